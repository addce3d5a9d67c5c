// ONNX forms that fold at import: Constant's value attributes, BatchNormalization in training
// mode on constants (weight standardization), and the math, comparison, logic, Where and Range
// ops on constants, each imported on its own and checked against hand-computed values (the
// run-time forms epilog refuses are in test_onnx_forms.cpp).
#ifdef EPILOG_HAVE_ONNX

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "onnx_model.h"

using namespace epilog;
using namespace epilog::onnx_test;

TEST_CASE("onnx forms: Constant with value_float, value_floats, value_int and value_ints",
          "[onnx]") {
  Model m(20);
  m.input("x", {1, 2});
  set_f(m.node("Constant", {}, {"half"}), "value_float", 0.5f);
  auto& floats =
      attr(m.node("Constant", {}, {"scales"}), "value_floats", onnx::AttributeProto::FLOATS);
  floats.add_floats(2.0f);
  floats.add_floats(4.0f);
  // The shape [2, 1] from a value_int, Unsqueeze and Concat, folded at import.
  set_i(m.node("Constant", {}, {"two"}), "value_int", 2);
  set_ints(m.node("Constant", {}, {"axes"}), "value_ints", {0});
  set_ints(m.node("Constant", {}, {"one"}), "value_ints", {1});
  m.node("Unsqueeze", {"two", "axes"}, {"two_1d"});
  set_i(m.node("Concat", {"two_1d", "one"}, {"shape"}), "axis", 0);
  m.node("Mul", {"x", "half"}, {"a"});
  m.node("Mul", {"a", "scales"}, {"b"});
  m.node("Reshape", {"b", "shape"}, {"y"});
  m.output("y");
  Graph g = m.load();
  CHECK(g.value("y").shape == Shape{2, 1});
  CHECK(values(run1(g, Tensor::from_vector({1, 2}, {1.0f, 3.0f}))) ==
        std::vector<float>{1.0f, 6.0f});
}

TEST_CASE("onnx forms: BatchNormalization in training mode on constants (weight standardization)",
          "[onnx]") {
  // timm's StdConv2d / ScaledStdConv2d (NF-Nets, BiT) as exported: the conv's weight reshaped to
  // [1, K, C * R * S], batch-normalized in training mode with a gain, reshaped back. It folds
  // into the conv's weight: each output channel's weights less their mean, over their (biased)
  // standard deviation, times the gain.
  const auto build = [](bool runtime_x) {
    Model m(17);
    m.input("x", {1, 3, 5, 5});
    if (runtime_x) {
      m.input("flat", {1, 4, 27});
    } else {
      m.random("w", {4, 3, 3, 3}, 9);
      m.ints("to_flat", {1, 4, 27});
      m.node("Reshape", {"w", "to_flat"}, {"flat"}, "flatten");
    }
    m.init("gain", {4}, {1.0f, 0.5f, 2.0f, -1.0f});
    m.init("zero", {4}, {0, 0, 0, 0});
    m.init("one", {4}, {1, 1, 1, 1});
    auto& bn = m.node("BatchNormalization", {"flat", "gain", "zero", "zero", "one"}, {"std"}, "ws");
    set_i(bn, "training_mode", 1);
    set_f(bn, "epsilon", 1e-6f);
    m.ints("to_w", {4, 3, 3, 3});
    m.node("Reshape", {"std", "to_w"}, {"wstd"}, "unflatten");
    m.node("Conv", {"x", "wstd"}, {"y"}, "conv");
    m.output("y");
    return m;
  };
  const Graph g = build(false).load();
  CHECK(count(g, OpKind::BatchNorm) == 0);
  REQUIRE(count(g, OpKind::Conv2d) == 1);
  const Tensor w = Tensor::randn({4, 3, 3, 3}, 9);
  const Tensor& got = g.weights.at(g.nodes[0].inputs[1]).data;
  const float gain[4] = {1.0f, 0.5f, 2.0f, -1.0f};
  for (int64_t k = 0; k < 4; ++k) {
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < 27; ++i) sum += w.f32()[k * 27 + i];
    for (int64_t i = 0; i < 27; ++i) sq += std::pow(w.f32()[k * 27 + i] - sum / 27, 2);
    for (int64_t i = 0; i < 27; ++i) {
      const double want = (w.f32()[k * 27 + i] - sum / 27) / std::sqrt(sq / 27 + 1e-6) * gain[k];
      CHECK(got.f32()[k * 27 + i] == Approx(want).epsilon(1e-6).margin(1e-6));
    }
  }
  // On a run-time input: refused, naming the attribute.
  check_import_error(
      [&] { build(true).load(); },
      {"node 'ws' (BatchNormalization): attribute 'training_mode': is 1 on a run-time input"},
      true);
}

