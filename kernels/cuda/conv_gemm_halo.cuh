// The 3x3 "halo" kernel of conv_gemm.cu (tiles.k == 72): stride 1 or 2, dilation 1, any padding.
// This file holds its tile geometry and its kernel (conv_gemm_halo_launch.cuh launches it).
//
// A warp owns an 8x8 square of output pixels of one image and WN channels (64, or 32 when
// n = 32); a block m/64 squares (consecutive in (image, square row, square column) order) by n
// channels, warps (m/64) x (n/WN). Grid: one block per tile, n tiles fastest as in the k = 32
// kernels (conv_gemm_k32.cuh), a tile being m/64 squares (past the last square a warp computes
// on zeros and stores nothing).
// The reduction runs over stages of 8 input channels; a stage holds, per square, the input patch
// under it, P[8 channels][kCS] with (8-1)*S + 3 rows and columns (100 or 289 slots; zero outside
// the image; for S = 2 the even columns first, then the odd ones), and Bs[n][76]: the 72 weights
// of the 8 channels in the weight's own order (c*9 + 3i + j). Each tap (i, j) is one k step of the
// 8 channels. Copies: 4-byte cp.async for the patch (a lane owns slots lane + 32q of every
// channel plane, their input offsets decoded once per block), 16-byte (4-byte) for the weights;
// then one __syncthreads per stage. A patch is read by 9 taps: the loads per output
// pixel fall from 9 per channel (gather) to about 1.6 (S = 1) or 4.5 (S = 2).
// MMA tile mi (0..3) of a square: rows g and g + 8 are its pixels (mi, g) and (mi + 4, g) (row,
// column); k step (i, j), column t is channel t. So a0 = P[t][(mi*S + i)*kPW + slot(g*S + j)],
// a1 = the same 4S rows lower, a2, a3 = the same for channel t + 4; b0 = Bs[g][9t + 3i + j],
// b1 = channel t + 4. The A fragment of (mi, i) depends on mi*S + i only: a column of taps j
// reads 3S + 3 distinct fragments (6 or 9), each loaded and rounded once instead of 12 times.
// Shared loads are 4 bytes, conflict-free: kCS = 8 (mod 32) puts lanes (g, t) on banks 8t + g,
// the row pad 76 on banks 12g + 9t. The epilogue stores straight from the accumulators: 8 lanes
// store 8 consecutive floats of an output row (a full 32-byte sector).
#pragma once

#include <cstdint>
#include <type_traits>

#include "conv_common.cuh"
#include "conv_gemm_ptx.cuh"
#include "epilog/kernels/shapes.h"

