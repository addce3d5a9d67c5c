// Which kernel a CUDA launch runs, decided in one place: the launchers of kernels/cuda obey these
// functions (and record what they launched, runtime/launch_log.h), and `explain` prints their
// answer for every node (node_choices). Plain C++ on top of shapes.h: lowering, the launchers and
// the tests share it, with or without CUDA.
//
// Besides the shape, a choice may depend on the operands: whether x starts 16-byte aligned
// (ConvShape::x_stride carries its image stride), whether a residual is added, whether channels
// come through a folded upsampling. The launchers see the real tensors; explain sees them as the
// executor lays them out (value_places, runtime/executor.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "epilog/kernels/shapes.h"

namespace epilog {

struct ConvOperands {
  bool x_aligned = true;  // x starts on a 16-byte boundary
  bool residual = false;  // a residual is added (fused_conv2d's fifth input)
  bool up = false;        // gemm reads a run of x's channels through a folded upsampling
  bool pro = false;       // gemm scales, shifts and activates x as it loads it (a prologue)
};

// The tiles as explain's tiles column shows them and the launchers record them:
// "m=.. n=.. [k=..] [stages=..] [splits=..] [wgmma] [tma] [up] [pro] [wide] [persistent]" (no
// stages for the persistent halo kernel: it stages a square's whole reduction).
inline std::string conv_tiles_str(const ConvTiles& t, bool tma = false, bool up = false,
                                  bool wide = false, bool pro = false) {
  std::string s = "m=" + std::to_string(t.m) + " n=" + std::to_string(t.n);
  if (t.k) s += " k=" + std::to_string(t.k);
  if (t.stages && !t.persistent) s += " stages=" + std::to_string(t.stages);
  if (t.splits > 1) s += " splits=" + std::to_string(t.splits);
  if (t.wgmma) s += " wgmma";
  if (tma) s += " tma";
  if (up) s += " up";
  if (pro) s += " pro";
  if (wide) s += " wide";
  if (t.persistent) s += " persistent";
  return s;
}

// -- gemm (cuda::conv_gemm): which of its kernels runs tiles t on a shape --
// The k of its tile kinds (conv_gemm.cu asserts them): the gather and direct kernels' 32, the halo
// kernels' 72 (8 input channels x 9 taps a stage), the stem kernel's kGemmStemK.
constexpr int kGemmK = 32, kGemmHaloK = 72;

enum class GemmPath : uint8_t {
  Stem,    // conv_gemm_stem.cu
  Halo,    // the 3x3 halo kernel: mma.sync, wgmma (tiles.wgmma), persistent (tiles.persistent)
  Gather,  // k = 32 gathering its A tiles: mma.sync or wgmma, split-K where splits > 1
  Direct,  // 1x1, A is x itself: mma.sync or wgmma (by cp.async, tensor copies or upsampling)
};
inline const char* gemm_path_name(GemmPath p) {
  switch (p) {
    case GemmPath::Stem:
      return "stem";
    case GemmPath::Halo:
      return "halo";
    case GemmPath::Gather:
      return "gather";
    case GemmPath::Direct:
      return "direct";
  }
  return "?";
}

struct GemmLaunch {
  GemmPath path = GemmPath::Gather;
  ConvTiles tiles;    // as the kernel runs them: its stages and splits, wgmma, persistent
  bool tma = false;   // Direct on wgmma: A by tensor copies
  bool up = false;    // Direct on wgmma: channels read through the folded upsampling
  bool pro = false;   // Direct on wgmma: x scaled, shifted and activated as it is loaded
  bool wide = false;  // Halo on wgmma: the patch staged as wide rows (halo_wgmma_wide)
};

// "<path> <tiles>", as explain's tiles column shows a gemm launch.
inline std::string gemm_launch_str(const GemmLaunch& l) {
  return std::string(gemm_path_name(l.path)) + " " +
         conv_tiles_str(l.tiles, l.tma, l.up, l.wide, l.pro);
}

// The mma.sync halo kernel's deepest pipeline for m / 64 squares by n channels at `stride`
// (HaloTile::kMaxStages, conv_gemm_halo.cuh; conv_gemm.cu asserts they agree): 4 stages where
// they fit in the 227 KB a block may have, else 3, else 2.
constexpr int halo_mma_max_stages(int m, int n, int stride) {
  const int64_t side = 7 * stride + 3, pos = side * side;
  const int64_t cs = (pos + 23) / 32 * 32 + 8;  // a channel plane of the patch
  const int64_t stage = int64_t(m / 64) * 8 * cs + int64_t(n) * (kGemmHaloK + 4);
  constexpr int64_t kMaxSmem = 227 * 1024;
  return 4 * stage * 4 <= kMaxSmem ? 4 : 3 * stage * 4 <= kMaxSmem ? 3 : 2;
}

// What conv_gemm runs for tiles `t` (valid ones: conv_gemm rejects the others) on shape `s`:
// - stem tiles (k = kGemmStemK) on a shape conv_gemm_stem_fits takes: the stem kernel;
// - halo tiles (k = 72) on a shape conv_gemm_halo_fits takes: the halo kernel, persistent where
//   the tiles ask for it, the shape fits it, Cout fits one tile and x's rows start 16-byte
//   aligned; on wgmma in splits halved until each keeps a stage, 3 to halo_wgmma_max_stages
//   stages, no more than the reduction's stages where unsplit, wide rows where x's rows are
//   16-byte aligned and halo_wgmma_wide holds; on mma.sync at most the reduction's stages + 1 and
//   halo_mma_max_stages;
// - anything else the k = 32 kernels: stem tiles as 128x32 in 2 stages, halo tiles at the same
//   n (at least 32) and m (at most 128), wgmma where conv_gemm_wgmma_kernel names the direct or
//   gather kernel (else mma.sync); the direct kernel on conv_gemm_direct_fits shapes with x
//   16-byte aligned (unsplit, on mma.sync), else the gather kernel; splits halved until each
//   keeps a k tile; on mma.sync's gather kernel at most the k tiles a split walks + 1 stages.
inline GemmLaunch conv_gemm_launch(const ConvShape& s, const ConvTiles& tiles,
                                   const ConvOperands& o) {
  GemmLaunch l;
  if (tiles.k == kGemmStemK && conv_gemm_stem_fits(s)) {
    l.path = GemmPath::Stem;
    l.tiles = ConvTiles{tiles.m, tiles.n, kGemmStemK, 0};
    return l;
  }
  if (tiles.k == kGemmHaloK && conv_gemm_halo_fits(s)) {
    l.path = GemmPath::Halo;
    ConvTiles t = tiles;
    const int stride = int(s.stride_h);
    const int64_t ctiles = std::max<int64_t>(1, (s.c + 7) / 8);  // stages of 8 input channels
    const bool rows16 = s.w % 4 == 0 && s.x_image() % 4 == 0 && o.x_aligned;
    if (!t.wgmma) {
      t.stages =
          int(std::min<int64_t>({ctiles + 1, t.stages, halo_mma_max_stages(t.m, t.n, stride)}));
      t.splits = 1;
      t.persistent = false;
    } else if (t.persistent && halo_persistent_fits(s) && s.k <= t.n && rows16) {
      t.splits = 1;  // its stages are the reduction's (conv_halo_persistent.cu): none shown
    } else {
      t.persistent = false;
      while (t.splits > ctiles) t.splits /= 2;
      const bool split = t.m == 64 && t.splits > 1;
      t.stages = std::clamp(t.stages, 3, halo_wgmma_max_stages(t.m, t.n, stride));
      if (!split && ctiles < t.stages) t.stages = int(ctiles);
      l.wide = rows16 && halo_wgmma_wide(t.m, t.n, stride, halo_wgmma_reg_a(t.n, o.residual));
    }
    l.tiles = t;
    return l;
  }
  const WgmmaKernel wg = conv_gemm_wgmma_kernel(tiles, s);
  ConvTiles t = tiles.k == kGemmStemK ? ConvTiles{128, 32, kGemmK, 2} : tiles;
  t.wgmma = wg == WgmmaKernel::Direct || wg == WgmmaKernel::Gather;
  t.persistent = false;
  if (t.k == kGemmHaloK) {
    t.k = kGemmK;
    t.m = std::min(t.m, 128);
    t.n = std::max(t.n, 32);
  }
  const bool direct = (t.splits == 1 || t.wgmma) && conv_gemm_direct_fits(s) && o.x_aligned;
  l.path = direct ? GemmPath::Direct : GemmPath::Gather;
  l.tma = t.wgmma && direct && !o.up && conv_gemm_direct_tma(s, t);
  l.up = o.up;
  l.pro = o.pro;
  const int64_t ktiles = std::max<int64_t>(1, (s.c * s.r * s.s + kGemmK - 1) / kGemmK);
  while (t.splits > ktiles) t.splits /= 2;
  const int64_t split_ktiles = (ktiles + t.splits - 1) / t.splits;
  if (!direct && !t.wgmma && split_ktiles + 1 < t.stages) t.stages = int(split_ktiles + 1);
  l.tiles = t;
  return l;
}

// gemm's conv pair kernel (conv_pair_fits) has one geometry: explain's tiles column for it.
inline std::string conv_pair_tiles_str() {
  return "8x8 squares x " + std::to_string(kPairMaxCout) + " channels wgmma";
}

// -- scalar (cuda::conv_scalar): its stem path where the shape fits it (conv_scalar_stem_fits),
// the depthwise path on groups == C where a tile one output row high stages within kDwMaxSmem,
// the grouped path (conv_scalar_grouped_channels), else the kernel that runs every shape --
enum class ScalarPath : uint8_t { General, Stem, Depthwise, Grouped };

// The depthwise path's tile columns (conv_scalar.cu's header comment): items of kDwV outputs
// along a row, at most kDwMaxGroups of them across a tile, the staged window in kDwMaxSmem.
constexpr int kDwV = 4;
constexpr int kDwMaxGroups = 64;
constexpr int kDwMaxSmem = 48 * 1024;  // the default dynamic shared-memory limit

// float4 reads per window row of an item (the unrolled windows): its 4 outputs read
// (4 - 1) * sw + s consecutive columns, starting sh4 columns into a 16-byte aligned float4.
EPILOG_HD constexpr int dw_row_vecs(int s, int sw, int sh4) {
  return (sh4 + (kDwV - 1) * sw + s + 3) / 4;
}

// Where a row's first tap, input column ow0 * sw - pad_l with ow0 % 4 == 0, lies in its 16-byte
// group: the same for every tile and item, (-pad_l) mod 4.
inline int first_tap_phase(const ConvShape& s) {
  return int(((-s.pad_l) % 4 + 4) % 4);
}

// A depthwise tile's columns: ctiles tiles across a row of ncg items (tw outputs), staging `cols`
// columns from sh4 on in rows wp floats apart. vec_in: 16-byte copies (w % 4 == 0, x aligned).
struct DwColumns {
  bool unit;  // an unrolled window: r = s in {3, 5, 7}, dil_w 1, stride_w 1 or 2
  int sh4;
  int64_t ctiles, ncg, tw, cols, wp;
};
inline DwColumns dw_columns(const ConvShape& s, bool vec_in) {
  DwColumns d{};
  d.unit = s.dil_w == 1 && (s.stride_w == 1 || s.stride_w == 2) && s.r == s.s &&
           (s.r == 3 || s.r == 5 || s.r == 7);
  d.sh4 = vec_in ? first_tap_phase(s) : 0;
  const int64_t sw = s.stride_w, ncg_all = (s.wo + kDwV - 1) / kDwV;
  d.ctiles = (ncg_all + kDwMaxGroups - 1) / kDwMaxGroups;
  d.ncg = (ncg_all + d.ctiles - 1) / d.ctiles;
  d.tw = d.ncg * kDwV;
  // Every tap of the tile's outputs, and every float4 the unrolled reads touch.
  int64_t cols = d.sh4 + (d.tw - 1) * sw + (s.s - 1) * s.dil_w + 1;
  if (d.unit)
    cols = std::max<int64_t>(cols, 4 * ((d.ncg - 1) * sw + dw_row_vecs(int(s.s), int(sw), d.sh4)));
  d.cols = (cols + 3) / 4 * 4;
  d.wp = d.cols;
  while ((d.wp / 4 - d.ncg * sw) % 8 != 0) d.wp += 4;  // conflict-free float4 reads
  return d;
}
// Input rows a tile of th output rows stages.
inline int64_t dw_staged_rows(const ConvShape& s, int64_t th) {
  return (th - 1) * s.stride_h + (s.r - 1) * s.dil_h + 1;
}
inline bool conv_scalar_depthwise_fits(const ConvShape& s, bool x_aligned) {
  if (s.c != s.groups || s.c < 1) return false;
  const DwColumns d = dw_columns(s, s.w % 4 == 0 && x_aligned);
  return dw_staged_rows(s, 1) * d.wp * 4 <= kDwMaxSmem;
}
inline ScalarPath conv_scalar_path(const ConvShape& s, bool x_aligned) {
  if (conv_scalar_stem_fits(s)) return ScalarPath::Stem;
  if (conv_scalar_depthwise_fits(s, x_aligned)) return ScalarPath::Depthwise;
  if (conv_scalar_grouped_channels(s) > 0) return ScalarPath::Grouped;
  return ScalarPath::General;
}
// explain's tiles column for it: "stem m=<pixels a block> n=<Cout>", "grouped m=<pixels a
// block> n=<output channels a block>", "depthwise" (its tiles are sized at launch from the plane
// and the grid), "general m=<pixels a block> n=1".
inline std::string scalar_launch_str(ScalarPath p, const ConvShape& s) {
  switch (p) {
    case ScalarPath::Stem:
      return "stem " + conv_tiles_str({kScalarThreads * kStemItemOutputs, int(s.k)});
    case ScalarPath::Grouped:
      return "grouped " +
             conv_tiles_str({kScalarThreads * kStemItemOutputs, conv_scalar_grouped_block(s)});
    case ScalarPath::Depthwise:
      return "depthwise";
    case ScalarPath::General:
      break;
  }
  return "general " + conv_tiles_str({kScalarThreads, 1});
}

// -- gemv (cuda::conv_gemv, and cuda::linear at few rows): rows of x a warp sums at once, output
// columns a block (one a warp) --
constexpr int kGemvRows = 8, kGemvCols = 8;

// -- linear (cuda::linear): the gemv kernel for up to kGemvRows rows (a weight stream), else
// tiles of the product --
inline bool linear_runs_gemv(int64_t rows) {
  return rows <= kGemvRows;
}
inline const char* linear_launch_str(int64_t rows) {
  return linear_runs_gemv(rows) ? "gemv" : "tiled";
}

// -- matmul (cuda::matmul): TF32 tensor-core tiles (mma.sync m16n8k8, fp32 sums) for products at
// least an mma deep (k >= 8) and wide (n >= 8), else the fp32 SIMT tiles. Below that an m16n8k8
// multiplies mostly the zeros that pad k or n, and such products (a GEMV-like column, a sum of a
// few terms) stay exact in fp32; where exactly the SIMT tiles stop losing is to be measured.
// m plays no part: the launcher may fold a batch into it. --
constexpr int kMatmulTf32M = 64, kMatmulTf32N = 64, kMatmulTf32K = 32;  // 2 stages (cp.async)
constexpr int kMatmulSimtM = 64, kMatmulSimtN = 64, kMatmulSimtK = 16;
inline bool matmul_runs_tf32(int64_t n, int64_t k) {
  return n >= 8 && k >= 8;
}
// explain's tiles column for it: "tf32 m=64 n=64 k=32 stages=2" or "simt m=64 n=64 k=16".
inline std::string matmul_launch_str(int64_t n, int64_t k) {
  return matmul_runs_tf32(n, k)
             ? "tf32 " + conv_tiles_str({kMatmulTf32M, kMatmulTf32N, kMatmulTf32K, 2})
             : "simt " + conv_tiles_str({kMatmulSimtM, kMatmulSimtN, kMatmulSimtK});
}

// -- maxpool2d (cuda::maxpool2d, maxpool2d_chain): maxpool_kernel (shapes.h) picks; a chain of
// `count` "same" pools is one launch --
inline std::string maxpool_launch_str(MaxPoolKernel k, int count = 1) {
  const char* name = k == MaxPoolKernel::Same    ? "same"
                     : k == MaxPoolKernel::Plane ? "plane"
                                                 : "window";
  return count > 1 ? std::string(name) + " chain=" + std::to_string(count) : std::string(name);
}

}  // namespace epilog
