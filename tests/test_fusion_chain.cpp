// What the conv rules leave: chains of elementwise ops as one fused_elementwise, and batchnorms
// folded into the conv after them. Structurally (the nodes and programs the passes make, and
// their refusals) and numerically (the fused graph's CPU outputs against the unfused graph's,
// element by element).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>

#include "epilog/graph/passes.h"
#include "epilog/io/builder.h"
#include "epilog/io/dump.h"
#include "epilog/io/model.h"
#include "epilog/kernels/cpu.h"
#include "epilog/runtime/params.h"
#include "error_matcher.h"
#include "test_util.h"

using namespace epilog;

namespace {

int count(const Graph& g, OpKind op) {
  auto c = g.op_counts();
  return c.count(op) ? c[op] : 0;
}

// Optimizes a copy of g and checks each output against g's on random inputs, element by element:
// |fused - unfused| <= atol + rtol * |unfused|.
Graph fused(const Graph& g, PassReport* report = nullptr, double atol = 1e-6, double rtol = 1e-5) {
  Graph f = g;
  const PassReport r = optimize(f);
  if (report) *report = r;
  const auto in = test::random_inputs(g, 42);
  const auto want = test::run_cpu(g, in), got = test::run_cpu(f, in);
  for (const std::string& out : g.outputs) {
    const Tensor &w = want.at(out), &o = got.at(out);
    REQUIRE(o.shape() == w.shape());
    int64_t bad = 0;
    for (int64_t i = 0; i < w.numel(); ++i) {
      const double d = std::fabs(double(o.f32()[i]) - double(w.f32()[i]));
      bad += !(d <= atol + rtol * std::fabs(double(w.f32()[i])));
    }
    INFO("output " << out << ": " << bad << " of " << w.numel() << " elements off");
    CHECK(bad == 0);
  }
  return f;
}

bool refused(const PassReport& r, const std::string& why) {
  for (const std::string& refusal : r.refusals)
    if (refusal.find(why) != std::string::npos) return true;
  return false;
}

std::string refusals(const PassReport& r) {
  return fmt::format("{}", fmt::join(r.refusals, "\n"));
}

Val constant(Builder& b, const std::string& name, const Shape& shape, float value) {
  b.set_weights({{name, Tensor::full(shape, value)}});
  return b.weight(name, shape, OpKind::Add, "b");
}

}  // namespace

