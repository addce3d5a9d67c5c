// The ONNX importer's handlers of elementwise ops (activations, arithmetic), reductions and
// linear layers: one function per ONNX op (the op list, and what each maps to: onnx_ops.cpp).
#ifdef EPILOG_HAVE_ONNX

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <limits>
#include <set>

#include "epilog/graph/activation.h"
#include "onnx_ops.h"

namespace epilog::onnx_import {
namespace {

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

// Ops epilog evaluates on constants only, at import: the Fourier features some models build in
// the graph from shapes alone (EdgeNeXt's and XCiT's positional encodings: a cumsum of ones,
// sin and cos). On a run-time tensor, one message.
const Const& constant_operand(Importer& im, int k = 0) {
  const Const* c = im.const_in(k);
  if (!c)
    im.unsupported("input '{}' is computed at run time; epilog evaluates {} on constants only",
                   im.in_name(k), im.op());
  return *c;
}

template <double (*F)(double)>
void op_fold_float(Importer& im) {
  im.allow({});
  im.arity(1, 1);
  Const c = constant_operand(im);
  if (!c.is_float()) im.bad("input '{}' is {}, expected float", im.in_name(0), c.describe());
  for (float& v : c.f) v = float(F(double(v)));
  im.set_const(0, std::move(c));
}
double round_even(double v) {
  return std::nearbyint(v);  // ties to even, the default rounding mode: ONNX Round's
}

void op_not(Importer& im) {
  im.allow({});
  im.arity(1, 1);
  Const c = constant_operand(im);
  if (c.dtype != TensorProto::BOOL)
    im.bad("input '{}' is {}, expected bool", im.in_name(0), c.describe());
  for (int64_t& v : c.i) v = v == 0;
  im.set_const(0, std::move(c));
}

// Comparisons and logic (shape arithmetic in some exports: a dim tested against -1, picked by
// Where), and Range: on constants, folded.
void op_compare(Importer& im) {
  im.allow({});
  im.arity(2, 2);
  const Const &a = constant_operand(im), &b = constant_operand(im, 1);
  im.set_const(0, fold_compare(a, b, im.op()));
}

// Mod on constants (shape arithmetic: a dim's remainder): fmod 1 is C's remainder, fmod 0
// (integers only) Python's.
void op_mod(Importer& im) {
  im.allow({"fmod"});
  im.arity(2, 2);
  const Const &a = constant_operand(im), &b = constant_operand(im, 1);
  im.set_const(0, fold_binary(a, b, im.attr_int("fmod", 0) != 0 ? '%' : 'm'));
}

// Trilu of a constant (the triangular masks attention builds from a shape): the elements on and
// above (upper) or below (lower) diagonal k of the last two dims kept, the others 0.
void op_trilu(Importer& im) {
  im.allow({"upper"});
  im.arity(1, 2);
  Const c = constant_operand(im);
  const bool upper = im.attr_int("upper", 1) != 0;
  const std::vector<int64_t> kv = im.has_in(1) ? im.ints_in(1, "k") : std::vector<int64_t>{0};
  if (kv.size() != 1) im.bad("k '{}' has {} values, expected 1", im.in_name(1), kv.size());
  const int64_t k = kv[0];
  if (c.dims.size() < 2)
    im.bad("input '{}' is {}, expected 2 dims or more", im.in_name(0), c.describe());
  const int64_t rows = c.dims[c.dims.size() - 2], cols = c.dims.back();
  for (int64_t e = 0; e < c.numel(); ++e) {
    const int64_t i = e / cols % rows, j = e % cols;
    if (upper ? j - i >= k : j - i <= k) continue;
    if (c.is_float())
      c.f[size_t(e)] = 0.0f;
    else
      c.i[size_t(e)] = 0;
  }
  im.set_const(0, std::move(c));
}

// Where and Range: three inputs, all constants.
template <Const (*Fold)(const Const&, const Const&, const Const&)>
void op_fold3(Importer& im) {
  im.allow({});
  im.arity(3, 3);
  if (!im.all_const())
    im.unsupported("an input is computed at run time; epilog evaluates {} on constants only",
                   im.op());
  im.set_const(0, Fold(*im.const_in(0), *im.const_in(1), *im.const_in(2)));
}

void op_cumsum(Importer& im) {
  im.allow({"exclusive", "reverse"});
  im.arity(2, 2);
  const Const& x = constant_operand(im);
  const std::vector<int64_t> axis = im.ints_in(1, "axis");
  if (axis.size() != 1) im.bad("axis '{}' has {} values, expected one", im.in_name(1), axis.size());
  const bool exclusive = im.attr_int("exclusive", 0) != 0, reverse = im.attr_int("reverse", 0) != 0;
  im.set_const(0, fold_cumsum(x, axis[0], exclusive, reverse));
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

// Selu: gamma * elu(x, alpha) (ONNX's defaults: SELU's constants).
void op_selu(Importer& im) {
  im.allow({"alpha", "gamma"});
  im.arity(1, 1);
  Attrs a;
  a.set("alpha", double(im.attr_float("alpha", 1.67326319217681884765625f)));
  const std::string e = im.fresh_value(im.out(0) + ".elu");
  im.emit(OpKind::Elu, {im.dyn(0)}, a, {e});
  const std::string gamma =
      scalar_weight(im, im.out(0) + ".gamma", im.attr_float("gamma", 1.05070102214813232421875f));
  im.emit(OpKind::Mul, {e, gamma}, {}, {im.out(0)}, "gamma");
}

// PRelu with a constant slope of dims `dims` broadcast to x, as a chain from x (which the
// elementwise fusion runs as one kernel): max(x, slope * x) where every slope is at most 1,
// min(x, slope * x) where every slope is at least 1, both exact; else x + (slope - 1) * min(x,
// 0), whose error relative to slope * x grows as 2^-24 / |slope|.
void prelu_of(Importer& im, const Shape& x, Const slope) {
  const Shape& dims = slope.dims;
  if (dims.size() > x.size())
    im.bad("slope {} has more dims than x {}", shape_str(dims), shape_str(x));
  for (size_t d = 0; d < dims.size(); ++d) {
    const int64_t s = dims[dims.size() - 1 - d], n = x[x.size() - 1 - d];
    if (s != 1 && s != n)
      im.bad("slope {} does not broadcast to x {}", shape_str(dims), shape_str(x));
  }
  const bool below = std::all_of(slope.f.begin(), slope.f.end(), [](float v) { return v <= 1; });
  const bool above = std::all_of(slope.f.begin(), slope.f.end(), [](float v) { return v >= 1; });
  const std::string y = im.out(0), in = im.dyn(0);
  const std::string factor = im.fresh_value(y + ".slope"), scaled = im.fresh_value(y + ".scaled");
  if (below || above) {
    im.add_weight(factor, slope);
    im.emit(OpKind::Mul, {in, factor}, {}, {scaled}, "slope");
    return im.emit(below ? OpKind::Max : OpKind::Min, {scaled, in}, {}, {y});
  }
  for (float& v : slope.f) v -= 1.0f;
  const std::string zero = scalar_weight(im, y + ".zero", 0.0f);
  const std::string neg = im.fresh_value(y + ".negative");
  im.add_weight(factor, slope);
  im.emit(OpKind::Min, {in, zero}, {}, {neg});
  im.emit(OpKind::Mul, {neg, factor}, {}, {scaled}, "slope");
  im.emit(OpKind::Add, {scaled, in}, {}, {y}, "sum");
}

// PRelu: x where x >= 0, slope * x below. One slope is leaky_relu; a slope per channel
// (PyTorch's PReLU(C), exported as [C, 1, 1]) an elementwise chain (prelu_of). The slope
// broadcasts to x, not x to it.
void op_prelu(Importer& im) {
  im.allow({});
  im.arity(2, 2);
  Const slope = im.cst(1, "slope");
  if (!slope.is_float()) im.bad("slope '{}' is not float", im.in_name(1));
  const Shape x = im.shape_in(0);
  if (slope.numel() == 1) {
    Attrs a;
    a.set("alpha", double(slope.f[0]));
    return im.emit(OpKind::LeakyRelu, {im.dyn(0)}, a, {im.out(0)});
  }
  // Before opset 7 a slope of C values is per channel (axis 1).
  if (im.opset() < 7 && slope.dims.size() == 1 && x.size() > 2 && slope.dims[0] == x[1]) {
    slope.dims = Shape(x.size() - 1, 1);
    slope.dims[0] = x[1];
  }
  prelu_of(im, x, std::move(slope));
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
  if (im.all_const()) {  // the result has the base's type; a float base may take an int exponent
    const Const &base = *im.const_in(0), &e = *im.const_in(1);
    if (!base.is_float() && e.is_float())
      im.unsupported("integer base '{}' with a float exponent is not folded", im.in_name(0));
    return im.set_const(0, fold_binary(base, base.is_float() ? fold_cast(e, base.dtype) : e, '^'));
  }
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
  const std::string scale = scalar_weight(im, im.node().output(0) + ".scale", float(1.0 / n));
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

// Gemm: alpha * A' B' + beta * C. A constant B (the usual classifier) is a linear layer's
// weight, alpha folded in; a run-time B a batched matmul (transB: of B transposed). transA
// transposes A first; beta folds into a constant C, else scales it. A bias of one value per
// output feature (or one for all) joins the linear node, any other C is added.
void op_gemm(Importer& im) {
  im.allow({"alpha", "beta", "transA", "transB", "broadcast"});
  im.arity(2, 3);
  const bool trans_a = im.attr_int("transA", 0) != 0, trans_b = im.attr_int("transB", 0) != 0;
  const float alpha = im.attr_float("alpha", 1), beta = im.attr_float("beta", 1);
  const bool with_c = im.has_in(2) && beta != 0;  // beta 0 drops C (PyTorch's mm exports so)
  for (int k = 0; k < 2; ++k)
    if (im.shape_in(k).size() != 2)
      im.bad("input {} '{}' has shape {}, expected 2 dims", k == 0 ? "A" : "B", im.in_name(k),
             shape_str(im.shape_in(k)));
  const auto transpose = [&](const std::string& x, const char* label) {
    const std::string y = im.fresh_value(x + ".T");
    im.emit(OpKind::Transpose, {x}, im.attrs({{"perm", std::vector<int64_t>{1, 0}}}), {y}, label);
    return y;
  };
  const std::string a = trans_a ? transpose(im.dyn(0), "transpose_a") : im.dyn(0);
  const Const* b = im.const_in(1);
  const bool matmul = !b || !b->is_float();
  const bool scaled = alpha == 1 || !matmul;  // alpha applied (folded into a constant B)
  std::string w;  // [N, K] for the linear layer, or B as the matmul's [K, N]
  if (matmul) {
    w = trans_b ? transpose(im.dyn(1), "transpose_b") : im.dyn(1);
  } else if (trans_b) {
    w = scaled_weight(im, im.in_name(1), *b, alpha, ".alpha");
  } else {
    Const bw = *b;
    for (float& v : bw.f) v *= alpha;
    w = transposed_weight(im, im.in_name(1), bw);
  }
  const int64_t n = im.value_shape(w)[matmul ? 1 : 0];
  std::vector<std::string> ins = {a, w};
  std::string add;  // a C that is not one value per output feature
  if (with_c) {
    const Shape cs = im.shape_in(2);
    const Const* c = im.const_in(2);
    if (c && c->is_float() && !matmul && cs.size() <= 2 &&
        std::all_of(cs.begin(), cs.end() - (cs.empty() ? 0 : 1),
                    [](int64_t d) { return d == 1; }) &&
        (cs.empty() || cs.back() == 1 || cs.back() == n)) {
      // One value per output feature (or one for all): the linear bias, spread to [N].
      if (cs == Shape{n}) {
        ins.push_back(scaled_weight(im, im.in_name(2), *c, beta, ".beta"));
      } else {
        Const bias;
        bias.dims = {n};
        check_folded(bias.dims, c->numel());
        for (int64_t k = 0; k < n; ++k)
          bias.f.push_back(beta * (c->numel() == 1 ? c->f[0] : c->f[size_t(k)]));
        ins.push_back(im.fresh_value(im.in_name(2) + ".bias"));
        im.add_weight(ins.back(), bias);
      }
    } else if (c && c->is_float()) {
      add = scaled_weight(im, im.in_name(2), *c, beta, ".beta");
    } else if (!c && cs == Shape{n} && beta == 1 && !matmul) {
      ins.push_back(im.dyn(2));
    } else {
      add = im.dyn(2);
      if (beta != 1) {
        const std::string y = im.fresh_value(add + ".beta");
        im.emit(OpKind::Mul, {add, scalar_weight(im, im.out(0) + ".beta", beta)}, {}, {y}, "beta");
        add = y;
      }
    }
  }
  // The product, then alpha where it is not folded, then C.
  std::string y = add.empty() && scaled ? im.out(0) : im.fresh_value(im.node().output(0) + ".mm");
  im.emit(matmul ? OpKind::MatMul : OpKind::Linear, ins, {}, {y});
  if (!scaled) {
    const std::string z = add.empty() ? im.out(0) : im.fresh_value(y + ".alpha");
    im.emit(OpKind::Mul, {y, scalar_weight(im, im.out(0) + ".alpha", alpha)}, {}, {z}, "alpha");
    y = z;
  }
  if (!add.empty()) im.emit(OpKind::Add, {y, add}, {}, {im.out(0)}, "bias");
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

// Einsum of one or two operands without ellipses or diagonals (a letter twice in one term), as
// epilog's ops: each operand's letters found in no other term and not in the output summed
// (reduce_sum); one operand then transposed to the output's order; two multiplied as a batched
// matmul, [batch, a's free, contracted] by [batch, contracted, b's free] (letters in both and in
// the output, in a only, in both but not the output, in b only), reshaped to those letters and
// transposed to the output's order. Without "->" the output holds the letters seen once, sorted.
void op_einsum(Importer& im) {
  im.allow({"equation"});
  im.arity(1, 2);
  std::string eq;
  for (char ch : im.attr_string("equation", "")) {
    if (ch != ' ') eq += ch;
  }
  if (eq.find("...") != std::string::npos)
    im.unsupported_attr("equation", "'{}' has an ellipsis; epilog takes explicit letters", eq);
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t at = 0;;) {
    const size_t comma = lhs.find(',', at);
    terms.push_back(lhs.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (int(terms.size()) != im.n_in())
    im.bad_attr("equation", "'{}' has {} operands, the node {} inputs", eq, terms.size(),
                im.n_in());
  std::map<char, int64_t> size, seen;
  for (size_t t = 0; t < terms.size(); ++t) {
    const Shape sh = im.shape_in(int(t));
    if (terms[t].size() != sh.size())
      im.bad_attr("equation", "'{}' has {} letters for input {} of shape {}", terms[t],
                  terms[t].size(), t, shape_str(sh));
    for (size_t d = 0; d < sh.size(); ++d) {
      const char ch = terms[t][d];
      if (!std::isalpha(static_cast<unsigned char>(ch)))
        im.bad_attr("equation", "'{}' holds '{}', not a letter", eq, ch);
      if (terms[t].find(ch) != d)
        im.unsupported_attr("equation", "'{}' takes a diagonal ('{}' twice in one term)", eq, ch);
      if (size.count(ch) && size[ch] != sh[d])
        im.bad_attr("equation", "'{}' is {} in one input and {} in another", ch, size[ch], sh[d]);
      size[ch] = sh[d];
      ++seen[ch];
    }
  }
  std::string out;
  if (arrow == std::string::npos) {
    for (const auto& [ch, n] : seen)
      if (n == 1) out += ch;
  } else {
    out = eq.substr(arrow + 2);
  }
  for (size_t d = 0; d < out.size(); ++d)
    if (!size.count(out[d]) || out.find(out[d]) != d)
      im.bad_attr("equation", "output letter '{}' is in no input or twice", out[d]);
  const std::string base = im.node().output(0);
  const auto in = [](const std::string& text, char ch) {
    return text.find(ch) != std::string::npos;
  };
  // -- each operand: its letters in no other term summed away --
  std::vector<std::string> vals, kept(terms.size());
  for (size_t t = 0; t < terms.size(); ++t) {
    std::vector<int64_t> axes;
    for (size_t d = 0; d < terms[t].size(); ++d) {
      const char ch = terms[t][d];
      const bool other = terms.size() == 2 && in(terms[1 - t], ch);
      if (in(out, ch) || other)
        kept[t] += ch;
      else
        axes.push_back(int64_t(d));
    }
    vals.push_back(im.dyn(int(t)));
    if (axes.empty()) continue;
    const std::string y = im.fresh_value(base + ".sum" + std::to_string(t));
    im.emit(OpKind::ReduceSum, {vals[t]}, im.attrs({{"axes", axes}, {"keepdims", int64_t(0)}}), {y},
            "sum" + std::to_string(t));
    vals[t] = y;
  }
  // `v` (letters `have`) transposed to the letters `want`: v itself where they agree, else into
  // `y` (a fresh value where empty).
  const auto permute = [&](const std::string& v, const std::string& have, const std::string& want,
                           std::string y, const std::string& suffix) {
    if (have == want) return v;
    std::vector<int64_t> perm;
    for (char ch : want) perm.push_back(int64_t(have.find(ch)));
    if (y.empty()) y = im.fresh_value(base + "." + suffix);
    im.emit(OpKind::Transpose, {v}, im.attrs({{"perm", perm}}), {y}, suffix);
    return y;
  };
  if (terms.size() == 1) {  // the output: x in its order, or x itself
    if (kept[0] == out) return im.set_alias(0, vals[0]);
    permute(vals[0], kept[0], out, im.out(0), "transpose");
    return;
  }
  // -- two operands: a batched matmul --
  std::string batch, a_free, contracted, b_free;
  for (char ch : kept[0]) (in(kept[1], ch) ? in(out, ch) ? batch : contracted : a_free) += ch;
  for (char ch : kept[1])
    if (!in(kept[0], ch)) b_free += ch;
  const auto extent = [&](const std::string& letters) {
    int64_t n = 1;
    for (char ch : letters) n *= size[ch];
    return n;
  };
  const int64_t nb = extent(batch), m = extent(a_free), k = extent(contracted), n = extent(b_free);
  const auto as_3d = [&](int t, const std::string& order, Shape to) {
    const std::string v = permute(vals[size_t(t)], kept[size_t(t)], order, "",
                                  std::string(t == 0 ? "a" : "b") + ".transpose");
    const std::string y = im.fresh_value(base + (t == 0 ? ".a" : ".b"));
    im.emit(OpKind::Reshape, {v}, im.attrs({{"shape", to}}), {y}, t == 0 ? "a" : "b");
    return y;
  };
  const std::string a = as_3d(0, batch + a_free + contracted, {nb, m, k});
  const std::string b = as_3d(1, batch + contracted + b_free, {nb, k, n});
  const std::string mm = im.fresh_value(base + ".mm");
  im.emit(OpKind::MatMul, {a, b}, {}, {mm}, "mm");
  const std::string letters = batch + a_free + b_free;
  Shape dims;
  for (char ch : letters) dims.push_back(size[ch]);
  const std::string y = letters == out ? im.out(0) : im.fresh_value(base + ".letters");
  im.emit(OpKind::Reshape, {mm}, im.attrs({{"shape", dims}}), {y}, "letters");
  if (letters != out) permute(y, letters, out, im.out(0), "transpose");
}

}  // namespace

void add_math_handlers(std::map<std::string, OpHandler>& table) {
  table.insert({
      {"Abs", op_activation<OpKind::Abs>},
      {"Add", op_add},
      {"And", op_compare},
      {"Ceil", op_fold_float<std::ceil>},
      {"Clip", op_clip},
      {"Cos", op_fold_float<std::cos>},
      {"CumSum", op_cumsum},
      {"Equal", op_compare},
      {"Floor", op_fold_float<std::floor>},
      {"Greater", op_compare},
      {"GreaterOrEqual", op_compare},
      {"Less", op_compare},
      {"LessOrEqual", op_compare},
      {"Mod", op_mod},
      {"Not", op_not},
      {"Or", op_compare},
      {"Range", op_fold3<fold_range>},
      {"Round", op_fold_float<round_even>},
      {"Sin", op_fold_float<std::sin>},
      {"Where", op_fold3<fold_where>},
      {"Xor", op_compare},
      {"Div", op_div},
      {"Elu", op_elu},
      {"PRelu", op_prelu},
      {"Selu", op_selu},
      {"Erf", op_activation<OpKind::Erf>},
      {"Exp", op_activation<OpKind::Exp>},
      {"Gelu", op_gelu},
      {"HardSigmoid", op_hardsigmoid},
      {"HardSwish", op_activation<OpKind::HardSwish>},
      {"LeakyRelu", op_leaky_relu},
      {"Log", op_activation<OpKind::Log>},
      {"Mish", op_activation<OpKind::Mish>},
      {"Neg", op_neg},
      {"Pow", op_pow},
      {"Reciprocal", op_activation<OpKind::Reciprocal>},
      {"Softplus", op_activation<OpKind::Softplus>},
      {"Sqrt", op_activation<OpKind::Sqrt>},
      {"Tanh", op_activation<OpKind::Tanh>},
      {"Einsum", op_einsum},
      {"Gemm", op_gemm},
      {"MatMul", op_matmul},
      {"Max", op_max},
      {"Mean", op_mean},
      {"Min", op_min},
      {"Mul", op_mul},
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
      {"Sigmoid", op_sigmoid},
      {"Sub", op_sub},
      {"Trilu", op_trilu},
      {"Sum", op_sum},
  });
}

}  // namespace epilog::onnx_import

#endif  // EPILOG_HAVE_ONNX
