// Pooling CUDA kernels: 2-D max and average windows over NCHW planes, and the global average.
//
// Math (the same as the CPU reference, kernels/cpu/pool.cpp): output (oh, ow) of a plane
//   covers input rows [oh * stride_h - pad_t, + kh) and columns likewise, clipped to the input.
//   maxpool2d   the largest value in the clipped window; padding never wins; NaN propagates.
//   avgpool2d   the window's sum divided by its element count, or with count_include_pad by
//               the extent of the window clipped to the padded input [-pad, size + pad_end).
//   global_avgpool  y[r] = mean of x[r, 0 .. inner) for each of `outer` rows.
// Layout: float32 NCHW, device pointers; x and y must not overlap. Pools take the images of x
//   and y PoolShape::x_image() / y_image() floats apart (channel slabs of a larger batch);
//   everything else is contiguous.
// Grid, maxpool2d on a plane that fits in shared memory with its row maxima (kPoolPlaneFloats;
//   maxpool_kernel in shapes.h picks the kernel, and `epilog explain` prints it): a plane per
//   block per step, grid-stride, at most one full wave (maxpool_plane_kernel below;
//   maxpool_same_kernel for 3x3 and 5x5 windows at stride 1 padded by half the window).
// Grid, other pools: 1-D and grid-stride, one output per thread per step, kThreads per block,
//   at most one full wave. Item w decodes as ow = w % wo, oh = (w / wo) % ho, plane =
//   w / (wo * ho), so a warp covers consecutive ow of one row: its writes are coalesced and its
//   reads are the rows under those windows, shared through L1 by neighbouring windows.
// Grid, global_avgpool: rows of at most kWarpRowMax floats take one warp each (8 rows per
//   block); longer rows take a whole block. Lanes stride through the row (float4 loads when the
//   rows are 16-byte aligned), then a shuffle reduction (and one through shared memory across
//   the block's warps) gives the sum; the first lane divides and writes.
// Index math over planes and rows is 32-bit when every index is below 2^31 (its divisions then
// multiply-shifts, see Divisor), else 64-bit; within a plane it is 32-bit.
// Restrictions: h, w, kernel, stride and padding below 2^30 (checked); every window covers at
//   least one input element, which shape inference guarantees (padding < kernel).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "epilog/kernels/cuda.h"
#include "epilog/kernels/launch.h"
#include "epilog/runtime/launch_log.h"
#include "launch.cuh"

namespace epilog::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Up to 32 floats per lane a warp per row keeps enough loads in flight; longer rows (large
// feature maps, few rows) would leave too few warps busy.
constexpr int64_t kWarpRowMax = 1024;

// Geometry in 32-bit: the per-window math is the hot part of a pool.
struct Geometry {
  int h, w, ho, wo, kh, kw, stride_h, stride_w, pad_t, pad_l, pad_b, pad_r;
};

// One axis of a window: [begin, end) clipped to the input, and its extent clipped to the
// padded input (the count_include_pad divisor). As window() in kernels/cpu/pool.cpp.
struct Window {
  int begin, end, padded;
};
__device__ __forceinline__ Window window(int o, int stride, int pad_begin, int pad_end, int extent,
                                         int in) {
  const int start = o * stride - pad_begin;
  const int stop = min(start + extent, in + pad_end);
  return {max(start, 0), min(stop, in), stop - start};
}

// The larger of a and b, NaN if either is (PyTorch's max-pool propagates NaN): one instruction.
__device__ __forceinline__ float max_nan(float a, float b) {
  float m;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(m) : "f"(a), "f"(b));
  return m;
}

// Windows at most this wide take the unrolled row loop.
constexpr int kNarrow = 8;

