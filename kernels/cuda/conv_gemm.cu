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
//                  (conv_direct_wgmma_kernel below), reading the weights packed ahead; on any
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
//   (Hopper) runs the gather kernel as split-K, also on 1x1 shapes (see Grid below).
//   All three are launched with programmatic dependent launch (launch_pdl, launch.cuh).
//
// TF32 (all kernels): each operand is rounded to nearest as it leaves shared memory by adding
// half a TF32 ulp to its bits (one integer add, see to_tf32), the tensor core then dropping the
// low 13 bits; this is cvt.rna for finite values at half its cost. Error per operand <= 2^-11
// relative, unbiased.
//
// == k = 32: gather and direct ==
// Block: 128 threads (256 for 128x128); warps tile the block as kWarpsM x kWarpsN, each warp
// owns a WM x WN sub-tile of m16n8k8 MMAs (WM in {32, 64}, WN in {8, 16, 32}, see Tile below).
// Tile (m_tile, n_tile) owns pixels [m_tile*BM, +BM) and channels [n_tile*BN, +BN); tiles are
// numbered n fastest (tile = m_tile * n_tiles + n_tile), so that blocks running together share
// one A tile in L2 (the weights are small and stay in L2).
// Grid: gather, one block per tile (blockIdx.x = tile); direct, persistent: as many blocks as fit
// on the device at once (capped at the tile count), block b taking tiles b, b + gridDim.x, ...
// through one pipeline, so that the next tile's copies fly while this one computes and stores.
// Split-K (gather, tiles.splits > 1): each tile is `splits` consecutive blocks launched as one
// thread-block cluster, blockIdx.x = tile * splits + j; block j sums k tiles
// [j * ktiles / splits, (j + 1) * ktiles / splits) (splits shrinks to at most ktiles, so none is
// empty). Then rank 0 adds the others' accumulators through distributed shared memory
// (cluster_sum, conv_gemm_ptx.cuh) and alone runs the epilogue.
//
// -- pipeline -- tiles.stages shared-memory stages of BK = 32 reduction steps each, filled with
// cp.async (zero-fill through src-size for padding and every tail) and waited on with
// wait_group; one __syncthreads per k tile. A stage is
//   As[BK][BM + 4]: k rows, pixels contiguous (the order NCHW gives them), and
//   Bs[BN][BK + 8]: channel rows, k contiguous (the order the weight gives it).
// Two ways to fill As:
//   direct  - A is x viewed as [Cin, h*w] per image, copied 16 bytes (4 pixels) at a time;
//   gather  - 4-byte copies; each lane owns fixed pixels (decoded once) and each warp a run of
//             k rows (decoded per tile with a multiply-shift division).
// Bs is copied 16 bytes at a time when Cin*r*s % 4 == 0 and w is 16-byte aligned, else 4.
//
// Fragments, without conflicts and with 8-byte shared loads: a sum over k does not care in
// which order its terms come, and an output pixel does not care which MMA row computes it, so
// the kernel relabels both (the copies above stay plain). For k step s of a tile, MMA column q
// reads k row 8s + 2*(q % 4) + q / 4 of both As and Bs; row g + 8h of the warp's MMA tile mi is
// its pixel 16*mi + 2g + h. A lane (g = lane/4, t = lane%4) then loads (a0, a1) and (a2, a3)
// of a tile and (b0, b1) with one 8-byte load each, straight into the registers the MMA reads
// (a 16-byte load serving two tiles was tried: ptxas then spent about two register moves per
// accumulator per k tile regrouping the halves). The pads (4 and 8 floats) put the 16 lanes of
// each half-warp on distinct banks.
//
// -- batchnorm + activation epilogue -- acc * scale + shift, act (one copy of the code per
// activation). Gather: through shared memory (Cs[BN][BM + 4], reusing the pipeline's space) so
// that the stores run along the pixels: float4 when ho*wo % 4 == 0 and y is 16-byte aligned,
// else one float per thread. Direct: straight from the accumulators, whose pixels 2g and 2g + 1
// are adjacent (ho*wo is even): one float2 per pixel pair and channel (8 lanes store 64
// contiguous bytes) when y is 8-byte aligned, else two floats.
//
// == k = 72: halo (3x3; stride S = 1 or 2) ==
// A warp owns an 8x8 square of output pixels of one image and WN channels (64, or 32 when
// n = 32); a block m/64 squares (consecutive in (image, square row, square column) order) by n
// channels, warps (m/64) x (n/WN). Grid: one block per tile, n tiles fastest as above, a tile
// being m/64 squares (past the last square a warp computes on zeros and stores nothing).
// The reduction runs over stages of 8 input channels; a stage holds, per square, the input patch
// under it, P[8 channels][kCS] with (8-1)*S + 3 rows and columns (100 or 289 slots; zero outside
// the image; for S = 2 the even columns first, then the odd ones), and Bs[n][76]: the 72 weights
// of the 8 channels in the weight's own order (c*9 + 3i + j). Each tap (i, j) is one k step of the
// 8 channels. Copies: 4-byte cp.async for the patch (a lane owns slots lane + 32q of every
// channel plane, their input offsets decoded once per block), 16-byte (4-byte) for the weights;
// then one __syncthreads per stage, as above. A patch is read by 9 taps: the loads per output
// pixel fall from 9 per channel (gather) to about 1.6 (S = 1) or 4.5 (S = 2).
// MMA tile mi (0..3) of a square: rows g and g + 8 are its pixels (mi, g) and (mi + 4, g) (row,
// column); k step (i, j), column t is channel t. So a0 = P[t][(mi*S + i)*kPW + slot(g*S + j)],
// a1 = the same 4S rows lower, a2, a3 = the same for channel t + 4; b0 = Bs[g][9t + 3i + j],
// b1 = channel t + 4. The A fragment of (mi, i) depends on mi*S + i only: a column of taps j
// reads 3S + 3 distinct fragments (6 or 9), each loaded and rounded once instead of 12 times.
// Shared loads are 4 bytes, conflict-free: kCS = 8 (mod 32) puts lanes (g, t) on banks 8t + g,
// the row pad 76 on banks 12g + 9t. The epilogue stores straight from the accumulators: 8 lanes
// store 8 consecutive floats of an output row (a full 32-byte sector).
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
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "conv_common.cuh"
#include "conv_gemm_halo.cuh"
#include "conv_gemm_ptx.cuh"
#include "conv_gemm_wgmma.cuh"
#include "epilog/kernels/cuda.h"
#include "epilog/kernels/launch.h"
#include "epilog/runtime/launch_log.h"

