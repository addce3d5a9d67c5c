// The conv bench: for every shape of a shape suite, conv2d -> batchnorm -> silu run as each of
// the three fused kernels, as our unfused three-kernel sequence, and as cuDNN's convolution
// followed by our batchnorm + silu pass (the anchor, in the same process). Every variant is
// checked against the CPU reference before it is timed.
//
// Timing: REPS launches captured into one CUDA graph, replayed; CUDA events; median of the
// replays. Inputs rotate over enough buffers to exceed the L2 cache. Prints a table and, with
// --json FILE, one JSON object per shape (joinable with bench/torch_conv_bn_silu.py).
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "epilog/graph/lowering.h"
#include "epilog/kernels/cpu.h"
#include "epilog/kernels/cuda.h"
#include "epilog/runtime/executor.h"

namespace {

using namespace epilog;
using nlohmann::json;

constexpr int kReps = 20;
constexpr int kReplays = 50;

#define CUDNN_CHECK(call)                                                                   \
  do {                                                                                      \
    cudnnStatus_t s_ = (call);                                                              \
    if (s_ != CUDNN_STATUS_SUCCESS)                                                         \
      fail("cuDNN error: {} failed: {} at {}:{}", #call, cudnnGetErrorString(s_), __FILE__, \
           __LINE__);                                                                       \
  } while (0)

struct Options {
  std::string shapes = "tools/conv_shapes.json";
  std::string json_out;
  double copy_gbps = 4250;  // ceilings of the card, PERF.md (measured on an H200)
  double tf32_tflops = 358;
  std::string only;    // run only shapes whose name contains this
  bool sweep = false;       // also time every built tile combination
  bool sweep_gemm = false;  // ...of gemm only (tiled's take milliseconds on big shapes)
};

// Device buffers that free themselves.
struct DeviceBuffer {
  float* ptr = nullptr;
  explicit DeviceBuffer(size_t n) {
    EPILOG_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(n, 1) * 4));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr); }
};

void upload(float* dst, const Tensor& t) {
  EPILOG_CUDA_CHECK(cudaMemcpy(dst, t.f32(), t.nbytes(), cudaMemcpyHostToDevice));
}

Tensor download(const float* src, const Shape& shape) {
  Tensor t = Tensor::empty(shape);
  EPILOG_CUDA_CHECK(cudaMemcpy(t.f32(), src, t.nbytes(), cudaMemcpyDeviceToHost));
  return t;
}

