// The op table: names, arity, attribute normalization and shape inference for every op of
// ops.def, with worked numbers, and the errors each op reports.
#include <catch2/catch.hpp>

#include <set>

#include "epilog/graph/op.h"
#include "error_matcher.h"

using epilog::Attrs;
using epilog::AttrValue;
using epilog::OpKind;
using epilog::Shape;

namespace {

// Attributes by chained calls: A().ints("stride", {2, 2}).i("groups", 2).
struct A {
  Attrs attrs;
  A& i(const std::string& name, int64_t v) { return attrs.set(name, AttrValue{v}), *this; }
  A& f(const std::string& name, double v) { return attrs.set(name, AttrValue{v}), *this; }
  A& ints(const std::string& name, std::vector<int64_t> v) {
    return attrs.set(name, AttrValue{std::move(v)}), *this;
  }
  A& s(const std::string& name, std::string v) {
    return attrs.set(name, AttrValue{std::move(v)}), *this;
  }
  operator const Attrs&() const { return attrs; }
};

// Normalizes `given` and infers the output shapes of a node named `node`.
std::vector<Shape> infer(OpKind op, const Attrs& given, const std::vector<Shape>& inputs,
                         const std::string& node = "c1") {
  return epilog::infer_shapes(op, node, epilog::normalize_attrs(op, node, given), inputs);
}

// The single output shape of a node.
Shape infer1(OpKind op, const Attrs& given, const std::vector<Shape>& inputs) {
  std::vector<Shape> outs = infer(op, given, inputs);
  REQUIRE(outs.size() == 1);
  return outs[0];
}

Attrs norm(OpKind op, const Attrs& given) {
  return epilog::normalize_attrs(op, "c1", given);
}

}  // namespace

// -- the table --

TEST_CASE("ops: parse_op and op_name round trip for every op", "[ops]") {
  std::set<std::string> names;
  for (int k = 0; k < epilog::kNumOps; ++k) {
    OpKind kind = static_cast<OpKind>(k);
    std::string name = epilog::op_name(kind);
    CAPTURE(k, name);
    REQUIRE(!name.empty());
    REQUIRE(names.insert(name).second);
    REQUIRE(epilog::parse_op(name) == kind);
    REQUIRE(epilog::op_info(kind).kind == kind);
    REQUIRE(epilog::op_info(kind).infer != nullptr);
  }
  REQUIRE(names.size() == size_t(epilog::kNumOps));
  REQUIRE(std::string(epilog::op_name(OpKind::FusedConv2d)) == "fused_conv2d");
  REQUIRE(std::string(epilog::op_name(OpKind::UpsampleNearest)) == "upsample_nearest");
  REQUIRE_FALSE(epilog::parse_op("Conv2d").has_value());
  REQUIRE_FALSE(epilog::parse_op("conv").has_value());
  REQUIRE_FALSE(epilog::parse_op("").has_value());
}

TEST_CASE("ops: input specs give arity and input names", "[ops]") {
  const auto& conv = epilog::op_info(OpKind::Conv2d);
  REQUIRE(conv.min_inputs == 2);
  REQUIRE(conv.max_inputs == 3);
  REQUIRE(conv.inputs == std::vector<std::string>{"x", "weight", "bias"});
  REQUIRE(conv.input_name(2) == "bias");

  const auto& fused = epilog::op_info(OpKind::FusedConv2d);
  REQUIRE(fused.min_inputs == 4);
  REQUIRE(fused.max_inputs == 5);
  REQUIRE(fused.input_name(4) == "residual");

  const auto& bn = epilog::op_info(OpKind::BatchNorm);
  REQUIRE(bn.min_inputs == 5);
  REQUIRE(bn.max_inputs == 5);
  REQUIRE(bn.input_name(4) == "running_var");

  const auto& cat = epilog::op_info(OpKind::Concat);
  REQUIRE(cat.min_inputs == 1);
  REQUIRE(cat.max_inputs == -1);
  REQUIRE(cat.input_name(0) == "x");
  REQUIRE(cat.input_name(7) == "x");

  const auto& lin = epilog::op_info(OpKind::Linear);
  REQUIRE(lin.min_inputs == 2);
  REQUIRE(lin.max_inputs == 3);

  for (OpKind k :
       {OpKind::Silu, OpKind::Relu, OpKind::Sigmoid, OpKind::Split, OpKind::MaxPool2d,
        OpKind::AvgPool2d, OpKind::GlobalAvgPool, OpKind::UpsampleNearest, OpKind::Flatten}) {
    CAPTURE(epilog::op_name(k));
    REQUIRE(epilog::op_info(k).min_inputs == 1);
    REQUIRE(epilog::op_info(k).max_inputs == 1);
  }
  for (OpKind k : {OpKind::Add, OpKind::Mul}) {
    REQUIRE(epilog::op_info(k).min_inputs == 2);
    REQUIRE(epilog::op_info(k).max_inputs == 2);
  }
}

// -- attribute normalization --

TEST_CASE("ops: normalize_attrs fills in every default", "[ops]") {
  Attrs conv = norm(OpKind::Conv2d, {});
  REQUIRE(conv.all().size() == 4);
  REQUIRE(conv.ints("stride") == std::vector<int64_t>{1, 1});
  REQUIRE(conv.ints("padding") == std::vector<int64_t>{0, 0, 0, 0});
  REQUIRE(conv.ints("dilation") == std::vector<int64_t>{1, 1});
  REQUIRE(conv.i("groups") == 1);

  Attrs fused = norm(OpKind::FusedConv2d, {});
  REQUIRE(fused.all().size() == 8);
  REQUIRE(fused.s("activation") == "none");

  REQUIRE(norm(OpKind::BatchNorm, {}).f("eps") == Approx(1e-5));
  REQUIRE(norm(OpKind::Flatten, {}).i("axis") == 1);

  Attrs avg = norm(OpKind::AvgPool2d, A().ints("kernel", {3, 3}));
  REQUIRE(avg.all().size() == 5);
  REQUIRE(avg.ints("stride") == std::vector<int64_t>{1, 1});
  REQUIRE(avg.ints("padding") == std::vector<int64_t>{0, 0, 0, 0});
  REQUIRE(avg.i("ceil_mode") == 0);
  REQUIRE(avg.i("count_include_pad") == 0);
  Attrs max = norm(OpKind::MaxPool2d, A().ints("kernel", {3, 3}));
  REQUIRE(max.all().size() == 4);
  REQUIRE_FALSE(max.has("count_include_pad"));

  for (OpKind k : {OpKind::Silu, OpKind::Relu, OpKind::Sigmoid, OpKind::Add, OpKind::Mul,
                   OpKind::GlobalAvgPool, OpKind::Linear})
    REQUIRE(norm(k, {}).all().empty());

  // Given values are kept, and normalizing twice changes nothing.
  Attrs given = norm(OpKind::Conv2d, A().ints("stride", {2, 3}).i("groups", 4));
  REQUIRE(given.ints("stride") == std::vector<int64_t>{2, 3});
  REQUIRE(given.i("groups") == 4);
  REQUIRE(norm(OpKind::Conv2d, given) == given);
}