namespace epilog::cuda {
namespace {

using namespace conv_gemm_detail;

constexpr int kBK = 32;
static_assert(kBK == kGemmK && kHaloK == kGemmHaloK, "launch.h names these tiles");
constexpr int kPadA = 4;  // As row pad: k rows 2t land 8t banks apart, pixels 2g add 2g
constexpr int kPadB = 8;  // Bs row pad: channel rows g land 8g banks apart
constexpr int kPadC = 4;  // Cs row pad: as As, channel rows 2t land 8t banks apart
// A row offset that lands outside every image: k rows past K and pixels past M carry it, so the
// input bounds test alone masks them.
constexpr int kFar = 1 << 30;

// kWide: warps of 64x64 (4 for 128x128) instead of 64x32 (8 for 128x128). The direct kernel
// uses it at 128x128: per MMA a warp then reads 128 instead of 192 bytes of shared memory, which
// with the 64 bytes of copies brings a fully fed tensor core from 100% to 75% of the shared
// memory bandwidth (0.5 MMA per clock and SM, 128 bytes per clock).
template <int BM_, int BN_, bool kWide = false>
struct Tile {
  static constexpr int BM = BM_, BN = BN_;
  static_assert(!kWide || (BM % 64 == 0 && BN % 64 == 0), "64x64 warps");
  static constexpr int kThreads = kWide                  ? BM * BN / (64 * 64) * 32
                                  : BM * BN >= 128 * 128 ? 256
                                                         : 128;
  // Two 128x128 blocks fit an SM's shared memory at 3 stages; this holds registers to 128 so
  // that they fit its register file too (for 256 threads; 128 threads may take 255).
  static constexpr int kMinBlocks = kThreads == 256 ? 2 : 1;
  static constexpr int kWarps = kThreads / 32;
  // Warps along m: WM = 64 where the tile allows it with WN = 32 (most MMAs per fragment load),
  // else WM = 32; kWide: WM = WN = 64.
  static constexpr int kWarpsM = kWide      ? BM / 64
                                 : BM == 32 ? 1
                                 : BM == 64 ? (BN == 128 ? 1 : 2)
                                            : (BN == 32 ? 4 : 2);
  static constexpr int kWarpsN = kWarps / kWarpsM;
  static constexpr int kWM = BM / kWarpsM, kWN = BN / kWarpsN;
  static constexpr int kMI = kWM / 16, kNI = kWN / 8;
  static constexpr int kLdA = BM + kPadA, kLdB = kBK + kPadB, kLdC = BM + kPadC;
  static constexpr int kStageFloats = kBK * kLdA + BN * kLdB;
  static_assert(kWarpsM * kWarpsN == kWarps && kWM % 32 == 0 && kWN % 8 == 0, "warp tiling");

  static constexpr size_t smem_bytes(int stages) {
    const int pipe = stages * kStageFloats, out = BN * kLdC;
    return sizeof(float) * size_t(pipe > out ? pipe : out);
  }
};

struct GemmArgs {
  const float* x;
  const float* wt;
  const float* scale;
  const float* shift;
  float* y;
  int c, h, w;    // input channels and plane
  int k, ho, wo;  // output channels and plane
  int s, rs;      // window width and area (the height only shows through rs)
  int sh, sw, pt, pl, dh, dw;
  int m;             // n * ho * wo
  int kg;            // c * r * s
  int n_tiles;       // ceil(k / BN)
  int stages;        // 2..4; gather: never more than a split's k tiles + 1
  int splits;        // gather: blocks (one cluster) a tile's k tiles are split over, 1..8
  int ktiles;        // ceil(kg / kBK), >= splits
  int xs, ys;        // elements between images of x and of y
  const float* res;  // residual (y's shape) or null
  int r_img;         // elements between its images
  const float* wp;   // the weights packed for the wgmma direct kernel (pack_wgmma_weights)
  FastDiv div_rs, div_s;
  bool vec_b;   // 16-byte weight copies
  bool vec_y;   // float4 output stores (k = 32 gather kernel)
  bool vec2_y;  // float2 output stores (direct kernel)
  bool tma;     // the wgmma direct kernel copies A by tensor copies (conv_gemm_direct_tma)
  int plane;    // tma: an image's pixels in tile space (h*w rounded up to the tile); m = n*plane
  Act act, res_act;  // res_act: after adding the residual (cuda::ConvResidual)
  // DirectUpA: channels [up_c0, up_c0 + up_c) of x are up_x's, upsampled by up_sh x 2; its
  // plane is up_w wide and up_hw in all, its images up_xs apart.
  const float* up_x;
  int up_c0, up_c, up_sh, up_w, up_hw, up_xs;
};

// -- A loaders: one k tile of As[kBK][kLdA] per call --

// Direct: thread owns one 4-pixel chunk and every kRowStep-th k row.
template <class T>
struct DirectA {
  static constexpr int kChunks = T::BM / 4;
  static constexpr int kRowStep = T::kThreads / kChunks;
  static constexpr int kRows = kBK / kRowStep;
  int base;  // x offset of (img, channel 0, first pixel of the chunk); -1 past M
  int row0, col;

  __device__ __forceinline__ DirectA(const GemmArgs& a, int m0, int tid) {
    const int chunk = tid % kChunks;
    row0 = tid / kChunks;
    col = 4 * chunk;
    const int m = m0 + col;
    const int hw = a.ho * a.wo;  // == h * w on this path
    const int img = m / hw;
    base = m < a.m ? img * a.xs + (m - img * hw) : -1;
  }

  __device__ __forceinline__ void load(const GemmArgs& a, uint32_t as, int k0) const {
    const int hw = a.ho * a.wo;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int kr = row0 + j * kRowStep;
      const int kk = k0 + kr;
      const bool valid = base >= 0 && kk < a.kg;
      const int off = valid ? base + kk * hw : 0;
      cp_async16(as + 4 * (kr * T::kLdA + col), a.x + off, valid);
    }
  }
};

// Direct, with x's channels [up_c0, up_c0 + up_c) read from up_x upsampled (an upsample_nearest
// folded into the conv, FoldedUpsample) by up_sh down and 2 across: a chunk of those k rows is
// pixels (oh, ow..ow + 3), ow % 4 == 0 (conv_gemm_upsample_fits), whose sources are (oh / up_sh,
// ow / 2) twice and the pixel after it twice: four 4-byte copies off one address.
template <class T>
struct DirectUpA : DirectA<T> {
  using D = DirectA<T>;
  int up_base;  // up_x offset of (img, channel 0, the chunk's first source pixel); -1 past M

  __device__ __forceinline__ DirectUpA(const GemmArgs& a, int m0, int tid) : D(a, m0, tid) {
    const int m = m0 + D::col, hw = a.ho * a.wo;
    const int img = m / hw, rem = m - img * hw;
    const int oh = rem / a.wo, ow = rem - oh * a.wo;
    up_base = m < a.m ? img * a.up_xs + oh / a.up_sh * a.up_w + ow / 2 : -1;
  }

  __device__ __forceinline__ void load(const GemmArgs& a, uint32_t as, int k0) const {
    const int hw = a.ho * a.wo;
#pragma unroll
    for (int j = 0; j < D::kRows; ++j) {
      const int kr = D::row0 + j * D::kRowStep, kk = k0 + kr, uc = kk - a.up_c0;
      const uint32_t dst = as + 4 * (kr * T::kLdA + D::col);
      if (unsigned(uc) < unsigned(a.up_c)) {
        const bool valid = up_base >= 0;
        const float* src = a.up_x + (valid ? up_base + uc * a.up_hw : 0);
        cp_async4(dst, src, valid);
        cp_async4(dst + 4, src, valid);
        cp_async4(dst + 8, src + 1, valid);
        cp_async4(dst + 12, src + 1, valid);
      } else {  // DirectA's copy, written out: a helper shared with it moved every direct
                // kernel's registers (tools/kernel_regs.py)
        const bool valid = D::base >= 0 && kk < a.kg;
        cp_async16(dst, a.x + (valid ? D::base + kk * hw : 0), valid);
      }
    }
  }
};

// Gather: lane owns pixels lane + 32p (decoded once); warp owns k rows [warp*kRows, +kRows).
template <class T>
struct GatherA {
  static constexpr int kPix = T::BM / 32;
  static constexpr int kRows = kBK / (T::kThreads / 32);
  int base[kPix];  // x offset of (img, 0, ih0, iw0); may be negative, valid once a tap is added
  int ih0[kPix], iw0[kPix];
  int row0, lane;

  __device__ __forceinline__ GatherA(const GemmArgs& a, int m0, int tid) {
    lane = tid % 32;
    row0 = (tid / 32) * kRows;
    const int hwo = a.ho * a.wo;
#pragma unroll
    for (int p = 0; p < kPix; ++p) {
      const int m = m0 + lane + 32 * p;
      const bool inside = m < a.m;
      const int mm = inside ? m : 0;
      const int img = mm / hwo, rem = mm - img * hwo;
      const int oh = rem / a.wo, ow = rem - oh * a.wo;
      ih0[p] = oh * a.sh - a.pt;
      iw0[p] = ow * a.sw - a.pl;
      base[p] = img * a.xs + ih0[p] * a.w + iw0[p];
      if (!inside) ih0[p] = -kFar;
    }
  }

