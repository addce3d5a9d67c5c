// The canonicalization rules (graph/canonicalize.cpp), each on its own: a graph in the form an
// exporter writes, built as an ONNX model as the forms arrive (the builder's own graphs where the
// form needs no ONNX), becomes after optimize() the one op it spells, computing what the form
// computes element by element on random inputs (|got - want| <= atol + rtol |want|); and with
// one constant changed the graph stays as imported, a refusal saying why.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "epilog/graph/lowering.h"
#include "epilog/graph/passes.h"
#include "epilog/io/builder.h"
#include "kernel_check.h"
#include "test_util.h"

#ifdef EPILOG_HAVE_ONNX
#include "onnx_model.h"
#endif

using namespace epilog;

namespace {

// |got - want| <= atol + rtol * |want| at every element.
void check_close(const Tensor& got, const Tensor& want, double atol, double rtol) {
  REQUIRE(got.shape() == want.shape());
  const std::vector<double> ref(want.f32(), want.f32() + want.numel());
  std::vector<double> tol;
  for (double w : ref) tol.push_back(atol + rtol * std::fabs(w));
  test::expect_close(got.f32(), ref, tol);
}

// `source` optimized: one node of `op` is left, and on random inputs (normal, of `spread`) it
// computes what `source` computes. Returns the optimized graph.
Graph canonical(const Graph& source, OpKind op, double tol, float spread = 1) {
  Graph g = source;
  const PassReport r = optimize(g);
  INFO(r.summary() << "\n" << fmt::format("{}", fmt::join(r.refusals, "\n")));
  REQUIRE(g.nodes.size() == 1);
  CHECK(g.nodes[0].op == op);
  CHECK(g.nodes[0].outputs == source.outputs);
  std::map<std::string, Tensor> in;
  for (const std::string& name : source.inputs)
    in[name] = Tensor::randn(source.value(name).shape, 11, spread);
  const auto want = test::run_cpu(source, in), got = test::run_cpu(g, in);
  for (const std::string& out : source.outputs) check_close(got.at(out), want.at(out), tol, tol);
  return g;
}

// `source` canonicalized keeps its nodes, and a refusal says `why` (fusion off: it would make
// an elementwise chain of what is left).
void untouched(const Graph& source, const std::string& why) {
  Graph g = source;
  PassOptions o;
  o.fuse = false;
  const PassReport r = optimize(g, o);
  CHECK(g.op_counts() == source.op_counts());
  INFO(fmt::format("{}", fmt::join(r.refusals, "\n")));
  CHECK(std::any_of(r.refusals.begin(), r.refusals.end(),
                    [&](const std::string& s) { return s.find(why) != std::string::npos; }));
}

}  // namespace

// -- global_avgpool --

TEST_CASE("canonicalize: reduce_mean over every dim after N and C is global_avgpool",
          "[canonicalize]") {
  struct Case {
    Shape x;
    std::vector<int64_t> axes;
    bool keepdims;
  };
  for (const Case& c : std::vector<Case>{{{2, 3, 4, 5}, {2, 3}, true},
                                         {{2, 3, 4, 5}, {-2, -1}, false},
                                         {{2, 3, 7}, {2}, true},
                                         {{1, 2, 3, 4, 5}, {4, 2, 3}, false}}) {
    INFO(shape_str(c.x) << " keepdims " << c.keepdims);
    Builder b;
    b.output(b.reduce(OpKind::ReduceMean, b.input("x", c.x), c.axes, c.keepdims, "mean"));
    const Graph source = b.build();
    Graph g = source;
    optimize(g);
    REQUIRE(g.nodes.size() == (c.keepdims ? 1u : 2u));
    CHECK(g.nodes[0].op == OpKind::GlobalAvgPool);
    CHECK(g.nodes[0].name == "mean");
    if (!c.keepdims) {
      // The flatten to [N, C] is a view (executor test "a flatten or reshape output lives in its
      // input's storage").
      CHECK(g.nodes[1].op == OpKind::Flatten);
      CHECK(g.value("mean").shape == Shape{c.x[0], c.x[1]});
    }
    CHECK(g.outputs == source.outputs);
    const auto in = test::random_inputs(source, 5);
    check_close(test::run_cpu(g, in).at("mean"), test::run_cpu(source, in).at("mean"), 1e-6, 1e-6);
  }
  Builder b;
  b.output(b.reduce(OpKind::ReduceMean, b.input("x", {2, 3, 4, 5}), {1, 2, 3}, true, "mean"));
  untouched(b.build(), "'mean' is no mean over every dim of [2,3,4,5] after the first two");
}

// -- channel_shuffle --

