// Whole models on the GPU against the CPU reference: the YOLO-like model and every
// models/*.json, through compile() with each conv kernel forced in turn and as selected.
//
// The reference is the unfused graph on the CPU (what the model means). Each output element by
// element (test::check_close): |gpu - cpu| <= atol * magnitude + rtol * |cpu|, the magnitude
// being the largest |cpu| of the element's channel, or the output's RMS where that is larger
// (test::channel_magnitude), with atol
//   2e-5 with the SIMT conv kernels (scalar, tiled) and the unfused GPU graph: float32 with
//     its rounding carried through ~60 layers (test::kSimtGraph);
//   5e-3 with any gemm kernel or TF32 matmul (tensor cores; test::kTf32Graph).
// Each comparison prints how near its bound it came, so the logs record a card's margin.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>

#include "epilog/epilog.h"
#include "epilog/io/model.h"
#include "epilog/kernels/launch.h"
#include "gpu_util.h"
#include "test_graphs.h"
#include "yolo_like.h"

using namespace epilog;

namespace {

std::map<std::string, Tensor> random_inputs(const Graph& g, uint64_t seed) {
  std::map<std::string, Tensor> in;
  for (const std::string& name : g.inputs) in[name] = Tensor::randn(g.value(name).shape, seed++);
  return in;
}

std::map<std::string, Tensor> run(Graph g, const CompileOptions& options,
                                  const std::map<std::string, Tensor>& inputs,
                                  bool* uses_gemm = nullptr) {
  Compiled c = compile(std::move(g), options);
  if (uses_gemm) {
    *uses_gemm = false;
    for (size_t i = 0; i < c.plan.nodes.size(); ++i) {
      const Node& n = c.plan.graph.nodes[i];
      if ((n.op == OpKind::FusedConv2d || n.op == OpKind::Conv2d) &&
          c.plan.nodes[i].conv == ConvKernel::Gemm)
        *uses_gemm = true;
      if (n.op == OpKind::MatMul) {  // TF32 too where matmul_runs_tf32 says
        const Shape& b = c.plan.graph.value(n.inputs[1]).shape;
        if (matmul_runs_tf32(b.back(), b[b.size() - 2])) *uses_gemm = true;
      }
    }
  }
  std::unique_ptr<Backend> backend = make_backend(options.device);
  Executor ex(std::move(c.plan), *backend);
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : ex.run(inputs)) out[name] = t.to(Device::CPU);
  return out;
}

// The unfused graph on the CPU, computed once per model.
const std::map<std::string, Tensor>& reference(const std::string& key, const Graph& g,
                                               const std::map<std::string, Tensor>& inputs) {
  static std::map<std::string, std::map<std::string, Tensor>> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  CompileOptions o;
  o.device = Device::CPU;
  o.fuse = false;
  return cache[key] = run(g, o, inputs);
}

// A graph's output `gpu` against the CPU's `cpu`, element by element at `tol` over the channels'
// magnitudes; `print`: how near its bound it came, on stdout.
test::Closeness check_output(const Tensor& gpu, const Tensor& cpu, const test::Tolerance& tol,
                             const std::string& what, bool print = true) {
  const Tensor mag = test::channel_magnitude(cpu);
  const test::Closeness c = test::check_close(gpu, cpu, tol, what, &mag);
  if (print)
    std::cout << fmt::format("{}: {} of {} elements out of bounds, the nearest at {:.3g} of its "
                             "bound ({})\n",
                             what, c.failed, c.n, c.worst, tol.kind);
  return c;
}

const char* kernel_label(const std::optional<ConvKernel>& k) {
  return k ? conv_kernel_name(*k) : "selected";
}

// Each conv kernel forced, then as selected.
const std::optional<ConvKernel> kEachKernel[] = {ConvKernel::Scalar, ConvKernel::Tiled,
                                                 ConvKernel::Gemm, std::nullopt};

