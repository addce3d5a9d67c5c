// Model, safetensors and .npy I/O: round trips, and one test per kind of bad input checking that
// the message names the file, the place and the problem.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "epilog/graph/passes.h"
#include "epilog/io/builder.h"
#include "epilog/io/dump.h"
#include "epilog/io/init.h"
#include "epilog/io/model.h"
#include "epilog/io/npy.h"
#include "epilog/io/safetensors.h"
#include "error_matcher.h"
#include "test_util.h"
#include "yolo_like.h"

namespace {

using namespace epilog;
using json = nlohmann::json;
namespace fs = std::filesystem;
using Catch::Contains;
using epilog::test::check_error;

std::string tmp(const std::string& name) {
  return (epilog::test::scratch_dir() / name).string();
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void require_same(const Graph& a, const Graph& b) {
  CHECK(a.inputs == b.inputs);
  CHECK(a.outputs == b.outputs);
  REQUIRE(a.nodes.size() == b.nodes.size());
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    INFO("node " << a.nodes[i].name);
    CHECK(a.nodes[i] == b.nodes[i]);
  }
  CHECK(a.values == b.values);
  REQUIRE(a.weights.size() == b.weights.size());
  for (const auto& [name, w] : a.weights) {
    INFO("weight " << name);
    REQUIRE(b.weights.count(name));
    CHECK(w.seed == b.weights.at(name).seed);
    CHECK(same_bytes(w.data, b.weights.at(name).data));
  }
}

// Every op of the table, seeded and given weights, big and small ones.
Graph rich_graph() {
  Builder b(3);
  b.set_weights({{"c0.weight", Tensor::randn({8, 3, 3, 3}, 1)},
                 {"c0.bias", Tensor::randn({8}, 2)},
                 {"f.scale", Tensor::randn({8}, 3)},
                 {"f.shift", Tensor::randn({8}, 4)}});
  Val x = b.input("images", {2, 3, 16, 16});
  Val y = b.conv2d(x, "c0", ConvOpts(8, 3).stride(2).padding(1).bias());
  y = b.silu(b.batchnorm(y, "bn0", 1e-3), "act0");
  std::vector<Val> parts = b.split(y, 1, {3, 5}, "sp");
  Val z = b.concat({parts[1], parts[0]}, 1, "cat");
  Attrs fused;
  fused.set("activation", std::string("relu"));
  fused.set("padding", int64_t(1));
  Val f = b.node(OpKind::FusedConv2d,
                 {z, b.weight("f.weight", {8, 8, 3, 3}, OpKind::FusedConv2d, "weight"),
                  b.weight("f.scale", {8}, OpKind::FusedConv2d, "scale"),
                  b.weight("f.shift", {8}, OpKind::FusedConv2d, "shift")},
                 fused, "f")[0];
  Val p = b.upsample_nearest(b.maxpool2d(f, PoolOpts(2), "pool"), 2, "up");
  Val a = b.avgpool2d(p, PoolOpts(3).stride(1).padding(1).count_include_pad(), "avg");
  Val s = b.add(b.mul(b.sigmoid(a, "sig"), f, "gate"), b.relu(f, "rel"), "res");
  Val l = b.linear(b.flatten(b.global_avgpool(s, "gap"), 1, "flat"), "fc", 10);
  b.output(l);
  b.output(s);
  return b.build();
}

// conv -> batchnorm -> silu with seeded, inline and (in some tests) file weights.
json base_model() {
  return json::parse(R"({
    "format": "epilog", "version": 1,
    "inputs": [{"name": "x", "shape": [1, 3, 8, 8]}],
    "outputs": [{"name": "act", "shape": [1, 4, 8, 8]}],
    "weights": {
      "conv.weight": {"shape": [4, 3, 3, 3], "init": {"seed": 7}},
      "bn.weight": {"shape": [4], "data": [1, 1.5, 2, 2.5]},
      "bn.bias": {"shape": [4], "data": [0, 0.25, -1, 3]},
      "bn.running_mean": {"shape": [4], "init": {"seed": 7}},
      "bn.running_var": {"shape": [4], "init": {"seed": 7}}
    },
    "nodes": [
      {"name": "conv", "op": "conv2d", "inputs": ["x", "conv.weight"], "outputs": ["conv"],
       "attrs": {"padding": 1}},
      {"name": "bn", "op": "batchnorm",
       "inputs": ["conv", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
       "outputs": ["bn"], "attrs": {"eps": 0.001}},
      {"name": "act", "op": "silu", "inputs": ["bn"], "outputs": ["act"]}
    ]})");
}

Graph parse(const json& model, const LoadOptions& options = {}) {
  return parse_json_model(model.dump(), "models/m.json", fs::path(tmp("x")).parent_path().string(),
                          options);
}

// Bytes of a safetensors file: length, header, data.
std::vector<uint8_t> st_file(const std::string& header, const std::vector<uint8_t>& data) {
  uint64_t n = header.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  bytes += header;
  bytes.append(data.begin(), data.end());
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::vector<uint8_t> u16_bytes(const std::vector<uint16_t>& v) {
  std::vector<uint8_t> out(v.size() * 2);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::map<std::string, Tensor> st_parse(const std::vector<uint8_t>& bytes) {
  return parse_safetensors(bytes.data(), bytes.size(), "w.safetensors");
}

// A .npy file with the given header dict (padded as NumPy does) and data.
std::vector<uint8_t> npy_file(const std::string& dict, const std::vector<uint8_t>& data,
                              int major = 1) {
  size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', uint8_t(major), 0};
  size_t n = header.size();
  for (size_t i = 0; i < prefix - 8; ++i) out.push_back(uint8_t(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

Tensor npy_parse(const std::vector<uint8_t>& bytes) {
  return parse_npy(bytes.data(), bytes.size(), "x.npy");
}

}  // namespace

// -- round trips --

TEST_CASE("io: the base model loads with seeded and inline weights", "[io]") {
  Graph g = parse(base_model());
  REQUIRE(g.nodes.size() == 3);
  CHECK(g.nodes[0].op == OpKind::Conv2d);
  CHECK(g.nodes[0].attrs.ints("padding") == std::vector<int64_t>{1, 1, 1, 1});
  CHECK(g.nodes[1].attrs.f("eps") == 0.001);
  CHECK(g.value("act").shape == Shape{1, 4, 8, 8});
  const Weight& w = g.weights.at("conv.weight");
  CHECK(w.seed == 7u);
  CHECK(same_bytes(w.data, init_weight("conv.weight", {4, 3, 3, 3}, OpKind::Conv2d, "weight", 7)));
  // The role comes from the consuming node: running_var is initialized as a variance.
  CHECK(same_bytes(g.weights.at("bn.running_var").data,
                   init_weight("bn.running_var", {4}, OpKind::BatchNorm, "running_var", 7)));
  const Weight& bias = g.weights.at("bn.bias");
  CHECK_FALSE(bias.seed);
  CHECK(std::vector<float>(bias.data.f32(), bias.data.f32() + 4) ==
        std::vector<float>{0, 0.25f, -1, 3});
}

TEST_CASE("io: dump_json -> parse_json_model gives the same graph", "[io]") {
  Graph g = rich_graph();
  Graph back = parse_json_model(dump_json(g), "rich.json", "");
  require_same(g, back);
}

TEST_CASE("io: a yolo-like model survives the JSON round trip", "[io]") {
  Builder b(11);
  Graph g = yolo::yolo_like(b, 1, 64);
  require_same(g, parse_json_model(dump_json(g), "yolo.json", ""));
}

TEST_CASE("io: the layout, reduction, norm, resize and matmul ops survive the JSON round trip",
          "[io]") {
  Builder b(12);
  Val x = b.input("x", {2, 8, 6, 6});
  Val t = b.transpose(b.sub(x, b.div(x, b.binary(OpKind::Max, x, x))), {0, 2, 3, 1}, "t");
  Val n = b.layer_norm(t, "ln");
  Val m = b.matmul(b.reshape(n, {0, -1, 8}), b.softmax(b.reshape(n, {0, 8, -1}), 1), "mm");
  Val r = b.reduce(OpKind::ReduceMean, m, {-1}, false, "mean");
  b.output(r);
  Val g = b.group_norm(b.instance_norm(x, "in"), "gn", 4);
  Val p = b.pad(b.slice(g, {1}, {-1}, {2}, {2}), {0, 0, 1, 1, 0, 0, 1, 1}, "reflect");
  b.output(b.resize(p, {2, 8, 9, 12}, "linear", "align_corners"));
  b.output(b.transpose(b.binary(OpKind::Min, x, x), {}));
  b.output(b.layer_norm(b.channel_shuffle(x, 4, "cs"), "ln2", 1, 1e-5, 1));
  b.output(b.depth_space(OpKind::SpaceToDepth,
                         b.depth_space(OpKind::DepthToSpace, x, {2, 1}, "CRD", "d2s"), {1, 2}));
  b.output(b.log_softmax(b.reduce(OpKind::ReduceMin, x, {1, 2}, false, "min"), 0, "lsm"));
  b.output(b.activation(b.activation(b.reduce(OpKind::ReduceProd, x, {-1}), Activation::Abs),
                        Activation::Log, "log"));
  const Graph graph = b.build();
  const Graph back = parse_json_model(dump_json(graph), "ops.json", "");
  require_same(graph, back);
  const auto in = test::random_inputs(graph, 3);
  const auto want = test::run_cpu(graph, in), got = test::run_cpu(back, in);
  for (const auto& [name, t] : want) CHECK(test::bit_equal(got.at(name), t));
}

TEST_CASE("io: an elementwise chain survives the JSON round trip, its program as text", "[io]") {
  Builder b(13);
  Val x = b.input("x", {2, 8, 6, 6});
  Val g = b.sigmoid(b.batchnorm(b.input("g", {2, 8, 1, 1}), "bn"), "gate");
  Val y = b.activation(b.sub(b.input("c", {8, 1, 1}), b.mul(x, g, "se"), "sub"),
                       Act(Activation::Clip, -0.1f, 6.0f), "clip");
  b.output(y);
  const Graph source = b.build();
  Graph graph = source;
  optimize(graph);
  REQUIRE(graph.nodes.size() == 1);
  CHECK(graph.nodes[0].attrs.s("program") ==
        "mul(x1), add(x2), sigmoid, mul(x3), sub(x4, v), clip(-0.1, 6)");
  const std::string text = dump_json(graph);
  CHECK_THAT(text, Contains(R"("program":"mul(x1), add(x2), sigmoid, mul(x3), sub(x4, v))"));
  const Graph back = parse_json_model(text, "chain.json", "");
  require_same(graph, back);
  const auto in = test::random_inputs(source, 3);
  const auto want = test::run_cpu(graph, in), got = test::run_cpu(back, in);
  for (const auto& [name, t] : want) CHECK(test::bit_equal(got.at(name), t));
}

TEST_CASE("io: dump_dot draws every value, node and edge, its names escaped", "[io]") {
  // Names with a quote and a backslash, which DOT strings must escape.
  Builder b(5);
  Val x = b.input("in\"put", {1, 3, 8, 8});
  Val y = b.silu(b.batchnorm(b.conv2d(x, "conv\\1", ConvOpts(4, 3).padding(1)), "bn"), "act");
  Val r = b.relu(y, "r\"1");
  b.output(b.add(y, r, "sum"));
  b.output(r);  // a graph output: no elementwise chain takes it into "sum"
  Graph g = b.build();
  optimize(g);
  REQUIRE(g.op_counts()[OpKind::FusedConv2d] == 1);
  const std::string dot = dump_dot(g);
  INFO(dot);
  // Every string closes: an even count of the quotes no backslash escapes, line by line.
  std::istringstream lines(dot);
  for (std::string line; std::getline(lines, line);) {
    int quotes = 0;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '\\')
        ++i;
      else if (line[i] == '"')
        ++quotes;
    }
    CHECK(quotes % 2 == 0);
  }
  CHECK_THAT(dot, Catch::StartsWith("digraph") && Catch::EndsWith("}\n"));
  CHECK_THAT(dot, Contains(R"("v:in\"put" [shape=ellipse)"));
  CHECK_THAT(dot, Contains(R"("n:conv\\1" [shape=box, label="conv\\1\nfused_conv2d {k=3x3 p=1)"));
  CHECK_THAT(dot, Contains(R"("n:r\"1" [shape=box)"));
  CHECK_THAT(dot, Contains(R"("n:sum" [shape=box)"));
  // An edge for each value a node reads (weights are not drawn) and one to each output; the
  // fused node filled.
  size_t reads = g.outputs.size();
  for (const Node& n : g.nodes)
    for (const std::string& in : n.inputs) reads += g.is_weight(in) ? 0 : 1;
  CHECK(test::count_of(dot, " -> ") == reads);
  CHECK(test::count_of(dot, R"(fillcolor="#ffcc66")") == 1);
}

TEST_CASE("io: save_model -> load_model with a safetensors sidecar", "[io]") {
  Graph g = rich_graph();
  std::string path = tmp("rich.json");
  save_model(g, path);
  REQUIRE(fs::exists(tmp("rich.safetensors")));
  json j = json::parse(read_text(path));
  CHECK(j["weights_file"] == "rich.safetensors");
  CHECK(j["weights"]["c0.weight"].count("data") == 0);  // 216 numbers: in the file
  CHECK(j["weights"]["c0.bias"].count("data") == 1);    // 8 numbers: inline
  CHECK(j["weights"]["bn0.weight"].count("init") == 1);
  auto file = read_safetensors(tmp("rich.safetensors"));
  CHECK(file.count("c0.weight"));
  CHECK_FALSE(file.count("c0.bias"));
  require_same(g, load_model(path));
}

TEST_CASE("io: save_model puts non-finite weights in the file", "[io]") {
  float inf = std::numeric_limits<float>::infinity();
  Builder b;
  b.set_weights({{"c.bias", Tensor::from_vector({2}, {inf, std::nanf("")})}});
  b.output(b.conv2d(b.input("x", {1, 1, 4, 4}), "c", ConvOpts(2, 1).bias()));
  Graph g = b.build();
  std::string path = tmp("nonfinite.json");
  save_model(g, path);
  CHECK(read_safetensors(tmp("nonfinite.safetensors")).count("c.bias"));
  require_same(g, load_model(path));
}

TEST_CASE("io: nodes may come in any order", "[io]") {
  json m = base_model();
  json reversed = m;
  reversed["nodes"] = json::array({m["nodes"][2], m["nodes"][0], m["nodes"][1]});
  require_same(parse(m), parse(reversed));
}

TEST_CASE("io: LoadOptions::batch rebinds the batch dim", "[io]") {
  LoadOptions options;
  options.batch = 4;
  Graph g = parse(base_model(), options);
  CHECK(g.value("x").shape == Shape{4, 3, 8, 8});
  CHECK(g.value("act").shape == Shape{4, 4, 8, 8});
  CHECK(g.weights.at("conv.weight").data.shape() == Shape{4, 3, 3, 3});
}

TEST_CASE("io: a weights file overrides init and inline data", "[io]") {
  Tensor w = Tensor::randn({4, 3, 3, 3}, 5);
  Tensor bias = Tensor::from_vector({4}, {9, 8, 7, 6});
  write_safetensors(
      tmp("override.safetensors"),
      {{"conv.weight", w}, {"bn.bias", bias}, {"bn.num_batches_tracked", Tensor::zeros({})}});
  LoadOptions options;
  options.weights_file = tmp("override.safetensors");
  Graph g = parse(base_model(), options);
  CHECK(same_bytes(g.weights.at("conv.weight").data, w));
  CHECK_FALSE(g.weights.at("conv.weight").seed);
  CHECK(same_bytes(g.weights.at("bn.bias").data, bias));
  CHECK(g.weights.at("bn.running_mean").seed == 7u);

  // The same file named by the model, relative to the model's directory.
  json m = base_model();
  m["weights_file"] = "override.safetensors";
  m["weights"]["conv.weight"].erase("init");
  Graph h = parse(m);
  CHECK(same_bytes(h.weights.at("conv.weight").data, w));
}

// -- model errors --

TEST_CASE("io: invalid JSON names the byte", "[io]") {
  check_error([] { parse_json_model("{\"format\": \"epilog\",, }", "bad.json", ""); },
              {"bad.json", "invalid JSON at byte 21", "syntax error"});
}

TEST_CASE("io: truncated JSON", "[io]") {
  std::string text = base_model().dump();
  check_error([&] { parse_json_model(text.substr(0, text.size() / 2), "cut.json", ""); },
              {"cut.json", "invalid JSON at byte", "unexpected end of input"});
}

TEST_CASE("io: a key given twice is an error", "[io]") {
  std::string text = base_model().dump();
  text.insert(text.find("\"nodes\""), "\"version\": 1, ");
  check_error([&] { parse_json_model(text, "dup.json", ""); },
              {"dup.json", "\"version\" appears twice"});
}

TEST_CASE("io: the top level must be an object with known keys", "[io]") {
  check_error([] { parse_json_model("[1, 2]", "a.json", ""); },
              {"a.json: top level", "expected an object"});
  json m = base_model();
  m["weight"] = json::object();
  check_error([&] { parse(m); }, {"models/m.json: top level", "unknown key \"weight\""});
  m = base_model();
  m.erase("nodes");
  check_error([&] { parse(m); }, {"models/m.json: top level", "missing \"nodes\""});
}

TEST_CASE("io: wrong format or version", "[io]") {
  json m = base_model();
  m["format"] = "onnx";
  check_error([&] { parse(m); }, {"models/m.json: format", "\"onnx\"", "expected \"epilog\""});
  m = base_model();
  m["version"] = 2;
  check_error([&] { parse(m); }, {"models/m.json: version", "2 is not supported"});
}

TEST_CASE("io: unknown op", "[io]") {
  json m = base_model();
  m["nodes"][0]["op"] = "conv";
  check_error([&] { parse(m); },
              {"models/m.json: nodes[0] 'conv'", "unknown op 'conv'", "did you mean conv2d"});
  m["nodes"][0]["op"] = "frobnicate";
  check_error([&] { parse(m); }, {"nodes[0] 'conv'", "unknown op 'frobnicate'", "known ops:"});
  // Within two edits of an op, though neither name holds the other: two letters swapped, two
  // left out, two too many.
  for (const auto& [typo, op] : std::vector<std::pair<std::string, std::string>>{
           {"cnov2d", "conv2d"}, {"sigmd", "sigmoid"}, {"rrellu", "relu"}}) {
    m["nodes"][0]["op"] = typo;
    check_error([&] { parse(m); }, {"unknown op '" + typo + "'", "did you mean " + op});
  }
}

TEST_CASE("io: unknown attribute", "[io]") {
  json m = base_model();
  m["nodes"][0]["attrs"]["strid"] = 2;
  check_error([&] { parse(m); }, {"models/m.json: nodes[0]", "[conv2d] node 'conv'",
                                  "unknown attribute 'strid'", "stride"});
}

TEST_CASE("io: missing required attribute", "[io]") {
  json m = base_model();
  m["nodes"].push_back(
      {{"name", "cat"}, {"op", "concat"}, {"inputs", {"act", "act"}}, {"outputs", {"cat"}}});
  check_error([&] { parse(m); }, {"models/m.json: nodes[3]", "[concat] node 'cat'",
                                  "missing required attribute 'axis'"});
}

TEST_CASE("io: wrong attribute type", "[io]") {
  json m = base_model();
  m["nodes"][0]["attrs"]["padding"] = "same";
  check_error([&] { parse(m); },
              {"models/m.json: nodes[0]", "[conv2d] node 'conv'", "'padding' must be int list"});
  m["nodes"][0]["attrs"]["padding"] = json::array({1, 1.5, 1, 1});
  check_error([&] { parse(m); },
              {"nodes[0] 'conv' (conv2d): attrs.padding[1]", "expected an integer, got 1.5"});
  m["nodes"][0]["attrs"]["padding"] = true;
  check_error([&] { parse(m); }, {"nodes[0] 'conv' (conv2d): attrs.padding", "is true"});
  m["nodes"][0]["attrs"]["padding"] = json::array({1, 1});
  check_error([&] { parse(m); }, {"nodes[0]", "'padding' must have 4 values, got 2"});
}

TEST_CASE("io: a float attribute may be an int, an ints attribute a scalar", "[io]") {
  json m = base_model();
  m["nodes"][1]["attrs"]["eps"] = 1;
  m["nodes"][0]["attrs"]["stride"] = 1;
  Graph g = parse(m);
  CHECK(g.nodes[1].attrs.f("eps") == 1.0);
  CHECK(g.nodes[0].attrs.ints("stride") == std::vector<int64_t>{1, 1});
}

TEST_CASE("io: wrong number of inputs", "[io]") {
  json m = base_model();
  m["nodes"][2]["inputs"] = {"bn", "bn"};
  check_error([&] { parse(m); },
              {"models/m.json: nodes[2]", "[silu] node 'act'", "has 2 inputs, expected 1"});
}

TEST_CASE("io: reference to an undefined value", "[io]") {
  json m = base_model();
  m["nodes"][0]["inputs"][0] = "foo";
  check_error([&] { parse(m); },
              {"models/m.json: nodes[0] 'conv' (conv2d): input 'foo' is not defined"});
  m = base_model();
  m["outputs"][0]["name"] = "nope";
  check_error([&] { parse(m); }, {"models/m.json: outputs[0] 'nope'", "is not defined"});
}

TEST_CASE("io: duplicate names", "[io]") {
  json m = base_model();
  m["nodes"][2]["name"] = "conv";
  check_error([&] { parse(m); },
              {"models/m.json: nodes[2] 'conv' (silu)", "already used by nodes[0]"});
  m = base_model();
  m["nodes"][2]["outputs"][0] = "x";
  check_error([&] { parse(m); },
              {"models/m.json: nodes[2] 'act' (silu)", "'x' is already defined by inputs[0]"});
  m = base_model();
  m["inputs"].push_back({{"name", "bn.bias"}, {"shape", {4}}});
  check_error([&] { parse(m); },
              {"models/m.json: weights[\"bn.bias\"]", "'bn.bias' is already defined by inputs[1]"});
  m = base_model();
  m["outputs"].push_back(m["outputs"][0]);
  check_error([&] { parse(m); }, {"models/m.json: outputs[1] 'act'", "listed twice"});
}

TEST_CASE("io: a cycle is an error", "[io]") {
  json m = base_model();
  m["nodes"][0]["inputs"][0] = "act";
  check_error([&] { parse(m); }, {"models/m.json", "cycle through node"});
}

TEST_CASE("io: shape mismatch", "[io]") {
  json m = base_model();
  m["inputs"][0]["shape"] = {1, 5, 8, 8};
  check_error([&] { parse(m); },
              {"models/m.json: nodes[0]", "[conv2d] node 'conv'", "input has 5 channels"});
  m = base_model();
  m["outputs"][0]["shape"] = {1, 4, 4, 4};
  check_error([&] { parse(m); }, {"models/m.json: outputs[0] 'act'",
                                  "[1,4,4,4] does not match the inferred [1,4,8,8]"});
  m = base_model();
  m["inputs"][0]["shape"] = {1, 3, 0, 8};
  check_error([&] { parse(m); }, {"models/m.json: inputs[0].shape[2]", "out of range"});
  m["inputs"][0]["shape"] = {1, 3, 1 << 30, 1 << 30};
  check_error([&] { parse(m); }, {"models/m.json: inputs[0].shape", "beyond epilog's limits"});
}

TEST_CASE("io: sizes that would overflow shape inference are refused", "[io]") {
  json m = base_model();
  m["inputs"].push_back({{"name", "big"}, {"shape", {1, 1, 2147483647, 1}}});
  m["nodes"].push_back({{"name", "up"},
                        {"op", "upsample_nearest"},
                        {"inputs", {"big"}},
                        {"outputs", {"up"}},
                        {"attrs", {{"scale", 2147483647}}}});
  check_error([&] { parse(m); }, {"models/m.json: nodes[3] 'up' (upsample_nearest): output 'up'",
                                  "beyond epilog's limits"});
  m["nodes"][3]["attrs"]["scale"] = 2147483648;
  check_error([&] { parse(m); },
              {"nodes[3] 'up' (upsample_nearest): attrs.scale", "2147483648 is out of range"});
  LoadOptions options;
  options.batch = int64_t(1) << 40;
  check_error([&] { parse(base_model(), options); }, {"models/m.json", "batch 1099511627776"});
}

TEST_CASE("io: missing weight", "[io]") {
  json m = base_model();
  m["weights"]["bn.bias"].erase("data");
  check_error([&] { parse(m); }, {"models/m.json: weights[\"bn.bias\"]", "has no data"});
  m = base_model();
  m["weights"].erase("bn.bias");
  check_error([&] { parse(m); }, {"nodes[1] 'bn' (batchnorm): input 'bn.bias' is not defined"});
}

TEST_CASE("io: bad inline weights", "[io]") {
  json m = base_model();
  m["weights"]["bn.bias"]["data"] = {1, 2, 3};
  check_error([&] { parse(m); },
              {"models/m.json: weights[\"bn.bias\"].data", "has 3 numbers but shape [4] holds 4"});
  m["weights"]["bn.bias"]["data"] = {1, "2", 3, 4};
  check_error([&] { parse(m); }, {"weights[\"bn.bias\"].data[1]", "expected a number"});
  m["weights"]["bn.bias"]["data"] = {1, 1e300, 3, 4};
  check_error([&] { parse(m); }, {"weights[\"bn.bias\"].data[1]", "outside the float32 range"});
  m = base_model();
  m["weights"]["bn.bias"]["init"] = {{"seed", 1}};
  check_error([&] { parse(m); }, {"weights[\"bn.bias\"]", "both \"data\" and \"init\""});
  m = base_model();
  m["weights"]["bn.bias"]["data"] = nullptr;
  check_error([&] { parse(m); }, {"weights[\"bn.bias\"].data", "expected a list"});
  m = base_model();
  m["weights"]["conv.weight"]["init"]["seed"] = -1;
  check_error([&] { parse(m); },
              {"weights[\"conv.weight\"].init.seed", "expected a non-negative integer"});
  m = base_model();
  m["weights"]["unused"] = {{"shape", {2}}, {"init", {{"seed", 1}}}};
  check_error([&] { parse(m); }, {"weights[\"unused\"]", "no node reads it"});
}

TEST_CASE("io: weight shape mismatch with the weights file", "[io]") {
  write_safetensors(tmp("shape.safetensors"), {{"bn.bias", Tensor::zeros({5})}});
  json m = base_model();
  m["weights_file"] = "shape.safetensors";
  check_error([&] { parse(m); }, {"models/m.json: weights[\"bn.bias\"]",
                                  "shape [4] in the model but [5] in", "shape.safetensors"});
}

TEST_CASE("io: weight dtype the loader does not read", "[io]") {
  write_bytes(tmp("f64.safetensors"),
              st_file(R"({"bn.bias":{"dtype":"F64","shape":[4],"data_offsets":[0,32]}})",
                      std::vector<uint8_t>(32)));
  json m = base_model();
  m["weights_file"] = "f64.safetensors";
  check_error([&] { parse(m); },
              {"models/m.json: weights_file", "f64.safetensors", "tensor 'bn.bias'", "dtype F64"});
}

TEST_CASE("io: tensors of the weights file that no weight names", "[io]") {
  write_safetensors(tmp("extra.safetensors"), {{"bn.bais", Tensor::zeros({4})},
                                               {"bn.num_batches_tracked", Tensor::zeros({})}});
  json m = base_model();
  m["weights_file"] = "extra.safetensors";
  check_error([&] { parse(m); }, {"models/m.json", "extra.safetensors",
                                  "1 tensor(s) that no weight of the model names: 'bn.bais'"});
}

TEST_CASE("io: missing or corrupt weights file", "[io]") {
  json m = base_model();
  m["weights_file"] = "absent.safetensors";
  check_error([&] { parse(m); },
              {"models/m.json: weights_file", "absent.safetensors", "cannot open"});
  write_bytes(tmp("cut.safetensors"), {1, 2, 3});
  m["weights_file"] = "cut.safetensors";
  check_error([&] { parse(m); }, {"models/m.json: weights_file", "cut.safetensors", "too short"});
}

TEST_CASE("io: load_model checks the file type and that it exists", "[io]") {
  check_error([] { load_model("model.pt"); },
              {"model.pt", "unsupported model file type '.pt'", "reads .json and .onnx"});
  check_error([] { load_model(tmp("absent.onnx")); }, {"absent.onnx", "cannot open"});
  check_error([] { load_model(tmp("absent.json")); }, {"absent.json", "cannot open"});
  write_text(tmp("bad.json"), "{\"format\": \"epilog\", \"version\": 1, \"inputs\": 3");
  check_error([] { load_model(tmp("bad.json")); }, {"bad.json", "invalid JSON at byte"});
}

TEST_CASE("io: batch option on a scalar input", "[io]") {
  json m = base_model();
  m["inputs"].push_back({{"name", "s"}, {"shape", json::array()}});
  LoadOptions options;
  options.batch = 2;
  check_error([&] { parse(m, options); }, {"models/m.json: inputs[1] 's'", "no batch dim"});
}

TEST_CASE("io: a node with the wrong number of outputs", "[io]") {
  json m = base_model();
  m["nodes"][2]["outputs"] = {"act", "act2"};
  check_error([&] { parse(m); },
              {"models/m.json: nodes[2] 'act' (silu)", "lists 2 outputs but silu makes 1"});
}

// -- safetensors --

TEST_CASE("io: safetensors round trip", "[io]") {
  std::map<std::string, Tensor> t = {{"a", Tensor::randn({2, 3}, 1)},
                                     {"b", Tensor::randn({5}, 2)},
                                     {"scalar", Tensor::full({}, 3.5f)},
                                     {"empty", Tensor::zeros({0, 4})}};
  write_safetensors(tmp("rt.safetensors"), t);
  auto back = read_safetensors(tmp("rt.safetensors"));
  REQUIRE(back.size() == t.size());
  for (const auto& [name, tensor] : t) CHECK(same_bytes(tensor, back.at(name)));
  // The data starts 8-byte aligned.
  std::string bytes = read_text(tmp("rt.safetensors"));
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);
}

TEST_CASE("io: safetensors F16 and BF16 are widened exactly", "[io]") {
  std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff,
                               0x3555, 0x8000, 0x7c00, 0xfc00, 0x7e00};
  std::vector<uint16_t> bf16 = {0x3f80, 0xc040, 0x4049, 0x0001, 0x7f80, 0xff80};
  std::vector<uint8_t> data = u16_bytes(f16);
  std::vector<uint8_t> more = u16_bytes(bf16);
  data.insert(data.end(), more.begin(), more.end());
  auto t = st_parse(st_file(R"({"h":{"dtype":"F16","shape":[10],"data_offsets":[0,20]},
                               "b":{"dtype":"BF16","shape":[2,3],"data_offsets":[20,32]},
                               "__metadata__":{"format":"pt"}})",
                            data));
  const float* h = t.at("h").f32();
  CHECK(h[0] == 1.0f);
  CHECK(h[1] == -2.0f);
  CHECK(h[2] == 65504.0f);
  CHECK(h[3] == std::ldexp(1.0f, -24));     // smallest subnormal
  CHECK(h[4] == std::ldexp(1023.0f, -24));  // largest subnormal
  CHECK(h[5] == 0.333251953125f);
  CHECK((h[6] == 0.0f && std::signbit(h[6])));  // -0
  CHECK(h[7] == std::numeric_limits<float>::infinity());
  CHECK(h[8] == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(h[9]));
  const Tensor& b = t.at("b");
  CHECK(b.shape() == Shape{2, 3});
  const float* p = b.f32();
  CHECK(p[0] == 1.0f);
  CHECK(p[1] == -3.0f);
  CHECK(p[2] == 3.140625f);
  CHECK(p[3] == std::ldexp(1.0f, -133));  // a float32 subnormal
  CHECK(p[4] == std::numeric_limits<float>::infinity());
  CHECK(p[5] == -std::numeric_limits<float>::infinity());
}

TEST_CASE("io: safetensors offsets may leave holes", "[io]") {
  auto t = st_parse(
      st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f32_bytes({9, 2, 7})));
  CHECK(t.at("a").f32()[0] == 2.0f);
}

TEST_CASE("io: safetensors truncated file", "[io]") {
  check_error([] { st_parse({1, 0, 0}); }, {"w.safetensors", "3 bytes is too short"});
  std::vector<uint8_t> full = st_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                                      f32_bytes({1, 2, 3, 4}));
  full.resize(full.size() - 4);
  check_error([&] { st_parse(full); },
              {"w.safetensors", "tensor 'a'", "[0, 16] are outside the 12-byte data buffer"});
}

TEST_CASE("io: safetensors header length past the end", "[io]") {
  std::vector<uint8_t> bytes = st_file("{}", {});
  bytes[0] = 200;
  check_error([&] { st_parse(bytes); },
              {"w.safetensors", "header length 200 goes past the end of the file (10 bytes)"});
  bytes[0] = 0;
  bytes[7] = 0x80;
  check_error([&] { st_parse(bytes); }, {"w.safetensors", "goes past the end"});
}

TEST_CASE("io: safetensors header not JSON", "[io]") {
  check_error([] { st_parse(st_file("{\"a\": ", {})); },
              {"w.safetensors", "header is not valid JSON"});
  check_error([] { st_parse(st_file("[1, 2]", {})); },
              {"w.safetensors", "header is not a JSON object"});
  check_error([] { st_parse(st_file(R"({"a": 3})", {})); },
              {"w.safetensors", "tensor 'a'", "not an object"});
  check_error([] { st_parse(st_file(R"({"a": {"dtype": "F32", "shape": [1]}})", {})); },
              {"w.safetensors", "tensor 'a'", "no \"data_offsets\""});
  check_error([] { st_parse(st_file(R"({"__metadata__": 3})", {})); },
              {"w.safetensors", "__metadata__ is not an object"});
}

TEST_CASE("io: safetensors unknown dtype", "[io]") {
  check_error(
      [] { st_parse(st_file(R"({"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", {0})); },
      {"w.safetensors", "tensor 'w' has dtype Q4", "F32, F16 and BF16"});
  check_error(
      [] {
        st_parse(st_file(R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})",
                         std::vector<uint8_t>(8)));
      },
      {"w.safetensors", "tensor 'w' has dtype I64"});
}

TEST_CASE("io: safetensors data_offsets outside the buffer", "[io]") {
  check_error(
      [] {
        st_parse(st_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                         f32_bytes({1, 2, 3})));
      },
      {"w.safetensors", "tensor 'w'", "[8, 16] are outside the 12-byte data buffer"});
  check_error(
      [] {
        st_parse(st_file(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})",
                         f32_bytes({1, 2, 3})));
      },
      {"w.safetensors", "tensor 'w'", "[8, 4]"});
  check_error(
      [] { st_parse(st_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", {})); },
      {"w.safetensors", "tensor 'w'", "data_offsets holds -4"});
}

TEST_CASE("io: safetensors overlapping tensors", "[io]") {
  check_error(
      [] {
        st_parse(st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                             "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         f32_bytes({1, 2, 3})));
      },
      {"w.safetensors", "'a' [0, 8] and 'b' [4, 12] overlap"});
}

TEST_CASE("io: safetensors shape and byte range disagree", "[io]") {
  check_error(
      [] {
        st_parse(st_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                         f32_bytes({1, 2})));
      },
      {"w.safetensors", "tensor 'w'", "shape [3] of F32 needs 12 bytes", "[0, 8] hold 8"});
  check_error(
      [] {
        st_parse(
            st_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                    f32_bytes({1, 2})));
      },
      {"w.safetensors", "tensor 'w'", "too large"});
  check_error(
      [] {
        st_parse(
            st_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", f32_bytes({1})));
      },
      {"w.safetensors", "tensor 'w'", "shape holds -1"});
}

TEST_CASE("io: safetensors missing file and non-f32 writes", "[io]") {
  check_error([] { read_safetensors(tmp("none.safetensors")); },
              {"none.safetensors", "cannot open"});
  check_error([] { read_safetensors(fs::path(tmp("x")).parent_path().string()); },
              {"not a regular file"});
}

// -- npy --

TEST_CASE("io: npy round trip", "[io]") {
  for (const Shape& shape : {Shape{}, Shape{3}, Shape{1, 3, 4, 5}, Shape{2, 0}}) {
    INFO("shape " << shape_str(shape));
    Tensor t = Tensor::randn(shape, 9);
    write_npy(tmp("rt.npy"), t);
    std::string bytes = read_text(tmp("rt.npy"));
    CHECK(bytes.compare(0, 8, std::string("\x93NUMPY\x01\x00", 8)) == 0);
    size_t header = static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9]) << 8;
    CHECK((10 + header) % 64 == 0);
    CHECK(same_bytes(t, read_npy(tmp("rt.npy"))));
  }
  std::string bytes = read_text(tmp("rt.npy"));
  CHECK_THAT(bytes, Contains("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 0), }"));
  write_npy(tmp("one.npy"), Tensor::zeros({3}));
  CHECK_THAT(read_text(tmp("one.npy")), Contains("'shape': (3,), }"));
}

TEST_CASE("io: npy versions 2.0 and 3.0, Python 2 longs and any key order", "[io]") {
  for (int major : {2, 3}) {
    Tensor t = npy_parse(npy_file("{'shape': (2L, 1L), \"fortran_order\": False, 'descr': '<f4'}",
                                  f32_bytes({4, 5}), major));
    CHECK(t.shape() == Shape{2, 1});
    CHECK(t.f32()[1] == 5.0f);
  }
}

TEST_CASE("io: npy wrong magic", "[io]") {
  check_error([] { npy_parse({'P', 'K', 3, 4, 0, 0, 0, 0, 0, 0}); }, {"x.npy", "not a .npy file"});
  check_error([] { npy_parse({0x93, 'N', 'U'}); }, {"x.npy", "not a .npy file"});
  std::vector<uint8_t> v =
      npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': ()}", f32_bytes({1}));
  v[6] = 4;
  check_error([&] { npy_parse(v); }, {"x.npy", "unsupported .npy format version 4.0"});
}

TEST_CASE("io: npy float64", "[io]") {
  check_error(
      [] {
        npy_parse(npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }",
                           std::vector<uint8_t>(8)));
      },
      {"x.npy", "dtype '<f8' is not supported", "'<f4'"});
}

TEST_CASE("io: npy big-endian float32", "[io]") {
  check_error(
      [] {
        npy_parse(
            npy_file("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", f32_bytes({1})));
      },
      {"x.npy", "dtype '>f4' is not supported"});
}

TEST_CASE("io: npy fortran order", "[io]") {
  check_error(
      [] {
        npy_parse(npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }",
                           f32_bytes({1, 2, 3, 4})));
      },
      {"x.npy", "fortran_order is True"});
}

