// Canonicalization: the ways exporters spell an op, each rewritten to that one op, so that the
// fusion rules and the kernels see one spelling. Every rule checks the constants of its form
// against the ones the op means and refuses, naming the constant, where they differ: a wrong
// match would change what the graph computes.
//
//   mul(x, sigmoid(x))                                 -> silu
//   x * (erf(x / sqrt 2) + 1) * 0.5, in any order      -> gelu
//   x * relu6(x + 3) / 6, x * hardsigmoid(x)           -> hardswish
//   LayerNorm as reduce_mean, sub, pow, ..., add       -> layer_norm
//   reduce_mean over every dim after N and C           -> global_avgpool (+ flatten)
//   reshape, transpose, reshape on the channels        -> channel_shuffle
//   channel_shuffle of a concat on the channels        -> channel_shuffle of its inputs
//   reshape to 6-D, transpose, reshape (pixel_shuffle) -> depth_to_space
//   transpose to NHWC, layer_norm / linear / activation -> their NCHW twins, transposes that
//   cancel                                               -> none
//   conv_transpose2d of groups 1, dilation 1          -> conv2d, depth_to_space (cropped)
//   batchnorm or activation of depth_to_space          -> the same before it
//   batchnorm or activation of a concat of convs       -> one a part (each fuses into its conv)
#include <algorithm>
#include <cmath>

#include "epilog/graph/activation.h"
#include "epilog/graph/passes.h"