// Runs `g` on the GPU with conv kernel `force` (or as selected, and unfused when `fuse` is
// false) and compares every output with the CPU reference; `print`: each output's error too.
void check_model(const std::string& key, const Graph& g, std::optional<ConvKernel> force,
                 bool fuse = true, bool print = true) {
  const std::map<std::string, Tensor> inputs = random_inputs(g, 1000);
  const std::map<std::string, Tensor>& ref = reference(key, g, inputs);
  CompileOptions o;
  o.device = Device::CUDA;
  o.force_conv = force;
  o.fuse = fuse;
  bool uses_gemm = false;
  const std::map<std::string, Tensor> got = run(g, o, inputs, &uses_gemm);
  REQUIRE(got.size() == ref.size());
  for (const auto& [name, cpu] : ref) {
    const std::string label = fmt::format("{} [{}{}] {} {}", key, kernel_label(force),
                                          fuse ? "" : ", unfused", name, shape_str(cpu.shape()));
    check_output(got.at(name), cpu, uses_gemm ? test::kTf32Graph : test::kSimtGraph, label, print);
  }
}

// g's outputs on the GPU as selected (on the host), with copy avoidance on and off, and the
// nodes that ran no kernel with it on.
struct OnOff {
  std::vector<std::string> no_kernel;
  std::map<std::string, Tensor> on, off;
};
OnOff run_on_off(const Graph& g, const std::map<std::string, Tensor>& inputs) {
  CompileOptions o;
  o.device = Device::CUDA;
  Compiled c = compile(g, o);
  std::unique_ptr<Backend> backend = make_backend(Device::CUDA);
  Executor on(c.plan, *backend), off(c.plan, *backend);
  off.set_in_place(false);
  OnOff r{on.in_place_nodes(), on.run(inputs), off.run(inputs)};
  for (auto* outputs : {&r.on, &r.off})
    for (auto& [name, t] : *outputs) t = t.to(Device::CPU);
  for (const auto& [name, t] : r.on) REQUIRE(t.shape() == r.off.at(name).shape());
  return r;
}

// Each of `nodes` ran in place (no kernel of its own) in r's run.
void check_in_place(const OnOff& r, std::initializer_list<const char*> nodes) {
  for (const char* node : nodes) {
    INFO(node);
    CHECK(std::find(r.no_kernel.begin(), r.no_kernel.end(), node) != r.no_kernel.end());
  }
}

Graph yolo_small() {
  Builder b(/*seed=*/1);
  return yolo::yolo_like(b, /*batch=*/2, /*size=*/128);
}

}  // namespace

TEST_CASE("gpu models: yolo_like with every fused conv on the scalar kernel", "[gpu][models]") {
  check_model("yolo_like b2 128", yolo_small(), ConvKernel::Scalar);
}

TEST_CASE("gpu models: yolo_like with every fused conv on the tiled kernel", "[gpu][models]") {
  check_model("yolo_like b2 128", yolo_small(), ConvKernel::Tiled);
}

TEST_CASE("gpu models: yolo_like with every fused conv on the gemm kernel", "[gpu][models]") {
  check_model("yolo_like b2 128", yolo_small(), ConvKernel::Gemm);
}

TEST_CASE("gpu models: yolo_like with the kernels the selector picks", "[gpu][models]") {
  check_model("yolo_like b2 128", yolo_small(), std::nullopt);
}

TEST_CASE("gpu models: yolo_like unfused (conv2d, batchnorm, silu on the GPU)", "[gpu][models]") {
  check_model("yolo_like b2 128", yolo_small(), std::nullopt, /*fuse=*/false);
}

TEST_CASE("gpu models: every models/*.json with each conv kernel", "[gpu][models]") {
  for (const std::filesystem::path& file : test::model_files()) {
    const Graph g = load_model(file.string());
    for (std::optional<ConvKernel> force : kEachKernel) {
      INFO(file.filename().string() << " with " << kernel_label(force));
      check_model(file.filename().string(), g, force);
    }
  }
}

