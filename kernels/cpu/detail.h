// Pieces the CPU kernel files share: the per-row epilogue and the GEMM that applies it.
#pragma once

#include <cstdint>

#include "epilog/kernels/shapes.h"

namespace epilog::cpu::detail {

// What every finished element of row i of a GEMM result becomes:
// act(v * scale[i] + shift[i]); scale == nullptr means 1, shift == nullptr means 0.
struct Epilogue {
  const float* scale = nullptr;
  const float* shift = nullptr;
  Activation act = Activation::None;
};

// y[j] = act(x[j]) for j < n; x and y may be the same array. The switch sits outside the loop so
// that each activation gets its own loop (Relu and None vectorize, the others call expf).
void activate_span(Activation act, const float* x, float* y, int64_t n);

// Applies ep to v[0, n), all of which belong to row `row`.
void finish_row(const Epilogue& ep, int64_t row, float* v, int64_t n);

// sgemm (see epilog/kernels/cpu.h) whose epilogue runs on each output tile as soon as its last
// k-block is summed, so the result is written once.
void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
          float* c, int64_t ldc, bool accumulate, const Epilogue& ep);

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