namespace epilog {
namespace {

// -- checks --

// Whether v is within a relative 1e-6 of want (exactly want when want is 0).
bool near(double v, double want) {
  return std::fabs(v - want) <= 1e-6 * std::fabs(want);
}

// Whether `value` is a constant of one element near `want`.
std::string scalar_is(const Graph& g, const std::string& value, double want) {
  if (!g.is_weight(value) || shape_numel(g.value(value).shape) != 1)
    return fmt::format("'{}' is not a constant of one value", value);
  const double v = g.weights.at(value).data.f32()[0];
  if (!near(v, want)) return fmt::format("'{}' is {}, not {}", value, v, want);
  return "";
}

// Whether float attribute `attr` of node n is near `want`.
std::string attr_is(const Node& n, const char* attr, double want) {
  const double v = n.attrs.f(attr);
  if (!near(v, want))
    return fmt::format("{} '{}' has {} {}, not {}", op_name(n.op), n.name, attr, v, want);
  return "";
}

// The first reason to refuse among `reasons`, or "".
std::string first(std::initializer_list<std::string> reasons) {
  for (const std::string& why : reasons)
    if (!why.empty()) return why;
  return "";
}

// The root's output has the shape of the value bound to x: no constant of the form broadcasts x
// to more elements, so the op that replaces it, applied to x, makes the same tensor.
std::string keeps_shape(const Match& m) {
  const Graph& g = *m.graph;
  const Shape& y = g.value(g.nodes[size_t(m.root)].outputs[0]).shape;
  const Shape& x = g.value(m.value("x")).shape;
  if (y != x) return fmt::format("a constant broadcasts {} to {}", shape_str(x), shape_str(y));
  return "";
}

// The root as one node of `op` that reads x and makes the root's outputs.
Replacement unary(const Match& m, OpKind kind, const Attrs& attrs = {}) {
  const Node& root = m.graph->nodes[size_t(m.root)];
  return Replacement{
      {Node{
          root.name, kind, normalize_attrs(kind, root.name, attrs), {m.value("x")}, root.outputs}},
      {}};
}

// -- gelu --

// GELU as PyTorch's exporter spells it below opset 20, x * (erf(x / sqrt(2)) + 1) * 0.5, with
// the division also as a product by 1 / sqrt(2), and the 0.5 taken with the product, with x or
// with erf + 1.
void gelu_rules(std::vector<Rule>& rules) {
  const auto check = [](const Match& m) {
    const Graph& g = *m.graph;
    const bool div = m.node("scaled").op == OpKind::Div;
    return first({scalar_is(g, m.value("k"), div ? std::sqrt(2.0) : std::sqrt(0.5)),
                  scalar_is(g, m.value("one"), 1.0), scalar_is(g, m.value("half"), 0.5),
                  keeps_shape(m)});
  };
  const auto apply = [](const Match& m) { return unary(m, OpKind::Gelu); };
  for (OpKind scale : {OpKind::Div, OpKind::Mul}) {
    const Pat erf1 = op(
        OpKind::Add,
        {op(OpKind::Erf, {op(scale, {any("x"), any("k")}, "scaled")}, "erf"), any("one")}, "add");
    for (const Pat& form :
         {op(OpKind::Mul, {op(OpKind::Mul, {any("x"), erf1}, "inner"), any("half")}, "mul"),
          op(OpKind::Mul, {op(OpKind::Mul, {any("x"), any("half")}, "inner"), erf1}, "mul"),
          op(OpKind::Mul, {any("x"), op(OpKind::Mul, {erf1, any("half")}, "inner")}, "mul")})
      rules.push_back({"gelu(erf)->gelu", form, OpKind::Gelu, check, apply});
  }
}

// -- hardswish --

// x * relu6(x + 3) / 6 with relu6 as clip(0, 6), min(max(., 0), 6) or max(min(., 6), 0) and the
// division by 6 (or product by 1 / 6) applied to the product, to the relu6 or to x; and
// x * hardsigmoid(x) with hardsigmoid's alpha 1 / 6 and beta 0.5.
void hardswish_rules(std::vector<Rule>& rules) {
  const Pat shifted = op(OpKind::Add, {any("x"), any("three")}, "shifted");
  const std::vector<Pat> relu6s = {
      op(OpKind::Clip, {shifted}, "relu6"),
      op(OpKind::Min, {op(OpKind::Max, {shifted, any("zero")}, "max"), any("six")}, "relu6"),
      op(OpKind::Max, {op(OpKind::Min, {shifted, any("six")}, "min"), any("zero")}, "relu6")};
  const auto check = [](const Match& m) {
    const Graph& g = *m.graph;
    const Node& relu6 = m.node("relu6");
    const bool clip = relu6.op == OpKind::Clip;
    const bool div = m.node("scale").op == OpKind::Div;
    return first({scalar_is(g, m.value("three"), 3.0),
                  clip ? attr_is(relu6, "min", 0.0) : scalar_is(g, m.value("zero"), 0.0),
                  clip ? attr_is(relu6, "max", 6.0) : scalar_is(g, m.value("six"), 6.0),
                  scalar_is(g, m.value("sixth"), div ? 6.0 : 1.0 / 6.0), keeps_shape(m)});
  };
  const auto apply = [](const Match& m) { return unary(m, OpKind::HardSwish); };
  for (const Pat& relu6 : relu6s)
    for (OpKind scale : {OpKind::Div, OpKind::Mul}) {
      const auto sixth = [&](const Pat& p) { return op(scale, {p, any("sixth")}, "scale"); };
      for (const Pat& form : {sixth(op(OpKind::Mul, {any("x"), relu6}, "mul")),
                              op(OpKind::Mul, {any("x"), sixth(relu6)}, "mul"),
                              op(OpKind::Mul, {sixth(any("x")), relu6}, "mul")})
        rules.push_back({"x*relu6(x+3)/6->hardswish", form, OpKind::HardSwish, check, apply});
    }
  rules.push_back({"x*hardsigmoid(x)->hardswish",
                   op(OpKind::Mul, {any("x"), op(OpKind::HardSigmoid, {any("x")}, "hs")}, "mul"),
                   OpKind::HardSwish,
                   [](const Match& m) {
                     const Node& hs = m.node("hs");
                     return first({attr_is(hs, "alpha", 1.0 / 6.0), attr_is(hs, "beta", 0.5)});
                   },
                   apply});
}

// -- layer_norm --

// What a decomposed LayerNorm normalizes: x's dims first..last, and its eps.
struct NormSpan {
  int64_t first = 0, last = 0;
  double eps = 0;
};

// Whether constant `value` holds one number per element of x's dims first..last: its shape,
// aligned with x's at the back, is x's there and 1 elsewhere (so its numbers, in order, are
// layer_norm's scale or bias).
std::string per_element(const Graph& g, const std::string& value, const Shape& x,
                        const NormSpan& s) {
  if (!g.is_weight(value)) return fmt::format("'{}' is computed, not a constant", value);
  const Shape& w = g.value(value).shape;
  bool ok = w.size() <= x.size();
  for (size_t d = 0; ok && d < x.size(); ++d) {
    const size_t lead = x.size() - w.size();
    const int64_t have = d < lead ? 1 : w[d - lead];
    ok = have == (int64_t(d) >= s.first && int64_t(d) <= s.last ? x[d] : 1);
  }
  if (!ok)
    return fmt::format("'{}' of shape {} is not one value per element of dims {} to {} of {}",
                       value, shape_str(w), s.first, s.last, shape_str(x));
  return "";
}

// The span of a decomposed LayerNorm, or the reason it is none: both means over one run of x's
// dims with keepdims, a square as pow 2, eps a constant >= 0, and the weight and bias (where
// the form has them) constants per element of the normalized dims.
std::string norm_span(const Match& m, NormSpan& s) {
  const Graph& g = *m.graph;
  const Shape& x = g.value(m.value("x")).shape;
  const Node &mean = m.node("mean"), &var = m.node("var");
  const std::vector<Shape> shapes{x};
  const std::vector<bool> axes = reduce_axes(InferContext{mean.op, mean.name, mean.attrs, shapes});
  if (mean.attrs.i("keepdims") == 0 || var.attrs.i("keepdims") == 0)
    return fmt::format("'{}' or '{}' drops the reduced dims (keepdims 0)", mean.name, var.name);
  if (axes != reduce_axes(InferContext{var.op, var.name, var.attrs, shapes}))
    return fmt::format("'{}' and '{}' reduce other dims", mean.name, var.name);
  const auto begin = std::find(axes.begin(), axes.end(), true);
  const auto end = std::find(begin, axes.end(), false);
  if (std::find(end, axes.end(), true) != axes.end())
    return fmt::format("'{}' reduces dims that are not one run", mean.name);
  s.first = begin - axes.begin();
  s.last = end - axes.begin() - 1;
  const Node& sq = m.node("sq");
  if (sq.op == OpKind::Pow && !near(sq.attrs.f("exponent"), 2.0))
    return fmt::format("'{}' raises to {}, not 2", sq.name, sq.attrs.f("exponent"));
  const std::string& eps = m.value("eps");
  if (!g.is_weight(eps) || shape_numel(g.value(eps).shape) != 1 ||
      !(g.weights.at(eps).data.f32()[0] >= 0))
    return fmt::format("eps '{}' is not a constant of one value >= 0", eps);
  s.eps = g.weights.at(eps).data.f32()[0];
  std::string why = keeps_shape(m);
  for (const char* affine : {"w", "b"})
    if (why.empty() && m.value_of.count(affine)) why = per_element(g, m.value(affine), x, s);
  return why;
}

// The constant `value` as a weight of `shape` (its numbers): itself where it has that shape.
std::string weight_as(const Graph& g, Replacement& r, const std::string& value, const Shape& shape,
                      const std::string& base) {
  if (g.value(value).shape == shape) return value;
  const std::string name = g.unique_name(base);
  r.weights[name] = g.weights.at(value).data.reshape(shape);
  return name;
}

Replacement to_layer_norm(const Match& m) {
  const Graph& g = *m.graph;
  NormSpan s;
  norm_span(m, s);
  const Node& root = g.nodes[size_t(m.root)];
  const Shape& x = g.value(m.value("x")).shape;
  const Shape dims(x.begin() + s.first, x.begin() + s.last + 1);
  Replacement r;
  std::vector<std::string> ins{m.value("x")};
  if (m.value_of.count("w")) {
    ins.push_back(weight_as(g, r, m.value("w"), dims, root.name + ".scale"));
  } else {
    ins.push_back(g.unique_name(root.name + ".scale"));
    r.weights[ins.back()] = Tensor::full(dims, 1.0f);
  }
  if (m.value_of.count("b"))
    ins.push_back(weight_as(g, r, m.value("b"), dims, root.name + ".bias"));
  Attrs a;
  a.set("axis", s.first);
  a.set("last_axis", s.last + 1 == int64_t(x.size()) ? int64_t(-1) : s.last);
  a.set("eps", s.eps);
  r.nodes.push_back(Node{root.name, OpKind::LayerNorm,
                         normalize_attrs(OpKind::LayerNorm, root.name, a), ins, root.outputs});
  return r;
}

// LayerNorm as exporters decompose it (before opset 17, and ConvNeXt's channels-first one):
// d = x - mean(x), (d / sqrt(mean(d^2) + eps)) [* weight] [+ bias], the means over one run of
// dims with keepdims. The square is pow(d, 2) or d * d, the division one by the square root or
// a product by its reciprocal, and d may be computed once or twice (with or without the
// exporter's common subexpression elimination).
void layer_norm_rules(std::vector<Rule>& rules) {
  const Pat mean = op(OpKind::ReduceMean, {any("x")}, "mean");
  const Pat d = op(OpKind::Sub, {any("x"), mean}, "d");
  const Pat centered = op(OpKind::Sub, {any("x"), mean}, "centered");
  const auto check = [](const Match& m) {
    NormSpan s;
    return norm_span(m, s);
  };
  for (const Pat& sq : {op(OpKind::Pow, {d}, "sq"), op(OpKind::Mul, {d, d}, "sq")}) {
    const Pat var = op(OpKind::ReduceMean, {sq}, "var");
    const Pat stddev = op(OpKind::Sqrt, {op(OpKind::Add, {var, any("eps")}, "var_eps")}, "std");
    for (const Pat& norm :
         {op(OpKind::Div, {centered, stddev}, "norm"),
          op(OpKind::Mul, {centered, op(OpKind::Reciprocal, {stddev}, "rstd")}, "norm")}) {
      const Pat scaled = op(OpKind::Mul, {norm, any("w")}, "scaled");
      for (const Pat& form : {norm, scaled, op(OpKind::Add, {norm, any("b")}, "shifted"),
                              op(OpKind::Add, {scaled, any("b")}, "shifted")})
        rules.push_back(
            {"layer_norm(decomposed)->layer_norm", form, OpKind::LayerNorm, check, to_layer_norm});
    }
  }
}

// -- global_avgpool, channel_shuffle, its concat --

// The mean over every dim after N and C is global_avgpool; without keepdims a flatten to [N, C]
// follows (a view: its output lives in its input's storage).
Rule global_avgpool_rule() {
  return {"reduce_mean(h,w)->global_avgpool", op(OpKind::ReduceMean, {any("x")}, "mean"),
          OpKind::GlobalAvgPool,
          [](const Match& m) -> std::string {
            const Node& mean = m.node("mean");
            const Shape& x = m.graph->value(m.value("x")).shape;
            const std::vector<Shape> shapes{x};
            std::vector<bool> want(x.size(), true);
            if (x.size() >= 2) want[0] = want[1] = false;
            if (x.size() < 3 ||
                reduce_axes(InferContext{mean.op, mean.name, mean.attrs, shapes}) != want)
              return fmt::format("'{}' is no mean over every dim of {} after the first two",
                                 mean.name, shape_str(x));
            return "";
          },
          [](const Match& m) {
            const Node& mean = m.node("mean");
            if (mean.attrs.i("keepdims")) return unary(m, OpKind::GlobalAvgPool);
            const std::string pooled = m.graph->unique_name(mean.outputs[0] + ".pool");
            Attrs flat;
            flat.set("axis", int64_t(1));
            const std::string name = m.graph->unique_name(mean.name + ".flatten");
            return Replacement{
                {Node{mean.name, OpKind::GlobalAvgPool, {}, {m.value("x")}, {pooled}},
                 Node{name,
                      OpKind::Flatten,
                      normalize_attrs(OpKind::Flatten, name, flat),
                      {pooled},
                      mean.outputs}},
                {}};
          }};
}

// x [N, C, ...] reshaped to [N, g, C / g, ...], its dims 1 and 2 swapped and reshaped back
// (torchvision's ShuffleNet, exported) is channel_shuffle(g).
Rule channel_shuffle_rule() {
  return {"reshape->transpose->reshape->channel_shuffle",
          op(OpKind::Reshape,
             {op(OpKind::Transpose, {op(OpKind::Reshape, {any("x")}, "split")}, "swap")}, "merge"),
          OpKind::ChannelShuffle,
          [](const Match& m) -> std::string {
            const Graph& g = *m.graph;
            const Shape& x = g.value(m.value("x")).shape;
            const Shape& split = g.value(m.value("split")).shape;
            const Node& swap = m.node("swap");
            const std::vector<Shape> shapes{split};
            std::vector<int64_t> swapped(split.size());
            for (size_t d = 0; d < swapped.size(); ++d) swapped[d] = int64_t(d);
            bool ok = x.size() >= 2 && split.size() == x.size() + 1 && split[0] == x[0] &&
                      split[1] * split[2] == x[1] &&
                      std::equal(x.begin() + 2, x.end(), split.begin() + 3) &&
                      g.value(m.value("merge")).shape == x;
            if (ok) {
              std::swap(swapped[1], swapped[2]);
              ok = transpose_perm(InferContext{swap.op, swap.name, swap.attrs, shapes}) == swapped;
            }
            if (!ok)
              return fmt::format("{} -> {} -> {} is no channel shuffle", shape_str(x),
                                 shape_str(split), shape_str(g.value(m.value("swap")).shape));
            return "";
          },
          [](const Match& m) {
            Attrs a;
            a.set("groups", m.graph->value(m.value("split")).shape[1]);
            return unary(m, OpKind::ChannelShuffle, a);
          }};
}

// channel_shuffle of a concat on the channels (ShuffleNet's cat(x1, branch(x2)) -> shuffle)
// reads the concat's inputs: the concat is never stored, and an input that is a split's part
// is read where it lies.
Rule shuffle_concat_rule() {
  return {"channel_shuffle(concat)->channel_shuffle",
          op(OpKind::ChannelShuffle, {op(OpKind::Concat, {}, "cat")}, "shuffle"),
          OpKind::ChannelShuffle,
          [](const Match& m) -> std::string {
            const Node &cat = m.node("cat"), &shuffle = m.node("shuffle");
            const size_t rank = m.graph->value(cat.outputs[0]).shape.size();
            const int64_t axis = cat.attrs.i("axis");
            if (axis != 1 && axis != 1 - int64_t(rank))
              return fmt::format("concat '{}' is on axis {}, not the channels", cat.name, axis);
            if (shuffle.inputs.size() != 1)
              return fmt::format("'{}' already reads {} inputs", shuffle.name,
                                 shuffle.inputs.size());
            if (cat.inputs.size() > size_t(kMaxShuffleInputs))
              return fmt::format("concat '{}' has {} inputs, a shuffle reads at most {}", cat.name,
                                 cat.inputs.size(), kMaxShuffleInputs);
            return "";
          },
          [](const Match& m) {
            const Node &cat = m.node("cat"), &shuffle = m.node("shuffle");
            return Replacement{
                {Node{shuffle.name, OpKind::ChannelShuffle, shuffle.attrs, cat.inputs,
                      shuffle.outputs}},
                {}};
          }};
}

// -- conv_transpose2d as a conv2d and a depth_to_space (sub-pixel convolution) --
// Output row oh = s * m + p (phase p = oh % s) of a transposed conv with stride s, padding pad
// and dilation 1 gathers input rows ih = m + d through taps i = p + pad - s * d, 0 <= i < R: for
// every phase the same window of offsets d_min..d_max around m. So the op is a stride-1 conv2d
// of x with a T = d_max - d_min + 1 tall kernel (padded -d_min on top), whose K * sh * sw output
// channels are the K channels at each phase, tap (i, j) of phase (p, q) at row d - d_min, column
// e - e_min (zero where no tap lands), then depth_to_space (CRD) of those phases, cropped where
// the output is not a whole number of strides tall or wide. A kernel as large as the stride
// (U-Net's 2x2 stride 2) makes a 1x1 conv, each output pixel from one input pixel; 4x4 stride 2
// padding 1 (DCGAN) a 3x3 conv of 4 * K channels (a window a phase would make it 2x2, half the
// taps, but on the gather kernel, not the 3x3 halo one: perf-history "conv_transpose2d in
// ceil(r / s) taps"). The conv then runs on the conv kernels (tensor cores). Groups and
// dilation keep the op (cuda::conv_transpose2d).

// One spatial dim of the rewrite: the conv's kernel extent and padding, the first offset, and
// the conv's output extent (ceil(out / stride)).
struct SubPixelDim {
  int64_t taps = 0, pad_begin = 0, pad_end = 0, d_min = 0, rows = 0;
};

int64_t floor_div(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// Input extent `in`, output `out`, kernel extent r, stride s, begin padding pad; false where
// the conv would need negative padding.
bool sub_pixel_dim(int64_t in, int64_t out, int64_t r, int64_t s, int64_t pad, SubPixelDim& d) {
  d.d_min = -floor_div(r - 1 - pad, s);  // ceil((pad - (r - 1)) / s)
  const int64_t d_max = floor_div(s - 1 + pad, s);
  d.taps = d_max - d.d_min + 1;
  d.pad_begin = -d.d_min;
  d.rows = (out + s - 1) / s;
  d.pad_end = d.rows - in + d.taps - 1 - d.pad_begin;
  return d.pad_begin >= 0 && d.pad_end >= 0 && d.taps >= 1;
}

std::string sub_pixel_refusal(const Graph& g, const Node& ct, SubPixelDim dims[2]) {
  if (!g.is_weight(ct.inputs[1]))
    return fmt::format("the weight of '{}' is computed, not a constant", ct.name);
  if (ct.inputs.size() > 2 && !g.is_weight(ct.inputs[2]))
    return fmt::format("the bias of '{}' is computed, not a constant", ct.name);
  if (ct.attrs.i("groups") != 1)
    return fmt::format("'{}' has groups={}", ct.name, ct.attrs.i("groups"));
  const auto& dil = ct.attrs.ints("dilation");
  if (dil[0] != 1 || dil[1] != 1)
    return fmt::format("'{}' has dilation {}x{}", ct.name, dil[0], dil[1]);
  const Shape &x = g.value(ct.inputs[0]).shape, &w = g.value(ct.inputs[1]).shape;
  const Shape& y = g.value(ct.outputs[0]).shape;
  const auto& stride = ct.attrs.ints("stride");
  const auto& pad = ct.attrs.ints("padding");
  for (int d = 0; d < 2; ++d)
    if (!sub_pixel_dim(x[size_t(2 + d)], y[size_t(2 + d)], w[size_t(2 + d)], stride[size_t(d)],
                       pad[size_t(d)], dims[d]))
      return fmt::format("'{}' needs negative padding as a conv (padding {} of a kernel {})",
                         ct.name, pad[size_t(d)], w[size_t(2 + d)]);
  return "";
}

Replacement to_sub_pixel(const Match& m) {
  const Graph& g = *m.graph;
  const Node& ct = m.node("ct");
  SubPixelDim dims[2];
  EPILOG_ASSERT(sub_pixel_refusal(g, ct, dims).empty());
  const Shape& ws = g.value(ct.inputs[1]).shape;
  const Shape& ys = g.value(ct.outputs[0]).shape;
  const int64_t c = ws[0], k = ws[1], r = ws[2], s = ws[3];
  const int64_t sh = ct.attrs.ints("stride")[0], sw = ct.attrs.ints("stride")[1];
  const int64_t pt = ct.attrs.ints("padding")[0], pl = ct.attrs.ints("padding")[1];
  const SubPixelDim &dh = dims[0], &dw = dims[1];
  const int64_t phases = sh * sw, kc = k * phases;
  // -- the conv's weight [K * sh * sw, C, Th, Tw] and bias, channel k * sh * sw + p * sw + q --
  Tensor wc = Tensor::full({kc, c, dh.taps, dw.taps}, 0.0f);
  const float* w = g.weights.at(ct.inputs[1]).data.f32();
  float* out = wc.f32();
  for (int64_t ko = 0; ko < k; ++ko)
    for (int64_t p = 0; p < sh; ++p)
      for (int64_t q = 0; q < sw; ++q)
        for (int64_t th = 0; th < dh.taps; ++th)
          for (int64_t tw = 0; tw < dw.taps; ++tw) {
            const int64_t i = p + pt - sh * (th + dh.d_min), j = q + pl - sw * (tw + dw.d_min);
            if (i < 0 || i >= r || j < 0 || j >= s) continue;
            const int64_t o = ko * phases + p * sw + q;
            for (int64_t ci = 0; ci < c; ++ci)
              out[((o * c + ci) * dh.taps + th) * dw.taps + tw] =
                  w[((ci * k + ko) * r + i) * s + j];
          }
  Replacement rep;
  const std::string wname = g.unique_name(ct.inputs[1] + ".sub_pixel");
  rep.weights[wname] = wc;
  std::vector<std::string> ins{ct.inputs[0], wname};
  if (ct.inputs.size() > 2) {
    Tensor bc = Tensor::empty({kc});
    const float* b = g.weights.at(ct.inputs[2]).data.f32();
    for (int64_t o = 0; o < kc; ++o) bc.f32()[o] = b[o / phases];
    ins.push_back(g.unique_name(ct.inputs[2] + ".sub_pixel"));
    rep.weights[ins.back()] = bc;
  }
  // -- conv2d -> depth_to_space (cropped): at stride 1 the conv alone where nothing is cropped --
  Attrs conv;
  conv.set("padding", std::vector<int64_t>{dh.pad_begin, dw.pad_begin, dh.pad_end, dw.pad_end});
  const std::vector<int64_t> crop{0, 0, dh.rows * sh - ys[2], dw.rows * sw - ys[3]};
  const bool cropped = crop != std::vector<int64_t>(4, 0);
  const std::string phased =
      phases == 1 && !cropped ? ct.outputs[0] : g.unique_name(ct.outputs[0] + ".phases");
  rep.nodes.push_back(
      Node{ct.name, OpKind::Conv2d, normalize_attrs(OpKind::Conv2d, ct.name, conv), ins, {phased}});
  if (phases == 1 && !cropped) return rep;
  Attrs d2s;
  d2s.set("blocksize", std::vector<int64_t>{sh, sw});
  d2s.set("mode", std::string("CRD"));
  d2s.set("crop", crop);
  const std::string d2s_name = g.unique_name(ct.name + ".depth_to_space");
  rep.nodes.push_back(Node{d2s_name,
                           OpKind::DepthToSpace,
                           normalize_attrs(OpKind::DepthToSpace, d2s_name, d2s),
                           {phased},
                           ct.outputs});
  return rep;
}

Rule sub_pixel_rule() {
  return {"conv_transpose2d->conv2d->depth_to_space", op(OpKind::ConvTranspose2d, {}, "ct"),
          OpKind::Conv2d,
          [](const Match& m) {
            SubPixelDim dims[2];
            return sub_pixel_refusal(*m.graph, m.node("ct"), dims);
          },
          to_sub_pixel};
}

// A batchnorm of depth_to_space's output, its parameters constants, runs before it with each
// parameter repeated over the channels that become its channel (then fusion takes it into the
// conv before); so does an activation (canonicalize_rules).
Rule batchnorm_first_rule() {
  return {"batchnorm(depth_to_space)->depth_to_space(batchnorm)",
          op(OpKind::BatchNorm, {op(OpKind::DepthToSpace, {any("x")}, "layout")}, "bn"),
          OpKind::BatchNorm,
          [](const Match& m) -> std::string {
            const Node& bn = m.node("bn");
            for (size_t i = 1; i < bn.inputs.size(); ++i)
              if (!m.graph->is_weight(bn.inputs[i]))
                return fmt::format("'{}' of '{}' is computed, not a constant", bn.inputs[i],
                                   bn.name);
            return "";
          },
          [](const Match& m) {
            const Graph& g = *m.graph;
            Node bn = m.node("bn"), layout = m.node("layout");
            const auto& b = layout.attrs.ints("blocksize");
            const int64_t phases = b[0] * b[1], c = g.value(bn.inputs[0]).shape[1];
            const bool crd = layout.attrs.s("mode") == "CRD";
            Replacement r;
            for (size_t i = 1; i < bn.inputs.size(); ++i) {
              const float* v = g.weights.at(bn.inputs[i]).data.f32();
              Tensor t = Tensor::empty({c * phases});
              for (int64_t o = 0; o < c * phases; ++o) t.f32()[o] = v[crd ? o / phases : o % c];
              const std::string name = g.unique_name(bn.inputs[i] + ".phases");
              r.weights[name] = t;
              bn.inputs[i] = name;
            }
            const std::string pre = g.unique_name(bn.name + ".pre_depth_to_space");
            layout.outputs = bn.outputs;
            layout.inputs = {pre};
            bn.inputs[0] = m.value("x");
            bn.outputs = {pre};
            r.nodes = {bn, layout};
            return r;
          }};
}

// Whether `value` is a conv2d's output, back through the batchnorms and activations already
// moved next to it.
bool made_by_conv(const Graph& g, std::string value) {
  const Node* made = nullptr;
  do {
    made = nullptr;
    for (const Node& n : g.nodes)
      if (n.outputs[0] == value) made = &n;
    if (made) value = made->inputs[0];
  } while (made && (made->op == OpKind::BatchNorm || is_activation_op(made->op)));
  return made && made->op == OpKind::Conv2d;
}

// A batchnorm or activation of a concat on the channels whose parts are each a conv's output read
// by the concat alone (MixNet's mixed depthwise convs, split and concatenated): one a part, the
// batchnorm's constants sliced, so that each fuses into its conv and the concat runs in place.
Rule into_concat_rule(OpKind kind) {
  const std::string name = op_name(kind);
  return {name + "(concat(convs))->concat(" + name + "(conv))",
          op(kind, {op(OpKind::Concat, {}, "cat")}, "pw"), kind,
          [](const Match& m) -> std::string {
            const Graph& g = *m.graph;
            const Node &cat = m.node("cat"), &pw = m.node("pw");
            const int64_t rank = int64_t(g.value(cat.outputs[0]).shape.size());
            const int64_t axis = cat.attrs.i("axis");
            if (rank < 2 || (axis != 1 && axis != 1 - rank))
              return fmt::format("concat '{}' is not on the channels", cat.name);
            const int64_t c = g.value(cat.outputs[0]).shape[1];
            for (size_t k = 1; k < pw.inputs.size(); ++k)
              if (!g.is_weight(pw.inputs[k]) || shape_numel(g.value(pw.inputs[k]).shape) != c)
                return fmt::format("'{}' of '{}' is no constant per channel", pw.inputs[k],
                                   pw.name);
            const UseIndex uses(g);
            for (const std::string& part : cat.inputs)
              if (!made_by_conv(g, part) || g.is_output(part) || uses.consumers(part).size() != 1)
                return fmt::format("'{}' is no conv's output that the concat alone reads", part);
            return "";
          },
          [](const Match& m) {
            const Graph& g = *m.graph;
            const Node &cat = m.node("cat"), &pw = m.node("pw");
            Replacement r;
            std::vector<std::string> parts;
            int64_t c0 = 0;
            for (size_t i = 0; i < cat.inputs.size(); ++i) {
              const int64_t c = g.value(cat.inputs[i]).shape[1];
              Node one = pw;
              one.name = g.unique_name(fmt::format("{}.{}", pw.name, i));
              one.inputs[0] = cat.inputs[i];
              one.outputs = {g.unique_name(one.name + ".y")};
              for (size_t k = 1; k < pw.inputs.size(); ++k) {  // batchnorm's per-channel constants
                const Tensor& t = g.weights.at(pw.inputs[k]).data;
                Tensor slice = Tensor::empty({c});
                std::copy(t.f32() + c0, t.f32() + c0 + c, slice.f32());
                one.inputs[k] = g.unique_name(fmt::format("{}.{}", pw.inputs[k], i));
                r.weights[one.inputs[k]] = slice;
              }
              parts.push_back(one.outputs[0]);
              r.nodes.push_back(one);
              c0 += c;
            }
            r.nodes.push_back(Node{cat.name, OpKind::Concat, cat.attrs, parts, pw.outputs});
            return r;
          }};
}

// x [N, C, H, W] reshaped to [N, C', bh, bw, H, W], permuted to [N, C', H, bh, W, bw] and
// reshaped to [N, C', H * bh, W * bw] is depth_to_space CRD (PyTorch's pixel_shuffle as its
// exporters decompose it); from [N, bh, bw, C', H, W] by [0, 3, 4, 1, 5, 2], DCR.
Rule depth_to_space_rule() {
  const auto mode = [](const Match& m, int64_t& bh, int64_t& bw) -> std::string {
    const Graph& g = *m.graph;
    const Shape& x = g.value(m.value("x")).shape;
    const Shape& split = g.value(m.value("split")).shape;
    const Shape& y = g.value(m.value("merge")).shape;
    const Node& swap = m.node("swap");
    const std::vector<Shape> shapes{split};
    if (x.size() == 4 && split.size() == 6 && split[0] == x[0] && split[4] == x[2] &&
        split[5] == x[3]) {
      const std::vector<int64_t> perm =
          transpose_perm(InferContext{swap.op, swap.name, swap.attrs, shapes});
      const bool crd = perm == std::vector<int64_t>{0, 1, 4, 2, 5, 3};
      const bool dcr = perm == std::vector<int64_t>{0, 3, 4, 1, 5, 2};
      bh = crd ? split[2] : split[1];
      bw = crd ? split[3] : split[2];
      const int64_t c = crd ? split[1] : split[3];
      if ((crd || dcr) && y == Shape{x[0], c, x[2] * bh, x[3] * bw}) return crd ? "CRD" : "DCR";
    }
    return "";
  };
  return {"reshape->transpose->reshape->depth_to_space",
          op(OpKind::Reshape,
             {op(OpKind::Transpose, {op(OpKind::Reshape, {any("x")}, "split")}, "swap")}, "merge"),
          OpKind::DepthToSpace,
          [mode](const Match& m) -> std::string {
            int64_t bh = 0, bw = 0;
            if (!mode(m, bh, bw).empty()) return "";
            const Graph& g = *m.graph;
            return fmt::format("{} -> {} -> {} is no depth_to_space",
                               shape_str(g.value(m.value("x")).shape),
                               shape_str(g.value(m.value("split")).shape),
                               shape_str(g.value(m.value("swap")).shape));
          },
          [mode](const Match& m) {
            int64_t bh = 0, bw = 0;
            Attrs a;
            a.set("mode", mode(m, bh, bw));
            a.set("blocksize", std::vector<int64_t>{bh, bw});
            return unary(m, OpKind::DepthToSpace, a);
          }};
}

// -- channels-last blocks back to NCHW --
// ConvNeXt runs its MLP on NHWC: transpose(0,2,3,1), layer_norm over C, linear, gelu, linear,
// transpose(0,3,1,2). The transpose moves down through each op, which becomes its NCHW twin (the
// layer norm over axis 1, the linear a 1x1 conv, an activation as it is), until it meets its
// inverse and both go: the block is then convs that fuse, their activations and the layer scale
// in their epilogues.

const std::vector<int64_t> kToNhwc{0, 2, 3, 1};

std::string to_nhwc(const Node& t) {
  if (t.attrs.ints("perm") != kToNhwc)
    return fmt::format("'{}' permutes [{}], not [0,2,3,1]", t.name, fmt::join(t.attrs.ints("perm"), ","));
  return "";
}

// The NCHW op `n` of kind `op` on x (its first input) with n's other inputs, then the transpose
// to NHWC into n's outputs.
Replacement then_to_nhwc(const Match& m, const Node& n, OpKind op, const Attrs& attrs,
                         std::vector<std::string> inputs, std::map<std::string, Tensor> w = {}) {
  const Graph& g = *m.graph;
  const std::string y = g.unique_name(n.name + ".nchw");
  Attrs perm;
  perm.set("perm", kToNhwc);
  const std::string t = g.unique_name(n.name + ".to_nhwc");
  return Replacement{{Node{n.name, op, normalize_attrs(op, n.name, attrs), std::move(inputs), {y}},
                      Node{t, OpKind::Transpose, normalize_attrs(OpKind::Transpose, t, perm), {y},
                           n.outputs}},
                     std::move(w)};
}

void channels_last_rules(std::vector<Rule>& rules) {
  const Pat t = op(OpKind::Transpose, {any("x")}, "t");
  // layer_norm over the last dim of NHWC is layer_norm over C of NCHW (the same scale and bias).
  rules.push_back(Rule{
      "layer_norm(nhwc)->layer_norm(c)", op(OpKind::LayerNorm, {t}, "n"), OpKind::LayerNorm,
      [](const Match& m) {
        const Node& n = m.node("n");
        std::string why = to_nhwc(m.node("t"));
        const auto last = [&](int64_t a) { return a == -1 || a == 3; };
        if (why.empty() && !(last(n.attrs.i("axis")) && last(n.attrs.i("last_axis"))))
          why = fmt::format("'{}' normalizes more than the last dim", n.name);
        return why;
      },
      [](const Match& m) {
        const Node& n = m.node("n");
        Attrs a = n.attrs;
        a.set("axis", int64_t(1));
        a.set("last_axis", int64_t(1));
        std::vector<std::string> ins = n.inputs;
        ins[0] = m.value("x");
        return then_to_nhwc(m, n, OpKind::LayerNorm, a, ins);
      }});
  // linear over C of NHWC, with a constant weight, is a 1x1 conv of NCHW.
  rules.push_back(Rule{
      "linear(nhwc)->conv2d(1x1)", op(OpKind::Linear, {t}, "n"), OpKind::Conv2d,
      [](const Match& m) {
        const Graph& g = *m.graph;
        const Node& n = m.node("n");
        std::string why = to_nhwc(m.node("t"));
        return why.empty() ? linear_constants(g, n) : why;
      },
      [](const Match& m) {
        const Graph& g = *m.graph;
        const Node& n = m.node("n");
        Replacement r;
        const std::vector<std::string> ins = linear_conv_inputs(g, n, m.value("x"), r);
        return then_to_nhwc(m, n, OpKind::Conv2d, {}, ins, std::move(r.weights));
      }});
  // An activation commutes with any transpose: it runs before it, next to what made its input.
  for (int i = 0; i < kNumOps; ++i) {
    const OpKind kind = OpKind(i);
    if (!is_activation_op(kind)) continue;
    rules.push_back(Rule{std::string(op_name(kind)) + "(transpose)->transpose(" + op_name(kind) + ")",
                         op(kind, {op(OpKind::Transpose, {any("x")}, "layout")}, "act"), kind,
                         nullptr, activation_first});
  }
  // A transpose of a transpose: one, or none where they cancel (a reshape to the same shape,
  // a view that eliminate_identity_views then removes).
  rules.push_back(Rule{
      "transpose(transpose)", op(OpKind::Transpose, {t}, "n"), OpKind::Transpose,
      [](const Match& m) -> std::string {
        if (m.node("n").attrs.ints("perm").empty() || m.node("t").attrs.ints("perm").empty())
          return "a transpose reverses its dims (no perm)";
        return "";
      },
      [](const Match& m) {
        const Graph& g = *m.graph;
        const Node& n = m.node("n");
        const std::vector<int64_t>& inner = m.node("t").attrs.ints("perm");
        const std::vector<int64_t>& outer = n.attrs.ints("perm");
        const Shape& x = g.value(m.value("x")).shape;
        std::vector<int64_t> perm(outer.size());
        bool identity = true;
        for (size_t d = 0; d < outer.size(); ++d) {
          perm[d] = inner[size_t(outer[d])];
          identity = identity && perm[d] == int64_t(d);
        }
        Attrs a;
        if (identity) {
          a.set("shape", std::vector<int64_t>(x.begin(), x.end()));
          return Replacement{{Node{n.name, OpKind::Reshape, normalize_attrs(OpKind::Reshape, n.name, a),
                                   {m.value("x")}, n.outputs}},
                             {}};
        }
        a.set("perm", perm);
        return Replacement{{Node{n.name, OpKind::Transpose,
                                 normalize_attrs(OpKind::Transpose, n.name, a), {m.value("x")},
                                 n.outputs}},
                           {}};
      }});
}

}  // namespace

Replacement activation_first(const Match& m) {
  const Graph& g = *m.graph;
  Node act = m.node("act"), layout = m.node("layout");
  const std::string pre = g.unique_name(act.name + ".pre_" + op_name(layout.op));
  layout.outputs = act.outputs;
  layout.inputs = {pre};
  act.inputs = {m.value("x")};
  act.outputs = {pre};
  return Replacement{{act, layout}, {}};
}

std::vector<Rule> canonicalize_rules() {
  std::vector<Rule> rules;
  rules.push_back(
      Rule{"mul(x,sigmoid(x))->silu",
           op(OpKind::Mul, {any("x"), op(OpKind::Sigmoid, {any("x")}, "sigmoid")}, "mul"),
           OpKind::Silu, nullptr, [](const Match& m) { return unary(m, OpKind::Silu); }});
  gelu_rules(rules);
  hardswish_rules(rules);
  layer_norm_rules(rules);
  rules.push_back(global_avgpool_rule());
  rules.push_back(channel_shuffle_rule());
  rules.push_back(shuffle_concat_rule());
  rules.push_back(depth_to_space_rule());
  channels_last_rules(rules);
  rules.push_back(sub_pixel_rule());
  rules.push_back(batchnorm_first_rule());
  rules.push_back(into_concat_rule(OpKind::BatchNorm));
  for (int i = 0; i < kNumOps; ++i) {
    const OpKind kind = OpKind(i);
    if (!is_activation_op(kind)) continue;
    rules.push_back(into_concat_rule(kind));
    rules.push_back(
        Rule{std::string(op_name(kind)) + "(depth_to_space)->depth_to_space(" + op_name(kind) + ")",
             op(kind, {op(OpKind::DepthToSpace, {any("x")}, "layout")}, "act"), kind, nullptr,
             activation_first});
  }
  return rules;
}

}  // namespace epilog
