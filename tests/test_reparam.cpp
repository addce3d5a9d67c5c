// Structural reparameterization (graph/reparam.cpp): summed convs of one input become one conv,
// checked structurally (one fused conv a block) and numerically (the unoptimized graph on the
// CPU reference), and each refusal leaves the graph as it was and says why.
#include <catch2/catch.hpp>

#include <functional>

#include "epilog/graph/passes.h"
#include "epilog/io/builder.h"
#include "onnx_model.h"
#include "test_util.h"

using namespace epilog;
using epilog::test::max_rel_err;
using epilog::test::random_inputs;
using epilog::test::run_cpu;

namespace {

const char* const kHit = "reparameterized 1 add(conv2d,conv2d,...)->conv2d";

int count(const Graph& g, OpKind op) {
  auto c = g.op_counts();
  return c.count(op) ? c[op] : 0;
}

// Optimizes a copy and checks that it computes what the source graph computes: max |got -
// want| within 1e-5 of max |want|.
Graph optimized(const Graph& g, PassReport& report) {
  Graph f = g;
  report = optimize(f);
  INFO(report.summary() << "\n" << fmt::format("{}", fmt::join(report.refusals, "\n")));
  auto in = random_inputs(g, 42);
  auto want = run_cpu(g, in), got = run_cpu(f, in);
  for (const std::string& out : g.outputs) {
    INFO("output " << out);
    CHECK(max_rel_err(got.at(out), want.at(out)) <= 1e-5);
  }
  return f;
}

// A branch: conv(x) -> batchnorm, or, as PyTorch exports it, the batchnorm folded into the
// conv's bias.
Val conv_bn(Builder& b, Val x, const std::string& name, ConvOpts o, bool folded) {
  if (folded) return b.conv2d(x, name + ".conv", o.bias());
  return b.batchnorm(b.conv2d(x, name + ".conv", o), name + ".bn");
}

// timm's RepVggBlock: relu(conv_1x1(x) + conv_kxk(x) [+ identity(x)]), the identity a batchnorm
// where channels and size stay. `order` rotates the operands of the add tree.
Val repvgg_block(Builder& b, Val x, const std::string& name, int64_t out, int64_t stride,
                 int64_t groups = 1, bool folded = false, int order = 0) {
  const int64_t in = b.shape(x)[1];
  std::vector<Val> branches{
      conv_bn(b, x, name + ".conv_1x1", ConvOpts(out, 1).stride(stride).groups(groups), folded),
      conv_bn(b, x, name + ".conv_kxk", ConvOpts(out, 3).stride(stride).padding(1).groups(groups),
              folded)};
  if (in == out && stride == 1) branches.push_back(b.batchnorm(x, name + ".identity"));
  std::rotate(branches.begin(), branches.begin() + order % branches.size(), branches.end());
  Val sum = b.add(branches[0], branches[1], name + ".add");
  if (branches.size() > 2) sum = b.add(sum, branches[2], name + ".add_identity");
  return b.relu(sum, name + ".act");
}

// The one node a block became.
const Node& only_conv(const Graph& f) {
  REQUIRE(f.nodes.size() == 1);
  REQUIRE(f.nodes[0].op == OpKind::FusedConv2d);
  return f.nodes[0];
}

// A stack of RepVGG blocks, each with its own relu: one fused conv a block (and one for a linear
// head: the linear layers' 1x1 conv), nothing refused.
void check_stack(const Graph& g, int blocks) {
  PassReport r;
  Graph f = optimized(g, r);
  const int heads = count(g, OpKind::Linear);
  CHECK(count(f, OpKind::FusedConv2d) == blocks + heads);
  for (OpKind op : {OpKind::Conv2d, OpKind::BatchNorm, OpKind::Add, OpKind::Relu, OpKind::Linear})
    CHECK(count(f, op) == 0);
  CHECK_THAT(r.summary(),
             Catch::StartsWith(fmt::format("reparameterized {} add(conv2d,conv2d,...)->conv2d, ",
                                           blocks)) &&
                 Catch::Contains(fmt::format("fused {} conv2d->relu", blocks)));
  CHECK(r.refusals.empty());
}

}  // namespace