  __device__ __forceinline__ void load(const GemmArgs& a, uint32_t as, int k0) const {
    const int hw = a.h * a.w;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int kr = row0 + j;
      const int kk = k0 + kr;
      // (c, i, j) of this k row, uniform across the warp; rows past K decode as the last one
      // and are masked through the row test.
      const int kd = kk < a.kg ? kk : a.kg - 1;
      const int c = fast_div(kd, a.div_rs);
      const int tap = kd - c * a.rs;
      const int i = fast_div(tap, a.div_s);
      const int di = i * a.dh, dj = (tap - i * a.s) * a.dw;
      const int koff = c * hw + di * a.w + dj;
      const int di_test = kk < a.kg ? di : -kFar;
#pragma unroll
      for (int p = 0; p < kPix; ++p) {
        const bool valid =
            unsigned(ih0[p] + di_test) < unsigned(a.h) && unsigned(iw0[p] + dj) < unsigned(a.w);
        const int off = valid ? base[p] + koff : 0;
        cp_async4(as + 4 * (kr * T::kLdA + lane + 32 * p), a.x + off, valid);
      }
    }
  }
};

// -- B loader: Bs[BN][kLdB] --
template <class T>
__device__ __forceinline__ void load_b(const GemmArgs& a, uint32_t bs, int n0, int k0, int tid) {
  if (a.vec_b) {
    constexpr int kRowStep = T::kThreads / (kBK / 4);
    const int kc = 4 * (tid % (kBK / 4)), nr0 = tid / (kBK / 4);
#pragma unroll
    for (int j = 0; j < T::BN / kRowStep; ++j) {
      const int nr = nr0 + j * kRowStep;
      const int n = n0 + nr, kk = k0 + kc;
      const bool valid = n < a.k && kk < a.kg;  // kg % 4 == 0: chunks are all in or all out
      cp_async16(bs + 4 * (nr * T::kLdB + kc), a.wt + (valid ? n * a.kg + kk : 0), valid);
    }
  } else {
    const int kr = tid % 32, nr0 = tid / 32;
#pragma unroll
    for (int j = 0; j < T::BN / T::kWarps; ++j) {
      const int nr = nr0 + j * T::kWarps;
      const int n = n0 + nr, kk = k0 + kr;
      const bool valid = n < a.k && kk < a.kg;
      cp_async4(bs + 4 * (nr * T::kLdB + kr), a.wt + (valid ? n * a.kg + kk : 0), valid);
    }
  }
}

// -- one k tile of MMAs (both k = 32 kernels) --
// a_frag, b_frag: this lane's fragment offsets (see the file comment for the relabeling).
template <class T>
__device__ __forceinline__ void mma_ktile(float (&acc)[T::kMI][T::kNI][4], const float* as,
                                          int a_frag, int b_frag) {
  const float* bs = as + kBK * T::kLdA;
#pragma unroll
  for (int ks = 0; ks < kBK / 8; ++ks) {
    uint32_t af[T::kMI][4], bf[T::kNI][2];
#pragma unroll
    for (int mi = 0; mi < T::kMI; ++mi) {
      const float* p = as + a_frag + 8 * ks * T::kLdA + 16 * mi;
      const float2 lo = *reinterpret_cast<const float2*>(p);            // MMA column t
      const float2 hi = *reinterpret_cast<const float2*>(p + T::kLdA);  // MMA column t + 4
      af[mi][0] = to_tf32(lo.x);
      af[mi][1] = to_tf32(lo.y);
      af[mi][2] = to_tf32(hi.x);
      af[mi][3] = to_tf32(hi.y);
    }
#pragma unroll
    for (int ni = 0; ni < T::kNI; ++ni) {
      const float2 v = *reinterpret_cast<const float2*>(bs + b_frag + 8 * ni * T::kLdB + 8 * ks);
      bf[ni][0] = to_tf32(v.x);
      bf[ni][1] = to_tf32(v.y);
    }
#pragma unroll
    for (int mi = 0; mi < T::kMI; ++mi)
#pragma unroll
      for (int ni = 0; ni < T::kNI; ++ni) mma_tf32(acc[mi][ni], af[mi], bf[ni]);
  }
}

template <int BM, int BN>
__global__ void __launch_bounds__(Tile<BM, BN>::kThreads, Tile<BM, BN>::kMinBlocks)
    conv_gemm_kernel(const GemmArgs a) {
  using T = Tile<BM, BN>;
  extern __shared__ __align__(16) float smem[];
  detail::pdl_begin();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // A tile's splits are consecutive blocks, one cluster: split = the block's rank in it.
  const unsigned tile = blockIdx.x / unsigned(a.splits);
  const int split = int(blockIdx.x - tile * unsigned(a.splits));
  const int n_tile = int(tile % unsigned(a.n_tiles));
  const int m0 = int(tile / unsigned(a.n_tiles)) * BM, n0 = n_tile * BN;
  const int kt0 = split * a.ktiles / a.splits;
  const int ktiles = (split + 1) * a.ktiles / a.splits - kt0;  // this split's k tiles, >= 1
  const uint32_t smem0 = smem_addr(smem);
  constexpr uint32_t kStageBytes = 4 * T::kStageFloats, kBOffset = 4 * kBK * T::kLdA;

  const GatherA<T> loader_a(a, m0, tid);
  auto load_tile = [&](int stage, int kt) {
    const uint32_t as = smem0 + stage * kStageBytes;
    loader_a.load(a, as, (kt0 + kt) * kBK);
    load_b<T>(a, as + kBOffset, n0, (kt0 + kt) * kBK, tid);
  };

  // Warp position and this lane's fragment offsets (see the file comment for the relabeling).
  const int wm = warp / T::kWarpsN, wn = warp % T::kWarpsN;
  const int g = lane / 4, t = lane % 4;
  const int a_frag = 2 * t * T::kLdA + wm * T::kWM + 2 * g;
  const int b_frag = (wn * T::kWN + g) * T::kLdB + 2 * t;

  float acc[T::kMI][T::kNI][4];
#pragma unroll
  for (int mi = 0; mi < T::kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < T::kNI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

  // -- mainloop --
  const int stages = a.stages;
  for (int st = 0; st < stages - 1; ++st) {
    if (st < ktiles) load_tile(st, st);
    cp_async_commit();  // empty groups keep the count that wait_group relies on
  }
  int read_stage = 0, write_stage = stages - 1;
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait_stage(stages);
    // Tile kt is visible to all, and every warp is done with the stage the next copy overwrites.
    __syncthreads();
    if (kt + stages - 1 < ktiles) load_tile(write_stage, kt + stages - 1);
    cp_async_commit();
    write_stage = write_stage + 1 == stages ? 0 : write_stage + 1;

    mma_ktile<T>(acc, smem + read_stage * T::kStageFloats, a_frag, b_frag);
    read_stage = read_stage + 1 == stages ? 0 : read_stage + 1;
  }

  cp_async_wait<0>();
  __syncthreads();  // the pipeline's space is free

  // -- split-K: the cluster's other blocks hand their sums to rank 0 --
  if (!cluster_sum<T::kMI * T::kNI * 4, T::kThreads>(&acc[0][0][0], smem, split, a.splits)) return;

  // -- batchnorm + activation epilogue --
  float* cs = smem;  // the pipeline's space
  // One copy per activation, so that each element's activation is straight-line code.
  auto finish = [&](auto act) {
#pragma unroll
    for (int ni = 0; ni < T::kNI; ++ni) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int nr = wn * T::kWN + 8 * ni + 2 * t + e;
        const int n = n0 + nr;
        const float sc = a.scale && n < a.k ? __ldg(a.scale + n) : 1.0f;
        const float sf = a.shift && n < a.k ? __ldg(a.shift + n) : 0.0f;
#pragma unroll
        for (int mi = 0; mi < T::kMI; ++mi) {
          // Rows g and g + 8 of MMA tile mi are pixels 2g and 2g + 1 of its 16.
          float2 v;
          v.x = act(fmaf(acc[mi][ni][e], sc, sf));
          v.y = act(fmaf(acc[mi][ni][2 + e], sc, sf));
          *reinterpret_cast<float2*>(cs + nr * T::kLdC + wm * T::kWM + 16 * mi + 2 * g) = v;
        }
      }
    }
  };
  with_activation_lean(a.act, finish);
  __syncthreads();

  const int hwo = a.ho * a.wo;
  if (a.vec_y) {
    // Four pixels of one image per store: hwo % 4 == 0, so M % 4 == 0 and chunks never straddle.
    constexpr int kChunks = BM / 4, kRowStep = T::kThreads / kChunks;
    const int col = 4 * (tid % kChunks), nr0 = tid / kChunks;
    const int m = m0 + col;
    if (m < a.m) {
      const int img = m / hwo;
      float* __restrict__ yb = a.y + (img * a.ys + (m - img * hwo));
      const float* __restrict__ rb = a.res ? a.res + (img * a.r_img + (m - img * hwo)) : nullptr;
#pragma unroll 4
      for (int nr = nr0; nr < BN; nr += kRowStep) {
        if (n0 + nr >= a.k) break;
        float4 v = *reinterpret_cast<const float4*>(cs + nr * T::kLdC + col);
        if (rb) {
          const float* r = rb + (n0 + nr) * hwo;
          v.x = activate(a.res_act, v.x + __ldg(r));
          v.y = activate(a.res_act, v.y + __ldg(r + 1));
          v.z = activate(a.res_act, v.z + __ldg(r + 2));
          v.w = activate(a.res_act, v.w + __ldg(r + 3));
        }
        *reinterpret_cast<float4*>(yb + (n0 + nr) * hwo) = v;
      }
    }
  } else {
    constexpr int kRowStep = T::kThreads / BM;
    const int col = tid % BM, nr0 = tid / BM;
    const int m = m0 + col;
    if (m < a.m) {
      const int img = m / hwo;
      float* __restrict__ yb = a.y + (img * a.ys + (m - img * hwo));
      const float* __restrict__ rb = a.res ? a.res + (img * a.r_img + (m - img * hwo)) : nullptr;
#pragma unroll 4
      for (int nr = nr0; nr < BN; nr += kRowStep) {
        if (n0 + nr >= a.k) break;
        yb[(n0 + nr) * hwo] =
            detail::add_residual(cs[nr * T::kLdC + col], rb, (n0 + nr) * hwo, a.res_act);
      }
    }
  }
}