TEST_CASE("ops: scalars broadcast to fixed-length lists and ints widen to floats", "[ops]") {
  Attrs conv = norm(OpKind::Conv2d, A().i("stride", 2).i("padding", 1).i("dilation", 3));
  REQUIRE(conv.ints("stride") == std::vector<int64_t>{2, 2});
  REQUIRE(conv.ints("padding") == std::vector<int64_t>{1, 1, 1, 1});
  REQUIRE(conv.ints("dilation") == std::vector<int64_t>{3, 3});

  REQUIRE(norm(OpKind::UpsampleNearest, A().i("scale", 2)).ints("scale") ==
          std::vector<int64_t>{2, 2});
  REQUIRE(norm(OpKind::MaxPool2d, A().i("kernel", 5)).ints("kernel") == std::vector<int64_t>{5, 5});
  // A list of any length: a scalar becomes a list of one.
  REQUIRE(norm(OpKind::Split, A().i("axis", 1).i("sizes", 7)).ints("sizes") ==
          std::vector<int64_t>{7});

  Attrs bn = norm(OpKind::BatchNorm, A().i("eps", 0));
  REQUIRE(std::holds_alternative<double>(bn.all().at("eps")));
  REQUIRE(bn.f("eps") == 0.0);

  // And the broadcast scalar is what shape inference uses.
  REQUIRE(infer1(OpKind::Conv2d, A().i("stride", 2).i("padding", 1),
                 {{1, 3, 640, 640}, {16, 3, 3, 3}}) == Shape{1, 16, 320, 320});
}

TEST_CASE("ops: attribute errors name op, node and attribute", "[ops]") {
  SECTION("unknown attribute") {
    REQUIRE_ERROR(norm(OpKind::Conv2d, A().i("strides", 2)), "[conv2d]", "node 'c1'",
                  "unknown attribute 'strides'", "known: stride, padding, dilation, groups");
    REQUIRE_ERROR(norm(OpKind::Silu, A().i("alpha", 1)), "[silu]", "node 'c1'",
                  "unknown attribute 'alpha'", "known: none");
  }
  SECTION("missing required attribute") {
    REQUIRE_ERROR(norm(OpKind::Concat, {}), "[concat]", "node 'c1'",
                  "missing required attribute 'axis'");
    REQUIRE_ERROR(norm(OpKind::Split, A().i("axis", 0)), "[split]", "node 'c1'",
                  "missing required attribute 'sizes'");
    REQUIRE_ERROR(norm(OpKind::MaxPool2d, {}), "[maxpool2d]", "node 'c1'",
                  "missing required attribute 'kernel'");
    REQUIRE_ERROR(norm(OpKind::AvgPool2d, A().i("stride", 2)), "[avgpool2d]",
                  "missing required attribute 'kernel'");
    REQUIRE_ERROR(norm(OpKind::UpsampleNearest, {}), "[upsample_nearest]", "node 'c1'",
                  "missing required attribute 'scale'");
  }
  SECTION("wrong attribute type") {
    REQUIRE_ERROR(norm(OpKind::Conv2d, A().f("groups", 2.0)), "[conv2d]", "node 'c1'",
                  "attribute 'groups' must be int");
    REQUIRE_ERROR(norm(OpKind::Conv2d, A().s("stride", "2")), "[conv2d]", "node 'c1'",
                  "attribute 'stride' must be int list");
    REQUIRE_ERROR(norm(OpKind::Conv2d, A().f("padding", 1.0)), "[conv2d]",
                  "attribute 'padding' must be int list");
    REQUIRE_ERROR(norm(OpKind::BatchNorm, A().s("eps", "1e-5")), "[batchnorm]", "node 'c1'",
                  "attribute 'eps' must be float");
    REQUIRE_ERROR(norm(OpKind::FusedConv2d, A().i("activation", 1)), "[fused_conv2d]", "node 'c1'",
                  "attribute 'activation' must be string");
    REQUIRE_ERROR(norm(OpKind::Concat, A().ints("axis", {1})), "[concat]",
                  "attribute 'axis' must be int");
  }
  SECTION("wrong list length") {
    REQUIRE_ERROR(norm(OpKind::Conv2d, A().ints("padding", {1, 1})), "[conv2d]", "node 'c1'",
                  "attribute 'padding' must have 4 values, got 2");
    REQUIRE_ERROR(norm(OpKind::Conv2d, A().ints("stride", {1, 1, 1})), "[conv2d]",
                  "attribute 'stride' must have 2 values, got 3");
    REQUIRE_ERROR(norm(OpKind::MaxPool2d, A().ints("kernel", {3})), "[maxpool2d]",
                  "attribute 'kernel' must have 2 values, got 1");
    REQUIRE_ERROR(norm(OpKind::UpsampleNearest, A().ints("scale", {2, 2, 2})), "[upsample_nearest]",
                  "attribute 'scale' must have 2 values, got 3");
  }
  SECTION("bad choice") {
    for (const char* act : {"none", "silu", "relu", "sigmoid"})
      REQUIRE(norm(OpKind::FusedConv2d, A().s("activation", act)).s("activation") == act);
    REQUIRE_ERROR(norm(OpKind::FusedConv2d, A().s("activation", "swish")), "[fused_conv2d]",
                  "node 'c1'", "attribute 'activation' is 'swish'",
                  "expected one of: none, silu, relu, sigmoid, clip");
    REQUIRE_ERROR(norm(OpKind::FusedConv2d, A().s("activation", "SiLU")), "[fused_conv2d]",
                  "'SiLU'");
  }
}