template <bool Max, bool Narrow, class I>
__global__ void __launch_bounds__(kThreads)
    pool_kernel(Geometry g, bool count_include_pad, I items, Divisor<I> c, Divisor<I> ho,
                Divisor<I> wo, I xs, I ys, const float* __restrict__ x, float* __restrict__ y) {
  pdl_begin();
  const I step = I(gridDim.x) * kThreads;
  for (I item = I(blockIdx.x) * kThreads + threadIdx.x; item < items; item += step) {
    const I orow = wo.div(item);  // plane * ho + oh
    const int ow = int(item - orow * wo.d);
    const I plane = ho.div(orow);
    const int oh = int(orow - plane * ho.d);
    const I img = c.div(plane), ch = plane - img * c.d;
    const float* in = x + img * xs + ch * I(g.h) * I(g.w);
    const Window wh = window(oh, g.stride_h, g.pad_t, g.pad_b, g.kh, g.h);
    const Window ww = window(ow, g.stride_w, g.pad_l, g.pad_r, g.kw, g.w);
    const int cols = ww.end - ww.begin;
    // Each row of the window from one base pointer, so that its loads take immediate offsets;
    // Narrow windows unroll the row with predicates instead of looping (a 5-wide row costs
    // about a quarter of the instructions).
    const auto window_row = [&](int ih, auto f) {
      const float* r = in + (ih * g.w + ww.begin);
      if constexpr (Narrow) {
#pragma unroll
        for (int k = 0; k < kNarrow; ++k)
          if (k < cols) f(__ldg(r + k));
      } else {
        for (int k = 0; k < cols; ++k) f(__ldg(r + k));
      }
    };
    float out;
    if constexpr (Max) {
      float m = -INFINITY;  // every window holds an input element, which replaces it
      for (int ih = wh.begin; ih < wh.end; ++ih)
        window_row(ih, [&](float v) { m = max_nan(m, v); });
      out = m;
    } else {
      const int count = count_include_pad ? wh.padded * ww.padded : (wh.end - wh.begin) * cols;
      float sum = 0.0f;
      for (int ih = wh.begin; ih < wh.end; ++ih) window_row(ih, [&](float v) { sum += v; });
      out = sum / float(count);
    }
    y[img * ys + ch * I(g.ho) * I(g.wo) + I(oh) * I(g.wo) + ow] = out;
  }
}

// -- maxpool2d a plane a block, for planes that fit in shared memory --
// The block stages its plane once (coalesced loads), then computes each input row's maxima over
// the windows' columns (h x wo, into shared memory), then each output as the maximum of its
// window's rows of those: an output costs kh + kw shared reads instead of kh * kw loads, and
// every input is loaded once. NaN propagates through both maxima.
template <class I>
__global__ void __launch_bounds__(kThreads)
    maxpool_plane_kernel(Geometry g, FastDiv wo, I planes, Divisor<I> c, I xs, I ys,
                         const float* __restrict__ x, float* __restrict__ y) {
  extern __shared__ float plane_smem[];
  float* const in = plane_smem;
  float* const rows = plane_smem + g.h * g.w;
  pdl_begin();
  const int hw = g.h * g.w, hwo = g.h * g.wo, out = g.ho * g.wo;
  for (I plane = blockIdx.x; plane < planes; plane += gridDim.x) {
    const I img = c.div(plane), ch = plane - img * c.d;
    const float* __restrict__ src = x + img * xs + ch * I(hw);
    for (int i = threadIdx.x; i < hw; i += kThreads) in[i] = __ldg(src + i);
    __syncthreads();
    for (int i = threadIdx.x; i < hwo; i += kThreads) {
      const int r = fast_div(i, wo), ow = i - r * g.wo;
      const Window ww = window(ow, g.stride_w, g.pad_l, g.pad_r, g.kw, g.w);
      float m = -INFINITY;  // every window holds an input element, which replaces it
      for (int k = ww.begin; k < ww.end; ++k) m = max_nan(m, in[r * g.w + k]);
      rows[i] = m;
    }
    __syncthreads();
    float* __restrict__ dst = y + img * ys + ch * I(out);
    for (int i = threadIdx.x; i < out; i += kThreads) {
      const int oh = fast_div(i, wo), ow = i - oh * g.wo;
      const Window wh = window(oh, g.stride_h, g.pad_t, g.pad_b, g.kh, g.h);
      float m = -INFINITY;
      for (int r = wh.begin; r < wh.end; ++r) m = max_nan(m, rows[r * g.wo + ow]);
      dst[i] = m;
    }
    __syncthreads();  // the next plane overwrites in[] and rows[]
  }
}

