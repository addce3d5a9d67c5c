// The conv_transpose2d CUDA kernel: the CPU reference's gather, one output per thread.
//
// Math: y[b, k, oh, ow] = bias[k] + sum over (i, j, c in k's group) of x[b, c, ih, iw] *
//   w[c, k % kg, i, j], where oh = ih * stride_h - pad_t + i * dil_h (ow alike), in float32.
// Layout: x [n, c, h, w], w [c, k / groups, r, s], y [n, k, ho, wo], contiguous float32 device
//   pointers; y must not overlap the others. bias may be null.
// Grid: 1-D and grid-stride, 256 threads a block, at most one full wave; item w is y's element
//   w (ow fastest), so a warp's writes are coalesced and its reads share x's rows through L1.
//   Every weight read is uniform across neighbouring outputs of one row, cached.
// Index math is 64-bit. Restrictions: none beyond the shape inference's.
#include <cuda_runtime.h>

#include <cstdint>

#include "epilog/kernels/cuda.h"
#include "launch.cuh"

namespace epilog::cuda {
namespace {

constexpr int kThreads = 256;
using namespace detail;

__global__ void __launch_bounds__(kThreads)
    conv_transpose_kernel(ConvShape s, int64_t total, const float* __restrict__ x,
                          const float* __restrict__ w, const float* __restrict__ bias,
                          float* __restrict__ y) {
  pdl_begin();
  const int64_t cg = s.c / s.groups, kg = s.k / s.groups;
  for (int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * kThreads) {
    const int64_t ow = e % s.wo, oh = e / s.wo % s.ho, k = e / (s.wo * s.ho) % s.k;
    const int64_t b = e / (s.wo * s.ho * s.k), g = k / kg;
    float sum = bias ? __ldg(bias + k) : 0.0f;
    for (int64_t i = 0; i < s.r; ++i) {
      const int64_t ih = transposed_source(oh, s.pad_t, i, s.dil_h, s.stride_h, s.h);
      for (int64_t j = 0; ih >= 0 && j < s.s; ++j) {
        const int64_t iw = transposed_source(ow, s.pad_l, j, s.dil_w, s.stride_w, s.w);
        for (int64_t ci = 0; iw >= 0 && ci < cg; ++ci) {
          const int64_t c = g * cg + ci;
          sum = fmaf(__ldg(x + ((b * s.c + c) * s.h + ih) * s.w + iw),
                     __ldg(w + ((c * kg + k % kg) * s.r + i) * s.s + j), sum);
        }
      }
    }
    y[e] = sum;
  }
}

}  // namespace

void conv_transpose2d(const ConvShape& s, const float* x, const float* w, const float* bias,
                      float* y, Stream stream) {
  const int64_t total = s.n * s.k * s.ho * s.wo;
  if (total == 0) return;
  EPILOG_CUDA_REQUIRE(s.groups > 0 && s.stride_h > 0 && s.stride_w > 0);
  conv_transpose_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(s, total, x, w, bias,
                                                                            y);
  check_launch("conv_transpose2d");
}

}  // namespace epilog::cuda