TEST_CASE("canonicalize: reshape, transpose, reshape on the channels is channel_shuffle",
          "[canonicalize]") {
  const auto build = [](const std::vector<int64_t>& split, const std::vector<int64_t>& perm,
                        const std::vector<int64_t>& merge) {
    Builder b;
    Val x = b.input("x", {2, 12, 3, 5});
    b.output(b.reshape(b.transpose(b.reshape(x, split, "split"), perm, "swap"), merge, "merge"));
    return b.build();
  };
  // torchvision's ShuffleNetV2: view(n, g, c / g, h, w), transpose(1, 2), view(n, -1, h, w).
  for (const auto& [split, merge] :
       {std::pair<std::vector<int64_t>, std::vector<int64_t>>{{2, 3, 4, 3, 5}, {2, 12, 3, 5}},
        {{0, 3, -1, 3, 5}, {0, -1, 3, 5}}}) {
    const Graph g = canonical(build(split, {0, 2, 1, 3, 4}, merge), OpKind::ChannelShuffle, 0);
    CHECK(g.nodes[0].attrs.i("groups") == 3);
    CHECK(g.nodes[0].name == "merge");
  }
  untouched(build({2, 3, 4, 3, 5}, {0, 1, 2, 4, 3}, {2, 12, 3, 5}), "is no channel shuffle");
  untouched(build({2, 3, 4, 3, 5}, {0, 2, 1, 4, 3}, {2, 12, 5, 3}), "is no channel shuffle");
}

TEST_CASE("canonicalize: channel_shuffle of a concat on the channels reads the concat's inputs",
          "[canonicalize]") {
  const auto build = [](int64_t axis, bool cat_out) {
    Builder b;
    Val x = b.input("x", {2, 6, 4, 4}), z = b.input("z", {2, 6, 4, 4});
    Val cat = b.concat({x, z}, axis, "cat");
    b.output(b.channel_shuffle(cat, 2, "cs"));
    if (cat_out) b.output(cat);
    return b.build();
  };
  for (int64_t axis : {1, -3}) {
    const Graph g = canonical(build(axis, false), OpKind::ChannelShuffle, 0);
    CHECK(g.nodes[0].inputs == std::vector<std::string>{"x", "z"});
    CHECK(g.nodes[0].name == "cs");
  }
  untouched(build(1, true), "'cat' is a graph output");
  Builder b;
  Val x = b.input("x", {2, 6, 4, 4});
  b.output(b.channel_shuffle(b.concat({x, x}, 2, "cat"), 2, "cs"));
  untouched(b.build(), "concat 'cat' is on axis 2, not the channels");
  Builder many;
  Val y = many.input("x", {2, 2, 4, 4});
  many.output(many.channel_shuffle(many.concat(std::vector<Val>(9, y), 1, "cat"), 2, "cs"));
  untouched(many.build(), "concat 'cat' has 9 inputs, a shuffle reads at most 8");
}

#ifdef EPILOG_HAVE_ONNX