// -- maxpool2d over "same" windows (K x K, stride 1, padding K / 2 all round: SPPF's 5x5) --
// As the plane kernel, but the plane is staged with K / 2 columns of -inf either side of each row
// and the row maxima with K / 2 rows of -inf above and below, so that both passes are K
// unrolled shared reads with no clipping. The padding is never overwritten, so it is written
// once. Blocks of kSameThreads, so that 16 share an SM: the YOLO-like model's SPPF pools at
// batch 16 (2048 planes of 20x20) run all their planes at once. Nsight Compute (2026-12-04, us
// a pool): 10.6 on the plane kernel, whose clipped run-time loops cost more than the bytes; 7.6
// with this kernel in 256-thread blocks, 6.8 to 7.0 in 128-thread ones.
// A chain (SPPF's cascade of pools, each pooling the one before) writes each pool's maxima back
// into the staged plane as the next one's input: the cascade reads its input once.
constexpr int kSameThreads = 128;
constexpr int kSameLoads = 4;  // loads in flight a thread while a plane is staged
constexpr int kSameChunk = kSameThreads * kSameLoads;

template <class I>
struct ChainOutputs {
  float* y[kMaxPoolChain];
  I ys[kMaxPoolChain];  // elements between images
  int count;
};

template <int K, class I>
__global__ void __launch_bounds__(kSameThreads)
    maxpool_same_kernel(int h, int w, FastDiv wdiv, I planes, Divisor<I> c, I xs,
                        const float* __restrict__ x, const ChainOutputs<I> out) {
  constexpr int P = K / 2;
  extern __shared__ float plane_smem[];
  const int pw = w + 2 * P, hw = h * w;
  float* const in = plane_smem;             // h rows of pw: P of -inf, the row, P of -inf
  float* const rows = plane_smem + h * pw;  // h + 2P rows of w: P of -inf, the maxima, P of -inf
  for (int i = threadIdx.x; i < h * pw; i += kSameThreads) {
    const int col = i % pw;
    if (col < P || col >= P + w) in[i] = -INFINITY;
  }
  for (int i = threadIdx.x; i < 2 * P * w; i += kSameThreads)
    rows[i < P * w ? i : i + hw] = -INFINITY;
  pdl_begin();
  for (I plane = blockIdx.x; plane < planes; plane += gridDim.x) {
    const I img = c.div(plane), ch = plane - img * c.d;
    const float* __restrict__ src = x + img * xs + ch * I(hw);
    // Loads kSameLoads deep before their stores: one round trip a chunk, not one a load.
    for (int base = 0; base < hw; base += kSameChunk) {
      float v[kSameLoads];
#pragma unroll
      for (int u = 0; u < kSameLoads; ++u) {
        const int i = base + u * kSameThreads + int(threadIdx.x);
        v[u] = i < hw ? __ldg(src + i) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kSameLoads; ++u) {
        const int i = base + u * kSameThreads + int(threadIdx.x);
        const int r = fast_div(i, wdiv);
        if (i < hw) in[i + r * 2 * P + P] = v[u];
      }
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < kMaxPoolChain; ++q) {
      if (q == out.count) break;
      for (int i = threadIdx.x; i < hw; i += kSameThreads) {
        const float* r = in + i + fast_div(i, wdiv) * 2 * P;  // window start, padded coordinates
        float m = r[0];
#pragma unroll
        for (int k = 1; k < K; ++k) m = max_nan(m, r[k]);
        rows[P * w + i] = m;
      }
      __syncthreads();
      float* __restrict__ dst = out.y[q] + img * out.ys[q] + ch * I(hw);
      const bool more = q + 1 < out.count;
      for (int i = threadIdx.x; i < hw; i += kSameThreads) {
        const float* r = rows + i;  // rows i / w - P .. + P of column i % w, padded coordinates
        float m = r[0];
#pragma unroll
        for (int k = 1; k < K; ++k) m = max_nan(m, r[k * w]);
        dst[i] = m;
        if (more) in[i + fast_div(i, wdiv) * 2 * P + P] = m;  // the next pool's input
      }
      __syncthreads();  // the next pool or plane overwrites in[] and rows[]
    }
  }
}