TEST_CASE("reparam: a RepVGG block, as modelled and as exported, is one fused conv", "[reparam]") {
  for (bool folded : {false, true}) {
    for (int order : {0, 1, 2}) {
      DYNAMIC_SECTION((folded ? "bias-folded" : "batchnorms") << ", order " << order) {
        Builder b(1);
        Val x = b.input("x", {2, 8, 9, 7});
        b.output(repvgg_block(b, x, "block", 8, 1, 1, folded, order));
        PassReport r;
        Graph f = optimized(b.build(), r);
        const Node& n = only_conv(f);
        CHECK(n.attrs.s("activation") == "relu");
        CHECK(n.inputs[0] == "x");
        CHECK(n.attrs.ints("padding") == std::vector<int64_t>{1, 1, 1, 1});
        CHECK(f.value(n.inputs[1]).shape == Shape{8, 8, 3, 3});
        CHECK(r.summary() == std::string(kHit) + ", fused 1 conv2d->relu, removed 0 dead nodes");
        CHECK(r.refusals.empty());
      }
    }
  }
}

TEST_CASE("reparam: the merged kernel and bias are the branches' sum, rounded once", "[reparam]") {
  // One channel: conv3x3(x) + b3 + conv1x1(x) + b1 + x has the kernel w3 with w1 + 1 added at
  // its center, and the bias b3 + b1.
  Builder b;
  const std::vector<float> w3{0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f};
  b.set_weights({{"c3.weight", Tensor::from_vector({1, 1, 3, 3}, w3)},
                 {"c3.bias", Tensor::from_vector({1}, {0.25f})},
                 {"c1.weight", Tensor::from_vector({1, 1, 1, 1}, {0.3f})},
                 {"c1.bias", Tensor::from_vector({1}, {-0.125f})}});
  Val x = b.input("x", {1, 1, 5, 5});
  Val c3 = b.conv2d(x, "c3", ConvOpts(1, 3).padding(1).bias());
  Val c1 = b.conv2d(x, "c1", ConvOpts(1, 1).bias());
  b.output(b.add(b.add(c3, x, "a"), c1, "sum"));
  Graph g = b.build();
  RewriteStats s = reparameterize(g, {});
  CHECK(s.hits.at("add(conv2d,conv2d,...)->conv2d") == 1);
  REQUIRE(g.nodes.size() == 1);
  const Node& n = g.nodes[0];
  CHECK(n.op == OpKind::Conv2d);
  CHECK(n.name == "c3");
  CHECK(n.outputs[0] == "sum");
  const float* w = g.weights.at(n.inputs[1]).data.f32();
  for (int i = 0; i < 9; ++i)
    CHECK(w[i] == (i == 4 ? float(double(w3[4]) + double(0.3f) + 1.0) : w3[i]));
  CHECK(g.weights.at(n.inputs[2]).data.f32()[0] == float(double(0.25f) + double(-0.125f)));
}

TEST_CASE("reparam: ACNet's 3x3 + 1x3 + 3x1 with batchnorms is one conv", "[reparam]") {
  for (int64_t stride : {1, 2}) {
    Builder b(2);
    Val x = b.input("x", {2, 6, 10, 9});
    const auto o = [&](int64_t kh, int64_t kw) {
      return ConvOpts(5, 3).kernel(kh, kw).stride(stride).padding(kh / 2, kw / 2, kh / 2, kw / 2);
    };
    Val sq = conv_bn(b, x, "square", o(3, 3), false);
    Val hor = conv_bn(b, x, "hor", o(1, 3), false);
    Val ver = conv_bn(b, x, "ver", o(3, 1), false);
    b.output(b.silu(b.add(b.add(hor, sq, "a1"), ver, "a2"), "act"));
    PassReport r;
    Graph f = optimized(b.build(), r);
    CHECK(only_conv(f).attrs.s("activation") == "silu");
    CHECK(f.value(only_conv(f).inputs[1]).shape == Shape{5, 6, 3, 3});
    CHECK_THAT(r.summary(), Catch::Contains(kHit));
  }
}

TEST_CASE("reparam: grouped and depthwise RepVGG blocks, identity per group", "[reparam]") {
  for (int64_t groups : {2, 4, 8}) {
    INFO("groups " << groups);
    Builder b(3);
    Val x = b.input("x", {1, 8, 7, 6});
    b.output(repvgg_block(b, x, "block", 8, 1, groups));
    PassReport r;
    Graph f = optimized(b.build(), r);
    CHECK(only_conv(f).attrs.i("groups") == groups);
    CHECK_THAT(r.summary(), Catch::Contains(kHit));
  }
}

