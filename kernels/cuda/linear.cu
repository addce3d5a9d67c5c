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
// weights (linear_gemv_kernel; also conv_gemv, the `gemv` conv kernel: a linear layer that the
// fusion pass turned into a 1x1 conv, with the convs' scale, shift, activation and residual): each is used M times only, so the tiles above would leave most SMs idle waiting on
// 64 columns each. linear_gemv_kernel instead gives each warp one row of w (one output column),
// read once, 16 bytes a lane where k and the pointers allow, against all M rows of x (small,
// from L1/L2); the warp sums its lanes with shuffles. Many warps in flight keep the weight
// stream near memory bandwidth; the sums run over k in another order than the CPU's (lanes
// strided, then a tree), within float32 rounding of it.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>

#include "conv_common.cuh"
#include "epilog/kernels/cuda.h"
#include "epilog/kernels/launch.h"
#include "epilog/runtime/launch_log.h"
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

// kGemvRows (launch.h): rows of x a warp sums at once.
constexpr int kGemvWarps = kGemvCols;  // warps (output columns) per block

// The GEMV's operands: rows of x, y and the residual lie x_row, y_row and r_row floats apart (a
// 1x1 conv's images), y = post(act(acc * scale + shift) + residual) per column, as the convs do.
struct GemvArgs {
  int m;
  int64_t n, k, x_row, y_row, r_row;
  const float *x, *w, *scale, *shift, *res;
  float* y;
  Act act, post;
};

template <bool Vec>
__global__ void __launch_bounds__(32 * kGemvWarps) linear_gemv_kernel(const GemvArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t col = int64_t(blockIdx.x) * kGemvWarps + threadIdx.x / 32;
  if (col >= a.n) return;
  const float* __restrict__ wr = a.w + col * a.k;
  const detail::ChannelAffine f = detail::channel_affine(a.scale, a.shift, col);
  // Rows past the first kGemvRows re-read the weight row, from L2 (the selector sends only
  // batches of at most kGemvRows here).
  for (int r0 = 0; r0 < a.m; r0 += kGemvRows) {
    const float* __restrict__ x = a.x + r0 * a.x_row;
    const int rows = a.m - r0 < kGemvRows ? a.m - r0 : kGemvRows;
    float acc[kGemvRows] = {};
    if (Vec) {
      // k % 4 == 0 and x, w 16-byte aligned, rows a multiple of 4 apart: every row starts aligned.
      const int64_t k4 = a.k / 4;
      const float4* __restrict__ w4 = reinterpret_cast<const float4*>(wr);
      for (int64_t i = lane; i < k4; i += 32) {
        const float4 wv = __ldg(w4 + i);
#pragma unroll
        for (int r = 0; r < kGemvRows; ++r) {
          if (r >= rows) break;
          const float4 xv = __ldg(reinterpret_cast<const float4*>(x + r * a.x_row) + i);
          acc[r] = fmaf(xv.x, wv.x, fmaf(xv.y, wv.y, fmaf(xv.z, wv.z, fmaf(xv.w, wv.w, acc[r]))));
        }
      }
    } else {
      for (int64_t i = lane; i < a.k; i += 32) {
        const float wv = __ldg(wr + i);
#pragma unroll
        for (int r = 0; r < kGemvRows; ++r) {
          if (r >= rows) break;
          acc[r] = fmaf(__ldg(x + r * a.x_row + i), wv, acc[r]);
        }
      }
    }
    // -- scale, shift, activation and residual epilogue --
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) {
      if (r >= rows) break;
      float v = acc[r];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) {
        const int64_t row = r0 + r;
        a.y[row * a.y_row + col] =
            detail::add_residual(detail::apply(v, f, a.act), a.res, row * a.r_row + col, a.post);
      }
    }
  }
}

void launch_gemv(const GemvArgs& a, Stream stream) {
  const int64_t blocks = (a.n + kGemvWarps - 1) / kGemvWarps;
  EPILOG_CUDA_REQUIRE(blocks < (int64_t(1) << 31) && a.k >= 0);
  const bool vec = a.k % 4 == 0 && a.x_row % 4 == 0 && detail::aligned16(a.x) &&
                   detail::aligned16(a.w);
  const auto kernel = vec ? linear_gemv_kernel<true> : linear_gemv_kernel<false>;
  kernel<<<unsigned(blocks), 32 * kGemvWarps, 0, stream>>>(a);
  check_launch("gemv");
}

}  // namespace

void linear(int64_t m, int64_t n, int64_t k, const float* x, const float* w, const float* b,
            float* y, Stream stream) {
  if (m == 0 || n == 0) return;
  if (linear_runs_gemv(m)) {
    EPILOG_CUDA_REQUIRE(m < (int64_t(1) << 31));
    launch_gemv(GemvArgs{int(m), n, k, k, n, 0, x, w, nullptr, b, nullptr, y, {}, {}}, stream);
    log_launch("linear", [] { return "gemv"; });
    return;
  }
  const int64_t tiles_m = (m + kBM - 1) / kBM, tiles_n = (n + kBN - 1) / kBN;
  EPILOG_CUDA_REQUIRE(tiles_n <= 65535 && tiles_m < (int64_t(1) << 31) && k >= 0);
  // K == 0 runs too: the loop is empty and y becomes the bias (or zeros).
  linear_kernel<<<dim3(unsigned(tiles_m), unsigned(tiles_n)), kThreads, 0, stream>>>(m, n, k, x, w,
                                                                                     b, y);
  check_launch("linear");
  log_launch("linear", [] { return "tiled"; });
}

void conv_gemv(const ConvShape& s, const float* x, const float* w, const float* scale,
               const float* shift, Act act, float* y, Stream stream, ConvResidual residual) {
  if (!conv_supports(ConvKernel::Gemv, s))
    throw std::invalid_argument(
        "[conv_gemv] takes a 1x1 conv over a 1x1 plane (a linear layer), groups 1, unpadded");
  if (s.n == 0 || s.k == 0) return;
  EPILOG_CUDA_REQUIRE(s.n < (int64_t(1) << 31));
  launch_gemv(GemvArgs{int(s.n), s.k, s.c, s.x_image(), s.y_image(), s.r_image(), x, w, scale,
                       shift, residual.x, y, act, residual.post},
              stream);
  log_launch("gemv", [] { return conv_tiles_str({kGemvRows, kGemvCols}); });
}

}  // namespace epilog::cuda
