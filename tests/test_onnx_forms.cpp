// The ONNX forms of opsets 11 to 21 and of PyTorch's dynamo exporter (opset 18 and 20, weights
// in an external .onnx.data file): each form imported on its own, checked structurally and
// numerically (against hand-computed values or the older spelling of the same model), and the
// forms epilog refuses, each with one message naming the node and the op.
#ifdef EPILOG_HAVE_ONNX

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <tuple>

#include "epilog/graph/activation.h"
#include "epilog/graph/passes.h"
#include "onnx_model.h"

namespace {

using namespace epilog;
using namespace epilog::onnx_test;

// The mean of each [H, W] plane of x, [N, C].
std::vector<float> plane_means(const Tensor& x) {
  const Shape& s = x.shape();
  const int64_t plane = s[2] * s[3];
  std::vector<float> out;
  for (int64_t p = 0; p < s[0] * s[1]; ++p) {
    double sum = 0;
    for (int64_t k = 0; k < plane; ++k) sum += x.f32()[p * plane + k];
    out.push_back(float(sum / double(plane)));
  }
  return out;
}

void check_means(const Tensor& got, const Tensor& x) {
  std::vector<float> want = plane_means(x), have = values(got);
  REQUIRE(have.size() == want.size());
  for (size_t k = 0; k < want.size(); ++k) CHECK(have[k] == Approx(want[k]).epsilon(1e-5));
}

// x [1, 4, 3, 5] -> ReduceMean over `axes` (an attribute before opset 18, an input from then on).
Model reduce_mean_model(int64_t opset, const std::vector<int64_t>& axes, int64_t keepdims,
                        const Shape& x = {1, 4, 3, 5}) {
  Model m(opset);
  m.input("x", x);
  onnx::NodeProto* n;
  if (opset < 18) {
    n = &m.node("ReduceMean", {"x"}, {"y"}, "mean");
    set_ints(*n, "axes", axes);
  } else {
    m.ints("axes", axes);
    n = &m.node("ReduceMean", {"x", "axes"}, {"y"}, "mean");
  }
  set_i(*n, "keepdims", keepdims);
  m.output("y");
  return m;
}

}  // namespace

TEST_CASE("onnx forms: every opset from 11 to 21 loads", "[onnx]") {
  for (int64_t opset = 11; opset <= 21; ++opset) {
    INFO("opset " << opset);
    Model m(opset);
    m.input("x", {1, 2, 4, 4});
    m.random("w", {3, 2, 3, 3}, 1);
    set_ints(m.node("Conv", {"x", "w"}, {"c"}, "conv"), "pads", {1, 1, 1, 1});
    m.node("Relu", {"c"}, {"y"});
    m.output("y");
    CHECK(m.load().value("y").shape == Shape{1, 3, 4, 4});
  }
}

TEST_CASE("onnx forms: ReduceMean over H and W becomes global_avgpool", "[onnx][canonicalize]") {
  Tensor x = Tensor::randn({1, 4, 3, 5}, 7);
  // keepdims 1, axes [2, 3] as an attribute (opset 17) or [-2, -1] as an input (opset 18):
  // imported as reduce_mean, canonicalized to global_avgpool.
  for (auto [opset, axes] :
       {std::pair<int64_t, std::vector<int64_t>>{17, {2, 3}}, {18, {-2, -1}}, {20, {3, 2}}}) {
    INFO("opset " << opset);
    Graph g = reduce_mean_model(opset, axes, 1).load();
    CHECK(count(g, OpKind::ReduceMean) == 1);
    optimize(g);
    REQUIRE(g.nodes.size() == 1);
    CHECK(g.nodes[0].op == OpKind::GlobalAvgPool);
    CHECK(g.nodes[0].name == "mean");
    CHECK(g.value("y").shape == Shape{1, 4, 1, 1});
    check_means(run1(g, x), x);
  }
  // keepdims 0: global_avgpool, then a flatten.
  Graph g = reduce_mean_model(18, {2, 3}, 0).load();
  optimize(g);
  CHECK(count(g, OpKind::GlobalAvgPool) == 1);
  CHECK(count(g, OpKind::Flatten) == 1);
  CHECK(g.value("y").shape == Shape{1, 4});
  check_means(run1(g, x), x);

  // keepdims 0, then the flatten-like Reshape the exporters write: nothing more.
  Model m = reduce_mean_model(17, {2, 3}, 0);
  m.g().mutable_output()->Clear();
  m.g().mutable_node(0)->set_output(0, "pooled");
  m.ints("shape", {1, -1});
  m.node("Reshape", {"pooled", "shape"}, {"y"});
  m.output("y");
  g = m.load();
  optimize(g);
  CHECK(g.nodes.size() == 2);
  CHECK(g.value("y").shape == Shape{1, 4});
  check_means(run1(g, x), x);

  // noop_with_empty_axes and no axes: the input itself.
  Model noop(18);
  noop.input("x", {1, 4, 3, 5});
  auto& n = noop.node("ReduceMean", {"x"}, {"r"}, "mean");
  set_i(n, "noop_with_empty_axes", 1);
  noop.node("Relu", {"r"}, {"y"});
  noop.output("y");
  g = noop.load();
  REQUIRE(g.nodes.size() == 1);
  CHECK(g.nodes[0].inputs == std::vector<std::string>{"x"});
}

TEST_CASE("onnx forms: other ReduceMean forms are reduce_mean; malformed ones refused", "[onnx]") {
  const Tensor x = Tensor::randn({1, 4, 3, 5}, 8);
  for (auto [opset, axes] : {std::pair<int64_t, std::vector<int64_t>>{18, {1}}, {17, {1, 2}}}) {
    INFO("opset " << opset);
    Graph g = reduce_mean_model(opset, axes, 0).load();
    REQUIRE(count(g, OpKind::ReduceMean) == 1);
    const Tensor y = run1(g, x);
    CHECK(y.shape() == (axes.size() == 1 ? Shape{1, 3, 5} : Shape{1, 5}));
    // The first output: the mean over the reduced axes at index 0 of the kept ones.
    double sum = 0;
    for (int64_t c = 0; c < 4; ++c)
      for (int64_t h = 0; h < (axes.size() == 1 ? 1 : 3); ++h) sum += x.f32()[c * 15 + h * 5];
    CHECK(y.f32()[0] == Approx(sum / (axes.size() == 1 ? 4 : 12)).epsilon(1e-6));
  }
  // No axes: every axis.
  Model all(18);
  all.input("x", {1, 4, 3, 5});
  all.node("ReduceMean", {"x"}, {"y"}, "mean");
  all.output("y");
  CHECK(all.load().value("y").shape == Shape{1, 1, 1, 1});
  // Malformed: an axis twice, out of range, and axes as an attribute at opset 18.
  check_import_error(
      [] {
        reduce_mean_model(18, {2, -2}, 1).load();
      },
      {"node 'mean' (ReduceMean)", "axis -2 is given twice"});
  check_import_error(
      [] {
        reduce_mean_model(18, {2, 4}, 1).load();
      },
      {"node 'mean' (ReduceMean)", "axes value 4 is out of range for rank 4"});
  Model attr18 = reduce_mean_model(17, {2, 3}, 1);
  attr18.m.mutable_opset_import(0)->set_version(18);
  check_import_error([&] { attr18.load(); }, {"node 'mean' (ReduceMean): attribute 'axes'"}, true);
}

TEST_CASE("onnx forms: Split with num_outputs (opset 18)", "[onnx]") {
  Model m(18);
  m.input("x", {1, 5, 2, 2});
  auto& split = m.node("Split", {"x"}, {"a", "b"}, "chunk");
  set_i(split, "axis", 1);
  set_i(split, "num_outputs", 2);
  set_i(m.node("Concat", {"b", "a"}, {"y"}), "axis", 1);
  m.output("y");
  Graph g = m.load();
  REQUIRE(count(g, OpKind::Split) == 1);
  // ceil(5 / 2) = 3, and the rest.
  CHECK(g.value("a").shape == Shape{1, 3, 2, 2});
  CHECK(g.value("b").shape == Shape{1, 2, 2, 2});
  Tensor x = Tensor::randn({1, 5, 2, 2}, 5);
  std::vector<float> want = values(x);
  std::rotate(want.begin(), want.begin() + 12, want.end());
  CHECK(values(run1(g, x)) == want);

  onnx::AttributeProto& parts = *split.mutable_attribute(1);
  parts.set_i(3);
  check_import_error([&] { m.load(); },
                     {"node 'chunk' (Split): attribute 'num_outputs': is 3 for 2 outputs"});
  // 4 parts of 5: 2, 2, 2 and nothing left.
  split.add_output("c");
  split.add_output("d");
  parts.set_i(4);
  check_import_error([&] { m.load(); }, {"(Split): attribute 'num_outputs'", "last one empty"});
  split.mutable_output()->DeleteSubrange(2, 2);
  parts.set_i(2);
  m.ints("sizes", {3, 2});
  split.add_input("sizes");
  check_import_error([&] { m.load(); }, {"(Split): has both the 'split' input and 'num_outputs'"});
  // Before opset 18 there is no num_outputs.
  Model old(17);
  old.input("x", {1, 4, 2, 2});
  set_i(old.node("Split", {"x"}, {"a", "b"}, "chunk"), "num_outputs", 2);
  old.output("a");
  check_import_error([&] { old.load(); }, {"(Split): attribute 'num_outputs': is not supported"},
                     true);
}