TEST_CASE("chain: each chain shape runs as one fused_elementwise, as its ops compute it",
          "[fusion]") {
  struct Case {
    std::string name;
    std::function<Val(Builder&)> build;
    std::string program;
    size_t inputs;
  };
  const std::vector<Case> cases = {
      {"unary ops only",
       [](Builder& b) {
         Val x = b.input("x", {2, 3, 5, 7});
         return b.activation(b.activation(b.relu(x), Activation::Tanh),
                             Act(Activation::Clip, 0.0f, 0.5f));
       },
       "relu, tanh, clip(0, 0.5)", 1},
      {"squeeze-excite: x * sigmoid(gate), the gate [N,C,1,1] the running value",
       [](Builder& b) {
         Val x = b.input("x", {2, 8, 5, 7}), g = b.input("g", {2, 8, 1, 1});
         return b.mul(x, b.sigmoid(g));
       },
       "sigmoid, mul(x1)", 2},
      {"squeeze-excite, the gate first",
       [](Builder& b) {
         Val x = b.input("x", {2, 8, 5, 7}), g = b.input("g", {2, 8, 1, 1});
         return b.mul(b.sigmoid(g), x);
       },
       "sigmoid, mul(x1)", 2},
      {"sub, the running value on the left",
       [](Builder& b) {
         Val x = b.input("x", {2, 3, 5, 7}), c = b.input("c", {1, 3, 1, 1});
         return b.sub(b.relu(x), c);
       },
       "relu, sub(x1)", 2},
      {"sub, the running value on the right",
       [](Builder& b) {
         Val x = b.input("x", {2, 3, 5, 7}), c = b.input("c", {1, 3, 1, 1});
         return b.sub(c, b.relu(x));
       },
       "relu, sub(x1, v)", 2},
      {"div on either side",
       [](Builder& b) {
         Val x = b.input("x", {2, 3, 5, 7}), c = b.input("c", {5, 7});
         return b.div(b.div(c, b.activation(x, Activation::Exp)), b.input("d", {2, 1, 1, 7}));
       },
       "exp, div(x1, v), div(x2)", 3},
      {"batchnorm -> relu (DenseNet)",
       [](Builder& b) {
         return b.relu(b.batchnorm(b.input("x", {2, 6, 5, 5}), "bn", 1e-3));
       },
       "mul(x1), add(x2), relu", 3},
      {"a batchnorm on 2-D values",
       [](Builder& b) {
         return b.sigmoid(b.batchnorm(b.input("x", {4, 6}), "bn"));
       },
       "mul(x1), add(x2), sigmoid", 3},
      {"the running value the smaller side, broadcast up, then on",
       [](Builder& b) {
         Val g = b.input("g", {2, 8, 1, 1}), x = b.input("x", {2, 8, 5, 7});
         Val y = b.add(b.mul(b.relu(g), x), b.input("c", {8, 1, 1}));
         return b.activation(y, Activation::Tanh);
       },
       "relu, mul(x1), add(x2), tanh", 3},
      // hardswish's form with other constants (with 3, 6 and 6 canonicalization makes it one op)
      {"x * clip(x + 2, 0, 5) / 5",
       [](Builder& b) {
         Val x = b.input("x", {2, 3, 5, 7});
         Val c = b.activation(b.add(x, constant(b, "two", {}, 2.0f)),
                              Act(Activation::Clip, 0.0f, 5.0f));
         return b.div(b.mul(x, c), constant(b, "five", {1}, 5.0f));
       },
       "add(x1), clip(0, 5), mul(x0), div(x2)", 3},
      {"ConvNeXt's layer scale and residual: x + gamma * h",
       [](Builder& b) {
         Val x = b.input("x", {2, 8, 5, 7}), h = b.input("h", {2, 8, 5, 7});
         return b.add(x, b.mul(b.weight("gamma", {8, 1, 1}, OpKind::Mul, "b"), h));
       },
       "mul(x1), add(x2)", 3},
      {"max and min against lower-rank operands",
       [](Builder& b) {
         Val x = b.input("x", {2, 3, 5, 7});
         Val y = b.binary(OpKind::Max, b.relu(x), b.input("c", {7}));
         return b.binary(OpKind::Min, b.input("d", {5, 1}), y);
       },
       "relu, max(x1), min(x2, v)", 3},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      Builder b(21);
      b.output(c.build(b));
      const Graph g = b.build();
      PassReport r;
      const Graph f = fused(g, &r);
      INFO(dump_text(f) << refusals(r));
      REQUIRE(f.nodes.size() == 1);
      const Node& n = f.nodes[0];
      CHECK(n.op == OpKind::FusedElementwise);
      CHECK(n.attrs.s("program") == c.program);
      CHECK(n.inputs.size() == c.inputs);
      CHECK(n.outputs == g.outputs);
      CHECK(f.value(n.outputs[0]).shape == g.value(g.outputs[0]).shape);
      CHECK(r.hits.size() == 1);
      CHECK(r.hits[0].rule == "elementwise chain");
      CHECK(r.hits[0].count == int(g.nodes.size()) - 1);
      CHECK_THAT(dump_text(f), Catch::Contains("fused_elementwise[" + c.program + "]("));
    }
  }
}

TEST_CASE("chain: the conv rules come first and keep what they take", "[fusion]") {
  // conv -> batchnorm -> sigmoid is the conv's; the mul by another value stays alone (a chain of
  // one op is that op).
  Builder b(22);
  Val x = b.input("x", {1, 4, 6, 6});
  Val s = b.sigmoid(b.batchnorm(b.conv2d(x, "c", ConvOpts(4, 1)), "bn"), "gate");
  b.output(b.mul(s, x, "m"));
  // A silu and a residual add go into the conv; what follows is a chain.
  Val y = b.add(b.silu(b.conv2d(x, "d", ConvOpts(4, 3).padding(1)), "act"), x, "sum");
  b.output(b.activation(b.relu(y, "r"), Activation::Tanh, "t"));
  PassReport r;
  const Graph f = fused(b.build(), &r);
  INFO(dump_text(f));
  CHECK(count(f, OpKind::FusedConv2d) == 2);
  CHECK(f.find_node("c")->attrs.s("activation") == "sigmoid");
  CHECK(f.find_node("d")->inputs.size() == 5);  // the residual
  CHECK(count(f, OpKind::Mul) == 1);
  REQUIRE(count(f, OpKind::FusedElementwise) == 1);
  CHECK(f.find_node("t")->attrs.s("program") == "relu, tanh");
}

