// Reduction and normalization CUDA kernels: reduce_{mean,sum,max,min,prod}, softmax and
// log_softmax, and the row normalization behind layer_norm, group_norm and instance_norm.
//
// Rows: a row (the reduced elements of one output, contiguous) takes one warp when it has at most
//   kWarpRowMax floats (8 rows a block of 256), else a whole block; lanes stride through it
//   (coalesced), then a shuffle reduction, and one through shared memory across a block's warps.
//   Grid-stride over rows, at most one full wave. Used for reductions over the innermost dims
//   (a last axis, H x W per (n, c)), and the normalizations of rows up to kWarpRowMax.
// Register rows (softmax over the last axis up to kWarpRowMax): kWidth lanes a row (several rows
//   a warp for rows of up to 16), each lane holding its kPer elements in registers from the one
//   read to the one write; max and sum by shuffles within the row's lanes. Longer rows: a block.
// Cluster rows (normalizations of rows over kWarpRowMax, up to kClusterRowMax): a row split over
//   a thread-block cluster of up to 8 blocks (Hopper; one block elsewhere, rows up to
//   kThreads * kClusterPer), each thread holding up to kClusterPer of its elements in registers;
//   each block's mean and squared deviations (two exact passes over registers) merge across the
//   cluster through distributed shared memory in one round. x read once, y written once, and
//   group_norm's few long groups (512 of 25088 floats at [16, 256, 56, 56]) fill the GPU.
// Columns (reductions whose kept dims end with x's innermost, e.g. over the channels of NCHW; and
//   layer_norm over dims that have inner dims after them): a block takes 8 to 32 neighbouring
//   columns of one outer index (a warp reads 8 to 32 consecutive floats an element, coalesced)
//   and splits each column's elements among kThreads / kCols threads; the parts meet in shared
//   memory (column_all).
// Strided (reduce when the reduced dims are not innermost and the columns do not apply, or
//   an output reduces under kColumnMinCount elements; softmax over an inner axis): one output
//   (reduce) or one (outer, inner) column (softmax) per thread, looping over the reduced
//   elements; consecutive threads read consecutive elements of the kept inner dims, so the
//   reads stay coalesced.
// Math: float32 sums and products (the CPU reference works in double; the tests bound the
//   difference). Max and min propagate NaN. softmax: y = e^(x - max) / sum e^(x - max);
//   log_softmax y = x - max - log(sum e^(x - max)). Normalization: mean, then the biased variance
//   of x - mean (two passes), then (x - mean) * rsqrt(var + eps) * scale + bias.
// Layout: float32, contiguous, device pointers; x and y must not overlap. 64-bit indices.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <cooperative_groups.h>

#include "epilog/kernels/cuda.h"
#include "launch.cuh"

namespace epilog::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kWarpRowMax = 1024;
// Columns from this many reduced elements an output: with fewer, most of a column's threads
// idle and its blocks' shared-memory rounds cost more than the reads (ResNeSt's sum over 2
// radix maps: 0.475 ms on the columns kernel), and a thread an output loops briefly instead.
constexpr int64_t kColumnMinCount = 32;
using namespace detail;

__device__ __forceinline__ float combine(Reduce op, float a, float b) {
  switch (op) {
    case Reduce::Max:
      return a != a || a > b ? a : b;
    case Reduce::Min:
      return a != a || a < b ? a : b;
    case Reduce::Prod:
      return a * b;
    default:
      return a + b;
  }
}

__device__ __forceinline__ float identity(Reduce op) {
  return op == Reduce::Max    ? -INFINITY
         : op == Reduce::Min  ? INFINITY
         : op == Reduce::Prod ? 1.0f
                              : 0.0f;
}

// softmax's output from x - max and the row's sum of e^(x - max) (log_sum its log).
__device__ __forceinline__ float softmax_out(bool log, float shifted, float inv, float log_sum) {
  return log ? shifted - log_sum : expf(shifted) * inv;
}

// The combination of v over a warp (kBlock false) or the block (true); every thread gets it.
template <bool kBlock>
__device__ __forceinline__ float row_all(Reduce op, float v, float* scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = combine(op, v, __shfl_xor_sync(0xffffffffu, v, offset));
  if constexpr (kBlock) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = identity(op);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v = combine(op, v, scratch[w]);
    __syncthreads();  // scratch is rewritten by the next reduction
  }
  return v;
}