namespace epilog::cuda::conv_gemm_detail {

constexpr int kHaloK = 72;    // reduction steps per stage: 8 input channels x 9 taps
constexpr int kHaloC = 8;     // input channels per stage
constexpr int kHaloSide = 8;  // a warp's output pixels: an 8 x 8 square of one image

struct HaloArgs {
  const float* x;
  const float* wt;
  const float* scale;
  const float* shift;
  float* y;
  int c, h, w;            // input channels and plane
  int k, ho, wo;          // output channels and plane
  int pt, pl;             // top and left padding
  int tiles_x, tiles_yx;  // 8x8 squares per row of squares, per image
  int squares;            // n * tiles_yx
  int n_tiles;            // ceil(k / BN)
  // The divisors blocks and squares are decoded by: a runtime division is ~20 instructions, and
  // the shallow layers' blocks are issue-bound, a sixth of their instructions in the set-up.
  FastDiv div_n_tiles, div_tiles_yx, div_tiles_x;
  int ctiles;        // ceil(c / 8): stages of the reduction
  int stages;        // 2..4, never more than ctiles + 1 nor what shared memory holds
  int xs, ys;        // elements between images of x and of y
  const float* res;  // residual (y's shape) or null
  int r_img;         // elements between its images
  bool vec_b;        // 16-byte weight copies: c % 4 == 0 and w 16-byte aligned
  Act act, res_act;  // res_act: after adding the residual (cuda::ConvResidual)
  // The wgmma kernel: blocks (one cluster) a tile's stages are split over, 1..8. One byte, in
  // padding: as an int it enlarged the struct, and that moved ptxas's register allocation of
  // every halo kernel (tools/kernel_regs.py).
  uint8_t splits;
  // The conv chain (cuda::conv_chain): the 1x1 conv's activation; its weights, scale and shift
  // follow the packed ones (pack_conv_chain). In padding too.
  Act chain_act;
  const float* wp;  // the wgmma kernel's weights, packed for its n (pack_wgmma_weights)
};
static_assert(sizeof(void*) != 8 || sizeof(HaloArgs) == 192,
              "HaloArgs' size moves ptxas's register allocation of every halo kernel");

// The fields of `a` conv shape s fixes: planes, padding, squares and their divisors, image
// strides, and n_tiles for tiles of bn channels. False (a partly set) where s has 2^31 squares or
// more.
inline bool set_halo_geometry(HaloArgs& a, const ConvShape& s, int bn) {
  a.c = int(s.c), a.h = int(s.h), a.w = int(s.w);
  a.k = int(s.k), a.ho = int(s.ho), a.wo = int(s.wo);
  a.pt = int(s.pad_t), a.pl = int(s.pad_l);
  a.tiles_x = int((s.wo + kHaloSide - 1) / kHaloSide);
  a.tiles_yx = int((s.ho + kHaloSide - 1) / kHaloSide) * a.tiles_x;
  const int64_t squares = s.n * a.tiles_yx;
  if (squares >= INT32_MAX) return false;
  a.squares = int(squares);
  a.n_tiles = int((s.k + bn - 1) / bn);
  a.div_n_tiles = make_fastdiv(uint32_t(a.n_tiles));
  a.div_tiles_yx = make_fastdiv(uint32_t(a.tiles_yx));
  a.div_tiles_x = make_fastdiv(uint32_t(a.tiles_x));
  a.xs = int(s.x_image()), a.ys = int(s.y_image());
  return true;
}

template <int BM, int BN, int S>
struct HaloTile {
  static_assert(S == 1 || S == 2, "stride 1 or 2");
  static_assert(BM == 64 || BM == 128 || BM == 256, "BM: 1, 2 or 4 squares");
  static_assert(BN == 32 || BN == 64 || BN == 128, "BN");
  static constexpr int kSquares = BM / 64;  // one warp row per square
  static constexpr int kWN = BN >= 64 ? 64 : 32;
  static constexpr int kWarpsM = kSquares, kWarpsN = BN / kWN;
  static constexpr int kWarps = kWarpsM * kWarpsN, kThreads = 32 * kWarps;
  static constexpr int kMI = 4, kNI = kWN / 8;  // a square is 4 MMA tiles of 2 rows x 8 columns
  static constexpr int kQuads = 3 * S + 3;      // distinct A fragments of a column of taps
  // The input patch under one square: (8 - 1) * S + 3 rows and columns.
  static constexpr int kPH = (kHaloSide - 1) * S + 3, kPW = kPH, kPos = kPH * kPW;
  // Channel planes of a patch kCS floats apart, kCS = 8 (mod 32): with the 8 pixels g of an MMA
  // row on consecutive slots, lanes (g, t) reading channel t hit banks 8t + g, all distinct.
  static constexpr int kCS = (kPos + 23) / 32 * 32 + 8;
  static constexpr int kPatch = kHaloC * kCS;
  // Weight rows of 72 floats (8 channels x 9 taps, the weight's own order) padded to 76: lanes
  // (g, t) reading channel t of row g hit banks 12g + 9t (mod 32), all distinct.
  static constexpr int kLdB = kHaloK + 4;
  static constexpr int kStageFloats = kSquares * kPatch + BN * kLdB;
  static constexpr int kQ = (kPos + 31) / 32;  // patch positions per lane (lane + 32q)
  static constexpr int kMaxSmem = 227 * 1024;
  static constexpr int kMaxStages = 4 * kStageFloats * 4 <= kMaxSmem   ? 4
                                    : 3 * kStageFloats * 4 <= kMaxSmem ? 3
                                                                       : 2;
  static_assert(2 * kStageFloats * 4 <= kMaxSmem, "two stages must fit");
  static_assert(kPos <= kCS && kLdB % 4 == 0 && kStageFloats % 4 == 0, "16-byte aligned rows");