namespace {

using onnx_test::Model;
using onnx_test::set_f;
using onnx_test::set_i;
using onnx_test::set_ints;

const Shape kX{2, 3, 4, 5};

// The model's last node makes "y": the value named `name`, or "y" when `last`.
std::string out(const std::string& name, bool last) {
  return last ? "y" : name;
}

// GELU as x * (erf(x / k) + 1) * 0.5 (scale "Div", k = sqrt 2) or x * erf(x * k) ... (scale
// "Mul", k = 1 / sqrt 2); the 0.5 with the product (order 0, PyTorch's), with x (1) or with
// erf + 1 (2).
Model gelu_model(const char* scale, int order, float k, float half = 0.5f) {
  Model m;
  m.input("x", kX);
  m.init("k", {}, {k});
  m.init("one", {}, {1});
  m.init("half", {}, {half});
  m.node(scale, {"x", "k"}, {"scaled"});
  m.node("Erf", {"scaled"}, {"erf"});
  m.node("Add", {"erf", "one"}, {"erf1"});
  if (order == 0) {
    m.node("Mul", {"x", "erf1"}, {"inner"});
    m.node("Mul", {"inner", "half"}, {"y"});
  } else if (order == 1) {
    m.node("Mul", {"half", "x"}, {"inner"});
    m.node("Mul", {"inner", "erf1"}, {"y"});
  } else {
    m.node("Mul", {"erf1", "half"}, {"inner"});
    m.node("Mul", {"x", "inner"}, {"y"});
  }
  m.output("y");
  return m;
}

// x * relu6(x + 3) / 6 with relu6 as Clip(0, 6) (0), Min(Max(., 0), 6) (1) or Max(Min(., 6), 0)
// (2); the division (scale "Div" by 6, "Mul" by 1 / 6) of the product (at 0), of the relu6 (1)
// or of x (2).
struct Hardswish {
  int relu6 = 0;
  const char* scale = "Div";
  int at = 0;
  float three = 3, six = 6;
};

Model hardswish_model(const Hardswish& c) {
  Model m;
  m.input("x", kX);
  m.init("three", {}, {c.three});
  m.init("zero", {}, {0});
  m.init("six", {}, {c.six});
  m.init("sixth", {}, {std::string(c.scale) == "Div" ? 6.0f : 1.0f / 6.0f});
  m.node("Add", {"x", "three"}, {"shifted"});
  if (c.relu6 == 0) {
    m.node("Clip", {"shifted", "zero", "six"}, {"r"}, "relu6");
  } else if (c.relu6 == 1) {
    m.node("Max", {"shifted", "zero"}, {"low"});
    m.node("Min", {"low", "six"}, {"r"});
  } else {
    m.node("Min", {"shifted", "six"}, {"high"});
    m.node("Max", {"high", "zero"}, {"r"});
  }
  if (c.at == 0) {
    m.node("Mul", {"x", "r"}, {"p"});
    m.node(c.scale, {"p", "sixth"}, {"y"});
  } else if (c.at == 1) {
    m.node(c.scale, {"r", "sixth"}, {"q"});
    m.node("Mul", {"x", "q"}, {"y"});
  } else {
    m.node(c.scale, {"x", "sixth"}, {"q"});
    m.node("Mul", {"q", "r"}, {"y"});
  }
  m.output("y");
  return m;
}

// LayerNorm decomposed as the exporters write it: over the last dim (span 0), the last two
// (span 1, opset 18: axes an input) or the channels of NCHW (span 2, ConvNeXt's channels-first
// LayerNorm: its weight and bias [C, 1, 1]); the square as Pow(d, 2) or d * d, the division as
// Div or Mul by Reciprocal, x - mean computed once or twice, with or without weight and bias.
struct LayerNorm {
  int span = 0;
  bool pow = true, reciprocal = false, twice = false, weight = true, bias = true;
  float exponent = 2;
  std::vector<int64_t> axes, var_axes;  // the span's, the mean's when empty
  Shape affine;                         // the weight's and bias's shape: the span's when empty
};

const Shape kNormX{2, 5, 4, 6};

std::vector<int64_t> norm_axes(int span) {
  return span == 0   ? std::vector<int64_t>{-1}
         : span == 1 ? std::vector<int64_t>{-2, -1}
                     : std::vector<int64_t>{1};
}

Model layer_norm_model(const LayerNorm& c) {
  const int64_t opset = c.span == 1 ? 18 : 17;
  Model m(opset);
  m.input("x", kNormX);
  const auto mean = [&](const std::string& in, const std::string& y,
                        const std::vector<int64_t>& axes) {
    onnx::NodeProto* n;
    if (opset >= 18) {
      m.ints(y + ".axes", axes);
      n = &m.node("ReduceMean", {in, y + ".axes"}, {y});
    } else {
      n = &m.node("ReduceMean", {in}, {y});
      set_ints(*n, "axes", axes);
    }
    set_i(*n, "keepdims", 1);
  };
  const std::vector<int64_t> axes = c.axes.empty() ? norm_axes(c.span) : c.axes;
  mean("x", "mean", axes);
  m.node("Sub", {"x", "mean"}, {"d"});
  if (c.pow) {
    m.init("two", {}, {c.exponent});
    m.node("Pow", {"d", "two"}, {"sq"}, "sq");
  } else {
    m.node("Mul", {"d", "d"}, {"sq"});
  }
  mean("sq", "var", c.var_axes.empty() ? axes : c.var_axes);
  m.init("eps", {}, {1e-5f});
  m.node("Add", {"var", "eps"}, {"var_eps"});
  m.node("Sqrt", {"var_eps"}, {"std"});
  const std::string centered = c.twice ? "d2" : "d";
  if (c.twice) m.node("Sub", {"x", "mean"}, {centered});
  const bool plain = !c.weight && !c.bias;
  if (c.reciprocal) {
    m.node("Reciprocal", {"std"}, {"rstd"});
    m.node("Mul", {centered, "rstd"}, {out("norm", plain)});
  } else {
    m.node("Div", {centered, "std"}, {out("norm", plain)});
  }
  const Shape per = !c.affine.empty() ? c.affine
                    : c.span == 0     ? Shape{6}
                    : c.span == 1     ? Shape{4, 6}
                                      : Shape{5, 1, 1};
  std::string y = "norm";
  if (c.weight) {
    m.random("w", per, 3);
    const std::string scaled = out("scaled", !c.bias);
    m.node("Mul", {"w", y}, {scaled});  // the weight first: either order matches
    y = scaled;
  }
  if (c.bias) {
    m.random("b", per, 4);
    m.node("Add", {y, "b"}, {"y"});
  }
  m.output("y");
  return m;
}

}  // namespace

// -- gelu --