TEST_CASE("onnx forms: Resize with axes, sizes policies and half_pixel_symmetric", "[onnx]") {
  Tensor x = Tensor::randn({1, 2, 3, 4}, 3);
  auto resize = [&](int64_t opset, const std::vector<float>& scales,
                    const std::vector<int64_t>& sizes) {
    Model m(opset);
    m.input("x", {1, 2, 3, 4});
    std::vector<std::string> ins = {"x", ""};
    if (!scales.empty()) {
      m.init("scales", {int64_t(scales.size())}, scales);
      ins.push_back("scales");
    } else {
      m.ints("sizes", sizes);
      ins.push_back("");
      ins.push_back("sizes");
    }
    m.node("Resize", ins, {"y"}, "up");
    m.output("y");
    return m;
  };
  // What the dynamo exporter writes for nn.Upsample(scale_factor=2): all four scales.
  Model m = resize(20, {1, 1, 2, 2}, {});
  auto& n = *m.g().mutable_node(0);
  set_s(n, "coordinate_transformation_mode", "asymmetric");
  set_s(n, "mode", "nearest");
  set_s(n, "nearest_mode", "floor");
  Graph ref = m.load();
  REQUIRE(ref.nodes.size() == 1);
  CHECK(ref.nodes[0].op == OpKind::UpsampleNearest);
  const Tensor want = run1(ref, x);
  CHECK(want.shape() == Shape{1, 2, 6, 8});

  // Scales for axes 2 and 3 only; half_pixel_symmetric; antialias (for linear modes only).
  m = resize(18, {2, 2}, {});
  set_ints(*m.g().mutable_node(0), "axes", {2, -1});
  set_i(*m.g().mutable_node(0), "antialias", 1);
  CHECK(test::bit_equal(run1(m.load(), x), want));
  m = resize(19, {1, 1, 2, 2}, {});
  set_s(*m.g().mutable_node(0), "coordinate_transformation_mode", "half_pixel_symmetric");
  CHECK(test::bit_equal(run1(m.load(), x), want));
  // Sizes for the listed axes, stretched or kept in aspect (not_larger: the smaller factor).
  m = resize(18, {}, {6, 8});
  set_ints(*m.g().mutable_node(0), "axes", {2, 3});
  CHECK(test::bit_equal(run1(m.load(), x), want));
  for (auto sizes : {std::vector<int64_t>{6, 12}, std::vector<int64_t>{7, 8}}) {
    m = resize(18, {}, sizes);
    set_ints(*m.g().mutable_node(0), "axes", {2, 3});
    set_s(*m.g().mutable_node(0), "keep_aspect_ratio_policy", "not_larger");
    CHECK(test::bit_equal(run1(m.load(), x), want));
  }
  m = resize(18, {}, {3, 8});
  set_ints(*m.g().mutable_node(0), "axes", {2, 3});
  set_s(*m.g().mutable_node(0), "keep_aspect_ratio_policy", "not_smaller");
  CHECK(test::bit_equal(run1(m.load(), x), want));
  // Sizes of all four axes, the batch the traced one (the dynamo exporter's): at another batch
  // the batch stays.
  m = resize(18, {}, {1, 2, 6, 8});
  LoadOptions at3;
  at3.batch = 3;
  CHECK(m.load(at3).value("y").shape == Shape{3, 2, 6, 8});

  // A scale that gives no whole size is refused; linear mode is a resize.
  m = resize(18, {1.5f, 2}, {});
  set_ints(*m.g().mutable_node(0), "axes", {2, 3});
  check_import_error([&] { m.load(); }, {"node 'up' (Resize)", "scale 1.5 of axis 2"}, true);
  m = resize(18, {1, 1, 2, 2}, {});
  set_s(*m.g().mutable_node(0), "mode", "linear");
  CHECK(count(m.load(), OpKind::Resize) == 1);
  m = resize(18, {2, 2}, {});
  check_import_error([&] { m.load(); }, {"(Resize): scales has 2 values for 4 axes"});
  // 'axes' is opset 18's.
  m = resize(17, {2, 2}, {});
  set_ints(*m.g().mutable_node(0), "axes", {2, 3});
  check_import_error([&] { m.load(); }, {"(Resize): attribute 'axes': is not supported"}, true);
}

TEST_CASE("onnx forms: Cast with saturate, CastLike, AveragePool with dilations", "[onnx]") {
  Model m(19);
  m.input("x", {1, 2, 4, 4});
  // CastLike of an integer constant to the float input's type, then to the shape's type.
  m.ints("two", {2});
  m.node("CastLike", {"two", "x"}, {"two_f"});
  m.node("Mul", {"x", "two_f"}, {"x2"});
  auto& cast = m.node("Cast", {"x2"}, {"x2f"});
  set_i(cast, "to", TensorProto::FLOAT);
  set_i(cast, "saturate", 1);
  auto& pool = m.node("AveragePool", {"x2f"}, {"y"}, "pool");
  set_ints(pool, "kernel_shape", {2, 2});
  set_ints(pool, "strides", {2, 2});
  set_ints(pool, "dilations", {1, 1});
  m.output("y");
  Graph g = m.load();
  CHECK(count(g, OpKind::AvgPool2d) == 1);
  Tensor x = Tensor::full({1, 2, 4, 4}, 1.5f);
  CHECK(values(run1(g, x)) == std::vector<float>(8, 3.0f));

  pool.mutable_attribute(2)->set_ints(0, 2);
  check_import_error([&] { m.load(); }, {"node 'pool' (AveragePool): attribute 'dilations'"}, true);
  // A run-time tensor cast to an integer type.
  Model c(19);
  c.input("x", {2});
  set_i(c.node("Cast", {"x"}, {"y"}, "cast"), "to", TensorProto::INT64);
  c.output("y");
  check_import_error([&] { c.load(); }, {"node 'cast' (Cast): casts a run-time tensor to INT64"},
                     true);
}

