// The three fused_conv2d kernels, each FORCED (called directly, not through the selector) with
// the tiles lowering picks and with every tile combination it is built for, against the CPU
// reference epilog::cpu::conv2d on a matrix of geometries: windows 1x1 to 7x7 (and 2x2, 3x1 for
// the generic paths), stride 1 and 2, padding 0, 1, asymmetric and wider than the window,
// dilation 2 (and 2x3), groups 1, 2 to 8 and depthwise, Cout that no tile divides, odd H and W,
// batch 1 and 3, scale/shift absent or given, every activation.
//
// Error, element by element (test::check_close): |gpu - cpu| <= atol * magnitude + rtol * |cpu|,
// the magnitude being |scale| * sum |x| |w| over the element's window (test::conv_magnitude);
// atol 1e-5 for the SIMT kernels (scalar, tiled), 2.5e-3 for gemm (TF32; gpu_util.h says why).
// Outputs are poisoned with NaN (bytes 0xFF) before each run and any NaN fails, so an element a
// kernel does not write cannot pass. Inputs are fresh random numbers per case; weights have
// stddev 1/sqrt(fan-in), as trained convs do, so the sigmoid and SiLU epilogues see
// pre-activations of order 1 rather than saturating.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "epilog/graph/lowering.h"
#include "epilog/kernels/cpu.h"
#include "epilog/kernels/cuda.h"
#include "epilog/runtime/executor.h"
#include "epilog/runtime/params.h"
#include "gpu_util.h"
#include "test_acts.h"

using namespace epilog;

namespace {

struct Geometry {
  const char* name;
  int64_t n, c, h, w, k, r, s;
  int64_t stride_h, stride_w;
  int64_t pad_t, pad_l, pad_b, pad_r;
  int64_t dil_h, dil_w;
  int64_t groups;