TEST_CASE("onnx forms: Not, CumSum, Sin, Cos, Floor, Ceil, Round, Pow and Trilu fold on constants",
          "[onnx]") {
  // A Fourier feature map built from a shape alone (EdgeNeXt's positional encoding): a cumsum of
  // ones (~zeros), then elementwise math, all constants; added to x. On a run-time tensor the
  // ops epilog lacks are one message.
  Model m(17);
  m.input("x", {1, 2, 3, 4});
  TensorProto& mask = *m.g().add_initializer();
  mask.set_name("mask");
  for (int64_t d : {1, 3, 4}) mask.add_dims(d);
  mask.set_data_type(TensorProto::BOOL);
  for (int i = 0; i < 12; ++i) mask.add_int32_data(0);
  m.node("Not", {"mask"}, {"ones"});
  set_i(m.node("Cast", {"ones"}, {"onesf"}), "to", TensorProto::FLOAT);
  m.ints("last", {2});
  m.ints("rows", {1});
  m.node("CumSum", {"onesf", "last"}, {"v"});  // 1, 2, 3, 4 along the last dim
  auto& back = m.node("CumSum", {"onesf", "rows"}, {"after"});  // 2, 1, 0 down the rows
  set_i(back, "exclusive", 1);
  set_i(back, "reverse", 1);
  m.init("half", {}, {0.5f});
  m.init("two", {}, {2.0f});
  m.node("Mul", {"v", "half"}, {"h"});
  std::vector<std::string> terms = {"after"};
  for (const char* op : {"Sin", "Cos"}) terms.push_back(m.node(op, {"v"}, {op}).output(0));
  for (const char* op : {"Floor", "Ceil", "Round"})
    terms.push_back(m.node(op, {"h"}, {op}).output(0));
  terms.push_back(m.node("Pow", {"v", "two"}, {"sq"}).output(0));
  m.ints("three_i", {3});
  terms.push_back(m.node("Pow", {"v", "three_i"}, {"cube"}).output(0));  // an integer exponent
  std::string acc = "x";
  for (const std::string& t : terms) acc = m.node("Add", {acc, t}, {acc + "+" + t}).output(0);
  m.output(acc);
  const Graph g = m.load();
  const Tensor x = Tensor::randn({1, 2, 3, 4}, 3);
  const Tensor y = run1(g, x, "x", acc);
  for (int64_t i = 0; i < y.numel(); ++i) {
    const double v = double(i % 4 + 1), row = double(i / 4 % 3);
    const double want = x.f32()[i] + (2 - row) + std::sin(v) + std::cos(v) + std::floor(v / 2) +
                        std::ceil(v / 2) + std::nearbyint(v / 2) + v * v + v * v * v;
    CHECK(y.f32()[i] == Approx(want).epsilon(1e-6));
  }
  // Pow of integers in shape arithmetic: [2] ^ [3] = 8 channels.
  Model shape(17);
  shape.input("x", {1, 2, 4, 3});
  shape.ints("two", {2});
  shape.ints("three", {3});
  shape.ints("one", {1});
  shape.node("Pow", {"two", "three"}, {"eight"});
  auto& cat = shape.node("Concat", {"one", "eight", "three"}, {"dims"});
  set_i(cat, "axis", 0);
  shape.node("Reshape", {"x", "dims"}, {"y"});
  shape.output("y");
  CHECK(shape.load().value("y").shape == Shape{1, 8, 3});
  for (const char* op : {"Sin", "CumSum", "Floor"}) {
    Model r(17);
    r.input("x", {1, 4});
    r.ints("axis", {1});
    auto& n = r.node(op, {"x"}, {"y"}, "pos");
    if (std::string(op) == "CumSum") n.add_input("axis");
    r.output("y");
    check_import_error([&] { r.load(); },
                       {fmt::format("node 'pos' ({})", op), "'x' is computed at run time",
                        fmt::format("evaluates {} on constants only", op)},
                       true);
  }
  // Trilu of constant ones (a causal mask as attention builds it): upper from diagonal 1, lower
  // from 0, summed onto x [2, 3, 4].
  Model tri(17);
  tri.input("x", {2, 3, 4});
  tri.init("ones", {3, 4}, std::vector<float>(12, 1.0f));
  tri.int_scalar("k1", 1);
  tri.node("Trilu", {"ones", "k1"}, {"up"});
  set_i(tri.node("Trilu", {"ones"}, {"low"}), "upper", 0);
  tri.node("Add", {"x", "up"}, {"xu"});
  tri.node("Add", {"xu", "low"}, {"y"});
  tri.output("y");
  const Tensor xt = Tensor::randn({2, 3, 4}, 7);
  const Tensor yt = run1(tri.load(), xt);
  for (int64_t e = 0; e < 24; ++e) {
    const int64_t i = e / 4 % 3, j = e % 4;
    CHECK(yt.f32()[e] == xt.f32()[e] + float(j - i >= 1) + float(j - i <= 0));
  }
  // An integer CumSum that overflows is one message, not a wrapped constant.
  Model big(17);
  big.input("x", {1, 2});
  big.ints("huge", {std::numeric_limits<int64_t>::max(), 1});
  big.int_scalar("axis", 0);
  big.node("CumSum", {"huge", "axis"}, {"sums"}, "cumsum");
  big.node("Reshape", {"x", "sums"}, {"y"});
  big.output("y");
  check_import_error([&] { big.load(); }, {"node 'cumsum' (CumSum)", "integer overflow"});
}