TEST_CASE("reparam: any kernels whose taps line up merge, dilated ones too", "[reparam]") {
  // A 2x2 conv padded at the bottom and right reads rows o and o + 1: taps 2 and 3 of a 5x5 with
  // padding 2. With dilation 2, a 1x1 and the identity are the center of a dilated 3x3.
  for (bool dilated : {false, true}) {
    INFO((dilated ? "dilation 2" : "5x5 + 3x3 + 2x2 + identity"));
    Builder b(4);
    Val x = b.input("x", {1, 4, 9, 8});
    std::vector<Val> parts;
    if (dilated) {
      parts = {conv_bn(b, x, "c3", ConvOpts(4, 3).padding(2).dilation(2), false),
               conv_bn(b, x, "c1", ConvOpts(4, 1).dilation(2), true)};
    } else {
      parts = {conv_bn(b, x, "c5", ConvOpts(4, 5).padding(2), false),
               conv_bn(b, x, "c3", ConvOpts(4, 3).padding(1), true),
               conv_bn(b, x, "c2", ConvOpts(4, 2).padding(0, 0, 1, 1), false)};
    }
    Val sum = b.batchnorm(x, "identity");
    for (size_t i = 0; i < parts.size(); ++i) sum = b.add(parts[i], sum, "a" + std::to_string(i));
    b.output(sum);
    PassReport r;
    Graph f = optimized(b.build(), r);
    CHECK(f.value(only_conv(f).inputs[1]).shape ==
          (dilated ? Shape{4, 4, 3, 3} : Shape{4, 4, 5, 5}));
    CHECK_THAT(r.summary(), Catch::Contains(kHit));
  }
}

TEST_CASE("reparam: operands of other inputs stay in the add", "[reparam]") {
  // conv(x) + conv(x) + z: the convs merge and z is the fused conv's residual; with two convs
  // of y as well, both pairs merge and one takes the other in as its residual.
  for (bool second_pair : {false, true}) {
    Builder b(5);
    Val x = b.input("x", {1, 4, 6, 6});
    Val z = b.input("z", {1, 4, 6, 6});
    Val sum = b.add(conv_bn(b, x, "c3", ConvOpts(4, 3).padding(1), false), z, "a1");
    if (second_pair) sum = b.add(sum, b.conv2d(z, "d3", ConvOpts(4, 3).padding(1)), "a2");
    sum = b.add(sum, conv_bn(b, x, "c1", ConvOpts(4, 1), true), "a3");
    if (second_pair) sum = b.add(b.conv2d(z, "d1", ConvOpts(4, 1).bias()), sum, "a4");
    b.output(b.relu(sum, "act"));
    PassReport r;
    Graph f = optimized(b.build(), r);
    CHECK(count(f, OpKind::Add) == 0);
    CHECK(count(f, OpKind::FusedConv2d) == (second_pair ? 2 : 1));
    CHECK(f.nodes.size() == (second_pair ? 2 : 1));
    CHECK_THAT(r.summary(),
               Catch::Contains(fmt::format("reparameterized {} add", second_pair ? 2 : 1)) &&
                   Catch::Contains("fused 1 fused_conv2d->add"));
  }
}

TEST_CASE("reparam: runs as its own stage, before fusion", "[reparam]") {
  Builder b(6);
  Val x = b.input("x", {1, 4, 5, 5});
  b.output(repvgg_block(b, x, "block", 4, 1));
  Graph g = b.build(), h = g;
  std::vector<std::string> stages;
  PassOptions po;
  po.on_stage = [&](int, const std::string& name, const Graph& s) {
    stages.push_back(name);
    if (name == "reparameterize") {
      CHECK(count(s, OpKind::Conv2d) == 1);
      CHECK(count(s, OpKind::Add) == 0);
      CHECK(count(s, OpKind::FusedConv2d) == 0);
    }
  };
  optimize(g, po);
  CHECK(stages ==
        std::vector<std::string>{"source", "canonicalize", "reparameterize", "fuse", "dce"});
  // Without fusion, no reparameterization either.
  po.fuse = false;
  stages.clear();
  PassReport r = optimize(h, po);
  CHECK(stages == std::vector<std::string>{"source", "canonicalize", "dce"});
  CHECK(count(h, OpKind::Add) == 2);
  CHECK(r.hits.empty());
}