TEST_CASE("io: npy truncated data", "[io]") {
  check_error(
      [] {
        npy_parse(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                           f32_bytes({1, 2, 3, 4, 5})));
      },
      {"x.npy", "truncated", "shape [2,3] of float32 needs 24 bytes", "the file has 20"});
  check_error(
      [] {
        npy_parse(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
                           f32_bytes({1, 2})));
      },
      {"x.npy", "4 bytes after the data"});
  std::vector<uint8_t> v = npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", {});
  v.resize(30);
  check_error([&] { npy_parse(v); }, {"x.npy", "truncated: the header is"});
  check_error(
      [] {
        npy_parse(npy_file(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", {}));
      },
      {"x.npy", "too large"});
}

TEST_CASE("io: npy malformed headers", "[io]") {
  auto bad = [](const std::string& dict, const std::string& what) {
    check_error([&] { npy_parse(npy_file(dict, f32_bytes({1}))); }, {"x.npy", what});
  };
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", "malformed header");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", "unsupported value");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 'y'}",
      "unexpected header key 'x'");
  bad("{'descr': '<f4', 'fortran_order': False}", "header has no 'shape'");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", "negative dimension");
  bad("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}", "structured dtype");
  bad("{'descr': '<f4', 'fortran_order': 'no', 'shape': (1,)}", "'fortran_order' is not True");
  bad("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", "twice");
  bad("{'descr': '<f4, 'fortran_order': False, 'shape': (1,)}", "malformed header");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
      "integer is too large");
  check_error([] { read_npy(tmp("none.npy")); }, {"none.npy", "cannot open"});
}
