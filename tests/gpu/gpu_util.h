// Helpers shared by the GPU tests: the wgmma test, and the one GPU-vs-CPU comparison.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <sstream>
#include <string>

#include "epilog/graph/lowering.h"
#include "epilog/kernels/cpu.h"
#include "epilog/runtime/executor.h"

namespace epilog::test {

// Whether this GPU and build run the wgmma kernels (compute capability 9.0 and sm_90a code). The
// test cases that need them are tagged [sm90a]; where they cannot run, main() skips them (exit
// code 77, which ctest reports as skipped).
inline bool wgmma_here() {
  return cuda_device_profile().value_or(h200_profile()).wgmma;
}

// How far a GPU output may lie from the CPU reference, element by element:
//   |gpu_i - cpu_i| <= atol * mag_i + rtol * |cpu_i|
// where mag_i is the size that element's rounding errors scale with (conv_magnitude,
// channel_magnitude; 1 where none is given). A NaN on one side only fails; on both it passes.
struct Tolerance {
  double atol = 0, rtol = 0;
  const char* kind = "";
};

// Ops that round a few float32 operations an element (elementwise, batchnorm, pooling, copies,
// linear) on values of order 1.
constexpr Tolerance kFloat32Op{1e-5, 1e-5, "float32 op"};
// The SIMT conv kernels (scalar, tiled) against conv_magnitude: the same float32 products summed
// in another order than the CPU's, and the activation by exp2 and reciprocal (within 3e-6).
constexpr Tolerance kSimtConv{1e-5, 1e-5, "SIMT float32 conv"};
// gemm's TF32 tensor-core kernels against conv_magnitude: each operand is rounded to 10 mantissa
// bits, so a product is off by at most 2^-10 of itself (2^-9 truncated), and their float32 sum by
// at most 2^-9 of sum |x w| plus the sum's own rounding; times the activation's slope (SiLU's is
// under 1.1), under 2.5e-3 of the magnitude for reductions up to 4096 deep. The magnitude grows
// with the reduction, and so does the bound.
constexpr Tolerance kTf32Conv{2.5e-3, 2e-3, "TF32 conv"};
// Whole graphs against channel_magnitude, where rounding compounds over the layers: with the SIMT
// conv kernels (the H200 measured up to 4.5e-6 of the largest output)...
constexpr Tolerance kSimtGraph{2e-5, 1e-5, "SIMT float32 graph"};
// ...and with any TF32 kernel: each layer rounds its inputs and weights to 10 mantissa bits, and
// the YOLO-like model's deepest outputs (n15, n18, n21, over 20 layers) measured up to 1.0e-2 of
// their channel's magnitude on an H100 (2026-12-06), in a few elements of thousands; a wrong
// index or epilogue is off by the magnitude itself.
constexpr Tolerance kTf32Graph{1.5e-2, 2e-3, "TF32 graph"};

// |scale_k| * sum over the window of |x| * |w|, for every output of conv `s` (x contiguous;
// scale null: 1): a bound on what each output's products sum to in absolute value, which
// their rounding errors are a fraction of. Shift, residual and activation add no products.
inline Tensor conv_magnitude(const ConvShape& s, const Tensor& x, const Tensor& w,
                             const float* scale = nullptr) {
  const auto abs_of = [](const Tensor& t) {
    Tensor a = t.to(Device::CPU).clone();
    for (int64_t i = 0; i < a.numel(); ++i) a.f32()[i] = std::abs(a.f32()[i]);
    return a;
  };
  const Tensor ax = abs_of(x), aw = abs_of(w);
  Tensor ascale;
  if (scale) {
    ascale = Tensor::empty({s.k});
    for (int64_t k = 0; k < s.k; ++k) ascale.f32()[k] = std::abs(scale[k]);
  }
  ConvShape plain = s;  // contiguous, whatever strides the kernel ran with
  plain.x_stride = plain.y_stride = plain.r_stride = 0;
  Tensor mag = Tensor::empty({s.n, s.k, s.ho, s.wo});
  cpu::conv2d(plain, ax.f32(), aw.f32(), scale ? ascale.f32() : nullptr, nullptr, Activation::None,
              mag.f32(), nullptr);
  return mag;
}

// For each element of `ref` (N, C, ...), the largest |ref| of its channel, or the RMS of all of
// `ref` where that is larger (a channel the activation left near zero): whole graphs' errors scale
// with the values a channel's convs sum, which its own largest output follows.
inline Tensor channel_magnitude(const Tensor& ref) {
  const Shape& shape = ref.shape();
  const int64_t n = shape.empty() ? 1 : shape[0], c = shape.size() < 2 ? 1 : shape[1];
  const int64_t inner = ref.numel() / std::max<int64_t>(1, n * c);
  double sum2 = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) sum2 += double(ref.f32()[i]) * ref.f32()[i];
  const double rms = ref.numel() ? std::sqrt(sum2 / double(ref.numel())) : 0.0;
  std::vector<double> top(size_t(c), rms);
  for (int64_t i = 0; i < ref.numel(); ++i) {
    double& t = top[size_t(i / inner % c)];
    t = std::max(t, double(std::abs(ref.f32()[i])));
  }
  Tensor mag = Tensor::empty(shape);
  for (int64_t i = 0; i < ref.numel(); ++i) mag.f32()[i] = float(top[size_t(i / inner % c)]);
  return mag;
}

// Elements of a comparison outside their bound: how many, and the first.
struct Closeness {
  int64_t failed = 0, first = -1, n = 0;
  float gpu = 0, cpu = 0;
  double bound = 0;
  double worst = 0;  // the largest |gpu - cpu| / bound: how near the bound the output came
};