TEST_CASE("reparam: a RepVGG-like stack, strided blocks without identity, end to end",
          "[reparam]") {
  Builder b(7);
  Val x = b.input("images", {2, 3, 32, 32});
  Val y = repvgg_block(b, x, "stem", 8, 2);
  y = repvgg_block(b, y, "s0.0", 8, 1);
  y = repvgg_block(b, y, "s1.0", 16, 2, 1, true);
  y = repvgg_block(b, y, "s1.1", 16, 1, 4, true);
  y = repvgg_block(b, y, "s1.2", 16, 1, 1, true, 1);
  y = repvgg_block(b, y, "s2.0", 32, 2, 2);
  b.output(b.linear(b.flatten(b.global_avgpool(y, "pool")), "head", 10));
  Graph g = b.build();
  REQUIRE(count(g, OpKind::Conv2d) == 12);
  check_stack(g, 6);
}

// -- refusals: the pass leaves the graph as it was and says why --

namespace {

void check_refused(const std::function<void(Builder&)>& build, const std::string& why) {
  Builder b(8);
  build(b);
  const Graph g = b.build();
  Graph f = g;
  RewriteStats s = reparameterize(f, {});
  CHECK(s.hits.empty());
  CHECK(f.nodes == g.nodes);
  REQUIRE(s.refused.size() == 1);
  CHECK_THAT(s.refused.begin()->first,
             Catch::StartsWith("add(conv2d,conv2d,...)->conv2d at '") && Catch::Contains(why));
  // optimize() reports it, and the rest of the pipeline still computes the same.
  PassReport r;
  optimized(g, r);
  bool said = false;
  for (const std::string& refusal : r.refusals)
    said = said || refusal.find(why) != std::string::npos;
  CHECK(said);
}

}  // namespace

TEST_CASE("reparam refuses: convs of different inputs, strides, dilations or groups", "[reparam]") {
  check_refused(
      [](Builder& b) {
        Val x = b.input("x", {1, 4, 6, 6}), y = b.input("y", {1, 4, 6, 6});
        b.output(b.add(b.conv2d(x, "c3", ConvOpts(4, 3).padding(1)),
                       b.conv2d(y, "c1", ConvOpts(4, 1)), "sum"));
      },
      "the convs read different values ('x', 'y')");
  check_refused(
      [](Builder& b) {  // 5x5 -> 3x3 either way
        Val x = b.input("x", {1, 4, 5, 5});
        b.output(b.add(b.conv2d(x, "c3", ConvOpts(4, 3)),
                       b.conv2d(x, "c1", ConvOpts(4, 1).stride(2)), "sum"));
      },
      "'c1' has stride 2x2 and 'c3' 1x1");
  check_refused(
      [](Builder& b) {
        Val x = b.input("x", {1, 4, 7, 7});
        b.output(b.add(b.conv2d(x, "c3", ConvOpts(4, 3).padding(1)),
                       b.conv2d(x, "d3", ConvOpts(4, 3).padding(2).dilation(2)), "sum"));
      },
      "'d3' has dilation 2x2 and 'c3' 1x1");
  check_refused(
      [](Builder& b) {
        Val x = b.input("x", {1, 4, 6, 6});
        b.output(b.add(b.conv2d(x, "c3", ConvOpts(4, 3).padding(1)),
                       b.conv2d(x, "c1", ConvOpts(4, 1).groups(2)), "sum"));
      },
      "'c1' has 2 groups and 'c3' 1");
}

TEST_CASE("reparam refuses: taps that do not line up, and a broadcast branch", "[reparam]") {
  check_refused(
      [](Builder& b) {  // both 6x6, but one reads rows o-1..o+1 and the other o..o+2
        Val x = b.input("x", {1, 4, 6, 6});
        b.output(b.add(b.conv2d(x, "c3", ConvOpts(4, 3).padding(1)),
                       b.conv2d(x, "s3", ConvOpts(4, 3).padding(0, 0, 2, 2)), "sum"));
      },
      "'s3' (3x3, padding 0,0,2,2) does not line up inside 'c3' (3x3, padding 1,1,1,1)");
  check_refused(
      [](Builder& b) {
        Val x = b.input("x", {1, 4, 3, 3});
        b.output(
            b.add(b.conv2d(x, "c3", ConvOpts(4, 3)), b.conv2d(x, "c1", ConvOpts(4, 1)), "sum"));
      },
      "'c3' of shape [1,4,1,1] is broadcast onto [1,4,3,3]");
}