// -- shape inference, op by op --

TEST_CASE("ops: conv2d output shapes", "[ops]") {
  // (640 + 1 + 1 - 3) / 2 + 1 = 320
  REQUIRE(infer1(OpKind::Conv2d, A().ints("stride", {2, 2}).ints("padding", {1, 1, 1, 1}),
                 {{1, 3, 640, 640}, {16, 3, 3, 3}}) == Shape{1, 16, 320, 320});
  // Rectangular kernel, no padding: 10 - 3 + 1 = 8, 12 - 5 + 1 = 8.
  REQUIRE(infer1(OpKind::Conv2d, {}, {{2, 8, 10, 12}, {4, 8, 3, 5}}) == Shape{2, 4, 8, 8});
  // Stride per axis: (9 - 3) / 2 + 1 = 4, (9 - 3) / 3 + 1 = 3.
  REQUIRE(infer1(OpKind::Conv2d, A().ints("stride", {2, 3}), {{1, 1, 9, 9}, {1, 1, 3, 3}}) ==
          Shape{1, 1, 4, 3});
  // 1x1 kernel with a stride larger than the input: one output.
  REQUIRE(infer1(OpKind::Conv2d, A().i("stride", 4), {{1, 3, 3, 3}, {8, 3, 1, 1}}) ==
          Shape{1, 8, 1, 1});
  // A kernel exactly as large as the input.
  REQUIRE(infer1(OpKind::Conv2d, {}, {{1, 3, 5, 5}, {8, 3, 5, 5}}) == Shape{1, 8, 1, 1});
}

TEST_CASE("ops: conv2d asymmetric padding is top, left, bottom, right", "[ops]") {
  // H: 10 + top 1 + bottom 3 - 3 + 1 = 12; W: 20 + left 2 + right 4 - 3 + 1 = 24.
  // (Reading it as top, bottom, left, right would give H = 11, W = 25.)
  REQUIRE(infer1(OpKind::Conv2d, A().ints("padding", {1, 2, 3, 4}),
                 {{1, 1, 10, 20}, {1, 1, 3, 3}}) == Shape{1, 1, 12, 24});
  // With stride 2: (11 / 2) + 1 = 6, (23 / 2) + 1 = 12.
  REQUIRE(infer1(OpKind::Conv2d, A().ints("padding", {1, 2, 3, 4}).i("stride", 2),
                 {{1, 1, 10, 20}, {1, 1, 3, 3}}) == Shape{1, 1, 6, 12});
  // Padding only on one side.
  REQUIRE(infer1(OpKind::Conv2d, A().ints("padding", {0, 0, 2, 0}), {{1, 1, 4, 4}, {1, 1, 3, 3}}) ==
          Shape{1, 1, 4, 2});
}

TEST_CASE("ops: conv2d dilation", "[ops]") {
  // Dilation 2 makes a 3x3 kernel span 5: 32 - 5 + 1 = 28; padding 2 keeps 32.
  REQUIRE(infer1(OpKind::Conv2d, A().i("dilation", 2), {{1, 4, 32, 32}, {8, 4, 3, 3}}) ==
          Shape{1, 8, 28, 28});
  REQUIRE(infer1(OpKind::Conv2d, A().i("dilation", 2).i("padding", 2),
                 {{1, 4, 32, 32}, {8, 4, 3, 3}}) == Shape{1, 8, 32, 32});
  // Per-axis dilation (2, 3): spans 5 and 7 -> 28 and 26.
  REQUIRE(infer1(OpKind::Conv2d, A().ints("dilation", {2, 3}), {{1, 4, 32, 32}, {8, 4, 3, 3}}) ==
          Shape{1, 8, 28, 26});
  // Dilation with stride: (32 - 5) / 2 + 1 = 14.
  REQUIRE(infer1(OpKind::Conv2d, A().i("dilation", 2).i("stride", 2),
                 {{1, 4, 32, 32}, {8, 4, 3, 3}}) == Shape{1, 8, 14, 14});
}

TEST_CASE("ops: conv2d groups, depthwise and bias", "[ops]") {
  // 8 input channels in 4 groups of 2.
  REQUIRE(infer1(OpKind::Conv2d, A().i("groups", 4), {{1, 8, 16, 16}, {4, 2, 3, 3}}) ==
          Shape{1, 4, 14, 14});
  // Depthwise: one filter per channel, and with a channel multiplier of 2.
  REQUIRE(infer1(OpKind::Conv2d, A().i("groups", 32).i("padding", 1),
                 {{1, 32, 16, 16}, {32, 1, 3, 3}}) == Shape{1, 32, 16, 16});
  REQUIRE(infer1(OpKind::Conv2d, A().i("groups", 32).i("padding", 1).i("stride", 2),
                 {{2, 32, 16, 16}, {64, 1, 3, 3}}) == Shape{2, 64, 8, 8});
  // Bias: one per output channel.
  REQUIRE(infer1(OpKind::Conv2d, {}, {{1, 3, 8, 8}, {16, 3, 3, 3}, {16}}) == Shape{1, 16, 6, 6});
  REQUIRE(infer1(OpKind::Conv2d, A().i("groups", 2), {{1, 4, 8, 8}, {6, 2, 1, 1}, {6}}) ==
          Shape{1, 6, 8, 8});
}

