// The matmul CUDA kernels: batched GEMMs with b stored [k, n] (NumPy/ONNX MatMul), on TF32
// tensor cores, or as a shared-memory tiled fp32 SGEMM for products under an mma's depth or width.
//
// Math: y[b, m, n] = sum_k a[b, m, k] * b[b, k, n].
//   tf32 (matmul_tf32_kernel): a and b rounded to TF32 (10 mantissa bits, to nearest) as they
//     leave shared memory, products summed in fp32 by mma.sync m16n8k8 (within ~1e-3 of the
//     magnitude sum |a| |b|, as the convs' gemm kernels).
//   simt (matmul_simt_kernel): fp32 FMAs with k ascending, as the CPU reference sums.
//   Which one runs: matmul_runs_tf32 (launch.h), on n and k; both log it for explain.
// Layout: row-major contiguous matrices; a's and b's matrices of batch index (i_0, ...) start at
//   sum_d i_d * a_stride[d] (b_stride[d]), 0 where that operand broadcasts; y contiguous.
//   The host folds a batch that b does not have into m when a is contiguous over it.
// Grid (both): blockIdx.x = tile of rows, blockIdx.y = tile of columns, blockIdx.z walks the
//   batch (grid-stride).
//   tf32: 64 x 64 tiles, 128 threads as 2 x 2 warps of 32 x 32 outputs (2 x 4 m16n8 tiles each).
//     k tiles of 32 go through two shared-memory buffers by cp.async (the next one loads while
//     the tensor cores work on this one): 16-byte copies where k (for a) or n (for b) is a
//     multiple of 4 and the pointer 16-byte aligned, else 4-byte ones; every copy past m, n or k
//     zero-fills, so the mainloop has no edge cases. a's rows are padded to 36 floats and b's to
//     72, which makes each fragment load hit 32 banks. The epilogue stores only rows < m and
//     columns < n (pairs as one 8-byte store where n is even and y 8-byte aligned).
//   simt: 64 x 64 tiles, 256 threads as 16 x 16, each owning 4 x 4 outputs at rows ty + 16 i and
//     columns tx + 16 j. Each step stages a's 64 x 16 tile (read along k, stored transposed) and
//     b's 16 x 64 tile (read along n), zero-filled past m, n and k.
// Restrictions: n <= 65535 * 64 (grid.y); batch dims up to kMaxRank.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "conv_gemm_ptx.cuh"
#include "epilog/kernels/cuda.h"
#include "epilog/kernels/launch.h"
#include "epilog/runtime/launch_log.h"
#include "launch.cuh"

