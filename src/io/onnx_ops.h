// What the op handlers share, private to src/io: the helpers (onnx_ops.cpp) and each family's
// part of the table (onnx_ops_math.cpp, onnx_ops_nn.cpp, onnx_ops_layout.cpp).
#pragma once

#ifdef EPILOG_HAVE_ONNX

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "onnx_import.h"

namespace epilog::onnx_import {

using onnx::AttributeProto;
using onnx::TensorProto;

// A per-spatial-dim list (strides, dilations, kernel_shape) of two values in [1, 2^31-1]; of a
// 1-D node (`line`: run as 2-D on rows of one), one value v, returned as {1, v}.
std::vector<int64_t> spatial(Importer& im, const char* name, std::optional<int64_t> fallback,
                             bool line = false);

// Explicit padding (top, left, bottom, right) from 'pads' or 'auto_pad' for an input of
// shape x (NCHW) and a window of `extent` (dilated kernel) moved by `stride`; a 1-D node's
// 'pads' (`line`) are two values, its x [N, C, 1, L].
std::vector<int64_t> padding(Importer& im, const Shape& x, const std::vector<int64_t>& extent,
                             const std::vector<int64_t>& stride, bool line = false);

// A Reshape node of the run-time tensor x to `target`, the node's output 0. The batch stays free
// (0: the input's) where the reshape keeps it, so that a plan for another batch size (Model)
// infers the same reshape; not where dim 0 is not the batch (batch_axis false).
void emit_reshape(Importer& im, const std::string& x, const Shape& target,
                  const std::string& label = "", bool batch_axis = true);

// Input 0 given new dims: a constant folds; a run-time tensor is named again when they are its
// own, flattened when they are a 2-D flatten of it, else reshaped (a view: no kernel).
void reshape_to(Importer& im, const Shape& target);

// Unsqueeze and Squeeze: their attributes and input counts, and the axes (the attribute before
// opset 13, the input from then on).
std::optional<std::vector<int64_t> > axes_arg(Importer& im);

// Input k, a constant of one value (a scalar or one element).
double scalar_in(Importer& im, int k, const char* role);

// Output 0 is input 0: a constant stays one, a run-time tensor is named again.
void pass_through(Importer& im);

// A new weight of one value, named after `base`; returns its name.
std::string scalar_weight(Importer& im, const std::string& base, float v);

// A float constant times `factor` as a weight: the constant's own where factor is 1, else one
// named after it with `suffix`; returns its name.
std::string scaled_weight(Importer& im, const std::string& name, const Const& c, float factor,
                          const char* suffix);

// Each family's handlers, added to the table op_handlers() builds.
void add_math_handlers(std::map<std::string, OpHandler>& table);
void add_nn_handlers(std::map<std::string, OpHandler>& table);
void add_layout_handlers(std::map<std::string, OpHandler>& table);

}  // namespace epilog::onnx_import

#endif  // EPILOG_HAVE_ONNX
