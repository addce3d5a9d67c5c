// The blocked single-precision GEMM behind conv2d and linear, its per-row epilogue, and linear.
//
// C[m, n] = sum_k A[m, k] * B[k, n], all row-major. Blocking (Goto style, kept small):
//   - Work is split into tasks of (kMC rows) x (kNC columns) of C, handed out by OpenMP.
//   - Per task and k-block of kKC, A is packed into kMR-row tiles ([p * kMR + i]) and B into
//     kNR-column strips ([p * kNR + j]), both zero padded, so the micro-kernel has no edges.
//     (Packing A per task repeats it for every column block, but that is 1/(2 kNC) of the
//     arithmetic and saves a barrier, which matters on a busy 2-core machine.)
//   - The micro-kernel sums a kMR x kNR tile over one k-block in registers; the tile is added
//     to C, and after the last k-block the epilogue runs on it while it is still in cache.
// Every C element is summed in the same order (k ascending) whatever the thread count, so
// results are deterministic.
#include <algorithm>
#include <memory>

#include "detail.h"
#include "epilog/kernels/cpu.h"

namespace epilog::cpu {
namespace detail {
namespace {

// 4 x 16 with `omp simd` on the column loop sustained ~19 GFLOP/s per core with SSE2 only
// (GCC 12 -O3, 2-core AMD EPYC KVM guest, kc = 256, 2026-11-30); 6 x 16 was equal, 8 x 8 and
// plain loops without the pragma fell to 3-15 GFLOP/s (GCC spills or gives up on SLP). Four
// rows waste nothing on the usual multiple-of-16 channel counts.
constexpr int64_t kMR = 4;
constexpr int64_t kNR = 16;
// A kKC x kNR strip of packed B (16 KiB) stays in L1 while it meets every A tile of a task;
// the task's kMC x kKC block of packed A (128 KiB) and its B panel (256 KiB) stay in L2
// (1 MiB per core here).
constexpr int64_t kKC = 256;
constexpr int64_t kMC = 128;
constexpr int64_t kNC = 256;
static_assert(kMC % kMR == 0 && kNC % kNR == 0);

void micro_tile(int64_t kc, const float* __restrict a, const float* __restrict b,
                float* __restrict tile) {
  float acc[kMR][kNR] = {};
  for (int64_t p = 0; p < kc; ++p) {
    const float* __restrict bp = b + p * kNR;
    for (int64_t i = 0; i < kMR; ++i) {
      const float av = a[p * kMR + i];
#pragma omp simd
      for (int64_t j = 0; j < kNR; ++j) acc[i][j] += av * bp[j];
    }
  }
  for (int64_t i = 0; i < kMR; ++i)
    for (int64_t j = 0; j < kNR; ++j) tile[i * kNR + j] = acc[i][j];
}

// A[0:mc, 0:kc] (already offset to the block's corner) into kMR-row tiles.
void pack_a(int64_t mc, int64_t kc, const float* a, int64_t lda, float* apack) {
  for (int64_t t = 0; t * kMR < mc; ++t) {
    float* dst = apack + t * kMR * kc;
    for (int64_t i = 0; i < kMR; ++i) {
      const int64_t row = t * kMR + i;
      for (int64_t p = 0; p < kc; ++p) dst[p * kMR + i] = row < mc ? a[row * lda + p] : 0.0f;
    }
  }
}

// B[0:kc, 0:nc] (already offset to the task's corner) into kNR-column strips.
void pack_b(int64_t kc, int64_t nc, const float* b, int64_t ldb, float* bpack) {
  for (int64_t j0 = 0; j0 < nc; j0 += kNR) {
    float* dst = bpack + j0 * kc;
    int64_t cols = std::min(kNR, nc - j0);
    for (int64_t p = 0; p < kc; ++p) {
      const float* src = b + p * ldb + j0;
      for (int64_t j = 0; j < kNR; ++j) dst[p * kNR + j] = j < cols ? src[j] : 0.0f;
    }
  }
}

template <Activation A>
void activate_loop(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = activate(A, x[i]);
}

void activate_loop(const Act& act, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = activate(act, x[i]);
}

}  // namespace

void activate_span(const Act& act, const float* x, float* y, int64_t n) {
  switch (act.kind) {
    case Activation::None:
      if (x != y) std::copy(x, x + n, y);
      return;
    case Activation::Silu:
      return activate_loop<Activation::Silu>(x, y, n);
    case Activation::Relu:
      return activate_loop<Activation::Relu>(x, y, n);
    default:
      return activate_loop(act, x, y, n);
  }
}

void finish_row(const Epilogue& ep, int64_t row, float* v, int64_t n) {
  if (ep.scale) {
    const float s = ep.scale[row];
    for (int64_t j = 0; j < n; ++j) v[j] *= s;
  }
  if (ep.shift) {
    const float t = ep.shift[row];
    for (int64_t j = 0; j < n; ++j) v[j] += t;
  }
  activate_span(ep.act, v, v, n);
}

void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const BSource& src,
          float* c, int64_t ldc, bool accumulate, const Epilogue& ep) {
  EPILOG_ASSERT(m >= 0 && n >= 0 && k >= 0, "gemm {}x{}x{}", m, n, k);
  EPILOG_ASSERT(lda >= k && ldc >= n && (src.fill || src.ldb >= n),
                "gemm lda {} ldb {} ldc {} for {}x{}x{}", lda, src.ldb, ldc, m, n, k);
  if (m == 0 || n == 0) return;
  EPILOG_ASSERT(c != nullptr && (k == 0 || (a != nullptr && (src.fill || src.b != nullptr))));
  if (k == 0) {  // an empty sum: C keeps its value (accumulate) or becomes 0
    for (int64_t i = 0; i < m; ++i) {
      float* row = c + i * ldc;
      if (!accumulate) std::fill(row, row + n, 0.0f);
      finish_row(ep, i, row, n);
    }
    return;
  }

  const int64_t tasks_m = (m + kMC - 1) / kMC;
  const int64_t tasks_n = (n + kNC - 1) / kNC;
#pragma omp parallel if (tasks_m * tasks_n > 1 && worth_threads(m * n * k / 4))
  {
    std::unique_ptr<float[]> apack(new float[kMC * kKC]);
    std::unique_ptr<float[]> bpack(new float[kKC * kNC]);
    std::unique_ptr<float[]> scratch(src.fill ? new float[kKC * kNC] : nullptr);
    alignas(64) float tile[kMR * kNR];
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks_m * tasks_n; ++task) {
      const int64_t m0 = task / tasks_n * kMC, mc = std::min(kMC, m - m0);
      const int64_t n0 = task % tasks_n * kNC, nc = std::min(kNC, n - n0);
      for (int64_t k0 = 0; k0 < k; k0 += kKC) {
        const int64_t kc = std::min(kKC, k - k0);
        const bool first = k0 == 0 && !accumulate;
        const bool last = k0 + kc == k;
        pack_a(mc, kc, a + m0 * lda + k0, lda, apack.get());
        if (src.fill) {
          src.fill(k0, kc, n0, nc, scratch.get());
          pack_b(kc, nc, scratch.get(), nc, bpack.get());
        } else {
          pack_b(kc, nc, src.b + k0 * src.ldb + n0, src.ldb, bpack.get());
        }
        for (int64_t j0 = 0; j0 < nc; j0 += kNR) {
          const int64_t cols = std::min(kNR, nc - j0);
          for (int64_t t = 0; t * kMR < mc; ++t) {
            micro_tile(kc, apack.get() + t * kMR * kc, bpack.get() + j0 * kc, tile);
            const int64_t rows = std::min(kMR, mc - t * kMR);
            for (int64_t i = 0; i < rows; ++i) {
              const int64_t row = m0 + t * kMR + i;
              float* crow = c + row * ldc + n0 + j0;
              const float* trow = tile + i * kNR;
              if (first)
                for (int64_t j = 0; j < cols; ++j) crow[j] = trow[j];
              else
                for (int64_t j = 0; j < cols; ++j) crow[j] += trow[j];
              // -- epilogue: the tile is final once its last k-block is in --
              if (last) finish_row(ep, row, crow, cols);
            }
          }
        }
      }
    }
  }
}

}  // namespace detail

void sgemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
           int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  detail::BSource src;
  src.b = b;
  src.ldb = ldb;
  detail::gemm(m, n, k, a, lda, src, c, ldc, accumulate, detail::Epilogue{});
}

void linear(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) {
  EPILOG_ASSERT(x.rank() >= 2 && w.rank() == 2 && x.shape().back() == w.dim(1),
                "linear x {} weight {}", shape_str(x.shape()), shape_str(w.shape()));
  const int64_t n = w.dim(0), k = w.dim(1), m = k == 0 ? 0 : x.numel() / k;
  Shape want = x.shape();
  want.back() = n;
  EPILOG_ASSERT(y.shape() == want, "linear y {} for x {} weight {}", shape_str(y.shape()),
                shape_str(x.shape()), shape_str(w.shape()));
  EPILOG_ASSERT(!b.defined() || b.shape() == Shape{n}, "linear bias {} for {} outputs",
                shape_str(b.shape()), n);
  // sgemm wants B as [k, n]; the weight is [n, k], so transpose it once (n * k, the cost of
  // reading it) rather than give the GEMM a strided B.
  std::unique_ptr<float[]> wt(new float[std::max<int64_t>(n * k, 1)]);
  const float* wp = w.f32();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < k; ++p) wt[p * n + i] = wp[i * k + p];
  float* yp = y.f32();
  // Starting from the bias and accumulating adds it in the same pass that writes y.
  if (b.defined()) {
    const float* bp = b.f32();
    for (int64_t i = 0; i < m; ++i) std::copy(bp, bp + n, yp + i * n);
  }
  sgemm(m, n, k, x.f32(), k, wt.get(), n, yp, n, b.defined());
}

}  // namespace epilog::cpu