TEST_CASE("gpu models: random conv nets with each conv kernel, copy avoidance on and off",
          "[gpu][models][random]") {
  // test::random_convnet graphs, 40 small and 10 large (the CPU suite runs them fused, in place
  // and folded against the unfused graph): every output with each conv kernel forced and as
  // selected, within the bounds above, their errors unprinted; as selected with copy avoidance
  // on (folds included) and off, within the TF32 bound (a folded conv pair or chain rounds apart
  // from its two kernels).
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    const bool large = seed > 40;  // where lowering also folds conv chains and upsamplings
    const Graph g = test::random_convnet(seed, large);
    const std::string key =
        "test::random_convnet(" + std::to_string(seed) + (large ? ", large)" : ")");
    for (std::optional<ConvKernel> force : kEachKernel)
      check_model(key, g, force, true, /*print=*/false);
    const std::map<std::string, Tensor> inputs = random_inputs(g, 1000);  // check_model's
    const OnOff r = run_on_off(g, inputs);
    for (const auto& [output, want] : reference(key, g, inputs)) {
      check_output(r.on.at(output), want, test::kTf32Graph, key + ", output " + output + ", in place",
                   false);
      check_output(r.off.at(output), want, test::kTf32Graph, key + ", output " + output + ", copied",
                   false);
    }
  }
}

TEST_CASE("gpu executor: replays of the recorded model follow new inputs", "[gpu][models]") {
  const Graph g = yolo_small();
  CompileOptions o;
  o.device = Device::CUDA;
  Compiled c = compile(g, o);
  std::unique_ptr<Backend> backend = make_backend(Device::CUDA);
  Executor ex(std::move(c.plan), *backend);
  for (uint64_t seed : {1u, 2u, 3u}) {
    const std::map<std::string, Tensor> inputs = random_inputs(g, 500 * seed);
    CompileOptions ref_options;
    ref_options.fuse = false;
    const std::map<std::string, Tensor> want = run(g, ref_options, inputs);
    const std::map<std::string, Tensor> got = ex.run(inputs);
    CHECK(ex.replaying());  // from the first run on, later runs replay the CUDA graph
    for (const auto& [name, cpu] : want)
      check_output(got.at(name), cpu, test::kTf32Graph,
                   fmt::format("run with seed {}, output {}", seed, name), false);
  }
}

TEST_CASE("gpu executor: in-place concats and chunks at batch 2 match copying bit for bit",
          "[gpu][models]") {
  // At batch 2 the in-place values are strided channel slabs: every conv kernel, the adds, the
  // max-pools and the upsampling write or read them. The same kernels on the same numbers must
  // give the same bits as the copying run.
  const Graph g = yolo_small();
  const std::map<std::string, Tensor> inputs = random_inputs(g, 77);
  for (std::optional<ConvKernel> force : kEachKernel) {
    CompileOptions o;
    o.device = Device::CUDA;
    o.force_conv = force;
    Compiled c = compile(g, o);
    std::unique_ptr<Backend> backend = make_backend(Device::CUDA);
    Executor on(c.plan, *backend), off(c.plan, *backend);
    off.set_in_place(false);
    // The 13 concats and 8 chunks, and SPPF's second and third pools, which the first makes; as
    // selected also the stem conv, which the next conv's kernel makes (conv pair, where the
    // device has the wgmma kernels).
    const bool pair = !force && test::wgmma_here();
    const std::vector<std::string> no_kernel = on.in_place_nodes();
    CHECK(no_kernel.size() == (pair ? 24 : 23));
    for (const char* pool : {"b9.m_1", "b9.m_2"})
      CHECK(std::find(no_kernel.begin(), no_kernel.end(), pool) != no_kernel.end());
    CHECK((std::find(no_kernel.begin(), no_kernel.end(), "b0.conv") != no_kernel.end()) == pair);
    std::map<std::string, Tensor> a = on.run(inputs), b = off.run(inputs);
    REQUIRE(a.size() == b.size());
    for (const auto& [name, t] : b) {
      const Tensor x = a.at(name).to(Device::CPU), y = t.to(Device::CPU);
      INFO(kernel_label(force) << " output " << name);
      REQUIRE(x.shape() == y.shape());
      // The pair kernel sums the stem's products in another order than the stem kernel, and
      // lowering may run the second conv on other tiles (a split reduction on small grids): the
      // same numbers to TF32's precision, not the same bits.
      if (pair)
        check_output(x, y, test::kTf32Graph, std::string("in place against copied, ") + name, false);
      else
        CHECK(std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0);
    }
  }
}

