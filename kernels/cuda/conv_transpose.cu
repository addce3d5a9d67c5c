// The conv_transpose2d CUDA kernel: a gather, kKb output channels of one output pixel a thread
// (cpu::conv_transpose2d is its CPU twin). The graph rewrites the common transposed convs (groups
// 1, dilation 1) into a conv2d and a depth_to_space (graph/canonicalize.cpp); this kernel runs
// the rest (groups, depthwise, dilation) and graphs whose weights are known only at run time.
//
// Math: y[b, k, oh, ow] = bias[k] + sum over taps (i, j) and channels c of k's group of
//   x[b, c, ih, iw] * w[c, k % kg, i, j], where oh = ih * stride_h - pad_t + i * dil_h (ow
//   alike), in float32: tap i reaches oh only where oh + pad_t - i * dil_h is a multiple of
//   stride_h (the phase of oh), and ih lies in x.
// Layout: x [n, c, h, w], w [c, k / groups, r, s], y [n, k, ho, wo], contiguous float32 device
//   pointers; y must not overlap the others. bias may be null.
// Grid: 1-D and grid-stride over work items, kThreads threads a block, at most one full wave.
//   An item is kKb output channels of one group (a group's kg channels in ceil(kg / kKb) blocks,
//   the last one partly past the group's end) times kThreads output pixels, a pixel a thread,
//   items of one channel block next to each other (their weights stay in L2). Pixels run over
//   (b, oh, ow) with ow fastest, but each row's columns ordered by phase: ow = q + stride_w * t,
//   every t of phase q before phase q + 1. So a warp's threads share oh and, but at the ends of
//   a phase, q: the same taps (no divergence) and the same weights (shared-memory broadcasts),
//   reading neighbouring iw (coalesced); each write is one of stride_w interleaved runs, whose
//   sectors the other phases' warps complete.
// Weights: per chunk of the group's input channels (as many as fill kSmemFloats), the block's
//   w[c, k, i, j] staged in shared memory as [c][i][j][kKb]: per input value read, two float4
//   broadcasts and kKb FMAs. Channels past the group's end are staged as zeros, never stored.
// Index math is 32-bit where every index fits (int), else 64-bit. Restrictions: r * s * kKb
//   floats in shared memory (r * s <= 1536).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "epilog/kernels/cuda.h"
#include "launch.cuh"

namespace epilog::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kKb = 8;             // output channels a thread (two float4 of weights)
constexpr int kSmemFloats = 4096;  // 16 KB of weights a chunk
using namespace detail;

// transposed_source (shapes.h) in the kernel's index type.
template <class I>
__device__ __forceinline__ I source(I o, I pad, I t, I dil, I stride, I in) {
  const I at = o + pad - t * dil;
  if (at < 0) return -1;
  const I q = at / stride;
  return q * stride != at || q >= in ? I(-1) : q;
}

