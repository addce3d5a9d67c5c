// The pattern matcher, the fusion rules, their refusals and the pass pipeline: structurally (op
// counts) and numerically (fused output against the unfused CPU reference).
#include <catch2/catch.hpp>

#include <functional>

#include "epilog/graph/passes.h"
#include "epilog/io/builder.h"
#include "epilog/io/dump.h"
#include "test_util.h"
#include "yolo_like.h"

using namespace epilog;
using epilog::test::max_rel_err;
using epilog::test::random_inputs;
using epilog::test::run_cpu;

namespace {

int count(const Graph& g, OpKind op) {
  auto c = g.op_counts();
  return c.count(op) ? c[op] : 0;
}

// Optimizes a copy and checks the fused graph computes what the source graph computes.
Graph optimized(const Graph& g, PassReport* report = nullptr, double tol = 1e-5) {
  Graph f = g;
  PassReport r = optimize(f);
  if (report) *report = r;
  auto in = random_inputs(g, 42);
  auto want = run_cpu(g, in);
  auto got = run_cpu(f, in);
  for (const std::string& out : g.outputs) {
    INFO("output " << out);
    CHECK(max_rel_err(got.at(out), want.at(out)) <= tol);
  }
  return f;
}

Graph conv_chain(const std::string& tail, bool bias, uint64_t seed = 3) {
  Builder b(seed);
  Val x = b.input("x", {2, 5, 9, 11});
  Val y = b.conv2d(x, "c", ConvOpts(7, 3).stride(2).padding(1, 0, 2, 1).bias(bias));
  if (tail.find("bn") != std::string::npos) y = b.batchnorm(y, "bn", 1e-3);
  if (tail.find("silu") != std::string::npos) y = b.silu(y, "act");
  if (tail.find("relu") != std::string::npos) y = b.relu(y, "act");
  if (tail.find("sigmoid") != std::string::npos) y = b.sigmoid(y, "act");
  b.output(y);
  return b.build();
}

}  // namespace

TEST_CASE("pattern: binds nodes and values, matches add/mul operands in either order", "[fusion]") {
  Builder b;
  Val x = b.input("x", {1, 4, 3, 3});
  Val s = b.sigmoid(x, "s");
  b.output(b.mul(s, x, "m"));  // sigmoid first: needs the swapped operand order
  Graph g = b.build();
  UseIndex uses(g);
  Pat p = op(OpKind::Mul, {any("x"), op(OpKind::Sigmoid, {any("x")}, "sig")}, "mul");
  auto m = match(g, uses, p, 1);
  REQUIRE(m);
  CHECK(m->value("x") == "x");
  CHECK(m->node("sig").name == "s");
  CHECK(m->nodes.size() == 2);
  CHECK_FALSE(match(g, uses, p, 0));  // root is the sigmoid, not a mul
  // A repeated binding must bind the same value: mul(x, sigmoid(y)) is no silu.
  Builder b2;
  Val x2 = b2.input("x", {1, 4, 3, 3});
  Val y2 = b2.input("y", {1, 4, 3, 3});
  b2.output(b2.mul(x2, b2.sigmoid(y2, "s"), "m"));
  Graph g2 = b2.build();
  CHECK_FALSE(match(g2, UseIndex(g2), p, 1));
  // Only add and mul swap: a concat's operands match in their order alone.
  Builder b3;
  Val x3 = b3.input("x", {1, 4, 3, 3});
  b3.output(b3.concat({b3.sigmoid(x3, "s"), x3}, 1, "cat"));
  Graph g3 = b3.build();
  const UseIndex uses3(g3);
  CHECK(match(g3, uses3, op(OpKind::Concat, {op(OpKind::Sigmoid, {any("x")}), any("x")}), 1));
  CHECK_FALSE(match(g3, uses3, op(OpKind::Concat, {any("x"), op(OpKind::Sigmoid, {any("x")})}), 1));
}