namespace {

// conv -> batchnorm (unfolded) -> relu -> maxpool -> Identity chain -> Split -> Concat (the
// halves swapped) -> mean over H and W -> flatten -> MatMul + Add, with one initializer shared
// by two Muls. `dynamo`: as PyTorch's dynamo exporter writes it (opset 20, IR 10, node names
// node_<Op>_<k>, value names with '::', MaxPool's indices named, Split with num_outputs,
// Constant value_ints, ReduceMean with axes as an input and keepdims 0, Reshape with
// allowzero); else the opset-17 spellings (GlobalAveragePool + Flatten, Split sizes).
Model convnet_model(bool dynamo) {
  Model m(dynamo ? 20 : 17);
  if (dynamo) m.m.set_ir_version(10);
  m.input("x", {2, 3, 8, 8});
  m.random("conv1.weight", {4, 3, 3, 3}, 1);
  m.random("bn1.weight", {4}, 2);
  m.random("bn1.bias", {4}, 3);
  m.random("bn1.running_mean", {4}, 4);
  m.init("bn1.running_var", {4}, {0.5f, 1.0f, 1.5f, 2.0f});
  m.random("fc.weight.T", {4, 5}, 5);
  m.random("fc.bias", {5}, 6);
  m.init("scale", {}, {0.5f});
  auto& conv = m.node("Conv", {"x", "conv1.weight"}, {"conv2d"}, "node_Conv_0");
  set_ints(conv, "pads", {1, 1, 1, 1});
  set_ints(conv, "strides", {1, 1});
  set_ints(conv, "dilations", {1, 1});
  set_i(conv, "group", 1);
  set_s(conv, "auto_pad", "NOTSET");
  const std::string bn_out = dynamo ? "_native_batch_norm_legit_no_training::0" : "bn";
  auto& bn = m.node("BatchNormalization",
                    {"conv2d", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var"},
                    {bn_out}, "node_BatchNormalization_1");
  set_f(bn, "epsilon", 1e-5f);
  set_f(bn, "momentum", 0.9f);
  set_i(bn, "training_mode", 0);
  m.node("Relu", {bn_out}, {"relu"}, "node_Relu_2");
  // max_pool2d_with_indices: the indices named, read by nothing.
  std::vector<std::string> pool_out = {"pool"};
  if (dynamo) pool_out.push_back("max_pool2d_with_indices::1");
  auto& pool = m.node("MaxPool", {"relu"}, pool_out, "node_MaxPool_2");
  set_ints(pool, "kernel_shape", {2, 2});
  set_ints(pool, "strides", {2, 2});
  m.node("Mul", {"pool", "scale"}, {"relu_scaled"}, "node_Mul_3");
  m.node("Identity", {"relu_scaled"}, {"val_0"}, "node_Identity_4");
  m.node("Identity", {"val_0"}, {"val_1"}, "node_Identity_5");
  auto& split = m.node("Split", {"val_1"}, {"split::0", "split::1"}, "node_Split_6");
  set_i(split, "axis", 1);
  if (dynamo) {
    set_i(split, "num_outputs", 2);
  } else {
    m.ints("sizes", {2, 2});
    split.add_input("sizes");
  }
  set_i(m.node("Concat", {"split::1", "split::0"}, {"cat"}, "node_Concat_7"), "axis", 1);
  if (dynamo) {
    set_ints(m.node("Constant", {}, {"val_axes"}, "node_Constant_8"), "value_ints", {-1, -2});
    set_i(m.node("ReduceMean", {"cat", "val_axes"}, {"mean"}, "node_ReduceMean_9"), "keepdims", 0);
    set_ints(m.node("Constant", {}, {"val_shape"}, "node_Constant_10"), "value_ints", {2, -1});
    set_i(m.node("Reshape", {"mean", "val_shape"}, {"view"}, "node_Reshape_11"), "allowzero", 1);
  } else {
    m.node("GlobalAveragePool", {"cat"}, {"pooled"});
    m.node("Flatten", {"pooled"}, {"view"});
  }
  m.node("MatMul", {"view", "fc.weight.T"}, {"mm"}, "node_MatMul_12");
  m.node("Add", {"mm", "fc.bias"}, {"addmm"}, "node_Add_13");
  m.node("Mul", {"addmm", "scale"}, {"y"}, "node_Mul_14");
  m.output("y");
  auto* shape = m.g().mutable_output(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
  shape->add_dim()->set_dim_value(2);
  shape->add_dim()->set_dim_value(5);
  return m;
}

// Moves every initializer to one data file, at 64-byte aligned offsets as the exporter writes
// them; returns the file's bytes.
std::string externalize(Model& m, const std::string& location) {
  std::string data;
  for (TensorProto& t : *m.g().mutable_initializer()) {
    data.resize((data.size() + 63) / 64 * 64, '\0');
    const size_t offset = data.size();
    data += t.raw_data();
    t.clear_raw_data();
    t.set_data_location(TensorProto::EXTERNAL);
    for (auto [key, value] : {std::pair<std::string, std::string>{"location", location},
                              {"offset", std::to_string(offset)},
                              {"length", std::to_string(data.size() - offset)}}) {
      auto* e = t.add_external_data();
      e->set_key(key);
      e->set_value(value);
    }
  }
  return data;
}

}  // namespace

TEST_CASE("onnx forms: a model as PyTorch's dynamo exporter writes it, weights external",
          "[onnx]") {
  Model m = convnet_model(true);
  const Graph internal = m.load();
  const fs::path dir = scratch() / "dynamo";
  fs::create_directories(dir);
  const std::string data = externalize(m, "model.onnx.data");
  std::ofstream(dir / "model.onnx.data", std::ios::binary) << data;
  const std::string path = (dir / "model.onnx").string();
  std::ofstream(path, std::ios::binary) << m.bytes();
  Graph g = load_onnx(path);

  CHECK(g.nodes[0].name == "node_Conv_0");
  CHECK(count(g, OpKind::BatchNorm) == 1);
  CHECK(count(g, OpKind::Split) == 1);
  CHECK(count(g, OpKind::ReduceMean) == 1);  // global_avgpool once canonicalized
  CHECK(count(g, OpKind::Linear) == 1);
  CHECK(g.value("_native_batch_norm_legit_no_training::0").shape == Shape{2, 4, 8, 8});
  CHECK(g.weights.count("scale") == 1);  // one weight for both readers
  Tensor x = Tensor::randn({2, 3, 8, 8}, 9);
  const Tensor y = run1(g, x);
  CHECK(y.shape() == Shape{2, 5});
  CHECK(test::bit_equal(y, run1(internal, x)));
  // The same as the opset-17 spellings compute.
  CHECK(test::max_rel_err(y, run1(convnet_model(false).load(), x)) < 1e-6);
  // And after the passes: batchnorm folded, relu fused, the mean a global_avgpool.
  optimize(g);
  CHECK(count(g, OpKind::BatchNorm) == 0);
  CHECK(count(g, OpKind::GlobalAvgPool) == 1);
  CHECK(count(g, OpKind::Relu) == 0);
  CHECK(test::max_rel_err(run1(g, x), y) < 1e-5);

  // The data file must hold every tensor, and stay in the model's folder.
  std::ofstream(dir / "model.onnx.data", std::ios::binary) << data.substr(0, data.size() - 4);
  check_import_error([&] { load_onnx(path); },
                     {"model.onnx: initializer 'scale': external data", "model.onnx.data",
                      "has " + std::to_string(data.size() - 4) + " bytes"});
  fs::remove(dir / "model.onnx.data");
  check_import_error([&] { load_onnx(path); },
                     {"model.onnx: initializer", "model.onnx.data", "does not exist"});
  const fs::path outside = scratch() / "outside.data";
  std::ofstream(outside, std::ios::binary) << data;
  fs::create_symlink(outside, dir / "model.onnx.data");
  check_import_error([&] { load_onnx(path); },
                     {"model.onnx: initializer", "lies outside the model's folder"});
}

TEST_CASE("onnx forms: Sum and Mean become adds (and a mul by 1/n)", "[onnx]") {
  Model m;
  m.input("a", {2, 3});
  m.input("b", {2, 3});
  m.init("c", {3}, {1.0f, 2.0f, 3.0f});
  m.init("d", {3}, {3.0f, 2.0f, 1.0f});
  m.node("Sum", {"c", "d"}, {"cd"});  // folded: [4, 4, 4]
  m.node("Sum", {"a", "b", "cd"}, {"s"}, "sum");
  m.node("Mean", {"a", "b", "cd"}, {"y"}, "mean");
  m.output("s");
  m.output("y");
  Graph g = m.load();
  CHECK(count(g, OpKind::Add) == 4);
  CHECK(count(g, OpKind::Mul) == 1);
  CHECK(g.nodes[0].name == "sum");
  CHECK(g.nodes[1].name == "sum.add2");
  Tensor a = Tensor::randn({2, 3}, 1), b = Tensor::randn({2, 3}, 2);
  auto out = test::run_cpu(g, {{"a", a}, {"b", b}});
  for (int64_t k = 0; k < 6; ++k) {
    const float sum = a.f32()[k] + b.f32()[k] + 4.0f;
    CHECK(out.at("s").f32()[k] == Approx(sum));
    CHECK(out.at("y").f32()[k] == Approx(sum / 3));
  }
}

TEST_CASE("onnx forms: Dropout at inference is its input", "[onnx]") {
  for (int64_t opset : {11, 13}) {
    INFO("opset " << opset);
    Model m(opset);
    m.input("x", {1, 4});
    std::vector<std::string> ins = {"x"};
    if (opset >= 12) {
      m.init("ratio", {}, {0.3f});
      TensorProto& t = m.ints("training", {0});
      t.clear_dims();
      t.set_data_type(TensorProto::BOOL);
      t.clear_int64_data();
      t.add_int32_data(0);
      ins = {"x", "ratio", "training"};
    }
    auto& d = m.node("Dropout", ins, {"d"}, "drop");
    m.node("Relu", {"d"}, {"y"});
    m.output("y");
    Graph g = m.load();
    REQUIRE(g.nodes.size() == 1);
    CHECK(g.nodes[0].inputs == std::vector<std::string>{"x"});
    // A mask that nothing reads is left out; one that is read is refused.
    d.add_output("mask");
    CHECK(m.load().nodes.size() == 1);
    m.output("mask");
    check_import_error([&] { m.load(); }, {"node 'drop' (Dropout): output 1 ('mask'"}, true);
    m.g().mutable_output()->RemoveLast();
    if (opset < 12) continue;
    d.mutable_output()->RemoveLast();
    m.g().mutable_initializer()->rbegin()->set_int32_data(0, 1);
    check_import_error([&] { m.load(); },
                       {"node 'drop' (Dropout): is in training mode with ratio 0.3"}, true);
  }
}

TEST_CASE("onnx forms: the activation ops import as the op of the same name, with parameters",
          "[onnx]") {
  struct Case {
    const char* onnx;
    OpKind op;
    std::vector<std::pair<const char*, float>> attrs;  // set on the ONNX node, read back
  };
  const std::vector<Case> cases = {
      {"LeakyRelu", OpKind::LeakyRelu, {{"alpha", 0.2f}}},
      {"HardSigmoid", OpKind::HardSigmoid, {{"alpha", 0.25f}, {"beta", 0.4f}}},
      {"HardSwish", OpKind::HardSwish, {}},
      {"Tanh", OpKind::Tanh, {}},
      {"Mish", OpKind::Mish, {}},
      {"Softplus", OpKind::Softplus, {}},
      {"Elu", OpKind::Elu, {{"alpha", 0.5f}}},
      {"Exp", OpKind::Exp, {}},
      {"Erf", OpKind::Erf, {}},
      {"Abs", OpKind::Abs, {}},
      {"Neg", OpKind::Neg, {}},
      {"Gelu", OpKind::Gelu, {}},
  };
  Tensor x = Tensor::randn({1, 2, 3, 3}, 5);
  for (const Case& c : cases) {
    INFO(c.onnx);
    Model m(20);
    m.input("x", {1, 2, 3, 3});
    auto& n = m.node(c.onnx, {"x"}, {"y"}, "act");
    for (const auto& [name, v] : c.attrs) set_f(n, name, v);
    m.output("y");
    Graph g = m.load();
    REQUIRE(g.nodes.size() == 1);
    CHECK(g.nodes[0].op == c.op);
    for (const auto& [name, v] : c.attrs) CHECK(g.nodes[0].attrs.f(name) == Approx(v));
    // The CPU reference runs it as the activation it names.
    const Act act = *node_activation(g.nodes[0]);
    std::vector<float> want = values(x);
    for (float& v : want) v = activate(act, v);
    CHECK(values(run1(g, x)) == want);
  }
  // LeakyRelu's default alpha is ONNX's 0.01; Pow takes a constant exponent only.
  Model m(17);
  m.input("x", {1, 2, 3, 3});
  m.node("LeakyRelu", {"x"}, {"y"}, "act");
  m.output("y");
  CHECK(m.load().nodes[0].attrs.f("alpha") == Approx(0.01));
  Model p(17);
  p.input("x", {1, 2, 3, 3});
  p.input("e", {1});
  p.node("Pow", {"x", "e"}, {"y"}, "pow");
  p.output("y");
  check_import_error([&] { p.load(); }, {"node 'pow' (Pow)", "'e'", "constant"}, true);
}

TEST_CASE("onnx forms: PRelu (one slope, a slope per channel) and Selu after a conv", "[onnx]") {
  // x -> Conv -> PRelu(slope of `slope_dims`) or Selu -> y, on the CPU against the formula.
  // Slopes 0.05, 0.15, ... (below 1: max(x, slope * x)); `step` 1 makes 0.05, 1.05, 2.05, 3.05
  // (both sides of 1: x + (slope - 1) * min(x, 0)).
  const auto build = [](const std::string& op, const Shape& slope_dims, int64_t opset = 17,
                        float step = 0.1f) {
    Model m(opset);
    m.input("x", {2, 3, 5, 5});
    m.random("w", {4, 3, 3, 3}, 7);
    m.node("Conv", {"x", "w"}, {"c"}, "conv");
    if (op == "PRelu") {
      int64_t n = 1;
      for (int64_t d : slope_dims) n *= d;
      std::vector<float> slope;
      for (int64_t i = 0; i < n; ++i) slope.push_back(0.05f + step * float(i));
      m.init("slope", slope_dims, slope);
      m.node("PRelu", {"c", "slope"}, {"y"}, "act");
    } else {
      m.node("Selu", {"c"}, {"y"}, "act");
    }
    m.output("y");
    return m;
  };
  const Tensor x = Tensor::randn({2, 3, 5, 5}, 8);
  const auto check = [&](const Model& m, const std::function<float(float, int64_t)>& f) {
    Graph g = m.load();
    const Tensor got = run1(g, x);
    // The conv alone, then the formula per element (channel c).
    Graph c = m.load();
    c.outputs = {"c"};
    const Tensor conv = run1(c, x, "x", "c");
    REQUIRE(got.shape() == conv.shape());
    for (int64_t i = 0; i < conv.numel(); ++i) {
      const int64_t ch = i / 9 % 4;  // conv [2, 4, 3, 3]
      CHECK(got.f32()[i] == Approx(f(conv.f32()[i], ch)).margin(1e-6));
    }
    optimize(g);
    return g;
  };
  // One slope: leaky_relu, fused into the conv.
  Graph g = check(build("PRelu", {1}), [](float v, int64_t) { return v >= 0 ? v : 0.05f * v; });
  CHECK(count(g, OpKind::FusedConv2d) == 1);
  CHECK(g.nodes.size() == 1);
  // A slope per channel ([C, 1, 1] as PyTorch exports it; [C] before opset 7): one elementwise
  // kernel after the conv.
  const auto per_channel = [](float v, int64_t c) { return v >= 0 ? v : (0.05f + 0.1f * c) * v; };
  g = check(build("PRelu", {4, 1, 1}), per_channel);
  CHECK(count(g, OpKind::FusedConv2d) == 1);
  CHECK(count(g, OpKind::FusedElementwise) == 1);
  CHECK(g.nodes.size() == 2);
  check(build("PRelu", {4}, 6), per_channel);
  g = check(build("PRelu", {4, 1, 1}, 17, 1.0f),
            [](float v, int64_t c) { return v >= 0 ? v : (0.05f + 1.0f * c) * v; });
  CHECK(count(g, OpKind::FusedElementwise) == 1);
  // Selu: gamma * elu(x, alpha) with ONNX's defaults.
  check(build("Selu", {}), [](float v, int64_t) {
    return 1.0507010221f * (v > 0 ? v : 1.6732631921f * (std::exp(v) - 1.0f));
  });
  // A slope that does not broadcast to x, and one known only at run time.
  check_import_error([&] { build("PRelu", {5, 1, 1}).load(); },
                     {"node 'act' (PRelu)", "slope [5,1,1] does not broadcast to x [2,4,3,3]"});
  Model r(17);
  r.input("x", {1, 4, 3, 3});
  r.input("slope", {4, 1, 1});
  r.node("PRelu", {"x", "slope"}, {"y"}, "act");
  r.output("y");
  check_import_error([&] { r.load(); }, {"node 'act' (PRelu)", "'slope'", "constant"}, true);
}

TEST_CASE("onnx forms: Tile of a run-time tensor and of a constant", "[onnx]") {
  // y[i] = x[i mod dims], against the formula; the run-time form is a broadcasting add and two
  // views a tiled dim, one dim deeper than x at most.
  const auto tiled = [](const Tensor& x, const std::vector<int64_t>& idx) {
    int64_t at = 0;
    for (size_t d = 0; d < idx.size(); ++d) at = at * x.dim(int(d)) + idx[d] % x.dim(int(d));
    return x.f32()[at];
  };
  for (const Shape& reps :
       {Shape{1, 1, 2, 3}, Shape{2, 1, 1, 1}, Shape{1, 3, 1, 2}, Shape{1, 1, 1, 1}}) {
    INFO(shape_str(reps));
    Model m(17);
    m.input("x", {2, 3, 2, 4});
    m.ints("reps", reps);
    m.node("Tile", {"x", "reps"}, {"y"}, "tile");
    m.output("y");
    const Graph g = m.load();
    const Tensor x = Tensor::randn({2, 3, 2, 4}, 5);
    const Tensor y = run1(g, x);
    REQUIRE(y.shape() == Shape{2 * reps[0], 3 * reps[1], 2 * reps[2], 4 * reps[3]});
    for (int64_t i = 0; i < y.numel(); ++i) {
      std::vector<int64_t> idx(4);
      for (int d = 3, r = int(i); d >= 0; r /= int(y.dim(d)), --d) idx[size_t(d)] = r % y.dim(d);
      CHECK(y.f32()[i] == tiled(x, idx));
    }
    for (const Node& n : g.nodes) CHECK(g.value(n.outputs[0]).shape.size() <= 5);
  }
  // A constant folds: Tile of [[1, 2]] by [2, 2] added to x [2, 4].
  Model c(17);
  c.input("x", {2, 4});
  c.init("row", {1, 2}, {1.0f, 2.0f});
  c.ints("reps", {2, 2});
  c.node("Tile", {"row", "reps"}, {"t"});
  c.node("Add", {"x", "t"}, {"y"});
  c.output("y");
  const Graph g = c.load();
  CHECK(g.nodes.size() == 1);
  const Tensor x = Tensor::randn({2, 4}, 6);
  const Tensor y = run1(g, x);
  for (int64_t i = 0; i < 8; ++i) CHECK(y.f32()[i] == x.f32()[i] + float(i % 2 + 1));
  Model bad(17);
  bad.input("x", {2, 4});
  bad.ints("reps", {2});
  bad.node("Tile", {"x", "reps"}, {"y"}, "tile");
  bad.output("y");
  check_import_error([&] { bad.load(); },
                     {"node 'tile' (Tile)", "repeats has 1 values for an input of 2 dims"});
  for (const int64_t r : {int64_t(6148914691236517206), int64_t(1) << 36}) {
    Model huge(17);
    huge.input("x", {3, 1});
    huge.ints("reps", {r, 1});
    huge.node("Tile", {"x", "reps"}, {"y"}, "tile");
    huge.output("y");
    check_import_error([&] { huge.load(); }, {"node 'tile' (Tile)", "larger than epilog's dims"},
                       true);
  }
}

TEST_CASE("onnx forms: 1-D Conv, ConvTranspose and pools run as 2-D on rows of one", "[onnx]") {
  // x [2, 4, 11] -> Conv(k 3, stride 2, pads 1/2, dilation 2, 2 groups) -> Relu -> MaxPool(k 2)
  // -> AveragePool(k 2, pads 1/0); the same as 2-D ops on x [2, 4, 1, 11].
  const auto build = [](bool line) {
    const auto dims = [&](std::vector<int64_t> v) {
      if (!line) v.insert(v.end() - 1, 1);
      return v;
    };
    Model m(17);
    m.input("x", dims({2, 4, 11}));
    m.random("w", dims({6, 2, 3}), 9);
    m.random("b", {6}, 10);
    auto& conv = m.node("Conv", {"x", "w", "b"}, {"c"}, "conv");
    set_ints(conv, "strides", line ? std::vector<int64_t>{2} : std::vector<int64_t>{1, 2});
    set_ints(conv, "dilations", line ? std::vector<int64_t>{2} : std::vector<int64_t>{1, 2});
    set_ints(conv, "pads", line ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{0, 1, 0, 2});
    set_i(conv, "group", 2);
    m.node("Relu", {"c"}, {"r"}, "act");
    set_ints(m.node("MaxPool", {"r"}, {"p"}, "max"), "kernel_shape",
             line ? std::vector<int64_t>{2} : std::vector<int64_t>{1, 2});
    auto& avg = m.node("AveragePool", {"p"}, {"y"}, "avg");
    set_ints(avg, "kernel_shape", line ? std::vector<int64_t>{2} : std::vector<int64_t>{1, 2});
    set_ints(avg, "pads", line ? std::vector<int64_t>{1, 0} : std::vector<int64_t>{0, 1, 0, 0});
    m.output("y");
    return m.load();
  };
  Graph line = build(true);
  const Graph plane = build(false);
  const Tensor x = Tensor::randn({2, 4, 11}, 11);
  const Tensor got = run1(line, x), want = run1(plane, x.reshape({2, 4, 1, 11}));
  REQUIRE(got.shape() == Shape{2, 6, 4});
  CHECK(values(got) == values(want));
  // The relu passes the view back to 1-D and fuses into the conv.
  optimize(line);
  CHECK(count(line, OpKind::FusedConv2d) == 1);
  CHECK(count(line, OpKind::Relu) == 0);
  CHECK(count(line, OpKind::MaxPool2d) == 1);
  CHECK(count(line, OpKind::AvgPool2d) == 1);
  // ConvTranspose (k 4, stride 2, pads 1/1, output_padding 1) likewise.
  const auto transposed = [](bool line) {
    const auto list = [&](std::vector<int64_t> one, std::vector<int64_t> two) {
      return line ? one : two;
    };
    Model m(17);
    m.input("x", list({2, 3, 7}, {2, 3, 1, 7}));
    m.random("w", list({3, 4, 4}, {3, 4, 1, 4}), 15);
    auto& ct = m.node("ConvTranspose", {"x", "w"}, {"y"}, "up");
    set_ints(ct, "strides", list({2}, {1, 2}));
    set_ints(ct, "pads", list({1, 1}, {0, 1, 0, 1}));
    set_ints(ct, "output_padding", list({1}, {0, 1}));
    m.output("y");
    return m.load();
  };
  const Tensor tx = Tensor::randn({2, 3, 7}, 16);
  const Tensor ty = run1(transposed(true), tx);
  REQUIRE(ty.shape() == Shape{2, 4, 15});
  CHECK(values(ty) == values(run1(transposed(false), tx.reshape({2, 3, 1, 7}))));
  // ECA (timm's EcaModule): the channels' means as a row [N, 1, C], a conv of k 3 across the
  // channels, sigmoid, back to [N, C, 1, 1] as x's gate.
  Model eca(18);  // ReduceMean's axes an input
  eca.input("x", {2, 8, 3, 3});
  eca.ints("hw", {2, 3});
  eca.ints("row", {2, 1, -1});
  eca.ints("gate", {2, -1, 1, 1});
  const Tensor k = eca.random("k", {1, 1, 3}, 14);
  set_i(eca.node("ReduceMean", {"x", "hw"}, {"m"}, "mean"), "keepdims", 0);
  eca.node("Reshape", {"m", "row"}, {"r"}, "row");
  set_ints(eca.node("Conv", {"r", "k"}, {"c"}, "conv"), "pads", {1, 1});
  eca.node("Sigmoid", {"c"}, {"s"}, "sigmoid");
  eca.node("Reshape", {"s", "gate"}, {"g"}, "gate");
  eca.node("Mul", {"x", "g"}, {"y"}, "scale");
  eca.output("y");
  const Tensor ex = Tensor::randn({2, 8, 3, 3}, 15);
  const Tensor ey = run1(eca.load(), ex);
  for (int64_t n = 0; n < 2; ++n) {
    std::vector<double> mean(8, 0.0);
    for (int64_t c = 0; c < 8; ++c)
      for (int64_t i = 0; i < 9; ++i) mean[size_t(c)] += ex.f32()[(n * 8 + c) * 9 + i] / 9.0;
    for (int64_t c = 0; c < 8; ++c) {
      double z = 0;
      for (int64_t t = 0; t < 3; ++t)
        if (c + t - 1 >= 0 && c + t - 1 < 8) z += k.f32()[t] * mean[size_t(c + t - 1)];
      const double gate = 1.0 / (1.0 + std::exp(-z));
      for (int64_t i = 0; i < 9; ++i) {
        const int64_t at = (n * 8 + c) * 9 + i;
        CHECK(ey.f32()[at] == Approx(ex.f32()[at] * gate).epsilon(1e-5).margin(1e-6));
      }
    }
  }
  // A 1-D node's lists have one value; 3-D convs are refused by name.
  Model bad(17);
  bad.input("x", {1, 2, 8});
  bad.random("w", {2, 2, 3}, 12);
  set_ints(bad.node("Conv", {"x", "w"}, {"y"}, "conv"), "strides", {1, 1});
  bad.output("y");
  check_import_error([&] { bad.load(); },
                     {"node 'conv' (Conv)", "'strides'", "2 values, expected 1"});
  Model four(17);
  four.input("x", {1, 2, 8});
  four.random("w", {2, 2, 1, 3}, 12);
  four.node("Conv", {"x", "w"}, {"y"}, "conv");
  four.output("y");
  check_import_error([&] { four.load(); },
                     {"node 'conv' (Conv)", "weight 'w' has shape [2,2,1,3], expected 3 dims"});
  Model cube(17);
  cube.input("x", {1, 2, 4, 4, 4});
  cube.random("w", {2, 2, 3, 3, 3}, 13);
  cube.node("Conv", {"x", "w"}, {"y"}, "conv");
  cube.output("y");
  check_import_error([&] { cube.load(); }, {"node 'conv' (Conv)", "1-D and 2-D convolutions"},
                     true);
}

TEST_CASE("onnx forms: Gemm with transA, transB, alpha, beta, constant or run-time B and C",
          "[onnx]") {
  // y = alpha * A' B' + beta * C, A' = A^T where transA, B' = B^T where transB; M 3, K 4, N 5.
  const Tensor a = Tensor::randn({3, 4}, 21), at = Tensor::randn({4, 3}, 22);
  const Tensor b = Tensor::randn({4, 5}, 23), bt = Tensor::randn({5, 4}, 24);
  const Tensor cv = Tensor::randn({5}, 25), cm = Tensor::randn({3, 5}, 26);
  struct Case {
    bool trans_a, trans_b, b_const, c_const;
    float alpha, beta;
    const Tensor* c;
  };
  const std::vector<Case> cases = {
      {false, true, true, true, 1.0f, 1.0f, &cv},     // a linear layer
      {false, false, true, true, 0.5f, 2.0f, &cv},    // alpha, beta folded
      {true, false, false, true, 1.0f, 1.0f, &cm},    // run-time B: a matmul
      {true, true, false, false, 0.25f, 3.0f, &cm},   // run-time B and C, scaled
      {false, true, true, false, 2.0f, 0.5f, &cv},    // run-time bias, scaled
      {false, false, false, true, 1.5f, 0.0f, &cv}};  // beta 0: no C
  const auto vec = [](const Tensor& t) { return std::vector<float>(t.f32(), t.f32() + t.numel()); };
  for (const Case& c : cases) {
    INFO("transA " << c.trans_a << " transB " << c.trans_b << " B const " << c.b_const
                   << " C const " << c.c_const << " alpha " << c.alpha << " beta " << c.beta);
    const Tensor& av = c.trans_a ? at : a;
    const Tensor& bv = c.trans_b ? bt : b;
    Model m(17);
    m.input("a", av.shape());
    if (c.b_const)
      m.init("b", bv.shape(), vec(bv));
    else
      m.input("b", bv.shape());
    if (c.c_const)
      m.init("c", c.c->shape(), vec(*c.c));
    else
      m.input("c", c.c->shape());
    auto& n = m.node("Gemm", {"a", "b", "c"}, {"y"}, "gemm");
    set_i(n, "transA", c.trans_a);
    set_i(n, "transB", c.trans_b);
    set_f(n, "alpha", c.alpha);
    set_f(n, "beta", c.beta);
    m.output("y");
    std::map<std::string, Tensor> in{{"a", av}};
    if (!c.b_const) in["b"] = bv;
    if (!c.c_const) in["c"] = *c.c;
    const Tensor y = test::run_cpu(m.load(), in).at("y");
    REQUIRE(y.shape() == Shape{3, 5});
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 5; ++j) {
        double s = 0;
        for (int64_t k = 0; k < 4; ++k)
          s += double(c.trans_a ? at.f32()[k * 3 + i] : a.f32()[i * 4 + k]) *
               double(c.trans_b ? bt.f32()[j * 4 + k] : b.f32()[k * 5 + j]);
        const double cij = c.c->numel() == 5 ? c.c->f32()[j] : c.c->f32()[i * 5 + j];
        CHECK(y.f32()[i * 5 + j] == Approx(c.alpha * s + c.beta * cij).epsilon(1e-5).margin(1e-5));
      }
  }
}

TEST_CASE("onnx forms: Expand of a run-time tensor, read directly where its reader broadcasts",
          "[onnx]") {
  // y = x * Expand(g, Shape(x)), g [2, 8, 1, 1] (an SE gate as x * g.expand_as(x)); z = Expand(g)
  // to [2, 8, 3, 5] as a graph output.
  Model m(17);
  m.input("x", {2, 8, 3, 5});
  m.input("g", {2, 8, 1, 1});
  m.node("Shape", {"x"}, {"shape"}, "shape");
  m.node("Expand", {"g", "shape"}, {"ge"}, "expand");
  m.node("Mul", {"x", "ge"}, {"y"}, "gate");
  m.ints("wide", {3, 5});
  m.node("Expand", {"g", "wide"}, {"z"}, "expand_out");
  m.output("y");
  m.output("z");
  Graph g = m.load();
  const Tensor x = Tensor::randn({2, 8, 3, 5}, 31), gate = Tensor::randn({2, 8, 1, 1}, 32);
  const auto out = test::run_cpu(g, {{"x", x}, {"g", gate}});
  REQUIRE(out.at("y").shape() == Shape{2, 8, 3, 5});
  REQUIRE(out.at("z").shape() == Shape{2, 8, 3, 5});
  for (int64_t i = 0; i < x.numel(); ++i) {
    CHECK(out.at("y").f32()[i] == x.f32()[i] * gate.f32()[i / 15]);
    CHECK(out.at("z").f32()[i] == gate.f32()[i / 15]);
  }
  optimize(g);
  // The gate's mul reads g; the graph output keeps its add of zeros [1, 1, 3, 5].
  CHECK(count(g, OpKind::Add) == 1);
  const Node* mul = nullptr;
  for (const Node& n : g.nodes)
    if (n.outputs[0] == "y") mul = &n;
  REQUIRE(mul != nullptr);
  CHECK(mul->inputs == std::vector<std::string>{"x", "g"});
  CHECK(values(test::run_cpu(g, {{"x", x}, {"g", gate}}).at("y")) == values(out.at("y")));
}

TEST_CASE("onnx forms: Clip without bounds, with min 0 alone or as clip; Pad by zeros and as pad",
          "[onnx]") {
  Tensor x = Tensor::randn({1, 2, 3, 3}, 4);
  std::vector<float> relu = values(x);
  for (float& v : relu) v = std::max(v, 0.0f);
  // min 0 as an input (opset 11) or an attribute (opset 6, max at float32's largest).
  Model m(13);
  m.input("x", {1, 2, 3, 3});
  m.init("zero", {}, {0.0f});
  auto& clip = m.node("Clip", {"x", "zero"}, {"y"}, "clamp");
  m.output("y");
  Graph g = m.load();
  CHECK(count(g, OpKind::Relu) == 1);
  CHECK(values(run1(g, x)) == relu);
  Model old(6);
  old.input("x", {1, 2, 3, 3});
  auto& clip6 = old.node("Clip", {"x"}, {"y"}, "clamp");
  set_f(clip6, "min", 0);
  set_f(clip6, "max", std::numeric_limits<float>::max());
  old.output("y");
  CHECK(values(run1(old.load(), x)) == relu);
  // No bounds: the input (here a graph output under another name, so a copy).
  clip.mutable_input()->RemoveLast();
  CHECK(values(run1(m.load(), x)) == values(x));
  // Other bounds: a clip (relu6 here), its bounds from the inputs.
  m.init("six", {}, {6.0f});
  clip.add_input("zero");
  clip.add_input("six");
  g = m.load();
  REQUIRE(count(g, OpKind::Clip) == 1);
  CHECK(g.nodes[0].attrs.f("min") == 0.0);
  CHECK(g.nodes[0].attrs.f("max") == 6.0);
  std::vector<float> relu6 = relu;
  for (float& v : relu6) v = std::min(v, 6.0f);
  CHECK(values(run1(g, x)) == relu6);

  // Pad by zeros (pads as an input, axes from opset 18) is the input; other pads need a pad op.
  Model p(18);
  p.input("x", {1, 2, 3, 3});
  p.ints("pads", {0, 0, 0, 0});
  p.ints("axes", {2, 3});
  auto& pad = p.node("Pad", {"x", "pads", "", "axes"}, {"padded"}, "pad");
  set_s(pad, "mode", "reflect");
  p.node("Relu", {"padded"}, {"y"});
  p.output("y");
  g = p.load();
  REQUIRE(g.nodes.size() == 1);
  CHECK(g.nodes[0].inputs == std::vector<std::string>{"x"});
  // Other pads are a pad of every dim: pads [0, 1] before axes 2 and 3, [0, 0] after.
  p.g().mutable_initializer(0)->set_int64_data(1, 1);
  g = p.load();
  REQUIRE(count(g, OpKind::Pad) == 1);
  CHECK(g.nodes[0].attrs.ints("pads") == std::vector<int64_t>{0, 0, 0, 1, 0, 0, 0, 0});
  CHECK(g.nodes[0].attrs.s("mode") == "reflect");
  CHECK(g.value("y").shape == Shape{1, 2, 3, 4});
  p.g().mutable_initializer(1)->set_dims(0, 3);
  p.g().mutable_initializer(1)->add_int64_data(1);
  check_import_error([&] { p.load(); }, {"node 'pad' (Pad): has 4 pads for 3 axes"});
  pad.mutable_attribute(0)->set_s("wrap");
  check_import_error([&] { p.load(); }, {"node 'pad' (Pad): attribute 'mode': is 'wrap'"});
}

TEST_CASE("onnx forms: an op epilog lacks is one message naming the node and the op", "[onnx]") {
  Model m(20);
  m.input("x", {1, 3, 4, 4});
  m.input("grid", {1, 4, 4, 2});
  m.node("GridSample", {"x", "grid"}, {"y"}, "node_GridSample_3");
  m.output("y");
  check_import_error(
      [&] { m.load(); },
      {"m.onnx: node 'node_GridSample_3' (GridSample): op 'GridSample' is not supported"}, true);
}

// -- the elementwise, layout, reduction, normalization, resize and matmul ops --

TEST_CASE("onnx forms: Sub, Div, Max and Min of run-time tensors", "[onnx]") {
  const Tensor a = Tensor::from_vector({1, 4}, {1, -2, 3, 8});
  const Tensor b = Tensor::from_vector({1, 4}, {2, 4, -1, 2});
  const std::vector<std::pair<const char*, std::vector<float>>> cases = {
      {"Sub", {-1, -6, 4, 6}},
      {"Div", {0.5f, -0.5f, -3, 4}},
      {"Max", {2, 4, 3, 8}},
      {"Min", {1, -2, -1, 2}}};
  for (const auto& [op, want] : cases) {
    INFO(op);
    Model m(17);
    m.input("a", {1, 4});
    m.input("b", {1, 4});
    m.node(op, {"a", "b"}, {"y"}, "op");
    m.output("y");
    const Graph g = m.load();
    REQUIRE(g.nodes.size() == 1);
    CHECK(values(test::run_cpu(g, {{"a", a}, {"b", b}}).at("y")) == want);
  }
  // Max of three inputs: a chain of two.
  Model m(17);
  for (const char* in : {"a", "b", "c"}) m.input(in, {1, 4});
  m.node("Max", {"a", "b", "c"}, {"y"}, "op");
  m.output("y");
  const Graph g = m.load();
  CHECK(count(g, OpKind::Max) == 2);
  const Tensor c = Tensor::full({1, 4}, 2.5f);
  CHECK(values(test::run_cpu(g, {{"a", a}, {"b", b}, {"c", c}}).at("y")) ==
        std::vector<float>{2.5f, 4, 3, 8});
}

TEST_CASE("onnx forms: channel shuffle (Reshape to 5-D, Transpose, Reshape back)", "[onnx]") {
  Model m(17);
  m.input("x", {1, 4, 1, 2});
  m.ints("five", {1, 2, 2, 1, 2});
  m.ints("four", {1, -1, 1, 2});
  m.node("Reshape", {"x", "five"}, {"r"}, "split_groups");
  set_ints(m.node("Transpose", {"r"}, {"t"}, "swap"), "perm", {0, 2, 1, 3, 4});
  m.node("Reshape", {"t", "four"}, {"y"}, "merge");
  m.output("y");
  const Graph g = m.load();
  CHECK(count(g, OpKind::Reshape) == 2);
  CHECK(count(g, OpKind::Transpose) == 1);
  // Channels 0 1 | 2 3 interleave to 0 2 1 3.
  const Tensor x = Tensor::from_vector({1, 4, 1, 2}, {0, 0.5f, 1, 1.5f, 2, 2.5f, 3, 3.5f});
  CHECK(values(run1(g, x)) == std::vector<float>{0, 0.5f, 2, 2.5f, 1, 1.5f, 3, 3.5f});
}

TEST_CASE("onnx forms: Slice with steps, Softmax and LogSoftmax of opset 11 and 13", "[onnx]") {
  const Tensor x = Tensor::from_vector({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  // x[:, -1::step], backwards to the front.
  const auto reversed = [](int64_t step) {
    Model m(17);
    m.input("x", {2, 4});
    m.ints("starts", {-1});
    m.ints("ends", {std::numeric_limits<int64_t>::min()});
    m.ints("axes", {1});
    m.ints("steps", {step});
    m.node("Slice", {"x", "starts", "ends", "axes", "steps"}, {"y"}, "rev");
    m.output("y");
    return m.load();
  };
  Graph g = reversed(-2);
  CHECK(count(g, OpKind::Slice) == 1);
  CHECK(values(run1(g, x)) == std::vector<float>{4, 2, 8, 6});
  CHECK(values(run1(reversed(-1), x)) == std::vector<float>{4, 3, 2, 1, 8, 7, 6, 5});
  // Softmax-11 over the dims from axis 0 as one (a reshape either side); Softmax-13 over axis 0
  // alone. LogSoftmax alike, its log.
  for (bool log : {false, true})
    for (int64_t opset : {11, 13}) {
      INFO((log ? "LogSoftmax" : "Softmax") << " opset " << opset);
      Model s(opset);
      s.input("x", {2, 4});
      set_i(s.node(log ? "LogSoftmax" : "Softmax", {"x"}, {"y"}, "sm"), "axis", 0);
      s.output("y");
      const Graph sg = s.load();
      CHECK(count(sg, log ? OpKind::LogSoftmax : OpKind::Softmax) == 1);
      CHECK(count(sg, OpKind::Reshape) == (opset == 11 ? 2 : 0));
      const Tensor y = run1(sg, x);
      double total = 0;
      for (int64_t i = 0; i < 8; ++i) total += std::exp(double(x.f32()[i]));
      const double want =
          opset == 11 ? std::exp(1.0) / total : std::exp(1.0) / (std::exp(1.0) + std::exp(5.0));
      CHECK(y.f32()[0] == Approx(log ? std::log(want) : want).epsilon(1e-6));
    }
}

TEST_CASE("onnx forms: LayerNormalization, GroupNormalization, InstanceNormalization", "[onnx]") {
  const Tensor x = Tensor::randn({2, 4, 3, 3}, 6);
  {
    Model m(17);
    m.input("x", {2, 4, 3, 3});
    m.random("scale", {3}, 1);
    m.random("bias", {3}, 2);
    auto& n = m.node("LayerNormalization", {"x", "scale", "bias"}, {"y"}, "ln");
    set_i(n, "axis", -1);
    set_f(n, "epsilon", 1e-6f);
    m.output("y");
    const Graph g = m.load();
    REQUIRE(count(g, OpKind::LayerNorm) == 1);
    CHECK(g.nodes[0].attrs.f("eps") == 1e-6);
    CHECK(run1(g, x).shape() == x.shape());
    // The statistics outputs, Mean and InvStdDev over the last dim (kept), against the formula.
    n.add_output("mean");
    n.add_output("inv_std");
    m.output("mean");
    m.output("inv_std");
    const std::map<std::string, Tensor> out = test::run_cpu(m.load(), {{"x", x}});
    REQUIRE(out.at("mean").shape() == Shape{2, 4, 3, 1});
    REQUIRE(out.at("inv_std").shape() == Shape{2, 4, 3, 1});
    for (int64_t row = 0; row < 24; ++row) {
      const float* v = x.f32() + 3 * row;
      const double mean = (double(v[0]) + v[1] + v[2]) / 3;
      double var = 0;
      for (int i = 0; i < 3; ++i) var += (v[i] - mean) * (v[i] - mean) / 3;
      CHECK(out.at("mean").f32()[row] == Approx(mean).margin(1e-6));
      CHECK(out.at("inv_std").f32()[row] == Approx(1 / std::sqrt(var + 1e-6)).epsilon(1e-5));
    }
  }
  // GroupNormalization-18's scale per group is spread over the group's channels; per channel
  // (opset 21) it is taken as it is. Both give the same result.
  Tensor want;
  for (int64_t opset : {18, 21}) {
    INFO("opset " << opset);
    Model m(opset);
    m.input("x", {2, 4, 3, 3});
    m.init("scale", {opset == 18 ? 2 : 4},
           opset == 18 ? std::vector<float>{2, -1} : std::vector<float>{2, 2, -1, -1});
    m.init("bias", {opset == 18 ? 2 : 4},
           opset == 18 ? std::vector<float>{0.5f, 1} : std::vector<float>{0.5f, 0.5f, 1, 1});
    set_i(m.node("GroupNormalization", {"x", "scale", "bias"}, {"y"}, "gn"), "num_groups", 2);
    m.output("y");
    const Graph g = m.load();
    REQUIRE(count(g, OpKind::GroupNorm) == 1);
    const Tensor y = run1(g, x);
    if (opset == 18)
      want = y;
    else
      CHECK(test::bit_equal(y, want));
  }
  Model m(17);
  m.input("x", {2, 4, 3, 3});
  m.random("scale", {4}, 1);
  m.random("bias", {4}, 2);
  m.node("InstanceNormalization", {"x", "scale", "bias"}, {"y"}, "in");
  m.output("y");
  CHECK(count(m.load(), OpKind::InstanceNorm) == 1);
}

TEST_CASE("onnx forms: bilinear Resize to sizes, batched MatMul, ReduceSum and ReduceMax",
          "[onnx]") {
  {
    Model m(17);
    m.input("x", {1, 1, 2, 2});
    m.ints("sizes", {1, 1, 4, 4});
    auto& n = m.node("Resize", {"x", "", "", "sizes"}, {"y"}, "up");
    set_s(n, "mode", "linear");
    set_s(n, "coordinate_transformation_mode", "pytorch_half_pixel");
    m.output("y");
    const Graph g = m.load();
    REQUIRE(count(g, OpKind::Resize) == 1);
    const Tensor y = run1(g, Tensor::from_vector({1, 1, 2, 2}, {1, 2, 3, 4}));
    CHECK(values(y)[0] == 1);
    CHECK(values(y)[1] == 1.25f);
    CHECK(values(y)[5] == 1.75f);
  }
  {
    // convnext's Linear on NHWC: [N, H, W, C] by a constant [C, D] is a linear layer.
    Model m(17);
    m.input("x", {1, 2, 2, 3});
    m.random("w", {3, 5}, 3);
    m.node("MatMul", {"x", "w"}, {"y"}, "mm");
    m.output("y");
    const Graph g = m.load();
    REQUIRE(count(g, OpKind::Linear) == 1);
    CHECK(g.value("y").shape == Shape{1, 2, 2, 5});
  }
  for (const char* op : {"ReduceSum", "ReduceMax"}) {
    INFO(op);
    Model m(18);
    m.input("x", {2, 3});
    m.ints("axes", {1});
    set_i(m.node(op, {"x", "axes"}, {"y"}, "r"), "keepdims", 0);
    m.output("y");
    const Tensor y = run1(m.load(), Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, 9}));
    CHECK(values(y) ==
          (std::string(op) == "ReduceSum" ? std::vector<float>{6, 18} : std::vector<float>{3, 9}));
  }
}

// x [2, 3] -> `op` over axis 1 (an attribute before opset 18, an input from then on; none with
// `noop`, which sets noop_with_empty_axes), keepdims as given.
Model reduce_model(const char* op, int64_t opset, int64_t keepdims, bool noop = false) {
  Model m(opset);
  m.input("x", {2, 3});
  onnx::NodeProto* n;
  if (noop) {
    n = &m.node(op, {"x"}, {"y"}, "r");
    set_i(*n, "noop_with_empty_axes", 1);
  } else if (opset < 18) {
    n = &m.node(op, {"x"}, {"y"}, "r");
    set_ints(*n, "axes", {-1});
  } else {
    m.ints("axes", {1});
    n = &m.node(op, {"x", "axes"}, {"y"}, "r");
  }
  set_i(*n, "keepdims", keepdims);
  m.output("y");
  return m;
}

TEST_CASE("onnx forms: ReduceMin, ReduceProd and the reductions composed around reduce_sum",
          "[onnx]") {
  const Tensor x = Tensor::from_vector({2, 3}, {1, -2, 3, -4, 5, -9});
  const double e = std::exp(1.0);
  struct Case {
    const char* op;
    std::vector<double> want;   // over axis 1
    std::vector<OpKind> kinds;  // the nodes it imports as
  };
  const std::vector<Case> cases = {
      {"ReduceMin", {-2, -9}, {OpKind::ReduceMin}},
      {"ReduceProd", {-6, 180}, {OpKind::ReduceProd}},
      {"ReduceSumSquare", {14, 122}, {OpKind::Pow, OpKind::ReduceSum}},
      {"ReduceL1", {6, 18}, {OpKind::Abs, OpKind::ReduceSum}},
      {"ReduceL2",
       {std::sqrt(14.0), std::sqrt(122.0)},
       {OpKind::Pow, OpKind::ReduceSum, OpKind::Sqrt}},
      {"ReduceLogSumExp",
       {std::log(e + std::exp(-2.0) + std::exp(3.0)),
        std::log(std::exp(-4.0) + std::exp(5.0) + std::exp(-9.0))},
       {OpKind::ReduceMax, OpKind::Clip, OpKind::Sub, OpKind::Exp, OpKind::ReduceSum, OpKind::Log,
        OpKind::Add}},
  };
  for (const Case& c : cases)
    for (int64_t opset : {13, 17, 18})
      for (int64_t keepdims : {0, 1}) {
        INFO(c.op << " opset " << opset << " keepdims " << keepdims);
        const Graph g = reduce_model(c.op, opset, keepdims).load();
        for (OpKind k : c.kinds) CHECK(count(g, k) == 1);
        const Tensor y = run1(g, x);
        CHECK(y.shape() == (keepdims ? Shape{2, 1} : Shape{2}));
        REQUIRE(y.numel() == 2);
        for (int64_t i = 0; i < 2; ++i)
          CHECK(y.f32()[i] == Approx(c.want[size_t(i)]).epsilon(1e-6));
      }
  // ReduceLogSum of positive values.
  {
    const Graph g = reduce_model("ReduceLogSum", 17, 0).load();
    CHECK(count(g, OpKind::ReduceSum) == 1);
    CHECK(count(g, OpKind::Log) == 1);
    const Tensor y = run1(g, Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, 9}));
    CHECK(y.f32()[0] == Approx(std::log(6.0)).epsilon(1e-6));
    CHECK(y.f32()[1] == Approx(std::log(18.0)).epsilon(1e-6));
  }
  // ReduceLogSumExp stays finite where e^x overflows, and gives -inf for a run of -inf and +inf
  // where one is +inf (as ONNX's reference, which shifts an infinite max by 0), NaN for a NaN.
  {
    const float inf = INFINITY;
    const Graph g = reduce_model("ReduceLogSumExp", 17, 1).load();
    const Tensor y = run1(g, Tensor::from_vector({2, 3}, {1000, 1000, -inf, -inf, -inf, -inf}));
    CHECK(y.f32()[0] == Approx(1000 + std::log(2.0)).epsilon(1e-6));
    CHECK(y.f32()[1] == -inf);
    const Tensor z = run1(g, Tensor::from_vector({2, 3}, {1, inf, -inf, 1, NAN, 2}));
    CHECK(z.f32()[0] == inf);
    CHECK(std::isnan(z.f32()[1]));
    // Over every axis without keepdims: a scalar.
    Model all(17);
    all.input("x", {2, 3});
    set_i(all.node("ReduceLogSumExp", {"x"}, {"y"}, "r"), "keepdims", 0);
    all.output("y");
    const Tensor s = run1(all.load(), x);
    CHECK(s.shape() == Shape{});
    double sum = 0;
    for (int64_t i = 0; i < 6; ++i) sum += std::exp(double(x.f32()[i]));
    CHECK(s.f32()[0] == Approx(std::log(sum)).epsilon(1e-6));
  }
  // noop_with_empty_axes (opset 18) and no axes: no reduction; the pointwise part stays, as in
  // ONNX's reference (the squares for ReduceSumSquare, |x| for ReduceL1 and ReduceL2).
  const std::vector<std::pair<const char*, std::vector<float>>> noops = {
      {"ReduceMin", {1, -2, 3, -4, 5, -9}},       {"ReduceProd", {1, -2, 3, -4, 5, -9}},
      {"ReduceSumSquare", {1, 4, 9, 16, 25, 81}}, {"ReduceL1", {1, 2, 3, 4, 5, 9}},
      {"ReduceL2", {1, 2, 3, 4, 5, 9}},           {"ReduceLogSumExp", {1, -2, 3, -4, 5, -9}}};
  for (const auto& [op, want] : noops) {
    INFO(op << " noop");
    const Graph g = reduce_model(op, 18, 1, true).load();
    CHECK(count(g, OpKind::ReduceSum) + count(g, OpKind::ReduceMin) + count(g, OpKind::ReduceProd) +
              count(g, OpKind::ReduceMax) ==
          0);
    const Tensor y = run1(g, x);
    CHECK(y.shape() == x.shape());
    CHECK(values(y) == want);
  }
}

