// fused_conv2d, one output element per thread: the kernel that runs every shape.
//
// Math: y[n, k, oh, ow] = act(acc * scale[k] + shift[k]) with
//   acc = sum_{c < cg, i < r, j < s} x[n, g*cg + c, oh*sh - pad_t + i*dh, ow*sw - pad_l + j*dw]
//                                     * w[k, c, i, j]
// where cg = C / groups, g = k / (K / groups), and x outside the input reads 0.
// scale == nullptr means 1, shift == nullptr means 0.
// Layout: float32, contiguous NCHW x [n, C, h, w], weight [K, cg, r, s], y [n, K, ho, wo].
//
// Grid: (K, ceil(ho*wo / 256), n) blocks of kThreads = 256 threads, channel fastest:
//   k = blockIdx.x, img = blockIdx.z, p = blockIdx.y * 256 + threadIdx.x,
//   (oh, ow) = (p / wo, p % wo)
// (y and z stride by the grid past 65535). A block is one 256-pixel run of one output plane, so
// consecutive threads step along ow (the loads and the store coalesce), the block's weights are
// one row of w (staged in shared memory and read as broadcasts), and consecutive blocks are the
// K channels over the same input pixels (they share them in L2).
// Restrictions: none on stride, padding (bottom/right padding only shows in ho/wo), dilation or
// groups (depthwise included). One input plane (h*w) and one output plane (ho*wo) must fit in
// int32. tiles are not used: 256 threads a block.
// The caller precomputes nothing: no workspace, no setup; r = s in {1, 3, 5, 7} get unrolled
// instantiations, any other window the generic loop.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "conv_common.cuh"
#include "epilog/common.h"
#include "epilog/kernels/cuda.h"