TEST_CASE("pattern: operand orders are tried again when the rest fails; a node read twice",
          "[fusion]") {
  // mul(mul(0.5, x), sigmoid(x)): the inner mul's two any()s bind either way round, and only x
  // first lets sigmoid(x) match.
  Builder b;
  b.set_weights({{"half", Tensor::full({}, 0.5f)}});
  Val x = b.input("x", {1, 4, 3, 3});
  Val inner = b.mul(b.weight("half", {}, OpKind::Mul, "b"), x, "inner");
  b.output(b.mul(inner, b.sigmoid(x, "s"), "m"));
  Graph g = b.build();
  const Pat p = op(OpKind::Mul, {op(OpKind::Mul, {any("x"), any("k")}, "inner"),
                                 op(OpKind::Sigmoid, {any("x")}, "sig")});
  auto m = match(g, UseIndex(g), p, 2);
  REQUIRE(m);
  CHECK(m->value("x") == "x");
  CHECK(m->value("k") == "half");
  // d * d with d = x - 1: the pattern reads d twice, so d may be absorbed; a reader outside the
  // pattern keeps it.
  for (bool outside : {false, true}) {
    Builder b2;
    b2.set_weights({{"one", Tensor::full({}, 1.0f)}});
    Val y = b2.input("x", {1, 4, 3, 3});
    Val d = b2.sub(y, b2.weight("one", {}, OpKind::Sub, "b"), "d");
    b2.output(b2.mul(d, d, "sq"));
    if (outside) b2.output(b2.relu(d, "r"));
    Graph g2 = b2.build();
    const UseIndex uses(g2);
    const Pat d_pat = op(OpKind::Sub, {any("x"), any("one")}, "d");
    auto m2 = match(g2, uses, op(OpKind::Mul, {d_pat, d_pat}, "sq"), 1);
    REQUIRE(m2);
    CHECK(m2->nodes.size() == 2);
    CHECK(m2->links.size() == 2);
    CHECK(can_absorb(g2, uses, *m2, OpKind::Mul, nullptr) ==
          (outside ? "'d' has 3 consumers, 1 outside the pattern" : ""));
  }
}

TEST_CASE("fusion: every conv rule fuses into one fused_conv2d with the right activation",
          "[fusion]") {
  struct Case {
    std::string tail;
    bool bias;
    std::string rule, act;
  };
  for (const Case& c :
       std::vector<Case>{{"bn silu", false, "conv2d->batchnorm->silu", "silu"},
                         {"bn relu", true, "conv2d->batchnorm->relu", "relu"},
                         {"bn sigmoid", false, "conv2d->batchnorm->sigmoid", "sigmoid"},
                         {"bn", true, "conv2d->batchnorm", "none"},
                         {"bn", false, "conv2d->batchnorm", "none"},
                         {"silu", true, "conv2d->silu", "silu"},
                         {"relu", false, "conv2d->relu", "relu"},
                         {"sigmoid", true, "conv2d->sigmoid", "sigmoid"}}) {
    DYNAMIC_SECTION(c.rule << (c.bias ? " with bias" : " without bias")) {
      Graph g = conv_chain(c.tail, c.bias);
      PassReport r;
      Graph f = optimized(g, &r);
      REQUIRE(f.nodes.size() == 1);
      const Node& n = f.nodes[0];
      CHECK(n.op == OpKind::FusedConv2d);
      CHECK(n.name == "c");
      CHECK(n.attrs.s("activation") == c.act);
      CHECK(n.attrs.ints("padding") == std::vector<int64_t>{1, 0, 2, 1});
      CHECK(n.attrs.ints("stride") == std::vector<int64_t>{2, 2});
      CHECK(n.outputs == g.outputs);  // consumers of the chain keep their value name
      // The conv weight is untouched; the fold lives in scale and shift.
      CHECK(f.weights.at("c.weight").data.shares_storage(g.weights.at("c.weight").data));
      CHECK(f.weights.count("c.scale") == 1);
      CHECK(f.weights.count("c.shift") == 1);
      CHECK(f.weights.count("bn.running_var") == 0);  // dead weights are removed
      REQUIRE(r.hits.size() == 1);
      CHECK(r.hits[0].rule == c.rule);
      CHECK(r.hits[0].count == 1);
    }
  }
}

TEST_CASE("fusion: the batchnorm fold is computed in float64 and rounded once", "[fusion]") {
  Builder b;
  std::map<std::string, Tensor> w = {{"c.weight", Tensor::from_vector({2, 2, 1, 1}, {1, 0, 0, 1})},
                                     {"c.bias", Tensor::from_vector({2}, {1.0f, -2.0f})},
                                     {"bn.weight", Tensor::from_vector({2}, {3.0f, 0.5f})},
                                     {"bn.bias", Tensor::from_vector({2}, {0.25f, 1.0f})},
                                     {"bn.running_mean", Tensor::from_vector({2}, {2.0f, -1.0f})},
                                     {"bn.running_var", Tensor::from_vector({2}, {3.5f, 1.5f})}};
  b.set_weights(w);
  Val x = b.input("x", {1, 2, 4, 4});
  Val c = b.conv2d(x, "c", ConvOpts(2, 1).bias());
  b.output(b.batchnorm(c, "bn", 0.5));
  Graph f = optimized(b.build());
  const float* scale = f.weights.at("c.scale").data.f32();
  const float* shift = f.weights.at("c.shift").data.f32();
  // scale = gamma / sqrt(var + eps); shift = beta + (bias - mean) * scale
  CHECK(scale[0] == float(3.0 / std::sqrt(4.0)));
  CHECK(scale[1] == float(0.5 / std::sqrt(2.0)));
  CHECK(shift[0] == float(0.25 + (1.0 - 2.0) * 1.5));
  CHECK(shift[1] == float(1.0 + (-2.0 + 1.0) * (0.5 / std::sqrt(2.0))));
}