TEST_CASE("chain: refused where a link is read twice, is a graph output, or too long", "[fusion]") {
  SECTION("a link read by two nodes stays") {
    Builder b(23);
    Val x = b.input("x", {1, 3, 4, 4});
    Val r = b.relu(x, "r");
    b.output(b.add(b.sigmoid(r, "s"), r, "sum"));
    PassReport rep;
    const Graph f = fused(b.build(), &rep);
    CHECK(count(f, OpKind::Relu) == 1);
    REQUIRE(f.find_node("sum"));
    CHECK(f.find_node("sum")->attrs.s("program") == "sigmoid, add(x0)");
    INFO(refusals(rep));
    CHECK(refused(rep, "elementwise chain at 'sum': 'sum' reads 'r' again in a step"));
  }
  SECTION("a graph output stays") {
    Builder b(24);
    Val x = b.input("x", {1, 3, 4, 4});
    Val r = b.relu(x, "r");
    b.output(b.sigmoid(r, "s"));
    b.output(r);
    PassReport rep;
    const Graph f = fused(b.build(), &rep);
    CHECK(f.nodes.size() == 2);
    CHECK(count(f, OpKind::FusedElementwise) == 0);
    INFO(refusals(rep));
    CHECK(refused(rep, "'r' is a graph output"));
  }
  SECTION("at most kMaxChainSteps steps") {
    Builder b(25);
    Val y = b.input("x", {2, 3, 4, 4});
    for (int i = 0; i <= kMaxChainSteps; ++i)
      y = b.activation(y, i % 2 ? Act(Activation::Tanh) : Act(Activation::LeakyRelu, 0.5f),
                       "a" + std::to_string(i));
    b.output(y);
    PassReport rep;
    const Graph f = fused(b.build(), &rep);
    REQUIRE(f.nodes.size() == 2);
    CHECK(f.nodes[0].op == OpKind::LeakyRelu);
    CHECK(node_chain(f.nodes[1]).steps == kMaxChainSteps);
    INFO(refusals(rep));
    CHECK(refused(rep, "the chain would take more than 8 steps"));
  }
  SECTION("at most kMaxChainInputs inputs") {
    Builder b(26);
    Val y = b.input("x", {2, 3, 4, 4});
    for (int i = 0; i < kMaxChainInputs; ++i)
      y = b.add(y, b.input("c" + std::to_string(i), {3, 1, 1}), "add" + std::to_string(i));
    b.output(y);
    PassReport rep;
    const Graph f = fused(b.build(), &rep);
    REQUIRE(f.nodes.size() == 2);
    CHECK(f.nodes[0].op == OpKind::Add);
    CHECK(f.nodes[1].inputs.size() == size_t(kMaxChainInputs));
    INFO(refusals(rep));
    CHECK(refused(rep, "the chain would read 6 inputs, more than 5"));
  }
  SECTION("a batchnorm whose statistics are computed") {
    Builder b(27);
    Val x = b.input("x", {1, 4, 3, 3});
    Val g = b.weight("bn.weight", {4}, OpKind::BatchNorm, "weight");
    Val be = b.weight("bn.bias", {4}, OpKind::BatchNorm, "bias");
    Val m = b.input("mean", {4});
    Val v = b.weight("bn.running_var", {4}, OpKind::BatchNorm, "running_var");
    b.output(b.relu(b.node(OpKind::BatchNorm, {x, g, be, m, v}, {}, "bn").front(), "r"));
    PassReport rep;
    const Graph f = fused(b.build(), &rep);
    CHECK(count(f, OpKind::BatchNorm) == 1);
    CHECK(count(f, OpKind::FusedElementwise) == 0);
    INFO(refusals(rep));
    CHECK(refused(rep, "batchnorm 'bn' is not in inference form (running_mean is computed"));
  }
}

