// The C++ graph builder: node lists, names and shapes, seeded weights, set_weights(), the
// errors each call reports, chunk(), and the YOLO-like model against its PyTorch twin.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <set>

#include "epilog/io/builder.h"
#include "epilog/io/init.h"
#include "error_matcher.h"
#include "yolo_like.h"

using epilog::Builder;
using epilog::ConvOpts;
using epilog::Graph;
using epilog::OpKind;
using epilog::PoolOpts;
using epilog::Shape;
using epilog::Tensor;
using epilog::Val;

namespace {

std::vector<float> values(const Tensor& t) {
  const float* p = t.f32();
  return std::vector<float>(p, p + t.numel());
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// conv -> batchnorm -> silu named like a PyTorch Conv module "b0".
Graph conv_bn_silu(uint64_t seed, const Shape& x = {1, 3, 64, 64}) {
  Builder b(seed);
  Val in = b.input("images", x);
  Val y = b.conv2d(in, "b0.conv", ConvOpts(16, 3).stride(2).padding(1));
  y = b.batchnorm(y, "b0.bn");
  b.output(b.silu(y, "b0.act"));
  return b.build();
}

const std::vector<std::string> kBnParams = {"weight", "bias", "running_mean", "running_var"};

}  // namespace

TEST_CASE("builder: conv -> batchnorm -> silu gives the expected nodes, names and shapes",
          "[builder]") {
  Graph g = conv_bn_silu(1);
  REQUIRE(g.inputs == std::vector<std::string>{"images"});
  REQUIRE(g.outputs == std::vector<std::string>{"b0.act"});
  REQUIRE(g.nodes.size() == 3);

  const auto& conv = g.nodes[0];
  REQUIRE(conv.name == "b0.conv");
  REQUIRE(conv.op == OpKind::Conv2d);
  REQUIRE(conv.inputs == std::vector<std::string>{"images", "b0.conv.weight"});
  REQUIRE(conv.outputs == std::vector<std::string>{"b0.conv"});
  REQUIRE(conv.attrs.ints("stride") == std::vector<int64_t>{2, 2});
  REQUIRE(conv.attrs.ints("padding") == std::vector<int64_t>{1, 1, 1, 1});
  REQUIRE(conv.attrs.ints("dilation") == std::vector<int64_t>{1, 1});
  REQUIRE(conv.attrs.i("groups") == 1);

  const auto& bn = g.nodes[1];
  REQUIRE(bn.name == "b0.bn");
  REQUIRE(bn.op == OpKind::BatchNorm);
  REQUIRE(bn.inputs == std::vector<std::string>{"b0.conv", "b0.bn.weight", "b0.bn.bias",
                                                "b0.bn.running_mean", "b0.bn.running_var"});
  REQUIRE(bn.outputs == std::vector<std::string>{"b0.bn"});
  REQUIRE(bn.attrs.f("eps") == 1e-5);

  const auto& act = g.nodes[2];
  REQUIRE(act.name == "b0.act");
  REQUIRE(act.op == OpKind::Silu);
  REQUIRE(act.inputs == std::vector<std::string>{"b0.bn"});
  REQUIRE(act.outputs == std::vector<std::string>{"b0.act"});

  std::set<std::string> weights;
  for (const auto& [name, w] : g.weights) weights.insert(name);
  REQUIRE(weights == std::set<std::string>{"b0.conv.weight", "b0.bn.weight", "b0.bn.bias",
                                           "b0.bn.running_mean", "b0.bn.running_var"});
  REQUIRE(g.weights.at("b0.conv.weight").data.shape() == Shape{16, 3, 3, 3});
  REQUIRE(g.value("b0.conv.weight").shape == Shape{16, 3, 3, 3});
  for (const std::string& p : kBnParams) {
    CAPTURE(p);
    REQUIRE(g.weights.at("b0.bn." + p).data.shape() == Shape{16});
    REQUIRE(g.value("b0.bn." + p).shape == Shape{16});
    REQUIRE(g.weights.at("b0.bn." + p).seed == uint64_t{1});
  }
  REQUIRE(g.value("images").shape == Shape{1, 3, 64, 64});
  REQUIRE(g.value("b0.conv").shape == Shape{1, 16, 32, 32});
  REQUIRE(g.value("b0.bn").shape == Shape{1, 16, 32, 32});
  REQUIRE(g.value("b0.act").shape == Shape{1, 16, 32, 32});
  REQUIRE(g.values.size() == 4 + 5);
  REQUIRE_NOTHROW(epilog::verify(g));
}

TEST_CASE("builder: conv options reach the node", "[builder]") {
  Builder b(3);
  Val x = b.input("x", {2, 8, 17, 19});
  Val y = b.conv2d(
      x, "c",
      ConvOpts(4, 3).kernel(3, 5).stride(2, 1).padding(1, 2, 0, 3).dilation(2).groups(2).bias());
  b.output(y);
  Graph g = b.build();
  const auto& n = *g.find_node("c");
  REQUIRE(n.inputs == std::vector<std::string>{"x", "c.weight", "c.bias"});
  REQUIRE(g.value("c.weight").shape == Shape{4, 4, 3, 5});
  REQUIRE(g.value("c.bias").shape == Shape{4});
  REQUIRE(n.attrs.ints("stride") == std::vector<int64_t>{2, 1});
  REQUIRE(n.attrs.ints("padding") == std::vector<int64_t>{1, 2, 0, 3});
  REQUIRE(n.attrs.ints("dilation") == std::vector<int64_t>{2, 2});
  REQUIRE(n.attrs.i("groups") == 2);
  // H: (17 + 1 + 0 - 5) / 2 + 1 = 7; W: (19 + 2 + 3 - 9) / 1 + 1 = 16.
  REQUIRE(g.value("c").shape == Shape{2, 4, 7, 16});
  // Conv bias is small and not all zero.
  auto bias = values(g.weights.at("c.bias").data);
  REQUIRE(std::any_of(bias.begin(), bias.end(), [](float v) { return v != 0.0f; }));
  for (float v : bias) REQUIRE(std::abs(v) <= 0.1f);

  // The batchnorm eps given is kept.
  Builder b2;
  Val z = b2.batchnorm(b2.input("x", {1, 4, 2, 2}), "bn", 1e-3);
  b2.output(z);
  REQUIRE(b2.build().find_node("bn")->attrs.f("eps") == 1e-3);
}

TEST_CASE("builder: seeded weights are deterministic", "[builder]") {
  Graph a = conv_bn_silu(7), b = conv_bn_silu(7), c = conv_bn_silu(8);
  REQUIRE(a.weights.size() == 5);
  for (const auto& [name, w] : a.weights) {
    CAPTURE(name);
    REQUIRE(w.seed == uint64_t{7});
    REQUIRE(same_bytes(w.data, b.weights.at(name).data));
    REQUIRE_FALSE(same_bytes(w.data, c.weights.at(name).data));
  }
  // Same seed, same shape, different name: different numbers.
  Builder two(7);
  Val x = two.input("x", {1, 8, 4, 4});
  Val y = two.conv2d(two.conv2d(x, "p", ConvOpts(8, 3).padding(1)), "q", ConvOpts(8, 3));
  two.output(y);
  Graph g = two.build();
  REQUIRE_FALSE(same_bytes(g.weights.at("p.weight").data, g.weights.at("q.weight").data));
  // The numbers depend on the name and seed only, not on what else the graph holds.
  REQUIRE(same_bytes(g.weights.at("p.weight").data,
                     epilog::init_weight("p.weight", {8, 8, 3, 3}, OpKind::Conv2d, "weight", 7)));
}

TEST_CASE("builder: seeded weights have useful statistics", "[builder]") {
  Graph g = conv_bn_silu(1, {1, 64, 8, 8});
  auto w = values(g.weights.at("b0.conv.weight").data);
  // He-uniform: |w| <= sqrt(6 / fan_in), fan_in = 64 * 3 * 3, and spread over the range.
  float bound = std::sqrt(6.0f / (64 * 3 * 3));
  float max_abs = 0;
  for (float v : w) max_abs = std::max(max_abs, std::abs(v));
  REQUIRE(max_abs <= bound);
  REQUIRE(max_abs > 0.9f * bound);

  auto gamma = values(g.weights.at("b0.bn.weight").data);
  auto beta = values(g.weights.at("b0.bn.bias").data);
  auto mean = values(g.weights.at("b0.bn.running_mean").data);
  auto var = values(g.weights.at("b0.bn.running_var").data);
  auto all = [](const std::vector<float>& v, float x) {
    return std::all_of(v.begin(), v.end(), [&](float e) { return e == x; });
  };
  REQUIRE_FALSE(all(mean, 0.0f));
  REQUIRE_FALSE(all(beta, 0.0f));
  REQUIRE_FALSE(all(var, 1.0f));
  REQUIRE_FALSE(all(gamma, 1.0f));
  for (float v : var) REQUIRE(v > 0.0f);
  for (float v : gamma) REQUIRE(v > 0.0f);
  // Different channels get different values.
  REQUIRE(std::set<float>(var.begin(), var.end()).size() > 8);
  REQUIRE(std::set<float>(mean.begin(), mean.end()).size() > 8);
}

TEST_CASE("builder: set_weights data is used and checked", "[builder]") {
  std::vector<float> w(16 * 3 * 3 * 3);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(i);
  std::vector<float> var(16, 2.5f);

  SECTION("given data is used, the rest is seeded") {
    Builder b(1);
    b.set_weights({{"b0.conv.weight", Tensor::from_vector({16, 3, 3, 3}, w)},
                   {"b0.bn.running_var", Tensor::from_vector({16}, var)}});
    Val y =
        b.batchnorm(b.conv2d(b.input("images", {1, 3, 8, 8}), "b0.conv", ConvOpts(16, 3)), "b0.bn");
    b.output(y);
    Graph g = b.build();
    REQUIRE(values(g.weights.at("b0.conv.weight").data) == w);
    REQUIRE_FALSE(g.weights.at("b0.conv.weight").seed.has_value());
    REQUIRE(values(g.weights.at("b0.bn.running_var").data) == var);
    REQUIRE_FALSE(g.weights.at("b0.bn.running_var").seed.has_value());
    Graph seeded = conv_bn_silu(1, {1, 3, 8, 8});
    REQUIRE(g.weights.at("b0.bn.running_mean").seed == uint64_t{1});
    REQUIRE(same_bytes(g.weights.at("b0.bn.running_mean").data,
                       seeded.weights.at("b0.bn.running_mean").data));
  }
  SECTION("data of the wrong shape throws naming the weight") {
    Builder b(1);
    b.set_weights({{"b0.conv.weight", Tensor::from_vector({16, 3, 1, 9}, w)}});
    Val x = b.input("images", {1, 3, 8, 8});
    REQUIRE_ERROR(b.conv2d(x, "b0.conv", ConvOpts(16, 3)), "[conv2d]", "'b0.conv.weight'",
                  "data has shape [16,3,1,9], expected [16,3,3,3]");
  }
  SECTION("batchnorm data of the wrong shape") {
    Builder b(1);
    b.set_weights({{"bn.running_mean", Tensor::zeros({8})}});
    Val x = b.input("x", {1, 16, 4, 4});
    REQUIRE_ERROR(b.batchnorm(x, "bn"), "[batchnorm]", "'bn.running_mean'",
                  "data has shape [8], expected [16]");
  }
  SECTION("data given after its weight was made throws instead of being ignored") {
    Builder b(1);
    b.conv2d(b.input("images", {1, 3, 8, 8}), "b0.conv", ConvOpts(16, 3));
    REQUIRE_ERROR(b.set_weights({{"b0.conv.weight", Tensor::from_vector({16, 3, 3, 3}, w)}}),
                  "'b0.conv.weight'", "call set_weights before the ops that use it");
  }
  SECTION("data that no op uses throws at build()") {
    Builder b(1);
    b.set_weights({{"b0.conv.wieght", Tensor::from_vector({16, 3, 3, 3}, w)}});
    Val y = b.conv2d(b.input("images", {1, 3, 8, 8}), "b0.conv", ConvOpts(16, 3));
    b.output(y);
    REQUIRE_ERROR(b.build(), "'b0.conv.wieght'", "no op uses");
  }
}

TEST_CASE("builder: shape errors are thrown at the call, naming node and shapes", "[builder]") {
  Builder b(1);
  Val x = b.input("x", {1, 4, 8, 8});
  Val x3 = b.input("x3", {1, 3, 8, 8});
  Val flat = b.input("flat", {4, 8});
  Val v = b.input("v", {4, 8, 8});
  Val row = b.input("row", {256});

  REQUIRE_ERROR(b.conv2d(v, "c1", ConvOpts(8, 3)), "[conv2d]", "node 'c1'", "[4,8,8]",
                "expected 4 dims");
  REQUIRE_ERROR(b.conv2d(x, "c2", ConvOpts(8, 3).groups(3)), "[conv2d]", "node 'c2'", "groups=3",
                "4 input channels");
  REQUIRE_ERROR(b.conv2d(x, "c3", ConvOpts(6, 3).groups(4)), "[conv2d]", "node 'c3'", "groups=4",
                "output channels 6");
  REQUIRE_ERROR(b.conv2d(x, "c4", ConvOpts(8, 9)), "[conv2d]", "node 'c4'", "kernel 9x9",
                "[1,4,8,8]");
  REQUIRE_ERROR(b.conv2d(x, "c5", ConvOpts(8, 3).stride(0)), "[conv2d]", "node 'c5'",
                "stride must be >= 1, got 0");
  REQUIRE_ERROR(b.batchnorm(b.input("r1", {4}), "bn1"), "[batchnorm]", "node 'bn1'", "[4]",
                "at least 2 dims");
  REQUIRE_ERROR(b.batchnorm(Val{"nope"}, "bn2"), "no value named 'nope'");
  REQUIRE_ERROR(b.add(x, x3, "a1"), "[add]", "node 'a1'", "[1,4,8,8] and [1,3,8,8]",
                "do not broadcast");
  REQUIRE_ERROR(b.mul(x, flat, "m1"), "[mul]", "node 'm1'", "[1,4,8,8] and [4,8]");
  REQUIRE_ERROR(b.concat({x, flat}, 1, "cat1"), "[concat]", "node 'cat1'", "[4,8]");
  REQUIRE_ERROR(b.concat({x, x3}, 0, "cat2"), "[concat]", "node 'cat2'", "[1,3,8,8]",
                "does not match [1,4,8,8]");
  REQUIRE_ERROR(b.split(x, 1, {3, 3}, "sp1"), "[split]", "node 'sp1'", "sizes add up to 6",
                "[1,4,8,8]");
  REQUIRE_ERROR(b.maxpool2d(x, PoolOpts(9), "mp1"), "[maxpool2d]", "node 'mp1'", "[1,4,8,8]");
  REQUIRE_ERROR(b.avgpool2d(x, PoolOpts(3).padding(3), "ap1"), "[avgpool2d]", "node 'ap1'",
                "padding 3");
  REQUIRE_ERROR(b.upsample_nearest(v, 2, "up1"), "[upsample_nearest]", "node 'up1'", "[4,8,8]");
  REQUIRE_ERROR(b.flatten(x, 5, "fl1"), "[flatten]", "node 'fl1'", "axis 5");
  REQUIRE_ERROR(b.linear(row, "fc1", 10), "[linear]", "node 'fc1'",
                "[256]", "expected at least 2 dims");
  REQUIRE_ERROR(b.global_avgpool(flat, "gap1"), "[global_avgpool]", "node 'gap1'", "[4,8]");

  // None of the failed calls left a node or a weight behind, and a retry under the same
  // name works.
  Val ok = b.silu(b.conv2d(x, "c4", ConvOpts(8, 3)), "s");
  b.output(ok);
  Graph g = b.build();
  REQUIRE(g.nodes.size() == 2);
  REQUIRE(g.nodes[1].name == "s");
  REQUIRE(g.weights.size() == 1);
  REQUIRE(g.weights.count("c4.weight") == 1);
}

TEST_CASE("builder: naming errors", "[builder]") {
  Builder b(1);
  Val x = b.input("x", {1, 4, 8, 8});
  REQUIRE_ERROR(b.input("x", {1}), "input 'x' is already defined");
  REQUIRE_ERROR(b.input("bad", {1, 0, 3}), "input 'bad'", "[1,0,3]");
  REQUIRE_ERROR(b.silu(Val{"nope"}, "s0"), "[silu] node 's0'", "input 'nope' is not defined");
  b.silu(x, "s1");
  REQUIRE_ERROR(b.relu(x, "s1"), "[relu] node 's1'", "already used");
  REQUIRE_ERROR(b.relu(x, "x"), "[relu] node 'x'", "'x' is already used");
  b.conv2d(x, "c", ConvOpts(4, 1));
  REQUIRE_ERROR(b.conv2d(x, "c", ConvOpts(4, 1)), "'c.weight' is already defined");
  REQUIRE_ERROR(b.output(Val{"nope"}), "no value named 'nope'");
  b.output(x);
  REQUIRE_ERROR(b.output(x), "'x' is already an output");

  Builder empty;
  empty.input("x", {1});
  REQUIRE_ERROR(empty.build(), "no outputs");

  // A split whose second output name is taken fails without leaving its first output behind.
  Builder s;
  Val in = s.input("in", {1, 4, 2, 2});
  s.input("sp.1", {1});
  REQUIRE_ERROR(s.split(in, 1, {2, 2}, "sp"), "[split] node 'sp'",
                "output name 'sp.1' is already used");
  s.output(in);
  Graph g;
  REQUIRE_NOTHROW(g = s.build());
  REQUIRE(g.values.count("sp.0") == 0);
  REQUIRE(g.nodes.empty());
}

TEST_CASE("builder: generated names are unique", "[builder]") {
  Builder b;
  Val x = b.input("x", {1, 2, 4, 4});
  Val explicit_name = b.silu(x, "silu_1");
  Val s0 = b.silu(x);
  Val s1 = b.silu(s0);
  Val s2 = b.silu(s1);
  Val r0 = b.relu(x);
  Val a0 = b.add(s2, r0);
  Val a1 = b.add(a0, explicit_name);
  std::vector<Val> parts = b.split(a1, 1, {1, 1});
  std::vector<Val> parts2 = b.chunk(a1, 2, 1);
  Val cat = b.concat({parts[0], parts2[1]}, 1);
  b.output(cat);
  Graph g = b.build();

  REQUIRE(s0.name == "silu_0");
  REQUIRE(s1.name == "silu_2");  // silu_1 was taken
  REQUIRE(s2.name == "silu_3");
  REQUIRE(r0.name == "relu_0");
  REQUIRE(a0.name == "add_0");
  REQUIRE(a1.name == "add_1");
  REQUIRE(parts[0].name == "split_0.0");
  REQUIRE(parts[1].name == "split_0.1");
  REQUIRE(parts2[1].name == "split_1.1");
  REQUIRE(cat.name == "concat_0");
  std::set<std::string> names, outputs;
  for (const auto& n : g.nodes) {
    names.insert(n.name);
    for (const auto& o : n.outputs) outputs.insert(o);
  }
  REQUIRE(names.size() == g.nodes.size());
  REQUIRE(names.size() == 10);
  REQUIRE(outputs.size() == 12);

  // Two builders generate the same names.
  Builder c;
  Val y = c.input("x", {1, 2, 4, 4});
  REQUIRE(c.silu(y).name == "silu_0");
}

TEST_CASE("builder: chunk sizes follow torch.chunk", "[builder]") {
  Builder b;
  Val x = b.input("x", {1, 64, 8, 7});
  auto sizes = [&](const std::vector<Val>& parts, int axis) {
    std::vector<int64_t> s;
    for (const Val& p : parts) s.push_back(b.shape(p)[axis]);
    return s;
  };
  auto even = b.chunk(x, 2, 1, "even");
  REQUIRE(sizes(even, 1) == std::vector<int64_t>{32, 32});
  REQUIRE(even[0].name == "even.0");
  REQUIRE(even[1].name == "even.1");
  REQUIRE(b.shape(even[1]) == Shape{1, 32, 8, 7});
  // torch.chunk(7, 2) -> 4, 3
  REQUIRE(sizes(b.chunk(x, 2, 3, "odd"), 3) == std::vector<int64_t>{4, 3});
  // torch.chunk(7, 4) -> 2, 2, 2, 1
  REQUIRE(sizes(b.chunk(x, 4, -1, "four"), 3) == std::vector<int64_t>{2, 2, 2, 1});
  // torch.chunk(8, 3) -> 3, 3, 2
  REQUIRE(sizes(b.chunk(x, 3, 2, "three"), 2) == std::vector<int64_t>{3, 3, 2});
  // torch.chunk may return fewer parts than asked: (6, 4) -> 2, 2, 2.
  Val six = b.input("six", {6});
  REQUIRE(sizes(b.chunk(six, 4, 0, "fewer"), 0) == std::vector<int64_t>{2, 2, 2});
  // One chunk, and as many chunks as elements.
  REQUIRE(sizes(b.chunk(six, 1, 0, "one"), 0) == std::vector<int64_t>{6});
  REQUIRE(sizes(b.chunk(six, 6, 0, "all"), 0) == std::vector<int64_t>(6, 1));
  REQUIRE(sizes(b.chunk(six, 9, 0, "more"), 0) == std::vector<int64_t>(6, 1));

  REQUIRE_ERROR(b.chunk(x, 0, 1, "zero"), "[split] node 'zero'", "into 0");
  REQUIRE_ERROR(b.chunk(x, 2, 4, "axis"), "[split] node 'axis'", "axis 4");
  REQUIRE_ERROR(b.chunk(x, 2, -5, "neg"), "[split] node 'neg'", "axis -5");
}

TEST_CASE("builder: every op through the builder", "[builder]") {
  Builder b(5);
  Val x = b.input("x", {2, 3, 16, 16});
  Val c = b.relu(b.conv2d(x, "stem", ConvOpts(8, 3).padding(1).bias()), "stem.act");
  Val m = b.maxpool2d(c, PoolOpts(2), "pool");  // stride defaults to the kernel
  REQUIRE(b.shape(m) == Shape{2, 8, 8, 8});
  Val a = b.avgpool2d(m, PoolOpts(3).stride(2).padding(1).ceil_mode().count_include_pad(), "avg");
  // ceil((8 + 2 - 3) / 2) + 1 = 5; the last window starts at 8 < 8 + 1, so 5 stays.
  REQUIRE(b.shape(a) == Shape{2, 8, 5, 5});
  Val u = b.upsample_nearest(a, 2, "up");
  REQUIRE(b.shape(u) == Shape{2, 8, 10, 10});
  Val gate = b.sigmoid(b.global_avgpool(u, "gap"), "gate");
  REQUIRE(b.shape(gate) == Shape{2, 8, 1, 1});
  Val scaled = b.mul(u, gate, "scale");
  REQUIRE(b.shape(scaled) == Shape{2, 8, 10, 10});
  Val f = b.flatten(b.global_avgpool(scaled, "gap2"), 1, "flat");
  REQUIRE(b.shape(f) == Shape{2, 8});
  Val logits = b.linear(f, "fc", 10);
  Val nobias = b.linear(f, "fc2", 10, false);
  REQUIRE(b.shape(logits) == Shape{2, 10});
  b.output(b.add(logits, nobias, "sum"));
  b.output(m);
  Graph g = b.build();

  REQUIRE(g.find_node("fc")->inputs == std::vector<std::string>{"flat", "fc.weight", "fc.bias"});
  REQUIRE(g.find_node("fc2")->inputs == std::vector<std::string>{"flat", "fc2.weight"});
  REQUIRE(g.value("fc.weight").shape == Shape{10, 8});
  REQUIRE(g.find_node("pool")->attrs.ints("stride") == std::vector<int64_t>{2, 2});
  const auto& avg = g.find_node("avg")->attrs;
  REQUIRE(avg.ints("kernel") == std::vector<int64_t>{3, 3});
  REQUIRE(avg.ints("stride") == std::vector<int64_t>{2, 2});
  REQUIRE(avg.ints("padding") == std::vector<int64_t>{1, 1, 1, 1});
  REQUIRE(avg.i("ceil_mode") == 1);
  REQUIRE(avg.i("count_include_pad") == 1);
  REQUIRE(g.find_node("up")->attrs.ints("scale") == std::vector<int64_t>{2, 2});
  REQUIRE(g.outputs == std::vector<std::string>{"sum", "pool"});
  auto counts = g.op_counts();
  REQUIRE(counts[OpKind::GlobalAvgPool] == 2);
  REQUIRE(counts[OpKind::Linear] == 2);
  REQUIRE(g.nodes.size() == 13);
  // build() hands over the graph and leaves the builder empty.
  REQUIRE_ERROR(b.build(), "no outputs");
}

// -- the YOLO-like model --

namespace {

// Conv module prefixes of YoloLike in bench/torch_yolo_like.py, in registration order.
const std::vector<std::string> kYoloConvs = {
    "b0",          "b1",          "b2.cv1",      "b2.cv2",      "b2.m.0.cv1",  "b2.m.0.cv2",
    "b3",          "b4.cv1",      "b4.cv2",      "b4.m.0.cv1",  "b4.m.0.cv2",  "b4.m.1.cv1",
    "b4.m.1.cv2",  "b5",          "b6.cv1",      "b6.cv2",      "b6.m.0.cv1",  "b6.m.0.cv2",
    "b6.m.1.cv1",  "b6.m.1.cv2",  "b7",          "b8.cv1",      "b8.cv2",      "b8.m.0.cv1",
    "b8.m.0.cv2",  "b9.cv1",      "b9.cv2",      "n12.cv1",     "n12.cv2",     "n12.m.0.cv1",
    "n12.m.0.cv2", "n15.cv1",     "n15.cv2",     "n15.m.0.cv1", "n15.m.0.cv2", "n16",
    "n18.cv1",     "n18.cv2",     "n18.m.0.cv1", "n18.m.0.cv2", "n19",         "n21.cv1",
    "n21.cv2",     "n21.m.0.cv1", "n21.m.0.cv2"};

}  // namespace

TEST_CASE("builder: yolo_like matches the PyTorch model", "[builder]") {
  Builder b(1);
  Graph g = yolo::yolo_like(b);
  auto counts = g.op_counts();
  REQUIRE(counts[OpKind::Conv2d] == 45);
  REQUIRE(counts[OpKind::BatchNorm] == 45);
  REQUIRE(counts[OpKind::Silu] == 45);
  REQUIRE(counts[OpKind::MaxPool2d] == 3);
  REQUIRE(counts[OpKind::UpsampleNearest] == 2);
  REQUIRE(counts[OpKind::Split] == 8);    // one chunk per C2f
  REQUIRE(counts[OpKind::Concat] == 13);  // 8 C2f, SPPF, 4 in the neck
  REQUIRE(counts[OpKind::Add] == 6);      // shortcut bottlenecks of b2, b4, b6, b8
  REQUIRE(g.nodes.size() == 167);

  REQUIRE(g.inputs == std::vector<std::string>{"images"});
  REQUIRE(g.value("images").shape == Shape{1, 3, 640, 640});
  REQUIRE(g.outputs.size() == 3);
  REQUIRE(g.value(g.outputs[0]).shape == Shape{1, 64, 80, 80});
  REQUIRE(g.value(g.outputs[1]).shape == Shape{1, 128, 40, 40});
  REQUIRE(g.value(g.outputs[2]).shape == Shape{1, 256, 20, 20});
  REQUIRE(g.outputs == std::vector<std::string>{"n15.cv2.act", "n18.cv2.act", "n21.cv2.act"});

  // Weight names are the state_dict keys (num_batches_tracked aside).
  std::set<std::string> expected;
  for (const std::string& p : kYoloConvs) {
    expected.insert(p + ".conv.weight");
    for (const std::string& bn : kBnParams) expected.insert(p + ".bn." + bn);
  }
  std::set<std::string> names;
  for (const auto& [name, w] : g.weights) names.insert(name);
  REQUIRE(names.size() == 225);
  REQUIRE(names == expected);
  for (const char* key : {"b2.m.0.cv1.conv.weight", "b9.cv2.bn.running_var", "n21.cv2.conv.weight",
                          "b0.conv.weight", "b4.m.1.cv2.bn.bias"})
    REQUIRE(g.is_weight(key));
  REQUIRE(g.value("b0.conv.weight").shape == Shape{16, 3, 3, 3});
  REQUIRE(g.value("b2.m.0.cv1.conv.weight").shape == Shape{16, 16, 3, 3});
  REQUIRE(g.value("b9.cv2.conv.weight").shape == Shape{256, 512, 1, 1});
  REQUIRE(g.value("b9.cv2.bn.running_var").shape == Shape{256});
  REQUIRE(g.value("n12.cv1.conv.weight").shape == Shape{128, 384, 1, 1});
  REQUIRE(g.value("n21.cv2.conv.weight").shape == Shape{256, 384, 1, 1});
  REQUIRE(g.value("b4.cv2.conv.weight").shape == Shape{64, 128, 1, 1});

  // sum(p.numel() for p in m.parameters()) of the PyTorch model: conv weights plus batchnorm
  // weight and bias, computed from the module definitions: 2,250,672 + 2 * 4,432 = 2,259,536.
  int64_t params = 0, stats = 0;
  for (const auto& [name, w] : g.weights) {
    bool running = name.find("running_") != std::string::npos;
    (running ? stats : params) += w.data.numel();
  }
  REQUIRE(params == 2259536);
  REQUIRE(stats == 2 * 4432);

  // Every batchnorm uses PyTorch's Conv eps, every conv pads k / 2 without bias.
  for (const auto& n : g.nodes) {
    if (n.op == OpKind::BatchNorm) REQUIRE(n.attrs.f("eps") == 1e-3);
    if (n.op == OpKind::Conv2d) {
      REQUIRE(n.inputs.size() == 2);
      int64_t k = g.value(n.inputs[1]).shape[2];
      REQUIRE(n.attrs.ints("padding") == std::vector<int64_t>(4, k / 2));
    }
  }
  const auto& sppf = g.find_node("b9.m")->attrs;
  REQUIRE(sppf.ints("kernel") == std::vector<int64_t>{5, 5});
  REQUIRE(sppf.ints("stride") == std::vector<int64_t>{1, 1});
  REQUIRE(sppf.ints("padding") == std::vector<int64_t>{2, 2, 2, 2});
}

TEST_CASE("builder: yolo_like at another size and batch", "[builder]") {
  Builder b(2);
  Graph g = yolo::yolo_like(b, 2, 320);
  REQUIRE(g.value(g.outputs[0]).shape == Shape{2, 64, 40, 40});
  REQUIRE(g.value(g.outputs[1]).shape == Shape{2, 128, 20, 20});
  REQUIRE(g.value(g.outputs[2]).shape == Shape{2, 256, 10, 10});
  // The seed changes the numbers, not the structure.
  Builder b1(1);
  Graph g1 = yolo::yolo_like(b1, 2, 320);
  REQUIRE(g1.nodes == g.nodes);
  REQUIRE_FALSE(
      same_bytes(g1.weights.at("b0.conv.weight").data, g.weights.at("b0.conv.weight").data));
}
