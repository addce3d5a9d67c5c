// The k = 32 kernels of conv_gemm.cu (gather and direct, mma.sync and wgmma): their arguments,
// tiles, loaders, MMA step and epilogue. conv_gemm_k32.cu holds the mma.sync kernels,
// conv_gemm_direct_wgmma.cu the wgmma one; conv_gemm.cu's header comment says which runs when.
//
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
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

#include "conv_common.cuh"
#include "conv_gemm_ptx.cuh"
#include "epilog/kernels/cuda.h"
#include "epilog/kernels/launch.h"
#include "launch.cuh"

namespace epilog::cuda::conv_gemm_detail {

constexpr int kBK = 32;
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
  bool vec_r, vec2_r;  // float4 (gather kernel), float2 (direct kernel) residual loads
  bool tma;     // the wgmma direct kernel copies A by tensor copies (conv_gemm_direct_tma)
  int plane;    // tma: an image's pixels in tile space (h*w rounded up to the tile); m = n*plane
  Act act, res_act;  // res_act: after adding the residual (cuda::ConvResidual)
  // DirectUpA: channels [up_c0, up_c0 + up_c) of x are up_x's, upsampled by up_sh x 2; its
  // plane is up_w wide and up_hw in all, its images up_xs apart.
  const float* up_x;
  int up_c0, up_c, up_sh, up_w, up_hw, up_xs;
  // The direct wgmma kernel's prologue (cuda::ConvPrologue): x[c] * pro_scale[c] + pro_shift[c],
  // then relu where pro_relu, for each input channel c < c as it loads A.
  const float *pro_scale, *pro_shift;
  bool pro_relu;
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
// a_frag, b_frag: this lane's fragment offsets (the comment on top says why the relabeling).
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

// -- the direct kernels' epilogue of one tile, from the accumulators --
// acc[mi][ni][e] and acc[mi][ni][2 + e]: pixels m + 16 mi and m + 16 mi + 1 (m even), channel
// n + 8 ni + 2t + e. Where the output plane hw = ho*wo is even a pair never straddles two
// images, so the second pixel is the first's neighbour; AnyPlane (the gather kernel on odd
// planes, such as 7x7) places it on its own. The direct kernels pass h*w, which is the same
// there: with ho*wo ptxas allocated their registers anew and the 1x1 layers got up to 2% slower.
// PerImage (the tensor-copy tiles): m counts pixels of images `plane` apart (hw rounded up to the
// tile), and the rows past hw, which the copies zero-filled, are not stored.
// The kernels run scale_shift_act (batchnorm and activation, in place) in one copy an activation
// kind, then this: the residual and the stores, compiled once (in every copy, the wgmma file took
// twice as long to compile).
template <bool PerImage = false, bool AnyPlane = false, int MI, int NI>
__device__ __forceinline__ void direct_store(const GemmArgs& a, float (&acc)[MI][NI][4], int m,
                                             int n, int t, int hw, int plane = 0) {
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
  // The residual, then the stores; as in the halo kernel, also the faster order without one.
  // The residual goes in rounds (16 floats a thread on wgmma, 4 x MI on mma.sync, whose larger
  // rounds took up to 20 more registers), each round's loads issued before any is used, with no
  // branch between them (an output not stored loads the residual's first element).
  // With the activation's branches after each load, the loads went out one at a time, a DRAM
  // round trip each: resnet50's residual 1x1 convs ran 3x slower than without one. All of them in
  // one round held as many registers as the accumulators, and the blocks an SM runs fell by a
  // third. 32-bit offsets (y and the residual span under 2^31 elements, conv_gemm checks): 64-bit
  // ones cost about five instructions a store.
  if (a.res) {
    constexpr int kRound = MI >= 2 ? 1 : 4;  // ni a round (wgmma: MI = 1)
    // The offset of the residual under an output (channel of ni, e; pixel of p[mi]), or 0.
    const auto at = [&](int ni, int e, int mi, const int (&rp)[MI], const int (&p)[MI]) {
      const int c = n + 8 * ni + 2 * t + e;
      return c < a.k && p[mi] >= 0 ? c * hw + rp[mi] : 0;
    };
#pragma unroll
    for (int ni0 = 0; ni0 < NI; ni0 += kRound) {
      // f(j, e, mi) for the round's outputs: ni = ni0 + j, channel e of the pair, row mi.
      const auto each = [&](auto&& f) {
#pragma unroll
        for (int j = 0; j < kRound && ni0 + j < NI; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e)
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) f(j, e, mi);
      };
      float2 r[MI][kRound][2];
      if (a.vec2_r) {  // never on odd planes
        each([&](int j, int e, int mi) {
          r[mi][j][e] =
              __ldg(reinterpret_cast<const float2*>(a.res + at(ni0 + j, e, mi, rpix, pix)));
        });
      } else {
        each([&](int j, int e, int mi) {
          r[mi][j][e].x = __ldg(a.res + at(ni0 + j, e, mi, rpix, pix));
          r[mi][j][e].y = __ldg(a.res + at(ni0 + j, e, mi, rpix1, pix1));
        });
      }
      each([&](int j, int e, int mi) {
        float(&v)[4] = acc[mi][ni0 + j];
        v[e] = activate(a.res_act, v[e] + r[mi][j][e].x);
        v[2 + e] = activate(a.res_act, v[2 + e] + r[mi][j][e].y);
      });
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


[[noreturn]] inline void reject(const std::string& what) {
  throw std::invalid_argument("[conv_gemm] " + what);
}

inline void check_grid(int64_t blocks) {
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


// The launches of conv_gemm_k32.cu (mma.sync: gather or direct) and conv_gemm_direct_wgmma.cu
// (gather: GatherA; up: DirectUpA; pro: a prologue), for the tiles conv_gemm checked and
// conv_gemm_launch sized.
void launch_k32(const GemmArgs& a, const ConvTiles& t, bool direct, Stream stream);
void launch_k32_wgmma(const GemmArgs& a, const ConvTiles& t, bool gather, bool up, bool pro,
                      Stream stream);

}  // namespace epilog::cuda::conv_gemm_detail
