// fused_conv2d, shared-memory tiled direct convolution (fp32 SIMT): the kernel for mid-size
// layers, where every input pixel feeds many output channels and every weight many pixels.
//
// Math: y[n, k, oh, ow] = act(acc * scale[k] + shift[k]) (+ residual[n, k, oh, ow]) with
//   acc = sum_{c < C, i < r, j < s} x[n, c, oh*sh - pad_t + i*dh, ow*sw - pad_l + j*dw]
//                                   * w[k, c, i, j]
// (x outside the input reads 0; scale == nullptr means 1, shift == nullptr means 0). This is the
// GEMM Y[k, p] = sum_e W[k, e] X[e, p] over pixels p = (n, oh, ow) and e = (c, i, j), with X
// gathered on the fly (implicit im2col).
// Layout: float32, NCHW x [n, C, h, w], weight [K, C, r, s], y [n, K, ho, wo].
// Images of x and y lie ConvShape::x_image() / y_image() floats apart (more than an image when
// x or y is a channel slab of a larger batch); within an image everything is contiguous.
//
// Tiles (ConvTiles): a block computes tiles.n (TN) output channels x tiles.m (TM) output pixels,
// where pixels are flattened over the whole batch, p = (n * ho + oh) * wo + ow, so small images
// still fill a tile. A step of the reduction stages in shared memory one window tap (i, j) for
// tiles.k = 8 input channels: an 8 x TM slab of gathered inputs and an 8 x TN slab of weights,
// each element read once from global memory and then by TN (resp. TM / 4) threads. Copies are
// cp.async, kStages = 4 steps deep, so three steps' global loads are in flight while one is
// computed, with one barrier a step; padding and partial tiles are zero-filled by the copy.
// Steps go tap-fastest within a group of 8 channels, so the r*s steps of a group re-read one
// small input region (L1 hits). Each thread holds a 4-pixel x PN-channel register tile (PN = 4,
// 2 or 1, so a block has 64 to 256 threads; see TiledConfig); its 4 pixels are consecutive, so
// its slab reads are float4 and its stores are float4 when ho*wo % 4 == 0.
// Grid: one-dimensional, channel tile fastest: blockIdx.x = pixel_tile * ceil(K / TN) +
// channel_tile, so the blocks that read the same input pixels run together and share it in L2.
// Restrictions: groups == 1 (conv_supports); tiles.m in {32, 64, 128}, tiles.n in {8, 16, 32},
// tiles.k == 8 (what lowering's conv_tiles produces; other values assert; tiles.stages is not
// read). Any K (a partial last channel tile), any n*ho*wo (a partial last pixel tile), any C,
// window, stride, padding and dilation. One input plane (h*w) and one output plane (ho*wo) must
// fit in int32.
// The caller precomputes nothing: no workspace, the weights are read as stored.
#include <climits>
#include <cstdint>

#include "conv_common.cuh"
#include "epilog/common.h"
#include "epilog/kernels/cuda.h"
#include "epilog/kernels/launch.h"
#include "epilog/runtime/launch_log.h"

namespace epilog::cuda {
namespace {

constexpr int kTK = 8;  // input channels a step stages (tiles.k)
// Pipeline depth: steps in flight while one is computed. A step is short (8 x 16 FMAs a thread
// for a 4x4 register tile), so several global round trips must overlap; small layers run few
// warps an SM and have nothing else to hide the latency with.
constexpr int kStages = 4;

struct TiledArgs {
  const float* x;
  const float* wt;
  const float* scale;
  const float* shift;
  float* y;
  int64_t npix;  // n * ho * wo
  int c, h, w;
  int k, ho, wo;
  int r, s;
  int sh, sw, pt, pl, dh, dw;
  int k_tiles;       // ceil(K / TN)
  int64_t xs, ys;    // elements between images of x and of y
  const float* res;  // residual (y's shape) or null
  int64_t rs;        // elements between its images
  bool vec_store;    // ho * wo % 4 == 0 and y 16-byte aligned: a thread's 4 pixels are a float4
  Act act, res_act;  // res_act: after adding the residual (cuda::ConvResidual)
};

// Thread layout of a TM x TN tile. The register tile is 4 pixels x PN channels with PN as large
// as keeps at least 64 threads (two warps) a block: 4x4 (16 FMAs per 2 shared loads) where the
// tile has 1024 outputs or more, down to 4x1 for the 32 x 8 tile.
template <int TM, int TN>
struct TiledConfig {
  static constexpr int kPM = 4;
  static constexpr int kPN = (TM / 4) * (TN / 4) >= 64 ? 4 : (TM / 4) * (TN / 2) >= 64 ? 2 : 1;
  static constexpr int kThreads = (TM / kPM) * (TN / kPN);
  // Staging: thread t loads input pixel columns t % TM + l * kThreads (l < kLP) for channels
  // t / TM + q * kCS (q < kLC) of the step, and the weights e = t + q * kThreads (q < kWPer) of
  // the 8 x TN slab with channel e % 8 and output channel e / 8.
  static constexpr int kLP = TM > kThreads ? TM / kThreads : 1;
  static constexpr int kCS = kThreads > TM ? kThreads / TM : 1;
  static constexpr int kLC = kTK / kCS;
  static constexpr int kWPer = kTK * TN / kThreads;
  // Weight slab row, padded by 4 floats: the staging stores (8 channels x 4 output channels a
  // warp) then land in 32 distinct banks, and rows stay 16-byte aligned for the float4 reads.
  static constexpr int kWRow = TN + 4;
  // Occupancy target for __launch_bounds__ (0: none, the PTX gets no .minnctapersm). Left alone,
  // ptxas (nvcc 13.0, sm_90) gives the 256-thread tile 64 registers and a 12-byte spill; 3
  // blocks an SM (80 registers) removes it. The others need 36 to 80 registers and no spill,
  // while any target makes ptxas spend registers up to the cap.
  static constexpr int kMinBlocks = kThreads == 256 ? 3 : 0;