TEST_CASE("ops: conv2d errors", "[ops]") {
  const Attrs none;
  SECTION("arity") {
    REQUIRE_ERROR(infer(OpKind::Conv2d, none, {{1, 3, 8, 8}}), "[conv2d]", "node 'c1'",
                  "has 1 inputs, expected 2 to 3 (x, weight, bias)");
    REQUIRE_ERROR(infer(OpKind::Conv2d, none, {{1, 3, 8, 8}, {4, 3, 3, 3}, {4}, {4}}), "[conv2d]",
                  "node 'c1'", "has 4 inputs, expected 2 to 3");
    REQUIRE_ERROR(infer(OpKind::Conv2d, none, {}), "[conv2d]", "has 0 inputs");
  }
  SECTION("rank") {
    REQUIRE_ERROR(infer(OpKind::Conv2d, none, {{3, 8, 8}, {4, 3, 3, 3}}), "[conv2d]", "node 'c1'",
                  "input 'x' has shape [3,8,8] (3 dims), expected 4 dims");
    REQUIRE_ERROR(infer(OpKind::Conv2d, none, {{1, 3, 8, 8}, {4, 27}}), "[conv2d]", "node 'c1'",
                  "input 'weight' has shape [4,27] (2 dims), expected 4 dims");
  }
  SECTION("channel mismatch") {
    REQUIRE_ERROR(infer(OpKind::Conv2d, none, {{1, 3, 8, 8}, {16, 4, 3, 3}}), "[conv2d]",
                  "node 'c1'", "input has 3 channels but weight [16,4,3,3] expects 4 (groups=1)");
    REQUIRE_ERROR(infer(OpKind::Conv2d, A().i("groups", 2), {{1, 8, 8, 8}, {4, 8, 3, 3}}),
                  "[conv2d]", "input has 8 channels", "expects 16 (groups=2)");
  }
  SECTION("groups") {
    REQUIRE_ERROR(infer(OpKind::Conv2d, A().i("groups", 4), {{1, 6, 8, 8}, {8, 1, 3, 3}}),
                  "[conv2d]", "node 'c1'", "groups=4 does not divide input channels 6");
    REQUIRE_ERROR(infer(OpKind::Conv2d, A().i("groups", 4), {{1, 8, 8, 8}, {6, 2, 3, 3}}),
                  "[conv2d]", "node 'c1'", "groups=4", "output channels 6");
    REQUIRE_ERROR(infer(OpKind::Conv2d, A().i("groups", 0), {{1, 8, 8, 8}, {8, 8, 3, 3}}),
                  "[conv2d]", "node 'c1'", "groups must be >= 1, got 0");
  }
  SECTION("bias shape") {
    REQUIRE_ERROR(infer(OpKind::Conv2d, none, {{1, 3, 8, 8}, {16, 3, 3, 3}, {8}}), "[conv2d]",
                  "node 'c1'", "input 'bias' has shape [8], expected [16]");
    REQUIRE_ERROR(infer(OpKind::Conv2d, none, {{1, 3, 8, 8}, {16, 3, 3, 3}, {16, 1}}), "[conv2d]",
                  "input 'bias' has shape [16,1]");
  }
  SECTION("kernel larger than the padded input") {
    REQUIRE_ERROR(infer(OpKind::Conv2d, A().i("padding", 1), {{1, 3, 4, 4}, {8, 3, 7, 7}}),
                  "[conv2d]", "node 'c1'", "kernel 7x7", "does not fit input [1,3,4,4]");
    // Only the width is too small: 5 + 0 - 6 < 0.
    REQUIRE_ERROR(infer(OpKind::Conv2d, none, {{1, 3, 9, 5}, {8, 3, 3, 6}}), "[conv2d]",
                  "does not fit");
    // Dilation makes a 3x3 kernel span 7 > 6.
    REQUIRE_ERROR(infer(OpKind::Conv2d, A().i("dilation", 3), {{1, 3, 6, 6}, {8, 3, 3, 3}}),
                  "[conv2d]", "node 'c1'", "(dilation 3x3) does not fit");
  }
  SECTION("stride, dilation and padding ranges") {
    REQUIRE_ERROR(infer(OpKind::Conv2d, A().i("stride", 0), {{1, 3, 8, 8}, {4, 3, 3, 3}}),
                  "[conv2d]", "node 'c1'", "stride must be >= 1, got 0");
    REQUIRE_ERROR(infer(OpKind::Conv2d, A().ints("stride", {1, -2}), {{1, 3, 8, 8}, {4, 3, 3, 3}}),
                  "[conv2d]", "node 'c1'", "stride must be >= 1, got -2");
    REQUIRE_ERROR(infer(OpKind::Conv2d, A().i("dilation", 0), {{1, 3, 8, 8}, {4, 3, 3, 3}}),
                  "[conv2d]", "dilation must be >= 1, got 0");
    REQUIRE_ERROR(
        infer(OpKind::Conv2d, A().ints("padding", {0, 0, -1, 0}), {{1, 3, 8, 8}, {4, 3, 3, 3}}),
        "[conv2d]", "node 'c1'", "padding must be >= 0, got -1");
  }
  SECTION("dims must be positive") {
    REQUIRE_ERROR(infer(OpKind::Conv2d, none, {{1, 0, 8, 8}, {4, 0, 3, 3}}), "[conv2d]",
                  "node 'c1'", "input 'x' has shape [1,0,8,8]", "every dim must be >= 1");
  }
}

TEST_CASE("ops: fused_conv2d shapes, scale/shift and activation", "[ops]") {
  for (const char* act : {"none", "silu", "relu", "sigmoid"}) {
    CAPTURE(act);
    REQUIRE(infer1(OpKind::FusedConv2d, A().i("stride", 2).i("padding", 1).s("activation", act),
                   {{1, 16, 40, 40}, {32, 16, 3, 3}, {32}, {32}}) == Shape{1, 32, 20, 20});
  }
  // Same geometry rules as conv2d: groups and asymmetric padding.
  REQUIRE(infer1(OpKind::FusedConv2d, A().i("groups", 8).ints("padding", {1, 0, 1, 0}),
                 {{1, 8, 6, 6}, {8, 1, 3, 3}, {8}, {8}}) == Shape{1, 8, 6, 4});
  REQUIRE_ERROR(infer(OpKind::FusedConv2d, {}, {{1, 16, 8, 8}, {32, 16, 3, 3}, {16}, {32}}),
                "[fused_conv2d]", "node 'c1'", "input 'scale' has shape [16], expected [32]");
  REQUIRE_ERROR(infer(OpKind::FusedConv2d, {}, {{1, 16, 8, 8}, {32, 16, 3, 3}, {32}, {1, 32}}),
                "[fused_conv2d]", "node 'c1'", "input 'shift' has shape [1,32], expected [32]");
  REQUIRE_ERROR(infer(OpKind::FusedConv2d, {}, {{1, 16, 8, 8}, {32, 16, 3, 3}, {32}}),
                "[fused_conv2d]", "node 'c1'",
                "has 3 inputs, expected 4 to 5 (x, weight, scale, shift, residual)");
  // The residual has the output's shape.
  REQUIRE(infer1(OpKind::FusedConv2d, A().i("padding", 1),
                 {{2, 16, 8, 8}, {32, 16, 3, 3}, {32}, {32}, {2, 32, 8, 8}}) == Shape{2, 32, 8, 8});
  REQUIRE_ERROR(infer(OpKind::FusedConv2d, A().i("padding", 1),
                      {{2, 16, 8, 8}, {32, 16, 3, 3}, {32}, {32}, {1, 32, 8, 8}}),
                "[fused_conv2d]", "node 'c1'",
                "input 'residual' has shape [1,32,8,8], expected the output's [2,32,8,8]");
  REQUIRE_ERROR(infer(OpKind::FusedConv2d, A().s("activation", "swish"),
                      {{1, 16, 8, 8}, {32, 16, 3, 3}, {32}, {32}}),
                "[fused_conv2d]", "node 'c1'", "'swish'");
}