TEST_CASE("fusion: mul(x, sigmoid(x)) is canonicalized to silu, then fused", "[fusion]") {
  for (bool sigmoid_first : {false, true}) {
    Builder b(5);
    Val x = b.input("x", {1, 3, 8, 8});
    Val c = b.batchnorm(b.conv2d(x, "c", ConvOpts(4, 3).padding(1)), "bn");
    Val s = b.sigmoid(c, "sig");
    b.output(sigmoid_first ? b.mul(s, c, "m") : b.mul(c, s, "m"));
    PassReport r;
    Graph f = optimized(b.build(), &r);
    REQUIRE(f.nodes.size() == 1);
    CHECK(f.nodes[0].op == OpKind::FusedConv2d);
    CHECK(f.nodes[0].attrs.s("activation") == "silu");
    CHECK_THAT(r.summary(), Catch::Contains("canonicalized 1 mul(x,sigmoid(x))->silu") &&
                                Catch::Contains("fused 1 conv2d->batchnorm->silu"));
  }
}

TEST_CASE("fusion: the YOLO-like model fuses all 45 conv -> batchnorm -> silu blocks", "[fusion]") {
  Builder b(11);
  Graph g = yolo::yolo_like(b, 1, 64);
  REQUIRE(count(g, OpKind::Conv2d) == 45);
  PassReport r;
  Graph f = optimized(g, &r);
  CHECK(count(f, OpKind::FusedConv2d) == 45);
  CHECK(count(f, OpKind::Conv2d) == 0);
  CHECK(count(f, OpKind::BatchNorm) == 0);
  CHECK(count(f, OpKind::Silu) == 0);
  // The 6 shortcut adds of the backbone's bottlenecks go into their second conv.
  REQUIRE(count(g, OpKind::Add) == 6);
  CHECK(count(f, OpKind::Add) == 0);
  int with_residual = 0;
  for (const Node& n : f.nodes) with_residual += n.inputs.size() == 5;
  CHECK(with_residual == 6);
  CHECK(count(f, OpKind::Concat) == count(g, OpKind::Concat));
  CHECK(count(f, OpKind::MaxPool2d) == 3);
  CHECK(r.summary() ==
        "fused 45 conv2d->batchnorm->silu, fused 6 fused_conv2d->add, removed 0 dead nodes");
  CHECK(r.refusals.empty());
}

TEST_CASE("fusion: a residual add after the activation goes into the fused conv", "[fusion]") {
  for (bool residual_first : {false, true}) {
    Builder b(4);
    Val x = b.input("x", {2, 6, 7, 5});
    Val y = b.silu(b.batchnorm(b.conv2d(x, "c", ConvOpts(6, 3).padding(1)), "bn"), "act");
    b.output(residual_first ? b.add(x, y, "sum") : b.add(y, x, "sum"));
    PassReport r;
    Graph f = optimized(b.build(), &r);
    REQUIRE(f.nodes.size() == 1);
    const Node& n = f.nodes[0];
    CHECK(n.op == OpKind::FusedConv2d);
    CHECK(n.inputs.size() == 5);
    CHECK(n.inputs[4] == "x");
    CHECK(n.outputs[0] == "sum");
    CHECK(r.summary() ==
          "fused 1 conv2d->batchnorm->silu, fused 1 fused_conv2d->add, removed 0 dead nodes");
  }
}

// -- when not to fuse: each refusal leaves the chain as it was, but for its conv, which runs fused
// alone (rule "conv2d": every conv takes the same kernels), and the numbers unchanged --

namespace {

// `chain`: the nodes after the conv that the elementwise rules then run as one fused_elementwise
// (named after the last of them), empty where none.
void check_untouched(const Graph& g, const std::string& reason, const KernelQuery& q = {},
                     const std::vector<std::string>& chain = {}) {
  Graph f = g;
  PassOptions po;
  po.has_kernel = q;
  PassReport r = optimize(f, po);
  REQUIRE(f.nodes.size() == g.nodes.size() - (chain.empty() ? 0 : chain.size() - 1));
  for (const Node& was : g.nodes) {
    INFO(was.name);
    const auto at = std::find(chain.begin(), chain.end(), was.name);
    const Node* is = f.find_node(was.name);
    if (at != chain.end() && at + 1 != chain.end()) {
      CHECK(is == nullptr);
      continue;
    }
    REQUIRE(is != nullptr);
    if (at != chain.end())
      CHECK(is->op == OpKind::FusedElementwise);
    else
      CHECK((is->op == was.op || (was.op == OpKind::Conv2d && is->op == OpKind::FusedConv2d)));
    CHECK(is->outputs == was.outputs);
  }
  for (const PassReport::Hit& h : r.hits)
    CHECK((h.rule == "conv2d" || (!chain.empty() && h.rule == "elementwise chain")));
  if (!reason.empty()) {
    REQUIRE(!r.refusals.empty());
    CHECK_THAT(r.refusals.front(), Catch::Contains(reason));
  }
  // A batchnorm in a chain is a scale and shift there, rounded otherwise; the rest is exact.
  auto in = random_inputs(g, 9);
  auto want = run_cpu(g, in), got = run_cpu(f, in);
  for (const std::string& out : g.outputs)
    if (chain.empty())
      CHECK(epilog::test::bit_equal(got.at(out), want.at(out)));
    else
      CHECK(max_rel_err(got.at(out), want.at(out)) <= 1e-6);
}

}  // namespace

