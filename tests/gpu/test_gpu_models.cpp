// Whole models on the GPU against the CPU reference: the YOLO-like model and every
// models/*.json, through compile() with each conv kernel forced in turn and as selected.
//
// The reference is the unfused graph on the CPU (what the model means). Tolerances:
// max |gpu - cpu| / max |cpu| per output (the error against the output's scale), at most
//   2e-5 with the SIMT conv kernels (scalar, tiled) and the unfused GPU graph: float32 with
//     its rounding carried through ~60 layers (the H200 shows up to 4.5e-6);
//   5e-3 with any gemm kernel (TF32 tensor cores).
// Each comparison prints its error, so the logs record how far from the bound a card is.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>

#include "epilog/epilog.h"
#include "epilog/io/model.h"
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
    for (size_t i = 0; i < c.plan.nodes.size(); ++i)
      if (c.plan.graph.nodes[i].op == OpKind::FusedConv2d &&
          c.plan.nodes[i].conv == ConvKernel::Gemm)
        *uses_gemm = true;
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

struct Mismatch {
  double max_norm = 0;  // max |gpu - cpu| / max |cpu|
};

Mismatch mismatch(const Tensor& gpu, const Tensor& cpu) {
  REQUIRE(gpu.shape() == cpu.shape());
  const float *g = gpu.f32(), *c = cpu.f32();
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    double d = std::abs(double(g[i]) - double(c[i]));
    if (std::isnan(d)) d = std::numeric_limits<double>::infinity();
    diff = std::max(diff, d);
    norm = std::max(norm, std::abs(double(c[i])));
  }
  return {norm > 0 ? diff / norm : diff};
}

const char* kernel_label(const std::optional<ConvKernel>& k) {
  return k ? conv_kernel_name(*k) : "selected";
}

