// The ONNX importer: small models built here with the ONNX protobuf classes, imported, checked
// structurally (ops, names) and numerically against hand-computed values or the same graph made
// with the Builder on the CPU reference; and one test per kind of bad or unsupported model,
// checking that the message names the file, the node, the op type and the attribute.
#ifdef EPILOG_HAVE_ONNX

#include <onnx/onnx_pb.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "epilog/graph/passes.h"
#include "epilog/io/builder.h"
#include "epilog/io/dump.h"
#include "epilog/io/onnx.h"
#include "onnx_model.h"
#include "test_util.h"

namespace {

using namespace epilog;
using namespace epilog::onnx_test;
using Catch::Contains;

// x [1,3,8,8] -> Conv(3x3, stride 2, pads 1) -> BatchNormalization -> act; weights named like
// a PyTorch state_dict so that the Builder makes the same graph.
Model conv_bn_model(const std::string& act, std::map<std::string, Tensor>& weights) {
  Model m;
  m.input("x", {1, 3, 8, 8});
  weights["c.weight"] = m.random("c.weight", {4, 3, 3, 3}, 1);
  weights["bn.weight"] = m.random("bn.weight", {4}, 2);
  weights["bn.bias"] = m.random("bn.bias", {4}, 3);
  weights["bn.running_mean"] = m.random("bn.running_mean", {4}, 4);
  Tensor var = Tensor::full({4}, 0.5f);
  m.init("bn.running_var", {4}, values(var));
  weights["bn.running_var"] = var;
  auto& conv = m.node("Conv", {"x", "c.weight"}, {"c"}, "c");
  set_ints(conv, "strides", {2, 2});
  set_ints(conv, "pads", {1, 1, 1, 1});
  set_ints(conv, "kernel_shape", {3, 3});
  auto& bn =
      m.node("BatchNormalization",
             {"c", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"}, {"bn"}, "bn");
  set_f(bn, "epsilon", 1e-3f);
  m.node(act, {"bn"}, {"y"}, "act");
  m.output("y");
  return m;
}

}  // namespace

// -- ops --

TEST_CASE("onnx: Conv + BatchNormalization + Relu matches the Builder's graph", "[onnx]") {
  std::map<std::string, Tensor> w;
  Graph g = conv_bn_model("Relu", w).load();
  CHECK(g.inputs == std::vector<std::string>{"x"});
  CHECK(g.outputs == std::vector<std::string>{"y"});
  REQUIRE(g.nodes.size() == 3);
  CHECK(g.nodes[0].name == "c");
  CHECK(g.nodes[0].op == OpKind::Conv2d);
  CHECK(g.nodes[1].name == "bn");
  CHECK(g.nodes[1].attrs.f("eps") == 1e-3);
  CHECK(g.nodes[2].name == "act");

  Builder b;
  b.set_weights(w);
  Val x = b.input("x", {1, 3, 8, 8});
  b.output(b.relu(b.batchnorm(b.conv2d(x, "c", ConvOpts(4, 3).stride(2).padding(1)), "bn", 1e-3),
                  "act"));
  Graph ref = b.build();
  Tensor in = Tensor::randn({1, 3, 8, 8}, 9);
  CHECK(test::bit_equal(run1(g, in), test::run_cpu(ref, {{"x", in}}).at("act")));

  // The dump keeps the ONNX names.
  std::string text = dump_text(g);
  CHECK_THAT(text, Contains("%c = conv2d") && Contains("%bn = batchnorm") && Contains("# act"));

  // Old exporters may leave an attribute's type out: the field that is set says it.
  Model old = conv_bn_model("Relu", w);
  for (auto& n : *old.g().mutable_node())
    for (auto& a : *n.mutable_attribute()) a.set_type(onnx::AttributeProto::UNDEFINED);
  CHECK(dump_text(old.load()) == text);

  PassReport r = optimize(g);
  CHECK(count(g, OpKind::FusedConv2d) == 1);
  CHECK(g.nodes.size() == 1);
  CHECK(g.nodes[0].attrs.s("activation") == "relu");
}

TEST_CASE("onnx: Conv with bias, Sigmoid and Mul fuse into fused_conv2d silu", "[onnx]") {
  // What PyTorch exports for Conv2d + BatchNorm2d (eval, folded into the bias) + SiLU.
  Model m;
  m.input("images", {1, 3, 16, 16});
  m.random("m.0.conv.weight", {8, 3, 3, 3}, 1);
  m.random("m.0.conv.bias", {8}, 2);
  auto& conv = m.node("Conv", {"images", "m.0.conv.weight", "m.0.conv.bias"},
                      {"/m.0/conv/Conv_out"}, "/m.0/conv/Conv");
  set_ints(conv, "pads", {1, 1, 1, 1});
  m.node("Sigmoid", {"/m.0/conv/Conv_out"}, {"/m.0/act/Sigmoid_out"}, "/m.0/act/Sigmoid");
  m.node("Mul", {"/m.0/conv/Conv_out", "/m.0/act/Sigmoid_out"}, {"out"}, "/m.0/act/Mul");
  m.output("out");
  Graph g = m.load();
  CHECK(count(g, OpKind::Conv2d) == 1);
  CHECK(count(g, OpKind::Sigmoid) == 1);
  CHECK(count(g, OpKind::Mul) == 1);
  Tensor in = Tensor::randn({1, 3, 16, 16}, 3);
  Tensor unfused = run1(g, in, "images", "out");

  PassReport r = optimize(g);
  INFO(r.summary());
  REQUIRE(g.nodes.size() == 1);
  CHECK(g.nodes[0].op == OpKind::FusedConv2d);
  CHECK(g.nodes[0].name == "/m.0/conv/Conv");
  CHECK(g.nodes[0].attrs.s("activation") == "silu");
  CHECK(test::max_rel_err(run1(g, in, "images", "out"), unfused) < 1e-5);
}

namespace {
// x [1,4,2,2] -> Split into two halves on the channels -> Concat(b, a): the halves swapped.
void check_swapped_halves(const Graph& g) {
  CHECK(count(g, OpKind::Split) == 1);
  Tensor x = Tensor::randn({1, 4, 2, 2}, 5);
  std::vector<float> want = values(x);
  std::rotate(want.begin(), want.begin() + 8, want.end());
  CHECK(values(run1(g, x)) == want);
}
}  // namespace

TEST_CASE("onnx: Split with sizes as input (opset 13) and as attribute (opset 11)", "[onnx]") {
  for (int64_t opset : {13, 11}) {
    INFO("opset " << opset);
    Model m(opset);
    m.input("x", {1, 4, 2, 2});
    onnx::NodeProto* split;
    if (opset >= 13) {
      m.ints("sizes", {2, 2});
      split = &m.node("Split", {"x", "sizes"}, {"a", "b"}, "chunk");
    } else {
      split = &m.node("Split", {"x"}, {"a", "b"}, "chunk");
      set_ints(*split, "split", {2, 2});
    }
    set_i(*split, "axis", 1);
    set_i(m.node("Concat", {"b", "a"}, {"y"}), "axis", 1);
    m.output("y");
    Graph g = m.load();
    CHECK(g.nodes[0].name == "chunk");
    CHECK(g.nodes[0].outputs == std::vector<std::string>{"a", "b"});
    check_swapped_halves(g);
  }
  // No sizes: equal parts.
  Model m;
  m.input("x", {1, 4, 2, 2});
  set_i(m.node("Split", {"x"}, {"a", "b"}), "axis", 1);
  set_i(m.node("Concat", {"b", "a"}, {"y"}), "axis", -3);
  m.output("y");
  check_swapped_halves(m.load());
}

TEST_CASE("onnx: shape arithmetic folds (chunk and view as PyTorch exports them)", "[onnx]") {
  Model m;
  m.input("x", {2, 4, 3, 3});
  // sizes = [C / 2, C / 2] from Shape -> Gather -> Div -> Unsqueeze -> Concat -> Cast.
  m.node("Shape", {"x"}, {"shape"});
  m.ints("one", {1});
  m.g().mutable_initializer()->rbegin()->clear_dims();  // a scalar index
  m.node("Gather", {"shape", "one"}, {"c"});
  m.ints("two", {2});
  m.g().mutable_initializer()->rbegin()->clear_dims();
  m.node("Div", {"c", "two"}, {"half"});
  m.ints("axes0", {0});
  m.node("Unsqueeze", {"half", "axes0"}, {"half1"});
  set_i(m.node("Concat", {"half1", "half1"}, {"sizes_f"}), "axis", 0);
  set_i(m.node("Cast", {"sizes_f"}, {"sizes"}), "to", TensorProto::INT64);
  set_i(m.node("Split", {"x", "sizes"}, {"a", "b"}, "chunk"), "axis", 1);
  m.node("Add", {"a", "b"}, {"s"});
  // view(s.size(0), -1): Shape -> Gather(0) -> Unsqueeze -> Concat with [-1] -> Reshape.
  m.node("Shape", {"s"}, {"s_shape"});
  m.ints("zero", {0});
  m.g().mutable_initializer()->rbegin()->clear_dims();
  m.node("Gather", {"s_shape", "zero"}, {"n"});
  m.node("Unsqueeze", {"n", "axes0"}, {"n1"});
  m.ints("minus1", {-1});
  set_i(m.node("Concat", {"n1", "minus1"}, {"view_shape"}), "axis", 0);
  m.node("Reshape", {"s", "view_shape"}, {"y"}, "view");
  m.output("y");
  Graph g = m.load();
  CHECK(g.nodes.size() == 3);  // split, add, flatten: the rest folded
  CHECK(count(g, OpKind::Split) == 1);
  CHECK(count(g, OpKind::Flatten) == 1);
  CHECK(g.find_node("view") != nullptr);
  CHECK(g.value("y").shape == Shape{2, 18});
  Tensor x = Tensor::randn({2, 4, 3, 3}, 1);
  Tensor y = run1(g, x);
  const float* px = x.f32();
  for (int n = 0; n < 2; ++n)
    for (int k = 0; k < 18; ++k) CHECK(y.f32()[n * 18 + k] == px[n * 36 + k] + px[n * 36 + 18 + k]);
}

TEST_CASE("onnx: Slice on the channel axis becomes a split", "[onnx]") {
  Model m;
  m.input("x", {1, 6, 2, 2});
  m.ints("starts", {1});
  m.ints("ends", {3});
  m.ints("axes", {1});
  m.node("Slice", {"x", "starts", "ends", "axes"}, {"y"}, "slice");
  m.output("y");
  Graph g = m.load();
  REQUIRE(g.nodes.size() == 1);
  CHECK(g.nodes[0].op == OpKind::Split);
  CHECK(g.nodes[0].attrs.ints("sizes") == std::vector<int64_t>{1, 2, 3});
  Tensor x = Tensor::randn({1, 6, 2, 2}, 2);
  std::vector<float> want(x.f32() + 4, x.f32() + 12);
  CHECK(values(run1(g, x)) == want);
  optimize(g);  // the unused parts stay outputs of the one split
  CHECK(g.nodes.size() == 1);
}

TEST_CASE("onnx: Resize nearest x2 and Upsample become upsample_nearest", "[onnx]") {
  auto check = [](const Graph& g, int64_t sh, int64_t sw) {
    REQUIRE(g.nodes.size() == 1);
    CHECK(g.nodes[0].op == OpKind::UpsampleNearest);
    CHECK(g.nodes[0].attrs.ints("scale") == std::vector<int64_t>{sh, sw});
    Tensor x = Tensor::randn({1, 2, 3, 3}, 4);
    Tensor y = run1(g, x);
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t h = 0; h < 3 * sh; ++h)
        for (int64_t w = 0; w < 3 * sw; ++w)
          CHECK(y.f32()[(c * 3 * sh + h) * 3 * sw + w] == x.f32()[(c * 3 + h / sh) * 3 + w / sw]);
  };
  {  // What PyTorch exports for nn.Upsample(scale_factor=2, mode="nearest") at opset 17.
    Model m;
    m.input("x", {1, 2, 3, 3});
    m.init("scales", {4}, {1, 1, 2, 2});
    auto& r = m.node("Resize", {"x", "", "scales"}, {"y"}, "up");
    set_s(r, "coordinate_transformation_mode", "asymmetric");
    set_s(r, "mode", "nearest");
    set_s(r, "nearest_mode", "floor");
    m.output("y");
    check(m.load(), 2, 2);
  }
  {  // sizes instead of scales; the default half_pixel + round_prefer_floor reads the same.
    Model m;
    m.input("x", {1, 2, 3, 3});
    m.ints("sizes", {1, 2, 6, 9});
    m.node("Resize", {"x", "", "", "sizes"}, {"y"});
    m.output("y");
    check(m.load(), 2, 3);
  }
  {
    Model m(9);
    m.input("x", {1, 2, 3, 3});
    m.init("scales", {4}, {1, 1, 3, 2});
    set_s(m.node("Upsample", {"x", "scales"}, {"y"}), "mode", "nearest");
    m.output("y");
    check(m.load(), 3, 2);
  }
}

TEST_CASE("onnx: Gemm and MatMul + Add become linear", "[onnx]") {
  const std::vector<float> w = {1, 2, 3, 4, 5, 6};   // [N=2, K=3] as PyTorch stores it
  const std::vector<float> wt = {1, 4, 2, 5, 3, 6};  // [K=3, N=2]
  Tensor x = Tensor::from_vector({2, 3}, {1, 0, -1, 2, 1, 0});
  const std::vector<float> want = {1 - 3 + 10, 4 - 6 + 20, 2 + 2 + 10, 8 + 5 + 20};
  {
    Model m;
    m.input("x", {2, 3});
    m.init("fc.weight", {2, 3}, w);
    m.init("fc.bias", {2}, {10, 20});
    set_i(m.node("Gemm", {"x", "fc.weight", "fc.bias"}, {"y"}, "fc"), "transB", 1);
    m.output("y");
    Graph g = m.load();
    REQUIRE(g.nodes.size() == 1);
    CHECK(g.nodes[0].op == OpKind::Linear);
    CHECK(g.nodes[0].inputs == std::vector<std::string>{"x", "fc.weight", "fc.bias"});
    CHECK(values(run1(g, x)) == want);
  }
  {  // transB = 0: the constant B is transposed at import; a [1, N] bias is one per feature.
    Model m;
    m.input("x", {2, 3});
    m.init("B", {3, 2}, wt);
    m.init("C", {1, 2}, {10, 20});
    m.node("Gemm", {"x", "B", "C"}, {"y"});
    m.output("y");
    Graph g = m.load();
    REQUIRE(g.nodes.size() == 1);
    CHECK(values(g.weights.at(g.nodes[0].inputs[1]).data) == w);
    CHECK(values(run1(g, x)) == want);
  }
  {  // One value for all features ([1]): spread into the linear's bias, no add.
    Model m;
    m.input("x", {2, 3});
    m.init("B", {2, 3}, w);
    m.init("C", {1}, {10});
    set_i(m.node("Gemm", {"x", "B", "C"}, {"y"}), "transB", 1);
    m.output("y");
    Graph g = m.load();
    REQUIRE(g.nodes.size() == 1);
    REQUIRE(g.nodes[0].inputs.size() == 3);
    CHECK(values(g.weights.at(g.nodes[0].inputs[2]).data) == std::vector<float>{10, 10});
    CHECK(values(run1(g, x)) == std::vector<float>{want[0], want[1] - 10, want[2], want[3] - 10});
  }
  {  // A [M, N] bias is added after.
    Model m;
    m.input("x", {2, 3});
    m.init("B", {2, 3}, w);
    m.init("C", {2, 2}, {10, 20, 10, 20});
    set_i(m.node("Gemm", {"x", "B", "C"}, {"y"}), "transB", 1);
    m.output("y");
    Graph g = m.load();
    CHECK(count(g, OpKind::Linear) == 1);
    CHECK(count(g, OpKind::Add) == 1);
    CHECK(values(run1(g, x)) == want);
  }
  {  // MatMul by a constant, then Add of a constant bias: one linear node.
    Model m;
    m.input("x", {2, 3});
    m.init("W", {3, 2}, wt);
    m.init("b", {2}, {10, 20});
    m.node("MatMul", {"x", "W"}, {"xw"}, "proj");
    m.node("Add", {"xw", "b"}, {"y"}, "proj_bias");
    m.output("y");
    Graph g = m.load();
    REQUIRE(g.nodes.size() == 1);
    CHECK(g.nodes[0].name == "proj");
    CHECK(g.nodes[0].outputs == std::vector<std::string>{"y"});
    CHECK(values(run1(g, x)) == want);
  }
}

TEST_CASE("onnx: Flatten, pools, Concat, Identity and Constant", "[onnx]") {
  Model m;
  m.input("x", {1, 2, 6, 6});
  auto& mp = m.node("MaxPool", {"x"}, {"mp"}, "mp");
  set_ints(mp, "kernel_shape", {3, 3});
  set_ints(mp, "strides", {2, 2});
  set_ints(mp, "pads", {1, 1, 1, 1});
  set_i(mp, "ceil_mode", 1);
  auto& ap = m.node("AveragePool", {"x"}, {"ap"}, "ap");
  set_ints(ap, "kernel_shape", {2, 2});
  set_ints(ap, "strides", {2, 2});
  set_ints(ap, "pads", {1, 1, 1, 1});
  set_i(ap, "count_include_pad", 1);
  set_i(m.node("Concat", {"mp", "ap"}, {"cat"}, "cat"), "axis", 1);
  auto& k = m.node("Constant", {}, {"k"}, "k");
  Model::fill(*attr(k, "value", onnx::AttributeProto::TENSOR).mutable_t(), "", {}, {0.5f});
  m.node("Mul", {"cat", "k"}, {"half"}, "half");
  m.node("GlobalAveragePool", {"half"}, {"gap"}, "gap");
  set_i(m.node("Flatten", {"gap"}, {"flat"}, "flat"), "axis", 1);
  m.node("Identity", {"flat"}, {"y"}, "id");
  m.output("y");
  Graph g = m.load();
  CHECK(g.outputs == std::vector<std::string>{"y"});
  CHECK(g.find_node("flat")->outputs == std::vector<std::string>{"y"});  // Identity's name

  Builder b;
  Val x = b.input("x", {1, 2, 6, 6});
  Val cat = b.concat({b.maxpool2d(x, PoolOpts(3).stride(2).padding(1).ceil_mode(), "mp"),
                      b.avgpool2d(x, PoolOpts(2).stride(2).padding(1).count_include_pad(), "ap")},
                     1, "cat");
  b.set_weights({{"k", Tensor::full({}, 0.5f)}});
  Val half = b.node(OpKind::Mul, {cat, b.weight("k", {}, OpKind::Mul, "b")}, {}, "half")[0];
  b.output(b.flatten(b.global_avgpool(half, "gap"), 1, "flat"));
  Graph ref = b.build();
  Tensor in = Tensor::randn({1, 2, 6, 6}, 6);
  CHECK(test::bit_equal(run1(g, in), test::run_cpu(ref, {{"x", in}}).at("flat")));
}

TEST_CASE("onnx: an output that is an input under another name gets a copy", "[onnx]") {
  Model m;
  m.input("x", {2, 3});
  m.node("Identity", {"x"}, {"y"}, "id");
  m.output("y");
  Graph g = m.load();
  CHECK(g.outputs == std::vector<std::string>{"y"});
  Tensor x = Tensor::randn({2, 3}, 1);
  CHECK(test::bit_equal(run1(g, x), x));
}

TEST_CASE("onnx: initializers as raw_data, float_data and float16, and external data", "[onnx]") {
  const std::vector<float> v = {0.5f, -1.25f, 3.0f, 0.0f};
  for (Store store : {Store::Raw, Store::Typed, Store::F16Raw, Store::F16Typed}) {
    Model m;
    m.input("x", {2, 2});
    m.init("w", {2, 2}, v, store);
    m.node("Mul", {"x", "w"}, {"y"});
    m.output("y");
    Graph g = m.load();
    CHECK(values(g.weights.at("w").data) == v);
  }
  // External data: 16 bytes of something else, then the tensor.
  std::string bin = std::string(16, 'x') + std::string(reinterpret_cast<const char*>(v.data()), 16);
  std::ofstream(scratch() / "ext.bin", std::ios::binary) << bin;
  Model m;
  m.input("x", {2, 2});
  TensorProto& t = m.init("w", {2, 2}, {});
  t.clear_raw_data();
  t.set_data_location(TensorProto::EXTERNAL);
  auto entry = [&](const char* key, const char* value) {
    auto* e = t.add_external_data();
    e->set_key(key);
    e->set_value(value);
  };
  entry("location", "ext.bin");
  entry("offset", "16");
  entry("length", "16");
  m.node("Mul", {"x", "w"}, {"y"});
  m.output("y");
  std::string path = m.save("ext.onnx");
  CHECK(values(load_onnx(path).weights.at("w").data) == v);
  CHECK(values(load_model(path).weights.at("w").data) == v);  // dispatch by extension

  t.mutable_external_data(0)->set_value("missing.bin");
  path = m.save("ext_missing.onnx");
  check_import_error([&] { load_onnx(path); },
                     {"ext_missing.onnx", "initializer 'w'", "missing.bin", "does not exist"});
  t.mutable_external_data(0)->set_value("../ext.bin");
  check_import_error([&] { m.load(); }, {"initializer 'w'", "inside the model's folder"});
  t.mutable_external_data(0)->set_value("ext.bin");
  t.mutable_external_data(1)->set_value("20");
  check_import_error([&] { m.load(); }, {"initializer 'w'", "needs bytes 20 to 36"});
}

TEST_CASE("onnx: --batch sets a symbolic batch dim", "[onnx]") {
  Model m;
  m.input("x", {-1, 3});
  m.node("Relu", {"x"}, {"y"});
  m.output("y");
  check_import_error([&] { m.load(); },
                     {"m.onnx", "graph input 'x'", "symbolic batch dim ('batch')", "--batch"});
  LoadOptions o;
  o.batch = 4;
  CHECK(m.load(o).value("y").shape == Shape{4, 3});
}

// -- errors --

TEST_CASE("onnx: unsupported ops, attributes and dtypes name node, op and attribute", "[onnx]") {
  {
    Model m;
    m.input("x", {1, 4});
    m.node("TopK", {"x"}, {"y"}, "sm");
    m.output("y");
    check_import_error([&] { m.load(); }, {"m.onnx: node 'sm' (TopK): op 'TopK' is not supported"},
                       true);
  }
  {
    Model m;
    m.input("x", {1, 2, 4, 4});
    m.init("scales", {4}, {1, 1, 2, 2});
    set_s(m.node("Resize", {"x", "", "scales"}, {"y"}, "up"), "mode", "cubic");
    m.output("y");
    check_import_error([&] { m.load(); },
                       {"node 'up' (Resize): attribute 'mode': is 'cubic'", "nearest and linear"},
                       true);
  }
  {
    std::map<std::string, Tensor> w;
    Model m = conv_bn_model("Relu", w);
    set_i(*m.g().mutable_node(1), "training_mode", 1);
    check_import_error([&] { m.load(); },
                       {"node 'bn' (BatchNormalization): attribute 'training_mode': is 1"}, true);
  }
  {
    std::map<std::string, Tensor> w;
    Model m = conv_bn_model("Relu", w);
    m.g().mutable_node(1)->mutable_attribute(0)->set_f(NAN);
    check_import_error(
        [&] { m.load(); },
        {"node 'bn' (BatchNormalization): attribute 'epsilon': is nan, expected a finite"});
  }
  {
    std::map<std::string, Tensor> w;
    Model m = conv_bn_model("Relu", w);
    set_s(*m.g().mutable_node(0), "auto_pad", "SAME");
    check_import_error([&] { m.load(); }, {"node 'c' (Conv): attribute 'auto_pad': is 'SAME'"});
  }
  {
    std::map<std::string, Tensor> w;
    Model m = conv_bn_model("Relu", w);
    set_i(*m.g().mutable_node(0), "foo", 1);
    check_import_error([&] { m.load(); }, {"node 'c' (Conv): attribute 'foo': is not supported"},
                       true);
  }
  {
    Model m;
    m.input("x", {1, 1, 4, 4});
    auto& mp = m.node("MaxPool", {"x"}, {"y", "idx"}, "mp");
    set_ints(mp, "kernel_shape", {2, 2});
    m.output("y");
    // The indices named but read by nothing are left out.
    CHECK(m.load().nodes.size() == 1);
    m.output("idx");
    check_import_error([&] { m.load(); }, {"node 'mp' (MaxPool): output 1 ('idx'"}, true);
    m.g().mutable_output()->RemoveLast();
    m.g().mutable_node(0)->mutable_output()->RemoveLast();
    set_i(*m.g().mutable_node(0), "storage_order", 1);
    check_import_error([&] { m.load(); }, {"node 'mp' (MaxPool): attribute 'storage_order'"}, true);
    m.g().mutable_node(0)->mutable_attribute()->RemoveLast();
    set_ints(*m.g().mutable_node(0), "dilations", {2, 2});
    check_import_error([&] { m.load(); }, {"node 'mp' (MaxPool): attribute 'dilations'"}, true);
  }
  {
    Model m;
    m.input("x", {2, 2});
    TensorProto& t = m.init("w", {2}, {});
    t.clear_raw_data();
    t.set_data_type(TensorProto::DOUBLE);
    t.add_double_data(1);
    t.add_double_data(2);
    m.node("Mul", {"x", "w"}, {"y"}, "mul");
    m.output("y");
    check_import_error([&] { m.load(); },
                       {"m.onnx: initializer 'w': dtype DOUBLE is not supported"}, true);
  }
  {
    Model m;
    m.input("x", {2, 2}, TensorProto::INT64);
    m.node("Relu", {"x"}, {"y"});
    m.output("y");
    check_import_error([&] { m.load(); }, {"graph input 'x' is INT64", "float32"}, true);
  }
  {
    Model m(22);
    check_import_error([&] { m.load(); }, {"opset 22 is not supported", "6 to 21"}, true);
  }
}

TEST_CASE("onnx: constant folding refuses what has no value", "[onnx]") {
  auto model = [](const std::string& op, const std::vector<int64_t>& a,
                  const std::vector<int64_t>& b) {
    Model m;
    m.input("x", {2, 3});
    m.ints("a", a);
    m.ints("b", b);
    m.node(op, {"a", "b"}, {"c"}, "fold");
    m.node("Reshape", {"x", "c"}, {"y"}, "view");
    m.output("y");
    return m;
  };
  check_import_error([&] { model("Div", {6}, {0}).load(); },
                     {"node 'fold' (Div): integer division by zero"});
  check_import_error([&] { model("Mul", {int64_t(1) << 62}, {4}).load(); },
                     {"node 'fold' (Mul): integer overflow"});
  check_import_error(
      [&] {
        model("Gather", {2, 3}, {2}).load();
      },
      {"node 'fold' (Gather): index 2 is out of range"});
  check_import_error(
      [&] {
        model("Add", {1, 5}, {0}).load();
      },
      {"node 'view' (Reshape): cannot reshape [2,3] (6 elements) to [1,5]"});
  // A backward slice of an empty constant is empty, and an empty output is unsupported.
  Model m;
  m.input("x", {2});
  TensorProto& e = m.init("e", {0, 2}, {});
  e.clear_raw_data();
  m.ints("starts", {-1});
  m.ints("ends", {-10});
  m.ints("axes", {0});
  m.ints("steps", {-1});
  m.node("Slice", {"e", "starts", "ends", "axes", "steps"}, {"y"}, "s");
  m.output("y");
  check_import_error([&] { m.load(); }, {"graph output 'y' is empty ([0,2])"}, true);
}

TEST_CASE("onnx: broken files get a clear error", "[onnx]") {
  std::map<std::string, Tensor> w;
  std::string bytes = conv_bn_model("Relu", w).bytes();
  for (size_t cut : {size_t(1), bytes.size() / 3, bytes.size() / 2, bytes.size() - 1}) {
    INFO("cut at " << cut);
    try {
      Graph g = parse_onnx(bytes.data(), cut, "cut.onnx", scratch().string());
      FAIL("a truncated file loaded");
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Catch::StartsWith("cut.onnx: "));
    }
  }
  check_import_error(
      [&] {
        std::string half = bytes.substr(0, bytes.size() / 2);
        parse_onnx(half.data(), half.size(), "cut.onnx", "");
      },
      {"cut.onnx"});
  std::string garbage = "{\"format\": \"epilog\"} this is not a protobuf \xff\xfe";
  check_import_error([&] { parse_onnx(garbage.data(), garbage.size(), "g.onnx", ""); },
                     {"g.onnx: not a valid ONNX model"});
  check_import_error([&] { parse_onnx("", 0, "empty.onnx", ""); }, {"empty.onnx", "no graph"});
  check_import_error([&] { load_onnx((scratch() / "nope.onnx").string()); },
                     {"nope.onnx", "cannot open"});

