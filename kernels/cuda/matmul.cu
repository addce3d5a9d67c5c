// The matmul CUDA kernel: a batched shared-memory tiled fp32 SGEMM, as linear.cu's but with b
// stored [k, n] (NumPy/ONNX MatMul) and a batch of matrices.
//
// Math: y[b, m, n] = sum_k a[b, m, k] * b[b, k, n], summed in fp32 with k ascending (no tensor
//   cores: the exact fp32 path).
// Layout: row-major contiguous matrices; a's and b's matrices of batch index (i_0, ...) start at
//   sum_d i_d * a_stride[d] (b_stride[d]), 0 where that operand broadcasts; y contiguous.
//   The host folds a batch that b does not have into m when a is contiguous over it.
// Grid: blockIdx.x = tile of kBM rows, blockIdx.y = tile of kBN columns, blockIdx.z walks the
//   batch (grid-stride); 256 threads as 16 x 16, each owning 4 x 4 outputs at rows ty + 16 i and
//   columns tx + 16 j. Each step stages a's kBM x kBK tile (read along k, stored transposed) and
//   b's kBK x kBN tile (read along n), zero-filled past m, n and k.
// Restrictions: n <= 65535 * kBN (grid.y); batch dims up to kMaxRank.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "epilog/kernels/cuda.h"
#include "launch.cuh"

namespace epilog::cuda {
namespace {

constexpr int kBM = 64, kBN = 64, kBK = 16;
constexpr int kT = 16;
constexpr int kThreads = kT * kT;
constexpr int kRM = kBM / kT, kRN = kBN / kT;
constexpr int kPad = 2;
using namespace detail;

__global__ void __launch_bounds__(kThreads)
    matmul_kernel(MatmulShape s, int64_t batches, const float* __restrict__ a,
                  const float* __restrict__ b, float* __restrict__ y) {
  pdl_begin();
  __shared__ float as[kBK][kBM + kPad];
  __shared__ float bs[kBK][kBN + kPad];
  const int tx = threadIdx.x % kT, ty = threadIdx.x / kT;
  const int64_t m0 = int64_t(blockIdx.x) * kBM, n0 = int64_t(blockIdx.y) * kBN;
  for (int64_t bi = blockIdx.z; bi < batches; bi += gridDim.z) {
    int64_t oa = 0, ob = 0, rest = bi;
    for (int d = s.batch_rank - 1; d >= 0; --d) {
      const int64_t idx = rest % s.batch[d];
      rest /= s.batch[d];
      oa += idx * s.a_stride[d];
      ob += idx * s.b_stride[d];
    }
    const float* ap = a + oa;
    const float* bp = b + ob;
    float acc[kRM][kRN] = {};
    for (int64_t k0 = 0; k0 < s.k; k0 += kBK) {
      // -- stage a[m0 .. +kBM, k0 .. +kBK] transposed and b[k0 .. +kBK, n0 .. +kBN] --
      for (int e = threadIdx.x; e < kBM * kBK; e += kThreads) {
        const int r = e / kBK, c = e % kBK;
        const int64_t gm = m0 + r, gk = k0 + c;
        as[c][r] = gm < s.m && gk < s.k ? __ldg(ap + gm * s.k + gk) : 0.0f;
      }
      for (int e = threadIdx.x; e < kBK * kBN; e += kThreads) {
        const int r = e / kBN, c = e % kBN;
        const int64_t gk = k0 + r, gn = n0 + c;
        bs[r][c] = gk < s.k && gn < s.n ? __ldg(bp + gk * s.n + gn) : 0.0f;
      }
      __syncthreads();
      // -- mainloop: rank-1 updates of the 4 x 4 register tile --
#pragma unroll
      for (int kk = 0; kk < kBK; ++kk) {
        float av[kRM], bv[kRN];
#pragma unroll
        for (int i = 0; i < kRM; ++i) av[i] = as[kk][ty + kT * i];
#pragma unroll
        for (int j = 0; j < kRN; ++j) bv[j] = bs[kk][tx + kT * j];
#pragma unroll
        for (int i = 0; i < kRM; ++i)
#pragma unroll
          for (int j = 0; j < kRN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
      __syncthreads();
    }
    // -- store --
    float* yp = y + bi * s.m * s.n;
#pragma unroll
    for (int i = 0; i < kRM; ++i) {
      const int64_t gm = m0 + ty + kT * i;
      if (gm >= s.m) continue;
#pragma unroll
      for (int j = 0; j < kRN; ++j) {
        const int64_t gn = n0 + tx + kT * j;
        if (gn < s.n) yp[gm * s.n + gn] = acc[i][j];
      }
    }
  }
}

}  // namespace

void matmul(const MatmulShape& shape, const float* a, const float* b, float* y, Stream stream) {
  EPILOG_CUDA_REQUIRE(shape.batch_rank >= 0 && shape.batch_rank <= kMaxRank);
  MatmulShape s = shape;
  int64_t batches = 1;
  for (int d = 0; d < s.batch_rank; ++d) batches *= s.batch[d];
  if (batches == 0 || s.m == 0 || s.n == 0) return;
  // b shared by every batch and a contiguous over it: one matrix of batches * m rows.
  bool folds = true;
  int64_t expect = s.m * s.k;
  for (int d = s.batch_rank - 1; d >= 0; --d) {
    folds = folds && s.b_stride[d] == 0 && (s.batch[d] == 1 || s.a_stride[d] == expect);
    expect *= s.batch[d];
  }
  if (folds) {
    s.m *= batches;
    s.batch_rank = 0;
    batches = 1;
  }
  EPILOG_CUDA_REQUIRE(ceil_div(s.n, kBN) <= 65535);
  const dim3 grid(unsigned(ceil_div(s.m, kBM)), unsigned(ceil_div(s.n, kBN)),
                  unsigned(std::min<int64_t>(batches, 65535)));
  matmul_kernel<<<grid, kThreads, 0, stream>>>(s, batches, a, b, y);
  check_launch("matmul");
}

}  // namespace epilog::cuda