  static constexpr size_t smem_bytes(int stages) {
    return sizeof(float) * size_t(stages) * kStageFloats;
  }

  // Patch slot of input column px (of 0..kPW): for stride 2 the even columns come first, then
  // the odd ones, so that the 8 pixels of an MMA row (columns 2g + j) sit on consecutive slots.
  static constexpr __host__ __device__ int col_slot(int px) {
    return S == 1 ? px : (px & 1) * (kPW / 2 + 1) + (px >> 1);
  }
  static constexpr __host__ __device__ int slot_col(int slot) {
    return S == 1 ? slot : slot <= kPW / 2 ? 2 * slot : 2 * (slot - kPW / 2 - 1) + 1;
  }
};

// The cp.async copies of one stage of the halo kernels, into HaloTile's staging layout: the
// input patch under each square of the block (P[8][kCS]; HaloPatchLoader, all the wgmma kernel
// copies this way) and the block's weight rows (Bs[BN][kLdB]; HaloLoader adds them). WarpsN
// warps share a square and split its 8 channel planes; every warp copies weight rows. All copy
// state is decoded once per block.
template <int BM, int BN, int S, int WarpsN>
struct HaloPatchLoader {
  using T = HaloTile<BM, BN, S>;
  static constexpr int kChannelsPerWarp = kHaloC / WarpsN;
  static_assert(kHaloC % WarpsN == 0, "warps split a square's channels");

  const HaloArgs& a;
  int wn, lane;
  // Lane owns slots lane + 32q of each channel plane of its square. goff is the slot's offset in
  // an input channel plane (0 when outside the image), pbytes 4 inside, 0 outside (zero fill:
  // the padding).
  uint32_t goff[T::kQ];
  int pbytes[T::kQ];
  bool last_q;  // the last slot group is partial
  const float* x_img;
  uint32_t patch_dst;

  // Square wm of the block (sq_ok: it exists) has its outputs at (oy0, ox0) of image img.
  __device__ __forceinline__ HaloPatchLoader(const HaloArgs& args, uint32_t smem0, int warp, int wm,
                                             int lane_, bool sq_ok, int img, int oy0, int ox0)
      : a(args), wn(warp % WarpsN), lane(lane_) {
    const int iy0 = oy0 * S - a.pt, ix0 = ox0 * S - a.pl;
#pragma unroll
    for (int q = 0; q < T::kQ; ++q) {
      const int p = lane + 32 * q;
      const int py = p / T::kPW, px = T::slot_col(p - py * T::kPW);
      const int iy = iy0 + py, ix = ix0 + px;
      const bool ok = sq_ok && unsigned(iy) < unsigned(a.h) && unsigned(ix) < unsigned(a.w);
      goff[q] = ok ? uint32_t(iy * a.w + ix) : 0u;
      pbytes[q] = ok ? 4 : 0;
    }
    last_q = lane + 32 * (T::kQ - 1) < T::kPos;
    x_img = a.x + size_t(img) * a.xs;
    patch_dst = smem0 + 4 * (wm * T::kPatch + lane);
  }

  // Stage kt's patch (input channels 8kt ..) into the staging buffer sbase bytes past the first.
  __device__ __forceinline__ void load_patch(uint32_t sbase, int kt) const {
    const int c0 = kt * kHaloC, hw = a.h * a.w;
#pragma unroll
    for (int cc = 0; cc < kChannelsPerWarp; ++cc) {
      const int cl = wn + cc * WarpsN, c = c0 + cl;
      const uint32_t dst = patch_dst + sbase + 4 * cl * T::kCS;
      if (c < a.c) {
        const float* plane = x_img + c * hw;
#pragma unroll
        for (int q = 0; q + 1 < T::kQ; ++q)
          cp_async4_n(dst + 4 * 32 * q, plane + goff[q], pbytes[q]);
        cp_async4_if(last_q, dst + 4 * 32 * (T::kQ - 1), plane + goff[T::kQ - 1],
                     pbytes[T::kQ - 1]);
      } else {
#pragma unroll
        for (int q = 0; q + 1 < T::kQ; ++q) cp_async4_n(dst + 4 * 32 * q, a.x, 0);
        cp_async4_if(last_q, dst + 4 * 32 * (T::kQ - 1), a.x, 0);
      }
    }
  }
};

template <int BM, int BN, int S, int WarpsN>
struct HaloLoader : HaloPatchLoader<BM, BN, S, WarpsN> {
  using P = HaloPatchLoader<BM, BN, S, WarpsN>;
  using T = typename P::T;
  using P::a;
  using P::lane;
  static constexpr int kWarps = T::kSquares * WarpsN;
  static constexpr int kRowsPerWarp = BN / kWarps;
  static_assert(BN % kWarps == 0, "warps split the weight rows");