  static_assert(kThreads >= 64 && kThreads <= 256, "block size");
  static_assert(kLP * kThreads >= TM && kLC * kCS == kTK && kLP * kLC * kThreads == kTK * TM,
                "input staging covers the slab exactly once");
  static_assert(kWPer >= 1 && kWPer * kThreads == kTK * TN, "weight staging");
};

template <int N>
__device__ __forceinline__ void load_row(const float* p, float (&v)[N]) {
  if constexpr (N == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
  } else if constexpr (N == 2) {
    const float2 t = *reinterpret_cast<const float2*>(p);
    v[0] = t.x, v[1] = t.y;
  } else {
    v[0] = *p;
  }
}

// Asynchronous 4-byte global -> shared copy; !valid writes 0 (padding, channels past C, pixels
// past the end) and reads nothing, though src must still be a mapped address.
__device__ __forceinline__ void copy4(float* dst, const float* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void copy_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void copy_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <int TM, int TN>
__global__ void __launch_bounds__(TiledConfig<TM, TN>::kThreads, TiledConfig<TM, TN>::kMinBlocks)
    conv_tiled_kernel(const TiledArgs a) {
  detail::pdl_begin();
  using Cfg = TiledConfig<TM, TN>;
  constexpr int kThreads = Cfg::kThreads, kLP = Cfg::kLP, kLC = Cfg::kLC, kCS = Cfg::kCS;
  constexpr int kWPer = Cfg::kWPer, kPN = Cfg::kPN, kWRow = Cfg::kWRow;
  __shared__ __align__(16) float xs[kStages][kTK][TM];
  __shared__ __align__(16) float ws[kStages][kTK][kWRow];

  const int t = threadIdx.x;
  const int k0 = static_cast<int>(blockIdx.x % unsigned(a.k_tiles)) * TN;
  const int64_t m0 = int64_t(blockIdx.x / unsigned(a.k_tiles)) * TM;
  const int hw = a.h * a.w, howo = a.ho * a.wo;
  const int rs = a.r * a.s;

  // -- staging geometry, fixed for the block --
  // The pixel under each staged column: its window origin and the start of its image's first
  // staged channel. Pixels past the end stage zeros.
  const int cq = t / TM;  // the first channel of a step this thread stages
  int ih0[kLP], iw0[kLP];
  bool pin[kLP];
  const float* xb[kLP];
#pragma unroll
  for (int l = 0; l < kLP; ++l) {
    const int64_t p = m0 + t % TM + l * kThreads;
    pin[l] = p < a.npix;
    const int64_t img = pin[l] ? p / howo : 0;
    const int q = static_cast<int>(p - img * howo);
    const int oh = q / a.wo, ow = q - oh * a.wo;
    ih0[l] = oh * a.sh - a.pt;
    iw0[l] = ow * a.sw - a.pl;
    xb[l] = a.x + img * a.xs + int64_t(cq) * hw;
  }
  const int wc = t % kTK;  // the weight slab channel this thread stages
  const float* wb[kWPer];
  bool kin[kWPer];
#pragma unroll
  for (int q = 0; q < kWPer; ++q) {
    const int kk = k0 + t / kTK + q * (kThreads / kTK);
    kin[q] = kk < a.k;
    wb[q] = a.wt + (int64_t(kin[q] ? kk : 0) * a.c + wc) * rs;
  }

  // Issues the copies of one step (input channels c0.., window tap (i, j)) into stage b.
  const auto issue = [&](int b, int c0, int i, int j) {
#pragma unroll
    for (int l = 0; l < kLP; ++l) {
      const int ih = ih0[l] + i * a.dh, iw = iw0[l] + j * a.dw;
      const bool in = pin[l] && unsigned(ih) < unsigned(a.h) && unsigned(iw) < unsigned(a.w);
      const float* src = in ? xb[l] + int64_t(c0) * hw + (ih * a.w + iw) : a.x;
#pragma unroll
      for (int q = 0; q < kLC; ++q) {
        const bool ok = in && c0 + cq + q * kCS < a.c;
        copy4(&xs[b][cq + q * kCS][t % TM + l * kThreads], ok ? src + int64_t(q * kCS) * hw : a.x,
              ok);
      }
    }
    const bool cin = c0 + wc < a.c;
    const int off = c0 * rs + i * a.s + j;
#pragma unroll
    for (int q = 0; q < kWPer; ++q) {
      const bool ok = kin[q] && cin;
      copy4(&ws[b][wc][t / kTK + q * (kThreads / kTK)], ok ? wb[q] + off : a.wt, ok);
    }
  };

  // Compute layout: consecutive threads take consecutive 4-pixel groups (float4 slab reads
  // without bank conflicts, and coalesced stores), then the channel groups.
  const int tm = t % (TM / 4), tn = t / (TM / 4);
  float acc[4][kPN];
#pragma unroll
  for (int pm = 0; pm < 4; ++pm)
#pragma unroll
    for (int pn = 0; pn < kPN; ++pn) acc[pm][pn] = 0.0f;

  // -- mainloop: 8 input channels x one window tap a step, kStages-deep cp.async pipeline --
  // Step order is tap-fastest: (c0, i, j) -> (c0, i, j + 1) ... -> (c0 + 8, 0, 0).
  const int steps = static_cast<int>(detail::ceil_div(a.c, kTK)) * rs;
  int ic = 0, ii = 0, ij = 0;  // the next step to issue
  const auto advance = [&] {
    if (++ij == a.s) {
      ij = 0;
      if (++ii == a.r) {
        ii = 0;
        ic += kTK;
      }
    }
  };
  // One commit group a step, empty past the last step, so that wait_group counts steps.
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < steps) {
      issue(st, ic, ii, ij);
      advance();
    }
    copy_commit();
  }
  for (int step = 0; step < steps; ++step) {
    copy_wait<kStages - 2>();  // this thread's copies of `step` have landed
    // Everyone's copies of `step` are visible, and everyone is done with step - 1, whose stage
    // the issue below refills.
    __syncthreads();
    const int next = step + kStages - 1;
    if (next < steps) {
      issue(next % kStages, ic, ii, ij);
      advance();
    }
    copy_commit();
    const int b = step % kStages;
#pragma unroll
    for (int c = 0; c < kTK; ++c) {
      float xv[4], wv[kPN];
      load_row(&xs[b][c][tm * 4], xv);
      load_row(&ws[b][c][tn * kPN], wv);
#pragma unroll
      for (int pm = 0; pm < 4; ++pm)
#pragma unroll
        for (int pn = 0; pn < kPN; ++pn) acc[pm][pn] = fmaf(xv[pm], wv[pn], acc[pm][pn]);
    }
  }