TEST_CASE("ops: batchnorm", "[ops]") {
  Shape c8{8};
  REQUIRE(infer1(OpKind::BatchNorm, {}, {{2, 8, 5, 7}, c8, c8, c8, c8}) == Shape{2, 8, 5, 7});
  REQUIRE(infer1(OpKind::BatchNorm, {}, {{4, 8}, c8, c8, c8, c8}) == Shape{4, 8});
  REQUIRE(infer1(OpKind::BatchNorm, A().f("eps", 0.0), {{1, 8, 3}, c8, c8, c8, c8}) ==
          Shape{1, 8, 3});
  REQUIRE_ERROR(infer(OpKind::BatchNorm, {}, {{2, 8, 5, 5}, c8, c8, c8, {4}}), "[batchnorm]",
                "node 'c1'", "input 'running_var' has shape [4], expected [8]");
  REQUIRE_ERROR(infer(OpKind::BatchNorm, {}, {{2, 8, 5, 5}, {8, 1}, c8, c8, c8}), "[batchnorm]",
                "input 'weight' has shape [8,1], expected [8]");
  REQUIRE_ERROR(infer(OpKind::BatchNorm, {}, {{8}, c8, c8, c8, c8}), "[batchnorm]", "node 'c1'",
                "input 'x' has shape [8], expected at least 2 dims");
  REQUIRE_ERROR(infer(OpKind::BatchNorm, {}, {{2, 8, 5, 5}, c8, c8, c8}), "[batchnorm]",
                "node 'c1'",
                "has 4 inputs, expected 5 (x, weight, bias, running_mean, running_var)");
  REQUIRE_ERROR(infer(OpKind::BatchNorm, A().f("eps", -1e-3), {{2, 8, 5, 5}, c8, c8, c8, c8}),
                "[batchnorm]", "node 'c1'", "eps must be >= 0");
}

TEST_CASE("ops: silu, relu and sigmoid keep the shape", "[ops]") {
  for (OpKind k : {OpKind::Silu, OpKind::Relu, OpKind::Sigmoid}) {
    std::string name = epilog::op_name(k);
    CAPTURE(name);
    REQUIRE(infer1(k, {}, {{2, 3, 4, 5}}) == Shape{2, 3, 4, 5});
    REQUIRE(infer1(k, {}, {{7}}) == Shape{7});
    REQUIRE(infer1(k, {}, {{1, 16, 320, 320}}) == Shape{1, 16, 320, 320});
    REQUIRE_ERROR(infer(k, {}, {{2, 3}, {2, 3}}), "[" + name + "]", "node 'c1'",
                  "has 2 inputs, expected 1 (x)");
    REQUIRE_ERROR(infer(k, {}, {}), "[" + name + "]", "node 'c1'", "has 0 inputs, expected 1");
  }
}

TEST_CASE("ops: add and mul broadcast like NumPy", "[ops]") {
  for (OpKind k : {OpKind::Add, OpKind::Mul}) {
    std::string name = epilog::op_name(k);
    CAPTURE(name);
    const Shape x{2, 16, 8, 8};
    REQUIRE(infer1(k, {}, {x, x}) == x);
    REQUIRE(infer1(k, {}, {x, {1, 16, 1, 1}}) == x);
    REQUIRE(infer1(k, {}, {x, {2, 16, 1, 1}}) == x);
    REQUIRE(infer1(k, {}, {x, {16, 1, 1}}) == x);
    REQUIRE(infer1(k, {}, {x, {1}}) == x);
    REQUIRE(infer1(k, {}, {x, {8}}) == x);
    // Either side may be the smaller one.
    REQUIRE(infer1(k, {}, {{1, 16, 1, 1}, x}) == x);
    REQUIRE(infer1(k, {}, {{1}, x}) == x);
    // Both sides stretch: the NumPy documentation's example.
    REQUIRE(infer1(k, {}, {{8, 1, 6, 1}, {7, 1, 5}}) == Shape{8, 7, 6, 5});
    REQUIRE(infer1(k, {}, {{7, 1, 5}, {8, 1, 6, 1}}) == Shape{8, 7, 6, 5});
    REQUIRE(infer1(k, {}, {{2, 1}, {1, 3}}) == Shape{2, 3});

    REQUIRE_ERROR(infer(k, {}, {x, {1, 8, 1, 1}}), "[" + name + "]", "node 'c1'",
                  "shapes [2,16,8,8] and [1,8,1,1] do not broadcast");
    // Rank mismatch: [4] aligns with the last dim 3.
    REQUIRE_ERROR(infer(k, {}, {{2, 3}, {4}}), "[" + name + "]", "node 'c1'",
                  "shapes [2,3] and [4] do not broadcast");
    REQUIRE_ERROR(infer(k, {}, {{3}, {3, 4}}), "[" + name + "]", "do not broadcast");
    REQUIRE_ERROR(infer(k, {}, {x}), "[" + name + "]", "node 'c1'",
                  "has 1 inputs, expected 2 (a, b)");
    REQUIRE_ERROR(infer(k, {}, {x, x, x}), "[" + name + "]", "has 3 inputs, expected 2");
  }
}