  ConvShape shape() const {
    ConvShape cs{n, c, h, w, k, r, s, 0, 0, stride_h, stride_w, pad_t, pad_l, dil_h, dil_w, groups};
    cs.ho = (h + pad_t + pad_b - dil_h * (r - 1) - 1) / stride_h + 1;
    cs.wo = (w + pad_l + pad_r - dil_w * (s - 1) - 1) / stride_w + 1;
    return cs;
  }
};

// Cout 13, 37, 33, 70 fit no tile (8/16/32 or 32/64/128); H and W odd unless a case needs even.
// clang-format off
const std::vector<Geometry> kGeometries = {
    // name                        n   c   h   w   k  r  s sh sw pt pl pb pr dh dw  g
    {"1x1",                        1, 16,  9, 11, 13, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},
    {"1x1 stride 2",               3,  5, 13,  7, 37, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 1},
    {"1x1 plane % 4 == 0",         3, 12, 16, 12, 40, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},
    {"1x1 padded",                 1,  7,  5,  7,  9, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {"1x1 64-pixel slabs",         3, 40,  8, 24, 70, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},
    {"1x1 8x8 planes",             5, 72,  8,  8, 37, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},
    {"1x1 more tiles than SMs",    4, 40, 48, 40, 70, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},
    // Linear layers (1x1 over a 1x1 plane; gemv takes these only): rows under and over the 8 a
    // warp sums at once, k not a multiple of 4.
    {"linear, 3 rows",             3, 40,  1,  1, 70, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},
    {"linear, 11 rows, k odd",    11, 37,  1,  1, 13, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},
    {"3x3 pad 1",                  1,  8, 17, 15, 37, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {"3x3 stride 2 pad 1",         3, 19, 15, 13, 13, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1},
    {"3x3 pad 0",                  1,  3, 11,  9, 16, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1},
    {"3x3 asymmetric pad",         1, 12, 12, 13, 37, 3, 3, 1, 1, 0, 1, 2, 0, 1, 1, 1},
    {"3x3 stride 2 'same' pad",    3,  6, 14, 15, 13, 3, 3, 2, 2, 0, 0, 1, 1, 1, 1, 1},
    {"3x3 dilation 2",             3, 10, 13, 17, 13, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, 1},
    {"3x3 pad wider than window",  1,  3,  6,  7,  9, 3, 3, 1, 1, 3, 2, 3, 2, 1, 1, 1},
    {"3x3 Cin 1",                  1,  1, 13, 11, 13, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {"3x3 several tiles each way", 3, 20, 21, 19, 70, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {"3x3 stride 2 many squares",  3, 24, 37, 35, 70, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1},
    // 9 stages of 8 channels: split-K tiles split it unevenly, 8 ways at most.
    {"3x3 deep reduction",         1, 72, 20, 21, 70, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    // Rows of whole 16-byte chunks: the wgmma halo kernel's wide rows, the row's first column
    // 3, 2 and 0 slots past a chunk boundary (left padding 1, 2, 0); the last squares stick out
    // of the plane, and the channels end in a partial stage.
    {"3x3 16-byte rows",           2, 20, 13, 20, 70, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {"3x3 16-byte rows, pad 0 2",  1, 12, 11, 24, 37, 3, 3, 1, 1, 0, 2, 2, 0, 1, 1, 1},
    {"3x3 16-byte rows, no pad",   3, 11, 12, 16, 33, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1},
    // The scalar kernel's stem path: rows of 4k floats (16-byte loads) and 8 outputs (float4
    // stores), then odd sizes.
    {"3x3 stride 2, an RGB stem",  3,  3, 17, 24, 16, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1},
    {"3x3 stem, odd sizes",        3,  3, 17, 21, 16, 3, 3, 2, 2, 2, 1, 1, 2, 1, 1, 1},
    // The stem's first tap at each phase of its 16-byte group: (-pad_l) mod 4 = 0, 1 and 2.
    {"3x3 stem, no padding",       1,  3, 16, 20, 12, 3, 3, 2, 2, 0, 0, 0, 0, 1, 1, 1},
    {"3x3 stem, left pad 3",       1,  4, 12, 16, 16, 3, 3, 2, 2, 1, 3, 1, 0, 1, 1, 1},
    {"3x3 stem stride 1, pad 2",   3,  2, 13, 12,  7, 3, 3, 1, 1, 2, 2, 0, 1, 1, 1, 1},
    // gemm's stem kernel: tiles of 64 columns by 2 to 8 rows, the last ones partial both ways,
    // with 16-byte copies (w % 4 == 0) and 4-byte ones; strides 1 x 2 (scalar's stem path only).
    {"3x3 stem, column tiles",     2,  3, 37, 152, 10, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1},
    {"3x3 stem, odd column tiles", 1,  2, 21, 139, 16, 3, 3, 1, 1, 1, 2, 1, 0, 1, 1, 1},
    {"3x3 stem, strides 1 x 2",    1,  3, 11, 40, 16, 3, 3, 1, 2, 1, 1, 1, 1, 1, 1, 1},
    {"5x5 pad 2",                  1,  9, 15, 19, 33, 5, 5, 1, 1, 2, 2, 2, 2, 1, 1, 1},
    {"5x5 stride 2 asymmetric",    3,  4, 17, 13, 13, 5, 5, 2, 2, 1, 2, 2, 1, 1, 1, 1},
    {"5x5 dilation 2",             1,  5, 10,  9,  7, 5, 5, 1, 1, 4, 4, 4, 4, 2, 2, 1},
    {"7x7 stride 2 pad 3",         1,  3, 23, 21, 13, 7, 7, 2, 2, 3, 3, 3, 3, 1, 1, 1},
    {"7x7 dilation 2x3",           3,  5, 10,  9,  7, 7, 7, 1, 1, 6, 6, 6, 6, 2, 3, 1},
    {"3x1 stride 1x2",             1,  5, 10,  9,  7, 3, 1, 1, 2, 1, 0, 1, 0, 1, 1, 1},
    {"2x2 stride 2",               3,  6,  8,  9, 37, 2, 2, 2, 2, 0, 0, 0, 1, 1, 1, 1},
    {"3x3 groups 2",               3,  8,  9,  9, 14, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 2},
    // The grouped path (RegNet's groups of 8 channels, ResNeXt's of 4 to 32), grids just past
    // kGroupedMinItems thread items: 16 channels a block in three chunks (the last partial), 8
    // on 16-channel groups, 4 on RegNet's 8 (stride 2 on odd planes, and 7x7 planes); 16-byte
    // rows and not. Smaller grids and dilations: the general kernel.
    {"3x3 grouped, 3 chunks of 16", 8, 40, 40, 40, 80, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 2},
    {"3x3 grouped, 8 a block",     5, 128, 30, 30, 128, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 8},
    {"3x3 grouped, 4, stride 2",   3, 192, 47, 47, 192, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 24},
    {"3x3 grouped, 4, 7x7 planes", 32, 160, 7,  7, 160, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 20},
    {"3x3 grouped, small grid",    1, 16, 11, 10, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 2},
    {"3x3 grouped, dilation 2",    1, 16, 11, 10, 16, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, 2},
    {"3x3 depthwise",              3, 13, 11,  9, 13, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 13},
    {"3x3 depthwise stride 2",     1, 16, 15, 15, 16, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 16},
    {"5x5 depthwise x2 stride 2",  1,  6, 14, 11, 12, 5, 5, 2, 2, 2, 1, 2, 3, 1, 1, 6},
    {"7x7 depthwise",              1,  5, 12, 11,  5, 7, 7, 1, 1, 3, 3, 3, 3, 1, 1, 5},
};
// clang-format on

const Activation kActivations[] = {Activation::None, Activation::Silu, Activation::Relu,
                                   Activation::Sigmoid};
// Every activation the epilogues apply, with parameters (the common four first).
const std::vector<Act>& kEpilogueActs = test::epilogue_acts();

std::string tiles_str(const ConvTiles& t) {
  return "m=" + std::to_string(t.m) + " n=" + std::to_string(t.n) + " k=" + std::to_string(t.k) +
         " stages=" + std::to_string(t.stages) + " splits=" + std::to_string(t.splits) +
         (t.wgmma ? " wgmma" : "") + (t.persistent ? " persistent" : "");
}

std::string shape_desc(const ConvShape& s) {
  return "x [" + std::to_string(s.n) + "," + std::to_string(s.c) + "," + std::to_string(s.h) + "," +
         std::to_string(s.w) + "] w [" + std::to_string(s.k) + "," +
         std::to_string(s.c / s.groups) + "," + std::to_string(s.r) + "," + std::to_string(s.s) +
         "] stride " + std::to_string(s.stride_h) + "x" + std::to_string(s.stride_w) + " pad t" +
         std::to_string(s.pad_t) + " l" + std::to_string(s.pad_l) + " dil " +
         std::to_string(s.dil_h) + "x" + std::to_string(s.dil_w) + " groups " +
         std::to_string(s.groups) + " -> [" + std::to_string(s.ho) + "," + std::to_string(s.wo) +
         "]";
}

test::Tolerance tolerance(ConvKernel kernel) {
  return kernel == ConvKernel::Gemm ? test::kTf32Conv : test::kSimtConv;
}

void ensure_backend() {
  // Registers the CUDA allocator and copies (and checks there is a device) once.
  static const bool ok = make_cuda_backend() != nullptr;
  REQUIRE(ok);
}

struct Outcome {
  Tensor y, ref, mag;  // the kernel's output, the CPU's, the outputs' magnitudes
  int64_t stray = 0;   // writes outside y's channel slab (strided cases)
};

struct Case {
  ConvKernel kernel;
  ConvTiles tiles;
  ConvShape shape;
  bool scale, shift;
  Act act;
  // x as channels [2, 2 + C) of a batch with 3 more channels, y as channels [1, 1 + K) of one
  // with 2 more (images x_image() / y_image() apart, as the executor's in-place concats make).
  bool strided = false;
  // A residual added after the activation (fused_conv2d's fifth input); with `strided`, as
  // channels [2, 2 + K) of a batch with 3 more.
  bool residual = false;
  // scale and shift from one float into their buffers: 4-byte aligned, not 8, so that the
  // epilogues take their general path (scale_shift_act loads aligned pairs where it can).
  bool odd_affine = false;
  // The residual added before the activation (ResNet's relu(bn(conv) + x)), not after.
  bool residual_first = false;
};

// conv_gemm with host weights w (also on the device at pw), packed first for the wgmma kernels
// as lowering packs them; synchronised.
void run_gemm(const ConvShape& s, const ConvTiles& tiles, const Tensor& w, const float* px,
              const float* pw, const float* psc, const float* psh, Act act, float* py,
              const cuda::ConvResidual& pres) {
  Tensor dpacked;
  if (conv_gemm_wgmma_kernel(tiles, s) != WgmmaKernel::None) {
    Tensor packed = Tensor::empty({wgmma_packed_floats(s, tiles)});
    pack_wgmma_weights(s, tiles, w.f32(), packed.f32());
    dpacked = packed.to(Device::CUDA);
  }
  cuda::conv_gemm(s, tiles, px, pw, psc, psh, act, py, nullptr, pres,
                  dpacked.defined() ? static_cast<const float*>(dpacked.raw()) : nullptr);
  EPILOG_CUDA_CHECK(cudaDeviceSynchronize());  // before dpacked is freed
}

// Fresh inputs from `seed`, the CPU reference, the forced kernel on poisoned output, compared.
Outcome run(const Case& cc, uint64_t seed) {
  ensure_backend();
  const ConvShape& s = cc.shape;
  const int64_t fan_in = (s.c / s.groups) * s.r * s.s;
  const int64_t cx = cc.strided ? s.c + 3 : s.c, cy = cc.strided ? s.k + 2 : s.k;
  const int64_t x0 = cc.strided ? 2 * s.h * s.w : 0, y0 = cc.strided ? s.ho * s.wo : 0;
  const Tensor xs = Tensor::randn({s.n, cx, s.h, s.w}, seed);
  const Tensor x = xs.part(x0, {s.n, s.c, s.h, s.w}).clone();  // contiguous, for the CPU
  const Tensor w = Tensor::randn({s.k, s.c / s.groups, s.r, s.s}, seed + 1,
                                 1.0f / std::sqrt(static_cast<float>(fan_in)));
  const int64_t a0 = cc.odd_affine ? 1 : 0;  // scale's and shift's first element
  const Tensor scale = Tensor::randn({a0 + s.k}, seed + 2);
  const Tensor shift = Tensor::randn({a0 + s.k}, seed + 3);
  const Shape out_shape{s.n, s.k, s.ho, s.wo};

  const int64_t cr = cc.strided ? s.k + 3 : s.k, r0 = cc.strided ? 2 * s.ho * s.wo : 0;
  const Tensor rs = Tensor::randn({s.n, cr, s.ho, s.wo}, seed + 4);
  const Tensor res = rs.part(r0, out_shape).clone();

  Outcome o;
  o.ref = Tensor::empty(out_shape);
  cpu::conv2d(s, x.f32(), w.f32(), cc.scale ? scale.f32() + a0 : nullptr,
              cc.shift ? shift.f32() + a0 : nullptr, cc.act, o.ref.f32(),
              cc.residual ? res.f32() : nullptr, cc.residual_first);
  o.mag = test::conv_magnitude(s, x, w, cc.scale ? scale.f32() + a0 : nullptr);
  // The activation's input is the sum, the shift and, where it comes first, the residual: its
  // own rounding (GPU and CPU math libraries differ by an ulp or two, and GELU's 1 + erf(v)
  // cancels) scales with all three, and the sum's error passes through a slope of up to 1.5
  // (test::epilogue_acts).
  if (cc.act.kind != Activation::None && cc.act.kind != Activation::Relu) {
    const int64_t plane = s.ho * s.wo;
    for (int64_t i = 0; i < o.mag.numel(); ++i) {
      float m = o.mag.f32()[i];
      if (cc.shift) m += std::abs(shift.f32()[a0 + i / plane % s.k]);
      if (cc.residual && cc.residual_first) m += std::abs(res.f32()[i]);
      o.mag.f32()[i] = 1.5f * m;
    }
  }

  const Tensor dx = xs.to(Device::CUDA), dw = w.to(Device::CUDA);
  const Tensor dscale = scale.to(Device::CUDA), dshift = shift.to(Device::CUDA);
  const Tensor dres = rs.to(Device::CUDA);
  const ResidualActs acts = split_residual_act(cc.act, cc.residual, cc.residual_first);
  const cuda::ConvResidual pres(cc.residual ? static_cast<const float*>(dres.raw()) + r0 : nullptr,
                                acts.post);
  Tensor dy = Tensor::empty({s.n, cy, s.ho, s.wo}, DType::F32, Device::CUDA);
  EPILOG_CUDA_CHECK(cudaMemset(dy.raw(), 0xFF, dy.nbytes()));  // all NaN
  ConvShape sg = s;
  if (cc.strided)
    sg.x_stride = cx * s.h * s.w, sg.y_stride = cy * s.ho * s.wo, sg.r_stride = cr * s.ho * s.wo;

  const auto* px = static_cast<const float*>(dx.raw()) + x0;
  const auto* pw = static_cast<const float*>(dw.raw());
  const float* psc = cc.scale ? static_cast<const float*>(dscale.raw()) + a0 : nullptr;
  const float* psh = cc.shift ? static_cast<const float*>(dshift.raw()) + a0 : nullptr;
  auto* py = static_cast<float*>(dy.raw()) + y0;
  switch (cc.kernel) {
    case ConvKernel::Scalar:
      cuda::conv_scalar(sg, px, pw, psc, psh, acts.pre, py, nullptr, pres);
      break;
    case ConvKernel::Tiled:
      cuda::conv_tiled(sg, cc.tiles, px, pw, psc, psh, acts.pre, py, nullptr, pres);
      break;
    case ConvKernel::Gemm:
      run_gemm(sg, cc.tiles, w, px, pw, psc, psh, acts.pre, py, pres);
      break;
    case ConvKernel::Gemv:
      cuda::conv_gemv(sg, px, pw, psc, psh, acts.pre, py, nullptr, pres);
      break;
  }
  EPILOG_CUDA_CHECK(cudaGetLastError());
  EPILOG_CUDA_CHECK(cudaDeviceSynchronize());

  const Tensor ys = dy.to(Device::CPU);
  o.y = ys.part(y0, out_shape).clone();
  const int64_t k0 = cc.strided ? 1 : 0;  // y's first channel in the batch
  for (int64_t i = 0; i < ys.numel(); ++i) {
    const int64_t ch = i / (s.ho * s.wo) % cy;
    if ((ch < k0 || ch >= k0 + s.k) && !std::isnan(ys.f32()[i])) ++o.stray;
  }
  return o;
}

void check(const Case& cc, uint64_t seed, const std::string& what) {
  const Outcome o = run(cc, seed);
  std::ostringstream desc;
  desc << conv_kernel_name(cc.kernel) << " " << what << ": " << shape_desc(cc.shape) << ", tiles "
       << tiles_str(cc.tiles) << ", scale " << cc.scale << " shift " << cc.shift << " act "
       << activation_name(cc.act.kind) << "(" << cc.act.a << "," << cc.act.b << ")"
       << (cc.strided ? ", strided" : "")
       << (cc.residual ? (cc.residual_first ? ", residual before the activation" : ", residual")
                       : "") << (cc.odd_affine ? ", scale/shift 4-byte aligned" : "");
  test::check_close(o.y, o.ref, tolerance(cc.kernel), desc.str(), &o.mag);
  INFO(desc.str() << ": " << o.stray << " stray writes");
  CHECK(o.stray == 0);
}

// Runs `kernel` on every geometry it supports: the tiles lowering picks with every activation,
// then every built tile combination with one activation each, then once more with every
// activation on the first geometry it runs, the residual before the activation. Run r has
// scale/shift presence r % 4 and, past the lowering's tiles, activation (r + r / 4) % 16, so that
// every pair of the two meets in 64 consecutive runs; runs 3 to 5 of every 6 read and write
// channel slabs, runs 5 to 9 of every 10 add a residual (before the activation in runs 11 to 21
// of every 22), runs 7 to 13 of every 14 read scale and shift unaligned.
void check_kernel(ConvKernel kernel, bool wgmma_only = false) {
  const DeviceProfile profile = cuda_device_profile().value_or(h200_profile());
  uint64_t seed = 1000 * (static_cast<uint64_t>(kernel) + 1);
  int r = 0;
  for (const Geometry& g : kGeometries) {
    const ConvShape s = g.shape();
    if (!conv_supports(kernel, s)) continue;
    const ConvTiles lowered = conv_tiles(kernel, s, profile);
    for (const Act& act : kEpilogueActs) {
      if (wgmma_only) break;
      check({kernel, lowered, s, r % 2 == 0, r / 2 % 2 == 0, act, r / 3 % 2 == 1, r / 5 % 2 == 1,
             r / 7 % 2 == 1, r / 11 % 2 == 1},
            seed += 5, std::string(g.name) + " (lowering's tiles)");
      ++r;
    }
    for (const ConvTiles& t : conv_built_tiles(kernel, profile)) {
      if (wgmma_only && !t.wgmma) continue;
      check({kernel, t, s, r % 2 == 0, r / 2 % 2 == 0,
             kEpilogueActs[size_t(r + r / 4) % kEpilogueActs.size()], r / 3 % 2 == 1,
             r / 5 % 2 == 1, r / 7 % 2 == 1, r / 11 % 2 == 1},
            seed += 5, g.name);
      ++r;
    }
  }
  // Every built tile with every activation, the residual before it (ResNet's order).
  for (const ConvTiles& t : conv_built_tiles(kernel, profile)) {
    if (wgmma_only && !t.wgmma) continue;
    for (const Geometry& g : kGeometries) {
      const ConvShape s = g.shape();
      if (!conv_supports(kernel, s)) continue;
      for (const Act& act : kEpilogueActs)
        check({kernel, t, s, true, true, act, false, true, false, true}, seed += 5,
              std::string(g.name) + " (every activation, residual first)");
      break;
    }
  }
}

// The magnitude of B's outputs where B reads A's (pair, chain): B's over |z| plus the bound on
// z's own error (kTf32Conv of A's magnitude, through an activation of slope under 1.1), so
// that A's rounding carried through B stays within kTf32Conv of it.
Tensor two_conv_magnitude(const ConvShape& a, const Tensor& x, const Tensor& wa, const float* sa,
                          const Tensor& z, const ConvShape& b, const Tensor& wb, const float* sb) {
  const Tensor mag_a = test::conv_magnitude(a, x, wa, sa);
  Tensor zz = z.clone();
  for (int64_t i = 0; i < zz.numel(); ++i)
    zz.f32()[i] = std::abs(zz.f32()[i]) + 1.1f * mag_a.f32()[i];
  return test::conv_magnitude(b, zz, wb, sb);
}

// The outputs of a two-conv kernel (pair, chain) stored into NaN-poisoned y against `ref`
// ([n, k, ho, wo]), `mag` their magnitudes: y is ref's shape, or with `slab` k + 2 channels an
// image, the layer's from channel 1 on, where the others must stay NaN.
void check_poisoned(const Tensor& ys, const Tensor& ref, const Tensor& mag, bool slab,
                    const std::string& what) {
  const int64_t k = ref.shape()[1], hw = ref.shape()[2] * ref.shape()[3], cy = slab ? k + 2 : k;
  int64_t stray = 0;
  Tensor y = Tensor::empty(ref.shape());
  for (int64_t i = 0; i < ys.numel(); ++i) {
    const int64_t img = i / (cy * hw), ch = i / hw % cy, c = ch - (slab ? 1 : 0), p = i % hw;
    const float g = ys.f32()[i];
    if (c < 0 || c >= k) {
      if (!std::isnan(g)) ++stray;
      continue;
    }
    y.f32()[(img * k + c) * hw + p] = g;
  }
  test::check_close(y, ref, test::kTf32Conv, what, &mag);
  INFO(what << "; " << stray << " stray writes");
  CHECK(stray == 0);
}

// A two-conv kernel's output on the GPU, all NaN before the launch: B's outputs, or with `slab`
// channels [1, 1 + k) of a batch with 2 more. `b` carries the output's image stride, `y` is where
// B's first output goes.
struct PoisonedOutput {
  bool slab;
  ConvShape b;
  Tensor dy;
  float* y;
  PoisonedOutput(const ConvShape& shape, bool slab_)
      : slab(slab_),
        b(shape),
        dy(Tensor::empty({b.n, slab ? b.k + 2 : b.k, b.ho, b.wo}, DType::F32, Device::CUDA)) {
    EPILOG_CUDA_CHECK(cudaMemset(dy.raw(), 0xFF, dy.nbytes()));
    if (slab) b.y_stride = (b.k + 2) * b.ho * b.wo;
    y = static_cast<float*>(dy.raw()) + (slab ? b.ho * b.wo : 0);
  }
  // After the launch of A then B (run q): check_poisoned against `ref`, of magnitudes `mag`.
  void check(const Tensor& ref, const Tensor& mag, const char* name, const ConvShape& a,
             Activation act_a, Activation act_b, int q) const {
    EPILOG_CUDA_CHECK(cudaGetLastError());
    EPILOG_CUDA_CHECK(cudaDeviceSynchronize());
    check_poisoned(dy.to(Device::CPU), ref, mag, slab,
                   std::string(name) + ": " + shape_desc(a) + " then " + shape_desc(b) +
                       ", activations " + activation_name(act_a) + " and " +
                       activation_name(act_b) + ", run " + std::to_string(q));
  }
};

}  // namespace

TEST_CASE("gpu conv: conv_supports: scalar runs everything, tiled and gemm groups == 1 only",
          "[gpu][conv]") {
  int linear = 0;
  for (const Geometry& g : kGeometries) {
    const ConvShape s = g.shape();
    INFO(g.name);
    CHECK(conv_supports(ConvKernel::Scalar, s));
    CHECK(conv_supports(ConvKernel::Tiled, s) == (s.groups == 1));
    CHECK(conv_supports(ConvKernel::Gemm, s) == (s.groups == 1));
    const bool is_linear = std::string(g.name).rfind("linear", 0) == 0;
    CHECK(conv_supports(ConvKernel::Gemv, s) == is_linear);
    linear += is_linear;
  }
  CHECK(linear == 2);
}

TEST_CASE("gpu conv: scalar kernel forced on the shape matrix", "[gpu][conv][scalar]") {
  check_kernel(ConvKernel::Scalar);
}

TEST_CASE("gpu conv: tiled kernel forced on the shape matrix, every built tile",
          "[gpu][conv][tiled]") {
  check_kernel(ConvKernel::Tiled);
}

TEST_CASE("gpu conv: gemm kernel forced on the shape matrix, every built tile",
          "[gpu][conv][gemm]") {
  check_kernel(ConvKernel::Gemm);
}

TEST_CASE("gpu conv: gemv forced on the linear layers of the shape matrix", "[gpu][conv][gemv]") {
  check_kernel(ConvKernel::Gemv);
}

// The wgmma tiles alone (also part of the case above): small enough to run under
// compute-sanitizer. It needs warpgroup MMA ([sm90a]: skipped where the GPU or build lacks it).
TEST_CASE("gpu conv: gemm's wgmma tiles on the shape matrix", "[gpu][conv][wgmma][sm90a]") {
  check_kernel(ConvKernel::Gemm, true);
}

// gemm's persistent halo kernel (its tiles are in the cases above too, on geometries of a square
// or a few a block): grids of more squares than fit at once on an H200, so that blocks take
// several squares through the ring of stage buffers; 1 to 4 stages, the last one partial, Cout
// under the tile's n; with and without a residual, plain and strided (16-byte aligned slabs).
TEST_CASE("gpu conv: gemm's persistent halo kernel, several squares a block",
          "[gpu][conv][persistent][sm90a]") {
  const DeviceProfile profile = cuda_device_profile().value_or(h200_profile());
  struct Layer {
    const char* name;
    int64_t n, c, h, w, k;
    bool lowered;  // lowering runs it with these tiles (from 17 output channels)
  };
  const Layer layers[] = {
      {"16 -> 16 at 160x160 (a C2f block's), batch 3", 3, 16, 160, 160, 16, false},
      {"32 -> 32 at 80x80, batch 3", 3, 32, 80, 80, 32, true},
      {"20 -> 29 at 44x120, batch 6", 6, 20, 44, 120, 29, true},
      {"11 -> 9 at 100x96, batch 7", 7, 11, 100, 96, 9, false},
      {"5 -> 16 at 48x64, batch 20", 20, 5, 48, 64, 16, false},
  };
  uint64_t seed = 9500;
  for (const Layer& l : layers) {
    const Geometry g{l.name, l.n, l.c, l.h, l.w, l.k, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    const ConvShape s = g.shape();
    const ConvTiles t{64, l.k <= 16 ? 16 : 32, 72, 3, 1, true, true};
    INFO(l.name);
    CHECK((conv_tiles(ConvKernel::Gemm, s, profile) == t) == l.lowered);
    for (int r = 0; r < 4; ++r)
      check({ConvKernel::Gemm, t, s, r != 1, r != 2, kActivations[r], r % 2 == 1, r >= 2},
            seed += 5, l.name);
  }
}

// gemm's stem kernel alone (also part of the gemm case above), on every geometry it takes with
// each of its tiles, every activation, plain and strided, with and without a residual: small
// enough to run under compute-sanitizer.
TEST_CASE("gpu conv: gemm's stem kernel on the stem geometries", "[gpu][conv][stem]") {
  const DeviceProfile profile = cuda_device_profile().value_or(h200_profile());
  uint64_t seed = 7000;
  int cases = 0;
  for (const Geometry& g : kGeometries) {
    const ConvShape s = g.shape();
    if (!conv_gemm_stem_fits(s)) continue;
    for (const ConvTiles& t : conv_built_tiles(ConvKernel::Gemm, profile)) {
      if (t.k != kGemmStemK) continue;
      for (int r = 0; r < 4; ++r) {
        check({ConvKernel::Gemm, t, s, r != 1, r != 2, kActivations[r], r % 2 == 1, r >= 2},
              seed += 5, g.name);
        ++cases;
      }
    }
  }
  CHECK(cases >= 8 * 3 * 4);  // the stem geometries, 3 tiles, 4 variants each
}

// Layers of the benchmark suite (shared/bench/conv_shapes.json, padding k/2) at full size, as
// the model runs them: conv -> batchnorm -> SiLU folded into scale and shift, each kernel that
// supports the layer forced with the tiles lowering picks for it.
TEST_CASE("gpu conv: suite layers at full size, every kernel", "[gpu][conv][suite]") {
  struct Layer {
    const char* name;
    int64_t n, c, hw, k, win, stride, groups;
  };
  const Layer layers[] = {
      {"b1_c3_16_3x3s2_640", 1, 3, 640, 16, 3, 2, 1},
      {"b1_c16_16_3x3_160", 1, 16, 160, 16, 3, 1, 1},
      {"b1_c8_8_1x1_320", 1, 8, 320, 8, 1, 1, 1},
      {"b1_c64_24_1x1_80", 1, 64, 80, 24, 1, 1, 1},
      {"b1_c32_64_3x3s2_160", 1, 32, 160, 64, 3, 2, 1},
      {"b1_c64_64_3x3_80", 1, 64, 80, 64, 3, 1, 1},
      {"b1_c256_256_1x1_20", 1, 256, 20, 256, 1, 1, 1},
      {"b16_c96_96_3x3dw_56 at batch 2", 2, 96, 56, 96, 3, 1, 96},
      // The YOLO-like model's deepest stride-2 layer, at a batch whose 64 x 128 tiles outnumber
      // the blocks that fit (the wgmma kernel gathering A runs several a block).
      {"128 -> 256 at stride 2 onto 20x20, batch 32", 32, 128, 40, 256, 3, 2, 1},
      // b16_c256_256_1x1_40 at a batch whose 400 64 x 128 tiles outnumber the 264 blocks of the
      // persistent wgmma direct kernel (2 an SM on an H200): blocks run two tiles or more,
      // through one pipeline of bulk-copied weights.
      {"b16_c256_256_1x1_40 at batch 8", 8, 256, 40, 256, 1, 1, 1},
  };
  const DeviceProfile profile = cuda_device_profile().value_or(h200_profile());
  uint64_t seed = 9000;
  for (const Layer& l : layers) {
    const int64_t pad = l.win / 2;
    const Geometry g{l.name,   l.n, l.c, l.hw, l.hw, l.k, l.win, l.win,   l.stride,
                     l.stride, pad, pad, pad,  pad,  1,   1,     l.groups};
    const ConvShape s = g.shape();
    for (ConvKernel kernel : {ConvKernel::Scalar, ConvKernel::Tiled, ConvKernel::Gemm}) {
      if (!conv_supports(kernel, s)) continue;
      check({kernel, conv_tiles(kernel, s, profile), s, true, true, Activation::Silu}, seed += 5,
            l.name);
    }
  }
}

// gemm's epilogues element by element: the cases above compare against the largest output, which
// cannot see an error in small outputs (a SiLU of a large negative input, a sigmoid near 0) or a
// NaN that spreads to an output beside it. A 1x1 layer with identity weights and a 3x3 stem
// layer whose only weight is the centre tap pass the input through exactly (its values have at
// most 10 significant bits, which TF32 keeps), so every pre-activation is a chosen value: a
// ramp over [-64, 64) with saturating values at every 7th pixel, down to -1e4. Each output must
// be within 1e-5 of the CPU's, or 1e-30 where the CPU's is below that (the reciprocal unit reads
// 0 for 1 + e^-v past 2^126, v < -87.3): kPassThrough. Then one pixel of the 1x1 layer's input
// is NaN: its outputs must be NaN and every other pixel's right.
TEST_CASE("gpu conv: gemm's SiLU and sigmoid element by element, saturating and NaN inputs",
          "[gpu][conv][epilogue]") {
  ensure_backend();
  const DeviceProfile profile = cuda_device_profile().value_or(h200_profile());
  const test::Tolerance kPassThrough{1e-30, 1e-5, "exact pass-through, the activation's own error"};
  const float kSaturating[] = {-1e4f,  -200.0f, -88.5f, -87.0f, -50.0f,
                               -20.5f, 20.5f,   40.0f,  100.0f, 1e4f};
  const Geometry pass1x1{"1x1 identity", 1, 8, 8, 16, 8, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1};
  const Geometry stem{"3x3 stem, centre tap", 1, 3, 8, 16, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  int checked = 0;
  for (const Geometry& g : {pass1x1, stem}) {
    const ConvShape s = g.shape();
    Tensor x = Tensor::empty({s.n, s.c, s.h, s.w});
    const int64_t plane = s.h * s.w;
    for (int64_t i = 0; i < x.numel(); ++i)
      x.f32()[i] = i % 7 == 3 ? kSaturating[i / 7 % 10] : float(i % 512) / 4.0f - 64.0f;
    Tensor w = Tensor::zeros({s.k, s.c, s.r, s.s});
    for (int64_t k = 0; k < s.k; ++k)
      w.f32()[((k * s.c + k % s.c) * s.r + s.r / 2) * s.s + s.s / 2] = 1.0f;
    for (const bool nan : {false, true}) {
      if (nan && s.r != 1) continue;  // a 3x3 window spreads a NaN through its zero weights
      const int64_t nan_pixel = 37;
      if (nan)
        for (int64_t c = 0; c < s.c; ++c) x.f32()[c * plane + nan_pixel] = NAN;
      const Tensor dx = x.to(Device::CUDA), dw = w.to(Device::CUDA);
      std::vector<ConvTiles> tiles = conv_built_tiles(ConvKernel::Gemm, profile);
      tiles.push_back(conv_tiles(ConvKernel::Gemm, s, profile));
      for (const ConvTiles& t : tiles) {
        for (Activation act : {Activation::Silu, Activation::Sigmoid}) {
          Tensor ref = Tensor::empty({s.n, s.k, s.ho, s.wo});
          cpu::conv2d(s, x.f32(), w.f32(), nullptr, nullptr, act, ref.f32(), nullptr);
          Tensor dy = Tensor::empty(ref.shape(), DType::F32, Device::CUDA);
          EPILOG_CUDA_CHECK(cudaMemset(dy.raw(), 0xFF, dy.nbytes()));
          run_gemm(s, t, w, static_cast<const float*>(dx.raw()),
                   static_cast<const float*>(dw.raw()), nullptr, nullptr, act,
                   static_cast<float*>(dy.raw()), nullptr);
          // The NaN pixel's outputs NaN on the CPU too, so the GPU's must be.
          if (nan) CHECK(std::isnan(ref.f32()[nan_pixel]));
          std::ostringstream desc;
          desc << g.name << (nan ? " with a NaN pixel" : "") << ", tiles " << tiles_str(t)
               << ", act " << activation_name(act);
          test::check_close(dy, ref, kPassThrough, desc.str());
          ++checked;
        }
      }
    }
  }
  // The 1x1 layer plain and with a NaN, the stem layer; every built tile and lowering's pick.
  CHECK(checked == 3 * 2 * int(conv_built_tiles(ConvKernel::Gemm, profile).size() + 1));
}

// gemm's wgmma direct kernel copying its input by tensor copies (conv_gemm_direct_tma): every
// built tile that takes it, at 2 to 4 stages, on a reduction whose last k tile is partial (the
// copy fills the channels past Cin with zeros), on a grid of more tiles than fit at once
// (blocks walk several, the pipeline running on from one into the next), and on planes that
// are not a multiple of the tile (the last tile of each image reaches past its plane, by a
// whole box on 20x20); x and y plain and as channel slabs of larger batches, with and without a
// residual.
TEST_CASE("gpu conv: gemm's wgmma direct kernel copying its input by tensor copies",
          "[gpu][conv][wgmma][tma][sm90a]") {
  ensure_backend();
  const DeviceProfile profile = cuda_device_profile().value_or(h200_profile());
  struct TmaCase {
    Geometry g;
    std::set<int> tiles;  // m * 1000 + n of the direct kernel's tiles that take it
  };
  const std::set<int> all{64032, 64064, 64128, 128032, 128064, 128128}, m64{64032, 64064, 64128};
  // clang-format off
  const std::vector<TmaCase> cases = {
      // name                            n    c   h   w   k  r  s sh sw pt pl pb pr dh dw g
      {{"1x1 16x16 planes, k tail",      3, 100, 16, 16, 80, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1}, all},
      {{"1x1 more tiles than fit",       4,  64, 64, 48, 72, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1}, all},
      {{"1x1 20x20 planes",              3,  96, 20, 20, 80, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1}, m64},
      {{"1x1 30x30 planes",              2,  64, 30, 30, 72, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1}, all},
  };
  // clang-format on
  uint64_t seed = 9500;
  int r = 0;
  for (const auto& [g, tiles] : cases) {
    const ConvShape s = g.shape();
    std::set<int> tiles_run;  // m * 1000 + n
    for (ConvTiles t : conv_built_tiles(ConvKernel::Gemm, profile)) {
      if (!conv_gemm_direct_tma(s, t)) continue;
      for (int stages : {2, 3, 4}) {
        t.stages = stages;
        check({ConvKernel::Gemm, t, s, true, r % 3 != 0, kActivations[r % 4], r % 2 == 1,
               r / 2 % 2 == 1},
              seed += 5, std::string(g.name) + " (tensor copies)");
        ++r;
      }
      tiles_run.insert(t.m * 1000 + t.n);
    }
    INFO(g.name);
    CHECK(tiles_run == tiles);
  }
}

// gemm's wgmma direct kernel reading a run of its input's channels through an upsampling (an
// upsample_nearest folded into the conv, cuda::ConvUpsampledInput): every built tile that takes
// it, runs that start and end inside a k tile, scales 2x2 and 3x2, the source as a channel slab
// of a larger batch. x's channels in the run are NaN on the GPU, so reading them fails; the CPU
// computes the conv on x with the run upsampled in.
TEST_CASE("gpu conv: gemm's wgmma direct kernel reading channels through an upsampling",
          "[gpu][conv][wgmma][upsample][sm90a]") {
  ensure_backend();
  const DeviceProfile profile = cuda_device_profile().value_or(h200_profile());
  struct UpCase {
    Geometry g;
    int64_t c0, channels, scale_h, scale_w;
    bool strided_source;
  };
  // clang-format off
  const std::vector<UpCase> cases = {
      // name                           n    c   h   w    k  r  s sh sw pt pl pb pr dh dw g   c0  ch sh sw strided
      {{"1x1 from 12x16, run first",    3,  64, 12, 16,  70, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},  0, 40, 2, 2, false},
      {{"1x1 from 8x24, run inside",    2,  72,  8, 24,  37, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1}, 24, 30, 2, 2, true},
      {{"1x1 from 24x32, scale 3x2",    1,  40, 24, 32,  64, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},  8, 32, 3, 2, false},
      {{"1x1 from 40x40, many tiles",   4, 128, 40, 40, 128, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},  0, 64, 2, 2, true},
  };
  // clang-format on
  uint64_t seed = 9000;
  for (const UpCase& uc : cases) {
    std::set<int> tiles_run;  // m * 1000 + n
    const ConvShape s = uc.g.shape();
    const int64_t sh = s.h / uc.scale_h, sw = s.w / uc.scale_w;
    const int64_t cs = uc.strided_source ? uc.channels + 3 : uc.channels;  // source batch's
    const int64_t s0 = uc.strided_source ? 2 * sh * sw : 0;                // its run's start
    const Tensor src = Tensor::randn({s.n, cs, sh, sw}, seed++);
    Tensor x = Tensor::randn({s.n, s.c, s.h, s.w}, seed++);
    Tensor x_gpu = x.clone();
    for (int64_t img = 0; img < s.n; ++img)
      for (int64_t c = 0; c < uc.channels; ++c)
        for (int64_t i = 0; i < s.h; ++i)
          for (int64_t j = 0; j < s.w; ++j) {
            const int64_t at = ((img * s.c + uc.c0 + c) * s.h + i) * s.w + j;
            x.f32()[at] =
                src.f32()[s0 + ((img * cs + c) * sh + i / uc.scale_h) * sw + j / uc.scale_w];
            x_gpu.f32()[at] = NAN;
          }
    const Tensor w = Tensor::randn({s.k, s.c, 1, 1}, seed++, 1.0f / std::sqrt(float(s.c)));
    const Tensor scale = Tensor::randn({s.k}, seed++), shift = Tensor::randn({s.k}, seed++);
    Tensor ref = Tensor::empty({s.n, s.k, s.ho, s.wo});
    cpu::conv2d(s, x.f32(), w.f32(), scale.f32(), shift.f32(), Activation::Silu, ref.f32(),
                nullptr);
    const Tensor mag = test::conv_magnitude(s, x, w, scale.f32());
    const Tensor dsrc = src.to(Device::CUDA), dx = x_gpu.to(Device::CUDA), dw = w.to(Device::CUDA);
    const Tensor dscale = scale.to(Device::CUDA), dshift = shift.to(Device::CUDA);
    cuda::ConvUpsampledInput up;
    up.x = static_cast<const float*>(dsrc.raw()) + s0;
    up.c0 = uc.c0, up.channels = uc.channels;
    up.scale_h = uc.scale_h, up.scale_w = uc.scale_w;
    up.image = cs * sh * sw;
    for (const ConvTiles& t : conv_built_tiles(ConvKernel::Gemm, profile)) {
      if (!conv_gemm_upsample_fits(s, t, uc.scale_h, uc.scale_w)) continue;
      Tensor packed = Tensor::empty({wgmma_packed_floats(s, t)});
      pack_wgmma_weights(s, t, w.f32(), packed.f32());
      const Tensor dpacked = packed.to(Device::CUDA);
      Tensor dy = Tensor::empty(ref.shape(), DType::F32, Device::CUDA);
      EPILOG_CUDA_CHECK(cudaMemset(dy.raw(), 0xFF, dy.nbytes()));
      cuda::conv_gemm(s, t, static_cast<const float*>(dx.raw()),
                      static_cast<const float*>(dw.raw()), static_cast<const float*>(dscale.raw()),
                      static_cast<const float*>(dshift.raw()), Activation::Silu,
                      static_cast<float*>(dy.raw()), nullptr, nullptr,
                      static_cast<const float*>(dpacked.raw()), &up);
      EPILOG_CUDA_CHECK(cudaDeviceSynchronize());
      std::ostringstream desc;
      desc << uc.g.name << ", channels " << uc.c0 << " + " << uc.channels << " upsampled "
           << uc.scale_h << "x" << uc.scale_w << (uc.strided_source ? ", strided" : "")
           << ", tiles " << tiles_str(t);
      test::check_close(dy, ref, test::kTf32Conv, desc.str(), &mag);
      tiles_run.insert(t.m * 1000 + t.n);
    }
    // The direct kernel's six wgmma tiles: m 64 and 128, n 32, 64 and 128.
    INFO(uc.g.name);
    CHECK(tiles_run == std::set<int>{64032, 64064, 64128, 128032, 128064, 128128});
  }

  // What the kernel cannot take is refused, not run: the halo kernel's tiles, a split, the
  // mma.sync kernel's tiles, a scale other than 2 across.
  const ConvShape s = cases[0].g.shape();
  cuda::ConvUpsampledInput up;
  up.channels = 8, up.scale_h = 2, up.scale_w = 2, up.image = 8 * 6 * 8;
  const ConvTiles direct{64, 64, 32, 3, 1, true};
  for (const auto& [t, scale_w] :
       std::vector<std::pair<ConvTiles, int64_t>>{{{64, 64, 72, 3, 1, true}, 2},
                                                  {{64, 64, 32, 3, 2, true}, 2},
                                                  {{64, 64, 32, 3, 1, false}, 2},
                                                  {direct, 4}}) {
    up.scale_w = scale_w;
    CHECK_THROWS_WITH(cuda::conv_gemm(s, t, nullptr, nullptr, nullptr, nullptr, Activation::Silu,
                                      nullptr, nullptr, nullptr, nullptr, &up),
                      Catch::Contains("an upsampled input needs tiles that run"));
  }
}

// The conv chain kernel (cuda::conv_chain: a 3x3 conv on wgmma halo tiles of 64 channels and the
// 1x1 conv that reads it, run on its accumulators) against the two convs on the CPU, on poisoned
// output: stride 1 and 2, both tiles it is built for (one square and two a block), input rows
// 16-byte aligned (wide-row copies at 64x64, stride 1) and odd, 1 to 5 stages of input channels
// (the last partial), planes under one square and with partial squares, batch 1 to 3, every
// pair of activations, y as a channel slab of a larger batch (check_poisoned).
TEST_CASE("gpu conv: the conv chain kernel against the two convs on the CPU",
          "[gpu][conv][chain][sm90a]") {
  ensure_backend();
  struct ChainCase {
    const char* name;
    int64_t n, c, h, w, stride, m;
    bool slab;  // y as channels [1, 1 + 64) of a batch with 2 more
  };
  // clang-format off
  const ChainCase cases[] = {
      {"b3 -> b4.cv1 of the YOLO-like model, 128x64", 2, 32, 160, 160, 2, 128, false},
      {"stride 2, 64x64, odd plane",                  3, 20,  75,  61, 2,  64, true},
      {"stride 1, 64x64, wide rows",                  2, 40,  48,  64, 1,  64, false},
      {"stride 1, 64x64, odd rows",                   1,  8,  37,  29, 1,  64, true},
      {"stride 1, 128x64, partial squares",           3, 13,  44,  52, 1, 128, false},
      {"plane under one square",                      2, 64,   6,   5, 1, 128, true},
  };
  // clang-format on
  uint64_t seed = 9700;
  int r = 0;
  for (const ChainCase& cc : cases) {
    ConvShape a{cc.n, cc.c, cc.h, cc.w, kChainC, 3, 3, 0, 0, cc.stride, cc.stride, 1, 1, 1, 1, 1};
    a.ho = (cc.h + 2 - 3) / cc.stride + 1;
    a.wo = (cc.w + 2 - 3) / cc.stride + 1;
    ConvShape b{cc.n, kChainC, a.ho, a.wo, kChainC, 1, 1, a.ho, a.wo, 1, 1, 0, 0, 1, 1, 1};
    const ConvTiles t{int(cc.m), kChainC, 72, 3, 1, true};
    REQUIRE(conv_chain_fits(a, t, b));
    for (int q = 0; q < 4; ++q, ++r) {
      const Activation act_a = kActivations[(r + 1) % 4], act_b = kActivations[(r + r / 4) % 4];
      const Tensor x = Tensor::randn({a.n, a.c, a.h, a.w}, seed++);
      const Tensor wa = Tensor::randn({a.k, a.c, 3, 3}, seed++, 1.0f / std::sqrt(9.0f * a.c));
      const Tensor wb = Tensor::randn({b.k, b.c, 1, 1}, seed++, 1.0f / std::sqrt(float(b.c)));
      const Tensor sa = Tensor::randn({a.k}, seed++), ha = Tensor::randn({a.k}, seed++);
      const Tensor sb = Tensor::randn({b.k}, seed++), hb = Tensor::randn({b.k}, seed++);
      // Run q leaves out A's scale and shift (q = 1).
      const float* psa = q == 1 ? nullptr : sa.f32();
      Tensor z = Tensor::empty({a.n, a.k, a.ho, a.wo}), ref = Tensor::empty({b.n, b.k, b.ho, b.wo});
      cpu::conv2d(a, x.f32(), wa.f32(), psa, q == 1 ? nullptr : ha.f32(), act_a, z.f32(), nullptr);
      cpu::conv2d(b, z.f32(), wb.f32(), sb.f32(), hb.f32(), act_b, ref.f32(), nullptr);

      Tensor packed = Tensor::empty({wgmma_packed_floats(a, t) + kChainTailFloats});
      pack_wgmma_weights(a, t, wa.f32(), packed.f32());
      pack_conv_chain(b, wb.f32(), sb.f32(), hb.f32(), packed.f32() + wgmma_packed_floats(a, t));
      const Tensor dx = x.to(Device::CUDA), dp = packed.to(Device::CUDA);
      const Tensor dsa = sa.to(Device::CUDA), dha = ha.to(Device::CUDA);
      const PoisonedOutput out(b, cc.slab);
      const auto dev = [](const Tensor& u) { return static_cast<const float*>(u.raw()); };
      cuda::conv_chain(a, t, out.b, dev(dx), q == 1 ? nullptr : dev(dsa),
                       q == 1 ? nullptr : dev(dha), act_a, dev(dp), act_b, out.y, nullptr);
      out.check(ref, two_conv_magnitude(a, x, wa, psa, z, b, wb, sb.f32()), cc.name, a, act_a,
                act_b, q);
    }
  }

  // What it cannot take is refused, not run.
  ConvShape a{1, 32, 32, 32, 64, 3, 3, 16, 16, 2, 2, 1, 1, 1, 1, 1};
  ConvShape b{1, 64, 16, 16, 32, 1, 1, 16, 16, 1, 1, 0, 0, 1, 1, 1};
  CHECK_THROWS_WITH(
      cuda::conv_chain(a, ConvTiles{64, 64, 72, 3, 1, true}, b, nullptr, nullptr, nullptr,
                       Activation::Silu, nullptr, Activation::Silu, nullptr, nullptr),
      Catch::Contains("a conv chain takes a 3x3 conv on wgmma halo tiles"));
}

// The conv pair kernel (cuda::conv_pair: a stem conv and the 3x3 stride-2 conv that reads it, A's
// output never stored) against the two convs on the CPU, on poisoned output: 16-byte input rows
// and odd ones, padding 1, 0 and uneven, fewer channels than its tiles (1 and 2 in, 8 and 12
// between, 13 and 24 out), planes under one square and several squares each way, batch 1 to 3,
// every pair of activations, y as a channel slab of a larger batch (check_poisoned).
TEST_CASE("gpu conv: the conv pair kernel against the two convs on the CPU",
          "[gpu][conv][pair][sm90a]") {
  ensure_backend();
  struct PairCase {
    const char* name;
    int64_t n, c, h, w, mid, k;
    int64_t pad_a[4], pad_b[4];  // top, left, bottom, right
    bool slab;                   // y as channels [1, 1 + k) of a batch with 2 more
  };
  // clang-format off
  const PairCase cases[] = {
      {"an RGB stem, 16-byte rows",      2, 3, 64, 64, 16, 32, {1, 1, 1, 1}, {1, 1, 1, 1}, false},
      {"odd plane, 4-byte copies",       3, 3, 37, 45, 16, 32, {1, 1, 1, 1}, {1, 1, 1, 1}, true},
      {"one channel, narrow layers",     1, 1, 29, 52,  8, 13, {1, 1, 1, 1}, {1, 1, 1, 1}, false},
      {"no padding",                     2, 2, 40, 36, 12, 24, {0, 0, 0, 0}, {0, 0, 0, 0}, true},
      {"uneven padding",                 1, 3, 33, 28, 16, 32, {0, 1, 1, 0}, {2, 0, 0, 1}, false},
      {"plane under one square",         1, 3,  9, 11, 16, 32, {1, 1, 1, 1}, {1, 1, 1, 1}, false},
      {"squares past the plane",         3, 3, 70, 100, 16, 32, {1, 2, 1, 2}, {1, 1, 1, 1}, true},
  };
  // clang-format on
  uint64_t seed = 9000;
  int r = 0;
  for (const PairCase& pc : cases) {
    ConvShape a{pc.n, pc.c, pc.h, pc.w,        pc.mid,      3, 3, 0,
                0,    2,    2,    pc.pad_a[0], pc.pad_a[1], 1, 1, 1};
    a.ho = (pc.h + pc.pad_a[0] + pc.pad_a[2] - 3) / 2 + 1;
    a.wo = (pc.w + pc.pad_a[1] + pc.pad_a[3] - 3) / 2 + 1;
    ConvShape b{pc.n, pc.mid, a.ho, a.wo,        pc.k,        3, 3, 0,
                0,    2,      2,    pc.pad_b[0], pc.pad_b[1], 1, 1, 1};
    b.ho = (a.ho + pc.pad_b[0] + pc.pad_b[2] - 3) / 2 + 1;
    b.wo = (a.wo + pc.pad_b[1] + pc.pad_b[3] - 3) / 2 + 1;
    REQUIRE(conv_pair_fits(a, b));
    for (int q = 0; q < 4; ++q, ++r) {
      const Activation act_a = kActivations[(r + 1) % 4], act_b = kActivations[(r + r / 4) % 4];
      const Tensor x = Tensor::randn({a.n, a.c, a.h, a.w}, seed++);
      const Tensor wa = Tensor::randn({a.k, a.c, 3, 3}, seed++, 1.0f / std::sqrt(9.0f * a.c));
      const Tensor wb = Tensor::randn({b.k, b.c, 3, 3}, seed++, 1.0f / std::sqrt(9.0f * b.c));
      const Tensor sa = Tensor::randn({a.k}, seed++), ha = Tensor::randn({a.k}, seed++);
      const Tensor sb = Tensor::randn({b.k}, seed++), hb = Tensor::randn({b.k}, seed++);
      // Run q leaves out A's scale and shift (q = 1), B's (q = 2).
      const float* psa = q == 1 ? nullptr : sa.f32();
      const float* psb = q == 2 ? nullptr : sb.f32();
      Tensor z = Tensor::empty({a.n, a.k, a.ho, a.wo}), ref = Tensor::empty({b.n, b.k, b.ho, b.wo});
      cpu::conv2d(a, x.f32(), wa.f32(), psa, q == 1 ? nullptr : ha.f32(), act_a, z.f32(), nullptr);
      cpu::conv2d(b, z.f32(), wb.f32(), psb, q == 2 ? nullptr : hb.f32(), act_b, ref.f32(),
                  nullptr);

      const Tensor dx = x.to(Device::CUDA), dwa = wa.to(Device::CUDA), dwb = wb.to(Device::CUDA);
      const Tensor dsa = sa.to(Device::CUDA), dha = ha.to(Device::CUDA);
      const Tensor dsb = sb.to(Device::CUDA), dhb = hb.to(Device::CUDA);
      const PoisonedOutput out(b, pc.slab);
      const auto dev = [](const Tensor& t) { return static_cast<const float*>(t.raw()); };
      cuda::conv_pair(a, out.b, dev(dx), dev(dwa), q == 1 ? nullptr : dev(dsa),
                      q == 1 ? nullptr : dev(dha), act_a, dev(dwb), q == 2 ? nullptr : dev(dsb),
                      q == 2 ? nullptr : dev(dhb), act_b, out.y, nullptr);
      out.check(ref, two_conv_magnitude(a, x, wa, psa, z, b, wb, psb), pc.name, a, act_a, act_b,
                q);
    }
  }

  // What it cannot take is refused, not run.
  ConvShape a{1, 4, 32, 32, 16, 3, 3, 16, 16, 2, 2, 1, 1, 1, 1, 1};
  ConvShape b{1, 16, 16, 16, 32, 3, 3, 8, 8, 2, 2, 1, 1, 1, 1, 1};
  CHECK_THROWS_WITH(cuda::conv_pair(a, b, nullptr, nullptr, nullptr, nullptr, Activation::Silu,
                                    nullptr, nullptr, nullptr, Activation::Silu, nullptr, nullptr),
                    Catch::Contains("[conv_pair] takes a 3x3 conv at stride 2 over at most 3"));
}
