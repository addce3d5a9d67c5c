// Device helpers shared by the fused_conv2d kernels (conv_scalar.cu, conv_tiled.cu,
// conv_gemm.cu). Keep this small: every conv kernel recompiles when it changes.
#pragma once

#include <cstdint>

#include "epilog/kernels/shapes.h"
#include "launch.cuh"

namespace epilog::cuda::detail {

// -- batchnorm + activation epilogue --
// y = act(acc * scale[k] + shift[k]); scale == nullptr means 1, shift == nullptr means 0, so the
// same kernel serves conv2d (+ bias) and conv -> batchnorm -> activation. The null tests are
// uniform across a launch: a predicate, not a divergent branch. activate() uses the GPU's fast
// exp2 and reciprocal (see logistic_ratio), well inside the 1e-5 the SIMT kernels are tested to.

// Output channel k's factors: load once, apply to every pixel of the channel a thread holds.
struct ChannelAffine {
  float scale, shift;
};

__device__ __forceinline__ ChannelAffine channel_affine(const float* __restrict__ scale,
                                                        const float* __restrict__ shift,
                                                        int64_t k) {
  return {scale ? __ldg(scale + k) : 1.0f, shift ? __ldg(shift + k) : 0.0f};
}

__device__ __forceinline__ float apply(float acc, ChannelAffine f, Act act) {
  return activate(act, fmaf(acc, f.scale, f.shift));
}

__device__ __forceinline__ float apply(float acc, const float* __restrict__ scale,
                                       const float* __restrict__ shift, Act act, int64_t k) {
  return apply(acc, channel_affine(scale, shift, k), act);
}

// post(v + r[i]): fused_conv2d's residual, then the activation where that comes after the add
// (split_residual_act: ResNet's relu(bn(conv) + x); else post is None); r == nullptr: v (a
// uniform branch). The residual has y's layout, so its reads coalesce as y's stores do.
__device__ __forceinline__ float add_residual(float v, const float* __restrict__ r, int64_t i,
                                              const Act& post) {
  return r ? activate(post, v + __ldg(r + i)) : v;
}

// The same for residuals a kernel loaded itself: v[j] = post(v[j] + r[j]) for j < n.
template <int N>
__device__ __forceinline__ void add_residuals(float (&v)[N], const float (&r)[N], const Act& post) {
#pragma unroll
  for (int j = 0; j < N; ++j) v[j] = activate(post, v[j] + r[j]);
}

}  // namespace epilog::cuda::detail
