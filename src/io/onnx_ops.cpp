// The ONNX importer's op handlers: the table of every ONNX op it imports (op_handlers) and the
// helpers they share (onnx_ops.h); the handlers by family in onnx_ops_math.cpp, onnx_ops_nn.cpp
// and onnx_ops_layout.cpp (see onnx_import.h for how to add one).
//
// ONNX op                  -> epilog
// Conv                     -> conv2d (auto_pad resolved to explicit padding; 4-D input, or
//                             3-D run as 2-D on rows of one between two reshape views)
// ConvTranspose            -> conv_transpose2d (4-D, or 3-D as Conv; padding from pads, auto_pad
//                             or output_shape, whose rows past the natural size are
//                             output_padding)
// BatchNormalization       -> batchnorm (inference form; training mode only on constants, folded:
//                             weight standardization)
// LayerNormalization, GroupNormalization, InstanceNormalization -> layer_norm, group_norm,
//                             instance_norm (constant scales and biases that broadcast, or per
//                             group in GroupNormalization-18, spread out at import);
//                             LayerNormalization's Mean and InvStdDev by reduce_mean, sub, pow,
//                             reduce_mean, add, sqrt and reciprocal
// LRN                      -> x^2, an average pool across channels (a view of x^2), then one
//                             elementwise chain: x * (bias + alpha * mean)^-beta
// Relu, Sigmoid            -> relu, sigmoid (Sigmoid * Mul becomes silu in canonicalization)
// Add, Mul, Sub, Div       -> add, mul, sub, div (legacy opset < 7 axis broadcasting on
//                             constants too); Max, Min of one or more inputs -> a chain of
//                             max, min
// Sum, Mean                -> a chain of adds (Mean then a mul by 1/n)
// Concat, Split            -> concat, split (sizes: the 'split' attribute before opset 13, the
//                             input from 13, or 'num_outputs' from 18)
// Slice                    -> split on each sliced axis (steps 1: views), or one slice
// Pad                      -> pad (constant, reflect, edge; pads of the listed axes from 18)
// MaxPool, AveragePool     -> maxpool2d, avgpool2d (2-D, or 1-D as Conv; dilations 1)
// GlobalAveragePool        -> global_avgpool
// ReduceMean, ReduceSum, ReduceMax, ReduceMin, ReduceProd -> reduce_mean, reduce_sum,
//                             reduce_max, reduce_min, reduce_prod (axes: an attribute before
//                             opset 18, 13 for ReduceSum, the input from then on; the mean over
//                             H and W becomes global_avgpool in canonicalization)
// ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSum -> reduce_sum after pow(2) or abs, or before
//                             sqrt or log (the axes as for ReduceMean)
// ReduceLogSumExp          -> log(reduce_sum(exp(x - m))) + m, m the max (reduce_max, clipped
//                             to finite values)
// Softmax, LogSoftmax      -> softmax, log_softmax (before opset 13, over the dims from axis as
//                             one: reshapes around it)
// Resize, Upsample         -> upsample_nearest (nearest, integer scales of H and W, the
//                             coordinate modes that read input floor(x / scale)); otherwise
//                             resize (nearest or linear, half_pixel, pytorch_half_pixel,
//                             align_corners, asymmetric; the last two dims; scales or sizes, from
//                             opset 18 'axes' and keep_aspect_ratio_policy too)
// Flatten                  -> flatten; Reshape/Unsqueeze/Squeeze of a run-time tensor -> flatten
//                             when the target is a 2-D flatten, nothing when the shape is kept,
//                             else reshape (a view)
// Transpose                -> transpose
// DepthToSpace, SpaceToDepth -> depth_to_space, space_to_depth (4-D; DCR or CRD)
// Gemm                     -> linear for a constant B (alpha folded in), else matmul (then a
//                             mul by alpha); transpose for transA (and a run-time B's transB);
//                             C: the linear's bias, or an add (beta folded, or a mul)
// MatMul [+ Add]           -> linear for a 2-D tensor by a constant matrix (transposed at import,
//                             the bias of a following Add taken in); else matmul (batched)
// Einsum                   -> one or two operands, no ellipsis or diagonal: reduce_sum of the
//                             letters one operand alone holds, then transpose, or a batched
//                             matmul between reshapes and transposes
// Clip                     -> clip; relu for min 0 and no max; nothing without bounds (min and
//                             max: attributes before opset 11, inputs from 11)
// PRelu                    -> leaky_relu for one slope, else max or min(x, slope * x) (a chain)
// Selu                     -> elu, then a mul by gamma
// LeakyRelu, HardSigmoid, HardSwish, Tanh, Gelu, Mish, Softplus, Elu, Exp, Erf, Sqrt,
// Reciprocal, Neg, Abs, Log -> the op of the same name (activations: a conv's epilogue takes them)
// Pow                      -> pow, for a constant exponent of one value
// Expand                   -> add of zeros of the dims x lacks (canonicalization drops it where
//                             the reader broadcasts x); folded on constants
// Tile                     -> a tiled dim at a time: a view, an add of zeros that broadcasts it,
//                             a view; folded on constants
// Identity, Dropout (at inference, no mask), Cast and CastLike to float, Pad by zeros -> nothing
//                             (the output names the input's value)
// Constant, Shape, Size, Gather, Unsqueeze, Squeeze, Reshape, Concat, Slice, Split, Cast, CastLike,
// Add, Sub, Mul, Div, Sum, Mean, Pow, Transpose, Flatten, ConstantOfShape on constants -> folded
// at import; Not, CumSum, Sin, Cos, Floor, Ceil, Round, Range, Where, Equal, Less, Greater,
// LessOrEqual, GreaterOrEqual, And, Or, Xor, Mod, Trilu on constants only (Fourier features and
// masks built from shapes, shape arithmetic)
//
// Everything else throws OnnxUnsupported naming the node, the op and the attribute.
#ifdef EPILOG_HAVE_ONNX

