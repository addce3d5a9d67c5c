// Graph dumps: text for diffs, Graphviz DOT for pictures, JSON for tools (the JSON dump is the
// model format itself, see docs/model-format.md). All three are deterministic.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "epilog/graph/graph.h"

namespace epilog {

// One line per node:
//   %b0.conv = conv2d(%images, @b0.conv.weight) {k=3x3 s=2 p=1} : [1,16,320,320]
// Values are %name, weights @name; attributes at their default are left out.
std::string dump_text(const Graph& graph);

// Renders with `dot -Tsvg`; fused nodes are filled so that they stand out.
std::string dump_dot(const Graph& graph);

struct JsonDumpOptions {
  // Weights made by the seeded generator are written as {"init": {"seed": N}}. The others are
  // written inline, unless `weights_file` is set: then only their shapes are written and the
  // caller saves their data to that safetensors file (named relative to the JSON file).
  std::string weights_file;
  // With weights_file set: whether a weight that is not seeded goes to the file (true) or is
  // written inline; unset means every one goes to the file.
  std::function<bool(const std::string& name, const Weight& weight)> in_file;
};

nlohmann::ordered_json to_json(const Graph& graph, const JsonDumpOptions& options = {});
std::string dump_json(const Graph& graph, const JsonDumpOptions& options = {});

enum class DumpFormat { Text, Dot, Json };
DumpFormat parse_dump_format(const std::string& name);  // "text", "dot", "json"
std::string dump(const Graph& graph, DumpFormat format);

}  // namespace epilog