  // -- batchnorm + activation epilogue --
  const int64_t p0 = m0 + tm * 4;
  if (p0 >= a.npix) return;
  const int64_t img0 = p0 / howo;
  const int q0 = static_cast<int>(p0 - img0 * howo);
  // Batchnorm and activation in place, then the residual (its loads fly together, no store
  // between them), then the stores.
#pragma unroll
  for (int pn = 0; pn < kPN; ++pn) {
    const int k = k0 + tn * kPN + pn;
    const detail::ChannelAffine f = detail::channel_affine(a.scale, a.shift, k < a.k ? k : 0);
#pragma unroll
    for (int pm = 0; pm < 4; ++pm) acc[pm][pn] = detail::apply(acc[pm][pn], f, a.act);
  }
  // Pixel pm of the 4 is pixel q of image img (they may cross into the next image unless
  // ho*wo % 4 == 0), or past the last pixel.
  int64_t img[4];
  int q[4];
  {
    int64_t im = img0;
    int qq = q0;
#pragma unroll
    for (int pm = 0; pm < 4; ++pm) {
      img[pm] = im, q[pm] = qq;
      if (++qq == howo) qq = 0, ++im;
    }
  }
  if (a.res) {
#pragma unroll
    for (int pn = 0; pn < kPN; ++pn) {
      const int k = k0 + tn * kPN + pn;
#pragma unroll
      for (int pm = 0; pm < 4; ++pm)
        if (k < a.k && p0 + pm < a.npix)
          acc[pm][pn] = activate(a.res_act,
                                 acc[pm][pn] + __ldg(a.res + img[pm] * a.rs + int64_t(k) * howo + q[pm]));
    }
  }
#pragma unroll
  for (int pn = 0; pn < kPN; ++pn) {
    const int k = k0 + tn * kPN + pn;
    if (k >= a.k) break;
    if (a.vec_store) {
      // ho*wo % 4 == 0: the 4 pixels are in one image, and the float4 is aligned.
      *reinterpret_cast<float4*>(a.y + img0 * a.ys + int64_t(k) * howo + q0) =
          make_float4(acc[0][pn], acc[1][pn], acc[2][pn], acc[3][pn]);
    } else {
#pragma unroll
      for (int pm = 0; pm < 4; ++pm)
        if (p0 + pm < a.npix) a.y[img[pm] * a.ys + int64_t(k) * howo + q[pm]] = acc[pm][pn];
    }
  }
}

template <int TM, int TN>
void launch(const TiledArgs& a, Stream stream) {
  const int64_t blocks = detail::ceil_div(a.npix, TM) * a.k_tiles;
  EPILOG_ASSERT(blocks <= INT_MAX, "conv_tiled grid of {} blocks", blocks);
  detail::launch_pdl(conv_tiled_kernel<TM, TN>, static_cast<unsigned>(blocks),
                     TiledConfig<TM, TN>::kThreads, 0, stream, 1, a);
}

// The tiles lowering's conv_tiles produces, one instantiation each.
struct Variant {
  int m, n;
  void (*launch)(const TiledArgs&, Stream);
};
constexpr Variant kVariants[] = {
    {128, 32, launch<128, 32>}, {128, 16, launch<128, 16>}, {128, 8, launch<128, 8>},
    {64, 32, launch<64, 32>},   {64, 16, launch<64, 16>},   {64, 8, launch<64, 8>},
    {32, 32, launch<32, 32>},   {32, 16, launch<32, 16>},   {32, 8, launch<32, 8>},
};

}  // namespace