TEST_CASE("onnx forms: comparisons, logic, Where and Range fold on constants", "[onnx]") {
  // Shape arithmetic as some exports write it: x [2,3,4] reshaped to dims picked by Where from
  // masks that Range, the comparisons and the logic ops make: [2, 12, 1].
  Model m(17);
  m.input("x", {2, 3, 4});
  m.ints("zero", {0});
  m.ints("one", {1});
  m.ints("two", {2});
  m.ints("three", {3});
  m.ints("yes", {2, -5, 1});
  m.ints("no", {-7, 12, -9});
  m.int_scalar("s0", 0);  // Range takes scalars
  m.int_scalar("s1", 1);
  m.int_scalar("s3", 3);
  m.node("Range", {"s0", "s3", "s1"}, {"r"});                  // 0, 1, 2
  m.node("Less", {"r", "two"}, {"lt"});                        // T T F
  m.node("GreaterOrEqual", {"r", "one"}, {"ge"});              // F T T
  m.node("And", {"lt", "ge"}, {"both"});                       // F T F
  m.node("Or", {"lt", "ge"}, {"either"});                      // T T T
  m.node("Xor", {"both", "either"}, {"pick"});                 // T F T
  m.node("Equal", {"r", "one"}, {"eq"});                       // F T F
  m.node("LessOrEqual", {"r", "zero"}, {"le"});                // T F F
  m.node("Greater", {"r", "one"}, {"gt"});                     // F F T
  m.node("Or", {"eq", "le"}, {"eq_le"});                       // T T F
  m.node("Xor", {"eq_le", "gt"}, {"all"});                     // T T T
  m.node("Where", {"pick", "yes", "no"}, {"dims0"});           // 2 12 1
  m.node("Where", {"all", "dims0", "three"}, {"dims"});        // the same
  m.node("Reshape", {"x", "dims"}, {"y"});
  m.output("y");
  const Graph g = m.load();
  CHECK(g.value("y").shape == Shape{2, 12, 1});
  // An integer Range counted exactly: 2^62 to 2^62 + 3 is 3 values (not 0, as in doubles),
  // the size of x's first dim here.
  Model rg(17);
  rg.input("x", {3, 4});
  rg.int_scalar("from", int64_t(1) << 62);
  rg.int_scalar("to", (int64_t(1) << 62) + 3);
  rg.int_scalar("by", 1);
  rg.node("Range", {"from", "to", "by"}, {"seq"});
  rg.node("Shape", {"seq"}, {"n"});
  rg.ints("rest", {-1});
  set_i(rg.node("Concat", {"n", "rest"}, {"dims"}), "axis", 0);
  rg.node("Reshape", {"x", "dims"}, {"y"});
  rg.output("y");
  CHECK(rg.load().value("y").shape == Shape{3, 4});
  // A float Range: 0, 0.25, 0.5, 0.75 added to x [1, 4].
  Model f(17);
  f.input("x", {1, 4});
  f.init("start", {}, {0.0f});
  f.init("limit", {}, {1.0f});
  f.init("delta", {}, {0.25f});
  f.node("Range", {"start", "limit", "delta"}, {"r"});
  f.node("Add", {"x", "r"}, {"y"});
  f.output("y");
  const Tensor x = Tensor::randn({1, 4}, 2);
  const Tensor y = run1(f.load(), x);
  for (int64_t i = 0; i < 4; ++i) CHECK(y.f32()[i] == x.f32()[i] + 0.25f * float(i));
  // Mod: Python's remainder for integers by default (-7 mod 4 = 1), C's with fmod 1 (7 mod -4 =
  // 3, 5.5 mod 2 = 1.5): x [2, 6] -> [1, 12] and [3, 4]; y = x + 1.5.
  Model md(17);
  md.input("x", {2, 6});
  md.ints("minus7", {-7});
  md.ints("four", {4});
  md.ints("seven", {7});
  md.ints("minus4", {-4});
  md.ints("twelve", {12});
  md.init("f55", {}, {5.5f});
  md.init("f2", {}, {2.0f});
  md.node("Mod", {"minus7", "four"}, {"one"});
  set_i(md.node("Concat", {"one", "twelve"}, {"flat"}), "axis", 0);
  md.node("Reshape", {"x", "flat"}, {"r"});
  set_i(md.node("Mod", {"seven", "minus4"}, {"three"}), "fmod", 1);
  md.ints("rest", {-1});
  set_i(md.node("Concat", {"three", "rest"}, {"dims3"}), "axis", 0);
  md.node("Reshape", {"x", "dims3"}, {"z"});
  md.output("z");
  set_i(md.node("Mod", {"f55", "f2"}, {"onehalf"}), "fmod", 1);
  md.node("Add", {"r", "onehalf"}, {"y"});
  md.output("y");
  const Graph gm = md.load();
  CHECK(gm.value("y").shape == Shape{1, 12});
  CHECK(gm.value("z").shape == Shape{3, 4});
  const Tensor xm = Tensor::randn({2, 6}, 4);
  const Tensor ym = run1(gm, xm);
  for (int64_t i = 0; i < 12; ++i) CHECK(ym.f32()[i] == xm.f32()[i] + 1.5f);
  // On a run-time input: one message.
  Model r(17);
  r.input("x", {1, 4});
  r.init("half", {}, {0.5f});
  r.node("Less", {"x", "half"}, {"y"}, "lt");
  r.output("y");
  check_import_error([&] { r.load(); },
                     {"node 'lt' (Less)", "'x' is computed at run time",
                      "evaluates Less on constants only"},
                     true);
}

#endif  // EPILOG_HAVE_ONNX