TEST_CASE("fusion refuses: the conv output has another consumer", "[fusion]") {
  Builder b(2);
  Val x = b.input("x", {1, 3, 6, 6});
  Val c = b.conv2d(x, "c", ConvOpts(3, 1));
  Val y = b.silu(c, "act");
  b.output(b.add(y, c, "sum"));  // c is read twice
  // The conv runs alone; silu and add, what it leaves, as one elementwise kernel.
  check_untouched(b.build(), "'c' has 2 consumers", {}, {"act", "sum"});
}

TEST_CASE("fusion refuses the longer chain but fuses the legal part", "[fusion]") {
  // bn output is read by silu and by an add: conv->bn fuses, the silu stays.
  Builder b(2);
  Val x = b.input("x", {1, 3, 6, 6});
  Val n = b.batchnorm(b.conv2d(x, "c", ConvOpts(3, 3).padding(1)), "bn");
  b.output(b.add(b.silu(n, "act"), n, "sum"));
  PassReport r;
  Graph f = optimized(b.build(), &r);
  CHECK(count(f, OpKind::FusedConv2d) == 1);
  CHECK(f.find_node("c")->attrs.s("activation") == "none");
  // The silu and the add, which reads the conv's output again, as one elementwise kernel.
  CHECK(count(f, OpKind::Silu) == 0);
  REQUIRE(count(f, OpKind::FusedElementwise) == 1);
  CHECK(f.find_node("sum")->attrs.s("program") == "silu, add(x0)");
  CHECK(r.summary() ==
        "fused 1 conv2d->batchnorm, fused 1 elementwise chain, removed 0 dead nodes");
}

TEST_CASE("fusion refuses a residual add that broadcasts, repeats or reads twice", "[fusion]") {
  auto refused = [](const std::function<Val(Builder&, Val, Val)>& tail, const std::string& why) {
    Builder b(6);
    Val x = b.input("x", {1, 4, 5, 5});
    Val y = b.silu(b.conv2d(x, "c", ConvOpts(4, 3).padding(1)), "act");
    b.output(tail(b, x, y));
    PassReport r;
    Graph f = optimized(b.build(), &r);
    CHECK(count(f, OpKind::Add) == 1);
    CHECK(r.summary() == "fused 1 conv2d->silu, removed 0 dead nodes");
    REQUIRE(!r.refusals.empty());
    CHECK_THAT(r.refusals.front(), Catch::Contains(why));
  };
  refused(
      [](Builder& b, Val, Val y) {
        return b.add(y, b.input("bias", {1, 4, 1, 1}), "sum");
      },
      "the add broadcasts [1,4,1,1] onto [1,4,5,5]");
  refused([](Builder& b, Val, Val y) { return b.add(y, y, "sum"); }, "'act' has 2 consumers");
  refused(
      [](Builder& b, Val x, Val y) {
        b.output(y);  // the conv's result is also a graph output
        return b.add(y, x, "sum");
      },
      "is a graph output");
}

TEST_CASE("fusion refuses: the intermediate is a graph output", "[fusion]") {
  Builder b(2);
  Val x = b.input("x", {1, 3, 6, 6});
  Val c = b.conv2d(x, "c", ConvOpts(4, 3));
  Val n = b.batchnorm(c, "bn");
  b.output(b.silu(n, "act"));
  b.output(c);
  // The batchnorm and silu, what the conv leaves, as one elementwise kernel.
  check_untouched(b.build(), "'c' is a graph output", {}, {"bn", "act"});
}

TEST_CASE("fusion refuses: the batchnorm is not in inference form", "[fusion]") {
  // Statistics computed by the graph instead of constants cannot be folded at compile time.
  Builder b(2);
  Val x = b.input("x", {1, 3, 6, 6});
  Val var = b.input("var", {4});
  Val c = b.conv2d(x, "c", ConvOpts(4, 3));
  Val g = b.weight("bn.weight", {4}, OpKind::BatchNorm, "weight");
  Val be = b.weight("bn.bias", {4}, OpKind::BatchNorm, "bias");
  Val m = b.weight("bn.running_mean", {4}, OpKind::BatchNorm, "running_mean");
  Attrs eps;
  eps.set("eps", 1e-3);
  Val n = b.node(OpKind::BatchNorm, {c, g, be, m, b.relu(var, "var_pos")}, eps, "bn").front();
  b.output(n);
  check_untouched(b.build(), "batchnorm 'bn' is not in inference form (running_var is computed");
}