  Model m;
  m.input("x", {2, 2});
  TensorProto& t = m.init("w", {2, 2}, {1, 2, 3});
  m.node("Mul", {"x", "w"}, {"y"}, "mul");
  m.output("y");
  check_import_error([&] { m.load(); }, {"initializer 'w': holds 12 bytes of data, expected 16"});
  t.mutable_raw_data()->append(4, '\0');
  m.g().mutable_node(0)->set_input(1, "v");
  check_import_error([&] { m.load(); }, {"node 'mul' (Mul): input 'v' is not defined"});
  LoadOptions o;
  o.weights_file = "w.safetensors";
  check_import_error([&] { m.load(o); }, {"w.safetensors", "JSON models"});
}

TEST_CASE("onnx: the CLI runs and dumps an ONNX model", "[onnx][cli]") {
  std::map<std::string, Tensor> w;
  std::string path = conv_bn_model("Relu", w).save("cli.onnx");
  std::string out = (scratch() / "dump.txt").string();
  std::string cmd =
      fmt::format("'{}' dump '{}' --stage source > '{}' 2>&1", test::cli_path(), path, out);
  CHECK(std::system(cmd.c_str()) == 0);
  std::ifstream f(out);
  std::string text((std::istreambuf_iterator<char>(f)), {});
  CHECK_THAT(text, Contains("conv2d(%x, @c.weight)") && Contains("{eps=0.001}"));
  cmd = fmt::format("'{}' run '{}' --device cpu > '{}' 2>&1", test::cli_path(), path, out);
  CHECK(std::system(cmd.c_str()) == 0);
}