TEST_CASE("ops: concat along any axis", "[ops]") {
  auto axis = [](int64_t a) { return A().i("axis", a); };
  REQUIRE(infer1(OpKind::Concat, axis(1), {{1, 16, 8, 8}, {1, 32, 8, 8}, {1, 8, 8, 8}}) ==
          Shape{1, 56, 8, 8});
  REQUIRE(infer1(OpKind::Concat, axis(0), {{1, 3, 4}, {2, 3, 4}}) == Shape{3, 3, 4});
  REQUIRE(infer1(OpKind::Concat, axis(2), {{1, 3, 4}, {1, 3, 5}}) == Shape{1, 3, 9});
  // Negative axes count from the back.
  REQUIRE(infer1(OpKind::Concat, axis(-1), {{1, 3, 4}, {1, 3, 5}}) == Shape{1, 3, 9});
  REQUIRE(infer1(OpKind::Concat, axis(-3), {{1, 3, 4}, {2, 3, 4}}) == Shape{3, 3, 4});
  REQUIRE(infer1(OpKind::Concat, axis(-3), {{1, 16, 8, 8}, {1, 4, 8, 8}}) == Shape{1, 20, 8, 8});
  // One input is a copy.
  REQUIRE(infer1(OpKind::Concat, axis(1), {{1, 16, 8, 8}}) == Shape{1, 16, 8, 8});
  // Many inputs.
  REQUIRE(infer1(OpKind::Concat, axis(1), std::vector<Shape>(6, {2, 3, 4, 4})) ==
          Shape{2, 18, 4, 4});

  REQUIRE_ERROR(infer(OpKind::Concat, axis(1), {{1, 16, 8, 8}, {1, 16, 4, 8}}), "[concat]",
                "node 'c1'", "input 1 has shape [1,16,4,8]", "does not match [1,16,8,8]",
                "outside axis 1");
  REQUIRE_ERROR(infer(OpKind::Concat, axis(1), {{1, 16, 8, 8}, {1, 16, 8, 8}, {2, 16, 8, 8}}),
                "[concat]", "input 2 has shape [2,16,8,8]");
  REQUIRE_ERROR(infer(OpKind::Concat, axis(1), {{1, 16, 8, 8}, {1, 16, 8}}), "[concat]",
                "node 'c1'", "input 1 has shape [1,16,8]");
  REQUIRE_ERROR(infer(OpKind::Concat, axis(4), {{1, 16, 8, 8}, {1, 16, 8, 8}}), "[concat]",
                "node 'c1'", "axis 4 is out of range for rank 4");
  REQUIRE_ERROR(infer(OpKind::Concat, axis(-5), {{1, 16, 8, 8}}), "[concat]",
                "axis -5 is out of range for rank 4");
  REQUIRE_ERROR(infer(OpKind::Concat, axis(0), {}), "[concat]", "node 'c1'",
                "has 0 inputs, expected at least 1");
}

TEST_CASE("ops: split along any axis", "[ops]") {
  auto split = [](int64_t axis, std::vector<int64_t> sizes) {
    return A().i("axis", axis).ints("sizes", std::move(sizes));
  };
  REQUIRE(infer(OpKind::Split, split(1, {32, 32}), {{1, 64, 8, 8}}) ==
          std::vector<Shape>{{1, 32, 8, 8}, {1, 32, 8, 8}});
  REQUIRE(infer(OpKind::Split, split(1, {16, 48}), {{1, 64, 8, 8}}) ==
          std::vector<Shape>{{1, 16, 8, 8}, {1, 48, 8, 8}});
  REQUIRE(infer(OpKind::Split, split(0, {1, 2, 3}), {{6, 5}}) ==
          std::vector<Shape>{{1, 5}, {2, 5}, {3, 5}});
  REQUIRE(infer(OpKind::Split, split(-1, {3, 7}), {{2, 3, 4, 10}}) ==
          std::vector<Shape>{{2, 3, 4, 3}, {2, 3, 4, 7}});
  REQUIRE(infer(OpKind::Split, split(3, {3, 7}), {{2, 3, 4, 10}}) ==
          std::vector<Shape>{{2, 3, 4, 3}, {2, 3, 4, 7}});
  REQUIRE(infer(OpKind::Split, split(-4, {1, 1}), {{2, 3, 4, 10}}) ==
          std::vector<Shape>{{1, 3, 4, 10}, {1, 3, 4, 10}});
  // A single part is a copy.
  REQUIRE(infer(OpKind::Split, split(2, {4}), {{2, 3, 4, 10}}) ==
          std::vector<Shape>{{2, 3, 4, 10}});

  REQUIRE_ERROR(infer(OpKind::Split, split(1, {10, 20}), {{1, 64, 8, 8}}), "[split]", "node 'c1'",
                "sizes add up to 30 but axis 1 of [1,64,8,8] has 64");
  REQUIRE_ERROR(infer(OpKind::Split, split(-1, {5, 5}), {{1, 64, 8, 8}}), "[split]",
                "sizes add up to 10 but axis 3 of [1,64,8,8] has 8");
  REQUIRE_ERROR(infer(OpKind::Split, split(1, {64, 0}), {{1, 64, 8, 8}}), "[split]", "node 'c1'",
                "sizes must be >= 1, got 0");
  REQUIRE_ERROR(infer(OpKind::Split, split(1, {70, -6}), {{1, 64, 8, 8}}), "[split]",
                "sizes must be >= 1, got -6");
  REQUIRE_ERROR(infer(OpKind::Split, split(1, {}), {{1, 64, 8, 8}}), "[split]", "node 'c1'",
                "sizes is empty");
  REQUIRE_ERROR(infer(OpKind::Split, split(4, {32, 32}), {{1, 64, 8, 8}}), "[split]", "node 'c1'",
                "axis 4 is out of range for rank 4");
  REQUIRE_ERROR(infer(OpKind::Split, split(-5, {32, 32}), {{1, 64, 8, 8}}), "[split]",
                "axis -5 is out of range for rank 4");
  REQUIRE_ERROR(infer(OpKind::Split, split(1, {32, 32}), {{1, 64, 8, 8}, {1, 64, 8, 8}}), "[split]",
                "node 'c1'", "has 2 inputs, expected 1");
}