// The "same" kernel over `count` pools in a row (maxpool_kernel(p) == Same).
void launch_same(const PoolShape& p, const float* x, float* const* y, const int64_t* y_image,
                 int count, Stream stream) {
  const int k = int(p.kh);
  const int64_t planes = p.n * p.c;
  if (planes == 0) return;
  int64_t span = p.n * p.x_image();
  for (int q = 0; q < count; ++q) span = std::max(span, p.n * y_image[q]);
  const size_t smem = sizeof(float) * size_t(maxpool_same_floats(p));
  const auto launch = [&](auto i) {
    using I = decltype(i);
    ChainOutputs<I> out{};
    for (int q = 0; q < count; ++q) out.y[q] = y[q], out.ys[q] = I(y_image[q]);
    out.count = count;
    const auto same = k == 3 ? maxpool_same_kernel<3, I> : maxpool_same_kernel<5, I>;
    const int grid =
        int(std::min<int64_t>(planes, int64_t(max_blocks()) * kThreads / kSameThreads));
    launch_pdl(same, grid, kSameThreads, smem, stream, 1, int(p.h), int(p.w),
               make_fastdiv(uint32_t(p.w)), I(planes), Divisor<I>(I(p.c)), I(p.x_image()), x, out);
  };
  // 32-bit index math where every index fits.
  if (fits32(span))
    launch(uint32_t{});
  else
    launch(int64_t{});
}

template <bool Max>
void pool(const char* name, const PoolShape& p, const float* x, float* y, Stream stream) {
  const int64_t items = p.n * p.c * p.ho * p.wo;
  if (items == 0) return;
  constexpr int64_t kLimit = int64_t(1) << 30;
  for (int64_t v : {p.h, p.w, p.ho, p.wo, p.kh, p.kw, p.stride_h, p.stride_w, p.pad_t, p.pad_l,
                    p.pad_b, p.pad_r})
    EPILOG_CUDA_REQUIRE(v >= 0 && v < kLimit);
  const Geometry g{int(p.h),     int(p.w),     int(p.ho),       int(p.wo),
                   int(p.kh),    int(p.kw),    int(p.stride_h), int(p.stride_w),
                   int(p.pad_t), int(p.pad_l), int(p.pad_b),    int(p.pad_r)};
  const int64_t xs = p.x_image(), ys = p.y_image();
  // 32-bit index math where every index fits.
  const auto with_index = [&](auto launch) {
    if (fits32(std::max(p.n * xs, p.n * ys)))
      launch(uint32_t{});
    else
      launch(int64_t{});
  };
  // maxpool_kernel picks max-pooling's kernel (explain prints it); average pooling has one.
  const MaxPoolKernel kernel = Max ? maxpool_kernel(p) : MaxPoolKernel::Window;
  const auto launched = [&](MaxPoolKernel k) {
    check_launch(name);
    if (Max) log_launch("maxpool2d", [&] { return maxpool_launch_str(k); });
  };
  if (kernel == MaxPoolKernel::Same) {
    launch_same(p, x, &y, &ys, 1, stream);
    return launched(MaxPoolKernel::Same);
  }
  if (kernel == MaxPoolKernel::Plane) {
    const int64_t planes = p.n * p.c;
    const size_t smem = sizeof(float) * size_t(maxpool_plane_floats(p));
    const auto launch = [&](auto i) {
      using I = decltype(i);
      launch_pdl(maxpool_plane_kernel<I>, grid_for(planes, 1), kThreads, smem, stream, 1, g,
                 make_fastdiv(uint32_t(p.wo)), I(planes), Divisor<I>(I(p.c)), I(xs), I(ys), x, y);
    };
    with_index(launch);
    return launched(MaxPoolKernel::Plane);
  }
  const int grid = grid_for(items, kThreads);
  const bool narrow = p.kw <= kNarrow;
  const auto launch = [&](auto narrow_c, auto i) {
    using I = decltype(i);
    launch_pdl(pool_kernel<Max, decltype(narrow_c)::value, I>, grid, kThreads, 0, stream, 1, g,
               p.count_include_pad, I(items), Divisor<I>(I(p.c)), Divisor<I>(I(p.ho)),
               Divisor<I>(I(p.wo)), I(xs), I(ys), x, y);
  };
  const auto by_width = [&](auto i) {
    if (narrow)
      launch(std::true_type{}, i);
    else
      launch(std::false_type{}, i);
  };
  with_index(by_width);
  launched(MaxPoolKernel::Window);
}