TEST_CASE("fusion refuses: no fused kernel for the dtype", "[fusion]") {
  Graph g = conv_chain("bn silu", false);
  // A backend with float32 kernels only for the unfused ops.
  KernelQuery no_fused = [](OpKind op, DType) {
    return op != OpKind::FusedConv2d && op != OpKind::FusedElementwise;
  };
  check_untouched(g, "no fused_conv2d kernel for f32", no_fused);
  // And the default query refuses a float16 graph.
  Graph h = g;
  for (auto& [name, v] : h.values) v.dtype = DType::F16;
  Graph f = h;
  PassReport r = optimize(f);
  CHECK(r.hits.empty());
  REQUIRE(!r.refusals.empty());
  CHECK_THAT(r.refusals.front(), Catch::Contains("no fused_conv2d kernel for f16"));
  CHECK(count(f, OpKind::FusedConv2d) == 0);
}

TEST_CASE("passes: dead-code elimination removes unused nodes and weights", "[fusion]") {
  Builder b(1);
  Val x = b.input("x", {1, 2, 4, 4});
  b.conv2d(x, "unused", ConvOpts(2, 1));  // nobody reads it
  b.output(b.relu(x, "r"));
  Graph g = b.build();
  CHECK(eliminate_dead_code(g) == 1);
  CHECK(g.nodes.size() == 1);
  CHECK(g.weights.empty());
  CHECK(g.values.count("unused") == 0);
  verify(g);
}

TEST_CASE("passes: stages are reported in order and the graph verified after each", "[fusion]") {
  Graph g = conv_chain("bn silu", false);
  std::vector<std::string> stages;
  PassOptions po;
  po.on_stage = [&](int i, const std::string& name, const Graph& s) {
    CHECK(i == int(stages.size()));
    stages.push_back(name);
    verify(s);
  };
  optimize(g, po);
  CHECK(stages ==
        std::vector<std::string>{"source", "canonicalize", "reparameterize", "fuse", "dce"});
  po.fuse = false;
  stages.clear();
  Graph h = conv_chain("bn silu", false);
  optimize(h, po);
  CHECK(stages == std::vector<std::string>{"source", "canonicalize", "dce"});
  CHECK(count(h, OpKind::FusedConv2d) == 0);
}

// -- one conv path: the forms exporters leave, every activation, per-channel constants --

namespace {

// The epilogue activations but none (no op of its own).
std::vector<Act> activation_ops_under_test() {
  std::vector<Act> acts;
  for (const Act& a : epilog::test::epilogue_acts())
    if (a.kind != Activation::None) acts.push_back(a);
  return acts;
}
const std::vector<Act> kEpilogueActs = activation_ops_under_test();

const Node& only_conv(const Graph& f) {
  REQUIRE(count(f, OpKind::FusedConv2d) == 1);
  for (const Node& n : f.nodes)
    if (n.op == OpKind::FusedConv2d) return n;
  FAIL("no fused conv");
  return f.nodes[0];
}

}  // namespace

TEST_CASE("fusion: every activation op fuses into the conv, with its parameters", "[fusion]") {
  for (const Act& act : kEpilogueActs) {
    for (bool bn : {false, true}) {
      const auto [kind, attrs] = activation_op(act);
      const std::string name = activation_name(act.kind);
      INFO(name << (bn ? " after a batchnorm" : ""));
      Builder b(7);
      Val x = b.input("x", {2, 4, 6, 5});
      Val y = b.conv2d(x, "c", ConvOpts(5, 3).padding(1).bias());
      if (bn) y = b.batchnorm(y, "bn");
      b.output(b.activation(y, act, "act"));
      PassReport r;
      Graph f = optimized(b.build(), &r);
      REQUIRE(f.nodes.size() == 1);
      const Node& n = only_conv(f);
      CHECK(n.attrs.s("activation") == name);
      CHECK(conv_activation(n) == act);
      CHECK(r.summary() == fmt::format("fused 1 conv2d->{}{}, removed 0 dead nodes",
                                       bn ? "batchnorm->" : "", op_name(kind)));
    }
  }
}

TEST_CASE("fusion: a ResNet block as exported (bias, add, relu) is one conv, residual first",
          "[fusion]") {
  // torch.onnx.export folds each batchnorm into its conv's bias: conv -> add(x) -> relu.
  for (const Act& act : kEpilogueActs) {
    INFO(activation_name(act.kind));
    Builder b(8);
    Val x = b.input("x", {2, 6, 7, 5});
    Val c = b.conv2d(x, "c", ConvOpts(6, 3).padding(1).bias());
    b.output(b.activation(b.add(c, x, "sum"), act, "act"));
    PassReport r;
    Graph f = optimized(b.build(), &r);
    REQUIRE(f.nodes.size() == 1);
    const Node& n = only_conv(f);
    CHECK(n.inputs.size() == 5);
    CHECK(n.inputs[4] == "x");
    CHECK(n.attrs.i("residual_first") == 1);
    CHECK(conv_activation(n) == act);
    CHECK(n.outputs[0] == "act");
    CHECK_THAT(r.summary(), Catch::Contains("fused 1 fused_conv2d->add") &&
                                Catch::Contains("fused 1 conv2d,"));
  }
}