// max |a - b| / max |b|; NaN gives infinity.
double rel_err(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::isnan(a.f32()[i])) return INFINITY;
    diff = std::max(diff, std::fabs(double(a.f32()[i]) - b.f32()[i]));
    scale = std::max(scale, std::fabs(double(b.f32()[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// Median time of one launch of fn(rep), from a CUDA graph of kReps launches.
double graph_time_us(cudaStream_t stream, const std::function<void(int)>& fn) {
  for (int r = 0; r < 3; ++r) fn(r);
  EPILOG_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  EPILOG_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int r = 0; r < kReps; ++r) fn(r);
  EPILOG_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  EPILOG_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 5; ++i) EPILOG_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  cudaEvent_t a, b;
  EPILOG_CUDA_CHECK(cudaEventCreate(&a));
  EPILOG_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> times;
  for (int i = 0; i < kReplays; ++i) {
    EPILOG_CUDA_CHECK(cudaEventRecord(a, stream));
    EPILOG_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    EPILOG_CUDA_CHECK(cudaEventRecord(b, stream));
    EPILOG_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    EPILOG_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    times.push_back(ms * 1e3 / kReps);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

json bench_shape(const json& spec, const Options& opt, const DeviceProfile& profile,
                 cudnnHandle_t cudnn, cudaStream_t stream) {
  ConvShape s{};
  s.n = spec.at("n");
  s.c = spec.at("cin");
  s.h = spec.at("h");
  s.w = spec.at("w");
  s.k = spec.at("cout");
  s.r = s.s = spec.at("k");
  s.stride_h = s.stride_w = spec.at("stride");
  s.groups = spec.at("groups");
  s.pad_t = s.pad_l = s.r / 2;
  s.dil_h = s.dil_w = 1;
  s.ho = (s.h + 2 * s.pad_t - s.r) / s.stride_h + 1;
  s.wo = (s.w + 2 * s.pad_l - s.s) / s.stride_w + 1;
  const std::string name = spec.at("name");
  const int64_t in_n = s.n * s.c * s.h * s.w, out_n = s.n * s.k * s.ho * s.wo;
  const int64_t w_n = s.k * (s.c / s.groups) * s.r * s.s;
  const int nbuf =
      int(std::max<int64_t>(1, std::min<int64_t>(16, (256 << 20) / (4 * (in_n + out_n)))));

  // Inputs, weights and batchnorm as in bench/torch_conv_bn_silu.py.
  Tensor x0 = Tensor::randn({s.n, s.c, s.h, s.w}, 1);
  Tensor w = Tensor::randn({s.k, s.c / s.groups, s.r, s.s}, 2,
                           1.0f / std::sqrt(float((s.c / s.groups) * s.r * s.s)));
  Rng rng(3);
  std::vector<float> gamma(s.k), beta(s.k), mean(s.k), var(s.k), scale(s.k), shift(s.k);
  for (int64_t k = 0; k < s.k; ++k) {
    mean[k] = rng.normal(0, 0.1f);
    var[k] = rng.uniform(0.5f, 1.5f);
    gamma[k] = rng.uniform(0.5f, 1.5f);
    beta[k] = rng.normal(0, 0.1f);
    double sc = gamma[k] / std::sqrt(double(var[k]) + 1e-5);
    scale[k] = float(sc);
    shift[k] = float(beta[k] - mean[k] * sc);
  }
  Tensor ref = Tensor::empty({s.n, s.k, s.ho, s.wo});
  cpu::conv2d(s, x0.f32(), w.f32(), scale.data(), shift.data(), Activation::Silu, ref.f32());

  std::vector<std::unique_ptr<DeviceBuffer>> xs, ys;
  for (int i = 0; i < nbuf; ++i) {
    xs.push_back(std::make_unique<DeviceBuffer>(in_n));
    ys.push_back(std::make_unique<DeviceBuffer>(out_n));
    upload(xs.back()->ptr, i == 0 ? x0 : Tensor::randn(x0.shape(), 100 + i));
  }
  DeviceBuffer dw(w_n), dscale(s.k), dshift(s.k), dgamma(s.k), dbeta(s.k), dmean(s.k), dvar(s.k),
      tmp(out_n);
  upload(dw.ptr, w);
  // The weights packed for every wgmma tile width, by (k, n): the halo kernel's (k = 72) or the
  // k = 32 kernel's (direct, or gathering A), where they take the shape (lowering packs them once
  // per model, for the tiles it picks).
  std::map<std::pair<int, int>, std::unique_ptr<DeviceBuffer>> dpacked;
  for (int k : {32, 72})
    for (int n : {16, 32, 64, 128}) {
      const ConvTiles t{64, n, k, 3, 1, true};
      if (conv_gemm_wgmma_kernel(t, s) == WgmmaKernel::None) continue;
      Tensor packed = Tensor::empty({wgmma_packed_floats(s, t)});
      pack_wgmma_weights(s, t, w.f32(), packed.f32());
      auto& d = dpacked[{k, n}] = std::make_unique<DeviceBuffer>(packed.numel());
      upload(d->ptr, packed);
    }
  auto wp = [&](const ConvTiles& t) -> const float* {
    const auto it = dpacked.find({t.k, t.n});
    return t.wgmma && it != dpacked.end() ? it->second->ptr : nullptr;
  };
  auto up = [](DeviceBuffer& d, const std::vector<float>& v) {
    EPILOG_CUDA_CHECK(cudaMemcpy(d.ptr, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  };
  up(dscale, scale), up(dshift, shift), up(dgamma, gamma), up(dbeta, beta), up(dmean, mean),
      up(dvar, var);

  // cuDNN's convolution, TF32 tensor-core math allowed, its fastest algorithm.
  cudnnTensorDescriptor_t xd, yd;
  cudnnFilterDescriptor_t wd;
  cudnnConvolutionDescriptor_t cd;
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&xd));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&yd));
  CUDNN_CHECK(cudnnCreateFilterDescriptor(&wd));
  CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&cd));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(s.n),
                                         int(s.c), int(s.h), int(s.w)));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(s.n),
                                         int(s.k), int(s.ho), int(s.wo)));
  CUDNN_CHECK(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, int(s.k),
                                         int(s.c / s.groups), int(s.r), int(s.s)));
  CUDNN_CHECK(cudnnSetConvolution2dDescriptor(cd, int(s.pad_t), int(s.pad_l), int(s.stride_h),
                                              int(s.stride_w), 1, 1, CUDNN_CROSS_CORRELATION,
                                              CUDNN_DATA_FLOAT));
  CUDNN_CHECK(cudnnSetConvolutionGroupCount(cd, int(s.groups)));
  CUDNN_CHECK(cudnnSetConvolutionMathType(cd, CUDNN_TENSOR_OP_MATH));
  int found = 0;
  cudnnConvolutionFwdAlgoPerf_t perf[8];
  CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(cudnn, xd, wd, cd, yd, 8, &found, perf));
  int best = 0;
  while (best < found && perf[best].status != CUDNN_STATUS_SUCCESS) ++best;
  if (best == found) fail("{}: cuDNN found no algorithm", name);
  cudnnConvolutionFwdAlgo_t algo = perf[best].algo;
  size_t ws_bytes = perf[best].memory;
  DeviceBuffer ws(ws_bytes / 4 + 1);
  const float one = 1, zero = 0;

  ConvTiles none_tiles;
  struct Variant {
    std::string name;
    std::function<void(int)> run;
    double tol;
  };
  auto xb = [&](int r) { return xs[r % nbuf]->ptr; };
  auto yb = [&](int r) { return ys[r % nbuf]->ptr; };
  std::vector<Variant> variants;
  // One fused conv -> batchnorm -> silu with kernel `kern` and tiles `t` on rotation slot r.
  auto fused = [&](ConvKernel kern, const ConvTiles& t, int r) {
    if (kern == ConvKernel::Scalar)
      cuda::conv_scalar(s, xb(r), dw.ptr, dscale.ptr, dshift.ptr, Activation::Silu, yb(r), stream);
    else if (kern == ConvKernel::Tiled)
      cuda::conv_tiled(s, t, xb(r), dw.ptr, dscale.ptr, dshift.ptr, Activation::Silu, yb(r),
                       stream);
    else
      cuda::conv_gemm(s, t, xb(r), dw.ptr, dscale.ptr, dshift.ptr, Activation::Silu, yb(r), stream,
                      nullptr, wp(t));
  };
  for (ConvKernel kern : {ConvKernel::Scalar, ConvKernel::Tiled, ConvKernel::Gemm}) {
    if (!conv_supports(kern, s)) continue;
    ConvTiles t = conv_tiles(kern, s, profile);
    variants.push_back({conv_kernel_name(kern), [&fused, kern, t](int r) { fused(kern, t, r); },
                        kern == ConvKernel::Gemm ? 2e-3 : 1e-5});
  }
  // Where lowering gives gemm the 3x3 halo kernel, the k = 32 gather kernel too, so that the
  // table shows what the halo tiles gain.
  if (conv_gemm_halo_fits(s)) {
    ConvTiles t = conv_tiles(ConvKernel::Gemm, s, profile);
    t = {std::min(t.m, 128), std::max(t.n, 32), 32, std::max(t.stages, 2)};
    variants.push_back({"gemm_k32", [&fused, t](int r) { fused(ConvKernel::Gemm, t, r); }, 2e-3});
  }
  // Where it picks a kernel on warpgroup MMA, the same kernel on mma.sync too.
  if (conv_tiles(ConvKernel::Gemm, s, profile).wgmma) {
    DeviceProfile sync = profile;
    sync.wgmma = false;
    const ConvTiles t = conv_tiles(ConvKernel::Gemm, s, sync);
    variants.push_back({"gemm_mma", [&fused, t](int r) { fused(ConvKernel::Gemm, t, r); }, 2e-3});
  }
  // Our unfused sequence: the selected kernel with an identity epilogue, batchnorm, silu.
  ConvChoice pick = select_conv_kernel(s, profile);
  ConvTiles pt = conv_tiles(pick.kernel, s, profile);
  variants.push_back({"unfused3",
                      [&, pt, pick](int r) {
                        if (pick.kernel == ConvKernel::Scalar)
                          cuda::conv_scalar(s, xb(r), dw.ptr, nullptr, nullptr, Activation::None,
                                            tmp.ptr, stream);
                        else if (pick.kernel == ConvKernel::Tiled)
                          cuda::conv_tiled(s, pt, xb(r), dw.ptr, nullptr, nullptr, Activation::None,
                                           tmp.ptr, stream);
                        else
                          cuda::conv_gemm(s, pt, xb(r), dw.ptr, nullptr, nullptr, Activation::None,
                                          tmp.ptr, stream, nullptr, wp(pt));
                        cuda::batchnorm(s.n, s.k, s.ho * s.wo, tmp.ptr, dgamma.ptr, dbeta.ptr,
                                        dmean.ptr, dvar.ptr, 1e-5f, tmp.ptr, stream);
                        cuda::activation(Activation::Silu, out_n, tmp.ptr, yb(r), stream);
                      },
                      pick.kernel == ConvKernel::Gemm ? 2e-3 : 1e-5});
  variants.push_back({"cudnn+bn_silu",
                      [&](int r) {
                        CUDNN_CHECK(cudnnConvolutionForward(cudnn, &one, xd, xb(r), wd, dw.ptr, cd,
                                                            algo, ws.ptr, ws_bytes, &zero, yd,
                                                            tmp.ptr));
                        cuda::scale_shift_act(s.n, s.k, s.ho * s.wo, tmp.ptr, dscale.ptr,
                                              dshift.ptr, Activation::Silu, yb(r), stream);
                      },
                      2e-3});

  const double flops = double(s.flops()), bytes = double(s.min_bytes());
  const double floor_us = std::max(bytes / (opt.copy_gbps * 1e3), flops / (opt.tf32_tflops * 1e6));
  json row = {{"shape", name},
              {"gflop", flops / 1e9},
              {"min_mbytes", bytes / 1e6},
              {"floor_us", floor_us},
              {"selected", conv_kernel_name(pick.kernel)},
              {"rule", pick.rule},
              {"cudnn_algo", int(algo)}};
  for (Variant& v : variants) {
    EPILOG_CUDA_CHECK(cudaMemset(ys[0]->ptr, 0xff, out_n * 4));  // NaN: unwritten outputs fail
    v.run(0);
    EPILOG_CUDA_CHECK(cudaStreamSynchronize(stream));
    double err = rel_err(download(ys[0]->ptr, ref.shape()), ref);
    row[v.name + "_relerr"] = err;
    if (!(err <= v.tol)) {
      row[v.name + "_us"] = nullptr;
      std::fprintf(stderr, "%s: %s is WRONG (relative error %.3g > %.0e), not timed\n",
                   name.c_str(), v.name.c_str(), err, v.tol);
      continue;
    }
    row[v.name + "_us"] = graph_time_us(stream, v.run);
  }
  cudnnDestroyTensorDescriptor(xd);
  cudnnDestroyTensorDescriptor(yd);
  cudnnDestroyFilterDescriptor(wd);
  cudnnDestroyConvolutionDescriptor(cd);

  // --sweep: every tile combination of tiled and gemm (the GPU tests check them all), against
  // the tiles lowering picks: what the tile rules of conv_tiles are checked with.
  if (opt.sweep) {
    json all = json::array();
    for (ConvKernel kern : {ConvKernel::Tiled, ConvKernel::Gemm}) {
      if (!conv_supports(kern, s) || (opt.sweep_gemm && kern != ConvKernel::Gemm)) continue;
      const ConvTiles picked = conv_tiles(kern, s, profile);
      ConvTiles best;
      double best_us = INFINITY, picked_us = INFINITY;
      // The built tiles hold every tile lowering can pick (a lowering test checks it), split-K
      // on every gather tile included: what the tile, split and stage rules are checked with.
      for (const ConvTiles& t : conv_built_tiles(kern, profile)) {
        // Tiles that would run another kernel on this shape.
        if (t.k == 72 && !conv_gemm_halo_fits(s)) continue;
        if (t.k == kGemmStemK && !conv_gemm_stem_fits(s)) continue;
        const double us = graph_time_us(stream, [&fused, kern, t](int r) { fused(kern, t, r); });
        all.push_back(
            {conv_kernel_name(kern), t.m, t.n, t.k, t.stages, t.splits, t.wgmma, t.persistent, us});
        if (us < best_us) best_us = us, best = t;
        if (t == picked) picked_us = us;
      }
      std::printf(
          "  %s sweep: fastest m=%d n=%d k=%d stages=%d splits=%d%s%s %.1f us; lowering's m=%d "
          "n=%d k=%d stages=%d splits=%d%s%s %.1f us\n",
          conv_kernel_name(kern), best.m, best.n, best.k, best.stages, best.splits,
          best.wgmma ? " wgmma" : "", best.persistent ? " persistent" : "", best_us, picked.m,
          picked.n, picked.k, picked.stages, picked.splits, picked.wgmma ? " wgmma" : "",
          picked.persistent ? " persistent" : "", picked_us);
    }
    row["sweep"] = all;
  }

  // The fastest of the fused kernels (and gemm tile shapes), and whether the selector's pick
  // is within 10% of it.
  double fastest = INFINITY;
  for (const char* k : {"scalar", "tiled", "gemm", "gemm_k32", "gemm_mma"})
    if (row.contains(std::string(k) + "_us") && !row[std::string(k) + "_us"].is_null())
      fastest = std::min(fastest, row[std::string(k) + "_us"].get<double>());
  std::string sel = std::string(conv_kernel_name(pick.kernel)) + "_us";
  double sel_us = row.contains(sel) && !row[sel].is_null() ? row[sel].get<double>() : INFINITY;
  row["selected_us"] = std::isfinite(sel_us) ? json(sel_us) : json(nullptr);
  row["fastest_us"] = fastest;
  row["selector_ok"] = sel_us <= 1.10 * fastest;
  row["selected_gbps"] = bytes / (sel_us * 1e3);
  row["selected_tflops"] = flops / (sel_us * 1e6);
  row["selected_pct_floor"] = 100.0 * floor_us / sel_us;
  return row;
}