// -- the persistent direct kernels' copy position: block b takes tiles b, b + gridDim.x, ...
// (n tiles fastest, so that the blocks resident together share their A tiles in L2); `tile` and
// `kt` are the tile and k tile its next copy fills, `n_tile` that tile's n tile and `a_loader`
// its A loader, all decoded once a tile.
template <class T, class Loader = DirectA<T>>
struct DirectCursor {
  int tile, kt = 0, n_tile;
  Loader a_loader;

  __device__ __forceinline__ DirectCursor(const GemmArgs& a, int tid, int tile0 = int(blockIdx.x),
                                          int kt0 = 0)
      : tile(tile0),
        kt(kt0),
        n_tile(tile0 % a.n_tiles),
        a_loader(a, tile0 / a.n_tiles * T::BM, tid) {}
  // This block's k tiles, all of its tiles together.
  static __device__ __forceinline__ int block_ktiles(const GemmArgs& a) {
    const int tiles = (a.m + T::BM - 1) / T::BM * a.n_tiles, step = int(gridDim.x);
    return (tiles - int(blockIdx.x) + step - 1) / step * a.ktiles;
  }
  __device__ __forceinline__ void advance(const GemmArgs& a, int tid) {
    if (++kt < a.ktiles) return;
    kt = 0;
    tile += int(gridDim.x);
    n_tile = tile % a.n_tiles;
    a_loader = Loader(a, tile / a.n_tiles * T::BM, tid);
  }
};

// -- the direct kernels' batchnorm + activation epilogue of one tile, from the accumulators --
// acc[mi][ni][e] and acc[mi][ni][2 + e]: pixels m + 16 mi and m + 16 mi + 1 (m even), channel
// n + 8 ni + 2t + e. Where the output plane hw = ho*wo is even a pair never straddles two
// images, so the second pixel is the first's neighbour; AnyPlane (the gather kernel on odd
// planes, such as 7x7) places it on its own. The direct kernels pass h*w, which is the same
// there: with ho*wo ptxas allocated their registers anew and the 1x1 layers got up to 2% slower.
// PerImage (the tensor-copy tiles): m counts pixels of images `plane` apart (hw rounded up to the
// tile), and the rows past hw, which the copies zero-filled, are not stored.
template <bool PerImage = false, bool AnyPlane = false, int MI, int NI, class ActFn>
__device__ __forceinline__ void direct_epilogue(const GemmArgs& a, float (&acc)[MI][NI][4], int m,
                                                int n, int t, ActFn act, int hw, int plane = 0) {
  // y's and the residual's offsets (channel 0) of the pair's pixels; -1: not stored.
  int pix[MI], rpix[MI], pix1[MI], rpix1[MI];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
    const int mm = m + 16 * mi;
    if constexpr (PerImage) {
      const int img = mm / plane, p = mm - img * plane;
      pix[mi] = mm < a.m && p < hw ? img * a.ys + p : -1;
      rpix[mi] = img * a.r_img + p;
    } else {
      const int img = mm / hw;
      pix[mi] = mm < a.m ? img * a.ys + (mm - img * hw) : -1;
      rpix[mi] = img * a.r_img + (mm - img * hw);
    }
    if constexpr (AnyPlane) {
      const int m1 = mm + 1, img1 = m1 / hw;
      pix1[mi] = m1 < a.m ? img1 * a.ys + (m1 - img1 * hw) : -1;
      rpix1[mi] = img1 * a.r_img + (m1 - img1 * hw);
    } else {
      pix1[mi] = pix[mi] < 0 ? -1 : pix[mi] + 1;
      rpix1[mi] = rpix[mi] + 1;
    }
  }
  // Batchnorm and activation in place, then the residual (its loads fly together, no store
  // between them), then the stores; as in the halo kernel, also the faster order without one.
  // 32-bit offsets (y and the residual span under 2^31 elements, conv_gemm checks): 64-bit ones
  // cost about five instructions a store.
  scale_shift_act(acc, a.scale, a.shift, a.k, n, t, act);
  if (a.res) {
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = n + 8 * ni + 2 * t + e;
        if (c >= a.k) continue;
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
          if (pix[mi] < 0) continue;
          acc[mi][ni][e] = activate(a.res_act, acc[mi][ni][e] + __ldg(a.res + (c * hw + rpix[mi])));
          if (AnyPlane && pix1[mi] < 0) continue;
          acc[mi][ni][2 + e] =
              activate(a.res_act, acc[mi][ni][2 + e] + __ldg(a.res + (c * hw + rpix1[mi])));
        }
      }
  }