TEST_CASE("fusion: a bottleneck whose residual is a downsampling conv fuses both convs",
          "[fusion]") {
  // ResNet-50's first block: relu(conv3(...) + downsample(x)); either conv may take the add.
  Builder b(9);
  Val x = b.input("x", {1, 8, 6, 6});
  Val y = b.relu(b.conv2d(x, "c1", ConvOpts(4, 1).bias()), "r1");
  y = b.conv2d(y, "c3", ConvOpts(16, 3).padding(1).bias());
  Val d = b.conv2d(x, "down", ConvOpts(16, 1).bias());
  b.output(b.relu(b.add(y, d, "sum"), "act"));
  PassReport r;
  Graph f = optimized(b.build(), &r);
  CHECK(count(f, OpKind::FusedConv2d) == 3);
  CHECK(f.nodes.size() == 3);
  int residual = 0;
  for (const Node& n : f.nodes)
    if (n.inputs.size() == 5) {
      ++residual;
      CHECK(n.attrs.s("activation") == "relu");
      CHECK(n.attrs.i("residual_first") == 1);
    }
  CHECK(residual == 1);
}

TEST_CASE("fusion: an activation after a residual that came after an activation stays", "[fusion]") {
  // relu(x + silu(conv)): the conv's epilogue holds one activation; the relu runs alone.
  Builder b(10);
  Val x = b.input("x", {1, 4, 5, 5});
  Val y = b.silu(b.conv2d(x, "c", ConvOpts(4, 3).padding(1)), "act1");
  b.output(b.relu(b.add(y, x, "sum"), "act2"));
  PassReport r;
  Graph f = optimized(b.build(), &r);
  CHECK(count(f, OpKind::Relu) == 1);
  const Node& n = only_conv(f);
  CHECK(n.attrs.i("residual_first") == 0);
  CHECK(n.attrs.s("activation") == "silu");
  REQUIRE(!r.refusals.empty());
  CHECK_THAT(r.refusals.front(), Catch::Contains("'c' already applies silu"));
}

TEST_CASE("fusion: per-channel constant muls and adds fold into the scale and shift", "[fusion]") {
  for (const Shape& s : {Shape{1, 5, 1, 1}, Shape{5, 1, 1}, Shape{1}}) {
    INFO(shape_str(s));
    Builder b(11);
    Val x = b.input("x", {2, 3, 6, 6});
    Val y = b.batchnorm(b.conv2d(x, "c", ConvOpts(5, 3)), "bn");
    y = b.mul(b.weight("gamma", s, OpKind::Mul, "b"), y, "scaled");
    y = b.add(y, b.weight("beta", s, OpKind::Add, "b"), "shifted");
    b.output(b.relu(y, "act"));
    PassReport r;
    Graph f = optimized(b.build(), &r);
    REQUIRE(f.nodes.size() == 1);
    CHECK(only_conv(f).attrs.s("activation") == "relu");
    CHECK_THAT(r.summary(), Catch::Contains("fused 1 fused_conv2d->mul(per channel)") &&
                                Catch::Contains("fused 1 fused_conv2d->add(per channel)"));
  }
}

TEST_CASE("fusion refuses a mul or add that is not one constant per channel", "[fusion]") {
  const auto refused = [](const Shape& s, bool computed, const std::string& why) {
    Builder b(12);
    Val x = b.input("x", {1, 3, 6, 6});
    Val c = b.conv2d(x, "c", ConvOpts(5, 3));
    Val k = computed ? b.input("k", s) : b.weight("k", s, OpKind::Mul, "b");
    b.output(b.mul(c, k, "scaled"));
    PassReport r;
    Graph f = optimized(b.build(), &r);
    CHECK(count(f, OpKind::Mul) == 1);
    bool said = false;
    for (const std::string& refusal : r.refusals) said = said || refusal.find(why) != std::string::npos;
    INFO(fmt::format("{}", fmt::join(r.refusals, "\n")));
    CHECK(said);
  };
  refused({1, 1, 4, 4}, false, "'k' of shape [1,1,4,4] is not one value per channel");
  refused({1, 5, 1, 1}, true, "'k' is computed, not a constant");
}

TEST_CASE("fusion: a conv nothing fuses with still runs as fused_conv2d, its bias the shift",
          "[fusion]") {
  for (bool bias : {false, true}) {
    Builder b(13);
    Val x = b.input("x", {1, 3, 6, 6});
    Val c = b.conv2d(x, "c", ConvOpts(4, 3).bias(bias));
    b.output(b.maxpool2d(c, PoolOpts(2)));
    PassReport r;
    Graph f = optimized(b.build(), &r);
    const Node& n = only_conv(f);
    CHECK(n.attrs.s("activation") == "none");
    CHECK(count(f, OpKind::Conv2d) == 0);
    CHECK(r.summary() == "fused 1 conv2d, removed 0 dead nodes");
  }
}