// Calls f(row index, lane, lanes) for each row this warp or block owns.
template <bool kBlock, class F>
__device__ __forceinline__ void for_rows(int64_t rows, F&& f) {
  if constexpr (kBlock) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) f(r, int(threadIdx.x), kThreads);
  } else {
    const int64_t warps = int64_t(gridDim.x) * kWarps;
    for (int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows; r += warps)
      f(r, int(threadIdx.x % 32), 32);
  }
}

// The combination over a column tile's parts: thread (part, col) = (threadIdx.x / kCols,
// threadIdx.x % kCols) brings v, and every thread of column col gets op over its kThreads / kCols
// parts, in part order. Every thread of the block must call it (it holds three barriers).
template <int kCols>
__device__ __forceinline__ float column_all(Reduce op, float v,
                                            float (&partial)[kThreads / kCols][kCols],
                                            float (&column)[kCols]) {
  const int col = threadIdx.x % kCols, part = threadIdx.x / kCols;
  partial[part][col] = v;
  __syncthreads();
  if (part == 0) {
    float t = identity(op);
#pragma unroll 8
    for (int p = 0; p < kThreads / kCols; ++p) t = combine(op, t, partial[p][col]);
    column[col] = t;
  }
  __syncthreads();
  const float t = column[col];
  __syncthreads();  // partial and column are rewritten by the next combination
  return t;
}

// The widest column tile (32, 16 or 8 columns) that still gives every SM two blocks: `tiles(c)`
// is the number of tiles of c columns.
template <class Tiles>
int column_tile(Tiles&& tiles) {
  const int64_t enough = max_blocks() / 4;
  return tiles(32) >= enough ? 32 : tiles(16) >= enough ? 16 : 8;
}

// kernel<32>, <16> or <8> as `cols` says, on a grid of `tiles` blocks (at most a wave).
#define EPILOG_LAUNCH_COLUMNS(kernel, cols, tiles, stream, ...)             \
  do {                                                                      \
    if ((cols) == 32)                                                       \
      kernel<32><<<grid_for(tiles, 1), kThreads, 0, stream>>>(__VA_ARGS__); \
    else if ((cols) == 16)                                                  \
      kernel<16><<<grid_for(tiles, 1), kThreads, 0, stream>>>(__VA_ARGS__); \
    else                                                                    \
      kernel<8><<<grid_for(tiles, 1), kThreads, 0, stream>>>(__VA_ARGS__);  \
  } while (0)

// -- reduce --

template <bool kBlock>
__global__ void __launch_bounds__(kThreads)
    reduce_rows_kernel(Reduce op, int64_t rows, int64_t len, const float* __restrict__ x,
                       float* __restrict__ y) {
  pdl_begin();
  __shared__ float scratch[kWarps];
  for_rows<kBlock>(rows, [&](int64_t r, int lane, int lanes) {
    const float* row = x + r * len;
    float v = identity(op);
    for (int64_t j = lane; j < len; j += lanes) v = combine(op, v, __ldg(row + j));
    v = row_all<kBlock>(op, v, scratch);
    if (lane == 0) y[r] = op == Reduce::Mean ? v / float(len) : v;
  });
}

__global__ void __launch_bounds__(kThreads)
    reduce_strided_kernel(Reduce op, ReduceShape s, int64_t outputs, int64_t count,
                          const float* __restrict__ x, float* __restrict__ y) {
  pdl_begin();
  for (int64_t o = int64_t(blockIdx.x) * kThreads + threadIdx.x; o < outputs;
       o += int64_t(gridDim.x) * kThreads) {
    int64_t rest = o, base = 0;
    for (int d = s.kept_rank - 1; d >= 0; --d) {
      base += rest % s.kept[d] * s.kept_stride[d];
      rest /= s.kept[d];
    }
    float v = identity(op);
    for (int64_t j = 0; j < count; ++j) {
      int64_t r = j, at = base;
      for (int d = s.reduced_rank - 1; d >= 0; --d) {
        at += r % s.reduced[d] * s.reduced_stride[d];
        r /= s.reduced[d];
      }
      v = combine(op, v, __ldg(x + at));
    }
    y[o] = op == Reduce::Mean ? v / float(count) : v;
  }
}

// Where column i of the columns kernels' output row o starts in x: the kept dims before the last
// decoded from o.
__device__ __forceinline__ int64_t column_base(const ReduceShape& s, int64_t o, int64_t i) {
  int64_t base = i, rest = o;
  for (int d = s.kept_rank - 2; d >= 0; --d) {
    base += rest % s.kept[d] * s.kept_stride[d];
    rest /= s.kept[d];
  }
  return base;
}