inline Closeness closeness(const float* gpu, const float* cpu, int64_t n, const Tolerance& tol,
                           const float* mag = nullptr) {
  Closeness c;
  c.n = n;
  for (int64_t i = 0; i < n; ++i) {
    const double bound = tol.atol * (mag ? double(mag[i]) : 1.0) + tol.rtol * std::abs(cpu[i]);
    const double d = std::abs(double(gpu[i]) - double(cpu[i]));
    const bool ok = std::isnan(gpu[i]) || std::isnan(cpu[i])
                        ? std::isnan(gpu[i]) && std::isnan(cpu[i])
                        : d <= bound;
    if (!(std::isnan(gpu[i]) && std::isnan(cpu[i])))
      c.worst = std::max(c.worst, std::isnan(d) ? HUGE_VAL
                                  : bound > 0   ? d / bound
                                  : d > 0       ? HUGE_VAL
                                                : 0.0);
    if (!ok && c.failed++ == 0) {
      c.first = i;
      c.gpu = gpu[i];
      c.cpu = cpu[i];
      c.bound = bound;
    }
  }
  return c;
}

// The GPU output `gpu` (on either device) against the CPU's `cpu`, element by element (mag: per
// element, as `cpu`; see Tolerance). A failure names the first element out of bounds, its two
// values and bound, and how many elements failed. Returns the comparison.
inline Closeness check_close(const Tensor& gpu, const Tensor& cpu, const Tolerance& tol,
                             const std::string& what, const Tensor* mag = nullptr) {
  REQUIRE(gpu.shape() == cpu.shape());
  if (mag) REQUIRE(mag->shape() == cpu.shape());
  const Tensor g = gpu.to(Device::CPU);
  const Closeness c = closeness(g.f32(), cpu.f32(), cpu.numel(), tol, mag ? mag->f32() : nullptr);
  std::ostringstream msg;
  msg << what << ": " << c.failed << " of " << c.n
      << " elements outside |gpu - cpu| <= " << tol.atol << (mag ? " * magnitude" : "") << " + "
      << tol.rtol << " * |cpu| (" << tol.kind << "), the nearest at " << c.worst << " of its bound";
  if (c.failed)
    msg << "; the first, element " << c.first << ": gpu " << c.gpu << ", cpu " << c.cpu
        << ", bound " << c.bound;
  INFO(msg.str());
  CHECK(c.failed == 0);
  return c;
}

// check_close as a requirement: the test case stops at the first output out of bounds.
inline void require_close(const Tensor& gpu, const Tensor& cpu, const std::string& what,
                          const Tolerance& tol = kFloat32Op, const Tensor* mag = nullptr) {
  REQUIRE(check_close(gpu, cpu, tol, what + " " + shape_str(cpu.shape()), mag).failed == 0);
}

// models/*.json, sorted. Binaries built on one machine run on another (tools/gpu-check.sh
// --prebuilt), where the sources sit elsewhere: EPILOG_SOURCE_DIR in the environment may say where.
inline std::vector<std::filesystem::path> model_files() {
  namespace fs = std::filesystem;
  const char* env = std::getenv("EPILOG_SOURCE_DIR");
  const fs::path dir = fs::path(env && *env ? env : EPILOG_SOURCE_DIR) / "models";
  std::vector<fs::path> files;
  if (fs::is_directory(dir))
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  INFO("models/*.json in " << dir.string());
  REQUIRE(!files.empty());
  return files;
}

inline Backend& cuda_backend() {
  static std::unique_ptr<Backend> backend = make_cuda_backend();
  REQUIRE(backend);
  return *backend;
}

// Runs the graph's single node on both backends with the given inputs (host tensors; inputs
// not given are drawn from randn), poisoning the device outputs first. `device_inputs`
// overrides the device copy of an input (views at odd offsets). Returns cpu and gpu outputs.
struct Outputs {
  std::vector<Tensor> cpu, gpu;
  std::vector<Tensor> inputs;  // the node's host inputs, in order
};
inline Outputs run_node(const Graph& g, std::map<std::string, Tensor> feeds = {},
                        const std::map<std::string, Tensor>& device_inputs = {},
                        const NodePlan& plan = {}) {
  REQUIRE(g.nodes.size() == 1);
  const Node& node = g.nodes[0];
  uint64_t seed = 100;
  for (const std::string& in : g.inputs)
    if (!feeds.count(in)) feeds[in] = Tensor::randn(g.value(in).shape, seed++);
  std::vector<Tensor> cpu_in, gpu_in;
  for (const std::string& in : node.inputs) {
    const Tensor& host = g.is_weight(in) ? g.weights.at(in).data : feeds.at(in);
    cpu_in.push_back(host);
    auto d = device_inputs.find(in);
    gpu_in.push_back(d != device_inputs.end() ? d->second : host.to(Device::CUDA));
  }
  Outputs o;
  o.inputs = cpu_in;
  for (const std::string& out : node.outputs) {
    const Shape& s = g.value(out).shape;
    o.cpu.push_back(Tensor::empty(s));
    o.gpu.push_back(Tensor::full(s, std::numeric_limits<float>::quiet_NaN()).to(Device::CUDA));
  }
  make_cpu_backend()->run(node, NodePlan{}, cpu_in, o.cpu);
  Backend& gpu = cuda_backend();
  gpu.run(node, plan, gpu_in, o.gpu);
  gpu.synchronize();
  return o;
}

}  // namespace epilog::test