TEST_CASE("onnx: bench sweeps the batch sizes of a model with a symbolic batch dim",
          "[onnx][cli]") {
  // Exported with a dynamic batch: --batch 1,3 loads it at the first size and plans each.
  Model m;
  m.input("x", {-1, 3});
  m.node("Relu", {"x"}, {"y"});
  m.output("y");
  const std::string path = m.save("dynamic_batch.onnx");
  const std::string out = (scratch() / "sweep.txt").string();
  const std::string cmd =
      fmt::format("'{}' bench '{}' --device cpu --batch 1,3 --iters 2 --warmup 0 > '{}' 2>&1",
                  test::cli_path(), path, out);
  const int rc = std::system(cmd.c_str());
  std::ifstream f(out);
  const std::string text((std::istreambuf_iterator<char>(f)), {});
  INFO(text);
  CHECK(rc == 0);
  CHECK_THAT(text, Contains("batch 1 ") && Contains("batch 3 "));
}

TEST_CASE("onnx: --batch rebinds a reshape that carries the exported batch (channel shuffle)",
          "[onnx]") {
  // shufflenet as exported at batch 1: Reshape to [1, 2, 3, 2, 2], Transpose, Reshape back.
  Model m;
  m.input("x", {1, 6, 2, 2});
  m.ints("split", {1, 2, 3, 2, 2});
  m.ints("back", {1, 6, 2, 2});
  m.node("Reshape", {"x", "split"}, {"r"}, "r1");
  set_ints(m.node("Transpose", {"r"}, {"t"}, "tr"), "perm", {0, 2, 1, 3, 4});
  m.node("Reshape", {"t", "back"}, {"y"}, "r2");
  m.output("y");
  LoadOptions o;
  o.batch = 3;
  const Graph g = m.load(o);
  CHECK(g.value("y").shape == Shape{3, 6, 2, 2});
  // Each image shuffled as the batch-1 file shuffles one: channel c of y is channel
  // (c % 2) * 3 + c / 2 of x.
  Tensor x = Tensor::empty({3, 6, 2, 2});
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = float(i);
  const Tensor y = test::run_cpu(g, {{"x", x}}).at("y");
  for (int64_t img = 0; img < 3; ++img)
    for (int64_t c = 0; c < 6; ++c)
      CHECK(y.f32()[(img * 6 + c) * 4] == x.f32()[(img * 6 + (c % 2) * 3 + c / 2) * 4]);
  // The dynamo exporter's flatten before the classifier: Reshape to [1, C] with allowzero = 1
  // (a 0 would be a zero dim, not the input's).
  Model f(18);
  f.input("x", {1, 6, 1, 1});
  f.ints("flat", {1, 6});
  set_i(f.node("Reshape", {"x", "flat"}, {"y"}, "view"), "allowzero", 1);
  f.output("y");
  CHECK(f.load(o).value("y").shape == Shape{3, 6});
  // timm's ResNeSt: x.reshape(batch, -1) with the batch traced as 1 keeps the batch, not
  // [1, 3 * 8]; the reshape after it to [1, 2, 4, 1, 1] then finds [3, 8, 1, 1].
  Model r;
  r.input("x", {1, 2, 4});
  r.ints("rows", {1, -1});
  r.ints("cols", {1, 8, 1, 1});
  r.ints("radix", {1, 2, 4, 1, 1});
  r.node("Reshape", {"x", "rows"}, {"a"}, "rows");
  r.node("Reshape", {"a", "cols"}, {"b"}, "cols");
  r.node("Reshape", {"b", "radix"}, {"y"}, "radix");
  r.output("y");
  const Graph rg = r.load(o);
  CHECK(rg.value("a").shape == Shape{3, 8});
  CHECK(rg.value("y").shape == Shape{3, 2, 4, 1, 1});
}

#endif  // EPILOG_HAVE_ONNX