// Columns: the last kept dim (inner outputs) is x's innermost, stride 1; the other kept dims
// (decoded from the tile's outer index) and the reduced dims (one stride where they merged into
// one, else decoded an element) lie further apart. Output (o, i) of y as [outer, inner].
template <int kCols>
__global__ void __launch_bounds__(kThreads)
    reduce_columns_kernel(Reduce op, ReduceShape s, int64_t outputs, int64_t count,
                          const float* __restrict__ x, float* __restrict__ y) {
  constexpr int kParts = kThreads / kCols;
  pdl_begin();
  __shared__ float partial[kParts][kCols];
  __shared__ float column[kCols];
  const int col = threadIdx.x % kCols, part = threadIdx.x / kCols;
  const int last = s.kept_rank - 1;
  const int64_t inner = s.kept[last], outer = outputs / inner;
  const int64_t tiles_per_outer = ceil_div(inner, kCols);
  for (int64_t tile = blockIdx.x; tile < outer * tiles_per_outer; tile += gridDim.x) {
    const int64_t o = tile / tiles_per_outer, i = tile % tiles_per_outer * kCols + col;
    const bool live = i < inner;  // dead threads still join the block's barriers
    const int64_t base = column_base(s, o, i);
    float v = identity(op);
    if (live && s.reduced_rank == 1) {
      // Four loads in flight a thread, combined in the order j ascending.
      const float* __restrict__ p = x + base;
      const int64_t st = s.reduced_stride[0];
      int64_t j = part;
      for (; j + 3 * kParts < count; j += 4 * kParts) {
        const float v0 = __ldg(p + j * st), v1 = __ldg(p + (j + kParts) * st);
        const float v2 = __ldg(p + (j + 2 * kParts) * st), v3 = __ldg(p + (j + 3 * kParts) * st);
        v = combine(op, combine(op, combine(op, combine(op, v, v0), v1), v2), v3);
      }
      for (; j < count; j += kParts) v = combine(op, v, __ldg(p + j * st));
    } else if (live) {
      for (int64_t j = part; j < count; j += kParts) {
        int64_t r = j, at = base;
        for (int d = s.reduced_rank - 1; d >= 0; --d) {
          at += r % s.reduced[d] * s.reduced_stride[d];
          r /= s.reduced[d];
        }
        v = combine(op, v, __ldg(x + at));
      }
    }
    v = column_all<kCols>(op, v, partial, column);
    if (live && part == 0) y[o * inner + i] = op == Reduce::Mean ? v / float(count) : v;
  }
}

// Columns by float4 (reduce_columns_kernel's tiles, 4 columns a thread): where the reduced dims
// are one stride and every stride, x and y lie on 16 bytes, a thread loads an element's 4
// columns as one float4, a quarter of the loads and tiles of 4 * kCols columns: the mean over C
// of [16, 256, 56, 56] makes 400 tiles of 128 columns, one round of blocks, not 1568 of 32 in
// 2.4 rounds: 0.031 -> 0.026 ms (perf-history: "reduce columns by float4"). Parts combine in part
// order, as there.
__device__ __forceinline__ float4 combine4(Reduce op, float4 a, float4 b) {
  return make_float4(combine(op, a.x, b.x), combine(op, a.y, b.y), combine(op, a.z, b.z),
                     combine(op, a.w, b.w));
}

