// What the CPU kernel files share: the threading threshold, the epilogue, the GEMM, window ranges.
#pragma once

#include <cstdint>
#include <functional>

#include "epilog/kernels/shapes.h"

namespace epilog::cpu::detail {

// Work (elements moved, or multiply-adds) below which a kernel runs on one thread. On the
// 2-core dev VM (GCC 12, 2026-11-30) streaming 2^18 floats took ~45 us on one core, while an
// OpenMP fork/join took 3-4 ms whenever the machine was oversubscribed (the second thread
// waits for a time slice): small ops would pay far more than they could save.
constexpr int64_t kParallelWork = int64_t(1) << 18;
inline bool worth_threads(int64_t work) {
  return work >= kParallelWork;
}

// What every finished element of row i of a GEMM result becomes:
// act(v * scale[i] + shift[i]); scale == nullptr means 1, shift == nullptr means 0.
struct Epilogue {
  const float* scale = nullptr;
  const float* shift = nullptr;
  Act act;
};

// y[j] = act(x[j]) for j < n; x and y may be the same array. The common activations get loops of
// their own (Relu and None vectorize), the rest one loop with the switch inside.
void activate_span(const Act& act, const float* x, float* y, int64_t n);

// Applies ep to v[0, n), all of which belong to row `row`.
void finish_row(const Epilogue& ep, int64_t row, float* v, int64_t n);

// Where a GEMM's B[k, n] comes from: a row-major matrix (b, ldb), or, when `fill` is set, a
// function that writes the block B[k0, k0 + kc) x [n0, n0 + nc) row-major (leading dimension
// nc) into `dst`. conv2d uses the latter to run im2col one cache-sized block at a time inside
// the GEMM's parallel region, so that a conv costs one fork/join and no full column matrix.
struct BSource {
  const float* b = nullptr;
  int64_t ldb = 0;
  std::function<void(int64_t k0, int64_t kc, int64_t n0, int64_t nc, float* dst)> fill;
};

// sgemm (see epilog/kernels/cpu.h) whose epilogue runs on each output tile as soon as its last
// k-block is summed, so the result is written once.
void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const BSource& b, float* c,
          int64_t ldc, bool accumulate, const Epilogue& ep);

// The outputs o in [lo, hi) of a window position whose input index o * stride + offset lies in
// [0, extent), clipped to [0, out).
struct Range {
  int64_t lo, hi;
};
inline Range valid_range(int64_t offset, int64_t stride, int64_t extent, int64_t out) {
  int64_t lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  int64_t hi = extent - offset <= 0 ? 0 : (extent - offset - 1) / stride + 1;
  if (hi > out) hi = out;
  if (lo > hi) lo = hi;
  return {lo, hi};
}

}  // namespace epilog::cpu::detail