TEST_CASE("ops: maxpool2d and avgpool2d output sizes, floor and ceil", "[ops]") {
  for (OpKind k : {OpKind::MaxPool2d, OpKind::AvgPool2d}) {
    std::string name = epilog::op_name(k);
    CAPTURE(name);
    auto pool = [&](int64_t h, int64_t kernel, int64_t stride, int64_t pad, bool ceil) {
      Shape out = infer1(
          k, A().i("kernel", kernel).i("stride", stride).i("padding", pad).i("ceil_mode", ceil),
          {{1, 2, h, h}});
      REQUIRE(out[0] == 1);
      REQUIRE(out[1] == 2);
      REQUIRE(out[2] == out[3]);
      return out[2];
    };
    // The common 2x2 / 2 pool.
    REQUIRE(pool(8, 2, 2, 0, false) == 4);
    REQUIRE(pool(8, 2, 2, 0, true) == 4);
    // Odd input: floor((7 - 2) / 2) + 1 = 3, ceil gives ceil(5 / 2) + 1 = 4.
    REQUIRE(pool(7, 2, 2, 0, false) == 3);
    REQUIRE(pool(7, 2, 2, 0, true) == 4);
    // SPPF's 5x5 / 1 with padding 2 keeps the size.
    REQUIRE(pool(20, 5, 1, 2, false) == 20);
    REQUIRE(pool(20, 5, 1, 2, true) == 20);
    // PyTorch: floor((6 + 2 - 3) / 2) + 1 = 3; ceil: ceil(5 / 2) + 1 = 4, and the last window
    // starts at (4 - 1) * 2 = 6 < 6 + 1 (input + left padding), so 4 stays.
    REQUIRE(pool(6, 3, 2, 1, false) == 3);
    REQUIRE(pool(6, 3, 2, 1, true) == 4);
    // No padding: ceil((6 - 3) / 2) + 1 = 3, last window starts at 4 < 6.
    REQUIRE(pool(6, 3, 2, 0, false) == 2);
    REQUIRE(pool(6, 3, 2, 0, true) == 3);
    // The PyTorch rule drops a window: k=2, s=4, p=1 on 6: ceil(6 / 4) + 1 = 3, but the third
    // window would start at (3 - 1) * 4 = 8 >= 6 + 1, entirely in the right padding, so 2.
    REQUIRE(pool(6, 2, 4, 1, false) == 2);
    REQUIRE(pool(6, 2, 4, 1, true) == 2);
    // k=3, s=3, p=1 on 5: floor(4 / 3) + 1 = 2; ceil(4 / 3) + 1 = 3, start 6 >= 6 -> 2.
    REQUIRE(pool(5, 3, 3, 1, false) == 2);
    REQUIRE(pool(5, 3, 3, 1, true) == 2);
    // k=3, s=3, p=0 on 7: floor 2; ceil(4 / 3) + 1 = 3, start 6 < 7 -> 3.
    REQUIRE(pool(7, 3, 3, 0, false) == 2);
    REQUIRE(pool(7, 3, 3, 0, true) == 3);
    // The whole input as one window.
    REQUIRE(pool(4, 4, 1, 0, false) == 1);
    // With padding a kernel larger than the input fits: 2 + 2 - 3 + 1 = 2.
    REQUIRE(pool(2, 3, 1, 1, false) == 2);

    // Rectangular kernel and stride, asymmetric padding (top, left, bottom, right):
    // H: (8 + 1 + 0 - 2) / 2 + 1 = 4; W: (9 + 2 + 1 - 3) / 3 + 1 = 4.
    REQUIRE(infer1(k,
                   A().ints("kernel", {2, 3}).ints("stride", {2, 3}).ints("padding", {1, 2, 0, 1}),
                   {{3, 4, 8, 9}}) == Shape{3, 4, 4, 4});
    // A 1x3 kernel may pad left and right by 1 but not top and bottom.
    REQUIRE(infer1(k, A().ints("kernel", {1, 3}).ints("padding", {0, 1, 0, 1}), {{1, 1, 5, 5}}) ==
            Shape{1, 1, 5, 5});
  }
  REQUIRE(norm(OpKind::AvgPool2d, A().i("kernel", 2).i("count_include_pad", 1))
              .i("count_include_pad") == 1);
}

TEST_CASE("ops: pool errors", "[ops]") {
  for (OpKind k : {OpKind::MaxPool2d, OpKind::AvgPool2d}) {
    std::string tag = "[" + std::string(epilog::op_name(k)) + "]";
    CAPTURE(tag);
    const Shape x{1, 2, 8, 8};
    REQUIRE_ERROR(infer(k, A().i("kernel", 3).i("padding", 3), {x}), tag, "node 'c1'",
                  "padding 3 must be smaller than the kernel 3x3");
    REQUIRE_ERROR(infer(k, A().i("kernel", 2).i("padding", 2), {x}), tag,
                  "padding 2 must be smaller than the kernel 2x2");
    // Top/bottom padding compares with the kernel height, left/right with the width.
    REQUIRE_ERROR(infer(k, A().ints("kernel", {1, 3}).ints("padding", {1, 0, 0, 0}), {x}), tag,
                  "node 'c1'", "padding 1 must be smaller than the kernel 1x3");
    REQUIRE_ERROR(infer(k, A().ints("kernel", {3, 1}).ints("padding", {0, 0, 0, 1}), {x}), tag,
                  "padding 1 must be smaller than the kernel 3x1");
    REQUIRE_ERROR(infer(k, A().i("kernel", 3).i("stride", 0), {x}), tag, "node 'c1'",
                  "stride must be >= 1, got 0");
    REQUIRE_ERROR(infer(k, A().i("kernel", 3).ints("stride", {2, -1}), {x}), tag,
                  "stride must be >= 1, got -1");
    REQUIRE_ERROR(infer(k, A().i("kernel", 0), {x}), tag, "node 'c1'",
                  "kernel must be >= 1, got 0");
    REQUIRE_ERROR(infer(k, A().i("kernel", 3).ints("padding", {0, -1, 0, 0}), {x}), tag,
                  "padding must be >= 0, got -1");
    REQUIRE_ERROR(infer(k, A().i("kernel", 3), {{1, 2, 2, 8}}), tag, "node 'c1'",
                  "kernel 3x3 does not fit input [1,2,2,8]");
    REQUIRE_ERROR(infer(k, A().i("kernel", 3), {{1, 2, 8}}), tag, "node 'c1'",
                  "input 'x' has shape [1,2,8] (3 dims), expected 4 dims");
    REQUIRE_ERROR(infer(k, A().i("kernel", 3), {x, x}), tag, "node 'c1'",
                  "has 2 inputs, expected 1 (x)");
  }
}