template <class I>
__global__ void __launch_bounds__(kThreads)
    conv_transpose_kernel(ConvShape sh, I pix_blocks, I items, I chunk, const float* __restrict__ x,
                          const float* __restrict__ w, const float* __restrict__ bias,
                          float* __restrict__ y) {
  pdl_begin();
  extern __shared__ float4 smem4[];
  float* ws = reinterpret_cast<float*>(smem4);
  const I n = I(sh.n), c = I(sh.c), h = I(sh.h), wd = I(sh.w), k = I(sh.k), r = I(sh.r),
          s = I(sh.s), ho = I(sh.ho), wo = I(sh.wo), groups = I(sh.groups);
  const I st_h = I(sh.stride_h), st_w = I(sh.stride_w), pad_t = I(sh.pad_t), pad_l = I(sh.pad_l);
  const I dil_h = I(sh.dil_h), dil_w = I(sh.dil_w);
  const I cg = c / groups, kg = k / groups, kblocks = (kg + kKb - 1) / kKb, taps = r * s;
  const I plane = h * wd, pixels = n * ho * wo;
  for (I item = blockIdx.x; item < items; item += gridDim.x) {
    const I kblock = item / pix_blocks, pblock = item - kblock * pix_blocks;
    const I g = kblock / kblocks, kk0 = (kblock - g * kblocks) * kKb;  // within the group
    // -- this thread's pixel: row (b, oh), column by phase --
    const I p = pblock * kThreads + I(threadIdx.x);
    const bool live = p < pixels;
    I b = 0, oh = 0, ow = 0;
    if (live) {
      const I row = p / wo;
      I t = p - row * wo, q = 0;
      for (I cnt = (wo + st_w - 1) / st_w; t >= cnt; cnt = (wo - q + st_w - 1) / st_w) {
        t -= cnt;
        ++q;
      }
      ow = q + st_w * t;
      b = row / ho;
      oh = row - b * ho;
    }
    float acc[kKb];
#pragma unroll
    for (int kb = 0; kb < kKb; ++kb) acc[kb] = 0.0f;
    for (I c0 = 0; c0 < cg; c0 += chunk) {
      const I cn = cg - c0 < chunk ? cg - c0 : chunk;
      // -- stage w[g * cg + c0 + ci, kk0 + kb, i, j] as ws[((ci * taps) + tap) * kKb + kb] --
      __syncthreads();  // the previous chunk's reads are done
      for (I e = threadIdx.x; e < cn * kKb * taps; e += kThreads) {
        const I tap = e % taps, kb = e / taps % kKb, ci = e / (taps * kKb);
        const I kk = kk0 + kb;
        ws[(ci * taps + tap) * kKb + kb] =
            kk < kg ? __ldg(w + ((g * cg + c0 + ci) * kg + kk) * taps + tap) : 0.0f;
      }
      __syncthreads();
      if (!live) continue;
      // -- the taps this pixel's phase reaches, each over the chunk's channels --
      const float* xb = x + ((b * c + g * cg + c0) * h) * wd;
      for (I i = 0; i < r; ++i) {
        const I ih = source(oh, pad_t, i, dil_h, st_h, h);
        if (ih < 0) continue;
        for (I j = 0; j < s; ++j) {
          const I iw = source(ow, pad_l, j, dil_w, st_w, wd);
          if (iw < 0) continue;
          const float* xp = xb + ih * wd + iw;
          const float4* wp = reinterpret_cast<const float4*>(ws + (i * s + j) * kKb);
#pragma unroll 4
          for (I ci = 0; ci < cn; ++ci) {
            const float v = __ldg(xp + ci * plane);
            const float4 w0 = wp[ci * taps * (kKb / 4)], w1 = wp[ci * taps * (kKb / 4) + 1];
            acc[0] = fmaf(v, w0.x, acc[0]);
            acc[1] = fmaf(v, w0.y, acc[1]);
            acc[2] = fmaf(v, w0.z, acc[2]);
            acc[3] = fmaf(v, w0.w, acc[3]);
            acc[4] = fmaf(v, w1.x, acc[4]);
            acc[5] = fmaf(v, w1.y, acc[5]);
            acc[6] = fmaf(v, w1.z, acc[6]);
            acc[7] = fmaf(v, w1.w, acc[7]);
          }
        }
      }
    }
    // -- store the group's channels --
    if (!live) continue;
#pragma unroll
    for (int kb = 0; kb < kKb; ++kb) {
      const I kk = kk0 + kb;
      if (kk >= kg) break;
      const I ko = g * kg + kk;
      y[((b * k + ko) * ho + oh) * wo + ow] = acc[kb] + (bias ? __ldg(bias + ko) : 0.0f);
    }
  }
}

}  // namespace

void conv_transpose2d(const ConvShape& s, const float* x, const float* w, const float* bias,
                      float* y, Stream stream) {
  const int64_t pixels = s.n * s.ho * s.wo;
  if (pixels == 0 || s.k == 0) return;
  EPILOG_CUDA_REQUIRE(s.groups > 0 && s.stride_h > 0 && s.stride_w > 0 && s.c % s.groups == 0 &&
                      s.k % s.groups == 0);
  const int64_t taps = s.r * s.s, cg = s.c / s.groups, kg = s.k / s.groups;
  EPILOG_CUDA_REQUIRE(taps * kKb <= 3 * kSmemFloats);  // 48 KB, no opt-in
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(cg, kSmemFloats / (taps * kKb)));
  const int64_t pix_blocks = ceil_div(pixels, kThreads);
  const int64_t items = s.groups * ceil_div(kg, kKb) * pix_blocks;
  const size_t smem = size_t(chunk * taps * kKb) * sizeof(float);
  // Every index: elements of x, y and w, an item, a row's reach (oh + pad_t, past the last tap),
  // with a block's overhang.
  const int64_t reach = std::max(s.ho + s.pad_t + s.r * s.dil_h, s.wo + s.pad_l + s.s * s.dil_w);
  const bool small = fits32(
      std::max({s.n * s.c * s.h * s.w, s.n * s.k * s.ho * s.wo, s.c * kg * taps, items, reach}) +
      kThreads);
  const int grid = grid_for(items, 1);
  if (small)
    launch_pdl(conv_transpose_kernel<int>, grid, kThreads, smem, stream, 1, s, int(pix_blocks),
               int(items), int(chunk), x, w, bias, y);
  else
    launch_pdl(conv_transpose_kernel<int64_t>, grid, kThreads, smem, stream, 1, s, pix_blocks,
               items, chunk, x, w, bias, y);
  check_launch("conv_transpose2d");
}

}  // namespace epilog::cuda