#pragma unroll
  for (int ni = 0; ni < NI; ++ni) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int c = n + 8 * ni + 2 * t + e;
      if (c >= a.k) continue;
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        if (pix[mi] < 0) continue;
        float* yc = a.y + (c * hw + pix[mi]);
        const float2 v = {acc[mi][ni][e], acc[mi][ni][2 + e]};
        if (a.vec2_y) {  // never on odd planes
          *reinterpret_cast<float2*>(yc) = v;
        } else {
          yc[0] = v.x;
          if (!AnyPlane || pix1[mi] >= 0) a.y[c * hw + pix1[mi]] = v.y;
        }
      }
    }
  }
}

// -- the persistent direct kernel (1x1, stride 1, unpadded: A is x itself) --
// Block b takes tiles b, b + gridDim.x, ... (n tiles fastest, so that the blocks resident
// together share their A tiles in L2) and runs one pipeline through all of their k tiles: the
// copies for the next tile are in flight while this one finishes and stores. The epilogue
// stores straight from the accumulators (pixel pairs 2g, 2g + 1 are one float2), so it needs
// neither shared memory nor a barrier.
template <int BM, int BN>
using DirectTile = Tile<BM, BN, BM == 128 && BN == 128>;

template <int BM, int BN>
__global__ void __launch_bounds__(DirectTile<BM, BN>::kThreads, DirectTile<BM, BN>::kMinBlocks)
    conv_direct_kernel(const GemmArgs a) {
  using T = DirectTile<BM, BN>;
  extern __shared__ __align__(16) float smem[];
  detail::pdl_begin();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int ktiles = a.ktiles, step = int(gridDim.x);
  const int total = DirectCursor<T>::block_ktiles(a);
  const uint32_t smem0 = smem_addr(smem);
  constexpr uint32_t kStageBytes = 4 * T::kStageFloats, kBOffset = 4 * kBK * T::kLdA;

  DirectCursor<T> ld(a, tid);
  auto load_next = [&](int stage) {
    const uint32_t as = smem0 + stage * kStageBytes;
    ld.a_loader.load(a, as, ld.kt * kBK);
    load_b<T>(a, as + kBOffset, ld.n_tile * BN, ld.kt * kBK, tid);
    ld.advance(a, tid);
  };

  const int wm = warp / T::kWarpsN, wn = warp % T::kWarpsN;
  const int g = lane / 4, t = lane % 4;
  const int a_frag = 2 * t * T::kLdA + wm * T::kWM + 2 * g;
  const int b_frag = (wn * T::kWN + g) * T::kLdB + 2 * t;
  float acc[T::kMI][T::kNI][4];
  auto clear = [&] {
#pragma unroll
    for (int mi = 0; mi < T::kMI; ++mi)
#pragma unroll
      for (int ni = 0; ni < T::kNI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
  };

  auto store_tile = [&](int tile, auto act) {
    direct_epilogue(a, acc, tile / a.n_tiles * BM + wm * T::kWM + 2 * g,
                    tile % a.n_tiles * BN + wn * T::kWN, t, act, a.h * a.w);
  };

  // -- mainloop over this block's tiles --
  const int stages = a.stages;
  for (int st = 0; st < stages - 1; ++st) {
    if (st < total) load_next(st);
    cp_async_commit();
  }
  clear();
  int read_stage = 0, write_stage = stages - 1, tile = int(blockIdx.x), kt = 0;
  for (int it = 0; it < total; ++it) {
    cp_async_wait_stage(stages);
    __syncthreads();
    if (it + stages - 1 < total) load_next(write_stage);
    cp_async_commit();
    write_stage = write_stage + 1 == stages ? 0 : write_stage + 1;
    mma_ktile<T>(acc, smem + read_stage * T::kStageFloats, a_frag, b_frag);
    read_stage = read_stage + 1 == stages ? 0 : read_stage + 1;
    if (++kt == ktiles) {
      with_activation_lean(a.act, [&](auto act) { store_tile(tile, act); });
      clear();
      kt = 0;
      tile += step;
    }
  }
  cp_async_wait<0>();
}

// -- the persistent direct kernel on warpgroup MMA (k = 32 with wgmma; sm_90a builds only) --
// The same tiles, copies of A, pipeline over the block's tiles and epilogue as
// conv_direct_kernel; the MMAs are wgmma.m64nNk8 with A from registers and B from shared memory.
// Why: the mma.sync kernel loads and rounds a fragment of A and of B for every m16n8k8; here a
// thread loads A once per k step for all n channels, and the tensor cores read B themselves.
// Block: BM / 64 warpgroups; warpgroup v owns pixels [64v, +64) of the tile and all BN channels.
// A, As[k][pixel] as staged (pixels contiguous), relabeled as the mma.sync kernels do (file
// comment): row g (g + 8) of warp w's 16 is pixel 16w + 2g (+ 1), column t (t + 4) of k step s
// is k row 8s + 2t (+ 1), so (a0, a1) and (a2, a3) are one 8-byte load each and the accumulators
// hold the pixel pairs direct_epilogue stores. B, the weights packed ahead in that column order
// (pack_wgmma_weights, rounded to TF32): a stage is 8 runs q of BN rows x 4 channels, runs 2s and
// 2s + 1 the two halves of k step s, i.e. wgmma's K-major core matrices of 8 rows x 16 bytes,
// the halves BN * 16 bytes apart; a stage's are one bulk copy completing on the stage's mbarrier,
// as in the halo kernel on wgmma (conv_gemm_wgmma.cuh says why; b16_c256_256_1x1_40 35.2 ->
// 33.7 us). Each k tile's wgmmas are waited for before the next one's fragments are loaded
// (they take the same registers), so copies run stages - 1 ahead, as in conv_direct_kernel.
// Tma (conv_gemm_direct_tma): A by tensor copies. Thread 0 issues a k tile's BM / 32 boxes of
// x's tensor map (x_tensor_map: 32 pixels of one image by 32 channels) along with the weights,
// all on the stage's mbarrier, so no other thread issues a copy. Tiles lie within one image: on a
// plane that is not a multiple of BM pixels the last tile of each image has rows past it, which
// the copies zero-fill (their boxes reach past the tensor map's plane) and the epilogue skips.
// A box lands as 32 rows of 128 bytes whose 16-byte chunks the copy swizzles (chunk c of row k
// at c ^ k % 8): a warp's fragment loads then meet no bank conflict, as with the padded rows.
// Why: cp.async's copies reach shared memory through L1, and the layers waited on them (shapes.h
// has the A/B).
// Gather: the same kernel on any other shape, its A tiles gathered
// 4 bytes at a time by GatherA (as the mma.sync gather kernel stages them) and the weights packed
// over the whole reduction (c, i, j). Why: the mma.sync gather kernel's deep 3x3 stride-2 layers
// onto small planes (where the halo kernel's 8x8 squares waste a third or more) ran at a fifth
// of the tensor cores' rate.
// Split (splits > 1, either loader): not persistent; a tile's splits are consecutive blocks, one
// cluster, each summing k tiles [split * ktiles / splits, (split + 1) * ktiles / splits); rank 0
// adds the others' accumulators (cluster_sum) and alone runs the epilogue. For grids of under a
// wave over deep reductions, whose blocks would each walk a long chain of k tiles.
template <int BM_, int BN_, bool Tma = false>
struct WgDirectTile {
  static constexpr int BM = BM_, BN = BN_, kThreads = 2 * BM, kNI = BN / 8;
  // Tma: A as the tensor copies leave it, boxes of 32 k rows x 32 pixels (128 bytes, swizzled).
  static constexpr int kLdA = Tma ? BM : BM + kPadA, kBFloats = kBK * BN;
  static constexpr int kStageFloats = kBK * kLdA + kBFloats;
  // Blocks of up to 64 channels are held to the registers of two an SM.
  static constexpr int kMinBlocks = BN <= 64 ? 2 : 1;
  // Tma's swizzle repeats every 1024 bytes, from a base the kernel aligns so.
  static constexpr size_t kAlign = Tma ? 1024 : 0;
  // The stages, then one mbarrier a stage (up to 4) for its weights.
  static constexpr size_t smem_bytes(int stages) {
    return 4 * size_t(stages) * kStageFloats + kWgmmaBarrierBytes + kAlign;
  }
  static_assert(!Tma || (4 * kStageFloats) % 1024 == 0, "stages keep the swizzle's alignment");
  static_assert(kNI * 4 * kThreads <= 2 * kStageFloats,
                "split-K parks the accumulators in the pipeline's space (at least 2 stages)");
};

// Tma: thread 0 copies a tile's A as BM / 32 boxes of x's tensor map (x_tensor_map), each 32
// pixels of one image by 32 channels; a.plane pixels an image in tile space (direct_tma_plane).
template <class T>
struct TmaA {
  int img, p0;
  __device__ __forceinline__ TmaA(const GemmArgs& a, int m0, int) {
    img = m0 / a.plane;
    p0 = m0 - img * a.plane;
  }
};

template <int BM, int BN, bool Gather, bool Split, bool Up = false, bool Tma = false>
__global__ void __launch_bounds__(WgDirectTile<BM, BN, Tma>::kThreads,
                                  WgDirectTile<BM, BN, Tma>::kMinBlocks)
    conv_direct_wgmma_kernel(const GemmArgs a, const __grid_constant__ CUtensorMap xmap) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = WgDirectTile<BM, BN, Tma>;
  using Loader = std::conditional_t<
      Tma, TmaA<T>,
      std::conditional_t<Gather, GatherA<T>, std::conditional_t<Up, DirectUpA<T>, DirectA<T>>>>;
  extern __shared__ __align__(16) float smem_raw[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int ktiles = a.ktiles, step = int(gridDim.x);
  // Split: this block's tile and share of its k tiles (never empty: splits <= ktiles).
  const int tile0 = Split ? int(blockIdx.x / unsigned(a.splits)) : int(blockIdx.x);
  const int split = Split ? int(blockIdx.x) - tile0 * a.splits : 0;
  const int kt0 = Split ? split * ktiles / a.splits : 0;
  const int total =
      Split ? (split + 1) * ktiles / a.splits - kt0 : DirectCursor<T, Loader>::block_ktiles(a);
  const uint32_t raw0 = smem_addr(smem_raw);
  const uint32_t smem0 = Tma ? (raw0 + 1023) & ~1023u : raw0;
  float* smem = smem_raw + (smem0 - raw0) / 4;
  constexpr uint32_t kStageBytes = 4 * T::kStageFloats, kBOffset = 4 * kBK * T::kLdA;

  // The packed weights hold each n tile's k tiles one after another, kBFloats each: a stage's
  // are one bulk copy, issued by thread 0 and counted on the stage's mbarrier.
  const uint32_t bars = smem0 + uint32_t(a.stages) * kStageBytes;
  DirectCursor<T, Loader> ld(a, tid, tile0, kt0);
  auto load_next = [&](int stage) {
    const uint32_t as = smem0 + stage * kStageBytes, bar = bars + 8 * stage;
    const float* wsrc = a.wp + (size_t(ld.n_tile) * ktiles + ld.kt) * T::kBFloats;
    if constexpr (Tma) {
      if (tid == 0) {
        mbar_expect_tx(bar, kStageBytes);
#pragma unroll
        for (int j = 0; j < BM / 32; ++j)
          tensor_copy_3d(bar, as + 4096 * j, &xmap, ld.a_loader.p0 + 32 * j, ld.kt * kBK,
                         ld.a_loader.img);
        bulk_copy(bar, as + kBOffset, wsrc, 4 * T::kBFloats);
      }
    } else {
      ld.a_loader.load(a, as, ld.kt * kBK);
      if (tid == 0) copy_stage(bar, as + kBOffset, wsrc, 4 * T::kBFloats);
    }
    ld.advance(a, tid);
  };

  const int wg = warp / 4, w4 = warp % 4, g = lane / 4, t = lane % 4;
  // A's k rows 8ks + 2t (lo) and 8ks + 2t + 1 (hi) at pixels p, p + 1. Tma: the box of p, its
  // 128-byte row k holding 16-byte chunk c at c ^ (k % 8), the same for every ks.
  const int p = 64 * wg + 16 * w4 + 2 * g, q = p % 32;
  const int a_lo =
      Tma ? 1024 * (p / 32) + 64 * t + 4 * ((q / 4) ^ (2 * t)) + q % 4 : 2 * t * T::kLdA + p;
  const int a_hi =
      Tma ? 1024 * (p / 32) + 64 * t + 32 + 4 * ((q / 4) ^ (2 * t + 1)) + q % 4 : a_lo + T::kLdA;
  constexpr int kStepA = 8 * (Tma ? 32 : T::kLdA);  // floats between k steps
  float acc[1][T::kNI][4];
  auto clear = [&] {
#pragma unroll
    for (int ni = 0; ni < T::kNI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[0][ni][e] = 0.0f;
  };

  // -- mainloop over this block's tiles --
  const int stages = a.stages;
  init_stage_barriers(bars, stages, tid);
  __syncthreads();
  detail::pdl_begin();
  if (Tma && tid == 0) asm volatile("prefetch.tensormap [%0];\n" ::"l"(&xmap) : "memory");
  for (int st = 0; st < stages - 1; ++st) {
    if (st < total) load_next(st);
    if (!Tma) cp_async_commit();
  }
  clear();
  int read_stage = 0, write_stage = stages - 1, tile = tile0, kt = 0;
  uint32_t phase = 0;  // of read_stage's mbarrier: flips each time the stages come round
  const auto epilogue = [&] {
    with_activation(a.act, [&](auto act) {
      direct_epilogue<Tma, Gather>(a, acc, tile / a.n_tiles * BM + 64 * wg + 16 * w4 + 2 * g,
                                   tile % a.n_tiles * BN, t, act, Gather ? a.ho * a.wo : a.h * a.w,
                                   a.plane);
    });
  };
  for (int it = 0; it < total; ++it) {
    if (!Tma) cp_async_wait_stage(stages);
    mbar_wait(bars + 8 * read_stage, phase);
    // Stage it is visible to all, and every warpgroup's wgmmas are done with the stage the next
    // copy overwrites (each waits for its own below).
    __syncthreads();

    const float* as = smem + read_stage * T::kStageFloats;
    uint32_t af[kBK / 8][4];
#pragma unroll
    for (int ks = 0; ks < kBK / 8; ++ks) {
      const float2 lo = *reinterpret_cast<const float2*>(as + a_lo + kStepA * ks);
      const float2 hi = *reinterpret_cast<const float2*>(as + a_hi + kStepA * ks);
      af[ks][0] = to_tf32(lo.x);
      af[ks][1] = to_tf32(lo.y);
      af[ks][2] = to_tf32(hi.x);
      af[ks][3] = to_tf32(hi.y);
    }
    const uint32_t b_addr = smem0 + read_stage * kStageBytes + kBOffset;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kBK / 8; ++ks)
      wgmma_tf32_rs<T::kNI>(acc[0], af[ks], wgmma_desc(b_addr + 16 * 2 * BN * ks, 16 * BN, 128));
    wgmma_commit();
    // The next copies (into a stage whose wgmmas are done) issue while the tensor cores work,
    // not before the fragments' loads (perf-history: "copies under the wgmmas").
    if (it + stages - 1 < total) load_next(write_stage);
    if (!Tma) cp_async_commit();
    write_stage = write_stage + 1 == stages ? 0 : write_stage + 1;
    // The next k tile's fragments go to the same registers, which the wgmmas read until they
    // are done: waiting here is what ptxas would otherwise insert (two register sets in turn
    // made it wait after every wgmma instead).
    wgmma_wait<0>();
    if (++read_stage == stages) read_stage = 0, phase ^= 1;
    if (!Split && ++kt == ktiles) {
      epilogue();
      clear();
      kt = 0;
      tile += step;
    }
  }
  cp_async_wait<0>();
  if constexpr (Split) {
    __syncthreads();  // every warpgroup is done with the pipeline's space
    if (cluster_sum<T::kNI * 4, T::kThreads>(&acc[0][0][0], smem, split, a.splits)) epilogue();
  }
#else
  __trap();  // built without sm_90a code: conv_gemm never launches it then
#endif
}

[[noreturn]] void reject(const std::string& what) {
  throw std::invalid_argument("[conv_gemm] " + what);
}

void check_grid(int64_t blocks) {
  if (blocks > INT32_MAX) reject("grid of " + std::to_string(blocks) + " blocks is too large");
}

// A persistent kernel of tiles T: as many blocks as fit on the device at once, at most one a tile.
template <class T, auto Kernel, class... Extra>
void launch_persistent(const GemmArgs& a, int64_t tiles, size_t smem, Stream stream,
                       const Extra&... extra) {
  static std::atomic<uint64_t> opted_in{0};
  static detail::ResidentCache resident_cache{};
  detail::opt_in(opted_in, T::smem_bytes(4), Kernel);
  const int64_t resident =
      detail::resident_blocks(resident_cache, a.stages - 2, Kernel, T::kThreads, smem);
  const unsigned blocks = unsigned(tiles < resident ? tiles : resident);
  detail::launch_pdl(Kernel, blocks, T::kThreads, smem, stream, 1, a, extra...);
}

// x as a rank-3 tensor map (pixels, channels, images) of 32 x 32 x 1 boxes, 128-byte swizzled,
// for the direct wgmma kernel's tensor copies (TmaA).
CUtensorMap x_tensor_map(const GemmArgs& a) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    EPILOG_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                       cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !fn)
      reject("the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  const int hw = a.h * a.w;
  const cuuint64_t dims[3] = {cuuint64_t(hw), cuuint64_t(a.kg), cuuint64_t(a.m / a.plane)};
  const cuuint64_t strides[2] = {4 * cuuint64_t(hw), 4 * cuuint64_t(a.xs)};
  const cuuint32_t box[3] = {32, 32, 1}, unit[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, const_cast<float*>(a.x), dims, strides, box,
             unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) reject("cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ")");
  return map;
}

