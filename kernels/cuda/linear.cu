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

}  // namespace

void linear(int64_t m, int64_t n, int64_t k, const float* x, const float* w, const float* b,
            float* y, Stream stream) {
  if (m == 0 || n == 0) return;
  const int64_t tiles_m = (m + kBM - 1) / kBM, tiles_n = (n + kBN - 1) / kBN;
  EPILOG_CUDA_REQUIRE(tiles_n <= 65535 && tiles_m < (int64_t(1) << 31) && k >= 0);
  // K == 0 runs too: the loop is empty and y becomes the bias (or zeros).
  linear_kernel<<<dim3(unsigned(tiles_m), unsigned(tiles_n)), kThreads, 0, stream>>>(m, n, k, x, w,
                                                                                     b, y);
  check_launch("linear");
}

}  // namespace epilog::cuda