// -- global_avgpool --

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum of row[0, len) over `lanes` threads numbered `lane`, V floats per load.
template <int V, class I>
__device__ __forceinline__ float partial_sum(const float* __restrict__ row, I len, int lane,
                                             int lanes) {
  float sum = 0.0f;
  if constexpr (V == 4) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
#pragma unroll 4
    for (I i = lane; i < len / 4; i += lanes) {
      const float4 t = __ldg(r4 + i);
      sum += (t.x + t.y) + (t.z + t.w);
    }
  } else {
#pragma unroll 4
    for (I i = lane; i < len; i += lanes) sum += __ldg(row + i);
  }
  return sum;
}

template <int V, class I>
__global__ void __launch_bounds__(kThreads)
    row_mean_warp(I outer, I inner, const float* __restrict__ x, float* __restrict__ y) {
  const int lane = threadIdx.x % 32;
  const I warps = I(gridDim.x) * kWarps;
  for (I r = I(blockIdx.x) * kWarps + threadIdx.x / 32; r < outer; r += warps) {
    const float sum = warp_sum(partial_sum<V>(x + r * inner, inner, lane, 32));
    if (lane == 0) y[r] = sum / float(inner);
  }
}

template <int V, class I>
__global__ void __launch_bounds__(kThreads)
    row_mean_block(I outer, I inner, const float* __restrict__ x, float* __restrict__ y) {
  __shared__ float partial[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (I r = blockIdx.x; r < outer; r += gridDim.x) {
    float sum = warp_sum(partial_sum<V>(x + r * inner, inner, threadIdx.x, kThreads));
    if (lane == 0) partial[warp] = sum;
    __syncthreads();
    if (warp == 0) {
      sum = warp_sum(lane < kWarps ? partial[lane] : 0.0f);
      if (lane == 0) y[r] = sum / float(inner);
    }
    __syncthreads();  // partial[] is rewritten by the next row
  }
}

}  // namespace

void maxpool2d(const PoolShape& p, const float* x, float* y, Stream stream) {
  pool<true>("maxpool2d", p, x, y, stream);
}

void maxpool2d_chain(const PoolShape& p, const float* x, float* const* y, const int64_t* y_image,
                     int count, Stream stream) {
  EPILOG_CUDA_REQUIRE(count >= 1 && count <= kMaxPoolChain);
  EPILOG_CUDA_REQUIRE(maxpool_kernel(p) == MaxPoolKernel::Same);
  EPILOG_CUDA_REQUIRE(p.h < (int64_t(1) << 30) && p.w < (int64_t(1) << 30));
  launch_same(p, x, y, y_image, count, stream);
  check_launch("maxpool2d_chain");
  log_launch("maxpool2d", [&] { return maxpool_launch_str(MaxPoolKernel::Same, count); });
}

void avgpool2d(const PoolShape& p, const float* x, float* y, Stream stream) {
  pool<false>("avgpool2d", p, x, y, stream);
}

void global_avgpool(int64_t outer, int64_t inner, const float* x, float* y, Stream stream) {
  if (outer == 0) return;
  EPILOG_CUDA_REQUIRE(inner > 0);
  const bool vec = inner % 4 == 0 && aligned16(x);
  const bool per_warp = inner <= kWarpRowMax;
  dispatch(vec, fits32(outer * inner), [&](auto v, auto i) {
    using I = decltype(i);
    if (per_warp)
      row_mean_warp<decltype(v)::value, I>
          <<<grid_for(outer, kWarps), kThreads, 0, stream>>>(I(outer), I(inner), x, y);
    else
      row_mean_block<decltype(v)::value, I>
          <<<grid_for(outer, 1), kThreads, 0, stream>>>(I(outer), I(inner), x, y);
  });
  check_launch("global_avgpool");
}

}  // namespace epilog::cuda
