// depth_to_space and space_to_depth on the GPU: the copies between deep [n, c * bh * bw, h, w]
// and wide [n, c, h * bh, w * bw], or a window of it (depth_to_space's crop) (cuda.h DepthSpace;
// cpu::depth_space is the CPU twin).
//
// Math: wide[img, ch, oh, ow] <-> deep[img, dc, fh / bh, fw / bw], i = fh % bh, j = fw % bw,
//   dc = ch * bh * bw + i * bw + j (CRD) or (i * bw + j) * c + ch (DCR), where fh = oh + crop_t
//   and fw = ow + crop_l (depth_to_space's crop; 0 for space_to_depth).
// Layout: float32, contiguous device pointers; x and y must not overlap.
// Grid: 1-D and grid-stride, kThreads per block, at most one full wave (grid_for). The loop runs
//   over the wide tensor, the side whose rows are long and contiguous: item t is wide row
//   t / chunks (rows are (img, ch, oh)), columns (t % chunks) * V .. + V, V = 4 (one float4 load
//   or store) where the wide row length is a multiple of 4 and both pointers are 16-byte
//   aligned, else 1. The deep side's V elements are scalar accesses, runs of w along a deep row
//   (bw of them interleaved): a warp touches bw deep rows, each in whole 32-byte sectors.
//   Bandwidth-bound: each element is read once and written once.
// Index math is 32-bit (divisions by launch constants as multiply-shifts, Divisor) when every
// index is below 2^31, else 64-bit. Restrictions: none beyond the shape inference's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "epilog/kernels/cuda.h"
#include "launch.cuh"

namespace epilog::cuda {
namespace {

constexpr int kThreads = 256;
using namespace detail;

template <int V, class I, bool ToSpace>
__global__ void __launch_bounds__(kThreads)
    depth_space_kernel(Divisor<I> chunks, I items, Divisor<I> c, Divisor<I> ho, I wo, I h, I w,
                       Divisor<I> bh, Divisor<I> bw, bool crd, I crop_t, I crop_l,
                       const float* __restrict__ x, float* __restrict__ y) {
  pdl_begin();
  const I step = I(gridDim.x) * kThreads, plane = h * w, taps = bh.d * bw.d;
  for (I t = I(blockIdx.x) * kThreads + threadIdx.x; t < items; t += step) {
    const I row = chunks.div(t), ow0 = (t - row * chunks.d) * V;
    const I planes = ho.div(row), oh = row - planes * ho.d;
    const I img = c.div(planes), ch = planes - img * c.d;
    const I fh = oh + crop_t, hi = bh.div(fh), i = fh - hi * bh.d;
    // The deep element of wide column ow0 + v: deep row (img, dc) at (hi, ow / bw).
    const I base = img * c.d * taps * plane + hi * w;
    I at[V];
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const I ow = ow0 + I(v) + crop_l, wi = bw.div(ow), j = ow - wi * bw.d;
      const I dc = crd ? ch * taps + i * bw.d + j : (i * bw.d + j) * c.d + ch;
      at[v] = base + dc * plane + wi;
    }
    if constexpr (ToSpace) {
      float* wide_out = y + row * wo + ow0;
      float v[V];
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = __ldg(x + at[k]);
      if constexpr (V == 4)
        *reinterpret_cast<float4*>(wide_out) = make_float4(v[0], v[1], v[2], v[3]);
      else
        *wide_out = v[0];
    } else {
      const float* wide_in = x + row * wo + ow0;
      if constexpr (V == 4) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(wide_in));
        y[at[0]] = v.x;
        y[at[1]] = v.y;
        y[at[2]] = v.z;
        y[at[3]] = v.w;
      } else {
        y[at[0]] = __ldg(wide_in);
      }
    }
  }
}

}  // namespace

void depth_space(const DepthSpace& s, bool to_space, const float* x, float* y, Stream stream) {
  const int64_t ho = s.ho, wo = s.wo, rows = s.n * s.c * ho;
  EPILOG_CUDA_REQUIRE(
      s.bh > 0 && s.bw > 0 && s.crop_t >= 0 && s.crop_l >= 0 && s.crop_t + ho <= s.h * s.bh &&
      s.crop_l + wo <= s.w * s.bw &&
      (to_space || (s.crop_t == 0 && s.crop_l == 0 && ho == s.h * s.bh && wo == s.w * s.bw)));
  if (rows == 0 || wo == 0) return;
  const bool vec = wo % 4 == 0 && aligned16(x) && aligned16(y);
  const int64_t chunks = vec ? wo / 4 : wo, items = rows * chunks;
  dispatch(
      vec, fits32(std::max(rows * wo, s.n * s.c * s.bh * s.h * s.bw * s.w)), [&](auto v, auto i) {
        using I = decltype(i);
        constexpr int V = decltype(v)::value;
        auto kernel = to_space ? depth_space_kernel<V, I, true> : depth_space_kernel<V, I, false>;
        launch_pdl(kernel, grid_for(items, kThreads), kThreads, 0, stream, 1, Divisor<I>(I(chunks)),
                   I(items), Divisor<I>(I(s.c)), Divisor<I>(I(ho)), I(wo), I(s.h), I(s.w),
                   Divisor<I>(I(s.bh)), Divisor<I>(I(s.bw)), s.crd, I(s.crop_t), I(s.crop_l), x, y);
      });
  check_launch(to_space ? "depth_to_space" : "space_to_depth");
}

}  // namespace epilog::cuda