TEST_CASE("gpu executor: a DenseNet block's concats as views of the last one's buffer",
          "[gpu][models]") {
  // At batch 2 every feature and every concat but the last is a strided slab of its buffer: the
  // pool and the convs write them, the elementwise chains and the convs read them (32-channel
  // features, so that the gemm kernels take the convs). Against the CPU, and in place against
  // copying bit for bit.
  const Graph g = test::dense_block(2, 32, 32, 4, 16);
  const std::map<std::string, Tensor> inputs = random_inputs(g, 78);
  check_model("dense_block", g, std::nullopt);
  const OnOff r = run_on_off(g, inputs);
  CHECK(r.no_kernel == std::vector<std::string>{"cat1", "cat2", "cat3", "cat_all"});
  for (const auto& [name, t] : r.off) {
    INFO("output " << name);
    CHECK(std::memcmp(r.on.at(name).raw(), t.raw(), t.nbytes()) == 0);
  }
}

TEST_CASE("gpu executor: DenseNet's batchnorm -> relu as its 1x1 conv's prologue matches the CPU",
          "[gpu][models][prologue][sm90a]") {
  // A DenseNet-BC block at batch 8 on 32x32 planes: each layer's batchnorm -> relu folded into
  // the loads of its 1x1 conv, the wgmma direct kernel (by cp.async on the first layer's 32
  // channels, by tensor copies on the others' 64 and 96), reading the concats' strided slabs.
  // The folded run and the run with copy avoidance off (the elementwise as its own kernel) must
  // both match the CPU.
  const Graph g = test::dense_block(8, 32, 32, 3, 32, 128);
  const std::map<std::string, Tensor> inputs = random_inputs(g, 80);
  const std::map<std::string, Tensor>& ref = reference("dense_block bc", g, inputs);
  const OnOff r = run_on_off(g, inputs);
  check_in_place(r, {"relu0", "relu1", "relu2"});
  for (const auto& [name, want] : ref) {
    check_output(r.on.at(name), want, test::kTf32Graph, "prologues, " + name);
    check_output(r.off.at(name), want, test::kTf32Graph, "no prologues, " + name);
  }
}

TEST_CASE("gpu executor: an upsampling folded into the conv that reads it matches the CPU",
          "[gpu][models][upsample][sm90a]") {
  // The YOLO neck's join (test::join_graph), the upsampled part first and second, at a size
  // where lowering folds the upsampling into the conv's loads. The folded run must match the CPU,
  // and the run with copy avoidance off (the upsampling and the concat as kernels) bit for bit.
  for (const bool up_first : {true, false}) {
    const Graph g = test::join_graph(up_first);
    const std::string key = up_first ? "join, upsampled first" : "join, upsampled second";
    INFO(key);
    const std::map<std::string, Tensor> inputs = random_inputs(g, 300);
    const std::map<std::string, Tensor>& ref = reference(key, g, inputs);
    const OnOff r = run_on_off(g, inputs);
    REQUIRE(std::find(r.no_kernel.begin(), r.no_kernel.end(), "up") != r.no_kernel.end());
    const Tensor &on = r.on.at("join.act"), &off = r.off.at("join.act");
    check_output(on, ref.at("join.act"), test::kTf32Graph, key);
    CHECK(std::memcmp(on.raw(), off.raw(), on.nbytes()) == 0);
  }
}