template <int kCols>
__global__ void __launch_bounds__(kThreads)
    reduce_columns4_kernel(Reduce op, ReduceShape s, int64_t outputs, int64_t count,
                           const float* __restrict__ x, float* __restrict__ y) {
  constexpr int kParts = kThreads / kCols;
  pdl_begin();
  __shared__ float4 partial[kParts][kCols];
  const int col = threadIdx.x % kCols, part = threadIdx.x / kCols;
  const int last = s.kept_rank - 1;
  const int64_t inner = s.kept[last], outer = outputs / inner, st = s.reduced_stride[0];
  const int64_t tiles_per_outer = ceil_div(inner, 4 * kCols);
  for (int64_t tile = blockIdx.x; tile < outer * tiles_per_outer; tile += gridDim.x) {
    const int64_t o = tile / tiles_per_outer, i = 4 * (tile % tiles_per_outer * kCols + col);
    const bool live = i < inner;  // inner % 4 == 0: a live thread's 4 columns all are
    const int64_t base = column_base(s, o, i);
    const float id = identity(op);
    float4 v = make_float4(id, id, id, id);
    if (live) {
      const float* __restrict__ p = x + base;
      const auto at = [&](int64_t j) { return __ldg(reinterpret_cast<const float4*>(p + j * st)); };
      int64_t j = part;
      for (; j + 3 * kParts < count; j += 4 * kParts) {
        const float4 v0 = at(j), v1 = at(j + kParts), v2 = at(j + 2 * kParts),
                     v3 = at(j + 3 * kParts);
        v = combine4(op, combine4(op, combine4(op, combine4(op, v, v0), v1), v2), v3);
      }
      for (; j < count; j += kParts) v = combine4(op, v, at(j));
    }
    partial[part][col] = v;
    __syncthreads();
    if (live && part == 0) {
      float4 t = partial[0][col];
      for (int q = 1; q < kParts; ++q) t = combine4(op, t, partial[q][col]);
      if (op == Reduce::Mean) {
        const float n = float(count);
        t = make_float4(t.x / n, t.y / n, t.z / n, t.w / n);
      }
      *reinterpret_cast<float4*>(y + o * inner + i) = t;
    }
    __syncthreads();  // partial is rewritten by the next tile
  }
}

// -- softmax --

// The combination of v over the kWidth lanes of its row (aligned groups of a warp); every lane of
// the group gets it.
template <int kWidth>
__device__ __forceinline__ float lanes_all(Reduce op, float v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1)
    v = combine(op, v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Register rows: rows of len <= kPer * kWidth, kWidth lanes a row (32 / kWidth rows a warp), lane
// `sub` of a row holding its elements sub + kWidth * i. Lanes past the last row still shuffle.
template <int kPer, int kWidth>
__global__ void __launch_bounds__(kThreads)
    softmax_regs_kernel(int64_t rows, int len, bool log, const float* __restrict__ x,
                        float* __restrict__ y) {
  constexpr int kRowsPerWarp = 32 / kWidth;
  pdl_begin();
  const int lane = threadIdx.x % 32, sub = lane % kWidth;
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  for (int64_t w = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; w * kRowsPerWarp < rows;
       w += warps) {
    const int64_t r = w * kRowsPerWarp + lane / kWidth;
    const bool live = r < rows;
    const float* __restrict__ row = x + r * len;
    float v[kPer];
    float top = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = sub + kWidth * i;
      v[i] = live && j < len ? __ldg(row + j) : -INFINITY;
      top = combine(Reduce::Max, top, v[i]);
    }
    top = lanes_all<kWidth>(Reduce::Max, top);
    // v becomes e^(x - max) (softmax) or x - max (log_softmax).
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (sub + kWidth * i >= len) continue;
      const float shifted = v[i] - top, e = expf(shifted);
      sum += e;
      v[i] = log ? shifted : e;
    }
    sum = lanes_all<kWidth>(Reduce::Sum, sum);
    if (!live) continue;
    const float inv = 1.0f / sum, log_sum = logf(sum);
    float* __restrict__ out = y + r * len;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = sub + kWidth * i;
      if (j < len) out[j] = log ? v[i] - log_sum : v[i] * inv;
    }
  }
}

template <bool kBlock>
__global__ void __launch_bounds__(kThreads)
    softmax_rows_kernel(int64_t rows, int64_t len, bool log, const float* __restrict__ x,
                        float* __restrict__ y) {
  pdl_begin();
  __shared__ float scratch[kWarps];
  for_rows<kBlock>(rows, [&](int64_t r, int lane, int lanes) {
    const float* row = x + r * len;
    float top = -INFINITY;
    for (int64_t j = lane; j < len; j += lanes) top = combine(Reduce::Max, top, __ldg(row + j));
    top = row_all<kBlock>(Reduce::Max, top, scratch);
    float sum = 0.0f;
    for (int64_t j = lane; j < len; j += lanes) sum += expf(__ldg(row + j) - top);
    sum = row_all<kBlock>(Reduce::Sum, sum, scratch);
    const float inv = 1.0f / sum, log_sum = logf(sum);
    for (int64_t j = lane; j < len; j += lanes)
      y[r * len + j] = softmax_out(log, __ldg(row + j) - top, inv, log_sum);
  });
}