  // Weights: warp w copies rows w, w + kWarps, ... of the block's BN; lane l < 18 the l-th
  // 16-byte chunk of the 72 floats (or, 4 bytes at a time, floats l, l + 32, l + 64). Rows past
  // k are skipped (their products only reach columns that are never stored).
  int b_rows, b_lane;
  const float* b_row;
  uint32_t b_dst;

  __device__ __forceinline__ HaloLoader(const HaloArgs& args, uint32_t smem0, int warp, int wm,
                                        int lane_, bool sq_ok, int img, int oy0, int ox0, int n0)
      : P(args, smem0, warp, wm, lane_, sq_ok, img, oy0, ox0) {
    b_rows = a.k - n0 - warp;  // rows rr with rr * kWarps < b_rows exist
    b_lane = a.vec_b ? 4 * (lane < kHaloK / 4 ? lane : 0) : lane;
    b_row = a.wt + size_t(n0 + warp < a.k ? n0 + warp : 0) * (a.c * 9);
    b_dst = smem0 + 4 * (T::kSquares * T::kPatch + warp * T::kLdB + b_lane);
  }

  // Stage kt (input channels 8kt ..) into the staging buffer sbase bytes past the first.
  __device__ __forceinline__ void load(uint32_t sbase, int kt) const {
    P::load_patch(sbase, kt);
    load_weights(sbase, kt);
  }
  __device__ __forceinline__ void load_weights(uint32_t sbase, int kt) const {
    const int c0 = kt * kHaloC, kg = a.c * 9;
    // Weights: columns c0 * 9 .. + 72 of each row. Past the row's end (c % 8 != 0) zeros, read
    // from the stage's first column so that the (unread) source stays in bounds.
    const int c9 = c0 * 9;
    const uint32_t dst = b_dst + sbase;
    if (a.vec_b) {
      // kg % 4 == 0: a chunk is wholly inside the row or wholly past it.
      const bool in_row = c9 + b_lane < kg, lane_ok = lane < kHaloK / 4;
      const float* src = b_row + c9 + (in_row ? b_lane : 0);
      // Unrolled by 4 only: fully unrolled (up to 64 rows for a one-warp block) ptxas keeps every
      // row's address live at once.
#pragma unroll 4
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        cp_async16_if(lane_ok && rr * kWarps < b_rows, dst + 4 * rr * kWarps * T::kLdB, src,
                      in_row ? 16 : 0);
        src += size_t(kWarps) * kg;
      }
    } else {
      int off[3];
      bool in_row[3];
#pragma unroll
      for (int p = 0; p < 3; ++p) {
        in_row[p] = c9 + b_lane + 32 * p < kg;
        off[p] = c9 + (in_row[p] ? b_lane + 32 * p : 0);
      }
      const float* src = b_row;
#pragma unroll 4
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
#pragma unroll
        for (int p = 0; p < 3; ++p)
          cp_async4_if((p < 2 || lane + 64 < kHaloK) && rr * kWarps < b_rows,
                       dst + 4 * (rr * kWarps * T::kLdB + 32 * p), src + off[p], in_row[p] ? 4 : 0);
        src += size_t(kWarps) * kg;
      }
    }
  }
};

// Calls f(mi, ni, q, n, p) for each output of a thread that exists: acc[mi][ni][q], q = 2h + e,
// is channel n = n0 + 8ni + 2t + e of the output pixel at offset p = pix[mi][h] of y (-1: none).
template <int MI, int NI, class F>
__device__ __forceinline__ void for_outputs(const int (&pix)[MI][2], int k, int n0, int t, F&& f) {
#pragma unroll
  for (int ni = 0; ni < NI; ++ni)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int n = n0 + 8 * ni + 2 * t + e;
      if (n >= k) continue;
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if (pix[mi][h] >= 0) f(mi, ni, 2 * h + e, n, pix[mi][h]);
    }
}

