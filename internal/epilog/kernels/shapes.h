// What the kernels take and how they compute, shared by the CPU and CUDA kernels, their
// launchers and the kernel selector: the pointwise functions (activate, binary_apply), kernel
// geometry (convolution, pooling, resize, elementwise chains) and each CUDA kernel's fits and tile
// limits. Plain data and inline functions, usable from device code. The library's own: the
// types a plan and the graph API carry are in the public graph/pointwise.h and
// graph/conv_kernel.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "epilog/graph/conv_kernel.h"
#include "epilog/graph/pointwise.h"

namespace epilog {

// A binary op (graph/pointwise.h Binary) on two values. Max and min propagate NaN, as NumPy's
// maximum and minimum.
EPILOG_HD inline float binary_apply(Binary op, float a, float b) {
  switch (op) {
    case Binary::Add:
      return a + b;
    case Binary::Mul:
      return a * b;
    case Binary::Sub:
      return a - b;
    case Binary::Div:
      return a / b;
    case Binary::Max:
      return a != a || a > b ? a : b;
    case Binary::Min:
      return a != a || a < b ? a : b;
  }
  return a;
}

// pad's modes and the reductions, as the CPU and CUDA kernels take them.
enum class PadMode : uint8_t { Constant, Reflect, Edge };
enum class Reduce : uint8_t { Mean, Sum, Max, Min, Prod };  // Min propagates NaN, as Max

// Resize (ONNX): where output index o of a dim resized from `in` to `out` samples its input, in
// input coordinates, and which input element nearest mode takes. Shared by the CPU and CUDA
// kernels: this is the definition the tests check against PyTorch's and ONNX's worked numbers.
// The index type I is int64_t on the CPU; the CUDA kernel passes uint32_t where every index
// fits (float(I) of an index below 2^31 is the same float either way, so are the results).
enum class ResizeCoord : uint8_t { HalfPixel, PytorchHalfPixel, AlignCorners, Asymmetric };
enum class NearestMode : uint8_t { RoundPreferFloor, RoundPreferCeil, Floor, Ceil };
struct ResizeMode {
  bool linear = false;
  ResizeCoord coord = ResizeCoord::HalfPixel;
  NearestMode nearest = NearestMode::RoundPreferFloor;
};

// a * b + c rounded after each operation, as the CPU computes it: nvcc would fuse the two into
// one fma, and a coordinate one rounding apart can land on another input index.
EPILOG_HD inline float mul_then_add(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(__fmul_rn(a, b), c);
#else
  return a * b + c;
#endif
}

template <class I>
EPILOG_HD inline float resize_source(ResizeCoord c, I o, I in, I out) {
  const float ratio = float(in) / float(out);  // 1 / scale, as PyTorch computes it
  switch (c) {
    case ResizeCoord::HalfPixel:
      return mul_then_add(float(o) + 0.5f, ratio, -0.5f);
    case ResizeCoord::PytorchHalfPixel:
      return out > 1 ? mul_then_add(float(o) + 0.5f, ratio, -0.5f) : 0.0f;
    case ResizeCoord::AlignCorners:
      return out > 1 ? float(o) * float(in - 1) / float(out - 1) : 0.0f;
    case ResizeCoord::Asymmetric:
      return float(o) * ratio;
  }
  return 0.0f;
}

// The input index nearest mode reads for source coordinate x, clamped to [0, in).
template <class I>
EPILOG_HD inline I resize_nearest(NearestMode m, float x, I in) {
  float r;
  switch (m) {
    case NearestMode::RoundPreferFloor:
      r = ceilf(x - 0.5f);
      break;
    case NearestMode::RoundPreferCeil:
      r = floorf(x + 0.5f);
      break;
    case NearestMode::Floor:
      r = floorf(x);
      break;
    default:
      r = ceilf(x);
      break;
  }
  // Clamped below in float (an unsigned I holds no negative index), above both in float (no
  // conversion out of I's range) and as an index.
  if (r <= 0.0f) return I(0);
  if (r >= float(in)) return in - 1;
  const I i = I(r);
  return i >= in ? in - 1 : i;
}

// The integer factor f by which nearest mode `m` resizes `in` to `out` where it reads input o / f
// for every output o (checked index by index: any coordinate and rounding mode may), else 0. The
// CUDA resize runs those as upsample_nearest (lowering's explain says so).
inline int64_t resize_nearest_factor(const ResizeMode& m, int64_t in, int64_t out) {
  if (m.linear || in <= 0 || out % in != 0) return 0;
  const int64_t f = out / in;
  for (int64_t o = 0; o < out; ++o)
    if (resize_nearest(m.nearest, resize_source(m.coord, o, in, out), in) != o / f) return 0;
  return f;
}

// Linear mode's two input indices and the weight of the second: x clamped below at 0, as
// PyTorch's and ONNX's bilinear do; past the last input both indices are the last.
template <class I = int64_t>
struct LinearTap {
  I i0, i1;
  float w1;
};
template <class I>
EPILOG_HD inline LinearTap<I> resize_linear(float x, I in) {
  if (x < 0.0f) x = 0.0f;
  I i0 = I(x);
  if (i0 > in - 1) i0 = in - 1;
  const I i1 = i0 < in - 1 ? i0 + 1 : i0;
  return {i0, i1, x - float(i0)};
}

// conv_transpose2d: the input index whose tap t (dilated by dil) lands on output o, where input i
// goes to i * stride - pad + t * dil; -1 where none does (off the stride's grid or the input).
EPILOG_HD inline int64_t transposed_source(int64_t o, int64_t pad, int64_t t, int64_t dil,
                                           int64_t stride, int64_t in) {
  const int64_t at = o + pad - t * dil;
  return at < 0 || at % stride != 0 || at / stride >= in ? -1 : at / stride;
}

// q = n / d for 0 <= n < 2^31 and 0 < d < 2^31 as a multiply-high and a shift
// (Granlund-Montgomery): for the index decodes a kernel runs per item or tile, where a real
// division (about 20 instructions in 32 bits, far more in 64) would cost more than the work it
// indexes. tests/test_lowering.cpp checks it against `/`.
struct FastDiv {
  uint32_t mul, shift;
};

inline FastDiv make_fastdiv(uint32_t d) {
  uint32_t shift = 0;
  while ((uint64_t(1) << shift) < d) ++shift;
  const uint64_t mul = ((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1;
  return {uint32_t(mul), shift};
}

EPILOG_HD inline int fast_div(int n, FastDiv d) {
  const uint32_t u = uint32_t(n);
#ifdef __CUDA_ARCH__
  const uint32_t hi = __umulhi(u, d.mul);
#else
  const uint32_t hi = uint32_t((uint64_t(u) * d.mul) >> 32);
#endif
  return int((hi + u) >> d.shift);
}

// num / (1 + e^-v). On the GPU through the exp2 and reciprocal units (ex2.approx, __fdividef):
// an accurate expf and an IEEE division cost about four times the instructions, which dominated
// the epilogue of memory-bound layers. The error stays within 3e-6 of the result for |v| <= 20
// (ex2.approx: 2 + 1.2|v| ulp as __expf; the result's relative error is e^-v's times
// e^-v / (1 + e^-v)) and below 1e-7 in absolute terms beyond, well inside the 1e-5 the CUDA
// kernels are tested to. The .ftz form skips __expf's rescaling of results below 2^-126, three
// instructions an output: flushed to 0 they leave 1 + e^-v == 1 all the same.
EPILOG_HD inline float logistic_ratio(float num, float v) {
#ifdef __CUDA_ARCH__
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(v * -1.44269504f));
  return __fdividef(num, 1.0f + e);
#else
  return num / (1.0f + std::exp(-v));
#endif
}

// GELU, erf form: ConvNeXt's and the transformers' MLPs.
EPILOG_HD inline float gelu_erf(float v) {
  return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
}

// The activations past the common four. On the GPU one out-of-line copy per file: inlined, their
// 16 cases (erff, tanhf, powf, ...) at each of a kernel's unrolled epilogue sites made its code
// and compile time grow many times over, for activations few layers use.
EPILOG_HD inline float activate_rare(const Act& act, float v) {
  switch (act.kind) {
    case Activation::Clip:
      return fminf(fmaxf(v, act.a), act.b);
    case Activation::LeakyRelu:
      return v >= 0.0f ? v : act.a * v;
    case Activation::HardSigmoid:
      return fminf(fmaxf(act.a * v + act.b, 0.0f), 1.0f);
    case Activation::HardSwish:
      return v * fminf(fmaxf(v + 3.0f, 0.0f), 6.0f) * (1.0f / 6.0f);
    case Activation::Tanh:
      return tanhf(v);
    case Activation::Gelu:
      return gelu_erf(v);
    case Activation::GeluTanh:
      return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    case Activation::Mish:
      // softplus without overflow: for large v, log1p(e^v) == v in float.
      return v * tanhf(v > 20.0f ? v : log1pf(expf(v)));
    case Activation::Softplus:
      return v > 20.0f ? v : log1pf(expf(v));
    case Activation::Elu:
      return v > 0.0f ? v : act.a * expm1f(v);
    case Activation::Exp:
      return expf(v);
    case Activation::Erf:
      return erff(v);
    case Activation::Sqrt:
      return sqrtf(v);
    case Activation::Reciprocal:
      return 1.0f / v;
    case Activation::Neg:
      return -v;
    case Activation::Abs:
      return fabsf(v);
    case Activation::Log:
      return logf(v);
    case Activation::Pow:
      return act.a == 2.0f ? v * v : powf(v, act.a);
    default:
      break;
  }
  return v;
}

#ifdef __CUDA_ARCH__
static __device__ __noinline__ float activate_rare_call(Act act, float v) {
  return activate_rare(act, v);
}
#endif

// An activation (graph/pointwise.h Act) on one value: the CPU kernels and every CUDA epilogue
// apply them through this one function.
EPILOG_HD inline float activate(const Act& act, float v) {
  switch (act.kind) {
    case Activation::None:
      return v;
    case Activation::Silu:
      return logistic_ratio(v, v);
    case Activation::Relu:
      return v > 0.0f ? v : 0.0f;
    case Activation::Sigmoid:
      return logistic_ratio(1.0f, v);
    default:
#ifdef __CUDA_ARCH__
      return activate_rare_call(act, v);
#else
      return activate_rare(act, v);
#endif
  }
}

// activate() for any kind but none, silu and relu, which the CUDA epilogues compile apart
// (cuda::detail::with_activation): the shared copy's code an output is then sigmoid, gelu and a
// call. GELU inline: ConvNeXt's 1x1s end in it, and the call made one 36% slower.
// perf-history: "GELU inline in the shared epilogue".
EPILOG_HD inline float activate_other(const Act& act, float v) {
  if (act.kind == Activation::Sigmoid) return logistic_ratio(1.0f, v);
  if (act.kind == Activation::Gelu) return gelu_erf(v);
#ifdef __CUDA_ARCH__
  return activate_rare_call(act, v);
#else
  return activate_rare(act, v);
#endif
}

// -- fused_elementwise (graph/pointwise.h ChainProgram): the CPU and CUDA kernels take the
// steps through chain_step --
EPILOG_HD inline float chain_step(const ChainStep& s, float v, float x) {
  if (s.operand < 0) return activate(s.act, v);
  return s.swap ? binary_apply(s.op, x, v) : binary_apply(s.op, v, x);
}

// What both kernels walk: the output's dims, outermost first, with each input's and the
// output's element strides (0 where an input broadcasts); input k's element at index (i_0, ...)
// is x_k[sum_d i_d * stride[k][d]]. Size-1 dims are dropped and neighbours every tensor steps
// through as one dim merged, so [N,C,H,W] * [N,C,1,1] runs as [N*C, H*W]; at least one dim.
struct ChainShape {
  int rank = 0, inputs = 0;
  int64_t size[kMaxChainRank] = {};
  int64_t stride[kMaxChainInputs][kMaxChainRank] = {};
  int64_t y_stride[kMaxChainRank] = {};
};

// fused_conv2d's epilogue around its residual r: y = act(v + r) where the residual comes before
// the activation (ResNet's relu(bn(conv) + x)), else act(v) + r (C2f's x + silu(bn(conv))). A
// kernel applies `pre` where it finishes an accumulator and `post` where it adds the residual.
struct ResidualActs {
  Act pre, post;
};
inline ResidualActs split_residual_act(const Act& act, bool has_residual, bool residual_first) {
  if (has_residual && residual_first) return {Act{}, act};
  return {act, Act{}};
}

// Whether a conv kernel can run a shape at all: scalar runs everything; tiled and gemm need
// groups == 1 (a block's output channels share one input tile); gemv only a linear layer: a 1x1
// conv over a 1x1 plane, unpadded, stride 1.
inline bool conv_supports(ConvKernel kernel, const ConvShape& s) {
  if (kernel == ConvKernel::Gemv)
    return s.groups == 1 && s.r == 1 && s.s == 1 && s.h == 1 && s.w == 1 && s.ho == 1 &&
           s.wo == 1 && s.pad_t == 0 && s.pad_l == 0;
  return kernel == ConvKernel::Scalar || s.groups == 1;
}

// conv_scalar's stem path (conv_scalar.cu): a dense 3x3 window, dilation 1, stride 1 or 2
// across, over at most kStemMaxCin input channels into at most kStemMaxCout output channels -
// the first layer of an image network, whose reduction (27 for RGB) is too shallow for gemm's
// tiles. Its thread items are kStemItemOutputs consecutive outputs along a row, all channels.
constexpr int kStemMaxCin = 4, kStemMaxCout = 16, kStemItemOutputs = 4;
// Threads per block of conv_scalar's general and stem kernels.
constexpr int kScalarThreads = 256;
inline bool conv_scalar_stem_fits(const ConvShape& s) {
  return s.groups == 1 && s.r == 3 && s.s == 3 && s.c <= kStemMaxCin && s.k <= kStemMaxCout &&
         s.dil_h == 1 && s.dil_w == 1 && (s.stride_w == 1 || s.stride_w == 2);
}
// Thread items of the stem path; of the grouped path below, one group's channel chunk's.
inline int64_t conv_scalar_stem_items(const ConvShape& s) {
  return s.n * s.ho * ((s.wo + kStemItemOutputs - 1) / kStemItemOutputs);
}
// Its grouped path: the same kernel on grouped convs (1 < groups < C; depthwise has a path of its
// own) with that window, over a group's at most kGroupedMaxCin input channels (RegNet's and
// ResNeXt's groups read 4 to 64), a block on kc of one group's output channels: the most of 16,
// 8 and 4 whose grid holds kGroupedMinItems thread items. Where even 4 leaves fewer (RegNet at
// batch 1), the general kernel's one output a thread, more threads on shorter chains, wins:
// regnet_y_400mf at batch 1 0.475 -> 0.572 ms with every group on this path (H100), at batch 16
// 1.686 -> 1.103. conv_scalar_grouped_channels: kc, or 0 where the path does not take the shape.
constexpr int kGroupedMaxCin = 64;
constexpr int64_t kGroupedMinItems = 16384;
inline int conv_scalar_grouped_channels(const ConvShape& s) {
  if (s.groups <= 1 || s.groups >= s.c || s.c / s.groups > kGroupedMaxCin || s.r != 3 ||
      s.s != 3 || s.dil_h != 1 || s.dil_w != 1 || (s.stride_w != 1 && s.stride_w != 2))
    return 0;
  const int64_t items = conv_scalar_stem_items(s) * s.groups, kg = s.k / s.groups;
  for (int kc : {kStemMaxCout, 8, 4})
    if (items * ((kg + kc - 1) / kc) >= kGroupedMinItems) return kc;
  return 0;
}
// A grouped-path block's output channels: kc, or the group's where it has fewer; 0 off the path.
inline int conv_scalar_grouped_block(const ConvShape& s) {
  const int kc = conv_scalar_grouped_channels(s);
  return kc ? int(std::min<int64_t>(s.k / s.groups, kc)) : 0;
}

// gemm's stem kernel (conv_gemm_stem.cu) takes those shapes with the same stride both ways,
// staging the whole reduction, up to 4 channels x 9 taps, at once: its tiles have k = kGemmStemK.
constexpr int kGemmStemK = kStemMaxCin * 9;
// Its tiles are kGemmStemCols output columns wide, and kGemmStemBlocksPerSm of its 256-thread
// blocks share an SM (its launch bounds, 80 registers): lowering sizes its tiles by both.
constexpr int kGemmStemCols = 64, kGemmStemBlocksPerSm = 3;
inline bool conv_gemm_stem_fits(const ConvShape& s) {
  return conv_scalar_stem_fits(s) && s.stride_h == s.stride_w;
}

// The shapes gemm's 3x3 "halo" kernel takes (ConvTiles::k == 72, conv_gemm.cu): a dense 3x3
// window, dilation 1, the same stride 1 or 2 both ways. It stages the input patch under an 8x8
// square of outputs once for all nine taps instead of gathering each tap.
inline bool conv_gemm_halo_fits(const ConvShape& s) {
  return s.groups == 1 && s.r == 3 && s.s == 3 && s.dil_h == 1 && s.dil_w == 1 &&
         s.stride_h == s.stride_w && (s.stride_h == 1 || s.stride_h == 2);
}

// gemm's persistent halo kernel (conv_halo_persistent.cu): a 3x3 conv at stride 1, dilation 1,
// groups 1, over at most kPersistentMaxCin channels into at most kPersistentMaxCout, one 8x8 output
// square after another a block, its weights loaded once (at least one input channel: its
// launcher sizes shared memory by the stages).
constexpr int kPersistentMaxCin = 32, kPersistentMaxCout = 32;
inline bool halo_persistent_fits(const ConvShape& s) {
  return conv_gemm_halo_fits(s) && s.stride_h == 1 && s.c >= 1 && s.c <= kPersistentMaxCin &&
         s.k <= kPersistentMaxCout;
}

// gemm's conv pair kernel (conv_pair.cu): a stem conv A and the 3x3 conv B that alone reads
// its output, as one kernel that makes A's outputs where B's halo kernel would stage them (lowering
// folds A into B: FoldedConv). Both 3x3 at stride 2, dilation 1, groups 1, non-negative padding; A
// over at most kPairMaxCin channels into at most kPairMaxMid, B into at most kPairMaxCout.
constexpr int kPairMaxCin = 3, kPairMaxMid = 16, kPairMaxCout = 32;
inline bool conv_pair_fits(const ConvShape& a, const ConvShape& b) {
  const auto window = [](const ConvShape& s) {
    return s.groups == 1 && s.r == 3 && s.s == 3 && s.dil_h == 1 && s.dil_w == 1 &&
           s.stride_h == 2 && s.stride_w == 2 && s.pad_t >= 0 && s.pad_l >= 0;
  };
  return window(a) && window(b) && a.c <= kPairMaxCin && a.k <= kPairMaxMid &&
         b.k <= kPairMaxCout && b.n == a.n && b.c == a.k && b.h == a.ho && b.w == a.wo;
}

// The wgmma kernels' shared memory ends in one 8-byte mbarrier for each of up to 4 stages, on
// which the stage's weights' bulk copy completes.
constexpr int64_t kWgmmaBarrierBytes = 8 * 4;

// -- gemm's halo kernel on warpgroup MMA (ConvTiles::wgmma, conv_gemm_wgmma.cuh) --
// Whether its tiles of n channels take A from registers (read straight from the staged patches)
// rather than from patches rewritten into shared memory: all but n = 32 with a residual (the
// measurements are in the kernel's header comment and at its residual fetch).
constexpr bool halo_wgmma_reg_a(int n, bool residual) {
  return n >= 64 || n <= 16 || !residual;
}
// Its one-square tiles that stage the patch as wide rows (register A, stride 1, n >= 32; where
// the input rows are 16-byte aligned, conv_gemm picks them): each of the square's 10 input rows
// kHaloWideRow floats wide from the 16-byte boundary at or before its first column, copied in
// 16-byte chunks (five a row), a channel's 10 rows one plane of 200 floats (8 mod 32:
// conflict-free fragment loads), where the narrow rows take 4-byte copies, 25 a channel plane
// against 10 (perf-history: "wide patch rows"). Wider tiles read twice the columns their squares
// share and lost (tried: "wide rows on every tile"); n = 16's seven 64x16 blocks an SM would
// not fit.
constexpr int kHaloWideRow = 20;
constexpr bool halo_wgmma_wide(int m, int n, int stride, bool reg_a) {
  return reg_a && stride == 1 && m == 64 && n >= 32;
}
// Its shared memory for `stages` stages of m / 64 squares by n channels at stride `stride`: each
// stage holds the input patches (8 channel planes of kCS floats each per square, as the mma.sync
// halo kernel stages them, or 10 wide rows) and the stage's packed weights (72 n floats);
// besides, where A comes from shared memory, two buffers of the patches rewritten for the tensor
// cores (8 x kPos floats per square); then the stages' mbarriers.
constexpr int64_t halo_wgmma_smem_bytes(int m, int n, int stride, int stages, bool reg_a,
                                        bool wide = false) {
  const int64_t side = 7 * stride + 3, pos = side * side;
  const int64_t cs = wide ? 10 * kHaloWideRow : (pos + 23) / 32 * 32 + 8;
  const int64_t squares = m / 64;
  return 4 * (stages * (squares * 8 * cs + 72 * n) + (reg_a ? 0 : 2 * squares * 8 * pos)) +
         kWgmmaBarrierBytes;
}
// Its pipeline depth for those tiles, with or without a residual: 4 where they fit in the 227 KB
// a block may have, else 3 (every tile fits three: the kernel asserts it).
constexpr int halo_wgmma_max_stages(int m, int n, int stride) {
  return halo_wgmma_smem_bytes(m, n, stride, 4, halo_wgmma_reg_a(n, true)) <= 227 * 1024 ? 4 : 3;
}

// The shapes gemm's 1x1 "direct" kernels take (conv_gemm.cu): a 1x1 window, stride 1, no
// padding, a plane of a multiple of 4 pixels. A is then x itself, copied 4 pixels at a time.
inline bool conv_gemm_direct_fits(const ConvShape& s) {
  return s.groups == 1 && s.r == 1 && s.s == 1 && s.stride_h == 1 && s.stride_w == 1 &&
         s.pad_t == 0 && s.pad_l == 0 && s.ho == s.h && s.wo == s.w && (s.h * s.w) % 4 == 0;
}

// Which warpgroup-MMA kernel (ConvTiles::wgmma) runs tiles `t` on `s`: the halo kernel for
// k = 72 on its 3x3 shapes, the direct kernel for k = 32 on its 1x1 shapes, and for k = 32 on
// any other shape the same kernel gathering its A tiles as the mma.sync gather kernel does (on
// odd planes its epilogue places the two pixels of a pair apart). Where none takes a shape, wgmma
// tiles run the mma.sync kernels, and no packed weights are read.
enum class WgmmaKernel : uint8_t { None, Halo, Direct, Gather };
inline WgmmaKernel conv_gemm_wgmma_kernel(const ConvTiles& t, const ConvShape& s) {
  if (!t.wgmma || s.groups != 1) return WgmmaKernel::None;
  if (t.k == 72 && conv_gemm_halo_fits(s)) return WgmmaKernel::Halo;
  if (t.k == 32 && conv_gemm_direct_fits(s)) return WgmmaKernel::Direct;
  if (t.k == 32) return WgmmaKernel::Gather;
  return WgmmaKernel::None;
}

// Whether tiles `t` on `s` can read a run of the input's channels from a tensor upsampled
// (nearest) by scale_h x scale_w as they load it (conv_gemm's `up`): the wgmma direct kernel
// unsplit, with each 4-pixel chunk of A on one output row, and twice across, so that a chunk's
// sources are two neighbours, each copied twice off one address (the general form, an address a
// copy, made the folded convs of the YOLO-like model slower).
inline bool conv_gemm_upsample_fits(const ConvShape& s, const ConvTiles& t, int64_t scale_h,
                                    int64_t scale_w) {
  return conv_gemm_wgmma_kernel(t, s) == WgmmaKernel::Direct && t.splits == 1 && s.wo % 4 == 0 &&
         scale_w == 2 && scale_h >= 1 && s.ho % scale_h == 0;
}

// Whether the wgmma direct kernel, on tiles `t` unsplit, copies A by tensor copies (TMA: one
// thread issues a k tile's boxes of 32 pixels x 32 channels, landing 128-byte swizzled) rather
// than by every thread's 16-byte cp.async: where the reduction is at least kDirectTmaMinDepth
// deep and tiles of one image each pad its plane by at most kDirectTmaMaxPad of the padded plane
// (direct_tma_plane). Not under two k tiles: one leaves a tile's copies nothing to run under,
// and such layers got slower. perf-history: "tensor copies for the 1x1".
constexpr int64_t kDirectTmaMinDepth = 64;
// A box cannot straddle two images, so on a plane that is not a multiple of the tile's pixels
// each image gets its own tiles, the last one's rows past the plane zero-filled by the copies
// and never stored: wgmmas on nothing, but no bytes. Up to an eighth of padding: the YOLO-like
// model's 20x20 layers (400 pixels in 7 tiles of 64, 11%) got faster; more was measured only on
// small grids (even), which is no evidence for large ones, whose wgmmas the padding would slow:
// they keep cp.async. perf-history: "tensor copies on padded planes".
constexpr double kDirectTmaMaxPad = 0.125;
inline int64_t direct_tma_plane(const ConvShape& s, const ConvTiles& t) {
  return (s.h * s.w + t.m - 1) / t.m * t.m;
}
inline bool conv_gemm_direct_tma(const ConvShape& s, const ConvTiles& t) {
  return conv_gemm_wgmma_kernel(t, s) == WgmmaKernel::Direct && t.splits == 1 && t.m > 0 &&
         double(direct_tma_plane(s, t) - s.h * s.w) <= kDirectTmaMaxPad * direct_tma_plane(s, t) &&
         s.n * direct_tma_plane(s, t) <= INT32_MAX && s.c >= kDirectTmaMinDepth &&
         s.x_image() % 4 == 0;
}

// The weights as the wgmma kernels read them with tiles of t.n output channels, packed once ahead
// of the runs so that a block's stage is one contiguous run; 0 past Cout or Cin. Each value is
// rounded to TF32 (to nearest: half a TF32 ulp added to its bits; the tensor core ignores the
// low 13), as the mma.sync kernels round their operands on the fly.
// Halo: for each n tile nt, stage of 8 input channels kt, tap (i, j) and chunk of 4 channels,
// tc = 2 (3i + j) + chunk, n rows r of 4 floats:
//   P[(((nt * stages + kt) * 18 + tc) * n + r) * 4 + e] = w[nt n + r, 8kt + 4 chunk + e, i, j].
// Direct and Gather: over the reduction kk = (c * r + i) * s + j (the weight's own order; the
// input channel on 1x1 shapes), for each n tile nt, stage of 32 steps kt, k step q / 2 and half
// q % 2 of it, n rows r of 4 floats, the steps of a k step in the order the kernel's A fragments
// take them (column e of its first half is step 2e, of its second 2e + 1):
//   P[(((nt * stages + kt) * 8 + q) * n + r) * 4 + e] = w[nt n + r, 32kt + 8(q / 2) + 2e + q % 2].
// All are 0 floats where conv_gemm_wgmma_kernel(t, s) is None.
inline int64_t wgmma_packed_floats(const ConvShape& s, const ConvTiles& t) {
  const int64_t n_tiles = (s.k + t.n - 1) / t.n;
  switch (conv_gemm_wgmma_kernel(t, s)) {
    case WgmmaKernel::Halo:
      return n_tiles * t.n * ((s.c + 7) / 8) * 72;
    case WgmmaKernel::Direct:
    case WgmmaKernel::Gather:
      return n_tiles * t.n * ((s.c * s.r * s.s + 31) / 32) * 32;
    case WgmmaKernel::None:
      break;
  }
  return 0;
}
inline void pack_wgmma_weights(const ConvShape& s, const ConvTiles& t, const float* w, float* out) {
  const WgmmaKernel kernel = conv_gemm_wgmma_kernel(t, s);
  if (kernel == WgmmaKernel::None) return;
  const bool halo = kernel == WgmmaKernel::Halo;
  const int64_t n = t.n, tiles = (s.k + n - 1) / n;
  // Halo: stages of 8 input channels, 9 taps each; else stages of 32 steps of the reduction.
  const int64_t rows = halo ? s.c : s.c * s.r * s.s, taps = halo ? 9 : 1;
  const int64_t depth = halo ? 8 : 32, stages = (rows + depth - 1) / depth;
  const int64_t runs = halo ? 18 : 8;  // runs of n rows a stage
  for (int64_t nt = 0; nt < tiles; ++nt)
    for (int64_t kt = 0; kt < stages; ++kt)
      for (int64_t q = 0; q < runs; ++q)
        for (int64_t r = 0; r < n; ++r)
          for (int64_t e = 0; e < 4; ++e) {
            const int64_t k = nt * n + r, tap = halo ? q >> 1 : 0;
            const int64_t c =
                halo ? 8 * kt + 4 * (q & 1) + e : 32 * kt + 8 * (q >> 1) + 2 * e + (q & 1);
            float v = k < s.k && c < rows ? w[(k * rows + c) * taps + tap] : 0.0f;
            uint32_t bits;
            std::memcpy(&bits, &v, 4);
            bits += 0x1000u;
            std::memcpy(&v, &bits, 4);
            out[(((nt * stages + kt) * runs + q) * n + r) * 4 + e] = v;
          }
}

// gemm's conv chain (cuda::conv_chain): a 3x3 conv A on the wgmma halo kernel, unsplit, whose
// tiles hold all kChainC of its output channels, and the 1x1 conv B that alone reads its output
// (kChainC -> kChainC channels, stride 1, no padding), as one kernel: A's accumulators, through
// A's epilogue, are the A operand of B's MMAs, and A's outputs are never stored (lowering folds
// B into A: NodePlan::post). Why: the YOLO-like backbone's stride-2 convs are each read only by
// the next C2f block's first 1x1 conv, which reads back whole what they wrote (b3 -> b4.cv1,
// 64 channels at 80x80: 18.1 us for the 1x1 at batch 16, Nsight Compute).
constexpr int kChainC = 64;
inline bool conv_chain_fits(const ConvShape& a, const ConvTiles& t, const ConvShape& b) {
  return conv_gemm_wgmma_kernel(t, a) == WgmmaKernel::Halo && (t.m == 64 || t.m == 128) &&
         t.n == kChainC && t.splits == 1 && a.k == kChainC && b.groups == 1 && b.r == 1 &&
         b.s == 1 && b.stride_h == 1 && b.stride_w == 1 && b.pad_t == 0 && b.pad_l == 0 &&
         b.n == a.n && b.c == a.k && b.h == a.ho && b.w == a.wo && b.ho == b.h && b.wo == b.w &&
         b.k == kChainC;
}
// The floats conv_chain reads after A's packed weights (pack_wgmma_weights): B's weights, then
// B's scale and shift. B's are packed as the wgmma direct kernel takes a 1x1 conv's on 64-channel
// tiles: k step j of its A operand holds input channels 8j + 2e at column e and 8j + 2e + 1 at
// column 4 + e, which is where A's accumulators hold them (channels 8j + 2t and 8j + 2t + 1 of a
// lane's pixels), so they go to B's MMAs as they are.
constexpr int64_t kChainTailFloats = int64_t(kChainC) * kChainC + 2 * kChainC;
inline ConvTiles conv_chain_b_tiles() {
  return {64, kChainC, 32, 3, 1, true};
}
inline void pack_conv_chain(const ConvShape& b, const float* w, const float* scale,
                            const float* shift, float* out) {
  // On a plane the direct kernel takes (a multiple of 4 pixels), whatever B's: the packing does
  // not depend on it, and pack_wgmma_weights packs nothing for tiles no wgmma kernel takes.
  ConvShape one = b;
  one.h = one.ho = 1;
  one.w = one.wo = 4;
  pack_wgmma_weights(one, conv_chain_b_tiles(), w, out);
  for (int64_t c = 0; c < kChainC; ++c) {
    out[kChainC * kChainC + c] = scale ? scale[c] : 1.0f;
    out[kChainC * kChainC + kChainC + c] = shift ? shift[c] : 0.0f;
  }
}

// NCHW pooling window geometry; padding is top, left, bottom, right.
struct PoolShape {
  int64_t n, c, h, w, ho, wo;
  int64_t kh, kw, stride_h, stride_w;
  int64_t pad_t, pad_l, pad_b, pad_r;
  bool count_include_pad;  // avgpool: padding counts in the divisor
  // Elements between consecutive images of x and of y, as in ConvShape (max-pooling only).
  int64_t x_stride = 0, y_stride = 0;

  int64_t x_image() const { return x_stride ? x_stride : c * h * w; }
  int64_t y_image() const { return y_stride ? y_stride : c * ho * wo; }
};

// -- maxpool2d's CUDA kernels (kernels/cuda/pool.cu), and which one runs a pool --
// A block stages a plane and its row maxima in shared memory up to this many floats (48 KB,
// no opt-in needed).
constexpr int64_t kPoolPlaneFloats = 12 * 1024;
enum class MaxPoolKernel {
  Same,    // 3x3 or 5x5 at stride 1 padded by half the window all round (SPPF's 5x5): the
           // plane and its row maxima staged with -inf borders, unrolled windows
  Plane,   // any other window over a plane that fits: clipped windows over the staged plane
  Window,  // one output a thread, its window's loads clipped to the input
};
// The floats a block of the plane kernel stages: the plane and its row maxima.
inline int64_t maxpool_plane_floats(const PoolShape& p) {
  return p.h * p.w + p.h * p.wo;
}
// ...and of the "same" kernel: both with kh / 2 of -inf padding either side.
inline int64_t maxpool_same_floats(const PoolShape& p) {
  const int64_t pad = p.kh / 2;
  return p.h * (p.w + 2 * pad) + (p.h + 2 * pad) * p.w;
}
// SPPF's cascade: up to this many "same" max-pools in a row, each pooling the one before, run as
// one kernel over the staged plane (cuda::maxpool2d_chain; lowering chains them).
constexpr int kMaxPoolChain = 3;
inline MaxPoolKernel maxpool_kernel(const PoolShape& p) {
  const int64_t k = p.kh, pad = k / 2;
  const bool same = p.kw == k && (k == 3 || k == 5) && p.stride_h == 1 && p.stride_w == 1 &&
                    p.pad_t == pad && p.pad_b == pad && p.pad_l == pad && p.pad_r == pad;
  if (same && maxpool_same_floats(p) <= kPoolPlaneFloats) return MaxPoolKernel::Same;
  return maxpool_plane_floats(p) <= kPoolPlaneFloats ? MaxPoolKernel::Plane : MaxPoolKernel::Window;
}

}  // namespace epilog