TEST_CASE("canonicalize: GELU as erf, in each order exporters write it, is gelu",
          "[canonicalize]") {
  for (const char* scale : {"Div", "Mul"})
    for (int order = 0; order < 3; ++order) {
      INFO(scale << " order " << order);
      const bool div = std::string(scale) == "Div";
      const float k = float(div ? std::sqrt(2.0) : std::sqrt(0.5));
      const Graph g = canonical(gelu_model(scale, order, k).load(), OpKind::Gelu, 1e-6, 2);
      CHECK(g.nodes[0].attrs.s("approximate") == "none");
      untouched(gelu_model(scale, order, 1.5f).load(), "'k' is 1.5, not");
    }
  untouched(gelu_model("Div", 1, float(std::sqrt(2.0)), 0.25f).load(), "'half' is 0.25, not 0.5");
}

// -- hardswish --

TEST_CASE("canonicalize: x * relu6(x + 3) / 6, each relu6 and place of the division, is hardswish",
          "[canonicalize]") {
  for (int relu6 = 0; relu6 < 3; ++relu6)
    for (const char* scale : {"Div", "Mul"})
      for (int at = 0; at < 3; ++at) {
        Hardswish c;
        c.relu6 = relu6;
        c.scale = scale;
        c.at = at;
        INFO("relu6 form " << relu6 << ", " << scale << " at " << at);
        canonical(hardswish_model(c).load(), OpKind::HardSwish, 1e-6, 3);
        c.three = 2;
        untouched(hardswish_model(c).load(), "'three' is 2, not 3");
        c.three = 3;
        c.six = 5;
        untouched(hardswish_model(c).load(),
                  relu6 == 0 ? "clip 'relu6' has max 5, not 6" : "'six' is 5, not 6");
      }
}

TEST_CASE("canonicalize: x * hardsigmoid(x) with alpha 1/6 and beta 0.5 is hardswish",
          "[canonicalize]") {
  const auto build = [](bool pytorch) {
    Model m;
    m.input("x", kX);
    auto& hs = m.node("HardSigmoid", {"x"}, {"hs"}, "hs");
    if (pytorch) set_f(hs, "alpha", 1.0f / 6.0f);  // else ONNX's default, 0.2
    m.node("Mul", {"x", "hs"}, {"y"});
    m.output("y");
    return m.load();
  };
  canonical(build(true), OpKind::HardSwish, 1e-6, 3);
  untouched(build(false), "hardsigmoid 'hs' has alpha 0.2");
}

// -- layer_norm --

TEST_CASE("canonicalize: LayerNorm decomposed, in each form exporters write, is layer_norm",
          "[canonicalize]") {
  for (int span = 0; span < 3; ++span)
    for (int form = 0; form < 32; ++form) {
      LayerNorm c;
      c.span = span;
      c.pow = form & 1;
      c.reciprocal = form & 2;
      c.twice = form & 4;
      c.weight = form & 8;
      c.bias = form & 16;
      INFO("span " << span << " pow " << c.pow << " reciprocal " << c.reciprocal << " twice "
                   << c.twice << " weight " << c.weight << " bias " << c.bias);
      const Graph g = canonical(layer_norm_model(c).load(), OpKind::LayerNorm, 1e-5);
      const Node& n = g.nodes[0];
      CHECK(n.attrs.i("axis") == (span == 0 ? 3 : span == 1 ? 2 : 1));
      CHECK(n.attrs.i("last_axis") == (span == 2 ? 1 : -1));
      CHECK(n.attrs.f("eps") == Approx(1e-5).epsilon(1e-6));
      CHECK(n.inputs.size() == (c.bias ? 3u : 2u));
    }
}

TEST_CASE("canonicalize: a LayerNorm whose constants or axes differ is left alone",
          "[canonicalize]") {
  LayerNorm cube;
  cube.exponent = 3;
  untouched(layer_norm_model(cube).load(), "'sq' raises to 3, not 2");
  LayerNorm other;
  other.var_axes = {1, 2, 3};
  untouched(layer_norm_model(other).load(), "reduce other dims");
  LayerNorm gap;  // the channels and W: not one run of dims
  gap.span = 2;
  gap.axes = {1, 3};
  gap.affine = {5, 1, 6};
  untouched(layer_norm_model(gap).load(), "reduces dims that are not one run");
  // A weight per channel on a LayerNorm over the last dim is no layer_norm weight: the
  // normalization becomes layer_norm, the weight and bias stay a mul and an add after it (one
  // elementwise chain once fused).
  LayerNorm per_channel;
  per_channel.affine = {5, 1, 1};
  Model pc = layer_norm_model(per_channel);
  Graph source = pc.load();
  Graph g = source;
  PassOptions canonical_only;
  canonical_only.fuse = false;
  optimize(g, canonical_only);
  CHECK(onnx_test::count(g, OpKind::LayerNorm) == 1);
  CHECK(onnx_test::count(g, OpKind::Mul) == 1);
  CHECK(onnx_test::count(g, OpKind::Add) == 1);
  const Tensor x = Tensor::randn(kNormX, 5);
  check_close(onnx_test::run1(g, x), onnx_test::run1(source, x), 1e-5, 1e-5);
}

