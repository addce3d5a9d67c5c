// The ONNX importer's op handlers: one function per ONNX op, found through the table at the
// bottom of this file (see onnx_import.h for how to add one).
//
// ONNX op                  -> epilog
// Conv                     -> conv2d (auto_pad resolved to explicit padding; 4-D input only)
// ConvTranspose            -> conv_transpose2d (4-D; padding from pads, auto_pad or
//                             output_shape)
// BatchNormalization       -> batchnorm (inference form only)
// LayerNormalization, GroupNormalization, InstanceNormalization -> layer_norm, group_norm,
//                             instance_norm (constant scales and biases that broadcast, or per
//                             group in GroupNormalization-18, spread out at import)
// Relu, Sigmoid            -> relu, sigmoid (Sigmoid * Mul becomes silu in canonicalization)
// Add, Mul, Sub, Div       -> add, mul, sub, div (legacy opset < 7 axis broadcasting on
//                             constants too); Max, Min of one or more inputs -> a chain of
//                             max, min
// Sum, Mean                -> a chain of adds (Mean then a mul by 1/n)
// Concat, Split            -> concat, split (sizes: the 'split' attribute before opset 13, the
//                             input from 13, or 'num_outputs' from 18)
// Slice                    -> split on each sliced axis (steps 1: views), or one slice
// Pad                      -> pad (constant, reflect, edge; pads of the listed axes from 18)
// MaxPool, AveragePool     -> maxpool2d, avgpool2d (2-D, dilations 1); GlobalAveragePool ->
//                             global_avgpool
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
// Gemm (alpha 1, transA 0) -> linear (+ add for a bias that is not per output feature)
// MatMul [+ Add]           -> linear for a 2-D tensor by a constant matrix (transposed at import,
//                             the bias of a following Add taken in); else matmul (batched)
// Clip                     -> clip; relu for min 0 and no max; nothing without bounds (min and
//                             max: attributes before opset 11, inputs from 11)
// LeakyRelu, HardSigmoid, HardSwish, Tanh, Gelu, Mish, Softplus, Elu, Exp, Erf, Sqrt,
// Reciprocal, Neg, Abs, Log -> the op of the same name (activations: a conv's epilogue takes them)
// Pow                      -> pow, for a constant exponent of one value
// Identity, Dropout (at inference, no mask), Cast and CastLike to float, Pad by zeros -> nothing
//                             (the output names the input's value)
// Constant, Shape, Size, Gather, Unsqueeze, Squeeze, Reshape, Concat, Slice, Split, Cast, CastLike,
// Add, Sub, Mul, Div, Sum, Mean, Pow, Transpose, Flatten, ConstantOfShape on constants -> folded
// at import
//
// Everything else throws OnnxUnsupported naming the node, the op and the attribute.
#ifdef EPILOG_HAVE_ONNX

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <set>

#include "epilog/graph/activation.h"
#include "onnx_import.h"