template <int BM, int BN>
void launch(const GemmArgs& a, bool direct, Stream stream) {
  const int64_t tiles = (int64_t(a.m) + BM - 1) / BM * a.n_tiles;
  check_grid(tiles);
  if (direct) {
    using T = DirectTile<BM, BN>;
    launch_persistent<T, conv_direct_kernel<BM, BN>>(a, tiles, T::smem_bytes(a.stages), stream);
  } else {
    using T = Tile<BM, BN>;
    auto kernel = conv_gemm_kernel<BM, BN>;
    static std::atomic<uint64_t> opted_in{0};
    detail::opt_in(opted_in, T::smem_bytes(4), kernel);
    check_grid(tiles * a.splits);
    detail::launch_pdl(kernel, unsigned(tiles * a.splits), T::kThreads, T::smem_bytes(a.stages),
                       stream, unsigned(a.splits), a);
  }
  check_launch("conv_gemm");
  log_launch("gemm", [&] {
    return std::string(direct ? "direct " : "gather ") +
           conv_tiles_str({BM, BN, kBK, a.stages, direct ? 1 : a.splits});
  });
}

// Up: the direct kernel reading channels through a folded upsampling (DirectUpA; unsplit).
template <int BM, int BN, bool Gather, bool Up = false>
void launch_direct_wgmma(const GemmArgs& a, Stream stream) {
  using T = WgDirectTile<BM, BN>;
  const int64_t tiles = (int64_t(a.m) + BM - 1) / BM * a.n_tiles;
  check_grid(tiles * a.splits);
  const size_t smem = T::smem_bytes(a.stages);
  const CUtensorMap none{};
  if constexpr (Up) {
    launch_persistent<T, conv_direct_wgmma_kernel<BM, BN, false, false, true>>(a, tiles, smem,
                                                                               stream, none);
  } else if (a.splits > 1) {
    auto kernel = conv_direct_wgmma_kernel<BM, BN, Gather, true>;
    static std::atomic<uint64_t> opted_in{0};
    detail::opt_in(opted_in, T::smem_bytes(4), kernel);
    detail::launch_pdl(kernel, unsigned(tiles * a.splits), T::kThreads, smem, stream,
                       unsigned(a.splits), a, none);
  } else if (!Gather && a.tma) {
    using TT = WgDirectTile<BM, BN, true>;
    launch_persistent<TT, conv_direct_wgmma_kernel<BM, BN, false, false, false, true>>(
        a, tiles, TT::smem_bytes(a.stages), stream, x_tensor_map(a));
  } else {
    launch_persistent<T, conv_direct_wgmma_kernel<BM, BN, Gather, false>>(a, tiles, smem, stream,
                                                                          none);
  }
  check_launch("conv_gemm");
  log_launch("gemm", [&] {
    const bool split = !Up && a.splits > 1, tma = !Up && !split && !Gather && a.tma;
    return std::string(Gather ? "gather " : "direct ") +
           conv_tiles_str({BM, BN, kBK, a.stages, split ? a.splits : 1, true}, tma, Up);
  });
}

