// Device helpers shared by the fused_conv2d kernels (conv_scalar.cu, conv_tiled.cu,
// conv_gemm.cu). Keep this small: every conv kernel recompiles when it changes.
#pragma once

#include <cstdint>

#include "epilog/kernels/shapes.h"

namespace epilog::cuda::detail {

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// -- batchnorm + activation epilogue --
// y = act(acc * scale[k] + shift[k]); scale == nullptr means 1, shift == nullptr means 0, so the
// same kernel serves conv2d (+ bias) and conv -> batchnorm -> activation. The null tests are
// uniform across a launch, so they cost a predicate, not a divergent branch. activate() keeps
// the accurate expf: the SIMT kernels are tested to 1e-5 of the fp32 CPU reference.
__device__ __forceinline__ float apply(float acc, const float* __restrict__ scale,
                                       const float* __restrict__ shift, Activation act, int64_t k) {
  const float a = scale ? __ldg(scale + k) : 1.0f;
  const float b = shift ? __ldg(shift + k) : 0.0f;
  return activate(act, fmaf(acc, a, b));
}

}  // namespace epilog::cuda::detail