TEST_CASE("gpu executor: a stem conv folded into the conv that reads it matches the CPU",
          "[gpu][models][pair][sm90a]") {
  // A stem (3 -> 16 channels, 3x3 at stride 2) and the conv that reads it (16 -> 32, 3x3 at
  // stride 2) with batchnorm and SiLU, then a 1x1 conv, at batch 3 on a plane that no square
  // divides: lowering folds the stem into the second conv (the conv pair kernel). The folded run
  // and the run with copy avoidance off (each conv its own kernel) must both match the CPU.
  Builder b(/*seed=*/8);
  Val stem = test::conv_bn_silu(b, b.input("images", {3, 3, 150, 198}), "stem", 16, 3, 2);
  b.output(test::conv_bn_silu(b, test::conv_bn_silu(b, stem, "down", 32, 3, 2), "head", 24, 1, 1));
  const Graph g = b.build();
  const std::map<std::string, Tensor> inputs = random_inputs(g, 500);
  const std::map<std::string, Tensor>& ref = reference("stem pair", g, inputs);
  const OnOff r = run_on_off(g, inputs);
  CHECK(r.no_kernel == std::vector<std::string>{"stem"});
  for (const auto& [label, got] :
       {std::pair<const char*, const Tensor*>{"folded", &r.on.at("head.act")},
        std::pair<const char*, const Tensor*>{"unfolded", &r.off.at("head.act")}}) {
    check_output(*got, ref.at("head.act"), test::kTf32Graph, std::string("stem pair, ") + label);
  }
}

TEST_CASE("gpu executor: a 1x1 conv folded into the conv before it matches the CPU",
          "[gpu][models][chain][sm90a]") {
  // A 3x3 stride-2 conv (24 -> 64 channels) and the 1x1 conv that alone reads it (64 -> 64),
  // then a 3x3 conv reading that, each with batchnorm and SiLU, at batch 3 on a plane that no
  // square divides: lowering folds the 1x1 into the first conv (the conv chain). The folded run
  // and the run with copy avoidance off (each conv its own kernel) must both match the CPU.
  Builder b(/*seed=*/12);
  Val down = test::conv_bn_silu(b, b.input("x", {3, 24, 150, 198}), "down", 64, 3, 2);
  b.output(test::conv_bn_silu(b, test::conv_bn_silu(b, down, "cv1", 64, 1, 1), "head", 24, 3, 1));
  const Graph g = b.build();
  const std::map<std::string, Tensor> inputs = random_inputs(g, 600);
  const std::map<std::string, Tensor>& ref = reference("conv chain", g, inputs);
  const OnOff r = run_on_off(g, inputs);
  CHECK(r.no_kernel == std::vector<std::string>{"cv1"});
  for (const auto& [label, got] :
       {std::pair<const char*, const Tensor*>{"folded", &r.on.at("head.act")},
        std::pair<const char*, const Tensor*>{"unfolded", &r.off.at("head.act")}}) {
    check_output(*got, ref.at("head.act"), test::kTf32Graph, std::string("conv chain, ") + label);
  }
}