// Runs `g` on the GPU with conv kernel `force` (or as selected, and unfused when `fuse` is
// false) and compares every output with the CPU reference.
void check_model(const std::string& key, const Graph& g, std::optional<ConvKernel> force,
                 bool fuse = true) {
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
    const Mismatch e = mismatch(got.at(name), cpu);
    const std::string label = fmt::format("{} [{}{}] {} {}", key, kernel_label(force),
                                          fuse ? "" : ", unfused", name, shape_str(cpu.shape()));
    const double bound = uses_gemm ? 5e-3 : 2e-5;
    std::cout << fmt::format("{}: max-norm error {:.3g} (bound {:g})\n", label, e.max_norm, bound);
    INFO(label << ": max-norm error " << e.max_norm);
    REQUIRE(e.max_norm <= bound);
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
  namespace fs = std::filesystem;
  // Binaries built on one machine run on another (tools/gpu-check.sh --prebuilt), where the
  // sources sit elsewhere: the environment may say where.
  const char* env = std::getenv("EPILOG_SOURCE_DIR");
  const fs::path dir = fs::path(env && *env ? env : EPILOG_SOURCE_DIR) / "models";
  std::vector<fs::path> files;
  if (fs::is_directory(dir))
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  if (files.empty()) WARN("no models/*.json in " << dir.string());
  for (const fs::path& file : files) {
    const Graph g = load_model(file.string());
    for (std::optional<ConvKernel> force :
         {std::optional<ConvKernel>(ConvKernel::Scalar),
          std::optional<ConvKernel>(ConvKernel::Tiled), std::optional<ConvKernel>(ConvKernel::Gemm),
          std::optional<ConvKernel>()}) {
      INFO(file.filename().string() << " with " << kernel_label(force));
      check_model(file.filename().string(), g, force);
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
    for (const auto& [name, cpu] : want) {
      INFO("run with seed " << seed << ", output " << name);
      CHECK(mismatch(got.at(name).to(Device::CPU), cpu).max_norm <= 5e-3);
    }
  }
}

TEST_CASE("gpu executor: in-place concats and chunks at batch 2 match copying bit for bit",
          "[gpu][models]") {
  // At batch 2 the in-place values are strided channel slabs: every conv kernel, the adds, the
  // max-pools and the upsampling write or read them. The same kernels on the same numbers must
  // give the same bits as the copying run.
  const Graph g = yolo_small();
  const std::map<std::string, Tensor> inputs = random_inputs(g, 77);
  for (std::optional<ConvKernel> force :
       {std::optional<ConvKernel>(ConvKernel::Scalar), std::optional<ConvKernel>(ConvKernel::Tiled),
        std::optional<ConvKernel>(ConvKernel::Gemm), std::optional<ConvKernel>()}) {
    CompileOptions o;
    o.device = Device::CUDA;
    o.force_conv = force;
    Compiled c = compile(g, o);
    std::unique_ptr<Backend> backend = make_backend(Device::CUDA);
    Executor on(c.plan, *backend), off(c.plan, *backend);
    off.set_in_place(false);
    CHECK(on.in_place_nodes().size() == 21);
    std::map<std::string, Tensor> a = on.run(inputs), b = off.run(inputs);
    REQUIRE(a.size() == b.size());
    for (const auto& [name, t] : b) {
      const Tensor x = a.at(name).to(Device::CPU), y = t.to(Device::CPU);
      INFO(kernel_label(force) << " output " << name);
      REQUIRE(x.shape() == y.shape());
      CHECK(std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0);
    }
  }
}

TEST_CASE("gpu executor: an upsampling folded into the conv that reads it matches the CPU",
          "[gpu][models][upsample]") {
  // The YOLO neck's join, conv(concat(upsample(a), s)), at a size where lowering folds the
  // upsampling into the conv's loads (the wgmma direct kernel; 40 upsampled channels, so a k tile
  // holds both parts), the upsampled part first and second. The folded run must match the CPU,
  // and the run with copy avoidance off (the upsampling and the concat as kernels) bit for bit.
  if (!cuda_device_profile().value_or(h200_profile()).wgmma) {
    WARN("no warpgroup MMA here (needs compute capability 9.0 and an sm_90a build): skipped");
    return;
  }
  for (const bool up_first : {true, false}) {
    Builder b(/*seed=*/4);
    const auto cbs = [&](Val x, const std::string& name, int64_t c) {
      return b.silu(b.batchnorm(b.conv2d(x, name, ConvOpts(c, 1)), name + ".bn"), name + ".act");
    };
    Val a = cbs(b.input("lo", {4, 8, 20, 24}), "a", 40);
    Val s = cbs(b.input("hi", {4, 8, 40, 48}), "s", 24);
    Val u = b.upsample_nearest(a, 2, "up");
    b.output(cbs(b.concat(up_first ? std::vector<Val>{u, s} : std::vector<Val>{s, u}, 1, "cat"),
                 "join", 128));
    const Graph g = b.build();
    const std::string key = up_first ? "join, upsampled first" : "join, upsampled second";
    INFO(key);
    const std::map<std::string, Tensor> inputs = random_inputs(g, 300);
    const std::map<std::string, Tensor>& ref = reference(key, g, inputs);
    CompileOptions o;
    o.device = Device::CUDA;
    Compiled c = compile(g, o);
    std::unique_ptr<Backend> backend = make_backend(Device::CUDA);
    Executor on(c.plan, *backend), off(c.plan, *backend);
    off.set_in_place(false);
    const std::vector<std::string> no_kernel = on.in_place_nodes();
    REQUIRE(std::find(no_kernel.begin(), no_kernel.end(), "up") != no_kernel.end());
    const Tensor y_on = on.run(inputs).at("join.act").to(Device::CPU);
    const Tensor y_off = off.run(inputs).at("join.act").to(Device::CPU);
    const Mismatch e = mismatch(y_on, ref.at("join.act"));
    std::cout << fmt::format("{}: max-norm error {:.3g} (bound 5e-3)\n", key, e.max_norm);
    CHECK(e.max_norm <= 5e-3);
    REQUIRE(y_on.shape() == y_off.shape());
    CHECK(std::memcmp(y_on.raw(), y_off.raw(), y_on.nbytes()) == 0);
  }
}