TEST_CASE("ops: global_avgpool", "[ops]") {
  REQUIRE(infer1(OpKind::GlobalAvgPool, {}, {{2, 16, 7, 9}}) == Shape{2, 16, 1, 1});
  REQUIRE(infer1(OpKind::GlobalAvgPool, {}, {{2, 16, 5}}) == Shape{2, 16, 1});
  REQUIRE(infer1(OpKind::GlobalAvgPool, {}, {{1, 3, 1, 1}}) == Shape{1, 3, 1, 1});
  REQUIRE_ERROR(infer(OpKind::GlobalAvgPool, {}, {{2, 16}}), "[global_avgpool]", "node 'c1'",
                "input 'x' has shape [2,16], expected at least 3 dims");
  REQUIRE_ERROR(infer(OpKind::GlobalAvgPool, {}, {}), "[global_avgpool]", "node 'c1'",
                "has 0 inputs");
}

TEST_CASE("ops: upsample_nearest", "[ops]") {
  REQUIRE(infer1(OpKind::UpsampleNearest, A().i("scale", 2), {{1, 8, 20, 20}}) ==
          Shape{1, 8, 40, 40});
  REQUIRE(infer1(OpKind::UpsampleNearest, A().ints("scale", {2, 3}), {{2, 8, 20, 10}}) ==
          Shape{2, 8, 40, 30});
  REQUIRE(infer1(OpKind::UpsampleNearest, A().i("scale", 1), {{1, 8, 5, 5}}) == Shape{1, 8, 5, 5});
  REQUIRE_ERROR(infer(OpKind::UpsampleNearest, A().i("scale", 0), {{1, 8, 5, 5}}),
                "[upsample_nearest]", "node 'c1'", "scale must be >= 1, got 0");
  REQUIRE_ERROR(infer(OpKind::UpsampleNearest, A().ints("scale", {2, -2}), {{1, 8, 5, 5}}),
                "[upsample_nearest]", "scale must be >= 1, got -2");
  REQUIRE_ERROR(infer(OpKind::UpsampleNearest, A().i("scale", 2), {{8, 5, 5}}),
                "[upsample_nearest]", "node 'c1'",
                "input 'x' has shape [8,5,5] (3 dims), expected 4 dims");
}

TEST_CASE("ops: flatten at every axis, negative axes count from the back", "[ops]") {
  auto flat = [](int64_t axis, const Shape& x) {
    return infer1(OpKind::Flatten, A().i("axis", axis), {x});
  };
  const Shape x{2, 3, 4, 5};
  REQUIRE(flat(0, x) == Shape{1, 120});
  REQUIRE(flat(1, x) == Shape{2, 60});
  REQUIRE(flat(2, x) == Shape{6, 20});
  REQUIRE(flat(3, x) == Shape{24, 5});
  REQUIRE(flat(4, x) == Shape{120, 1});
  REQUIRE(infer1(OpKind::Flatten, {}, {x}) == Shape{2, 60});  // default axis 1
  // ONNX: axis in [-r, r], a negative one counts dims from the back (axis + r).
  REQUIRE(flat(-1, x) == Shape{24, 5});
  REQUIRE(flat(-2, x) == Shape{6, 20});
  REQUIRE(flat(-3, x) == Shape{2, 60});
  REQUIRE(flat(-4, x) == Shape{1, 120});
  REQUIRE(flat(1, {7, 1, 1}) == Shape{7, 1});
  REQUIRE(flat(1, {7}) == Shape{7, 1});
  REQUIRE_ERROR(flat(5, x), "[flatten]", "node 'c1'", "axis 5 is out of range for rank 4");
  REQUIRE_ERROR(flat(-5, x), "[flatten]", "node 'c1'", "axis -5 is out of range for rank 4");
  REQUIRE_ERROR(infer(OpKind::Flatten, {}, {x, x}), "[flatten]", "node 'c1'",
                "has 2 inputs, expected 1");
}

TEST_CASE("ops: linear", "[ops]") {
  REQUIRE(infer1(OpKind::Linear, {}, {{4, 128}, {10, 128}}) == Shape{4, 10});
  REQUIRE(infer1(OpKind::Linear, {}, {{4, 128}, {10, 128}, {10}}) == Shape{4, 10});
  REQUIRE(infer1(OpKind::Linear, {}, {{1, 1}, {1, 1}}) == Shape{1, 1});
  REQUIRE_ERROR(infer(OpKind::Linear, {}, {{4, 128}, {10, 64}}), "[linear]", "node 'c1'",
                "input has 128 features but weight [10,64] expects 64");
  REQUIRE_ERROR(infer(OpKind::Linear, {}, {{4, 128}, {10, 128}, {5}}), "[linear]", "node 'c1'",
                "input 'bias' has shape [5], expected [10]");
  // PyTorch's Linear: any leading dims, the features last.
  REQUIRE(infer1(OpKind::Linear, {}, {{4, 7, 7, 128}, {10, 128}}) == Shape{4, 7, 7, 10});
  REQUIRE_ERROR(infer(OpKind::Linear, {}, {{4, 128, 1, 1}, {10, 128}}), "[linear]", "node 'c1'",
                "input has 1 features but weight [10,128] expects 128");
  REQUIRE_ERROR(infer(OpKind::Linear, {}, {{128}, {10, 128}}), "[linear]", "node 'c1'",
                "input 'x' has shape [128], expected at least 2 dims");
  REQUIRE_ERROR(infer(OpKind::Linear, {}, {{4, 128}, {1280}}), "[linear]",
                "input 'weight' has shape [1280] (1 dims), expected 2 dims");
  REQUIRE_ERROR(infer(OpKind::Linear, {}, {{4, 128}}), "[linear]", "node 'c1'",
                "has 1 inputs, expected 2 to 3 (x, weight, bias)");
  REQUIRE_ERROR(infer(OpKind::Linear, {}, {{4, 128}, {10, 128}, {10}, {10}}), "[linear]",
                "has 4 inputs, expected 2 to 3");
}

TEST_CASE("ops: errors use the node name given", "[ops]") {
  REQUIRE_ERROR(infer(OpKind::Relu, {}, {}, "model.3.act"), "[relu] node 'model.3.act': ");
  REQUIRE_ERROR(epilog::normalize_attrs(OpKind::Concat, "neck.cat", {}),
                "[concat] node 'neck.cat': missing required attribute 'axis'");
}