TEST_CASE("canonicalize: GELU spelled with erf becomes gelu, then fuses into the conv", "[fusion]") {
  const auto build = [](float root2, bool conv) {
    Builder b(14);
    std::map<std::string, Tensor> w = {{"root2", Tensor::from_vector({}, {root2})},
                                       {"one", Tensor::from_vector({}, {1.0f})},
                                       {"half", Tensor::from_vector({}, {0.5f})}};
    b.set_weights(w);
    Val x = b.input("x", {1, 3, 6, 6});
    if (conv) x = b.conv2d(x, "c", ConvOpts(4, 3).padding(1).bias());
    Val e = b.activation(b.div(x, b.weight("root2", {}, OpKind::Div, "b"), "div"),
                         Activation::Erf, "erf");
    Val in = b.mul(x, b.add(e, b.weight("one", {}, OpKind::Add, "b"), "add"), "inner");
    b.output(b.mul(in, b.weight("half", {}, OpKind::Mul, "b"), "gelu"));
    return b.build();
  };
  PassReport r;
  Graph f = optimized(build(float(std::sqrt(2.0)), true), &r);
  INFO(r.summary() << "\n" << fmt::format("{}", fmt::join(r.refusals, "\n")));
  REQUIRE(f.nodes.size() == 1);
  CHECK(conv_activation(f.nodes[0]) == Act(Activation::Gelu));
  CHECK(f.nodes[0].outputs[0] == "gelu");
  CHECK_THAT(r.summary(), Catch::Contains("canonicalized 1 gelu(erf)->gelu") &&
                              Catch::Contains("fused 1 conv2d->gelu"));
  // Another constant is another function: no gelu, and said why; its five ops run as one
  // elementwise kernel.
  Graph g = optimized(build(1.5f, false), &r);
  CHECK(count(g, OpKind::Gelu) == 0);
  CHECK(count(g, OpKind::Erf) == 0);
  REQUIRE(g.nodes.size() == 1);
  CHECK(g.nodes[0].attrs.s("program") == "div(x1), erf, add(x2), mul(x0), mul(x3)");
  REQUIRE(!r.refusals.empty());
  CHECK_THAT(r.refusals.front(), Catch::Contains("'root2' is 1.5, not 1.414"));
}

TEST_CASE("fusion: a linear layer becomes a 1x1 conv, its activation fused, on any rank",
          "[fusion]") {
  for (const Shape& in : {Shape{3, 24}, Shape{2, 5, 7, 24}}) {
    Builder b(15);
    Val x = b.input("x", in);
    Val h = b.relu(b.linear(x, "fc1", 16), "act1");
    b.output(b.linear(h, "fc2", 5, false));
    PassReport r;
    Graph f = optimized(b.build(), &r);
    INFO(r.summary());
    CHECK(count(f, OpKind::Linear) == 0);
    CHECK(count(f, OpKind::Relu) == 0);
    CHECK(count(f, OpKind::FusedConv2d) == 2);
    const Node* fc1 = f.find_node("fc1");
    REQUIRE(fc1);
    CHECK(conv_activation(*fc1) == Act(Activation::Relu));
    CHECK(f.value(fc1->inputs[0]).shape == Shape{shape_numel(in) / 24, 24, 1, 1});
    CHECK(f.value(f.outputs[0]).shape == [&] {
      Shape y = in;
      y.back() = 5;
      return y;
    }());
  }
}

TEST_CASE("fusion refuses a linear layer whose weight is computed", "[fusion]") {
  Builder b(16);
  Val x = b.input("x", {2, 8});
  Val w = b.input("w", {4, 8});
  b.output(b.node(OpKind::Linear, {x, w}, {}, "fc").front());
  check_untouched(b.build(), "the weight of 'fc' is computed, not a constant");
}

TEST_CASE("fusion: an activation after a view runs before it, fused into the conv", "[fusion]") {
  Builder b(17);
  Val x = b.input("x", {2, 3, 4, 4});
  Val c = b.conv2d(x, "c", ConvOpts(6, 3).padding(1).bias());
  b.output(b.silu(b.flatten(b.reshape(c, {2, 6, 16}, "r"), 1, "f"), "act"));
  PassReport r;
  Graph f = optimized(b.build(), &r);
  INFO(r.summary());
  CHECK(count(f, OpKind::Silu) == 0);
  CHECK(conv_activation(only_conv(f)) == Act(Activation::Silu));
  CHECK(f.nodes.back().op == OpKind::Flatten);
  CHECK(f.nodes.back().outputs[0] == "act");
}