__global__ void __launch_bounds__(kThreads)
    softmax_strided_kernel(int64_t outer, int64_t n, int64_t inner, bool log,
                           const float* __restrict__ x, float* __restrict__ y) {
  pdl_begin();
  for (int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x; c < outer * inner;
       c += int64_t(gridDim.x) * kThreads) {
    const int64_t base = c / inner * n * inner + c % inner;
    float top = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) top = combine(Reduce::Max, top, __ldg(x + base + j * inner));
    for (int64_t j = 0; j < n; ++j) sum += expf(__ldg(x + base + j * inner) - top);
    const float inv = 1.0f / sum, log_sum = logf(sum);
    for (int64_t j = 0; j < n; ++j)
      y[base + j * inner] = softmax_out(log, __ldg(x + base + j * inner) - top, inv, log_sum);
  }
}

// -- row normalization --

template <bool kBlock>
__global__ void __launch_bounds__(kThreads)
    row_norm_kernel(RowNorm s, const float* __restrict__ x, const float* __restrict__ scale,
                    const float* __restrict__ bias, float* __restrict__ y) {
  pdl_begin();
  __shared__ float scratch[kWarps];
  const int64_t per_group = s.groups ? s.len / s.inner : 0;  // channels a row covers
  for_rows<kBlock>(s.rows, [&](int64_t r, int lane, int lanes) {
    const float* row = x + r * s.len;
    float sum = 0.0f;
    for (int64_t j = lane; j < s.len; j += lanes) sum += __ldg(row + j);
    const float mean = row_all<kBlock>(Reduce::Sum, sum, scratch) / float(s.len);
    float var = 0.0f;
    for (int64_t j = lane; j < s.len; j += lanes) {
      const float d = __ldg(row + j) - mean;
      var += d * d;
    }
    const float rstd = rsqrtf(row_all<kBlock>(Reduce::Sum, var, scratch) / float(s.len) + s.eps);
    const int64_t c0 = s.groups ? r % s.groups * per_group : 0;
    for (int64_t j = lane; j < s.len; j += lanes) {
      const int64_t p = s.groups ? c0 + j / s.inner : j;
      const float b = bias ? __ldg(bias + p) : 0.0f;
      y[r * s.len + j] = (__ldg(row + j) - mean) * rstd * __ldg(scale + p) + b;
    }
  });
}

// layer_norm over dims with inner dims after them (ConvNeXt's LayerNorm over the channels of
// NCHW): x as [outer, len, inner], one column (o, i) normalized over its len elements. A block
// takes kCols neighbouring columns of one o and splits each column's len elements among
// kThreads / kCols threads, so even a 7x7 plane at batch 1 fills many threads; a warp reads
// kCols consecutive floats per element (coalesced), and partial sums meet in shared memory.
template <int kCols>
__global__ void __launch_bounds__(kThreads)
    row_norm_columns_kernel(RowNorm s, const float* __restrict__ x, const float* __restrict__ scale,
                            const float* __restrict__ bias, float* __restrict__ y) {
  constexpr int kParts = kThreads / kCols;
  pdl_begin();
  __shared__ float partial[kParts][kCols];
  __shared__ float column[kCols];
  const int col = threadIdx.x % kCols, part = threadIdx.x / kCols;
  const int64_t outer = s.rows / s.inner, tiles_per_outer = (s.inner + kCols - 1) / kCols;
  for (int64_t tile = blockIdx.x; tile < outer * tiles_per_outer; tile += gridDim.x) {
    const int64_t i = tile % tiles_per_outer * kCols + col;
    const bool live = i < s.inner;  // dead threads still join the block's barriers
    const int64_t base = tile / tiles_per_outer * s.len * s.inner + i;
    float sum = 0.0f;
    if (live)
      for (int64_t j = part; j < s.len; j += kParts) sum += __ldg(x + base + j * s.inner);
    const float mean = column_all<kCols>(Reduce::Sum, sum, partial, column) / float(s.len);
    float var = 0.0f;
    if (live)
      for (int64_t j = part; j < s.len; j += kParts) {
        const float d = __ldg(x + base + j * s.inner) - mean;
        var += d * d;
      }
    const float rstd =
        rsqrtf(column_all<kCols>(Reduce::Sum, var, partial, column) / float(s.len) + s.eps);
    if (live)
      for (int64_t j = part; j < s.len; j += kParts) {
        const float b = bias ? __ldg(bias + j) : 0.0f;
        y[base + j * s.inner] =
            (__ldg(x + base + j * s.inner) - mean) * rstd * __ldg(scale + j) + b;
      }
  }
}

