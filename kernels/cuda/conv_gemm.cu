// fused_conv2d as an implicit GEMM on the tensor cores (TF32 mma.sync, float32 accumulation).
//
// Math: y[img, k, oh, ow] = act(acc * scale[k] + shift[k]) (+ residual[img, k, oh, ow]) with
//   acc = sum_{c, i, j} x[img, c, oh*sh - pad_t + i*dh, ow*sw - pad_l + j*dw] * w[k, c, i, j]
// (x outside the input reads 0; scale == nullptr means 1, shift == nullptr means 0).
// GEMM view: C[M, N] = A[M, K] * B[K, N] with M = n*ho*wo output pixels, N = Cout,
// K = Cin*r*s in the weight's own order kk = (c*r + i)*s + j;
//   A[m, kk] = the input under pixel m for tap kk (gathered on the fly, never materialized),
//   B[kk, n] = w[n, kk] (the weight as stored is B column-major: K contiguous),
//   C[m, n]  -> y[img, n, pixel]: for a fixed n, consecutive m of one image are contiguous.
// Layout: float32, NCHW x [n, Cin, h, w], weight [Cout, Cin, r, s], y [n, Cout, ho, wo].
// Images of x and y lie ConvShape::x_image() / y_image() floats apart (more than an image when
// x or y is a channel slab of a larger batch); within an image everything is contiguous.
//
// Three kernels; ConvTiles {m, n, k, stages, splits} picks one:
//   k = 72  halo   3x3, stride 1 or 2 (the same both ways), dilation 1, any padding
//                  (conv_gemm_halo.cuh): m in {64, 128, 256} output pixels (1, 2 or 4 squares
//                  of 8x8), n in {32, 64, 128}. On any other shape k = 72 runs the k = 32
//                  kernels below with the same n (32 for 16) and m capped at 128. With
//                  `wgmma` the same tiles, and n = 16 too, on Hopper's warpgroup MMA
//                  (conv_gemm_wgmma.cuh; sm_90a builds on a compute capability 9.0 GPU),
//                  reading the weights packed ahead of the run (pack_wgmma_weights); stages 3
//                  or 4; at m = 64 splits > 1 runs it split-K over its 8-channel stages as the
//                  gather kernel below does. conv_chain runs its m in {64, 128}, n = 64 tiles
//                  with the 1x1 conv that alone reads the output on their accumulators
//                  (chain_epilogue, conv_gemm_wgmma.cuh).
//   k = 32  direct 1x1, stride 1, no padding, ho*wo % 4 == 0, x 16-byte aligned: persistent.
//                  With `wgmma` (m in {64, 128}, no splits) the same on warpgroup MMA
//                  (conv_gemm_direct_wgmma.cu), reading the weights packed ahead; on any
//                  other shape (groups 1) they run it with gathered A tiles (Gather). With
//                  `up` (an upsample_nearest
//                  folded into the conv, ConvUpsampledInput) the wgmma one reads those
//                  channels from the upsampling's source (DirectUpA); without, it copies A
//                  by tensor copies where conv_gemm_direct_tma admits it (tiles of one image
//                  each).
//   k = 32  gather everything else.
//   k = 36  stem   3x3 over at most 4 channels into at most 16, the same stride 1 or 2 both
//                  ways (conv_gemm_stem_fits): m in {128, 256, 512} (m / 64 output rows
//                  of 64 columns), n = 16, persistent (conv_gemm_stem.cu). On any other shape
//                  these tiles run the gather kernel at 128x32 in 2 stages.
//   k = 32 takes m, n in {32, 64, 128}. stages in {2, 3, 4} is the depth of the cp.async pipeline
//   (gather and halo use fewer when the reduction has fewer steps, halo when shared memory holds
//   fewer; the direct kernel's pipeline runs on from one tile into the next). splits > 1
//   (Hopper) runs the gather kernel as split-K, also on 1x1 shapes (conv_gemm_k32.cuh).
//   All three are launched with programmatic dependent launch (launch_pdl, launch.cuh).
//
// TF32 (all kernels): each operand is rounded to nearest as it leaves shared memory by adding
// half a TF32 ulp to its bits (one integer add, see to_tf32), the tensor core then dropping the
// low 13 bits; this is cvt.rna for finite values at half its cost. Error per operand <= 2^-11
// relative, unbiased.
//
// Which kernel runs, and with how many stages and splits, is conv_gemm_launch's answer
// (kernels/launch.h), which explain prints: conv_gemm follows it and logs the launch
// (runtime/launch_log.h), and the launchers below run what it says or throw.
//
// Restrictions: groups == 1; the tiles above; x, y and w must each span fewer than 2^31
// elements; h, w, ho*stride_h, wo*stride_w, the (non-negative) padding and the dilated window
// stay under 2^28.
// The caller precomputes nothing: no workspace, no setup beyond the pointers (the direct kernel
// asks the runtime once per device and depth how many blocks fit). splits in {1, 2, 4, 8}.
#include <cstdint>
#include <initializer_list>
#include <string>