// The residual under a thread's outputs: f(mi, ni, q, value) for each (as for_outputs). Loads
// only, each independent of the rest, so that they all fly together.
template <int MI, int NI, class F>
__device__ __forceinline__ void for_residual(const HaloArgs& a, const int (&pix)[MI][2], int img,
                                             int n0, int t, F&& f) {
  const int hwo = a.ho * a.wo;
  // The residual's offsets differ from y's by the image strides only (one image a square).
  const float* __restrict__ r = a.res + img * (a.r_img - a.ys);
  for_outputs<MI, NI>(pix, a.k, n0, t, [&](int mi, int ni, int q, int n, int p) {
    f(mi, ni, q, __ldg(r + (n * hwo + p)));
  });
}

// The halo kernels' epilogue, straight from the accumulators (laid out as for_outputs says; 8
// lanes store 8 consecutive floats of an output row). Batchnorm and activation in place, then
// the residual (loaded here, or `pre`: fetched ahead by the kernel), then the stores. This order
// also measured faster without a residual than applying the activation on the way to each store.
// Lean: two activation copies, not four (with_activation_lean), for the mma.sync kernel.
template <bool Lean = false, int MI, int NI>
__device__ __forceinline__ void halo_epilogue(const HaloArgs& a, float (&acc)[MI][NI][4],
                                              const int (&pix)[MI][2], int img, int n0, int t,
                                              const float (*pre)[NI][4] = nullptr) {
  const auto apply = [&](auto act) { scale_shift_act(acc, a.scale, a.shift, a.k, n0, t, act); };
  if constexpr (Lean)
    with_activation_lean(a.act, apply);
  else
    with_activation(a.act, apply);
  if (a.res && pre) {
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[mi][ni][q] = activate(a.res_act, acc[mi][ni][q] + pre[mi][ni][q]);
  } else if (a.res) {
    for_residual<MI, NI>(a, pix, img, n0, t, [&](int mi, int ni, int q, float v) {
      acc[mi][ni][q] = activate(a.res_act, acc[mi][ni][q] + v);
    });
  }
  // 32-bit offsets: y and the residual span under 2^31 elements (conv_gemm checks).
  const int hwo = a.ho * a.wo;
  for_outputs<MI, NI>(pix, a.k, n0, t, [&](int mi, int ni, int q, int n, int p) {
    a.y[n * hwo + p] = acc[mi][ni][q];
  });
}

// A block's square geometry: square wm of tile m_tile (squares run over (image, row of squares,
// column of squares); past the last one everything is masked).
struct HaloSquare {
  bool ok;
  int img, oy0, ox0;
  __device__ __forceinline__ HaloSquare(const HaloArgs& a, int sq) {
    ok = sq < a.squares;
    const int sqc = ok ? sq : 0;
    img = fast_div(sqc, a.div_tiles_yx);
    const int rem = sqc - img * a.tiles_yx;
    const int sy = fast_div(rem, a.div_tiles_x), sx = rem - sy * a.tiles_x;
    oy0 = sy * kHaloSide;
    ox0 = sx * kHaloSide;
  }
  // y's offset of the square's pixel (row, col), or -1 outside the output.
  __device__ __forceinline__ int pixel(const HaloArgs& a, int row, int col) const {
    const int oy = oy0 + row, ox = ox0 + col;
    return ok && oy < a.ho && ox < a.wo ? img * a.ys + oy * a.wo + ox : -1;
  }
};