namespace epilog::onnx_import {
namespace {

// A slice's end that reaches past the front going backwards at any size of the axis (also the
// batch's, rebound later): the most negative end an attribute holds.
constexpr int64_t kBeforeFront = -kMaxDim;

// The exclusive end of a slice whose last index is `last`, stepping by `step`.
int64_t slice_end(int64_t last, int64_t step) {
  return step > 0 ? last + 1 : (last == 0 ? kBeforeFront : last - 1);
}

using onnx::AttributeProto;
using onnx::TensorProto;

// -- attribute helpers --

// A per-spatial-dim list (strides, dilations, kernel_shape) of two values in [1, 2^31-1].
std::vector<int64_t> spatial(Importer& im, const char* name, std::optional<int64_t> fallback) {
  auto v = im.attr_ints(name);
  if (!v) {
    if (!fallback) im.bad("attribute '{}' is required", name);
    return {*fallback, *fallback};
  }
  if (v->size() != 2) im.bad_attr(name, "has {} values, expected 2 (H and W)", v->size());
  for (int64_t x : *v)
    if (x < 1 || x > kMaxDim) im.bad_attr(name, "{} is out of range [1, 2^31-1]", x);
  return *v;
}

// Explicit padding (top, left, bottom, right) from 'pads' or 'auto_pad' for an input of
// height and width `hw` and a window of `extent` (dilated kernel) moved by `stride`.
std::vector<int64_t> padding(Importer& im, const Shape& x, const std::vector<int64_t>& extent,
                             const std::vector<int64_t>& stride) {
  const std::string mode = im.attr_string("auto_pad", "NOTSET");
  auto pads = im.attr_ints("pads");
  if (mode == "NOTSET") {
    if (!pads) return {0, 0, 0, 0};
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

// A Reshape node of the run-time tensor x to `target`, the node's output 0. The batch stays free
// (0: the input's) where the reshape keeps it, so that a plan for another batch size (Model)
// infers the same reshape; not where dim 0 is not the batch (batch_axis false).
void emit_reshape(Importer& im, const std::string& x, const Shape& target,
                  const std::string& label = "", bool batch_axis = true) {
  const Shape& s = im.value_shape(x);
  std::vector<int64_t> shape(target);
  if (batch_axis && !s.empty() && !shape.empty() && shape[0] == s[0]) shape[0] = 0;
  im.emit(OpKind::Reshape, {x}, im.attrs({{"shape", std::move(shape)}}), {im.out(0)}, label);
}

// Input 0 given new dims: a constant folds; a run-time tensor is named again when they are its
// own, flattened when they are a 2-D flatten of it, else reshaped (a view: no kernel).
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

// Unsqueeze and Squeeze: their attributes and input counts, and the axes (the attribute before
// opset 13, the input from then on).
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

// Input k, a constant of one value (a scalar or one element).
double scalar_in(Importer& im, int k, const char* role) {
  const Const& c = im.cst(k, role);
  if (c.numel() != 1) im.bad("{} '{}' has {} values, expected 1", role, im.in_name(k), c.numel());
  return c.is_float() ? double(c.f[0]) : double(c.i[0]);
}

// Output 0 is input 0: a constant stays one, a run-time tensor is named again.
void pass_through(Importer& im) {
  if (const Const* c = im.const_in(0)) return im.set_const(0, *c);
  im.set_alias(0, im.dyn(0));
}

// -- handlers: elementwise --

void unary(Importer& im, OpKind kind) {
  im.allow({});
  im.arity(1, 1);
  im.emit(kind, {im.dyn(0)}, {}, {im.out(0)});
}

void op_relu(Importer& im) {
  unary(im, OpKind::Relu);
}

void op_sigmoid(Importer& im) {
  unary(im, OpKind::Sigmoid);
}

// Neg of a constant folds (shape arithmetic: LayerNormalization's expanded form negates its
// axis); of a run-time tensor it is the pointwise op.
void op_neg(Importer& im) {
  const Const* c = im.const_in(0);
  if (!c) return unary(im, OpKind::Neg);
  im.allow({});
  im.arity(1, 1);
  Const r = *c;
  for (float& v : r.f) v = -v;
  for (int64_t& v : r.i) {
    if (v == std::numeric_limits<int64_t>::min()) im.bad("integer overflow folding Neg of {}", v);
    v = -v;
  }
  im.set_const(0, std::move(r));
}

// The pointwise activations (graph/activation.h): each ONNX op is one epilog op, its
// parameters attributes of the same meaning.
template <OpKind Kind>
void op_activation(Importer& im) {
  unary(im, Kind);
}

// An activation with float attributes: (onnx name, epilog name, ONNX default) each.
struct FloatAttr {
  const char* onnx;
  const char* name;
  float fallback;
};
// The caller allows the attributes (Importer::allow takes literals).
void activation_with(Importer& im, OpKind kind, std::initializer_list<FloatAttr> attrs) {
  im.arity(1, 1);
  Attrs given;
  for (const FloatAttr& a : attrs) given.set(a.name, double(im.attr_float(a.onnx, a.fallback)));
  im.emit(kind, {im.dyn(0)}, given, {im.out(0)});
}

void op_leaky_relu(Importer& im) {
  im.allow({"alpha"});
  activation_with(im, OpKind::LeakyRelu, {{"alpha", "alpha", 0.01f}});
}

void op_hardsigmoid(Importer& im) {
  im.allow({"alpha", "beta"});
  activation_with(im, OpKind::HardSigmoid, {{"alpha", "alpha", 0.2f}, {"beta", "beta", 0.5f}});
}

void op_elu(Importer& im) {
  im.allow({"alpha"});
  activation_with(im, OpKind::Elu, {{"alpha", "alpha", 1.0f}});
}

// Gelu (opset 20): approximate "none" (erf) or "tanh".
void op_gelu(Importer& im) {
  im.allow({"approximate"});
  im.arity(1, 1);
  const std::string approximate = im.attr_string("approximate", "none");
  if (approximate != "none" && approximate != "tanh")
    im.bad("approximate '{}' is not one of none, tanh", approximate);
  Attrs given;
  given.set("approximate", approximate);
  im.emit(OpKind::Gelu, {im.dyn(0)}, given, {im.out(0)});
}

// Pow with a constant exponent (one value): x^e; on constants, folded.
void op_pow(Importer& im) {
  im.allow({});
  im.arity(2, 2);
  const Const& c = im.cst(1, "exponent");
  if (c.numel() != 1)
    im.unsupported("exponent '{}' has {} values (epilog raises to one constant power)",
                   im.in_name(1), c.numel());
  const double e = scalar_in(im, 1, "exponent");
  if (e == 1.0) return pass_through(im);
  Attrs given;
  given.set("exponent", e);
  im.emit(OpKind::Pow, {im.dyn(0)}, given, {im.out(0)});
}

// Clip: 'min' and 'max' attributes before opset 11, optional inputs from then on (absent:
// unbounded). No bounds is the input itself, min 0 alone is relu, anything else clip.
void op_clip(Importer& im) {
  if (im.opset() < 11)
    im.allow({"min", "max"});
  else
    im.allow({});
  im.arity(1, im.opset() < 11 ? 1 : 3);
  const float inf = std::numeric_limits<float>::infinity();
  double lo = im.attr_float("min", -inf), hi = im.attr_float("max", inf);
  if (im.has_in(1)) lo = scalar_in(im, 1, "min");
  if (im.has_in(2)) hi = scalar_in(im, 2, "max");
  // Opset 6's defaults are float32's extremes.
  if (lo <= std::numeric_limits<float>::lowest()) lo = -inf;
  if (hi >= std::numeric_limits<float>::max()) hi = inf;
  if (lo == -inf && hi == inf) return pass_through(im);
  if (lo == 0 && hi == inf) return im.emit(OpKind::Relu, {im.dyn(0)}, {}, {im.out(0)});
  if (!(lo <= hi)) im.bad("min {} is above max {}", lo, hi);
  Attrs given;
  given.set("min", std::max(lo, double(std::numeric_limits<float>::lowest())));
  given.set("max", std::min(hi, double(std::numeric_limits<float>::max())));
  im.emit(OpKind::Clip, {im.dyn(0)}, given, {im.out(0)});
}

// Add(MatMul(x, W), b) with a bias per output feature: the bias joins the linear node that
// MatMul became, unless the product has other readers.
bool take_bias(Importer& im) {
  for (int side = 0; side < 2; ++side) {
    const std::string& mm = im.in_name(side);
    auto lin = im.linear_of().find(mm);
    const Const* bias = im.const_in(1 - side);
    if (lin == im.linear_of().end() || !bias || im.uses(mm) != 1 || !bias->is_float()) continue;
    Node& node = im.graph().nodes[lin->second];
    const int64_t n = im.value_shape(node.inputs[1])[0];
    if (bias->dims != Shape{n} && bias->dims != Shape{1, n}) continue;
    std::string b = im.in_name(1 - side);
    if (bias->dims.size() != 1) {
      b = im.fresh_value(b + ".bias");
      Const flat = *bias;
      flat.dims = {n};
      im.add_weight(b, flat);
    } else {
      b = im.materialize(b, *bias);
    }
    std::string y = im.out(0);
    im.graph().values[y] = im.graph().values.at(node.outputs[0]);
    im.graph().values.erase(node.outputs[0]);
    im.dyn_values().erase(mm);
    node.outputs[0] = y;
    node.inputs.push_back(b);
    im.linear_of().erase(lin);
    return true;
  }
  return false;
}

void binary(Importer& im, char op) {
  if (im.opset() < 7)
    im.allow({"broadcast", "axis"});
  else
    im.allow({});
  im.arity(2, 2);
  // Before opset 7, B broadcasts to A only with broadcast=1, aligned at 'axis' (by default
  // at the back, which is NumPy's rule).
  std::optional<Shape> b_dims;
  if (im.opset() < 7 && im.attr_int("broadcast", 0) != 0 && im.has_attr("axis")) {
    Shape a = im.shape_in(0), b = im.shape_in(1);
    int64_t axis = axis_of(im.attr_int("axis", 0), a.size());
    if (size_t(axis) + b.size() > a.size())
      im.bad_attr("axis", "{} does not fit B {} into A {}", axis, shape_str(b), shape_str(a));
    b.resize(a.size() - size_t(axis), 1);
    if (b != im.shape_in(1)) b_dims = b;
  }
  const Const* ca = im.const_in(0);
  const Const* cb = im.const_in(1);
  if (ca && cb) {
    Const b = *cb;
    if (b_dims) b.dims = *b_dims;
    return im.set_const(0, fold_binary(*ca, b, op));
  }
  std::string b_value;
  if (b_dims) {
    if (!cb)
      im.unsupported_attr("axis", "legacy broadcasting of the run-time tensor '{}' at axis {}",
                          im.in_name(1), im.attr_int("axis", 0));
    Const b = *cb;
    b.dims = *b_dims;
    b_value = im.fresh_value(im.in_name(1) + ".broadcast");
    im.add_weight(b_value, b);
  }
  if (op == '+' && !b_dims && take_bias(im)) return;
  std::string a = im.dyn(0), b = b_dims ? b_value : im.dyn(1);
  const OpKind kind = op == '+'   ? OpKind::Add
                      : op == '*' ? OpKind::Mul
                      : op == '-' ? OpKind::Sub
                                  : OpKind::Div;
  im.emit(kind, {a, b}, {}, {im.out(0)});
}

void op_add(Importer& im) {
  binary(im, '+');
}
void op_sub(Importer& im) {
  binary(im, '-');
}
void op_mul(Importer& im) {
  binary(im, '*');
}
void op_div(Importer& im) {
  binary(im, '/');
}

// Sum and Mean of one or more inputs: a chain of adds, for Mean then a mul by 1/n.
void sum_of(Importer& im, bool mean) {
  im.allow({});
  im.arity(std::max(im.n_in(), 1), INT_MAX);
  const int n = im.n_in();
  if (im.all_const()) {
    Const acc = *im.const_in(0);
    for (int k = 1; k < n; ++k) acc = fold_binary(acc, *im.const_in(k), '+');
    if (mean) acc = fold_binary(acc, Const{TensorProto::FLOAT, {}, {float(1.0 / n)}, {}}, '*');
    return im.set_const(0, acc);
  }
  if (n == 1) return pass_through(im);
  std::string acc = im.dyn(0);
  for (int k = 1; k < n; ++k) {
    const std::string y = k == n - 1 && !mean
                              ? im.out(0)
                              : im.fresh_value(fmt::format("{}.sum{}", im.node().output(0), k));
    im.emit(OpKind::Add, {acc, im.dyn(k)}, {}, {y}, k == 1 ? "" : fmt::format("add{}", k));
    acc = y;
  }
  if (!mean) return;
  const std::string scale = im.fresh_value(im.node().output(0) + ".scale");
  im.add_weight(scale, Const{TensorProto::FLOAT, {1}, {float(1.0 / n)}, {}});
  im.emit(OpKind::Mul, {acc, scale}, {}, {im.out(0)}, "scale");
}

// Max and Min of one or more run-time tensors: a chain of max or min.
void extremum(Importer& im, OpKind kind) {
  im.allow({});
  im.arity(std::max(im.n_in(), 1), INT_MAX);
  const int n = im.n_in();
  if (n == 1) return pass_through(im);
  std::string acc = im.dyn(0);
  for (int k = 1; k < n; ++k) {
    const std::string y =
        k == n - 1 ? im.out(0) : im.fresh_value(fmt::format("{}.{}", im.node().output(0), k));
    im.emit(kind, {acc, im.dyn(k)}, {}, {y}, k == 1 ? "" : fmt::format("{}", k));
    acc = y;
  }
}
void op_max(Importer& im) {
  extremum(im, OpKind::Max);
}
void op_min(Importer& im) {
  extremum(im, OpKind::Min);
}

void op_sum(Importer& im) {
  sum_of(im, false);
}
void op_mean(Importer& im) {
  sum_of(im, true);
}

// -- handlers: convolution and normalization --

// Conv's and ConvTranspose's x and weight, both 4-D, and the weight's kernel_shape checked.
struct ConvOperands {
  std::string x, w;
  Shape xs, ws;
};
ConvOperands conv_operands(Importer& im) {
  im.arity(2, 3);
  ConvOperands c{im.dyn(0), im.dyn(1), {}, {}};
  c.xs = im.value_shape(c.x);
  c.ws = im.value_shape(c.w);
  if (c.xs.size() != 4)
    im.unsupported("input '{}' has shape {}: epilog imports 2-D convolutions (NCHW input) only",
                   im.in_name(0), shape_str(c.xs));
  if (c.ws.size() != 4)
    im.bad("weight '{}' has shape {}, expected 4 dims", im.in_name(1), shape_str(c.ws));
  if (auto k = im.attr_ints("kernel_shape"))
    if (*k != std::vector<int64_t>{c.ws[2], c.ws[3]})
      im.bad_attr("kernel_shape", "is {} but the weight is {}", shape_str(*k), shape_str(c.ws));
  return c;
}

void op_conv(Importer& im) {
  im.allow({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"});
  const auto [x, w, xs, ws] = conv_operands(im);
  std::vector<int64_t> stride = spatial(im, "strides", 1), dilation = spatial(im, "dilations", 1);
  int64_t group = im.attr_int("group", 1);
  if (group < 1 || group > kMaxDim) im.bad_attr("group", "{} is out of range", group);
  std::vector<int64_t> extent = {(ws[2] - 1) * dilation[0] + 1, (ws[3] - 1) * dilation[1] + 1};
  std::vector<int64_t> pad = padding(im, xs, extent, stride);
  std::vector<std::string> ins = {x, w};
  if (im.has_in(2)) ins.push_back(im.dyn(2));
  im.emit(
      OpKind::Conv2d, ins,
      im.attrs({{"stride", stride}, {"padding", pad}, {"dilation", dilation}, {"groups", group}}),
      {im.out(0)});
}

// ConvTranspose: padding from 'pads', 'auto_pad' or 'output_shape' (the padding that gives it,
// ONNX's rule for where the odd one goes).
void op_conv_transpose(Importer& im) {
  im.allow({"auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape",
            "pads", "strides"});
  const auto [x, w, xs, ws] = conv_operands(im);
  const std::vector<int64_t> stride = spatial(im, "strides", 1),
                             dilation = spatial(im, "dilations", 1);
  std::vector<int64_t> out_pad{0, 0};
  if (auto p = im.attr_ints("output_padding")) {
    if (p->size() != 2) im.bad_attr("output_padding", "has {} values, expected 2", p->size());
    out_pad = *p;
  }
  const int64_t group = im.attr_int("group", 1);
  if (group < 1 || group > kMaxDim) im.bad_attr("group", "{} is out of range", group);
  const std::string mode = im.attr_string("auto_pad", "NOTSET");
  auto out_shape = im.attr_ints("output_shape");
  std::vector<int64_t> pad{0, 0, 0, 0};
  if (out_shape || mode == "SAME_UPPER" || mode == "SAME_LOWER") {
    if (out_shape && out_shape->size() != 2 && out_shape->size() != 4)
      im.bad_attr("output_shape", "has {} values, expected 2 (H and W)", out_shape->size());
    for (int d = 0; d < 2; ++d) {
      const int64_t in = xs[size_t(2 + d)];
      const int64_t want =
          out_shape ? (*out_shape)[out_shape->size() - 2 + size_t(d)] : in * stride[size_t(d)];
      const int64_t total = stride[size_t(d)] * (in - 1) + out_pad[size_t(d)] +
                            (ws[size_t(2 + d)] - 1) * dilation[size_t(d)] + 1 - want;
      if (total < 0)
        im.unsupported("an output of {} along axis {} needs negative padding", want, 2 + d);
      const bool upper = mode == "SAME_UPPER";
      pad[size_t(d)] = upper ? total / 2 : total - total / 2;
      pad[size_t(d + 2)] = total - pad[size_t(d)];
    }
  } else if (mode == "NOTSET") {
    if (auto p = im.attr_ints("pads")) {
      if (p->size() != 4) im.bad_attr("pads", "has {} values, expected 4", p->size());
      for (int64_t v : *p)
        if (v < 0) im.unsupported_attr("pads", "negative padding {} is not supported", v);
      pad = *p;
    }
  } else if (mode != "VALID") {
    im.bad_attr("auto_pad", "is '{}', expected NOTSET, SAME_UPPER, SAME_LOWER or VALID", mode);
  }
  std::vector<std::string> ins = {x, w};
  if (im.has_in(2)) ins.push_back(im.dyn(2));
  im.emit(OpKind::ConvTranspose2d, ins,
          im.attrs({{"stride", stride},
                    {"padding", pad},
                    {"output_padding", out_pad},
                    {"dilation", dilation},
                    {"groups", group}}),
          {im.out(0)});
}

void op_batchnorm(Importer& im) {
  im.allow({"epsilon", "momentum", "training_mode", "spatial", "is_test", "consumed_inputs"});
  im.arity(5, 5, 5);
  if (im.attr_int("training_mode", 0) != 0)
    im.unsupported_attr("training_mode", "is 1; epilog imports inference-mode BatchNormalization");
  if (im.opset() < 7 && im.attr_int("is_test", 0) == 0)
    im.unsupported_attr("is_test",
                        "is 0 (training); epilog imports inference-mode "
                        "BatchNormalization");
  if (im.attr_int("spatial", 1) != 1)
    im.unsupported_attr("spatial", "is 0 (statistics per element); epilog normalizes per channel");
  for (int k = 1; k < im.n_out(); ++k)
    if (im.used_out(k))
      im.unsupported(
          "output {} ('{}') is a training statistic; epilog imports the inference "
          "form with one output",
          k, im.node().output(k));
  // ONNX stores eps as float32; its shortest decimal (1e-05, not 9.99999974738e-06) is the
  // value the exporter was given, and what dumps should show.
  const float epsilon = im.attr_float("epsilon", 1e-5f);
  if (!(epsilon >= 0 && std::isfinite(epsilon)))
    im.bad_attr("epsilon", "is {}, expected a finite number >= 0", epsilon);
  double eps = std::stod(fmt::format("{}", epsilon));
  std::vector<std::string> ins;
  for (int k = 0; k < 5; ++k) ins.push_back(im.dyn(k));
  im.emit(OpKind::BatchNorm, ins, im.attrs({{"eps", eps}}), {im.out(0)});
}

// epsilon as batchnorm reads it: the float32 attribute's shortest decimal.
double epsilon_attr(Importer& im) {
  const float epsilon = im.attr_float("epsilon", 1e-5f);
  if (!(epsilon >= 0 && std::isfinite(epsilon)))
    im.bad_attr("epsilon", "is {}, expected a finite number >= 0", epsilon);
  return std::stod(fmt::format("{}", epsilon));
}

// Outputs past the first (mean and inverse standard deviation of the training forms) are refused.
void first_output_only(Importer& im) {
  for (int k = 1; k < im.n_out(); ++k)
    if (im.used_out(k))
      im.unsupported("output {} ('{}') is a statistic; epilog imports the normalized output only",
                     k, im.node().output(k));
}

void op_layer_norm(Importer& im) {
  im.allow({"axis", "epsilon", "stash_type"});
  im.arity(2, 3, 3);
  first_output_only(im);
  const std::string x = im.dyn(0);
  const Shape& s = im.value_shape(x);
  const int64_t axis = axis_of(im.attr_int("axis", -1), s.size());
  const Shape tail(s.begin() + axis, s.end());
  std::vector<std::string> ins{x};
  for (int k = 1; k < 3 && im.has_in(k); ++k) {
    // Scale and bias broadcast to the normalized dims: constants are spread out at import.
    const Const* c = im.const_in(k);
    if (c && c->dims != tail && c->is_float()) {
      if (c->numel() != 1 && c->numel() != shape_numel(tail))
        im.unsupported("input '{}' {} does not broadcast to the normalized dims {}", im.in_name(k),
                       shape_str(c->dims), shape_str(tail));
      Const full = take(*c, tail, std::vector<int64_t>(size_t(shape_numel(tail)), 0));
      if (c->numel() != 1) full.f = c->f;
      const std::string w = im.fresh_value(im.in_name(k) + ".full");
      im.add_weight(w, full);
      ins.push_back(w);
    } else {
      ins.push_back(im.dyn(k));
    }
  }
  im.emit(OpKind::LayerNorm, ins, im.attrs({{"axis", axis}, {"eps", epsilon_attr(im)}}),
          {im.out(0)});
}

// GroupNormalization: scale and bias per channel (opset 21) or, in opset 18, per group (each
// group's value then spread over its channels at import).
void op_group_norm(Importer& im) {
  im.allow({"epsilon", "num_groups", "stash_type"});
  im.arity(3, 3);
  const std::string x = im.dyn(0);
  const Shape& s = im.value_shape(x);
  const int64_t groups = im.attr_int_req("num_groups");
  if (s.size() < 2 || groups < 1 || s[1] % groups != 0)
    im.bad_attr("num_groups", "{} does not divide the channels of {}", groups, shape_str(s));
  std::vector<std::string> ins{x};
  for (int k = 1; k < 3; ++k) {
    const Shape ps = im.shape_in(k);
    if (ps == Shape{s[1]}) {
      ins.push_back(im.dyn(k));
      continue;
    }
    const Const* c = im.const_in(k);
    if (ps != Shape{groups} || !c || !c->is_float())
      im.unsupported(
          "input '{}' has shape {}, expected [{}] per channel or a constant [{}] per "
          "group",
          im.in_name(k), shape_str(ps), s[1], groups);
    std::vector<int64_t> at;
    for (int64_t ch = 0; ch < s[1]; ++ch) at.push_back(ch / (s[1] / groups));
    const std::string w = im.fresh_value(im.in_name(k) + ".per_channel");
    im.add_weight(w, take(*c, {s[1]}, at));
    ins.push_back(w);
  }
  im.emit(OpKind::GroupNorm, ins, im.attrs({{"groups", groups}, {"eps", epsilon_attr(im)}}),
          {im.out(0)});
}

void op_instance_norm(Importer& im) {
  im.allow({"epsilon"});
  im.arity(3, 3);
  im.emit(OpKind::InstanceNorm, {im.dyn(0), im.dyn(1), im.dyn(2)},
          im.attrs({{"eps", epsilon_attr(im)}}), {im.out(0)});
}

// Softmax and LogSoftmax: over one axis from opset 13 (default -1); before, over the dims from
// `axis` on (default 1) as one, which is a reshape around a softmax over the last dim.
template <OpKind Kind>
void op_softmax(Importer& im) {
  im.allow({"axis"});
  im.arity(1, 1);
  const std::string x = im.dyn(0);
  const Shape& s = im.value_shape(x);
  const int64_t axis = axis_of(im.attr_int("axis", im.opset() < 13 ? 1 : -1), s.size());
  if (im.opset() >= 13 || axis == int64_t(s.size()) - 1)
    return im.emit(Kind, {x}, im.attrs({{"axis", axis}}), {im.out(0)});
  Shape flat{1, 1};
  for (size_t d = 0; d < s.size(); ++d) flat[int64_t(d) < axis ? 0 : 1] *= s[d];
  const std::string f = im.fresh_value(im.node().output(0) + ".flat");
  const std::string y = im.fresh_value(im.node().output(0) + "." + op_name(Kind));
  im.emit(OpKind::Reshape, {x}, im.attrs({{"shape", std::vector<int64_t>(flat)}}), {f}, "flat");
  im.emit(Kind, {f}, im.attrs({{"axis", int64_t(-1)}}), {y});
  im.emit(OpKind::Reshape, {y}, im.attrs({{"shape", std::vector<int64_t>(s)}}), {im.out(0)},
          "unflat");
}

// -- handlers: pooling and resizing --

void pool(Importer& im, bool max) {
  if (max)
    im.allow(
        {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides"});
  else
    im.allow({"auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads",
              "strides"});
  im.arity(1, 1, max ? 2 : 1);
  if (im.used_out(1))
    im.unsupported("output 1 ('{}', the indices of the maxima) is not supported",
                   im.node().output(1));
  if (im.attr_int("storage_order", 0) != 0)
    im.unsupported_attr("storage_order", "is {}; only the default row-major order (0) is supported",
                        im.attr_int("storage_order", 0));
  if (auto d = im.attr_ints("dilations"))
    if (std::any_of(d->begin(), d->end(), [](int64_t v) { return v != 1; }))
      im.unsupported_attr("dilations", "{} is not supported (only 1)", shape_str(*d));
  std::string x = im.dyn(0);
  const Shape xs = im.value_shape(x);
  if (xs.size() != 4)
    im.unsupported("input '{}' has shape {}: epilog pools 2-D (NCHW input) only", im.in_name(0),
                   shape_str(xs));
  std::vector<int64_t> kernel = spatial(im, "kernel_shape", std::nullopt);
  std::vector<int64_t> stride = spatial(im, "strides", 1);
  std::vector<int64_t> pad = padding(im, xs, kernel, stride);
  int64_t ceil_mode = im.attr_int("ceil_mode", 0) != 0;
  // ONNX sizes a ceil_mode output as ceil((in + pads - k) / s) + 1; epilog (and PyTorch) drop
  // a last window that would start in the end padding. Where the two differ the results
  // would too.
  for (int d = 0; ceil_mode && d < 2; ++d) {
    int64_t in = xs[size_t(2 + d)], s = stride[size_t(d)];
    int64_t span = in + pad[size_t(d)] + pad[size_t(d + 2)] - kernel[size_t(d)];
    if (span < 0) break;
    int64_t onnx_out = (span + s - 1) / s + 1;
    if ((onnx_out - 1) * s >= in + pad[size_t(d)])
      im.unsupported_attr("ceil_mode",
                          "the last window would start in the end padding, where "
                          "ONNX and epilog size the output differently");
  }
  if (max)
    im.emit(
        OpKind::MaxPool2d, {x},
        im.attrs(
            {{"kernel", kernel}, {"stride", stride}, {"padding", pad}, {"ceil_mode", ceil_mode}}),
        {im.out(0)});
  else
    im.emit(OpKind::AvgPool2d, {x},
            im.attrs({{"kernel", kernel},
                      {"stride", stride},
                      {"padding", pad},
                      {"ceil_mode", ceil_mode},
                      {"count_include_pad", int64_t(im.attr_int("count_include_pad", 0) != 0)}}),
            {im.out(0)});
}

void op_maxpool(Importer& im) {
  pool(im, true);
}
void op_avgpool(Importer& im) {
  pool(im, false);
}

void op_global_avgpool(Importer& im) {
  im.allow({});
  im.arity(1, 1);
  im.emit(OpKind::GlobalAvgPool, {im.dyn(0)}, {}, {im.out(0)});
}

void upsample(Importer& im, const std::string& x, const std::vector<double>& scales,
              const char* what) {
  const Shape& s = im.value_shape(x);
  if (s.size() != 4)
    im.unsupported("input '{}' has shape {}: epilog upsamples 4-D (NCHW) tensors only", x,
                   shape_str(s));
  if (scales.size() != 4) im.bad("{} has {} values, expected 4", what, scales.size());
  if (scales[0] != 1 || scales[1] != 1)
    im.unsupported("{} [{}] scale the batch or channel dim; epilog scales H and W only", what,
                   fmt::join(scales, ", "));
  std::vector<int64_t> factor;
  for (int d = 2; d < 4; ++d) {
    double v = scales[size_t(d)];
    if (!(v >= 1 && v <= kMaxDim && v == std::floor(v)))
      im.unsupported(
          "{} [{}] are not integer up-scales (epilog's nearest upsampling takes integer "
          "factors >= 1)",
          what, fmt::join(scales, ", "));
    factor.push_back(int64_t(v));
  }
  if (factor[0] == 1 && factor[1] == 1) return im.set_alias(0, x);
  im.emit(OpKind::UpsampleNearest, {x}, im.attrs({{"scale", factor}}), {im.out(0)});
}

// Resize: nearest with integer up-scales whose coordinate mode reads input floor(x / scale)
// becomes upsample_nearest (which convs take in); everything else the resize op, nearest or
// linear, in the coordinate modes PyTorch exports, to static sizes.
void op_resize(Importer& im) {
  // Opset 18 adds 'axes' (scales or sizes for these axes only), 'keep_aspect_ratio_policy' (with
  // sizes) and 'antialias' (for linear and cubic downscaling only).
  if (im.opset() < 18)
    im.allow({"coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
              "extrapolation_value", "mode", "nearest_mode"});
  else
    im.allow({"antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a",
              "exclude_outside", "extrapolation_value", "keep_aspect_ratio_policy", "mode",
              "nearest_mode"});
  im.arity(im.opset() < 11 ? 2 : 1, im.opset() < 11 ? 2 : 4);
  const std::string mode = im.attr_string("mode", "nearest");
  if (mode != "nearest" && mode != "linear")
    im.unsupported_attr("mode", "is '{}'; epilog imports nearest and linear resizing", mode);
  // Resize-10 maps coordinates like Upsample: x / scale (nearest rounded down).
  const std::string ctm = im.opset() < 11
                              ? "asymmetric"
                              : im.attr_string("coordinate_transformation_mode", "half_pixel");
  const std::string nearest =
      im.opset() < 11 ? "floor" : im.attr_string("nearest_mode", "round_prefer_floor");
  std::string x = im.dyn(0);
  const Shape& s = im.value_shape(x);
  // The axes that scales or sizes list, in their order.
  std::vector<int64_t> axes;
  if (auto a = im.attr_ints("axes")) {
    std::vector<bool> seen(s.size(), false);
    for (int64_t v : *a) {
      int64_t k = axis_of(v, s.size(), "axes value");
      if (seen[size_t(k)]) im.bad_attr("axes", "lists axis {} twice", v);
      seen[size_t(k)] = true;
      axes.push_back(k);
    }
  } else {
    for (size_t d = 0; d < s.size(); ++d) axes.push_back(int64_t(d));
  }
  // -- the scale and output size of every dim --
  std::vector<double> factors(s.size(), 1.0);
  std::vector<int64_t> sizes(s.begin(), s.end());
  bool from_scales = false;
  const int scales_at = im.opset() < 11 ? 1 : 2;
  const Const* scales = im.has_in(scales_at) ? &im.cst(scales_at, "scales") : nullptr;
  if (scales && scales->numel() == 0) scales = nullptr;
  if (im.has_in(3)) {
    if (scales) im.bad("has both scales and sizes; give one");
    std::vector<int64_t> given = im.ints_in(3, "sizes");
    if (given.size() != axes.size())
      im.bad("sizes has {} values for {} axes of the {}-D input", given.size(), axes.size(),
             s.size());
    // Sizes the exporter wrote with the batch it traced (the dynamo exporter's, on a run-time
    // tensor whose batch was rebound): the batch stays.
    if (im.batch() > 0 && im.file_batch() > 0 && !axes.empty() && axes[0] == 0 &&
        given[0] == im.file_batch() && !s.empty() && s[0] == im.batch())
      given[0] = s[0];
    // keep_aspect_ratio_policy scales every listed axis alike, by the smallest (not_larger)
    // or largest (not_smaller) ratio of sizes to the input; sizes are then rounded.
    const std::string policy = im.attr_string("keep_aspect_ratio_policy", "stretch");
    if (policy != "stretch" && policy != "not_larger" && policy != "not_smaller")
      im.bad_attr("keep_aspect_ratio_policy",
                  "is '{}', expected stretch, not_larger or not_smaller", policy);
    double f = policy == "not_larger" ? std::numeric_limits<double>::infinity() : 0.0;
    for (size_t k = 0; k < axes.size(); ++k) {
      const double ratio = double(given[k]) / double(s[size_t(axes[k])]);
      f = policy == "not_larger" ? std::min(f, ratio) : std::max(f, ratio);
    }
    for (size_t k = 0; k < axes.size(); ++k) {
      const size_t d = size_t(axes[k]);
      factors[d] = policy == "stretch" ? double(given[k]) / double(s[d]) : f;
      sizes[d] = policy == "stretch" ? given[k] : int64_t(std::round(f * double(s[d])));
    }
  } else {
    if (!scales) im.bad("has neither scales nor sizes");
    if (!scales->is_float()) im.bad("scales are {}, expected float", dtype_str(scales->dtype));
    if (scales->f.size() != axes.size())
      im.bad("scales has {} values for {} axes of the {}-D input", scales->f.size(), axes.size(),
             s.size());
    from_scales = true;
    for (size_t k = 0; k < axes.size(); ++k) {
      const size_t d = size_t(axes[k]);
      factors[d] = scales->f[k];
      if (!(factors[d] > 0 && factors[d] * double(s[d]) <= double(kMaxDim)))
        im.bad("scale {} of axis {} is out of range", factors[d], d);
      sizes[d] = int64_t(std::floor(factors[d] * double(s[d])));
    }
  }
  // -- nearest by integer factors, reading input floor(x / scale): upsample_nearest --
  // With an integer scale s, output x = q*s + r (0 <= r < s) must read input q:
  //   asymmetric: x/s = q + r/s, floored -> q.
  //   half_pixel: (x + 0.5)/s - 0.5 = q + (r + 0.5)/s - 0.5 lies strictly within q +- 0.5, so
  //   either rounding gives q (pytorch_half_pixel is the same for outputs longer than 1, and
  //   half_pixel_symmetric where the output is exactly s times the input, as here).
  //   tf_half_pixel_for_nn: (x + 0.5)/s = q + (r + 0.5)/s < q + 1, floored -> q.
  const bool rounds = nearest == "round_prefer_floor" || nearest == "round_prefer_ceil";
  const bool floors = nearest == "floor";
  const bool half_pixel =
      ctm == "half_pixel" || ctm == "pytorch_half_pixel" || ctm == "half_pixel_symmetric";
  const bool reads_floor = (ctm == "asymmetric" && floors) || (half_pixel && rounds) ||
                           (ctm == "tf_half_pixel_for_nn" && floors);
  bool integer = s.size() == 4 && factors[0] == 1 && factors[1] == 1;
  for (size_t d = 2; integer && d < 4; ++d)
    integer = factors[d] >= 1 && factors[d] == std::floor(factors[d]) &&
              sizes[d] == int64_t(factors[d]) * s[d];
  if (mode == "nearest" && reads_floor && integer) return upsample(im, x, factors, "scales");
  // -- the resize op --
  if (ctm != "half_pixel" && ctm != "pytorch_half_pixel" && ctm != "align_corners" &&
      ctm != "asymmetric")
    im.unsupported_attr("coordinate_transformation_mode",
                        "'{}' is not supported (half_pixel, pytorch_half_pixel, align_corners "
                        "and asymmetric are)",
                        ctm);
  if (mode == "nearest" && !rounds && !floors && nearest != "ceil")
    im.bad_attr("nearest_mode", "is '{}'", nearest);
  if (im.attr_int("exclude_outside", 0) != 0)
    im.unsupported_attr("exclude_outside", "is 1; only 0 is supported");
  for (size_t d = 0; d < s.size(); ++d) {
    if (sizes[d] < 1) im.unsupported("resizes axis {} of {} to nothing", d, shape_str(s));
    if (d + 2 < s.size() && sizes[d] != s[d])
      im.unsupported("resizes axis {} of {}: epilog resizes the last two axes only", d,
                     shape_str(s));
    // Given scales, every coordinate mode maps by the scale (align_corners by the scaled
    // length), which only equals sizes / input where that is whole.
    if (from_scales && sizes[d] != s[d] && double(sizes[d]) != factors[d] * double(s[d]))
      im.unsupported(
          "scale {} of axis {} (size {}) gives no whole output size; epilog resizes "
          "by sizes / input",
          factors[d], d, s[d]);
    if (mode == "linear" && im.attr_int("antialias", 0) != 0 && sizes[d] < s[d])
      im.unsupported_attr("antialias", "linear downscaling with antialias is not supported");
  }
  im.emit(
      OpKind::Resize, {x},
      im.attrs(
          {{"sizes", sizes}, {"mode", mode}, {"coordinate_mode", ctm}, {"nearest_mode", nearest}}),
      {im.out(0)});
}

void op_upsample(Importer& im) {
  if (im.opset() < 7)
    im.unsupported("Upsample before opset 7 (experimental form) is not supported");
  im.allow(im.opset() < 9 ? std::initializer_list<const char*>{"mode", "scales"}
                          : std::initializer_list<const char*>{"mode"});
  im.arity(im.opset() < 9 ? 1 : 2, im.opset() < 9 ? 1 : 2);
  const std::string mode = im.attr_string("mode", "nearest");
  if (mode != "nearest")
    im.unsupported_attr("mode", "is '{}'; epilog imports nearest-neighbour upsampling only", mode);
  std::vector<double> scales;
  if (im.opset() < 9) {
    auto s = im.attr_floats("scales");
    if (!s) im.bad("attribute 'scales' is required");
    scales.assign(s->begin(), s->end());
  } else {
    const Const& c = im.cst(1, "scales");
    if (!c.is_float()) im.bad("scales are {}, expected float", dtype_str(c.dtype));
    scales.assign(c.f.begin(), c.f.end());
  }
  upsample(im, im.dyn(0), scales, "scales");
}

// -- handlers: reductions --

// The axes of a Reduce* node, sorted and within [0, rank), and keepdims. The axes are an
// attribute before opset `input_from` (13 for ReduceSum, 18 for the others) and input 1 from
// then on. No axes reduce every axis, unless noop_with_empty_axes (from `input_from`) makes
// the node an identity.
struct ReduceArgs {
  std::vector<int64_t> axes;
  bool keepdims = true;
  bool noop = false;
};

ReduceArgs reduce_args(Importer& im, int64_t input_from) {
  const bool as_input = im.opset() >= input_from;
  if (as_input)
    im.allow({"keepdims", "noop_with_empty_axes"});
  else
    im.allow({"axes", "keepdims"});
  im.arity(1, as_input ? 2 : 1);
  const size_t rank = im.shape_in(0).size();
  std::vector<int64_t> given;
  if (!as_input) {
    if (auto a = im.attr_ints("axes")) given = *a;
  } else if (im.has_in(1)) {
    given = im.ints_in(1, "axes");
  }
  ReduceArgs r;
  r.keepdims = im.attr_int("keepdims", 1) != 0;
  r.noop = given.empty() && as_input && im.attr_int("noop_with_empty_axes", 0) != 0;
  std::vector<bool> reduced(rank, given.empty() && !r.noop);
  for (int64_t a : given) {
    const int64_t k = axis_of(a, rank, "axes value");
    if (reduced[size_t(k)]) im.bad("axis {} is given twice", a);
    reduced[size_t(k)] = true;
  }
  for (size_t d = 0; d < rank; ++d)
    if (reduced[d]) r.axes.push_back(int64_t(d));
  return r;
}

// A reduction node over the axes, keepdims as given, or nothing (noop_with_empty_axes and no
// axes); the axes are an input from opset `input_from` on.
template <OpKind Kind, int64_t input_from>
void op_reduce(Importer& im) {
  const ReduceArgs r = reduce_args(im, input_from);
  if (r.noop) return pass_through(im);
  im.emit(Kind, {im.dyn(0)}, im.attrs({{"axes", r.axes}, {"keepdims", int64_t(r.keepdims)}}),
          {im.out(0)});
}

// An activation's op on `x` into `y`, as a helper node "<name>.<its activation>".
void emit_activation(Importer& im, const Act& act, const std::string& x, const std::string& y) {
  const auto [kind, attrs] = activation_op(act);
  im.emit(kind, {x}, attrs, {y}, activation_name(act.kind));
}

// ReduceSumSquare, ReduceL1, ReduceL2 and ReduceLogSum: y = post(reduce_sum(pre(x))), pre and
// post activations (None: left out). With noop_with_empty_axes and no axes, post(pre(x)), as
// ONNX's reference computes it (the square of x for ReduceSumSquare).
void reduce_sum_between(Importer& im, const Act& pre, const Act& post) {
  const ReduceArgs r = reduce_args(im, 18);
  const std::string base = im.node().output(0);
  const bool has_pre = pre.kind != Activation::None, has_post = post.kind != Activation::None;
  if (r.noop && !has_pre && !has_post) return pass_through(im);
  std::string v = im.dyn(0);
  if (has_pre) {
    const std::string to =
        r.noop && !has_post ? im.out(0) : im.fresh_value(base + "." + activation_name(pre.kind));
    emit_activation(im, pre, v, to);
    v = to;
  }
  if (!r.noop) {
    const std::string to = has_post ? im.fresh_value(base + ".sum") : im.out(0);
    im.emit(OpKind::ReduceSum, {v}, im.attrs({{"axes", r.axes}, {"keepdims", int64_t(r.keepdims)}}),
            {to});
    v = to;
  }
  if (has_post) emit_activation(im, post, v, im.out(0));
}

void op_reduce_sum_square(Importer& im) {
  reduce_sum_between(im, Act(Activation::Pow, 2.0f), Activation::None);
}

void op_reduce_l1(Importer& im) {
  reduce_sum_between(im, Activation::Abs, Activation::None);
}

void op_reduce_l2(Importer& im) {
  reduce_sum_between(im, Act(Activation::Pow, 2.0f), Activation::Sqrt);
}

void op_reduce_log_sum(Importer& im) {
  reduce_sum_between(im, Activation::None, Activation::Log);
}

// ReduceLogSumExp without overflow: m = the max over the axes (dims kept), clipped to the finite
// floats, and y = log(reduce_sum(exp(x - m))) + m (m reshaped to y's dims without keepdims). The
// clip stands in for ONNX's shift by 0 where the max is infinite: a run of -inf gives -inf, one
// with +inf gives +inf, not NaN. With noop_with_empty_axes and no axes, x itself.
void op_reduce_log_sum_exp(Importer& im) {
  const ReduceArgs r = reduce_args(im, 18);
  if (r.noop) return pass_through(im);
  const std::string base = im.node().output(0), x = im.dyn(0);
  auto value = [&](const char* what) { return im.fresh_value(base + "." + what); };
  const std::string top = value("max"), shift = value("shift"), d = value("shifted"),
                    e = value("exp"), sum = value("sum"), log_sum = value("log");
  const float big = std::numeric_limits<float>::max();
  im.emit(OpKind::ReduceMax, {x}, im.attrs({{"axes", r.axes}, {"keepdims", int64_t(1)}}), {top},
          "max");
  emit_activation(im, Act(Activation::Clip, -big, big), top, shift);
  im.emit(OpKind::Sub, {x, shift}, {}, {d}, "sub");
  emit_activation(im, Activation::Exp, d, e);
  im.emit(OpKind::ReduceSum, {e}, im.attrs({{"axes", r.axes}, {"keepdims", int64_t(r.keepdims)}}),
          {sum});
  emit_activation(im, Activation::Log, sum, log_sum);
  std::string add = shift;
  if (!r.keepdims) {
    add = value("shift_dims");
    im.emit(OpKind::Reshape, {shift},
            im.attrs({{"shape", std::vector<int64_t>(im.value_shape(sum))}}), {add}, "reshape");
  }
  im.emit(OpKind::Add, {log_sum, add}, {}, {im.out(0)}, "add");
}

// -- handlers: linear layers --

// linear takes its weight as [N, K]; ONNX's B is [K, N].
std::string transposed_weight(Importer& im, const std::string& name, const Const& b) {
  if (!b.is_float()) im.bad("input B '{}' is {}, expected float", name, dtype_str(b.dtype));
  if (b.dims.size() != 2)
    im.bad("input B '{}' has shape {}, expected 2 dims", name, shape_str(b.dims));
  Const t = fold_transpose(b, {1, 0});
  std::string w = im.fresh_value(name + ".T");
  if (checked_numel(t.dims, kMaxNumel) == 0) im.unsupported("input B '{}' is empty", name);
  im.add_weight(w, t);
  return w;
}

void op_gemm(Importer& im) {
  im.allow({"alpha", "beta", "transA", "transB", "broadcast"});
  im.arity(2, 3);
  if (im.attr_int("transA", 0) != 0)
    im.unsupported_attr("transA", "is 1; epilog imports Gemm with transA=0 only");
  if (im.attr_float("alpha", 1) != 1)
    im.unsupported_attr("alpha", "is {}; epilog imports Gemm with alpha=1 only",
                        im.attr_float("alpha", 1));
  // beta = 0 drops C (PyTorch's mm exports so); any other beta but 1 would scale it.
  const float beta = im.attr_float("beta", 1);
  const bool with_c = im.has_in(2) && beta != 0;
  if (with_c && beta != 1)
    im.unsupported_attr("beta", "is {}; epilog imports Gemm with beta 0 or 1 only", beta);
  std::string a = im.dyn(0);
  if (im.value_shape(a).size() != 2)
    im.bad("input A '{}' has shape {}, expected 2 dims", im.in_name(0),
           shape_str(im.value_shape(a)));
  std::string w;
  if (im.attr_int("transB", 0) != 0) {
    w = im.dyn(1);
  } else {
    const Const* b = im.const_in(1);
    if (!b)
      im.unsupported_attr("transB",
                          "is 0 and B '{}' is computed at run time; epilog needs B "
                          "constant to transpose it at import",
                          im.in_name(1));
    w = transposed_weight(im, im.in_name(1), *b);
  }
  if (im.value_shape(w).size() != 2)
    im.bad("input B '{}' has shape {}, expected 2 dims", im.in_name(1),
           shape_str(im.value_shape(w)));
  const int64_t n = im.value_shape(w)[0];
  std::vector<std::string> ins = {a, w};
  std::string add;  // a bias that is not one value per output feature
  if (with_c) {
    const Shape cs = im.shape_in(2);
    const Const* c = im.const_in(2);
    if (c && c->is_float() && cs.size() <= 2 &&
        std::all_of(cs.begin(), cs.end() - (cs.empty() ? 0 : 1),
                    [](int64_t d) { return d == 1; }) &&
        (cs.empty() || cs.back() == 1 || cs.back() == n)) {
      // One value per output feature (or one for all): the linear bias, spread to [N].
      Const bias;
      bias.dims = {n};
      check_folded(bias.dims, c->numel());
      for (int64_t k = 0; k < n; ++k) bias.f.push_back(c->numel() == 1 ? c->f[0] : c->f[size_t(k)]);
      std::string b = cs == Shape{n} ? im.materialize(im.in_name(2), *c)
                                     : im.fresh_value(im.in_name(2) + ".bias");
      if (!im.graph().values.count(b)) im.add_weight(b, bias);
      ins.push_back(b);
    } else if (!c && cs == Shape{n}) {
      ins.push_back(im.dyn(2));
    } else {
      add = im.dyn(2);
    }
  }
  if (add.empty()) return im.emit(OpKind::Linear, ins, {}, {im.out(0)});
  std::string y = im.fresh_value(im.node().output(0) + ".mm");
  im.emit(OpKind::Linear, ins, {}, {y});
  im.emit(OpKind::Add, {y, add}, {}, {im.out(0)}, "bias");
}

void op_matmul(Importer& im) {
  im.allow({});
  im.arity(2, 2);
  std::string a = im.dyn(0);
  const Const* b = im.const_in(1);
  // A tensor of 2 dims or more by a constant matrix is a linear layer (which takes a following
  // bias in); anything else of at least 2 dims each a batched matmul.
  if (im.value_shape(a).size() < 2 || !b || b->dims.size() != 2) {
    if (im.value_shape(a).size() < 2 || im.shape_in(1).size() < 2)
      im.unsupported("MatMul of {} by {}: epilog multiplies tensors of at least 2 dims",
                     shape_str(im.value_shape(a)), shape_str(im.shape_in(1)));
    return im.emit(OpKind::MatMul, {a, im.dyn(1)}, {}, {im.out(0)});
  }
  std::string w = transposed_weight(im, im.in_name(1), *b);
  im.linear_of()[im.node().output(0)] = im.graph().nodes.size();
  im.emit(OpKind::Linear, {a, w}, {}, {im.out(0)});
}

// -- handlers: layout --

void op_concat(Importer& im) {
  im.allow({"axis"});
  im.arity(1, INT_MAX);
  int64_t axis = im.attr_int_req("axis");
  if (im.all_const()) {
    std::vector<const Const*> xs;
    for (int k = 0; k < im.n_in(); ++k)
      if (im.has_in(k)) xs.push_back(im.const_in(k));
    return im.set_const(0, fold_concat(xs, axis));
  }
  std::vector<std::string> ins;
  for (int k = 0; k < im.n_in(); ++k) {
    if (!im.has_in(k)) continue;
    // An empty constant adds nothing (PyTorch's exports concat them in shape arithmetic).
    if (const Const* c = im.const_in(k); c && c->numel() == 0) continue;
    ins.push_back(im.dyn(k));
  }
  if (ins.size() == 1) {
    axis_of(axis, im.value_shape(ins[0]).size());
    return im.set_alias(0, ins[0]);
  }
  im.emit(OpKind::Concat, ins, im.attrs({{"axis", axis}}), {im.out(0)});
}

void op_split(Importer& im) {
  // The sizes: an attribute before opset 13, an input from then on; or, from opset 18, a
  // number of outputs of ceil(dim / n) each, the last one smaller.
  if (im.opset() < 13)
    im.allow({"axis", "split"});
  else if (im.opset() < 18)
    im.allow({"axis"});
  else
    im.allow({"axis", "num_outputs"});
  im.arity(1, im.opset() < 13 ? 1 : 2, INT_MAX);
  const Shape s = im.shape_in(0);
  const int64_t axis = axis_of(im.attr_int("axis", 0), s.size());
  const int64_t dim = s[size_t(axis)];
  std::vector<int64_t> sizes;
  if (im.opset() < 13) {
    if (auto v = im.attr_ints("split")) sizes = *v;
  } else if (im.has_in(1)) {
    if (im.has_attr("num_outputs"))
      im.bad("has both the 'split' input and 'num_outputs'; give one");
    sizes = im.ints_in(1, "split");
  }
  if (im.has_attr("num_outputs") && !im.has_in(1)) {
    const int64_t n = im.attr_int("num_outputs", 0);
    if (n < 1 || n != im.n_out()) im.bad_attr("num_outputs", "is {} for {} outputs", n, im.n_out());
    const int64_t chunk = dim / n + (dim % n != 0);
    if (chunk * (n - 1) >= dim && dim > 0)
      im.bad_attr("num_outputs", "{} parts of {} elements leave the last one empty", n, dim);
    sizes.assign(size_t(n), chunk);
    sizes.back() = dim - chunk * (n - 1);
  }
  if (sizes.empty()) {
    int64_t parts = im.n_out();
    if (dim % parts != 0) im.bad("cannot split {} elements into {} equal parts", dim, parts);
    sizes.assign(size_t(parts), dim / parts);
  }
  if (int64_t(sizes.size()) != im.n_out())
    im.bad("split has {} sizes for {} outputs", sizes.size(), im.n_out());
  int64_t total = 0;
  for (int64_t v : sizes) {
    if (v < 0 || v > dim) im.bad("split sizes {} do not fit dim {}", shape_str(sizes), dim);
    total += v;
  }
  if (total != dim) im.bad("split sizes {} add up to {}, not {}", shape_str(sizes), total, dim);
  if (const Const* c = im.const_in(0)) {
    int64_t start = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      im.set_const(int(k), fold_slice(*c, {{axis, start, sizes[k], 1}}));
      start += sizes[k];
    }
    return;
  }
  if (std::any_of(sizes.begin(), sizes.end(), [](int64_t v) { return v == 0; }))
    im.unsupported("split sizes {} make an empty output", shape_str(sizes));
  std::string x = im.dyn(0);
  if (sizes.size() == 1) return im.set_alias(0, x);
  std::vector<std::string> outs;
  for (int k = 0; k < im.n_out(); ++k) outs.push_back(im.out(k));
  im.emit(OpKind::Split, {x}, im.attrs({{"axis", axis}, {"sizes", sizes}}), outs);
}

void op_slice(Importer& im) {
  if (im.opset() < 10) {
    im.allow({"starts", "ends", "axes"});
    im.arity(1, 1);
  } else {
    im.allow({});
    im.arity(3, 5);
  }
  const Shape s = im.shape_in(0);
  std::vector<int64_t> starts, ends, axes, steps;
  if (im.opset() < 10) {
    auto a = im.attr_ints("starts"), b = im.attr_ints("ends");
    if (!a || !b) im.bad("attributes 'starts' and 'ends' are required");
    starts = *a;
    ends = *b;
    if (auto c = im.attr_ints("axes")) axes = *c;
  } else {
    starts = im.ints_in(1, "starts");
    ends = im.ints_in(2, "ends");
    if (im.has_in(3)) axes = im.ints_in(3, "axes");
    if (im.has_in(4)) steps = im.ints_in(4, "steps");
  }
  if (axes.empty())
    for (size_t k = 0; k < starts.size(); ++k) axes.push_back(int64_t(k));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    im.bad("starts, ends, axes and steps have {}, {}, {} and {} values", starts.size(), ends.size(),
           axes.size(), steps.size());
  std::vector<SliceAxis> cut;
  std::set<int64_t> seen;
  for (size_t k = 0; k < starts.size(); ++k) {
    const int64_t axis = axis_of(axes[k], s.size());
    if (!seen.insert(axis).second) im.bad("axis {} is sliced twice", axis);
    const int64_t dim = s[size_t(axis)], step = steps[k];
    if (step == 0) im.bad("step 0 on axis {}", axis);
    // ONNX's rules: negative positions count from the end, then clamp to the axis
    // ([0, dim] going forward, [-1, dim-1] going backward).
    auto place = [&](int64_t v, int64_t lo, int64_t hi) {
      v = std::clamp(v, -dim - 1, dim + 1);
      if (v < 0) v += dim;
      return std::clamp(v, lo, hi);
    };
    // An empty axis (of a constant) has nothing to take, going either way.
    if (dim == 0) continue;
    int64_t b = step > 0 ? place(starts[k], 0, dim) : place(starts[k], 0, dim - 1);
    int64_t e = step > 0 ? place(ends[k], 0, dim) : place(ends[k], -1, dim - 1);
    // Unsigned magnitudes: a step of INT64_MIN or INT64_MAX must not overflow.
    const int64_t dist = step > 0 ? e - b : b - e;
    const uint64_t mag = step > 0 ? uint64_t(step) : uint64_t(0) - uint64_t(step);
    const int64_t count = dist <= 0 ? 0 : 1 + int64_t(uint64_t(dist - 1) / mag);
    if (count == dim && step == 1) continue;  // the whole axis
    cut.push_back({axis, b, count, step});
  }
  if (const Const* c = im.const_in(0)) return im.set_const(0, fold_slice(*c, cut));
  std::string x = im.dyn(0);
  for (const SliceAxis& c : cut)
    if (c.count == 0) im.unsupported("the slice of axis {} is empty", c.axis);
  // Steps other than 1: one slice node (start and end as clamped above, the end one step past
  // the last element taken, or the clamp's -1 going backwards past the front).
  if (std::any_of(cut.begin(), cut.end(), [](const SliceAxis& c) { return c.step != 1; })) {
    std::vector<int64_t> b, e, a, st;
    for (const SliceAxis& c : cut) {
      const int64_t last = c.start + (c.count - 1) * c.step;
      b.push_back(c.start);
      e.push_back(slice_end(last, c.step));
      a.push_back(c.axis);
      st.push_back(c.step);
    }
    return im.emit(OpKind::Slice, {x},
                   im.attrs({{"starts", b}, {"ends", e}, {"axes", a}, {"steps", st}}), {im.out(0)});
  }
  for (size_t k = 0; k < cut.size(); ++k) {
    const SliceAxis& c = cut[k];
    // A split into [before, wanted, after]; the unused parts are left to dead-code removal.
    const int64_t dim = im.value_shape(x)[size_t(c.axis)];
    std::vector<int64_t> sizes;
    std::vector<std::string> outs;
    if (c.start > 0) {
      sizes.push_back(c.start);
      outs.push_back(im.fresh_value(fmt::format("{}.before{}", im.name(), c.axis)));
    }
    size_t keep = sizes.size();
    sizes.push_back(c.count);
    outs.push_back(k + 1 == cut.size()
                       ? im.out(0)
                       : im.fresh_value(fmt::format("{}.axis{}", im.name(), c.axis)));
    if (c.start + c.count < dim) {
      sizes.push_back(dim - c.start - c.count);
      outs.push_back(im.fresh_value(fmt::format("{}.after{}", im.name(), c.axis)));
    }
    im.emit(OpKind::Split, {x}, im.attrs({{"axis", c.axis}, {"sizes", sizes}}), outs,
            k == 0 ? "" : fmt::format("axis{}", c.axis));
    x = outs[keep];
  }
  if (cut.empty()) im.set_alias(0, x);
}

// Pad: 'pads' (and 'value') attributes before opset 11, inputs from then on (pads,
// constant_value, and from opset 18 the axes the pads are for); mode constant, reflect, edge
// or (from 19) wrap. Zero pads are the input itself; other pads need a pad op.
void op_pad(Importer& im) {
  if (im.opset() < 11)
    im.allow({"mode", "pads", "value"});
  else
    im.allow({"mode"});
  im.arity(im.opset() < 11 ? 1 : 2, im.opset() < 11 ? 1 : (im.opset() < 18 ? 3 : 4));
  const std::string mode = im.attr_string("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge" &&
      !(mode == "wrap" && im.opset() >= 19))
    im.bad_attr("mode", "is '{}', expected constant, reflect, edge{}", mode,
                im.opset() >= 19 ? " or wrap" : "");
  std::vector<int64_t> pads;
  if (im.opset() < 11) {
    auto p = im.attr_ints("pads");
    if (!p) im.bad("attribute 'pads' is required");
    pads = *p;
  } else {
    pads = im.ints_in(1, "pads");
  }
  const size_t rank = im.shape_in(0).size();
  size_t axes = rank;
  if (im.has_in(3)) axes = im.ints_in(3, "axes").size();
  if (pads.size() != 2 * axes)
    im.bad("has {} pads for {} axes, expected two per axis", pads.size(), axes);
  if (std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; }))
    return pass_through(im);
  if (mode == "wrap") im.unsupported_attr("mode", "'wrap' is not supported");
  if (std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p < 0; }))
    im.unsupported("padding by {}: negative pads (cropping) are not supported", shape_str(pads));
  // Pads of every dim: begins, then ends (those of the listed axes only from opset 18).
  std::vector<int64_t> full(2 * rank, 0);
  std::vector<int64_t> listed;
  if (im.has_in(3))
    for (int64_t a : im.ints_in(3, "axes")) listed.push_back(axis_of(a, rank, "axes value"));
  else
    for (size_t d = 0; d < rank; ++d) listed.push_back(int64_t(d));
  for (size_t k = 0; k < axes; ++k) {
    full[size_t(listed[k])] = pads[k];
    full[rank + size_t(listed[k])] = pads[axes + k];
  }
  double value = im.attr_float("value", 0);
  if (im.opset() >= 11 && im.has_in(2)) value = scalar_in(im, 2, "constant_value");
  im.emit(OpKind::Pad, {im.dyn(0)}, im.attrs({{"pads", full}, {"mode", mode}, {"value", value}}),
          {im.out(0)});
}

void op_flatten(Importer& im) {
  im.allow({"axis"});
  im.arity(1, 1);
  const Shape s = im.shape_in(0);
  int64_t axis = im.attr_int("axis", 1);
  if (axis < -int64_t(s.size()) || axis > int64_t(s.size()))
    im.bad_attr("axis", "{} is out of range for rank {}", axis, s.size());
  if (axis < 0) axis += int64_t(s.size());
  if (const Const* c = im.const_in(0)) {
    Const r = *c;
    r.dims = {1, 1};
    for (size_t d = 0; d < s.size(); ++d) r.dims[int64_t(d) < axis ? 0 : 1] *= s[d];
    return im.set_const(0, r);
  }
  im.emit(OpKind::Flatten, {im.dyn(0)}, im.attrs({{"axis", axis}}), {im.out(0)});
}

void op_reshape(Importer& im) {
  im.allow({"allowzero"});
  im.arity(2, 2);
  std::vector<int64_t> want = im.ints_in(1, "shape");
  const Shape& x = im.shape_in(0);
  // A shape the exporter wrote with the batch it traced (shufflenet's channel shuffle at
  // batch 1), on a run-time tensor whose batch was rebound: its first dim is the batch.
  if (im.batch() > 0 && im.file_batch() > 0 && !want.empty() && want[0] == im.file_batch() &&
      !x.empty() && x[0] == im.batch() && !im.const_in(0)) {
    int64_t known = 1, total = 1;
    for (int64_t d : want) known *= d > 0 ? d : 1;
    for (int64_t d : x) total *= d;
    if (known != total && std::find(want.begin(), want.end(), -1) == want.end()) want[0] = -1;
  }
  Shape target = reshaped(x, want, im.attr_int("allowzero", 0) != 0);
  reshape_to(im, target);
}

void op_unsqueeze(Importer& im) {
  auto axes = axes_arg(im);
  if (!axes) im.bad("axes are required");
  Shape s = im.shape_in(0);
  const size_t rank = s.size() + axes->size();
  if (rank > kMaxRank) im.bad("makes {} dims", rank);
  std::vector<bool> added(rank, false);
  for (int64_t a : *axes) {
    int64_t k = axis_of(a, rank, "axes value");
    if (added[size_t(k)]) im.bad("axis {} is given twice", a);
    added[size_t(k)] = true;
  }
  Shape target;
  for (size_t k = 0, from = 0; k < rank; ++k) target.push_back(added[k] ? 1 : s[from++]);
  reshape_to(im, target);
}

void op_squeeze(Importer& im) {
  auto axes = axes_arg(im);
  Shape s = im.shape_in(0);
  std::vector<bool> drop(s.size(), false);
  if (axes) {
    for (int64_t a : *axes) {
      int64_t k = axis_of(a, s.size(), "axes value");
      if (s[size_t(k)] != 1) im.bad("cannot squeeze axis {} of size {}", a, s[size_t(k)]);
      drop[size_t(k)] = true;
    }
  } else {
    for (size_t k = 0; k < s.size(); ++k) drop[k] = s[k] == 1;
  }
  Shape target;
  for (size_t k = 0; k < s.size(); ++k)
    if (!drop[k]) target.push_back(s[k]);
  reshape_to(im, target);
}

void op_transpose(Importer& im) {
  im.allow({"perm"});
  im.arity(1, 1);
  const Shape s = im.shape_in(0);
  std::vector<int64_t> perm;
  if (auto p = im.attr_ints("perm")) {
    perm = *p;
  } else {
    for (size_t k = s.size(); k-- > 0;) perm.push_back(int64_t(k));
  }
  std::vector<bool> used(s.size(), false);
  if (perm.size() != s.size())
    im.bad_attr("perm", "has {} values for rank {}", perm.size(), s.size());
  for (int64_t p : perm) {
    if (p < 0 || p >= int64_t(s.size()) || used[size_t(p)])
      im.bad_attr("perm", "{} is not a permutation of 0..{}", shape_str(perm), s.size() - 1);
    used[size_t(p)] = true;
  }
  if (const Const* c = im.const_in(0)) return im.set_const(0, fold_transpose(*c, perm));
  for (size_t k = 0; k < perm.size(); ++k)
    if (perm[k] != int64_t(k))
      return im.emit(OpKind::Transpose, {im.dyn(0)}, im.attrs({{"perm", perm}}), {im.out(0)});
  im.set_alias(0, im.dyn(0));
}

// DepthToSpace (mode DCR or CRD) and SpaceToDepth (DCR) of a 4-D tensor.
template <OpKind Op>
void op_depth_space(Importer& im) {
  im.allow(Op == OpKind::DepthToSpace ? std::initializer_list<const char*>{"blocksize", "mode"}
                                      : std::initializer_list<const char*>{"blocksize"});
  im.arity(1, 1);
  const Shape s = im.shape_in(0);
  if (s.size() != 4)
    im.unsupported("input '{}' has shape {}: epilog rearranges 4-D (NCHW) tensors only",
                   im.in_name(0), shape_str(s));
  const int64_t block = im.attr_int_req("blocksize");
  if (block < 1 || block > kMaxDim) im.bad_attr("blocksize", "{} is out of range", block);
  const std::string mode = im.attr_string("mode", "DCR");
  if (mode != "DCR" && mode != "CRD") im.bad_attr("mode", "is '{}', expected DCR or CRD", mode);
  im.emit(Op, {im.dyn(0)},
          im.attrs({{"blocksize", std::vector<int64_t>{block, block}}, {"mode", mode}}),
          {im.out(0)});
}

// -- handlers: constants and shape arithmetic --

void op_identity(Importer& im) {
  im.allow({});
  im.arity(1, 1);
  pass_through(im);
}

// Dropout at inference is its input; so is training with ratio 0. The mask output is refused.
void op_dropout(Importer& im) {
  if (im.opset() < 7)
    im.allow({"consumed_inputs", "is_test", "ratio"});
  else if (im.opset() < 12)
    im.allow({"ratio"});
  else
    im.allow({"seed"});
  // From opset 12 the ratio and training_mode are inputs.
  im.arity(1, im.opset() < 12 ? 1 : 3, 2);
  bool training = im.opset() < 7 && im.attr_int("is_test", 0) == 0;
  float ratio = im.attr_float("ratio", 0.5f);
  if (im.has_in(1)) ratio = float(scalar_in(im, 1, "ratio"));
  if (im.has_in(2)) training = scalar_in(im, 2, "training_mode") != 0;
  if (training && ratio != 0)
    im.unsupported("is in training mode with ratio {}; epilog imports inference-mode Dropout",
                   ratio);
  if (im.used_out(1))
    im.unsupported("output 1 ('{}', the mask) is not supported", im.node().output(1));
  pass_through(im);
}

void op_constant(Importer& im) {
  im.allow({"value", "value_float", "value_floats", "value_int", "value_ints", "value_string",
            "value_strings", "sparse_value"});
  im.arity(0, 0);
  if (im.attributes().size() != 1)
    im.bad("needs exactly one value attribute, has {}", im.attributes().size());
  const std::string& kind = im.attributes().begin()->first;
  Const c;
  if (kind == "value") {
    c = im.reader().read(im.attr("value", AttributeProto::TENSOR)->t(),
                         fmt::format("{}: attribute 'value'", im.where()));
  } else if (kind == "value_float") {
    c.f = {im.attr_float("value_float", 0)};
  } else if (kind == "value_floats") {
    c.f = *im.attr_floats("value_floats");
    c.dims = {int64_t(c.f.size())};
  } else if (kind == "value_int") {
    c = int_const({}, {im.attr_int("value_int", 0)});
  } else if (kind == "value_ints") {
    std::vector<int64_t> v = *im.attr_ints("value_ints");
    c = int_const({int64_t(v.size())}, v);
  } else {
    im.unsupported_attr(kind, "string and sparse constants are not supported");
  }
  im.set_const(0, std::move(c));
}

void op_constant_of_shape(Importer& im) {
  im.allow({"value"});
  im.arity(1, 1);
  std::vector<int64_t> dims = im.ints_in(0, "shape");
  Const fill;
  fill.f = {0.0f};
  if (im.has_attr("value")) {
    fill = im.reader().read(im.attr("value", AttributeProto::TENSOR)->t(),
                            fmt::format("{}: attribute 'value'", im.where()));
    if (fill.numel() != 1) im.bad_attr("value", "has {} elements, expected 1", fill.numel());
  }
  check_folded(dims, 0);
  Const c = take(fill, dims, std::vector<int64_t>(size_t(checked_numel(dims, kMaxFolded)), 0));
  im.set_const(0, std::move(c));
}

void op_shape(Importer& im) {
  im.allow({"start", "end"});
  im.arity(1, 1);
  const Shape s = im.shape_in(0);
  const int64_t r = int64_t(s.size());
  auto place = [&](int64_t v) {
    return std::clamp(v < 0 ? std::max(v, -r) + r : v, int64_t(0), r);
  };
  int64_t b = place(im.attr_int("start", 0)), e = place(im.attr_int("end", r));
  std::vector<int64_t> dims(s.begin() + b, s.begin() + std::max(b, e));
  im.set_const(0, int_const({int64_t(dims.size())}, dims));
}

// Size: the element count of a shape known at import, an int64 scalar.
void op_size(Importer& im) {
  im.allow({});
  im.arity(1, 1);
  const Shape s = im.shape_in(0);
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  im.set_const(0, int_const({}, {n}));
}

// Gather: a constant folds. From a run-time tensor, indices that step evenly along the axis are
// a strided slice, reshaped to the indices' dims. PyTorch's dynamo exporter writes as_strided
// (ConvNeXt's pooled features viewed as [1, C, 1, 1]) as a Reshape to 1-D and a Gather of every
// index in order: that is the Reshape's input.
void op_gather(Importer& im) {
  im.allow({"axis"});
  im.arity(2, 2);
  const Const& idx = im.cst(1, "indices");
  if (idx.is_float()) im.bad("indices '{}' are float, expected integers", im.in_name(1));
  if (const Const* data = im.const_in(0))
    return im.set_const(0, fold_gather(*data, idx, im.attr_int("axis", 0)));
  const std::string x = im.dyn(0);
  const Shape s = im.value_shape(x);
  const int64_t axis = axis_of(im.attr_int("axis", 0), s.size());
  const int64_t dim = s[size_t(axis)];
  // as_strided as an identity view: x is src flattened by a Reshape, the indices 0, 1, .. shaped
  // as src at the file's batch. The result is src, at any batch.
  if (s.size() == 1 && !idx.dims.empty() && im.file_batch() > 0 &&
      idx.dims[0] == im.file_batch()) {
    const Graph& g = im.graph();
    for (auto n = g.nodes.rbegin(); n != g.nodes.rend(); ++n) {
      if (std::find(n->outputs.begin(), n->outputs.end(), x) == n->outputs.end()) continue;
      if (n->op != OpKind::Reshape) break;
      const Shape& src = im.value_shape(n->inputs[0]);
      bool identity = src.size() == idx.dims.size() && !src.empty() &&
                      std::equal(src.begin() + 1, src.end(), idx.dims.begin() + 1);
      for (size_t k = 0; identity && k < idx.i.size(); ++k) identity = idx.i[k] == int64_t(k);
      if (identity) return im.set_alias(0, n->inputs[0]);
      break;
    }
  }
  // Indices traced at the file's batch say nothing of another's: as_strided's Reshape to 1-D
  // holds the batch in that one axis.
  if (axis == 0 && im.batch() > 0 && im.file_batch() > 0 && im.batch() != im.file_batch())
    im.unsupported(
        "gathers along axis 0 of the run-time tensor '{}', which holds the batch: supported at "
        "the file's batch ({}) only, not at {}",
        x, im.file_batch(), im.batch());
  std::vector<int64_t> at(idx.i);
  for (int64_t& i : at) {
    if (i < -dim || i >= dim)
      im.bad("index {} is out of range for axis {} of size {}", i, axis, dim);
    if (i < 0) i += dim;
  }
  if (at.empty()) im.unsupported("gathers no index from the run-time tensor '{}'", x);
  const int64_t step = at.size() > 1 ? at[1] - at[0] : 1;
  for (size_t k = 1; k < at.size(); ++k)
    if (step == 0 || at[k] - at[k - 1] != step)
      im.unsupported(
          "gathers indices {}, {}, {}.. from the run-time tensor '{}': only indices that step "
          "evenly (a strided slice) are supported",
          at[0], at[1], at.size() > 2 ? at[2] : at[1], x);
  Shape out(s.begin(), s.begin() + axis);
  out.insert(out.end(), idx.dims.begin(), idx.dims.end());
  out.insert(out.end(), s.begin() + axis + 1, s.end());
  const int64_t n = int64_t(at.size()), last = at.back();
  Shape cut = s;
  cut[size_t(axis)] = n;
  std::string y = x;
  if (n != dim || step != 1) {
    y = cut == out ? im.out(0) : im.fresh_value(im.node().output(0) + ".slice");
    im.emit(OpKind::Slice, {x},
            im.attrs({{"starts", std::vector<int64_t>{at[0]}},
                      {"ends", std::vector<int64_t>{slice_end(last, step)}},
                      {"axes", std::vector<int64_t>{axis}},
                      {"steps", std::vector<int64_t>{step}}}),
            {y});
  }
  if (cut == out) return y == x ? im.set_alias(0, x) : void();
  emit_reshape(im, y, out, y == x ? "" : "reshape", axis > 0);
}

// Cast and CastLike: a constant folds; a run-time tensor stays float32 ('saturate', from
// opset 19, is for float8 only).
void cast_to(Importer& im, int64_t to) {
  const Const* c = im.const_in(0);
  if (!c) {
    if (to != TensorProto::FLOAT)
      im.unsupported("casts a run-time tensor to {}; only float32 tensors flow",
                     dtype_str(int(to)));
    return im.set_alias(0, im.dyn(0));
  }
  if (to != TensorProto::FLOAT && to != TensorProto::INT64 && to != TensorProto::INT32 &&
      to != TensorProto::BOOL)
    im.unsupported("casts to {}: constants fold to FLOAT, INT64, INT32 and BOOL only",
                   dtype_str(int(to)));
  im.set_const(0, fold_cast(*c, to));
}

void op_cast(Importer& im) {
  im.allow({"to", "saturate"});
  im.arity(1, 1);
  cast_to(im, im.attr_int_req("to"));
}

// To the type of input 1: a constant's, or float32 for a run-time tensor.
void op_cast_like(Importer& im) {
  im.allow({"saturate"});
  im.arity(2, 2);
  const Const* like = im.const_in(1);
  cast_to(im, like ? like->dtype : int32_t(TensorProto::FLOAT));
}

}  // namespace

const std::map<std::string, OpHandler>& op_handlers() {
  static const std::map<std::string, OpHandler> table = {
      {"Abs", op_activation<OpKind::Abs>},
      {"Add", op_add},
      {"AveragePool", op_avgpool},
      {"BatchNormalization", op_batchnorm},
      {"Cast", op_cast},
      {"CastLike", op_cast_like},
      {"Clip", op_clip},
      {"Concat", op_concat},
      {"Constant", op_constant},
      {"ConstantOfShape", op_constant_of_shape},
      {"Conv", op_conv},
      {"ConvTranspose", op_conv_transpose},
      {"DepthToSpace", op_depth_space<OpKind::DepthToSpace>},
      {"Div", op_div},
      {"Elu", op_elu},
      {"Erf", op_activation<OpKind::Erf>},
      {"Exp", op_activation<OpKind::Exp>},
      {"Gelu", op_gelu},
      {"HardSigmoid", op_hardsigmoid},
      {"HardSwish", op_activation<OpKind::HardSwish>},
      {"LeakyRelu", op_leaky_relu},
      {"Log", op_activation<OpKind::Log>},
      {"LogSoftmax", op_softmax<OpKind::LogSoftmax>},
      {"Mish", op_activation<OpKind::Mish>},
      {"Neg", op_neg},
      {"Pow", op_pow},
      {"Reciprocal", op_activation<OpKind::Reciprocal>},
      {"Softplus", op_activation<OpKind::Softplus>},
      {"Sqrt", op_activation<OpKind::Sqrt>},
      {"Tanh", op_activation<OpKind::Tanh>},
      {"Dropout", op_dropout},
      {"Flatten", op_flatten},
      {"Gather", op_gather},
      {"Gemm", op_gemm},
      {"GlobalAveragePool", op_global_avgpool},
      {"GroupNormalization", op_group_norm},
      {"Identity", op_identity},
      {"InstanceNormalization", op_instance_norm},
      {"LayerNormalization", op_layer_norm},
      {"MatMul", op_matmul},
      {"Max", op_max},
      {"MaxPool", op_maxpool},
      {"Mean", op_mean},
      {"Min", op_min},
      {"Mul", op_mul},
      {"Pad", op_pad},
      {"ReduceL1", op_reduce_l1},
      {"ReduceL2", op_reduce_l2},
      {"ReduceLogSum", op_reduce_log_sum},
      {"ReduceLogSumExp", op_reduce_log_sum_exp},
      {"ReduceMax", op_reduce<OpKind::ReduceMax, 18>},
      {"ReduceMean", op_reduce<OpKind::ReduceMean, 18>},
      {"ReduceMin", op_reduce<OpKind::ReduceMin, 18>},
      {"ReduceProd", op_reduce<OpKind::ReduceProd, 18>},
      {"ReduceSum", op_reduce<OpKind::ReduceSum, 13>},
      {"ReduceSumSquare", op_reduce_sum_square},
      {"Relu", op_relu},
      {"Reshape", op_reshape},
      {"Resize", op_resize},
      {"Shape", op_shape},
      {"Sigmoid", op_sigmoid},
      {"Slice", op_slice},
      {"Size", op_size},
      {"Softmax", op_softmax<OpKind::Softmax>},
      {"SpaceToDepth", op_depth_space<OpKind::SpaceToDepth>},
      {"Split", op_split},
      {"Squeeze", op_squeeze},
      {"Sub", op_sub},
      {"Sum", op_sum},
      {"Transpose", op_transpose},
      {"Unsqueeze", op_unsqueeze},
      {"Upsample", op_upsample},
  };
  return table;
}

}  // namespace epilog::onnx_import

#endif  // EPILOG_HAVE_ONNX