TEST_CASE("onnx forms: Log; Size folds at import", "[onnx]") {
  {
    Model m(13);
    m.input("x", {1, 4});
    m.node("Log", {"x"}, {"y"}, "log");
    m.output("y");
    const Graph g = m.load();
    REQUIRE(g.nodes.size() == 1);
    CHECK(g.nodes[0].op == OpKind::Log);
    const Tensor y = run1(g, Tensor::from_vector({1, 4}, {1, float(std::exp(2.0)), 0, -1}));
    CHECK(y.f32()[0] == 0);
    CHECK(y.f32()[1] == Approx(2).epsilon(1e-6));
    CHECK(y.f32()[2] == -INFINITY);
    CHECK(std::isnan(y.f32()[3]));
  }
  // Size folds: x [2, 3, 4] reshaped to [Size(x)] is a flatten to [24].
  Model m(13);
  m.input("x", {2, 3, 4});
  m.node("Size", {"x"}, {"n"}, "size");
  m.ints("zero", {0});
  m.node("Unsqueeze", {"n", "zero"}, {"shape"}, "unsq");
  m.node("Reshape", {"x", "shape"}, {"y"}, "flat");
  m.output("y");
  const Graph g = m.load();
  CHECK(g.value("y").shape == Shape{24});
}

TEST_CASE("onnx forms: ConvTranspose with pads, output_padding and output_shape", "[onnx]") {
  const Tensor x = Tensor::randn({1, 4, 5, 5}, 2);
  Model m(17);
  m.input("x", {1, 4, 5, 5});
  m.random("w", {4, 3, 3, 3}, 1);
  auto& n = m.node("ConvTranspose", {"x", "w"}, {"y"}, "up");
  set_ints(n, "strides", {2, 2});
  set_ints(n, "pads", {1, 1, 1, 1});
  set_ints(n, "output_padding", {1, 1});
  m.output("y");
  const Graph g = m.load();
  REQUIRE(count(g, OpKind::ConvTranspose2d) == 1);
  CHECK(g.value("y").shape == Shape{1, 3, 10, 10});
  const Tensor want = run1(g, x);
  // The same output asked for by output_shape: pads 1 before and 1 after, as given above
  // (output_padding 1 stays).
  Model s(17);
  s.input("x", {1, 4, 5, 5});
  s.random("w", {4, 3, 3, 3}, 1);
  auto& sn = s.node("ConvTranspose", {"x", "w"}, {"y"}, "up");
  set_ints(sn, "strides", {2, 2});
  set_ints(sn, "output_padding", {1, 1});
  set_ints(sn, "output_shape", {10, 10});
  s.output("y");
  CHECK(test::bit_equal(run1(s.load(), x), want));
}