TEST_CASE("chain: the program reads back as it prints; a bad one names its step", "[fusion]") {
  for (const std::string text :
       {"sigmoid, mul(x1)", "clip(0, 6), sub(x2, v), div(x0)", "mul(x1), add(x2), relu",
        "leaky_relu(0.1), hardsigmoid(0.2, 0.5), gelu_tanh, elu(1.5), pow(3), max(x4, v)",
        "clip(-3.4028235e+38, 3.4028235e+38)"}) {
    INFO(text);
    CHECK(chain_str(parse_chain(text)) == text);
  }
  const ChainProgram p = parse_chain(" relu ,min( x3 , v )");
  REQUIRE(p.steps == 2);
  CHECK(p.step[0].operand == -1);
  CHECK(p.step[0].act == Act(Activation::Relu));
  CHECK(p.step[1].op == Binary::Min);
  CHECK(p.step[1].operand == 3);
  CHECK(p.step[1].swap);
  REQUIRE_ERROR(parse_chain("sigmoid, foo"), "step 2", "'foo' is neither an activation");
  REQUIRE_ERROR(parse_chain("mul(y1)"), "step 1", "is not mul(xK) or mul(xK, v)");
  REQUIRE_ERROR(parse_chain("add(x5)"), "K below 5");
  REQUIRE_ERROR(parse_chain("add(x1, w)"), "is not add(xK)");
  REQUIRE_ERROR(parse_chain("clip(1)"), "'clip' takes 2 parameters, got 1");
  REQUIRE_ERROR(parse_chain("pow(two)"), "'two' is not a number");
  REQUIRE_ERROR(parse_chain("none"), "'none' is neither");
  REQUIRE_ERROR(parse_chain("relu, relu, relu, relu, relu, relu, relu, relu, relu"),
                "9 steps, more than the 8");

  // As a node of a model: shapes broadcast, every input read, every step's input there.
  Builder b(28);
  Val x = b.input("x", {2, 3}), y = b.input("y", {3});
  const auto program = [](const std::string& text) {
    Attrs a;
    a.set("program", text);
    return a;
  };
  const Val z = b.node(OpKind::FusedElementwise, {y, x}, program("relu, mul(x1)"), "z").front();
  CHECK(b.shape(z) == Shape{2, 3});
  REQUIRE_ERROR(b.node(OpKind::FusedElementwise, {x, y}, program("mul(x2)"), "w"),
                "[fused_elementwise] node 'w'", "step 1 reads x2, but there are 2 inputs");
  REQUIRE_ERROR(b.node(OpKind::FusedElementwise, {x, y}, program("relu"), "w"),
                "no step reads input x1");
  REQUIRE_ERROR(b.node(OpKind::FusedElementwise, {x}, program("relu, bad"), "w"),
                "[fused_elementwise] node 'w': program 'relu, bad': step 2");
  REQUIRE_ERROR(b.node(OpKind::FusedElementwise, {x, b.input("u", {2})}, program("add(x1)"), "w"),
                "shapes [2,3] and [2] do not broadcast");
}