TEST_CASE("gpu executor: SPPF's cascade of max-pools as one kernel matches the CPU bit for bit",
          "[gpu][models][pool]") {
  // A conv, then 5x5 "same" pools p1 -> p2 -> p3 -> p4 (p1 makes p2 and p3, p4 starts anew) and
  // a 3x3 one after them, all read by one concat: at batch 1 contiguous, at batch 3 each a
  // strided slab of the concat's buffer. Max-pooling is exact: the pools' channels of the output
  // must equal the CPU's pools of the GPU's conv output, with the chain and without it.
  for (const int64_t batch : {int64_t(1), int64_t(3)}) {
    Builder b(/*seed=*/6);
    Val x = b.conv2d(b.input("x", {batch, 8, 13, 20}), "conv", ConvOpts(24, 1));
    const PoolOpts five = PoolOpts(5).stride(1).padding(2);
    Val p1 = b.maxpool2d(x, five, "p1");
    Val p2 = b.maxpool2d(p1, five, "p2");
    Val p3 = b.maxpool2d(p2, five, "p3");
    Val p4 = b.maxpool2d(p3, five, "p4");
    Val p5 = b.maxpool2d(p4, PoolOpts(3).stride(1).padding(1), "p5");
    b.output(b.concat({x, p1, p2, p3, p4, p5}, 1, "cat"));
    const Graph g = b.build();
    const std::map<std::string, Tensor> inputs = random_inputs(g, 40);
    const OnOff got = run_on_off(g, inputs);
    const std::vector<std::string>& no_kernel = got.no_kernel;
    INFO("batch " << batch);
    CHECK(std::find(no_kernel.begin(), no_kernel.end(), "p2") != no_kernel.end());
    CHECK(std::find(no_kernel.begin(), no_kernel.end(), "p3") != no_kernel.end());
    CHECK(std::find(no_kernel.begin(), no_kernel.end(), "p4") == no_kernel.end());
    const Tensor &y_on = got.on.at("cat"), &y_off = got.off.at("cat");
    CHECK(std::memcmp(y_on.raw(), y_off.raw(), y_on.nbytes()) == 0);
    // The CPU's pools of the GPU's conv output (channels 0..23 of the concat).
    Builder r(/*seed=*/6);
    Val rx = r.input("x", {batch, 24, 13, 20});
    Val r1 = r.maxpool2d(rx, five, "p1");
    Val r2 = r.maxpool2d(r1, five, "p2");
    Val r3 = r.maxpool2d(r2, five, "p3");
    Val r4 = r.maxpool2d(r3, five, "p4");
    r.output(r.concat({rx, r1, r2, r3, r4, r.maxpool2d(r4, PoolOpts(3).stride(1).padding(1), "p5")},
                      1, "cat"));
    const int64_t plane = 13 * 20, item = 6 * 24 * plane;
    Tensor conv_out = Tensor::empty({batch, 24, 13, 20});
    for (int64_t n = 0; n < batch; ++n)
      std::memcpy(conv_out.f32() + n * 24 * plane, y_on.f32() + n * item,
                  sizeof(float) * 24 * plane);
    CompileOptions cpu;
    cpu.device = Device::CPU;
    const Tensor want = run(r.build(), cpu, {{"x", conv_out}}).at("cat");
    REQUIRE(want.shape() == y_on.shape());
    CHECK(std::memcmp(y_on.raw(), want.raw(), want.nbytes()) == 0);
  }
}

TEST_CASE("gpu executor: a conv of two wide groups, split a conv a group, matches the CPU",
          "[gpu][models]") {
  // ResNeSt's radix conv at batch 2: the passes split it into a gemm conv a group reading the
  // split's strided views, its residual split too, writing the concat in place. Against the
  // unfused CPU graph, and in place against copying bit for bit.
  const Graph g = test::radix_conv(2, 20);
  const std::map<std::string, Tensor> inputs = random_inputs(g, 81);
  const std::map<std::string, Tensor>& ref = reference("radix", g, inputs);
  const OnOff r = run_on_off(g, inputs);
  check_in_place(r, {"radix.groups", "radix.residuals", "radix.concat"});
  for (const auto& [name, want] : ref) {
    check_output(r.on.at(name), want, test::kTf32Graph, "split groups, " + name);
    CHECK(std::memcmp(r.on.at(name).raw(), r.off.at(name).raw(), want.nbytes()) == 0);
  }
}