TEST_CASE("onnx forms: DepthToSpace in both modes and SpaceToDepth", "[onnx]") {
  const auto model = [](const char* op, const Shape& shape, const char* mode) {
    Model m(13);
    m.input("x", shape);
    auto& n = m.node(op, {"x"}, {"y"}, "d");
    set_i(n, "blocksize", 2);
    if (mode) set_s(n, "mode", mode);
    m.output("y");
    return m;
  };
  for (const char* mode : {"DCR", "CRD"}) {
    const Graph g = model("DepthToSpace", {1, 8, 2, 3}, mode).load();
    REQUIRE(count(g, OpKind::DepthToSpace) == 1);
    CHECK(g.nodes[0].attrs.s("mode") == mode);
    CHECK(g.nodes[0].attrs.ints("blocksize") == std::vector<int64_t>{2, 2});
    CHECK(g.value("y").shape == Shape{1, 2, 4, 6});
  }
  CHECK(model("DepthToSpace", {1, 8, 2, 3}, nullptr).load().nodes[0].attrs.s("mode") == "DCR");
  const Graph s = model("SpaceToDepth", {1, 2, 4, 6}, nullptr).load();
  REQUIRE(count(s, OpKind::SpaceToDepth) == 1);
  CHECK(s.value("y").shape == Shape{1, 8, 2, 3});
  check_import_error(
      [&] {
        model("DepthToSpace", {1, 8, 2, 3}, "RDC").load();
      },
      {"node 'd' (DepthToSpace)", "mode", "RDC"});
  check_import_error(
      [&] {
        model("SpaceToDepth", {1, 2, 4, 6}, "CRD").load();
      },
      {"node 'd' (SpaceToDepth)", "mode"}, true);
  check_import_error(
      [&] {
        model("DepthToSpace", {8, 2, 3}, nullptr).load();
      },
      {"node 'd' (DepthToSpace)", "4-D"}, true);
}