void usage(FILE* to) {
  std::fprintf(to,
               "usage: conv_bench [--shapes FILE] [--json FILE] [--only NAME] [--sweep]\n"
               "                  [--sweep-gemm] [--copy-gbps X] [--tf32-tflops X]\n"
               "Times conv2d -> batchnorm -> silu per shape: the scalar, tiled and gemm fused\n"
               "kernels, our unfused three-kernel sequence and cuDNN + our batchnorm/silu pass.\n"
               "Defaults: --shapes tools/conv_shapes.json, ceilings 4250 GB/s and 358 TFLOP/s\n"
               "(TF32), measured on an H200 (docs/perf.md). --sweep also times every tile\n"
               "combination of tiled and gemm against the tiles lowering picks; --sweep-gemm\n"
               "those of gemm only.\n");
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") return usage(stdout), 0;
    if (a == "--sweep" || a == "--sweep-gemm") {
      opt.sweep = true;
      opt.sweep_gemm = a == "--sweep-gemm";
      continue;
    }
    if (i + 1 >= argc) return usage(stderr), 2;
    std::string v = argv[++i];
    if (a == "--shapes")
      opt.shapes = v;
    else if (a == "--json")
      opt.json_out = v;
    else if (a == "--only")
      opt.only = v;
    else if (a == "--copy-gbps")
      opt.copy_gbps = std::stod(v);
    else if (a == "--tf32-tflops")
      opt.tf32_tflops = std::stod(v);
    else
      return usage(stderr), 2;
  }
  try {
    auto backend = make_cuda_backend();  // registers the device allocator; checks for a GPU
    if (!backend) fail("conv_bench: no CUDA device");
    DeviceProfile profile = *cuda_device_profile();
    std::ifstream f(opt.shapes);
    if (!f) fail("conv_bench: cannot read '{}'", opt.shapes);
    json suite = json::parse(f);
    cudaStream_t stream;
    EPILOG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudnnHandle_t cudnn;
    CUDNN_CHECK(cudnnCreate(&cudnn));
    CUDNN_CHECK(cudnnSetStream(cudnn, stream));
    std::ofstream jout;
    if (!opt.json_out.empty()) jout.open(opt.json_out);
    std::printf("%s, %d SMs, cuDNN %zu; times in us (median of %d graph replays of %d launches)\n",
                profile.name.c_str(), profile.sm_count, cudnnGetVersion(), kReplays, kReps);
    std::printf("%-22s %8s %8s %8s %8s %9s %9s %8s %7s %7s %6s  %s\n", "shape", "floor", "scalar",
                "tiled", "gemm", "unfused3", "cudnn+ep", "selected", "GB/s", "TFLOP/s", "%floor",
                "pick (within 10%?)");
    auto us = [](const json& r, const std::string& k) {
      return r.contains(k) && !r[k].is_null() ? fmt::format("{:.1f}", r[k].get<double>())
                                              : std::string("-");
    };
    for (const json& spec : suite.at("shapes")) {
      if (!opt.only.empty() &&
          spec.at("name").get<std::string>().find(opt.only) == std::string::npos)
        continue;
      json r = bench_shape(spec, opt, profile, cudnn, stream);
      std::printf("%-22s %8.1f %8s %8s %8s %9s %9s %8s %7.0f %7.1f %6.1f  %s (%s)\n",
                  r["shape"].get<std::string>().c_str(), r["floor_us"].get<double>(),
                  us(r, "scalar_us").c_str(), us(r, "tiled_us").c_str(), us(r, "gemm_us").c_str(),
                  us(r, "unfused3_us").c_str(), us(r, "cudnn+bn_silu_us").c_str(),
                  us(r, "selected_us").c_str(), r["selected_gbps"].get<double>(),
                  r["selected_tflops"].get<double>(), r["selected_pct_floor"].get<double>(),
                  r["selected"].get<std::string>().c_str(),
                  r["selector_ok"].get<bool>() ? "yes" : "NO");
      std::fflush(stdout);
      if (jout) jout << r.dump() << "\n";
    }
    cudnnDestroy(cudnn);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