TEST_CASE("passes: a conv of a few wide groups becomes a conv a group over split views",
          "[fusion]") {
  // ResNeSt's radix conv (2 groups, batchnorm, relu) with a residual after it, and a conv of 8
  // narrow groups (ResNeXt's) that stays grouped.
  Builder b(21);
  Val x = b.input("x", {2, 64, 6, 6}), skip = b.input("skip", {2, 96, 6, 6});
  Val y = b.relu(b.batchnorm(b.conv2d(x, "radix", ConvOpts(96, 3).padding(1).groups(2)), "bn"),
                 "act");
  y = b.add(y, skip, "res");
  Val z = b.conv2d(y, "narrow", ConvOpts(32, 1).groups(8));
  b.output(z);
  PassReport r;
  const Graph f = optimized(b.build(), &r);
  CHECK(count(f, OpKind::Split) == 2);  // the input and the residual
  CHECK(count(f, OpKind::Concat) == 1);
  CHECK(count(f, OpKind::FusedConv2d) == 3);
  for (const Node& n : f.nodes) {
    if (n.op != OpKind::FusedConv2d) continue;
    INFO(n.name);
    CHECK(n.attrs.i("groups") == (n.name == "narrow" ? 8 : 1));
    if (n.name != "narrow") {
      CHECK(n.attrs.s("activation") == "relu");
      CHECK(n.inputs.size() == 5);  // its part of the residual
      CHECK(f.value(n.inputs[1]).shape == Shape{48, 32, 3, 3});
    }
  }
  CHECK_THAT(r.summary(), Catch::Contains("split 1 fused_conv2d(groups)->fused_conv2d per group"));
  CHECK(r.refusals.empty());  // narrow groups are no candidates

  // 16 groups: more launches than the split takes.
  Builder m(22);
  m.output(m.conv2d(m.input("x", {1, 512, 4, 4}), "many", ConvOpts(512, 3).padding(1).groups(16)));
  PassReport rm;
  const Graph g = optimized(m.build(), &rm);
  CHECK(count(g, OpKind::Split) == 0);
  CHECK(std::any_of(rm.refusals.begin(), rm.refusals.end(), [](const std::string& s) {
    return s.find("16 groups, more than 8 launches") != std::string::npos;
  }));
}

TEST_CASE("passes: a channel shuffle that only groups-1 convs read is read through their weights",
          "[fusion]") {
  // ShuffleNet's cat(x1, branch) -> shuffle, read by a 1x1 and a padded 3x3 conv: the shuffle
  // becomes a concat of its parts and each conv's input channels are permuted to match.
  Builder b(23);
  // 16 channels in 2 groups: a permutation that is not its own inverse.
  Val x1 = b.input("x1", {2, 4, 5, 5});
  Val branch = b.relu(b.conv2d(b.input("x2", {2, 3, 5, 5}), "branch", ConvOpts(12, 1)), "act");
  Val s = b.channel_shuffle({x1, branch}, 2, "shuffle");
  b.output(b.conv2d(s, "pw", ConvOpts(8, 1).bias()));
  b.output(b.silu(b.conv2d(s, "c3", ConvOpts(4, 3).padding(1)), "c3.act"));
  PassReport r;
  const Graph f = optimized(b.build(), &r);
  CHECK(count(f, OpKind::ChannelShuffle) == 0);
  CHECK(count(f, OpKind::Concat) == 1);
  CHECK_THAT(r.summary(), Catch::Contains("read through 1 channel_shuffle by its convs' weights"));

  // One part: the convs read it, no concat.
  Builder one(24);
  Val x = one.input("x", {1, 8, 4, 4});
  one.output(one.conv2d(one.channel_shuffle(x, 2, "shuffle"), "pw", ConvOpts(5, 1)));
  const Graph g = optimized(one.build());
  CHECK(count(g, OpKind::ChannelShuffle) == 0);
  CHECK(count(g, OpKind::Concat) == 0);
  CHECK(only_conv(g).inputs[0] == "x");
}

TEST_CASE("passes: a channel shuffle that another op reads stays a shuffle", "[fusion]") {
  // Read by a depthwise conv (ShuffleNet's stride-2 branch), by a relu, as a residual, or made a
  // graph output: no conv reads it through its weights.
  for (const char* reader : {"depthwise", "relu", "residual", "output"}) {
    INFO(reader);
    Builder b(25);
    Val x = b.input("x", {2, 8, 5, 5});
    Val s = b.channel_shuffle(x, 2, "shuffle");
    b.output(b.conv2d(s, "pw", ConvOpts(8, 1)));
    const std::string other = reader;
    if (other == "depthwise") b.output(b.conv2d(s, "dw", ConvOpts(8, 3).padding(1).groups(8)));
    if (other == "relu") b.output(b.relu(s, "act"));
    if (other == "residual") b.output(b.add(b.conv2d(x, "c", ConvOpts(8, 1)), s, "res"));
    if (other == "output") b.output(s);
    const Graph f = optimized(b.build());
    CHECK(count(f, OpKind::ChannelShuffle) == 1);
  }
}