TEST_CASE("onnx forms: Gather from a run-time tensor by evenly stepping indices is a slice",
          "[onnx]") {
  // as_strided as the dynamo exporter writes it (ConvNeXt's pooled [1, C, 1, 1]): Reshape to
  // 1-D, Gather with indices 0..C-1 shaped [1, C, 1, 1].
  const Tensor x = Tensor::from_vector({1, 4, 1, 1}, {1, 2, 3, 4});
  {
    Model m(18);
    m.input("x", {1, 4, 1, 1});
    m.ints("flat", {-1});
    m.node("Reshape", {"x", "flat"}, {"f"}, "view");
    TensorProto& idx = m.ints("idx", {0, 1, 2, 3});
    idx.clear_dims();
    for (int64_t d : {1, 4, 1, 1}) idx.add_dims(d);
    m.node("Gather", {"f", "idx"}, {"y"}, "as_strided");
    m.output("y");
    const Graph g = m.load();
    CHECK(count(g, OpKind::Slice) == 0);
    CHECK(g.value(g.outputs[0]).shape == Shape{1, 4, 1, 1});
    CHECK(values(run1(g, x)) == std::vector<float>{1, 2, 3, 4});
    // The identity view: x itself, also at another batch.
    LoadOptions o;
    o.batch = 2;
    CHECK(m.load(o).value(g.outputs[0]).shape == Shape{2, 4, 1, 1});
    // Other indices along an axis that holds the batch: refused at another batch (the traced
    // indices would take the first image alone).
    TensorProto* rev = nullptr;
    for (TensorProto& t : *m.g().mutable_initializer())
      if (t.name() == "idx") rev = &t;
    REQUIRE(rev);
    rev->clear_int64_data();
    for (int64_t i : {3, 2, 1, 0}) rev->add_int64_data(i);
    CHECK(values(run1(m.load(), x)) == std::vector<float>{4, 3, 2, 1});
    check_import_error([&] { m.load(o); }, {"node 'as_strided' (Gather)", "holds the batch"},
                       true);
  }
  // Strided (every other channel, backwards from the last) and a scalar index (the axis goes).
  const Tensor z = Tensor::from_vector({1, 6, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  for (const auto& [at, want, shape] :
       {std::tuple<std::vector<int64_t>, std::vector<float>, Shape>{
            {5, 3, 1}, {10, 11, 6, 7, 2, 3}, {1, 3, 2}},
        {{-2}, {8, 9}, {1, 2}}}) {
    INFO("indices " << at.size());
    Model m(13);
    m.input("x", {1, 6, 2});
    TensorProto& idx = m.ints("idx", at);
    if (at.size() == 1) idx.clear_dims();  // a scalar
    set_i(m.node("Gather", {"x", "idx"}, {"y"}, "pick"), "axis", 1);
    m.output("y");
    const Graph g = m.load();
    CHECK(count(g, OpKind::Slice) == 1);
    CHECK(g.value(g.outputs[0]).shape == shape);
    CHECK(values(run1(g, z)) == want);
  }
  // Indices that do not step evenly: one message naming the node.
  Model m(13);
  m.input("x", {1, 6, 2});
  m.ints("idx", {0, 2, 3});
  set_i(m.node("Gather", {"x", "idx"}, {"y"}, "pick"), "axis", 1);
  m.output("y");
  check_import_error([&] { m.load(); }, {"node 'pick' (Gather)", "step evenly"}, true);
}

TEST_CASE("onnx forms: Einsum of one or two operands, against its sum", "[onnx]") {
  // An Einsum of `eq` on inputs x (and w) of `shapes`.
  const auto einsum = [](const std::string& eq, const std::vector<Shape>& shapes) {
    Model m(17);
    std::vector<std::string> names{"x", "w"};
    names.resize(shapes.size());
    for (size_t t = 0; t < shapes.size(); ++t) m.input(names[t], shapes[t]);
    set_s(m.node("Einsum", names, {"y"}, "einsum"), "equation", eq);
    m.output("y");
    return m;
  };
  // Each case: the equation, the inputs' letters and shapes, the output's letters (written out
  // here, not parsed); y against the sum over every letter's values of the operands' product,
  // in double.
  struct Case {
    std::string eq;
    std::vector<std::string> terms;
    std::vector<Shape> shapes;
    std::string out;
  };
  const std::vector<Case> cases = {
      {"bij,bjk->bik", {"bij", "bjk"}, {{2, 3, 4}, {2, 4, 5}}, "bik"},
      {"bhqd,bhkd->bhqk", {"bhqd", "bhkd"}, {{2, 3, 4, 5}, {2, 3, 6, 5}}, "bhqk"},  // attention
      {"bi,bj->bij", {"bi", "bj"}, {{2, 3}, {2, 4}}, "bij"},  // no letter contracted
      {"ij,jk", {"ij", "jk"}, {{3, 4}, {4, 2}}, "ik"},        // implicit output
      {"ij,jk->k", {"ij", "jk"}, {{3, 4}, {4, 2}}, "k"},      // i summed in x alone
      {"nchw,c->nhw", {"nchw", "c"}, {{2, 3, 4, 5}, {3}}, "nhw"},
      {"ij->ji", {"ij"}, {{3, 4}}, "ji"},
      {"ijk->ki", {"ijk"}, {{2, 3, 4}}, "ki"},
      {"ij -> i", {"ij"}, {{3, 4}}, "i"},
      {"ij", {"ij"}, {{3, 4}}, "ij"},  // x itself
      {"i,i", {"i", "i"}, {{5}, {5}}, ""}};  // a scalar
  uint64_t seed = 70;
  for (const Case& c : cases) {
    INFO(c.eq);
    std::vector<Tensor> in;
    std::map<char, int64_t> size;
    for (size_t t = 0; t < c.shapes.size(); ++t) {
      in.push_back(Tensor::randn(c.shapes[t], ++seed));
      for (size_t d = 0; d < c.terms[t].size(); ++d) size[c.terms[t][d]] = c.shapes[t][d];
    }
    std::map<std::string, Tensor> feeds{{"x", in[0]}};
    if (in.size() == 2) feeds["w"] = in[1];
    const Tensor y = test::run_cpu(einsum(c.eq, c.shapes).load(), feeds).at("y");
    Shape ys;
    for (char ch : c.out) ys.push_back(size[ch]);
    REQUIRE(y.shape() == ys);
    // -- the reference: every assignment of the letters --
    std::vector<double> want(size_t(shape_numel(ys)), 0.0);
    int64_t total = 1;
    for (const auto& [ch, n] : size) total *= n;
    std::map<char, int64_t> at;
    for (int64_t i = 0; i < total; ++i) {
      int64_t r = i;
      for (const auto& [ch, n] : size) at[ch] = r % n, r /= n;
      double p = 1.0;
      for (size_t t = 0; t < c.terms.size(); ++t) {
        int64_t off = 0;
        for (size_t d = 0; d < c.terms[t].size(); ++d)
          off = off * c.shapes[t][d] + at[c.terms[t][d]];
        p *= double(in[t].f32()[off]);
      }
      int64_t o = 0;
      for (size_t d = 0; d < c.out.size(); ++d) o = o * ys[d] + at[c.out[d]];
      want[size_t(o)] += p;
    }
    double worst = 0.0;
    for (size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, std::fabs(double(y.f32()[i]) - want[i]) / (1.0 + std::fabs(want[i])));
    CHECK(worst < 1e-5);
  }
  // Refused: an ellipsis, a diagonal (epilog lacks them), sizes that disagree (a bad model).
  const std::vector<std::tuple<std::string, std::vector<Shape>, std::string, bool>> bad = {
      {"...ij,...jk->...ik", {{2, 3, 4}, {2, 4, 5}}, "has an ellipsis", true},
      {"ii->i", {{3, 3}}, "takes a diagonal", true},
      {"ij,jk->ik", {{3, 4}, {5, 2}}, "'j' is 4 in one input and 5 in another", false},
      {"ij,jk->iz", {{3, 4}, {4, 2}}, "output letter 'z' is in no input", false},
      {"ijk->i", {{3, 4}}, "has 3 letters for input 0", false}};
  for (const auto& [eq, shapes, why, unsupported] : bad) {
    INFO(eq);
    const Model m = einsum(eq, shapes);
    check_import_error([&] { m.load(); }, {"node 'einsum' (Einsum)", why}, unsupported);
  }
}

#endif  // EPILOG_HAVE_ONNX