TEST_CASE("chain: chain_shape merges the dims every tensor walks as one", "[fusion]") {
  Node n{"n", OpKind::FusedElementwise, {}, {}, {}};
  const Tensor x = Tensor::randn({2, 8, 5, 7}, 1), g = Tensor::randn({2, 8, 1, 1}, 2);
  const Tensor y = Tensor::empty({2, 8, 5, 7});
  ChainShape s = chain_shape(n, {g, x}, y);
  REQUIRE(s.rank == 2);
  CHECK(s.inputs == 2);
  CHECK((s.size[0] == 16 && s.size[1] == 35));
  CHECK((s.stride[0][0] == 1 && s.stride[0][1] == 0));
  CHECK((s.stride[1][0] == 35 && s.stride[1][1] == 1));
  CHECK((s.y_stride[0] == 35 && s.y_stride[1] == 1));
  s = chain_shape(n, {x, x}, y);  // equal shapes: one run
  CHECK((s.rank == 1 && s.size[0] == 560 && s.stride[1][0] == 1));
  s = chain_shape(n, {Tensor::randn({}, 3)}, Tensor::empty({}));  // one element
  CHECK((s.rank == 1 && s.size[0] == 1 && s.stride[0][0] == 0));
  // Channels 4..11 of a batch of 12-channel images: dim 0 steps by the image.
  const Tensor big = Tensor::randn({2, 12, 5, 7}, 4);
  const Tensor part = big.part(4 * 35, {2, 8, 5, 7});
  s = chain_shape(n, {part, g}, y);
  REQUIRE(s.rank == 3);
  CHECK((s.size[0] == 2 && s.size[1] == 8 && s.size[2] == 35));
  CHECK((s.stride[0][0] == 12 * 35 && s.stride[0][1] == 35 && s.stride[0][2] == 1));
  CHECK((s.y_stride[0] == 280 && s.y_stride[1] == 35 && s.y_stride[2] == 1));
  // The CPU kernel on the part reads what it reads on a contiguous copy.
  const ChainProgram p = parse_chain("mul(x1), relu");
  Tensor from_part = Tensor::empty(y.shape()), from_copy = Tensor::empty(y.shape());
  const Tensor copy = part.clone();
  const float* xs[2] = {part.f32(), g.f32()};
  cpu::fused_elementwise(p, s, xs, from_part.f32());
  xs[0] = copy.f32();
  cpu::fused_elementwise(p, chain_shape(n, {copy, g}, y), xs, from_copy.f32());
  CHECK(test::bit_equal(from_part, from_copy));
  REQUIRE_ERROR(chain_shape(n, {x, Tensor::randn({3, 1, 1}, 5)}, y), "[fused_elementwise] node 'n'",
                "input [3,1,1] does not broadcast");
}

// -- a batchnorm before a conv --

TEST_CASE("batchnorm fold: into the conv after it, exact where that conv does not pad",
          "[fusion]") {
  struct Case {
    std::string name;
    ConvOpts opts;
    int64_t channels;
  };
  for (const Case& c : std::vector<Case>{
           {"1x1", ConvOpts(6, 1), 5},
           {"3x3 stride 2, dilation 2, bias", ConvOpts(6, 3).stride(2).dilation(2).bias(), 5},
           {"grouped: 3 groups", ConvOpts(6, 3).groups(3).bias(), 9},
           {"depthwise", ConvOpts(8, 3).groups(8), 8}}) {
    DYNAMIC_SECTION(c.name) {
      Builder b(30);
      Val x = b.input("x", {2, c.channels, 9, 11});
      b.output(b.silu(b.conv2d(b.batchnorm(x, "bn", 1e-3), "c", c.opts), "act"));
      PassReport r;
      const Graph f = fused(b.build(), &r);
      REQUIRE(f.nodes.size() == 1);
      const Node& conv = f.nodes[0];
      CHECK(conv.op == OpKind::FusedConv2d);
      CHECK(conv.inputs[0] == "x");
      CHECK(conv.attrs.s("activation") == "silu");
      CHECK(count(f, OpKind::BatchNorm) == 0);
      CHECK_THAT(r.summary(), Catch::Contains("fused 1 batchnorm->fused_conv2d"));
      INFO(refusals(r));
      CHECK(r.refusals.empty());
    }
  }
}