// Cluster rows: row r = blockIdx.x / splits, block rank = blockIdx.x % splits (its rank in the
// cluster of `splits` consecutive blocks) owning elements [rank * chunk, min(len, + chunk)), chunk
// a multiple of 4 and <= kThreads * kClusterPer, len < 2^31. Thread t holds the kClusterPer / 4
// runs of 4 elements at rank * chunk + 4 * (t + kThreads * i), loaded as float4 when kVec4 (the
// row and chunk 16-byte aligned). Each block takes its mean and sum of squared deviations from it
// in two exact passes over registers; the cluster merges them in one round through distributed
// shared memory (Chan et al.'s pairwise update, every block in rank order: the same total in
// each): one cluster barrier for the statistics, not one a pass.
constexpr int kClusterPer = 16;
constexpr int kClusterMax = 8;  // blocks a cluster (the portable limit)
constexpr int64_t kClusterRowMax = int64_t(kClusterMax) * kThreads * kClusterPer;

template <bool kVec4>
__global__ void __launch_bounds__(kThreads)
    row_norm_cluster_kernel(RowNorm s, int splits, int chunk, const float* __restrict__ x,
                            const float* __restrict__ scale, const float* __restrict__ bias,
                            float* __restrict__ y) {
  pdl_begin();
  __shared__ float scratch[kWarps];
  __shared__ float part[2];  // this block's mean and sum of squared deviations
  const int64_t r = blockIdx.x / splits;
  const int rank = int(blockIdx.x % splits);
  const int len = int(s.len), lo = rank * chunk, hi = min(len, lo + chunk);
  const float* __restrict__ row = x + r * s.len;
  const auto at = [&](int i, int e) { return lo + 4 * (int(threadIdx.x) + kThreads * i) + e; };
  float v[kClusterPer];
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kClusterPer / 4; ++i) {
    if constexpr (kVec4) {
      const float4 q = at(i, 0) < hi ? __ldg(reinterpret_cast<const float4*>(row + at(i, 0)))
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      v[4 * i] = q.x, v[4 * i + 1] = q.y, v[4 * i + 2] = q.z, v[4 * i + 3] = q.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) v[4 * i + e] = at(i, e) < hi ? __ldg(row + at(i, e)) : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) sum += v[4 * i + e];
  }
  const float n_block = float(max(hi - lo, 0));
  const float block_mean = row_all<true>(Reduce::Sum, sum, scratch) / fmaxf(n_block, 1.0f);
  float m2 = 0.0f;
#pragma unroll
  for (int i = 0; i < kClusterPer / 4; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float d = at(i, e) < hi ? v[4 * i + e] - block_mean : 0.0f;
      m2 += d * d;
    }
  m2 = row_all<true>(Reduce::Sum, m2, scratch);
  float mean = block_mean;
#if __CUDA_ARCH__ >= 900  // clusters; the launcher splits rows on Hopper only
  namespace cg = cooperative_groups;
  if (splits > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) part[0] = block_mean, part[1] = m2;
    cluster.sync();
    // Merge the blocks' (count, mean, M2) in rank order: n = na + nb, mean += (mb - mean) nb / n,
    // M2 += M2b + (mb - mean_a)^2 na nb / n.
    float n = 0.0f;
    mean = 0.0f;
    m2 = 0.0f;
    for (int q = 0; q < splits; ++q) {
      const float* pq = cluster.map_shared_rank(part, q);
      const float nq = float(max(min(len, (q + 1) * chunk) - q * chunk, 0));
      if (nq == 0.0f) continue;
      const float total = n + nq, d = pq[0] - mean;
      mean += d * (nq / total);
      m2 += pq[1] + d * d * (n * nq / total);
      n = total;
    }
  }
#endif
  const float rstd = rsqrtf(m2 / float(len) + s.eps);
  // -- normalize: channel c0 + j / inner (group_norm, instance_norm) or j (layer_norm) --
  const int per_group = s.groups ? int(s.len / s.inner) : 0, inner = int(s.inner);
  const int c0 = s.groups ? int(r % s.groups) * per_group : 0;
  float* __restrict__ out = y + r * s.len;
