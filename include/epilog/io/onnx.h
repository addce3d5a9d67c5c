// Importing ONNX models (as PyTorch exports them) into a Graph.
//
//   epilog::Graph g = epilog::load_onnx("model.onnx", {});   // or load_model("model.onnx")
//
// What is imported: default-domain opsets 11 to 21 (and 6 to 10, whose older attribute forms
// are read too), so the files of both of PyTorch's exporters: the TorchScript one (dynamo=False,
// opset_version=17 for instance) and the dynamo one (PyTorch 2.11's default, opset 18 or 20, the
// weights in an external "model.onnx.data"). Graph inputs and outputs are float32 with static
// shapes (a symbolic batch dim takes LoadOptions::batch). Weights come from initializers (raw_data
// or typed fields; float32, float16 and bfloat16 converted to float32) or from external data files
// (location, offset and length; the file must lie in the model's folder, also when followed
// through links). Shape arithmetic on constants (Shape, Gather, Div, Unsqueeze, Concat,
// Reshape, Cast, ...) is folded at import, so the graph is static: only float32 tensors flow at
// run time. The op mapping, with the forms each op is read in, is the table at the top of
// src/io/onnx_ops.cpp; any other op or form throws OnnxUnsupported naming the node and the op.
//
// Names: a value keeps its ONNX name and a node its ONNX node name (one derived from the op
// type and the first output when the model has none), so dumps read like the model.
//
// Errors name the file, the node, the op type and, where it applies, the attribute:
//   "m.onnx: node 'Conv_3' (Conv): attribute 'auto_pad': is 'SAME', expected ..."
// A valid model that uses what epilog cannot run throws OnnxUnsupported (an Error), so that
// callers such as the conformance test can tell "not supported" from "broken".
#pragma once

#include <cstddef>
#include <string>

#include "epilog/graph/graph.h"
#include "epilog/io/model.h"

namespace epilog {

class OnnxUnsupported : public Error {
 public:
  using Error::Error;
};

// False when this build has no ONNX support (libonnx-dev or libprotobuf-dev were missing at
// configure time); every function below then throws an Error saying so.
bool onnx_available();

// Reads an ONNX model. options.batch > 0 sets dim 0 of every input (also a symbolic one, which
// is an error otherwise); options.weights_file must be empty: an ONNX model carries its weights.
// The result is verified.
Graph load_onnx(const std::string& path, const LoadOptions& options = {});

// The same from the bytes of a model; `source` names it in messages and external data files
// are looked up relative to `base_dir`.
Graph parse_onnx(const void* data, size_t size, const std::string& source,
                 const std::string& base_dir, const LoadOptions& options = {});

// One serialized TensorProto (the input_N.pb / output_N.pb files of the ONNX test data) as a
// float32 tensor; float16 and bfloat16 are converted, other dtypes throw OnnxUnsupported.
Tensor read_onnx_tensor(const std::string& path);

}  // namespace epilog