// -- channel_shuffle, as ONNX --

TEST_CASE("canonicalize: ShuffleNet's channel shuffle as exported is channel_shuffle",
          "[canonicalize]") {
  const auto build = [](const std::vector<int64_t>& perm) {
    Model m;
    m.input("x", {2, 12, 3, 5});
    m.ints("split", {2, 3, 4, 3, 5});
    m.ints("merge", {2, -1, 3, 5});
    m.node("Reshape", {"x", "split"}, {"r"});
    set_ints(m.node("Transpose", {"r"}, {"t"}), "perm", perm);
    m.node("Reshape", {"t", "merge"}, {"y"});
    m.output("y");
    return m.load();
  };
  const Graph g = canonical(build({0, 2, 1, 3, 4}), OpKind::ChannelShuffle, 0);
  CHECK(g.nodes[0].attrs.i("groups") == 3);
  untouched(build({0, 1, 2, 4, 3}), "is no channel shuffle");
}

#endif  // EPILOG_HAVE_ONNX

// -- channels-last blocks --

TEST_CASE("canonicalize: ConvNeXt's NHWC block becomes NCHW convs with no transpose left",
          "[canonicalize]") {
  Builder b(31);
  Val x = b.input("x", {2, 8, 5, 5});
  Val dw = b.conv2d(x, "dw", ConvOpts(8, 7).padding(3).groups(8).bias());
  Val h = b.layer_norm(b.transpose(dw, {0, 2, 3, 1}, "to_nhwc"), "ln", -1, 1e-6);
  h = b.activation(b.linear(h, "fc1", 32), Act(Activation::Gelu), "gelu");
  h = b.transpose(b.linear(h, "fc2", 8), {0, 3, 1, 2}, "to_nchw");
  Val scaled = b.mul(b.weight("gamma", {8, 1, 1}, OpKind::Mul, "b"), h, "layer_scale");
  b.output(b.add(x, scaled, "residual"));
  const Graph source = b.build();
  Graph g = source;
  const PassReport r = optimize(g);
  INFO(r.summary() << "\n" << fmt::format("{}", fmt::join(r.refusals, "\n")));
  const auto counts = g.op_counts();
  for (OpKind gone : {OpKind::Transpose, OpKind::Linear, OpKind::Mul, OpKind::Add, OpKind::Gelu,
                      OpKind::Reshape})
    CHECK(counts.count(gone) == 0);
  CHECK(counts.at(OpKind::FusedConv2d) == 3);
  CHECK(counts.at(OpKind::LayerNorm) == 1);
  const Node* ln = g.find_node("ln");
  REQUIRE(ln);
  CHECK(ln->attrs.i("axis") == 1);
  CHECK(ln->attrs.i("last_axis") == 1);
  const Node* fc2 = g.find_node("fc2");
  REQUIRE(fc2);
  CHECK(fc2->inputs.size() == 5);  // the residual
  std::map<std::string, Tensor> in{{"x", Tensor::randn({2, 8, 5, 5}, 7)}};
  const auto want = test::run_cpu(source, in), got = test::run_cpu(g, in);
  for (const std::string& out : source.outputs) check_close(got.at(out), want.at(out), 1e-5, 1e-5);
}

TEST_CASE("canonicalize: transposes that are not NHWC's stay, composed where they meet",
          "[canonicalize]") {
  Builder b(32);
  Val x = b.input("x", {2, 3, 4, 5});
  Val t = b.transpose(b.transpose(x, {0, 3, 1, 2}, "a"), {0, 1, 3, 2}, "b");
  b.output(b.layer_norm(t, "ln", -1));
  const Graph source = b.build();
  Graph g = source;
  const PassReport r = optimize(g);
  const auto counts = g.op_counts();
  CHECK(counts.at(OpKind::Transpose) == 1);
  CHECK(g.nodes[0].attrs.ints("perm") == std::vector<int64_t>{0, 3, 2, 1});
  INFO(fmt::format("{}", fmt::join(r.refusals, "\n")));
  CHECK(std::any_of(r.refusals.begin(), r.refusals.end(), [](const std::string& s) {
    return s.find("permutes [0,3,2,1], not [0,2,3,1]") != std::string::npos;
  }));
  std::map<std::string, Tensor> in{{"x", Tensor::randn({2, 3, 4, 5}, 8)}};
  const auto want = test::run_cpu(source, in), got = test::run_cpu(g, in);
  for (const std::string& out : source.outputs) check_close(got.at(out), want.at(out), 1e-6, 1e-6);
}

// -- x + 0 as a broadcast (ONNX Expand) --