namespace epilog::cuda {
namespace {

using namespace detail;

// a's and b's matrices of batch index bi: their element offsets.
__device__ __forceinline__ void batch_offsets(const MatmulShape& s, int64_t bi, int64_t& oa,
                                              int64_t& ob) {
  oa = 0, ob = 0;
  int64_t rest = bi;
  for (int d = s.batch_rank - 1; d >= 0; --d) {
    const int64_t idx = rest % s.batch[d];
    rest /= s.batch[d];
    oa += idx * s.a_stride[d];
    ob += idx * s.b_stride[d];
  }
}

// -- tf32: mma.sync m16n8k8 over cp.async double-buffered k tiles --

namespace tc {
constexpr int kBM = kMatmulTf32M, kBN = kMatmulTf32N, kBK = kMatmulTf32K;
constexpr int kWarpsM = 2, kWarpsN = 2, kThreads = 32 * kWarpsM * kWarpsN;
constexpr int kWM = kBM / kWarpsM, kWN = kBN / kWarpsN;  // a warp's 32 x 32 outputs
constexpr int kMI = kWM / 16, kNI = kWN / 8;             // its m16n8 tiles
constexpr int kLdA = kBK + 4;  // a fragment's 8 rows x 4 k: banks 4 g + t, all 32
constexpr int kLdB = kBN + 8;  // b fragment's 4 k x 8 columns: banks 8 t + g, all 32
struct Smem {
  float a[2][kBM][kLdA];
  float b[2][kBK][kLdB];
};
static_assert(sizeof(Smem) <= 48 * 1024, "static shared memory");
static_assert(kMI * 16 * kWarpsM == kBM && kNI * 8 * kWarpsN == kBN && kBK % 8 == 0, "tiles");
static_assert(kBM * kBK % (4 * kThreads) == 0 && kBK * kBN % (4 * kThreads) == 0 &&
                  kThreads % kBK == 0 && kThreads % kBN == 0,
              "a block's copies cover whole rows of both tiles");
}  // namespace tc

template <bool kVecA, bool kVecB>
__global__ void __launch_bounds__(tc::kThreads)
    matmul_tf32_kernel(MatmulShape s, int64_t batches, const float* __restrict__ a,
                       const float* __restrict__ b, float* __restrict__ y) {
  using namespace tc;
  using namespace conv_gemm_detail;
  pdl_begin();
  __shared__ __align__(16) Smem sm;
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int wm = warp / kWarpsN * kWM, wn = warp % kWarpsN * kWN;
  const int64_t m0 = int64_t(blockIdx.x) * kBM, n0 = int64_t(blockIdx.y) * kBN;
  const int64_t ktiles = ceil_div(s.k, kBK);
  constexpr int kVA = kVecA ? 4 : 1, kVB = kVecB ? 4 : 1;
  constexpr int kStepA = kThreads * kVA / kBK, kStepB = kThreads * kVB / kBN;  // rows an i
  const int ra = tid * kVA / kBK, ca = tid * kVA % kBK;
  const int rb = tid * kVB / kBN, cb = tid * kVB % kBN;
  const bool pairs = s.n % 2 == 0 && (reinterpret_cast<uintptr_t>(y) & 7) == 0;
  for (int64_t bi = blockIdx.z; bi < batches; bi += gridDim.z) {
    int64_t oa, ob;
    batch_offsets(s, bi, oa, ob);
    const float* ap = a + oa;
    const float* bp = b + ob;
    // -- stage k tile kt into buffer st: a[m0 .. +kBM, k0 .. +kBK], b[k0 .. +kBK, n0 .. +kBN] --
    // Runs of kVA (kVB) floats, 16-byte copies where k (n) % 4 == 0, so that a run is all in or
    // all out. Thread tid copies a's run (ra + kStepA i, ca) and b's (rb + kStepB i, cb). Masked
    // copies read nothing and zero-fill; they still name an in-bounds address (ap, bp).
    const float* pa = ap + (m0 + ra) * s.k + ca;
    const float* pb = bp + int64_t(rb) * s.n + n0 + cb;
    const int64_t rows_a = s.m - m0 - ra;  // a's rows this thread may copy, past ra
    const bool col_b = n0 + cb < s.n;
    const auto stage = [&](int64_t kt, int st) {
      const int64_t k0 = kt * kBK;
      const bool col_a = k0 + ca < s.k;
#pragma unroll
      for (int i = 0; i < kBM / kStepA; ++i) {
        const bool ok = col_a && i * kStepA < rows_a;
        const float* src = ok ? pa + i * kStepA * s.k + k0 : ap;
        const uint32_t dst = smem_addr(&sm.a[st][ra + i * kStepA][ca]);
        if constexpr (kVecA)
          cp_async16(dst, src, ok);
        else
          cp_async4(dst, src, ok);
      }
#pragma unroll
      for (int i = 0; i < kBK / kStepB; ++i) {
        const bool ok = col_b && k0 + rb + i * kStepB < s.k;
        const float* src = ok ? pb + (k0 + i * kStepB) * s.n : bp;
        const uint32_t dst = smem_addr(&sm.b[st][rb + i * kStepB][cb]);
        if constexpr (kVecB)
          cp_async16(dst, src, ok);
        else
          cp_async4(dst, src, ok);
      }
    };
    float acc[kMI][kNI][4] = {};
    if (ktiles > 0) stage(0, 0);
    cp_async_commit();
    // -- mainloop: one group committed per k tile (empty past the last), the oldest awaited --
    for (int64_t kt = 0; kt < ktiles; ++kt) {
      const int st = int(kt & 1);
      if (kt + 1 < ktiles) stage(kt + 1, st ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 8) {
        uint32_t af[kMI][4], bf[kNI][2];
#pragma unroll
        for (int mi = 0; mi < kMI; ++mi) {
          const float* p = &sm.a[st][wm + 16 * mi + g][kk + t];
          af[mi][0] = to_tf32(p[0]);
          af[mi][1] = to_tf32(p[8 * kLdA]);
          af[mi][2] = to_tf32(p[4]);
          af[mi][3] = to_tf32(p[8 * kLdA + 4]);
        }
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni) {
          const float* q = &sm.b[st][kk + t][wn + 8 * ni + g];
          bf[ni][0] = to_tf32(q[0]);
          bf[ni][1] = to_tf32(q[4 * kLdB]);
        }
#pragma unroll
        for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
          for (int ni = 0; ni < kNI; ++ni) mma_tf32(acc[mi][ni], af[mi], bf[ni]);
      }
      __syncthreads();  // the buffer is staged again two tiles on
    }
    // -- store: d0, d1 at (row g, columns 2t, 2t + 1), d2, d3 eight rows down --
    float* yp = y + bi * s.m * s.n;
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = m0 + wm + 16 * mi + g + 8 * h;
        if (r >= s.m) continue;
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni) {
          const int64_t c = n0 + wn + 8 * ni + 2 * t;
          const float* d = &acc[mi][ni][2 * h];
          float* out = yp + r * s.n + c;
          if (pairs && c + 1 < s.n) {
            *reinterpret_cast<float2*>(out) = make_float2(d[0], d[1]);
          } else {
            if (c < s.n) out[0] = d[0];
            if (c + 1 < s.n) out[1] = d[1];
          }
        }
      }
  }
}