#pragma unroll
  for (int i = 0; i < kClusterPer / 4; ++i) {
    if (at(i, 0) >= hi) continue;
    float o[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = at(i, e);
      const int p = s.groups ? c0 + j / inner : j;
      const float b = bias ? __ldg(bias + p) : 0.0f;
      o[e] = (v[4 * i + e] - mean) * rstd * __ldg(scale + p) + b;
    }
    if constexpr (kVec4) {
      *reinterpret_cast<float4*>(out + at(i, 0)) = make_float4(o[0], o[1], o[2], o[3]);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (at(i, e) < hi) out[at(i, e)] = o[e];
    }
  }
#if __CUDA_ARCH__ >= 900
  // No block may leave while the others still read its shared memory.
  if (splits > 1) cooperative_groups::this_cluster().sync();
#endif
}

// Launches kernel<false> (a warp a row) or kernel<true> (a block a row) over `rows` rows of `len`.
#define EPILOG_LAUNCH_ROWS(kernel, rows, len, stream, ...)                         \
  do {                                                                             \
    if ((len) <= kWarpRowMax)                                                      \
      kernel<false><<<grid_for(rows, kWarps), kThreads, 0, stream>>>(__VA_ARGS__); \
    else                                                                           \
      kernel<true><<<grid_for(rows, 1), kThreads, 0, stream>>>(__VA_ARGS__);       \
  } while (0)

// softmax_regs_kernel for rows of len <= kWarpRowMax: the first of <1, 1>, <1, 2>, ..., <1, 32>,
// <2, 32>, ..., <32, 32> (lanes a row doubling to a warp, then elements a lane) that holds len.
template <int kPer = 1, int kWidth = 1>
void launch_softmax_regs(int64_t rows, int len, bool log, const float* x, float* y, Stream stream) {
  static_assert(kPer * kWidth <= kWarpRowMax, "the widest register row");
  if constexpr (kPer * kWidth < kWarpRowMax) {
    constexpr bool kWarp = kWidth == 32;
    constexpr int kNextPer = kWarp ? 2 * kPer : kPer, kNextWidth = kWarp ? 32 : 2 * kWidth;
    if (len > kPer * kWidth)
      return launch_softmax_regs<kNextPer, kNextWidth>(rows, len, log, x, y, stream);
  }
  const int64_t warps = ceil_div(rows, 32 / kWidth);
  softmax_regs_kernel<kPer, kWidth>
      <<<grid_for(warps, kWarps), kThreads, 0, stream>>>(rows, len, log, x, y);
}

}  // namespace

namespace {
// Whether the float4 columns kernel applies (its comment).
bool columns4(const ReduceShape& s, int64_t inner, const float* x, const float* y) {
  if (s.reduced_rank != 1 || inner % 4 != 0 || s.reduced_stride[0] % 4 != 0) return false;
  for (int d = 0; d + 1 < s.kept_rank; ++d)
    if (s.kept_stride[d] % 4 != 0) return false;
  return aligned16(x) && aligned16(y);
}
}  // namespace

void reduce(Reduce op, const ReduceShape& shape, const float* x, float* y, Stream stream) {
  EPILOG_CUDA_REQUIRE(shape.kept_rank <= kMaxRank && shape.reduced_rank <= kMaxRank);
  // -- merge: drop size-1 dims, join neighbours x walks as one --
  ReduceShape s{};
  auto merge = [](int rank, const int64_t* size, const int64_t* stride, int& out_rank,
                  int64_t* out_size, int64_t* out_stride) {
    for (int d = 0; d < rank; ++d) {
      if (size[d] == 1) continue;
      if (out_rank > 0 && out_stride[out_rank - 1] == stride[d] * size[d]) {
        out_size[out_rank - 1] *= size[d];
        out_stride[out_rank - 1] = stride[d];
        continue;
      }
      out_size[out_rank] = size[d];
      out_stride[out_rank] = stride[d];
      ++out_rank;
    }
  };
  merge(shape.kept_rank, shape.kept, shape.kept_stride, s.kept_rank, s.kept, s.kept_stride);
  merge(shape.reduced_rank, shape.reduced, shape.reduced_stride, s.reduced_rank, s.reduced,
        s.reduced_stride);
  int64_t outputs = 1, count = 1;
  for (int d = 0; d < s.kept_rank; ++d) outputs *= s.kept[d];
  for (int d = 0; d < s.reduced_rank; ++d) count *= s.reduced[d];
  if (outputs == 0) return;
  // Rows: the reduced elements of an output are one contiguous run, and outputs follow runs.
  const bool rows = (s.reduced_rank == 0 || (s.reduced_rank == 1 && s.reduced_stride[0] == 1)) &&
                    (s.kept_rank == 0 || (s.kept_rank == 1 && s.kept_stride[0] == count));
  // Columns: the last kept dim is x's innermost and at least a column tile's 8 wide.
  const int64_t inner =
      s.kept_rank > 0 && s.kept_stride[s.kept_rank - 1] == 1 ? s.kept[s.kept_rank - 1] : 0;
  if (rows) {
    EPILOG_LAUNCH_ROWS(reduce_rows_kernel, outputs, count, stream, op, outputs, count, x, y);
  } else if (inner >= 8 && count >= kColumnMinCount && columns4(s, inner, x, y)) {
    const int64_t outer = outputs / inner;
    const int cols = column_tile([&](int64_t c) { return outer * ceil_div(inner, 4 * c); });
    EPILOG_LAUNCH_COLUMNS(reduce_columns4_kernel, cols, outer * ceil_div(inner, 4 * cols), stream,
                          op, s, outputs, count, x, y);
  } else if (inner >= 8 && count >= kColumnMinCount) {
    const int64_t outer = outputs / inner;
    const int cols = column_tile([&](int64_t c) { return outer * ceil_div(inner, c); });
    EPILOG_LAUNCH_COLUMNS(reduce_columns_kernel, cols, outer * ceil_div(inner, cols), stream, op, s,
                          outputs, count, x, y);
  } else {
    reduce_strided_kernel<<<grid_for(outputs, kThreads), kThreads, 0, stream>>>(op, s, outputs,
                                                                                count, x, y);
  }
  check_launch("reduce");
}