// Stages and splits as conv_gemm_launch sized them: a depth the tile cannot hold throws.
[[noreturn]] void reject_stages(int stages, int m, int n, int max) {
  reject(std::to_string(stages) + " stages for " + std::to_string(m) + "x" + std::to_string(n) +
         " halo tiles (at most " + std::to_string(max) + ")");
}

template <int BM, int BN, int S>
void launch_halo(const HaloArgs& a, Stream stream) {
  using T = HaloTile<BM, BN, S>;
  static_assert(T::kMaxStages == halo_mma_max_stages(BM, BN, S), "launch.h sizes the same tiles");
  static std::atomic<uint64_t> opted_in{0};
  detail::opt_in(opted_in, T::smem_bytes(T::kMaxStages), conv_halo_kernel<BM, BN, S>);
  if (a.stages < 2 || a.stages > T::kMaxStages) reject_stages(a.stages, BM, BN, T::kMaxStages);
  const int64_t blocks = (int64_t(a.squares) + T::kSquares - 1) / T::kSquares * a.n_tiles;
  check_grid(blocks);
  auto kernel = conv_halo_kernel<BM, BN, S>;
  detail::launch_pdl(kernel, unsigned(blocks), T::kThreads, T::smem_bytes(a.stages), stream, 1, a);
  check_launch("conv_gemm");
  log_launch("gemm", [&] { return "halo " + conv_tiles_str({BM, BN, kHaloK, a.stages}); });
}