void conv_tiled(const ConvShape& s, const ConvTiles& t, const float* x, const float* w,
                const float* scale, const float* shift, Act act, float* y, Stream stream,
                ConvResidual residual) {
  EPILOG_ASSERT(s.groups == 1, "conv_tiled runs groups == 1 only, got {}", s.groups);
  EPILOG_ASSERT(s.n > 0 && s.c > 0 && s.k > 0 && s.ho > 0 && s.wo > 0 && s.r > 0 && s.s > 0);
  EPILOG_ASSERT(s.stride_h > 0 && s.stride_w > 0 && s.dil_h > 0 && s.dil_w > 0 && s.pad_t >= 0 &&
                s.pad_l >= 0);
  EPILOG_ASSERT(s.h * s.w <= INT_MAX && s.ho * s.wo <= INT_MAX && s.c * s.r * s.s <= INT_MAX,
                "conv_tiled planes {}x{} -> {}x{} exceed int32", s.h, s.w, s.ho, s.wo);
  EPILOG_ASSERT(t.k == kTK, "conv_tiled tiles.k {} (only {} is built)", t.k, kTK);
  EPILOG_ASSERT(x && w && y);

  TiledArgs a;
  a.x = x;
  a.wt = w;
  a.scale = scale;
  a.shift = shift;
  a.y = y;
  a.npix = s.n * s.ho * s.wo;
  a.c = int(s.c), a.h = int(s.h), a.w = int(s.w);
  a.k = int(s.k), a.ho = int(s.ho), a.wo = int(s.wo);
  a.r = int(s.r), a.s = int(s.s);
  a.sh = int(s.stride_h), a.sw = int(s.stride_w);
  a.pt = int(s.pad_t), a.pl = int(s.pad_l);
  a.dh = int(s.dil_h), a.dw = int(s.dil_w);
  a.k_tiles = int(detail::ceil_div(s.k, t.n > 0 ? t.n : 1));
  a.vec_store = (s.ho * s.wo) % 4 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  a.xs = s.x_image(), a.ys = s.y_image();
  a.res = residual.x, a.rs = s.r_image();
  a.act = act, a.res_act = residual.post;

  for (const Variant& v : kVariants) {
    if (v.m == t.m && v.n == t.n) {
      v.launch(a, stream);
      check_launch("conv_tiled");
      log_launch("tiled", [&] { return conv_tiles_str({v.m, v.n, kTK}); });
      return;
    }
  }
  EPILOG_ASSERT(false, "conv_tiled tiles m={} n={} not built (m in 32/64/128, n in 8/16/32)", t.m,
                t.n);
}

}  // namespace epilog::cuda
