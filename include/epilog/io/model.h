// Loading and saving models in epilog's JSON format (version 1, the format dump_json writes).
//
//   {"format": "epilog", "version": 1,
//    "inputs":  [{"name": "images", "shape": [1, 3, 640, 640]}],
//    "outputs": [{"name": "b0.act", "shape": [1, 16, 320, 320]}],      (shape optional)
//    "weights_file": "yolo.safetensors",                               (optional)
//    "weights": {"b0.conv.weight": {"shape": [16, 3, 3, 3], "init": {"seed": 1}},
//                "b0.bn.bias": {"shape": [16], "data": [0.1, ...]},
//                "b0.bn.weight": {"shape": [16]}},                     (from weights_file)
//    "nodes": [{"name": "b0.conv", "op": "conv2d", "inputs": ["images", "b0.conv.weight"],
//               "outputs": ["b0.conv"], "attrs": {"stride": 2, "padding": 1}}, ...]}
//
// Nodes may come in any order. A tensor of the weights file takes precedence over "data" and
// "init" for the weight of its name; "init" makes the weight with init_weight(), in the role of
// the first node of the file that reads it.
#pragma once

#include <cstdint>
#include <string>

#include "epilog/graph/graph.h"

namespace epilog {

struct LoadOptions {
  // A safetensors file to use instead of the model's own "weights_file" (or in addition to
  // inline and seeded weights when the model names none). Relative to the working directory.
  std::string weights_file;
  // > 0: dim 0 of every input becomes `batch` and all shapes are inferred again.
  int64_t batch = 0;
};

// Reads a model file; the extension picks the format (.json). The result is verified; any
// problem throws one Error naming the file, the place in it and what is wrong.
Graph load_model(const std::string& path, const LoadOptions& options = {});

// Parses model JSON text. `source` names it in messages and `base_dir` is where a relative
// "weights_file" is found.
Graph parse_json_model(const std::string& text, const std::string& source,
                       const std::string& base_dir, const LoadOptions& options = {});

// Writes `json_path` and, when some weights are neither seeded nor small, `<stem>.safetensors`
// next to it. Loading the pair gives back the same graph, weights byte for byte.
void save_model(const Graph& graph, const std::string& json_path);

}  // namespace epilog