// A reduction of fewer stages than 3 unsplit gets as many buffers (conv_gemm_launch), all filled
// at once (the kernel's `ahead`), not idle ones that cost blocks (perf-history: "halo stage
// buffers for the reduction only"). Split-K keeps 3 at least: it parks its sums in the
// pipeline's space.
template <int BM, int BN, int S, bool RegA, bool Split, bool ResAhead, bool Wide, bool Chain>
void launch_halo_wgmma(const HaloArgs& a, Stream stream) {
  using W = HaloWgTile<BM, BN, S, RegA, Wide>;
  auto kernel = conv_halo_wgmma_kernel<BM, BN, S, RegA, Split, ResAhead, Wide, Chain>;
  static std::atomic<uint64_t> opted_in{0};
  detail::opt_in(opted_in, W::smem_bytes(W::kMaxStages), kernel);
  if (a.stages < (Split ? 3 : 1) || a.stages > W::kMaxStages || (!Split && a.stages > a.ctiles))
    reject_stages(a.stages, BM, BN, W::kMaxStages);
  const int64_t blocks =
      (int64_t(a.squares) + W::kSquares - 1) / W::kSquares * a.n_tiles * a.splits;
  check_grid(blocks);
  detail::launch_pdl(kernel, unsigned(blocks), W::kThreads, W::smem_bytes(a.stages), stream,
                     unsigned(a.splits), a);
  check_launch("conv_gemm");
  log_launch(Chain ? "gemm chain" : "gemm", [&] {
    return "halo " + conv_tiles_str({BM, BN, kHaloK, a.stages, a.splits, true}, false, false, Wide);
  });
}

// The kernel for layers with a residual or without (halo_wgmma_reg_a, halo_wgmma_res_ahead):
// where both rules give the same, the same instance. Wide rows where conv_gemm_launch says
// (halo_wgmma_wide, x's rows 16-byte aligned). Chain: the conv chain's kernel (conv_chain).
template <int BM, int BN, int S, bool Split, bool Residual, bool Chain = false>
void launch_halo_wgmma_for(const HaloArgs& a, bool wide, Stream stream) {
  constexpr bool reg_a = halo_wgmma_reg_a(BN, Residual);
  constexpr bool res_ahead = halo_wgmma_res_ahead(BN, S, Split, reg_a, Residual);
  if constexpr (halo_wgmma_wide(BM, BN, S, reg_a)) {
    if (wide) return launch_halo_wgmma<BM, BN, S, reg_a, Split, res_ahead, true, Chain>(a, stream);
  } else {
    if (wide) reject("wide patch rows on tiles that have none (halo_wgmma_wide)");
  }
  launch_halo_wgmma<BM, BN, S, reg_a, Split, res_ahead, false, Chain>(a, stream);
}

template <int BM, int BN, int S, bool Split>
void launch_halo_wgmma_any(const HaloArgs& a, bool wide, Stream stream) {
  if (a.res) return launch_halo_wgmma_for<BM, BN, S, Split, true>(a, wide, stream);
  launch_halo_wgmma_for<BM, BN, S, Split, false>(a, wide, stream);
}

template <int BM, int BN, int S>
void launch_halo_any(const HaloArgs& a, const GemmLaunch& l, Stream stream) {
  // n = 16 is built for the wgmma kernel only (conv_gemm checks the tiles).
  if constexpr (BN != 16)
    if (!l.tiles.wgmma) return launch_halo<BM, BN, S>(a, stream);
  // Split-K is built for the one-square tiles only (conv_built_tiles).
  if constexpr (BM == 64)
    if (a.splits > 1) return launch_halo_wgmma_any<BM, BN, S, true>(a, l.wide, stream);
  if (a.splits > 1) reject("split-K halo tiles of more than one square");
  return launch_halo_wgmma_any<BM, BN, S, false>(a, l.wide, stream);
}

// The wgmma k = 32 tiles (conv_gemm checks them): the direct kernel's, or Gather, or Up.
template <bool Gather, bool Up = false>
void dispatch_direct_wgmma(const ConvTiles& t, const GemmArgs& a, Stream stream) {
  switch (t.m * 1000 + t.n) {
    case 64032:
      return launch_direct_wgmma<64, 32, Gather, Up>(a, stream);
    case 64064:
      return launch_direct_wgmma<64, 64, Gather, Up>(a, stream);
    case 64128:
      return launch_direct_wgmma<64, 128, Gather, Up>(a, stream);
    case 128032:
      return launch_direct_wgmma<128, 32, Gather, Up>(a, stream);
    case 128064:
      return launch_direct_wgmma<128, 64, Gather, Up>(a, stream);
    case 128128:
      return launch_direct_wgmma<128, 128, Gather, Up>(a, stream);
  }
  reject("no wgmma k = 32 kernel built for " + std::to_string(t.m) + "x" + std::to_string(t.n));
}

template <int S>
void dispatch_halo(const GemmLaunch& l, const HaloArgs& a, Stream stream) {
  switch (l.tiles.m * 1000 + l.tiles.n) {
    case 64016:
      return launch_halo_any<64, 16, S>(a, l, stream);
    case 128016:
      return launch_halo_any<128, 16, S>(a, l, stream);
    case 256016:
      return launch_halo_any<256, 16, S>(a, l, stream);
    case 64032:
      return launch_halo_any<64, 32, S>(a, l, stream);
    case 64064:
      return launch_halo_any<64, 64, S>(a, l, stream);
    case 64128:
      return launch_halo_any<64, 128, S>(a, l, stream);
    case 128032:
      return launch_halo_any<128, 32, S>(a, l, stream);
    case 128064:
      return launch_halo_any<128, 64, S>(a, l, stream);
    case 128128:
      return launch_halo_any<128, 128, S>(a, l, stream);
    case 256032:
      return launch_halo_any<256, 32, S>(a, l, stream);
    case 256064:
      return launch_halo_any<256, 64, S>(a, l, stream);
    case 256128:
      return launch_halo_any<256, 128, S>(a, l, stream);
  }
  reject("no halo kernel built for " + std::to_string(l.tiles.m) + "x" + std::to_string(l.tiles.n));
}

}  // namespace

namespace conv_gemm_detail {
// conv_gemm_stem.cu.
void launch_stem_mma(const ConvShape& s, const ConvTiles& t, const float* x, const float* w,
                     const float* scale, const float* shift, Act act, float* y,
                     const ConvResidual& residual, Stream stream);
// conv_halo_persistent.cu: tiles of n in {16, 32} channels, a the wgmma halo kernel's arguments.
void launch_halo_persistent(const HaloArgs& a, int n, Stream stream);
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
               ConvResidual residual, const float* packed, const ConvUpsampledInput* up) {
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
  const GemmLaunch l =
      conv_gemm_launch(s, tiles, {aligned16(x), residual.x != nullptr, up != nullptr});
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
    if (up) return dispatch_direct_wgmma<false, true>(t, a, stream);
    return direct ? dispatch_direct_wgmma<false>(t, a, stream)
                  : dispatch_direct_wgmma<true>(t, a, stream);
  }
  switch (t.m * 1000 + t.n) {
    case 32032:
      return launch<32, 32>(a, direct, stream);
    case 32064:
      return launch<32, 64>(a, direct, stream);
    case 32128:
      return launch<32, 128>(a, direct, stream);
    case 64032:
      return launch<64, 32>(a, direct, stream);
    case 64064:
      return launch<64, 64>(a, direct, stream);
    case 64128:
      return launch<64, 128>(a, direct, stream);
    case 128032:
      return launch<128, 32>(a, direct, stream);
    case 128064:
      return launch<128, 64>(a, direct, stream);
    case 128128:
      return launch<128, 128>(a, direct, stream);
  }
  reject("no k = 32 kernel built for " + std::to_string(t.m) + "x" + std::to_string(t.n));
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
  const bool wide = l.wide;
  if (t.m == 64)
    return s.stride_h == 1
               ? launch_halo_wgmma_for<64, kChainC, 1, false, false, true>(a, wide, stream)
               : launch_halo_wgmma_for<64, kChainC, 2, false, false, true>(a, wide, stream);
  return s.stride_h == 1
             ? launch_halo_wgmma_for<128, kChainC, 1, false, false, true>(a, wide, stream)
             : launch_halo_wgmma_for<128, kChainC, 2, false, false, true>(a, wide, stream);
}

}  // namespace epilog::cuda