// -- simt: fp32 rank-1 updates of 4 x 4 register tiles --

namespace simt {
constexpr int kBM = kMatmulSimtM, kBN = kMatmulSimtN, kBK = kMatmulSimtK;
constexpr int kT = 16;
constexpr int kThreads = kT * kT;
constexpr int kRM = kBM / kT, kRN = kBN / kT;
constexpr int kPad = 2;
}  // namespace simt

__global__ void __launch_bounds__(simt::kThreads)
    matmul_simt_kernel(MatmulShape s, int64_t batches, const float* __restrict__ a,
                       const float* __restrict__ b, float* __restrict__ y) {
  using namespace simt;
  pdl_begin();
  __shared__ float as[kBK][kBM + kPad];
  __shared__ float bs[kBK][kBN + kPad];
  const int tx = threadIdx.x % kT, ty = threadIdx.x / kT;
  const int64_t m0 = int64_t(blockIdx.x) * kBM, n0 = int64_t(blockIdx.y) * kBN;
  for (int64_t bi = blockIdx.z; bi < batches; bi += gridDim.z) {
    int64_t oa, ob;
    batch_offsets(s, bi, oa, ob);
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
  const bool tf32 = matmul_runs_tf32(s.n, s.k);
  const int bm = tf32 ? kMatmulTf32M : kMatmulSimtM, bn = tf32 ? kMatmulTf32N : kMatmulSimtN;
  EPILOG_CUDA_REQUIRE(ceil_div(s.n, bn) <= 65535 && ceil_div(s.m, bm) < (int64_t(1) << 31));
  const dim3 grid(unsigned(ceil_div(s.m, bm)), unsigned(ceil_div(s.n, bn)),
                  unsigned(std::min<int64_t>(batches, 65535)));
  if (tf32) {
    // Every matrix of a starts 16-byte aligned where a does and m * k (the batch strides'
    // unit) is a multiple of 4, which k % 4 == 0 makes it; likewise b with n.
    const bool vec_a = s.k % 4 == 0 && aligned16(a), vec_b = s.n % 4 == 0 && aligned16(b);
    const auto kernel =
        vec_a ? (vec_b ? matmul_tf32_kernel<true, true> : matmul_tf32_kernel<true, false>)
              : (vec_b ? matmul_tf32_kernel<false, true> : matmul_tf32_kernel<false, false>);
    kernel<<<grid, tc::kThreads, 0, stream>>>(s, batches, a, b, y);
  } else {
    matmul_simt_kernel<<<grid, simt::kThreads, 0, stream>>>(s, batches, a, b, y);
  }
  check_launch("matmul");
  log_launch("matmul", [&] { return matmul_launch_str(s.n, s.k); });
}

}  // namespace epilog::cuda
