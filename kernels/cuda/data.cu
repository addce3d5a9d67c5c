// Data-movement CUDA kernels: the slab copy behind concat and split, nearest upsampling.
//
// copy_slab   dst[o, dst_offset + j, i] = src[o, src_offset + j, i] for o < outer, j < count,
//             i < inner, both tensors viewed as [outer, extent, inner] (their own extents).
//             Each o is one contiguous run of count * inner floats in both tensors, at
//             (o * extent + offset) * inner.
// upsample    y[p, oh, ow] = x[p, oh / scale_h, ow / scale_w] over planes p < n * c, with
//             y's planes (h * scale_h) x (w * scale_w).
// Layout: float32, device pointers; src and dst must not overlap. copy_slab's rows may lie
//   apart (src_extent, dst_extent); upsample's images x_image and y_image floats apart (channel
//   slabs of a larger batch); everything else is contiguous.
// Grid: 1-D and grid-stride, kThreads per block, at most one full wave (grid_for), so any
//   element count runs. A work item is V = 4 consecutive floats of one row (float4 loads and
//   stores) when the row length and every row start are multiples of 4 and the pointers are
//   16-byte aligned, else one float. copy_slab: item w is row w / chunks, column
//   (w % chunks) * V. upsample: item w is output row w / chunks (plane row / ho, oh = row % ho),
//   columns (w % chunks) * V .. + V, each read from x[iw = ow / scale_w]: neighbouring
//   outputs share inputs, so a warp's reads hit 1 / scale_w as many addresses as it writes.
// Index math is 32-bit when every index is below 2^31 (its divisions by launch constants then
// multiply-shifts, see Divisor), else 64-bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "epilog/kernels/cuda.h"
#include "launch.cuh"

namespace epilog::cuda {
namespace {

constexpr int kThreads = 256;
using namespace detail;

// -- copy_slab --

template <int V, class I>
__global__ void __launch_bounds__(kThreads)
    copy_slab_kernel(Divisor<I> chunks, I items, const float* __restrict__ src, I src_row,
                     I src_start, float* __restrict__ dst, I dst_row, I dst_start) {
  pdl_begin();
  using T = std::conditional_t<V == 4, float4, float>;
  const I step = I(gridDim.x) * kThreads;
  for (I w = I(blockIdx.x) * kThreads + threadIdx.x; w < items; w += step) {
    const I o = chunks.div(w), col = (w - o * chunks.d) * V;
    *reinterpret_cast<T*>(dst + o * dst_row + dst_start + col) =
        __ldg(reinterpret_cast<const T*>(src + o * src_row + src_start + col));
  }
}

// -- upsample_nearest --

template <int V, class I>
__global__ void __launch_bounds__(kThreads)
    upsample_kernel(Divisor<I> chunks, I items, Divisor<I> c, I h, I w, Divisor<I> ho, I wo,
                    Divisor<I> scale_h, Divisor<I> scale_w, const float* __restrict__ x, I xs,
                    float* __restrict__ y, I ys) {
  pdl_begin();
  const I step = I(gridDim.x) * kThreads;
  for (I item = I(blockIdx.x) * kThreads + threadIdx.x; item < items; item += step) {
    const I row = chunks.div(item), ow = (item - row * chunks.d) * V;
    const I plane = ho.div(row), oh = row - plane * ho.d;
    const I img = c.div(plane), ch = plane - img * c.d;
    const float* in = x + img * xs + (ch * h + scale_h.div(oh)) * w;
    float v[V];
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = __ldg(in + scale_w.div(ow + I(j)));
    float* out = y + img * ys + (ch * ho.d + oh) * wo + ow;
    if constexpr (V == 4)
      *reinterpret_cast<float4*>(out) = make_float4(v[0], v[1], v[2], v[3]);
    else
      *out = v[0];
  }
}

}  // namespace

void copy_slab(int64_t outer, int64_t count, int64_t inner, const float* src, int64_t src_extent,
               int64_t src_offset, float* dst, int64_t dst_extent, int64_t dst_offset,
               Stream stream) {
  const int64_t len = count * inner;
  if (outer == 0 || len == 0) return;
  const int64_t src_row = src_extent * inner, dst_row = dst_extent * inner;
  const int64_t src_start = src_offset * inner, dst_start = dst_offset * inner;
  const bool vec = len % 4 == 0 && src_row % 4 == 0 && dst_row % 4 == 0 && src_start % 4 == 0 &&
                   dst_start % 4 == 0 && aligned16(src) && aligned16(dst);
  const int64_t chunks = vec ? len / 4 : len;
  const int64_t items = outer * chunks;
  // Every index is below the larger tensor's element count.
  dispatch(vec, fits32(outer * std::max(src_row, dst_row)), [&](auto v, auto i) {
    using I = decltype(i);
    launch_pdl(copy_slab_kernel<decltype(v)::value, I>, grid_for(items, kThreads), kThreads, 0,
               stream, 1, Divisor<I>(I(chunks)), I(items), src, I(src_row), I(src_start), dst,
               I(dst_row), I(dst_start));
  });
  check_launch("copy_slab");
}

void upsample_nearest(int64_t n, int64_t c, int64_t h, int64_t w, int64_t scale_h, int64_t scale_w,
                      const float* x, int64_t x_image, float* y, int64_t y_image, Stream stream) {
  const int64_t ho = h * scale_h, wo = w * scale_w, rows = n * c * ho;
  if (rows == 0 || wo == 0) return;
  const bool vec = wo % 4 == 0 && y_image % 4 == 0 && aligned16(y);
  const int64_t chunks = vec ? wo / 4 : wo;
  const int64_t items = rows * chunks;
  dispatch(vec, fits32(n * std::max(x_image, y_image)), [&](auto v, auto i) {
    using I = decltype(i);
    launch_pdl(upsample_kernel<decltype(v)::value, I>, grid_for(items, kThreads), kThreads, 0,
               stream, 1, Divisor<I>(I(chunks)), I(items), Divisor<I>(I(c)), I(h), I(w),
               Divisor<I>(I(ho)), I(wo), Divisor<I>(I(scale_h)), Divisor<I>(I(scale_w)), x,
               I(x_image), y, I(y_image));
  });
  check_launch("upsample_nearest");
}

}  // namespace epilog::cuda