template <int BM, int BN, int S>
__global__ void __launch_bounds__(HaloTile<BM, BN, S>::kThreads, 1)
    conv_halo_kernel(const HaloArgs a) {
  using T = HaloTile<BM, BN, S>;
  extern __shared__ __align__(16) float smem[];
  detail::pdl_begin();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / T::kWarpsN, wn = warp % T::kWarpsN;
  const int g = lane / 4, t = lane % 4;
  const int m_tile = fast_div(int(blockIdx.x), a.div_n_tiles);
  const int n_tile = int(blockIdx.x) - m_tile * a.n_tiles;
  const int n0 = n_tile * BN;
  const uint32_t smem0 = smem_addr(smem);
  constexpr uint32_t kStageBytes = 4 * T::kStageFloats;

  // A block takes kSquares consecutive squares, warp row wm the wm-th.
  const HaloSquare sq(a, m_tile * T::kSquares + wm);
  const HaloLoader<BM, BN, S, T::kWarpsN> loader(a, smem0, warp, wm, lane, sq.ok, sq.img, sq.oy0,
                                                 sq.ox0, n0);

  float acc[T::kMI][T::kNI][4];
#pragma unroll
  for (int mi = 0; mi < T::kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < T::kNI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

  // Fragment bases: A at channel t, pixel column g of the patch's first row; B at row g of the
  // warp's columns, channel t.
  const int a_frag = wm * T::kPatch + t * T::kCS + g;
  const int b_frag = T::kSquares * T::kPatch + (wn * T::kWN + g) * T::kLdB + 9 * t;

  // -- mainloop: one stage = 8 input channels, 9 k steps (one per tap) --
  const int stages = a.stages, ktiles = a.ctiles;
  for (int st = 0; st < stages - 1; ++st) {
    if (st < ktiles) loader.load(st * kStageBytes, st);
    cp_async_commit();
  }
  int read_stage = 0, write_stage = stages - 1;
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait_stage(stages);
    // Stage kt is visible to all, and every warp is done with the stage the next copy overwrites.
    __syncthreads();
    if (kt + stages - 1 < ktiles) loader.load(write_stage * kStageBytes, kt + stages - 1);
    cp_async_commit();
    write_stage = write_stage + 1 == stages ? 0 : write_stage + 1;

    const float* sa = smem + read_stage * T::kStageFloats + a_frag;
    const float* sb = smem + read_stage * T::kStageFloats + b_frag;
#pragma unroll
    for (int j = 0; j < 3; ++j) {
      // MMA rows g and g + 8 of tile mi are square rows mi and mi + 4 (column g), so tap (i, j)
      // of tile mi reads patch rows mi * S + i and mi * S + i + 4S: the A fragment of tile mi,
      // tap row i is the same registers as that of tile mi + 1, tap row i - S. One column of
      // taps needs kQuads distinct fragments, loaded and rounded once.
      uint32_t aq[T::kQuads][4];
#pragma unroll
      for (int b = 0; b < T::kQuads; ++b) {
        const float* p = sa + b * T::kPW + T::col_slot(j);
        aq[b][0] = lds_tf32(p);
        aq[b][1] = lds_tf32(p + 4 * S * T::kPW);
        aq[b][2] = lds_tf32(p + 4 * T::kCS);
        aq[b][3] = lds_tf32(p + 4 * T::kCS + 4 * S * T::kPW);
      }
#pragma unroll
      for (int i = 0; i < 3; ++i) {
        const int tap = 3 * i + j;
        uint32_t bf[T::kNI][2];
#pragma unroll
        for (int ni = 0; ni < T::kNI; ++ni) {
          const float* p = sb + 8 * ni * T::kLdB + tap;
          bf[ni][0] = to_tf32(p[0]);
          bf[ni][1] = to_tf32(p[4 * 9]);
        }
#pragma unroll
        for (int mi = 0; mi < T::kMI; ++mi)
#pragma unroll
          for (int ni = 0; ni < T::kNI; ++ni) mma_tf32(acc[mi][ni], aq[mi * S + i], bf[ni]);
      }
    }
    read_stage = read_stage + 1 == stages ? 0 : read_stage + 1;
  }
  cp_async_wait<0>();

  // acc[mi][ni][2h + e] is pixel (row mi + 4h, column g) of the square, channel 2t + e of n8
  // tile ni: 8 lanes store 8 consecutive floats of one output row (a full 32-byte sector).
  int pix[T::kMI][2];
#pragma unroll
  for (int mi = 0; mi < T::kMI; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) pix[mi][h] = sq.pixel(a, mi + 4 * h, g);
  halo_epilogue<true>(a, acc, pix, sq.img, n0 + wn * T::kWN, t);
}

}  // namespace epilog::cuda::conv_gemm_detail