#include <cuda_runtime.h>

#include "conv_gemm_halo.cuh"
#include "conv_gemm_k32.cuh"
#include "epilog/kernels/cuda.h"
#include "epilog/kernels/launch.h"

namespace epilog::cuda {

using namespace conv_gemm_detail;
static_assert(kBK == kGemmK && kHaloK == kGemmHaloK, "launch.h names these tiles");

namespace conv_gemm_detail {
// conv_gemm_stem.cu.
void launch_stem_mma(const ConvShape& s, const ConvTiles& t, const float* x, const float* w,
                     const float* scale, const float* shift, Act act, float* y,
                     const ConvResidual& residual, Stream stream);
// conv_halo_persistent.cu: tiles of n in {16, 32} channels, a the wgmma halo kernel's arguments.
void launch_halo_persistent(const HaloArgs& a, int n, Stream stream);
// conv_gemm_halo_s1.cu and conv_gemm_halo_s2.cu build these (conv_gemm_halo_launch.cuh).
template <int S>
void dispatch_halo(const GemmLaunch& l, const HaloArgs& a, Stream stream);
template <int S>
void launch_chain(const HaloArgs& a, int m, bool wide, Stream stream);
}  // namespace conv_gemm_detail

namespace {

std::string tiles_str(const ConvTiles& t) {
  return "m=" + std::to_string(t.m) + " n=" + std::to_string(t.n) + " k=" + std::to_string(t.k) +
         " stages=" + std::to_string(t.stages) + " splits=" + std::to_string(t.splits) +
         (t.wgmma ? " wgmma" : "") + (t.persistent ? " persistent" : "");
}

// What every conv_gemm path needs of a shape: x, y, the residual and w index in 32 bits, and
// the plane, padding and window in 28.
void check_ranges(const ConvShape& s) {
  constexpr int64_t kSmall = int64_t(1) << 28;
  if (s.n * s.x_image() >= INT32_MAX || s.n * s.y_image() >= INT32_MAX ||
      s.n * s.r_image() >= INT32_MAX || s.k * s.c * s.r * s.s >= INT32_MAX)
    reject("x, y and w must each span fewer than 2^31 elements");
  if (s.h >= kSmall || s.w >= kSmall || s.ho * s.stride_h >= kSmall ||
      s.wo * s.stride_w >= kSmall || s.pad_t < 0 || s.pad_l < 0 || s.pad_t >= kSmall ||
      s.pad_l >= kSmall || (s.r - 1) * s.dil_h >= kSmall || (s.s - 1) * s.dil_w >= kSmall)
    reject("plane, padding or window out of range");
}

// The halo kernels' arguments for a launch conv_gemm_launch made on a shape
// conv_gemm_halo_fits takes: its stages and splits as it sized them.
HaloArgs halo_args(const ConvShape& s, const ConvTiles& tiles, const float* x, const float* w,
                   const float* scale, const float* shift, Act act, float* y,
                   const ConvResidual& residual, const float* packed) {
  HaloArgs a{};
  a.x = x;
  a.wt = w;
  a.scale = scale;
  a.shift = shift;
  a.y = y;
  if (!set_halo_geometry(a, s, tiles.n)) reject("too many output squares");
  a.ctiles = int((s.c + kHaloC - 1) / kHaloC);
  a.stages = tiles.stages;
  a.splits = tiles.splits;
  if (a.splits < 1 || (a.splits > 1 && a.splits > a.ctiles))
    reject("splits=" + std::to_string(a.splits) + " over " + std::to_string(a.ctiles) + " stages");
  if (tiles.wgmma) a.wp = packed;
  a.vec_b = s.c % 4 == 0 && aligned16(w);
  a.res = residual.x, a.r_img = int(s.r_image());
  a.act = act, a.res_act = residual.post;
  return a;
}

}  // namespace

bool wgmma_available() {
#ifdef EPILOG_WGMMA
  // sm_90a code runs on compute capability 9.0 only. Read once, as device_sm90 (launch.cuh).
  static const bool available = [] {
    int device = 0, major = 0, minor = 0;
    EPILOG_CUDA_CHECK(cudaGetDevice(&device));
    EPILOG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    EPILOG_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return major == 9 && minor == 0;
  }();
  return available;
#else
  return false;
#endif
}

void conv_gemm(const ConvShape& s, const ConvTiles& tiles, const float* x, const float* w,
               const float* scale, const float* shift, Act act, float* y, Stream stream,
               ConvResidual residual, const float* packed, const ConvUpsampledInput* up,
               const ConvPrologue* pro) {
  if (s.groups != 1) reject("groups must be 1, got " + std::to_string(s.groups));
  const auto in = [](int v, std::initializer_list<int> set) {
    for (int e : set)
      if (v == e) return true;
    return false;
  };
  const bool stages_ok = tiles.stages >= 2 && tiles.stages <= 4;
  const bool gemm_ok = tiles.k == kBK && in(tiles.m, {32, 64, 128}) && in(tiles.n, {32, 64, 128}) &&
                       in(tiles.splits, {1, 2, 4, 8}) && (!tiles.wgmma || tiles.m >= 64);
  const bool halo_ok =
      tiles.k == kHaloK && in(tiles.m, {64, 128, 256}) &&
      (in(tiles.n, {32, 64, 128}) || (tiles.wgmma && tiles.n == 16)) &&
      (tiles.splits == 1 || (tiles.wgmma && tiles.m == 64 && in(tiles.splits, {2, 4, 8})));
  const bool stem_ok = tiles.k == kGemmStemK && in(tiles.m, {128, 256, 512}) && tiles.n == 16 &&
                       tiles.splits == 1 && !tiles.wgmma;
  if (tiles.wgmma && !wgmma_available())
    reject(
        "the wgmma kernels need a compute capability 9.0 GPU and a build with sm_90a code "
        "(EPILOG_CUDA_ARCH=90a)");
  const bool persistent_ok = !tiles.persistent || (halo_ok && tiles.wgmma && tiles.m == 64 &&
                                                   in(tiles.n, {16, 32}) && tiles.splits == 1);
  if (!persistent_ok || (!stem_ok && (!stages_ok || !(gemm_ok || halo_ok))))
    reject("unsupported tiles " + tiles_str(tiles) +
           " (k = 32 with m, n in {32, 64, 128} and splits in {1, 2, 4, 8}, with wgmma m >= 64; "
           "k = 72 with m in {64, 128, 256}, n in {32, 64, 128} and no splits, "
           "with wgmma also n = 16 and at m = 64 splits in {1, 2, 4, 8}; stages in {2, 3, 4}; "
           "or k = 36, m in {128, 256, 512}, n = 16, no splits, no wgmma; persistent: wgmma "
           "k = 72, m = 64, n in {16, 32}, no splits)");
  if (up && !conv_gemm_upsample_fits(s, tiles, up->scale_h, up->scale_w))
    reject(
        "an upsampled input needs tiles that run the wgmma direct kernel unsplit, a scale of 2 "
        "across, wo % 4 == 0 and ho a multiple of the scale down; got " +
        tiles_str(tiles) + " on " + std::to_string(s.ho) + "x" + std::to_string(s.wo) +
        ", scales " + std::to_string(up->scale_h) + "x" + std::to_string(up->scale_w));
  if (conv_gemm_wgmma_kernel(tiles, s) != WgmmaKernel::None) {
    if (!packed)
      reject("the wgmma kernels read the weights packed ahead (pack_wgmma_weights), got none");
    if (wgmma_packed_floats(s, tiles) >= INT32_MAX)
      reject("packed weights span 2^31 floats or more");
    if (!aligned16(packed)) reject("packed weights must be 16-byte aligned (bulk copies)");
  }
  const int64_t m = s.n * s.ho * s.wo, kg = s.c * s.r * s.s;
  if (m == 0 || s.k == 0) return;
  check_ranges(s);

  // What runs: conv_gemm_launch's answer, as explain prints it.
  const GemmLaunch l = conv_gemm_launch(
      s, tiles, {aligned16(x), residual.x != nullptr, up != nullptr, pro != nullptr});
  const ConvTiles& t = l.tiles;
  if (t.splits > 1 && !detail::device_sm90())
    reject("splits=" + std::to_string(t.splits) +
           " needs thread-block clusters (compute capability 9.0 or later)");
  if (l.path == GemmPath::Stem)
    return launch_stem_mma(s, t, x, w, scale, shift, act, y, residual, stream);

  // -- the 3x3 halo kernel --
  if (l.path == GemmPath::Halo) {
    const HaloArgs a = halo_args(s, t, x, w, scale, shift, act, y, residual, packed);
    if (t.persistent) return launch_halo_persistent(a, t.n, stream);
    return s.stride_h == 1 ? dispatch_halo<1>(l, a, stream) : dispatch_halo<2>(l, a, stream);
  }
  // -- the k = 32 kernels: direct or gather --
  const bool direct = l.path == GemmPath::Direct;
  if (up && !direct) reject("an upsampled input needs a 16-byte aligned x");
  if (pro && !(direct && t.wgmma && t.splits == 1 && !up))
    reject("a prologue runs on the wgmma direct kernel alone, unsplit, on a 16-byte aligned x; "
           "got " + gemm_launch_str(l));
  if (pro && pro->act.kind != Activation::None && pro->act.kind != Activation::Relu)
    reject("a prologue's activation is relu or none");
  if (l.tma && !(direct && t.wgmma)) reject("tensor copies on another kernel than wgmma's direct");

  GemmArgs a{};
  a.x = x;
  a.wt = w;
  a.scale = scale;
  a.shift = shift;
  a.y = y;
  a.c = int(s.c), a.h = int(s.h), a.w = int(s.w);
  a.k = int(s.k), a.ho = int(s.ho), a.wo = int(s.wo);
  a.s = int(s.s);
  a.rs = int(s.r * s.s);
  a.sh = int(s.stride_h), a.sw = int(s.stride_w);
  a.pt = int(s.pad_t), a.pl = int(s.pad_l);
  a.dh = int(s.dil_h), a.dw = int(s.dil_w);
  a.m = int(m);
  a.kg = int(kg);
  a.n_tiles = int((s.k + t.n - 1) / t.n);
  // Split j of a tile takes k tiles [j * ktiles / splits, (j + 1) * ktiles / splits): none is
  // empty while splits <= ktiles (conv_gemm_launch halves them to that). The gather kernel runs
  // at most its k tiles + 1 stages: more would only hold nothing, its prologue already loads
  // them all. The persistent kernels' pipeline runs on into the next tile.
  a.ktiles = int((kg + kBK - 1) / kBK);
  a.splits = t.splits;
  a.stages = t.stages;
  if (a.splits < 1 || a.splits > a.ktiles || a.stages < 2 || a.stages > 4)
    reject("k = 32 tiles in " + std::to_string(a.stages) + " stages and " +
           std::to_string(a.splits) + " splits over " + std::to_string(a.ktiles) + " k tiles");
  a.div_rs = make_fastdiv(uint32_t(s.r * s.s));
  a.div_s = make_fastdiv(uint32_t(s.s));
  a.vec_b = kg % 4 == 0 && aligned16(w);
  a.vec_y = (s.ho * s.wo) % 4 == 0 && aligned16(y);
  a.vec2_y = (s.ho * s.wo) % 2 == 0 && reinterpret_cast<uintptr_t>(y) % 8 == 0;
  a.xs = int(s.x_image()), a.ys = int(s.y_image());
  a.res = residual.x, a.r_img = int(s.r_image());
  a.vec_r = a.vec_y && s.r_image() % 4 == 0 && aligned16(a.res);
  a.vec2_r = a.vec2_y && s.r_image() % 2 == 0 && reinterpret_cast<uintptr_t>(a.res) % 8 == 0;
  a.act = act, a.res_act = residual.post;

  if (up) {
    const int64_t up_hw = (s.ho / up->scale_h) * (s.wo / up->scale_w);
    if (up->c0 < 0 || up->channels < 1 || up->c0 + up->channels > s.c ||
        up->image < up->channels * up_hw || s.n * up->image >= INT32_MAX)
      reject("upsampled input: channels " + std::to_string(up->c0) + " + " +
             std::to_string(up->channels) + " of " + std::to_string(s.c) + ", images " +
             std::to_string(up->image) + " apart");
    a.up_x = up->x;
    a.up_c0 = int(up->c0), a.up_c = int(up->channels);
    a.up_sh = int(up->scale_h);
    a.up_w = int(s.wo / up->scale_w), a.up_hw = int(up_hw), a.up_xs = int(up->image);
  }
  if (t.wgmma) {
    a.wp = packed;
    a.tma = l.tma;
    if (a.tma) {
      // Tiles of one image each: m counts the padded planes.
      a.plane = int(direct_tma_plane(s, t));
      a.m = int(s.n) * a.plane;
    }
    if (pro) {
      a.pro_scale = pro->scale, a.pro_shift = pro->shift;
      a.pro_relu = pro->act.kind == Activation::Relu;
    }
    return launch_k32_wgmma(a, t, !direct, up != nullptr, pro != nullptr, stream);
  }
  launch_k32(a, t, direct, stream);
}

void conv_chain(const ConvShape& sa, const ConvTiles& t, const ConvShape& sb, const float* x,
                const float* scale_a, const float* shift_a, Act act_a, const float* packed,
                Act act_b, float* y, Stream stream) {
  if (!conv_chain_fits(sa, t, sb))
    reject("a conv chain takes a 3x3 conv on wgmma halo tiles of 64 or 128 pixels by " +
           std::to_string(kChainC) + " channels, unsplit, into " + std::to_string(kChainC) +
           " channels, then a 1x1 conv of its output into as many, stride 1, no padding; got " +
           tiles_str(t) + ", " + std::to_string(sa.k) + " then " + std::to_string(sb.k) +
           " channels");
  if (!wgmma_available())
    reject(
        "a conv chain needs a compute capability 9.0 GPU and a build with sm_90a code "
        "(EPILOG_CUDA_ARCH=90a)");
  if (!packed || !aligned16(packed))
    reject(
        "a conv chain reads its weights packed (pack_wgmma_weights, then pack_conv_chain), "
        "16-byte aligned");
  if (sa.n * sa.ho * sa.wo == 0) return;
  ConvShape s = sa;
  s.y_stride = sb.y_image();  // A's tiles store B's outputs
  check_ranges(s);
  // A's launch as conv_gemm_launch sizes it (stages, wide rows), as explain prints it.
  const GemmLaunch l = conv_gemm_launch(s, t, {aligned16(x), false, false});
  if (l.path != GemmPath::Halo || !l.tiles.wgmma || l.tiles.persistent || l.tiles.splits != 1)
    reject("a conv chain runs the wgmma halo kernel unsplit; got " + gemm_launch_str(l));
  HaloArgs a = halo_args(s, l.tiles, x, nullptr, scale_a, shift_a, act_a, y, nullptr, packed);
  a.chain_act = act_b;
  if (s.stride_h == 1) return launch_chain<1>(a, t.m, l.wide, stream);
  launch_chain<2>(a, t.m, l.wide, stream);
}

}  // namespace epilog::cuda
