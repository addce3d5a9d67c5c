// The CUDA kernels lowering chooses among for fused_conv2d, their tile sizes and the shape that
// decides: what a plan records for a conv (NodePlan) and what explain prints. Plain data; what
// each kernel takes (its fits and tile limits) and the kernels themselves are the library's own
// (internal/epilog/kernels/, not installed).
#pragma once

#include <cstdint>

namespace epilog {

// NCHW input [n, c, h, w], weight [k, c / groups, r, s], output [n, k, ho, wo].
// Output (oh, ow) reads input rows oh * stride_h - pad_t + i * dil_h, i in [0, r).
struct ConvShape {
  int64_t n, c, h, w;
  int64_t k, r, s;
  int64_t ho, wo;
  int64_t stride_h, stride_w;
  int64_t pad_t, pad_l;  // bottom/right padding only shows in ho/wo
  int64_t dil_h, dil_w;
  int64_t groups;
  // Elements between consecutive images of x and of y; 0 means contiguous (c*h*w, k*ho*wo).
  // Larger when x or y is a channel slab of a larger batch (Tensor::part): always a multiple of
  // the plane, so every alignment a kernel derives from the plane holds for each image too.
  int64_t x_stride = 0, y_stride = 0;
  int64_t r_stride = 0;  // the same for the residual (fused_conv2d's fifth input), y's shape

  int64_t x_image() const { return x_stride ? x_stride : c * h * w; }
  int64_t y_image() const { return y_stride ? y_stride : k * ho * wo; }
  int64_t r_image() const { return r_stride ? r_stride : k * ho * wo; }
  int64_t flops() const { return 2 * n * k * ho * wo * (c / groups) * r * s; }
  // Fewest bytes a fused layer must move: input once, weights, scale/shift, output once.
  int64_t min_bytes() const {
    return 4 * (n * c * h * w + k * (c / groups) * r * s + 2 * k + n * k * ho * wo);
  }
};

// The CUDA kernels for fused_conv2d, and the tile sizes one launch uses (their meaning per kernel
// is in that kernel's header comment). Gemv: a linear layer's weight stream
// (kernels/cuda/linear.cu).
enum class ConvKernel : uint8_t { Scalar, Tiled, Gemm, Gemv };

struct ConvTiles {
  int m = 0;       // output pixels (N*Ho*Wo) per block
  int n = 0;       // output channels per block
  int k = 0;       // reduction slice (Cin*Kh*Kw) staged per step
  int stages = 0;  // shared-memory pipeline depth (gemm)
  int splits = 1;  // gemm k = 32, and k = 72 with wgmma: blocks (one cluster) each output tile's
                   // reduction is split over
  bool wgmma = false;  // gemm: the halo (k = 72) or 1x1 direct (k = 32) kernel on Hopper's wgmma
  // gemm, wgmma 64 x n halo tiles, n in {16, 32}: the persistent halo kernel where it takes the
  // shape (halo_persistent_fits) and x's rows are 16-byte aligned, else these tiles as they are.
  bool persistent = false;
};

inline bool operator==(const ConvTiles& a, const ConvTiles& b) {
  return a.m == b.m && a.n == b.n && a.k == b.k && a.stages == b.stages && a.splits == b.splits &&
         a.wgmma == b.wgmma && a.persistent == b.persistent;
}

inline const char* conv_kernel_name(ConvKernel kernel) {
  switch (kernel) {
    case ConvKernel::Scalar:
      return "scalar";
    case ConvKernel::Tiled:
      return "tiled";
    case ConvKernel::Gemm:
      return "gemm";
    case ConvKernel::Gemv:
      return "gemv";
  }
  return "?";
}

}  // namespace epilog
