// Reduction and normalization CUDA kernels: reduce_{mean,sum,max,min,prod}, softmax and
// log_softmax, and the row normalization behind layer_norm, group_norm and instance_norm.
//
// Rows: a row (the reduced elements of one output, contiguous) takes one warp when it has at most
//   kWarpRowMax floats (8 rows a block of 256), else a whole block; lanes stride through it
//   (coalesced), then a shuffle reduction, and one through shared memory across a block's warps.
//   Grid-stride over rows, at most one full wave. Used for reductions over the innermost dims
//   (a last axis, H x W per (n, c)), softmax over the last axis, and every normalization.
// Strided (reduce and softmax when the reduced dims are not innermost): one output (reduce) or
//   one (outer, inner) column (softmax) per thread, looping over the reduced elements; consecutive
//   threads read consecutive elements of the kept inner dims, so the reads stay coalesced.
// Columns (layer_norm over dims that have inner dims after them): a block takes 8 to 32
//   neighbouring columns and splits each column's elements among its threads.
// Math: float32 sums and products (the CPU reference works in double; the tests bound the
//   difference). Max and min propagate NaN. softmax: y = e^(x - max) / sum e^(x - max), three
//   passes over the row; log_softmax the same passes, y = x - max - log(sum e^(x - max)).
//   Normalization: mean, then the biased variance of x - mean (two passes), then
//   (x - mean) * rsqrt(var + eps) * scale + bias (a third).
// Layout: float32, contiguous, device pointers; x and y must not overlap. 64-bit indices.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "epilog/kernels/cuda.h"
#include "launch.cuh"

namespace epilog::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kWarpRowMax = 1024;
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

// -- softmax --

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
  // The sum over a column of each thread's v; every thread of the column gets it.
  auto column_sum = [&](float v) {
    partial[part][col] = v;
    __syncthreads();
    if (part == 0) {
      float t = 0.0f;
#pragma unroll 8
      for (int p = 0; p < kParts; ++p) t += partial[p][col];
      column[col] = t;
    }
    __syncthreads();
    const float t = column[col];
    __syncthreads();  // partial and column are rewritten by the next sum
    return t;
  };
  for (int64_t tile = blockIdx.x; tile < outer * tiles_per_outer; tile += gridDim.x) {
    const int64_t i = tile % tiles_per_outer * kCols + col;
    const bool live = i < s.inner;  // dead threads still join the block's barriers
    const int64_t base = tile / tiles_per_outer * s.len * s.inner + i;
    float sum = 0.0f;
    if (live)
      for (int64_t j = part; j < s.len; j += kParts) sum += __ldg(x + base + j * s.inner);
    const float mean = column_sum(sum) / float(s.len);
    float var = 0.0f;
    if (live)
      for (int64_t j = part; j < s.len; j += kParts) {
        const float d = __ldg(x + base + j * s.inner) - mean;
        var += d * d;
      }
    const float rstd = rsqrtf(column_sum(var) / float(s.len) + s.eps);
    if (live)
      for (int64_t j = part; j < s.len; j += kParts) {
        const float b = bias ? __ldg(bias + j) : 0.0f;
        y[base + j * s.inner] =
            (__ldg(x + base + j * s.inner) - mean) * rstd * __ldg(scale + j) + b;
      }
  }
}

// Launches kernel<false> (a warp a row) or kernel<true> (a block a row) over `rows` rows of `len`.
#define EPILOG_LAUNCH_ROWS(kernel, rows, len, stream, ...)                         \
  do {                                                                             \
    if ((len) <= kWarpRowMax)                                                      \
      kernel<false><<<grid_for(rows, kWarps), kThreads, 0, stream>>>(__VA_ARGS__); \
    else                                                                           \
      kernel<true><<<grid_for(rows, 1), kThreads, 0, stream>>>(__VA_ARGS__);       \
  } while (0)

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
  if (rows)
    EPILOG_LAUNCH_ROWS(reduce_rows_kernel, outputs, count, stream, op, outputs, count, x, y);
  else
    reduce_strided_kernel<<<grid_for(outputs, kThreads), kThreads, 0, stream>>>(op, s, outputs,
                                                                                count, x, y);
  check_launch("reduce");
}

void softmax(int64_t outer, int64_t n, int64_t inner, const float* x, float* y, Stream stream,
             bool log) {
  const int64_t rows = outer * inner;
  if (rows == 0 || n == 0) return;
  if (inner == 1)
    EPILOG_LAUNCH_ROWS(softmax_rows_kernel, rows, n, stream, rows, n, log, x, y);
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
    // The widest column tile that still gives every SM two blocks; 8 columns at least (32-byte
    // reads).
    const int64_t outer = s.rows / s.inner, enough = max_blocks() / 4;
    auto tiles = [&](int64_t cols) { return outer * ceil_div(s.inner, cols); };
    if (tiles(32) >= enough)
      row_norm_columns_kernel<32>
          <<<grid_for(tiles(32), 1), kThreads, 0, stream>>>(s, x, scale, bias, y);
    else if (tiles(16) >= enough)
      row_norm_columns_kernel<16>
          <<<grid_for(tiles(16), 1), kThreads, 0, stream>>>(s, x, scale, bias, y);
    else
      row_norm_columns_kernel<8>
          <<<grid_for(tiles(8), 1), kThreads, 0, stream>>>(s, x, scale, bias, y);
  } else
    EPILOG_LAUNCH_ROWS(row_norm_kernel, s.rows, s.len, stream, s, x, scale, bias, y);
  check_launch("row_norm");
}

}  // namespace epilog::cuda
