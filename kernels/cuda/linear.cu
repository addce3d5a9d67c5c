// The linear CUDA kernel: a shared-memory tiled fp32 SGEMM with the bias in its epilogue.
//
// Math: y[m, n] = sum_k x[m, k] * w[n, k] + b[n] (b may be null), summed in fp32 with k
//   ascending, as the CPU reference does (no tensor cores: this is the exact fp32 path).
// Layout: x [M, K], w [N, K] (PyTorch's weight layout, so both operands run along k), y [M, N],
//   all row-major, contiguous float32 device pointers; y must not overlap x, w or b.
// Grid: blockIdx.x = tile of kBM rows of y (so M is limited only by 2^31 tiles), blockIdx.y =
//   tile of kBN columns; 256 threads as 16 x 16, thread (ty, tx) owning the 4 x 4 outputs at
//   rows ty + 16 i and columns tx + 16 j of the tile, so a warp's stores hit 16 consecutive
//   columns of two rows. Each step stages a kBK-wide slice of k: x's kBM x kBK and w's kBN x kBK
//   tiles are read along k (runs of kBK floats, coalesced), stored transposed in shared memory
//   ([k][row], padded a column against bank conflicts) and zero-filled past M, N and K, so the
//   inner loop has no edge cases; each thread then does 4 x 4 FMAs per k from 8 shared loads.
// Restrictions: N <= 65535 * kBN (grid.y), M * K, N * K and M * N below 2^63.
//
// At M <= kGemvRows (a batch of a few images through a classifier) the product is a stream of the
// weights: each is used M times only, so the tiles above would leave most SMs idle waiting on
// 64 columns each. linear_gemv_kernel instead gives each warp one row of w (one output column),
// read once, 16 bytes a lane where k and the pointers allow, against all M rows of x (small,
// from L1/L2); the warp sums its lanes with shuffles. Many warps in flight keep the weight
// stream near memory bandwidth; the sums run over k in another order than the CPU's (lanes
// strided, then a tree), within float32 rounding of it.
#include <cuda_runtime.h>

#include <cstdint>

#include "epilog/kernels/cuda.h"
#include "launch.cuh"