void softmax(int64_t outer, int64_t n, int64_t inner, const float* x, float* y, Stream stream,
             bool log) {
  const int64_t rows = outer * inner;
  if (rows == 0 || n == 0) return;
  if (inner == 1 && n <= kWarpRowMax)
    launch_softmax_regs(rows, int(n), log, x, y, stream);
  else if (inner == 1)
    softmax_rows_kernel<true><<<grid_for(rows, 1), kThreads, 0, stream>>>(rows, n, log, x, y);
  else
    softmax_strided_kernel<<<grid_for(rows, kThreads), kThreads, 0, stream>>>(outer, n, inner, log,
                                                                              x, y);
  check_launch(log ? "log_softmax" : "softmax");
}

void row_norm(const RowNorm& s, const float* x, const float* scale, const float* bias, float* y,
              Stream stream) {
  if (s.rows == 0 || s.len == 0) return;
  EPILOG_CUDA_REQUIRE(s.inner > 0 && (s.groups == 0 || s.len % s.inner == 0));
  if (s.groups == 0 && s.inner > 1) {
    const int64_t outer = s.rows / s.inner;
    const int cols = column_tile([&](int64_t c) { return outer * ceil_div(s.inner, c); });
    EPILOG_LAUNCH_COLUMNS(row_norm_columns_kernel, cols, outer * ceil_div(s.inner, cols), stream, s,
                          x, scale, bias, y);
  } else if (s.len > kWarpRowMax &&
             s.len <= (device_sm90() ? kClusterRowMax : int64_t(kThreads) * kClusterPer)) {
    // Blocks a row: as few as hold it in registers, more (up to a cluster's 8) while the grid
    // gives an SM fewer than two blocks.
    constexpr int64_t kHeld = int64_t(kThreads) * kClusterPer;
    const int64_t least = ceil_div(s.len, kHeld), enough = ceil_div(max_blocks() / 4, s.rows);
    const int splits = device_sm90() ? int(std::clamp<int64_t>(enough, least, kClusterMax)) : 1;
    const int chunk = int(ceil_div(ceil_div(s.len, splits), 4) * 4);
    EPILOG_CUDA_REQUIRE(s.rows * splits < (int64_t(1) << 31) && chunk <= kHeld);
    // float4 where every row starts 16-byte aligned (the buffers are).
    const bool vec4 = s.len % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(y) % 16 == 0;
    launch_pdl(vec4 ? row_norm_cluster_kernel<true> : row_norm_cluster_kernel<false>,
               dim3(unsigned(s.rows * splits)), dim3(kThreads), 0, stream, unsigned(splits), s,
               splits, chunk, x, scale, bias, y);
  } else {
    EPILOG_LAUNCH_ROWS(row_norm_kernel, s.rows, s.len, stream, s, x, scale, bias, y);
  }
  check_launch("row_norm");
}

}  // namespace epilog::cuda