namespace epilog::cuda {
namespace {

constexpr int kThreads = 256;

// By value, so the kernel reads it from the parameter bank. int fields: within-plane offsets
// are int32 (checked by the launcher); plane bases are formed in int64.
struct ScalarArgs {
  const float* x;
  const float* wt;
  const float* scale;
  const float* shift;
  float* y;
  int c, h, w;    // input channels and plane
  int k, ho, wo;  // output channels and plane
  int cg, kg;     // channels per group, in and out
  int r, s;       // the window (read by the generic instantiation only)
  int sh, sw, pt, pl, dh, dw;
  int n;
  int pix_blocks;  // ceil(ho * wo / kThreads)
  Activation act;
};

// Weights of the block's output channel staged per chunk of input channels (templated windows).
constexpr int kWeightChunk = 2048;

// Blocks an SM must hold, i.e. a register cap of 65536 / (256 * blocks), per instantiation: the
// highest occupancy at which ptxas (nvcc 13.0, sm_90) spills nothing (0: no target, the PTX gets
// no .minnctapersm). Dilated windows keep every tap's address live, so only the dilated 3x3 is
// unrolled; larger dilated windows take the generic loop.
template <int R, int S, bool kUnitDil>
constexpr int scalar_min_blocks() {
  if (R == 0) return 0;       // generic: 40 registers
  if (R * S == 1) return 8;   // 32
  if (!kUnitDil) return 4;    // 3x3 dilated: 64
  if (R * S <= 9) return 5;   // 48 (6 blocks: 40 and a spill)
  if (R * S <= 25) return 8;  // 32
  return 5;                   // 7x7: 48 (6 blocks: 40 and a spill)
}

// The block's 256 outputs at pixel block pb of plane (img, k). R = S = 0 is the generic
// window; otherwise the R x S window is unrolled, and kUnitDil says dil_w == 1 so that a window
// row is one base address plus immediate offsets. ws: the block's weight staging (templated).
template <int R, int S, bool kUnitDil>
__device__ __forceinline__ void conv_scalar_block(const ScalarArgs& a, int k, int img, int pb,
                                                  float* ws) {
  const int p = pb * kThreads + static_cast<int>(threadIdx.x);
  const int npix = a.ho * a.wo;
  const bool active = p < npix;
  const int oh = p / a.wo, ow = p - oh * a.wo;
  const int ih0 = oh * a.sh - a.pt, iw0 = ow * a.sw - a.pl;
  const int hw = a.h * a.w;
  const int g = k / a.kg;

  const float* __restrict__ xp = a.x + (int64_t(img) * a.c + int64_t(g) * a.cg) * hw;
  float acc = 0.0f;

  // -- mainloop: input channels of the group, window taps unrolled --
  if constexpr (R > 0) {
    // The block shares one weight row w[k]: staged in shared memory a chunk of channels at a
    // time, so the taps read it as broadcasts at immediate offsets, with no address registers.
    constexpr int kRS = R * S;
    constexpr int kChunk = kWeightChunk / kRS;  // input channels per chunk
    static_assert(kChunk >= 1, "window larger than the weight chunk");

    // The window's rows and columns, and which of them lie inside the input: fixed for the
    // thread, so the channel loop does no bounds arithmetic, only predicated loads.
    int roff[R];
    unsigned rmask = 0, cmask = 0;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int ih = ih0 + i * a.dh;
      roff[i] = ih * a.w + iw0;
      if (active && unsigned(ih) < unsigned(a.h)) rmask |= 1u << i;
    }
#pragma unroll
    for (int j = 0; j < S; ++j) {
      const int iw = iw0 + j * (kUnitDil ? 1 : a.dw);
      if (unsigned(iw) < unsigned(a.w)) cmask |= 1u << j;
    }
    const float* __restrict__ wk = a.wt + int64_t(k) * a.cg * kRS;
    // Small windows unroll over channels too, for enough independent loads in flight.
    constexpr int kUnroll = kRS == 1 ? 8 : (kRS <= 9 ? 2 : 1);
    for (int c0 = 0; c0 < a.cg; c0 += kChunk) {
      const int nc = min(kChunk, a.cg - c0);
      __syncthreads();  // the previous chunk is consumed
      for (int e = threadIdx.x; e < nc * kRS; e += kThreads) ws[e] = __ldg(wk + c0 * kRS + e);
      __syncthreads();
#pragma unroll kUnroll
      for (int c = 0; c < nc; ++c) {
#pragma unroll
        for (int i = 0; i < R; ++i) {
#pragma unroll
          for (int j = 0; j < S; ++j) {
            const int col = j * (kUnitDil ? 1 : a.dw);
            const float v =
                (rmask >> i & 1u) && (cmask >> j & 1u) ? __ldg(xp + roff[i] + col) : 0.0f;
            acc = fmaf(v, ws[c * kRS + i * S + j], acc);
          }
        }
        xp += hw;
      }
    }
    if (!active) return;
  } else {
    if (!active) return;
    // Clip the window to the input once: taps i in [i0, i1) and j in [j0, j1) are inside.
    const int i0 = ih0 >= 0 ? 0 : (-ih0 + a.dh - 1) / a.dh;
    const int i1 = a.h - ih0 <= 0 ? 0 : min(a.r, (a.h - 1 - ih0) / a.dh + 1);
    const int j0 = iw0 >= 0 ? 0 : (-iw0 + a.dw - 1) / a.dw;
    const int j1 = a.w - iw0 <= 0 ? 0 : min(a.s, (a.w - 1 - iw0) / a.dw + 1);
    const int rs = a.r * a.s;
    const float* __restrict__ wp = a.wt + int64_t(k) * a.cg * rs;
    for (int c = 0; c < a.cg; ++c, xp += hw, wp += rs) {
      for (int i = i0; i < i1; ++i) {
        const float* __restrict__ row = xp + (ih0 + i * a.dh) * a.w + iw0;
        const float* __restrict__ wrow = wp + i * a.s;
#pragma unroll 4
        for (int j = j0; j < j1; ++j) acc = fmaf(__ldg(row + j * a.dw), __ldg(wrow + j), acc);
      }
    }
  }