TEST_CASE("reparam refuses: an identity branch that changes channels or strides", "[reparam]") {
  check_refused(
      [](Builder& b) {  // x of one channel broadcasts onto the convs' four
        Val x = b.input("x", {1, 1, 6, 6});
        Val sum = b.add(b.conv2d(x, "c3", ConvOpts(4, 3).padding(1)),
                        b.conv2d(x, "c1", ConvOpts(4, 1)), "sum");
        b.output(b.add(sum, x, "sum2"));
      },
      "the identity branch 'x' needs stride 1 and as many channels in as out (stride 1x1, 1 -> 4 "
      "channels)");
  check_refused(
      [](Builder& b) {  // one column in, one column out at stride 2
        Val x = b.input("x", {1, 4, 5, 1});
        Val sum = b.add(b.conv2d(x, "c3", ConvOpts(4, 3).stride(1, 2).padding(1)),
                        b.conv2d(x, "c1", ConvOpts(4, 1).stride(1, 2)), "sum");
        b.output(b.add(sum, b.batchnorm(x, "identity"), "sum2"));
      },
      "the identity branch 'identity' needs stride 1 and as many channels in as out (stride 1x2");
}

TEST_CASE("reparam refuses: an intermediate read elsewhere, weights not constant", "[reparam]") {
  check_refused(
      [](Builder& b) {
        Val x = b.input("x", {1, 4, 6, 6});
        Val c1 = b.conv2d(x, "c1", ConvOpts(4, 1));
        b.output(b.add(b.conv2d(x, "c3", ConvOpts(4, 3).padding(1)), c1, "sum"));
        b.output(b.relu(c1, "other"));
      },
      "'c1' has 2 consumers");
  check_refused(
      [](Builder& b) {
        Val x = b.input("x", {1, 4, 6, 6});
        Val c1 = b.batchnorm(b.conv2d(x, "c1", ConvOpts(4, 1)), "bn");
        b.output(b.add(b.conv2d(x, "c3", ConvOpts(4, 3).padding(1)), c1, "sum"));
        b.output(c1);
      },
      "'bn' is a graph output");
  check_refused(
      [](Builder& b) {
        Val x = b.input("x", {1, 4, 6, 6});
        Attrs none;
        Val c1 = b.node(OpKind::Conv2d, {x, b.input("w", {4, 4, 1, 1})}, none, "c1").front();
        b.output(b.add(b.conv2d(x, "c3", ConvOpts(4, 3).padding(1)), c1, "sum"));
      },
      "weight 'w' of 'c1' is computed, not a constant");
  check_refused(
      [](Builder& b) {
        Val x = b.input("x", {1, 4, 6, 6});
        Val c1 = b.conv2d(x, "c1", ConvOpts(4, 1));
        Val g = b.weight("bn.weight", {4}, OpKind::BatchNorm, "weight");
        Val be = b.weight("bn.bias", {4}, OpKind::BatchNorm, "bias");
        Val m = b.weight("bn.running_mean", {4}, OpKind::BatchNorm, "running_mean");
        Val v = b.relu(b.input("var", {4}), "var_pos");
        Val n = b.node(OpKind::BatchNorm, {c1, g, be, m, v}, Attrs(), "bn").front();
        b.output(b.add(b.conv2d(x, "c3", ConvOpts(4, 3).padding(1)), n, "sum"));
      },
      "running_var 'var_pos' of 'bn' is computed, not a constant");
}

#ifdef EPILOG_HAVE_ONNX