TEST_CASE("passes: an add of zeros that only broadcasts goes where its reader broadcasts",
          "[canonicalize]") {
  // y = x * (g + zeros [1, 1, 3, 5]) on x [2, 8, 3, 5] and g [2, 8, 1, 1]: the mul reads g.
  const auto build = [](const Shape& x_shape, float fill = 0.0f) {
    Builder b(45);
    b.set_weights({{"zeros", Tensor::full({1, 1, 3, 5}, fill)}});
    Val g = b.input("g", {2, 8, 1, 1});
    Val e = b.add(g, b.weight("zeros", {1, 1, 3, 5}, OpKind::Add, "b"), "expand");
    b.output(b.mul(b.input("x", x_shape), e, "gate"));
    return b.build();
  };
  Graph g = canonical(build({2, 8, 3, 5}), OpKind::Mul, 0);
  CHECK(g.op_counts().count(OpKind::Add) == 0);
  CHECK(g.nodes[0].inputs == std::vector<std::string>{"x", "g"});
  CHECK(!g.is_weight("zeros"));
  // Where g alone would not make the mul's shape, the zeros stay read (by the add, or the chain
  // it fuses into).
  Graph kept = build({2, 8, 1, 1});
  optimize(kept);
  CHECK(kept.is_weight("zeros"));
  CHECK(kept.value(kept.outputs[0]).shape == Shape{2, 8, 3, 5});
  // Nor where the add adds anything but zeros.
  Graph ones = build({2, 8, 3, 5}, 1.0f);
  optimize(ones);
  CHECK(ones.is_weight("zeros"));
}

// -- conv_transpose2d as conv2d and depth_to_space --

namespace {

// conv_transpose2d(x) of `o` [-> batchnorm -> relu] on x of `shape`.
Graph conv_transpose_graph(const Shape& shape, const ConvOpts& o, bool bn_relu = false) {
  Builder b(41);
  Val y = b.conv_transpose2d(b.input("x", shape), "up", o);
  if (bn_relu) y = b.relu(b.batchnorm(y, "bn"), "act");
  b.output(y);
  return b.build();
}

// `source` optimized (fuse: as compile does; else canonicalized only) computes what it computes
// on the CPU, within float32 sums of its reductions; returns the optimized graph.
Graph same_values(const Graph& source, bool fuse) {
  Graph g = source;
  PassOptions o;
  o.fuse = fuse;
  const PassReport r = optimize(g, o);
  INFO(r.summary() << "\n" << fmt::format("{}", fmt::join(r.refusals, "\n")));
  std::map<std::string, Tensor> in;
  for (const std::string& name : source.inputs)
    in[name] = Tensor::randn(source.value(name).shape, 12);
  const auto want = test::run_cpu(source, in), got = test::run_cpu(g, in);
  for (const std::string& out : source.outputs) check_close(got.at(out), want.at(out), 1e-5, 1e-5);
  return g;
}

}  // namespace

TEST_CASE(
    "canonicalize: conv_transpose2d of groups 1 and dilation 1 is a conv2d and a "
    "depth_to_space",
    "[canonicalize][conv_transpose]") {
  struct Case {
    Shape x;
    ConvOpts o;
    Shape conv_weight;  // [K * sh * sw, C, Th, Tw]
    std::vector<int64_t> padding;
    bool crop;
  };
  const std::vector<Case> cases = {
      // U-Net's 2x2 stride 2: a 1x1 conv, one input pixel an output pixel.
      {{2, 6, 5, 4}, ConvOpts(4, 2).stride(2).bias(), {16, 6, 1, 1}, {0, 0, 0, 0}, false},
      {{1, 3, 3, 3}, ConvOpts(2, 4).stride(4), {32, 3, 1, 1}, {0, 0, 0, 0}, false},
      {{1, 4, 3, 5},
       ConvOpts(3, 2).kernel(2, 3).stride(2, 3).bias(),
       {18, 4, 1, 1},
       {0, 0, 0, 0},
       false},
      // DCGAN's 4x4 stride 2 padding 1: a 3x3 conv of four phases.
      {{2, 5, 4, 4},
       ConvOpts(3, 4).stride(2).padding(1).bias(),
       {12, 5, 3, 3},
       {1, 1, 1, 1},
       false},
      // CycleGAN's 3x3 stride 2 padding 1 output_padding 1, and without it (cropped).
      {{1, 4, 5, 6},
       ConvOpts(3, 3).stride(2).padding(1).output_padding(1, 1),
       {12, 4, 2, 2},
       {0, 0, 1, 1},
       false},
      {{1, 4, 5, 6}, ConvOpts(3, 3).stride(2).padding(1).bias(), {12, 4, 2, 2}, {0, 0, 1, 1}, true},
      // Stride 1 is a conv2d of the flipped kernel alone.
      {{1, 3, 6, 6}, ConvOpts(2, 3).padding(1), {2, 3, 3, 3}, {1, 1, 1, 1}, false},
      // A kernel smaller than its stride: phases no tap reaches hold the bias only.
      {{1, 3, 4, 4}, ConvOpts(2, 1).stride(2).bias(), {8, 3, 1, 1}, {0, 0, 0, 0}, true},
      // Asymmetric padding.
      {{1, 2, 4, 5},
       ConvOpts(3, 4).stride(2).padding(2, 1, 0, 1),
       {12, 2, 2, 3},
       {0, 1, 1, 1},
       false}};
  for (const Case& c : cases) {
    const Graph source = conv_transpose_graph(c.x, c.o);
    INFO(shape_str(c.x) << " -> " << shape_str(source.value(source.outputs[0]).shape));
    const Graph g = same_values(source, false);
    const auto counts = g.op_counts();
    CHECK(counts.count(OpKind::ConvTranspose2d) == 0);
    const bool phases = c.conv_weight[0] != source.value(source.outputs[0]).shape[1];
    REQUIRE(g.nodes.size() == (phases || c.crop ? 2u : 1u));
    const Node& conv = g.nodes[0];
    CHECK(conv.op == OpKind::Conv2d);
    CHECK(conv.name == "up");
    CHECK(g.value(conv.inputs[1]).shape == c.conv_weight);
    CHECK(conv.attrs.ints("padding") == c.padding);
    if (phases) {
      CHECK(g.nodes[1].op == OpKind::DepthToSpace);
      CHECK(g.nodes[1].attrs.s("mode") == "CRD");
      CHECK((g.nodes[1].attrs.ints("crop") != std::vector<int64_t>(4, 0)) == c.crop);
    }
    CHECK(g.nodes.back().outputs == source.outputs);
    CHECK(!g.is_weight("up.weight"));  // the old weight went with its node
    // Fused as compile fuses: the conv takes the bias in its epilogue.
    const Graph f = same_values(source, true);
    CHECK(f.op_counts().at(OpKind::FusedConv2d) == 1);
  }
}