#include <algorithm>

#include "onnx_ops.h"

namespace epilog::onnx_import {

// The helpers of onnx_ops.h (their comments there).

std::vector<int64_t> spatial(Importer& im, const char* name, std::optional<int64_t> fallback,
                             bool line) {
  auto v = im.attr_ints(name);
  if (!v) {
    if (!fallback) im.bad("attribute '{}' is required", name);
    return {line ? 1 : *fallback, *fallback};
  }
  if (line && v->size() != 1) im.bad_attr(name, "has {} values, expected 1 (L)", v->size());
  if (!line && v->size() != 2) im.bad_attr(name, "has {} values, expected 2 (H and W)", v->size());
  for (int64_t x : *v)
    if (x < 1 || x > kMaxDim) im.bad_attr(name, "{} is out of range [1, 2^31-1]", x);
  return line ? std::vector<int64_t>{1, (*v)[0]} : *v;
}

std::vector<int64_t> padding(Importer& im, const Shape& x, const std::vector<int64_t>& extent,
                             const std::vector<int64_t>& stride, bool line) {
  const std::string mode = im.attr_string("auto_pad", "NOTSET");
  auto pads = im.attr_ints("pads");
  if (mode == "NOTSET") {
    if (!pads) return {0, 0, 0, 0};
    if (line && pads->size() != 2)
      im.bad_attr("pads", "has {} values, expected 2 (begin, end)", pads->size());
    if (line) pads = std::vector<int64_t>{0, (*pads)[0], 0, (*pads)[1]};
    if (pads->size() != 4)
      im.bad_attr("pads", "has {} values, expected 4 (top, left, bottom, right)", pads->size());
    for (int64_t p : *pads) {
      if (p < 0) im.unsupported_attr("pads", "negative padding {} (cropping) is not supported", p);
      if (p > kMaxDim) im.bad_attr("pads", "{} is beyond epilog's limit of 2^31-1", p);
    }
    return *pads;
  }
  if (mode != "VALID" && mode != "SAME_UPPER" && mode != "SAME_LOWER")
    im.bad_attr("auto_pad", "is '{}', expected NOTSET, SAME_UPPER, SAME_LOWER or VALID", mode);
  if (pads && std::any_of(pads->begin(), pads->end(), [](int64_t p) { return p != 0; }))
    im.bad_attr("pads", "cannot be combined with auto_pad={}", mode);
  if (mode == "VALID") return {0, 0, 0, 0};
  // Output = ceil(in / stride); the padding that makes it, the odd one at the end (UPPER) or
  // the beginning (LOWER).
  std::vector<int64_t> p(4);
  for (int d = 0; d < 2; ++d) {
    int64_t in = x[size_t(2 + d)], s = stride[size_t(d)];
    int64_t out = (in + s - 1) / s;
    int64_t total = std::max<int64_t>(0, (out - 1) * s + extent[size_t(d)] - in);
    int64_t small = total / 2, big = total - small;
    p[size_t(d)] = mode == "SAME_UPPER" ? small : big;
    p[size_t(d + 2)] = mode == "SAME_UPPER" ? big : small;
  }
  return p;
}

void emit_reshape(Importer& im, const std::string& x, const Shape& target, const std::string& label,
                  bool batch_axis) {
  const Shape& s = im.value_shape(x);
  std::vector<int64_t> shape(target);
  if (batch_axis && !s.empty() && !shape.empty() && shape[0] == s[0]) shape[0] = 0;
  im.emit(OpKind::Reshape, {x}, im.attrs({{"shape", std::move(shape)}}), {im.out(0)}, label);
}

void reshape_to(Importer& im, const Shape& target) {
  if (const Const* c = im.const_in(0)) {
    Const r = *c;
    r.dims = target;
    return im.set_const(0, r);
  }
  const std::string x = im.dyn(0);
  const Shape& s = im.value_shape(x);
  if (target == s) return im.set_alias(0, x);
  if (target.size() == 2) {
    for (size_t axis = 0; axis <= s.size(); ++axis) {
      Shape flat{1, 1};
      for (size_t d = 0; d < s.size(); ++d) flat[d < axis ? 0 : 1] *= s[d];
      if (flat == target)
        return im.emit(OpKind::Flatten, {x}, im.attrs({{"axis", int64_t(axis)}}), {im.out(0)});
    }
  }
  if (std::any_of(target.begin(), target.end(), [](int64_t d) { return d < 1; }))
    im.unsupported("reshaping the run-time tensor '{}' from {} to the empty {} is not supported", x,
                   shape_str(s), shape_str(target));
  emit_reshape(im, x, target);
}

std::optional<std::vector<int64_t> > axes_arg(Importer& im) {
  if (im.opset() < 13) {
    im.allow({"axes"});
    im.arity(1, 1);
    return im.attr_ints("axes");
  }
  im.allow({});
  im.arity(1, 2);
  if (im.has_in(1)) return im.ints_in(1, "axes");
  return std::nullopt;
}

double scalar_in(Importer& im, int k, const char* role) {
  const Const& c = im.cst(k, role);
  if (c.numel() != 1) im.bad("{} '{}' has {} values, expected 1", role, im.in_name(k), c.numel());
  return c.is_float() ? double(c.f[0]) : double(c.i[0]);
}

void pass_through(Importer& im) {
  if (const Const* c = im.const_in(0)) return im.set_const(0, *c);
  im.set_alias(0, im.dyn(0));
}

std::string scalar_weight(Importer& im, const std::string& base, float v) {
  const std::string name = im.fresh_value(base);
  im.add_weight(name, Const{TensorProto::FLOAT, {1}, {v}, {}});
  return name;
}

std::string scaled_weight(Importer& im, const std::string& name, const Const& c, float factor,
                          const char* suffix) {
  if (factor == 1) return im.materialize(name, c);
  Const s = c;
  for (float& v : s.f) v *= factor;
  const std::string scaled = im.fresh_value(name + suffix);
  im.add_weight(scaled, s);
  return scaled;
}

// Every handler, found by op name (onnx.cpp).
const std::map<std::string, OpHandler>& op_handlers() {
  static const std::map<std::string, OpHandler> table = [] {
    std::map<std::string, OpHandler> t;
    add_math_handlers(t);
    add_nn_handlers(t);
    add_layout_handlers(t);
    return t;
  }();
  return table;
}

}  // namespace epilog::onnx_import

#endif  // EPILOG_HAVE_ONNX
