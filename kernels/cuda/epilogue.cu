// The conv epilogue as a standalone elementwise pass: y = act(x * scale[c] + shift[c]).
//
// Layout: x and y are [outer, channels, inner] (NCHW: outer = N, inner = H*W). One thread per
// four consecutive elements of a row when inner % 4 == 0 (float4 loads and stores), else one
// per element; a grid-stride loop covers any size. The caller passes device pointers.
#include <cuda_runtime.h>

#include <algorithm>

#include "epilog/kernels/cuda.h"

namespace epilog::cuda {
namespace {

__global__ void scale_shift_act_vec4(int64_t rows, int64_t channels, int64_t inner4,
                                     const float4* __restrict__ x, const float* __restrict__ scale,
                                     const float* __restrict__ shift, Act act,
                                     float4* __restrict__ y) {
  const int64_t total = rows * inner4;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = (i / inner4) % channels;
    const float a = scale[c], b = shift[c];
    float4 v = x[i];
    v.x = activate(act, v.x * a + b);
    v.y = activate(act, v.y * a + b);
    v.z = activate(act, v.z * a + b);
    v.w = activate(act, v.w * a + b);
    y[i] = v;
  }
}

__global__ void scale_shift_act_scalar(int64_t rows, int64_t channels, int64_t inner,
                                       const float* __restrict__ x, const float* __restrict__ scale,
                                       const float* __restrict__ shift, Act act,
                                       float* __restrict__ y) {
  const int64_t total = rows * inner;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = (i / inner) % channels;
    y[i] = activate(act, x[i] * scale[c] + shift[c]);
  }
}

}  // namespace

void scale_shift_act(int64_t outer, int64_t channels, int64_t inner, const float* x,
                     const float* scale, const float* shift, Act act, float* y,
                     Stream stream) {
  const int64_t rows = outer * channels;
  if (rows * inner == 0) return;
  const int threads = 256;
  const bool vec = inner % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(y) % 16 == 0;
  const int64_t work = vec ? rows * inner / 4 : rows * inner;
  const int blocks = int(std::min<int64_t>((work + threads - 1) / threads, 1 << 20));
  if (vec)
    scale_shift_act_vec4<<<blocks, threads, 0, stream>>>(rows, channels, inner / 4,
                                                         reinterpret_cast<const float4*>(x), scale,
                                                         shift, act, reinterpret_cast<float4*>(y));
  else
    scale_shift_act_scalar<<<blocks, threads, 0, stream>>>(rows, channels, inner, x, scale, shift,
                                                           act, y);
  check_launch("scale_shift_act");
}

}  // namespace epilog::cuda