TEST_CASE("batchnorm fold: the weights and shift in float64, each rounded once", "[fusion]") {
  // One group of two channels into one output: w' = w * s, shift' = shift + scale * sum w * t.
  Builder b;
  b.set_weights({{"c.weight", Tensor::from_vector({2, 1, 1, 2}, {1, 2, 3, -1})},
                 {"c.bias", Tensor::from_vector({2}, {0.5f, -1.0f})},
                 {"bn.weight", Tensor::from_vector({2}, {3.0f, 0.5f})},
                 {"bn.bias", Tensor::from_vector({2}, {0.25f, 1.0f})},
                 {"bn.running_mean", Tensor::from_vector({2}, {2.0f, -1.0f})},
                 {"bn.running_var", Tensor::from_vector({2}, {3.5f, 1.5f})}});
  Val x = b.input("x", {1, 2, 3, 4});
  b.output(b.conv2d(b.batchnorm(x, "bn", 0.5), "c", ConvOpts(2, 1).kernel(1, 2).groups(2).bias()));
  const Graph f = fused(b.build());
  REQUIRE(f.nodes.size() == 1);
  const Node& conv = f.nodes[0];
  const float* w = f.weights.at(conv.inputs[1]).data.f32();
  const float* shift = f.weights.at(conv.inputs[3]).data.f32();
  const double s0 = 3.0 / std::sqrt(4.0), s1 = 0.5 / std::sqrt(2.0);
  const double t0 = 0.25 - 2.0 * s0, t1 = 1.0 - -1.0 * s1;
  CHECK(w[0] == float(1 * s0));
  CHECK(w[1] == float(2 * s0));
  CHECK(w[2] == float(3 * s1));
  CHECK(w[3] == float(-1 * s1));
  CHECK(shift[0] == float(0.5 + (1 * t0 + 2 * t0)));
  CHECK(shift[1] == float(-1.0 + (3 * t1 + -1 * t1)));
}

TEST_CASE("batchnorm fold: refused where the conv pads, said why, and run as a chain", "[fusion]") {
  SECTION("padding") {
    Builder b(31);
    Val x = b.input("x", {1, 4, 6, 6});
    b.output(b.conv2d(b.batchnorm(x, "bn"), "c", ConvOpts(4, 3).padding(1, 0, 0, 0)));
    PassReport r;
    const Graph f = fused(b.build(), &r);
    CHECK(count(f, OpKind::BatchNorm) == 1);
    CHECK(f.find_node("c")->inputs[0] == "bn");
    INFO(refusals(r));
    CHECK(refused(r,
                  "batchnorm->fused_conv2d at 'c': 'c' pads its input (1,0,0,0), and its "
                  "padded zeros are not shifted as the batchnorm shifts 'x'"));
  }
  SECTION("batchnorm -> relu -> conv (DenseNet): the batchnorm and relu as one kernel") {
    Builder b(32);
    Val x = b.input("x", {1, 4, 6, 6});
    b.output(b.conv2d(b.relu(b.batchnorm(x, "bn"), "r"), "c", ConvOpts(4, 1)));
    PassReport r;
    const Graph f = fused(b.build(), &r);
    REQUIRE(f.nodes.size() == 2);
    CHECK(f.nodes[0].op == OpKind::FusedElementwise);
    CHECK(f.nodes[0].attrs.s("program") == "mul(x1), add(x2), relu");
    CHECK(f.nodes[1].op == OpKind::FusedConv2d);
  }
  SECTION("the batchnorm read by another node too") {
    Builder b(33);
    Val x = b.input("x", {1, 4, 6, 6});
    Val n = b.batchnorm(x, "bn");
    b.output(b.conv2d(n, "c", ConvOpts(4, 1)));
    b.output(b.add(n, x, "sum"));
    PassReport r;
    const Graph f = fused(b.build(), &r);
    CHECK(count(f, OpKind::BatchNorm) == 1);
    INFO(refusals(r));
    CHECK(refused(r, "batchnorm->fused_conv2d at 'c': 'bn' has 2 consumers"));
  }
}

TEST_CASE("cli: explain says why a batchnorm was not folded and shows a chain's steps",
          "[fusion][cli]") {
  Builder b(34);
  Val x = b.input("x", {1, 4, 6, 6});
  b.output(b.conv2d(b.batchnorm(x, "bn"), "c", ConvOpts(4, 3).padding(1)));
  b.output(b.relu(b.batchnorm(x, "bn2", 1e-3), "r"));
  const std::string path = (test::scratch_dir() / "bn_pad.json").string();
  save_model(b.build(), path);
  const std::string out = (test::scratch_dir() / "explain.txt").string();
  const std::string cmd = fmt::format("'{}' explain '{}' >'{}' 2>&1", test::cli_path(), path, out);
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream f(out);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  INFO(text);
  CHECK_THAT(text, Catch::Contains("not fused: batchnorm->fused_conv2d at 'c': 'c' pads its input "
                                   "(1,1,1,1)"));
  CHECK_THAT(text, Catch::Contains("fused_elementwise") &&
                       Catch::Contains("one kernel: mul(x1), add(x2), relu"));
}