  // -- batchnorm + activation epilogue --
  a.y[(int64_t(img) * a.k + k) * npix + p] = detail::apply(acc, a.scale, a.shift, a.act, k);
}

// Grid (K, pixel blocks, n), channel fastest. y and z stride by the grid when the launcher had
// to clip them to 65535 (planes over 16.7M pixels, batches over 65535); otherwise once each.
template <int R, int S, bool kUnitDil>
__global__ void __launch_bounds__(kThreads, (scalar_min_blocks<R, S, kUnitDil>()))
    conv_scalar_kernel(const ScalarArgs a) {
  __shared__ float ws[R > 0 ? kWeightChunk : 1];
  const int k = static_cast<int>(blockIdx.x);
  for (int img = blockIdx.z; img < a.n; img += gridDim.z)
    for (int pb = blockIdx.y; pb < a.pix_blocks; pb += gridDim.y)
      conv_scalar_block<R, S, kUnitDil>(a, k, img, pb, ws);
}

}  // namespace

bool conv_supports(ConvKernel kernel, const ConvShape& s) {
  switch (kernel) {
    case ConvKernel::Scalar:
      return true;
    case ConvKernel::Tiled:
      return s.groups == 1;  // a block's channels share one input patch
    case ConvKernel::Gemm:
      return s.groups == 1;
  }
  return false;
}

void conv_scalar(const ConvShape& s, const float* x, const float* w, const float* scale,
                 const float* shift, Activation act, float* y, Stream stream) {
  EPILOG_ASSERT(s.n > 0 && s.c > 0 && s.k > 0 && s.ho > 0 && s.wo > 0 && s.r > 0 && s.s > 0);
  EPILOG_ASSERT(s.groups > 0 && s.c % s.groups == 0 && s.k % s.groups == 0,
                "conv_scalar groups {} for {} -> {} channels", s.groups, s.c, s.k);
  EPILOG_ASSERT(s.stride_h > 0 && s.stride_w > 0 && s.dil_h > 0 && s.dil_w > 0 && s.pad_t >= 0 &&
                s.pad_l >= 0);
  EPILOG_ASSERT(s.h * s.w <= INT_MAX && s.ho * s.wo <= INT_MAX - kThreads,
                "conv_scalar planes {}x{} -> {}x{} exceed int32", s.h, s.w, s.ho, s.wo);
  EPILOG_ASSERT(x && w && y);
  EPILOG_ASSERT(s.n <= INT_MAX && s.k <= INT_MAX, "conv_scalar n {} k {}", s.n, s.k);
  const int64_t pix_blocks = detail::ceil_div(s.ho * s.wo, kThreads);

  ScalarArgs a;
  a.x = x;
  a.wt = w;
  a.scale = scale;
  a.shift = shift;
  a.y = y;
  a.c = int(s.c), a.h = int(s.h), a.w = int(s.w);
  a.k = int(s.k), a.ho = int(s.ho), a.wo = int(s.wo);
  a.cg = int(s.c / s.groups), a.kg = int(s.k / s.groups);
  a.r = int(s.r), a.s = int(s.s);
  a.sh = int(s.stride_h), a.sw = int(s.stride_w);
  a.pt = int(s.pad_t), a.pl = int(s.pad_l);
  a.dh = int(s.dil_h), a.dw = int(s.dil_w);
  a.n = int(s.n);
  a.pix_blocks = int(pix_blocks);
  a.act = act;

  constexpr int64_t kMaxGridYZ = 65535;
  const dim3 grid(static_cast<unsigned>(s.k),
                  static_cast<unsigned>(std::min(pix_blocks, kMaxGridYZ)),
                  static_cast<unsigned>(std::min(s.n, kMaxGridYZ)));
  const bool unit = s.dil_w == 1;
  const auto launch = [&](auto kernel) { kernel<<<grid, kThreads, 0, stream>>>(a); };
  if (s.r == 1 && s.s == 1)
    launch(conv_scalar_kernel<1, 1, true>);
  else if (s.r == 3 && s.s == 3)
    launch(unit ? conv_scalar_kernel<3, 3, true> : conv_scalar_kernel<3, 3, false>);
  else if (s.r == 5 && s.s == 5 && unit)
    launch(conv_scalar_kernel<5, 5, true>);
  else if (s.r == 7 && s.s == 7 && unit)
    launch(conv_scalar_kernel<7, 7, true>);
  else
    launch(conv_scalar_kernel<0, 0, false>);
  check_launch("conv_scalar");
}

}  // namespace epilog::cuda