TEST_CASE("canonicalize: every small conv_transpose2d rewritten computes what it computed",
          "[canonicalize][conv_transpose]") {
  int rewritten = 0, kept = 0;
  for (int64_t k = 1; k <= 5; ++k)
    for (int64_t s = 1; s <= 3; ++s)
      for (int64_t p = 0; p < k; ++p)
        for (int64_t op = 0; op < s; ++op) {
          const ConvOpts o = ConvOpts(3, k).stride(s).padding(p).output_padding(op, 0).bias();
          const Shape x{1, 2, 3, 4};
          if ((x[2] - 1) * s - 2 * p + k + op < 1 || (x[3] - 1) * s - 2 * p + k < 1) continue;
          INFO("kernel " << k << " stride " << s << " padding " << p << " output_padding " << op);
          const Graph g = same_values(conv_transpose_graph(x, o), false);
          (g.op_counts().count(OpKind::ConvTranspose2d) ? kept : rewritten) += 1;
        }
  CHECK(rewritten > 60);
  CHECK(kept < 5);
}

TEST_CASE("canonicalize: conv_transpose2d the rewrite cannot express stays, saying why",
          "[canonicalize][conv_transpose]") {
  const std::vector<std::tuple<Shape, ConvOpts, std::string>> cases = {
      {{1, 4, 5, 5}, ConvOpts(4, 2).stride(2).groups(2), "has groups=2"},
      {{1, 4, 5, 5}, ConvOpts(4, 4).stride(4).groups(4), "has groups=4"},
      {{1, 3, 5, 5}, ConvOpts(2, 3).stride(2).dilation(2), "has dilation 2x2"},
      // Padding past the kernel: the conv would start inside x.
      {{1, 3, 5, 5}, ConvOpts(2, 2).stride(2).padding(2), "needs negative padding"}};
  for (const auto& [shape, o, why] : cases) {
    const Graph source = conv_transpose_graph(shape, o);
    INFO(why);
    untouched(source, why);
    same_values(source, true);
  }
  // A weight known only at run time.
  Graph g = conv_transpose_graph({1, 3, 4, 4}, ConvOpts(2, 2).stride(2));
  g.weights.erase("up.weight");
  g.inputs.push_back("up.weight");
  untouched(g, "weight of 'up' is computed");
}