namespace epilog::cuda {
namespace {

constexpr int kBM = 64, kBN = 64, kBK = 16;
constexpr int kT = 16;                         // threads per tile side
constexpr int kThreads = kT * kT;              // 256
constexpr int kRM = kBM / kT, kRN = kBN / kT;  // 4 x 4 outputs per thread
constexpr int kPad = 2;  // row stride 66: a warp's transposed stores (16 k x 2 rows) hit 32 banks

__global__ void __launch_bounds__(kThreads)
    linear_kernel(int64_t m, int64_t n, int64_t k, const float* __restrict__ x,
                  const float* __restrict__ w, const float* __restrict__ b, float* __restrict__ y) {
  __shared__ float xs[kBK][kBM + kPad];
  __shared__ float ws[kBK][kBN + kPad];
  const int tx = threadIdx.x % kT, ty = threadIdx.x / kT;
  const int64_t m0 = int64_t(blockIdx.x) * kBM, n0 = int64_t(blockIdx.y) * kBN;

  float acc[kRM][kRN] = {};
  for (int64_t k0 = 0; k0 < k; k0 += kBK) {
    // -- stage x[m0 .. +kBM, k0 .. +kBK] and w[n0 .. +kBN, k0 .. +kBK], transposed --
#pragma unroll
    for (int e = threadIdx.x; e < kBM * kBK; e += kThreads) {
      const int r = e / kBK, c = e % kBK;
      const int64_t gm = m0 + r, gk = k0 + c;
      xs[c][r] = gm < m && gk < k ? __ldg(x + gm * k + gk) : 0.0f;
    }
#pragma unroll
    for (int e = threadIdx.x; e < kBN * kBK; e += kThreads) {
      const int r = e / kBK, c = e % kBK;
      const int64_t gn = n0 + r, gk = k0 + c;
      ws[c][r] = gn < n && gk < k ? __ldg(w + gn * k + gk) : 0.0f;
    }
    __syncthreads();
    // -- mainloop: rank-1 updates of the 4 x 4 register tile --
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float a[kRM], bv[kRN];
#pragma unroll
      for (int i = 0; i < kRM; ++i) a[i] = xs[kk][ty + kT * i];
#pragma unroll
      for (int j = 0; j < kRN; ++j) bv[j] = ws[kk][tx + kT * j];
#pragma unroll
      for (int i = 0; i < kRM; ++i)
#pragma unroll
        for (int j = 0; j < kRN; ++j) acc[i][j] = fmaf(a[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
  // -- bias epilogue --
#pragma unroll
  for (int j = 0; j < kRN; ++j) {
    const int64_t gn = n0 + tx + kT * j;
    if (gn >= n) continue;
    const float bias = b ? __ldg(b + gn) : 0.0f;
#pragma unroll
    for (int i = 0; i < kRM; ++i) {
      const int64_t gm = m0 + ty + kT * i;
      if (gm < m) y[gm * n + gn] = acc[i][j] + bias;
    }
  }
}

constexpr int kGemvRows = 8;     // M up to this takes the GEMV path
constexpr int kGemvWarps = 8;    // warps (output columns) per block

template <bool Vec>
__global__ void __launch_bounds__(32 * kGemvWarps)
    linear_gemv_kernel(int m, int64_t n, int64_t k, const float* __restrict__ x,
                       const float* __restrict__ w, const float* __restrict__ b,
                       float* __restrict__ y) {
  const int lane = threadIdx.x % 32;
  const int64_t col = int64_t(blockIdx.x) * kGemvWarps + threadIdx.x / 32;
  if (col >= n) return;
  const float* __restrict__ wr = w + col * k;
  float acc[kGemvRows] = {};
  if (Vec) {
    // k % 4 == 0 and x, w 16-byte aligned: every row starts aligned.
    const int64_t k4 = k / 4;
    const float4* __restrict__ w4 = reinterpret_cast<const float4*>(wr);
    for (int64_t i = lane; i < k4; i += 32) {
      const float4 wv = __ldg(w4 + i);
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) {
        if (r >= m) break;
        const float4 xv = __ldg(reinterpret_cast<const float4*>(x + r * k) + i);
        acc[r] = fmaf(xv.x, wv.x, fmaf(xv.y, wv.y, fmaf(xv.z, wv.z, fmaf(xv.w, wv.w, acc[r]))));
      }
    }
  } else {
    for (int64_t i = lane; i < k; i += 32) {
      const float wv = __ldg(wr + i);
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) {
        if (r >= m) break;
        acc[r] = fmaf(__ldg(x + r * k + i), wv, acc[r]);
      }
    }
  }
  const float bias = b ? __ldg(b + col) : 0.0f;
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
    if (r >= m) break;
    float v = acc[r];
#pragma unroll
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) y[r * n + col] = v + bias;
  }
}

}  // namespace

void linear(int64_t m, int64_t n, int64_t k, const float* x, const float* w, const float* b,
            float* y, Stream stream) {
  if (m == 0 || n == 0) return;
  if (m <= kGemvRows) {
    const int64_t blocks = (n + kGemvWarps - 1) / kGemvWarps;
    EPILOG_CUDA_REQUIRE(blocks < (int64_t(1) << 31) && k >= 0);
    const bool vec = k % 4 == 0 && detail::aligned16(x) && detail::aligned16(w);
    const auto kernel = vec ? linear_gemv_kernel<true> : linear_gemv_kernel<false>;
    kernel<<<unsigned(blocks), 32 * kGemvWarps, 0, stream>>>(int(m), n, k, x, w, b, y);
    check_launch("linear (gemv)");
    return;
  }
  const int64_t tiles_m = (m + kBM - 1) / kBM, tiles_n = (n + kBN - 1) / kBN;
  EPILOG_CUDA_REQUIRE(tiles_n <= 65535 && tiles_m < (int64_t(1) << 31) && k >= 0);
  // K == 0 runs too: the loop is empty and y becomes the bias (or zeros).
  linear_kernel<<<dim3(unsigned(tiles_m), unsigned(tiles_n)), kThreads, 0, stream>>>(m, n, k, x, w,
                                                                                     b, y);
  check_launch("linear");
}

}  // namespace epilog::cuda