namespace {

using epilog::onnx_test::Model;

// timm's repvgg_a0 as torch.onnx.export writes it in eval mode: each conv's batchnorm folded
// into its bias, the identity batchnorm kept, relu(Add(Add(1x1, kxk), identity)). Stem 3 -> 48
// at stride 2, stages of 2, 4, 14 and 1 blocks of 48, 96, 192 and 1280 channels, each stage's
// first block at stride 2 without identity; global average pool, flatten, 1000 classes. Random
// weights scaled by fan-in so that 22 blocks stay finite, and random batchnorm statistics.
Model repvgg_a0(int64_t size) {
  Model m;
  uint64_t seed = 1;
  const auto init = [&](const std::string& name, const Shape& dims, float scale, float offset) {
    Tensor t = Tensor::randn(dims, seed++, scale);
    std::vector<float> v = onnx_test::values(t);
    for (float& f : v) f = offset > 0 ? offset + std::fabs(f) : f;
    m.init(name, dims, v);
  };
  m.input("x", {1, 3, size, size});
  std::string x = "x";
  int64_t in = 3;
  const auto block = [&](const std::string& name, int64_t out, int64_t stride) {
    std::vector<std::string> sum;
    for (int64_t k : {1, 3}) {
      const std::string conv = name + (k == 1 ? ".conv_1x1.conv" : ".conv_kxk.conv");
      init(conv + ".weight", {out, in, k, k}, float(std::sqrt(1.0 / (in * 9))), 0);
      init(conv + ".bias", {out}, 0.1f, 0);
      auto& n = m.node("Conv", {x, conv + ".weight", conv + ".bias"}, {conv}, conv);
      onnx_test::set_ints(n, "kernel_shape", {k, k});
      onnx_test::set_ints(n, "pads", std::vector<int64_t>(4, k / 2));
      onnx_test::set_ints(n, "strides", {stride, stride});
      onnx_test::set_i(n, "group", 1);
      sum.push_back(conv);
    }
    std::string y = name + ".add";
    m.node("Add", sum, {y}, y);
    if (in == out && stride == 1) {
      const std::string id = name + ".identity";
      init(id + ".weight", {out}, 0.2f, 0.5f);
      init(id + ".bias", {out}, 0.1f, 0);
      init(id + ".running_mean", {out}, 0.1f, 0);
      init(id + ".running_var", {out}, 0.2f, 0.5f);
      onnx_test::set_f(
          m.node("BatchNormalization",
                 {x, id + ".weight", id + ".bias", id + ".running_mean", id + ".running_var"}, {id},
                 id),
          "epsilon", 1e-5f);
      m.node("Add", {y, id}, {y + "_identity"}, y + "_identity");
      y += "_identity";
    }
    m.node("Relu", {y}, {name + ".act"}, name + ".act");
    x = name + ".act";
    in = out;
  };
  block("stem", 48, 2);
  const int64_t depth[] = {2, 4, 14, 1}, width[] = {48, 96, 192, 1280};
  for (int s = 0; s < 4; ++s)
    for (int i = 0; i < depth[s]; ++i)
      block(fmt::format("stages.{}.{}", s, i), width[s], i == 0 ? 2 : 1);
  m.node("GlobalAveragePool", {x}, {"pool"}, "pool");
  onnx_test::set_i(m.node("Flatten", {"pool"}, {"flat"}, "flat"), "axis", 1);
  init("head.fc.weight", {1000, 1280}, 0.03f, 0);
  init("head.fc.bias", {1000}, 0.1f, 0);
  onnx_test::set_i(m.node("Gemm", {"flat", "head.fc.weight", "head.fc.bias"}, {"y"}, "head.fc"),
                   "transB", 1);
  m.output("y");
  return m;
}

}  // namespace

TEST_CASE("reparam: timm repvgg_a0 as exported to ONNX is 22 fused convs", "[reparam][onnx]") {
  Graph g = repvgg_a0(64).load();
  REQUIRE(count(g, OpKind::Conv2d) == 44);
  REQUIRE(count(g, OpKind::BatchNorm) == 17);
  REQUIRE(count(g, OpKind::Add) == 22 + 17);
  check_stack(g, 22);
}

#endif  // EPILOG_HAVE_ONNX

TEST_CASE("reparam: one conv and a batchnorm of its input (RepGhost) are one conv", "[reparam]") {
  // timm's RepGhost module: x1 = primary(x) (conv, batchnorm [, relu]); then depthwise(x1) +
  // batchnorm(x1) [-> relu], the batchnorm an identity branch merged into the depthwise kernel.
  for (bool relu : {true, false}) {
    INFO("relu " << relu);
    Builder b(3);
    Val x = b.input("x", {2, 8, 7, 6});
    Val x1 = b.batchnorm(b.conv2d(x, "primary", ConvOpts(8, 1)), "primary.bn");
    if (relu) x1 = b.relu(x1, "primary.act");
    Val x2 = b.conv2d(x1, "cheap", ConvOpts(8, 3).padding(1).groups(8).bias());
    Val y = b.add(x2, b.batchnorm(x1, "fusion_bn"), "add");
    b.output(relu ? b.relu(y, "act") : y);
    PassReport r;
    const Graph f = optimized(b.build(), r);
    CHECK(count(f, OpKind::FusedConv2d) == 2);
    CHECK(f.nodes.size() == 2);
    CHECK_THAT(r.summary(), Catch::Contains(kHit));
  }
}