TEST_CASE(
    "canonicalize: a batchnorm and an activation after a conv_transpose2d fuse into the "
    "conv before the depth_to_space",
    "[canonicalize][conv_transpose]") {
  // 3x3 stride 2 padding 1 without output_padding crops.
  const std::vector<std::pair<ConvOpts, bool>> cases = {
      {ConvOpts(3, 2).stride(2).bias(), false},
      {ConvOpts(3, 4).stride(2).padding(1), false},
      {ConvOpts(3, 3).stride(2).padding(1), true}};
  for (const auto& [o, crop] : cases) {
    const Graph source = conv_transpose_graph({2, 4, 4, 4}, o, true);
    const Graph g = same_values(source, true);
    REQUIRE(g.nodes.size() == 2u);
    CHECK(g.nodes[0].op == OpKind::FusedConv2d);
    CHECK(g.nodes[0].attrs.s("activation") == "relu");
    CHECK(g.nodes[1].op == OpKind::DepthToSpace);
    CHECK((g.nodes[1].attrs.ints("crop") != std::vector<int64_t>(4, 0)) == crop);
    CHECK(g.nodes.back().outputs == source.outputs);
  }
  // DCR phases repeat the parameters the other way round.
  Builder b(43);
  b.output(b.relu(
      b.batchnorm(b.depth_space(OpKind::DepthToSpace, b.input("x", {2, 12, 3, 3}), {2}), "bn")));
  const Graph g = same_values(b.build(), false);
  REQUIRE(g.nodes.size() == 3);
  CHECK(g.nodes[2].op == OpKind::DepthToSpace);
}

TEST_CASE("canonicalize: explain shows the conv and the depth_to_space of a conv_transpose2d",
          "[canonicalize][conv_transpose]") {
  Graph g = conv_transpose_graph({16, 256, 32, 32}, ConvOpts(128, 2).stride(2).bias());
  optimize(g);
  LowerOptions cuda;
  cuda.device = Device::CUDA;
  const std::string text = explain(lower(g, cuda));
  INFO(text);
  CHECK_THAT(text, Catch::Contains("fused_conv2d") && Catch::Contains("gemm") &&
                       Catch::Contains("[16,256,32,32] -> [16,512,32,32]") &&
                       Catch::Contains("depth_to_space") &&
                       Catch::Contains("[16,512,32,32] -> [16,128,64,64]"));
  CHECK_THAT(text, !Catch::Contains("conv_transpose2d"));
}

TEST_CASE("canonicalize: pixel_shuffle as reshape, transpose, reshape is depth_to_space",
          "[canonicalize][conv_transpose]") {
  const auto build = [](const std::vector<int64_t>& split, const std::vector<int64_t>& perm) {
    Builder b;
    Val x = b.input("x", {2, 12, 3, 5});
    b.output(b.reshape(b.transpose(b.reshape(x, split), perm), {2, 3, 6, 10}));
    return b.build();
  };
  Graph g = canonical(build({2, 3, 2, 2, 3, 5}, {0, 1, 4, 2, 5, 3}), OpKind::DepthToSpace, 0);
  CHECK(g.nodes[0].attrs.s("mode") == "CRD");
  g = canonical(build({2, 2, 2, 3, 3, 5}, {0, 3, 4, 1, 5, 2}), OpKind::DepthToSpace, 0);
  CHECK(g.nodes[0].attrs.s("mode") == "DCR");
  CHECK(g.nodes[0].attrs.ints("blocksize") == std::vector<int64_t>{2, 2});
  untouched(build({2, 3, 2, 2, 3, 5}, {0, 1, 4, 3, 5, 2}), "is no depth_to_space");
}

TEST_CASE("canonicalize: a batchnorm and an activation of a concat of convs go into each conv",
          "[canonicalize]") {
  // MixNet's mixed depthwise conv: x split into 4, 4 and 8 channels, 3x3, 5x5 and 7x7 depthwise
  // convs, concatenated, then batchnorm and SiLU: a fused conv a part, the concat in place.
  const auto mixed = [](bool passthrough) {
    Builder b(45);
    const std::vector<Val> parts = b.split(b.input("x", {2, 16, 9, 9}), 1, {4, 4, 8}, "split");
    std::vector<Val> ys;
    for (size_t i = 0; i < parts.size(); ++i) {
      const int64_t c = b.shape(parts[i])[1], k = 3 + 2 * int64_t(i);
      ys.push_back(passthrough && i == 0 ? parts[i]
                                         : b.conv2d(parts[i], fmt::format("dw{}", i),
                                                    ConvOpts(c, k).padding(k / 2).groups(c)));
    }
    b.output(b.silu(b.batchnorm(b.concat(ys, 1, "cat"), "bn"), "act"));
    return b.build();
  };
  const Graph g = same_values(mixed(false), true);
  CHECK(g.op_counts().count(OpKind::BatchNorm) == 0);
  CHECK(g.op_counts().count(OpKind::Silu) == 0);
  CHECK(g.op_counts().at(OpKind::FusedConv2d) == 3);
  CHECK(g.op_counts().at(OpKind::Concat) == 1);
  for (const Node& n : g.nodes)
    if (n.op == OpKind::FusedConv2d) CHECK(n.attrs.s("activation") == "silu");
  // A part no conv made (a split's view passed through) keeps them after the concat.
  untouched(mixed(true), "'split.0' is no conv's output that the concat alone reads");
}
