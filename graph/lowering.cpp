// Kernel selection for fused convolutions and the lowering of a graph to a plan.
#include "epilog/graph/lowering.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "epilog/graph/pattern.h"
#include "epilog/kernels/launch.h"
#include "epilog/runtime/params.h"

namespace epilog {

DeviceProfile h200_profile() {
  return {"NVIDIA H200 (default profile)", 132, false};
}

std::optional<ConvKernel> parse_conv_kernel(const std::string& name) {
  for (ConvKernel k : {ConvKernel::Scalar, ConvKernel::Tiled, ConvKernel::Gemm, ConvKernel::Gemv})
    if (name == conv_kernel_name(k)) return k;
  return std::nullopt;
}

// -- the thresholds --
// Each rule was chosen by tools/conv_bench --sweep (every built tile on the suite's and the
// YOLO-like model's layers) and checked on the model in A/B calls. Each comment says what the
// rule is, why, and the docs/perf-history.md entry that holds the measurements.

// Below this reduction depth (Cin/groups * Kh * Kw) gemm's 32-deep k tiles are mostly zero
// padding and tiled wins; gemm wins from 27 up (since the cheap activation), even at 8 output
// channels. 16 lies between. perf-history: "tile sweep".
constexpr int64_t kGemmMinReduction = 16;

// A linear layer (a 1x1 conv over a 1x1 plane: the fusion pass makes one of each linear) at
// a batch of at most this many rows streams its weights through the gemv kernel: each weight is
// used that many times only, and gemm's tiles leave most SMs idle on so few rows. perf-history:
// "linear as a 1x1 conv".
constexpr int64_t kGemvMaxRows = 8;

// A gemm grid should hold this many waves of blocks (times the SM count), with a 2-stage
// pipeline...
constexpr double kGemmWaves = 2.0;
// ...unless the reduction is deeper than this: then a block's work hides its start-up, so the
// larger tile wins at under one wave, and a third stage pays (a shallow one does not).
// perf-history: "tile sweep".
constexpr int64_t kGemmDeepReduction = 256;
constexpr double kGemmDeepWaves = 0.75;
// Grids (tiles x splits) under kGemmWaves waves take this many stages: with a block or two an
// SM, deeper copies cost no occupancy. perf-history: "small-grid tiles".
constexpr int kGemmSmallGridStages = 4;
// ...on tiles of up to this many outputs: four stages of them (at most 82 KB) still let two
// blocks share an SM; a 128x128 block at 4 stages fills one alone.
constexpr int kGemmSmallGridMaxTile = 64 * 64;

// The 3x3 halo kernel (k = 72, 256 output pixels per block) from this many waves of its blocks:
// below, too few blocks each walk the whole reduction and the gather kernel wins.
// perf-history: "tile sweep".
constexpr double kHaloMinWaves = 0.5;
// ...and from this many input channels: a stage holds 8, and with fewer its MMAs and copies are
// partly zeros. perf-history: "halo stride 2 and depthwise decode".
constexpr int64_t kHaloMinChannels = 8;
// ...and where the 8x8 squares waste little of the output plane: at least this fraction of
// their pixels exist (20x20 outputs sit in 24x24 of squares, 69%, and lose).
// perf-history: "no halo kernel on wasted squares".
constexpr double kHaloMinUseful = 0.8;
// The wgmma halo kernel (stride 1) still wins at 69%; below that it was not measured, so it is
// not chosen there. perf-history: "wgmma halo weights per n tile".
constexpr double kHaloWgmmaMinUseful = 0.68;
// At stride 2 the wgmma halo kernel wins from this many input channels, with n covering Cout
// and as many stages as fit, up to 4 (3 for 256x128), where the squares waste under a fifth of
// the plane and the tiles make half a wave: m = 256 for n = 128 where that grid fills, else 128.
// Below 32 channels see halo_wgmma_tiles. perf-history: "wgmma halo stride 2", "16-wide halo
// tiles". On grids too small for either halo kernel's 4-square blocks (under kHaloMinWaves) it
// takes stride 2 with 64x64 tiles from kHaloWgmmaMinWaves, at any depth, ahead of the gather
// kernel. perf-history: "small-grid tiles".
constexpr int64_t kHaloWgmmaStride2MinChannels = 32;
// ...in as many stages as fit where the reduction has more than this many stages of 8 channels,
// else kHaloWgmmaStages: a pipeline as deep as the reduction is all prologue.
// perf-history: "16-wide halo tiles".
constexpr int64_t kHaloWgmmaStride2DeepSteps = 4;
// ...but at n = 64 where its 128 x 64 blocks make under this many waves, 64x64 tiles in 3
// stages: more, smaller blocks fill the SMs. perf-history: "64x64 stride-2 halo tiles".
constexpr double kHaloWgmmaStride2NarrowWaves = 2.0;
// At stride 2 a block's input patches are 2.9 times those of stride 1 (17x17 vs 10x10 inputs
// under an 8x8 square): two stages (95 KB at n = 32) let two blocks share an SM, three do not.
// perf-history: "halo stride 2 and depthwise decode".
constexpr int kHaloStride2Stages = 2;
// The halo kernel on warpgroup MMA (Hopper), at stride 1: n covering Cout with m = 256 for
// n = 128, else 128, and 64x16 up to 16 output channels; where that grid is under kHaloMinWaves
// waves, 64x64 (n <= Cout cover), then 64x32. With A from registers (conv_gemm_wgmma.cuh)
// n = 128 wants four warpgroups a block, and 64x64 beats the tiles of as many blocks.
// 3 pipeline stages: a fourth pays only on some small grids (below) and loses elsewhere.
// perf-history: "wgmma halo three stages", "register A", "16-wide halo tiles".
constexpr int kHaloWgmmaStages = 3;
// ...and at stride 1, tiles up to 64x64 take as many as fit up to 4 where their grid is under
// one wave (a block an SM at most). perf-history: "small-grid tiles".
constexpr int kHaloWgmmaSmallGridStages = 4;
// At stride 1 gemm's persistent halo kernel (halo_persistent_fits) from this many output
// channels (its 64x32 tiles): it loads a block's weights once for several squares. At 16 or
// fewer the plain 64x16 tiles are as fast or faster. perf-history: "persistent halo kernel",
// "persistent halo from 17 channels".
constexpr int64_t kPersistentMinCout = 17;
// At stride 1 the wgmma halo kernel's last tiles, 64x32, may make fewer blocks than
// kHaloMinWaves asks, down to this many waves; so may their split form, the last fallback.
// Below, a grid over a deep reduction is too short a chain of blocks, and the gather kernel in
// splits wins. perf-history: "small-grid tiles", "split 64x32 halo tiles on small grids".
constexpr double kHaloWgmmaMinWaves = 0.375;

// The 1x1 direct kernel on warpgroup MMA (Hopper), from kDirectWgmmaMinCout output channels
// and one wave of its tiles: 64 pixels (one warpgroup, so that several blocks share an SM and
// one's epilogue runs under another's MMAs) by n covering Cout. 4 stages where one n tile
// covers Cout (each A tile read once, from DRAM) from kDirectWgmmaDeepInput input channels, or
// at n = 128; else 3 (two n tiles sharing an A tile find it in L2). Not measured below 32 output
// channels. Where the Cout-covering tiles make under a wave, half as many channels a tile if
// those make one (A is read once an n tile, so no narrower), with 4 stages under two waves.
// perf-history: "wgmma direct kernel", "direct stages by Cout cover", "same-window pools and
// n = 128 stages", "small-grid tiles".
constexpr int64_t kDirectWgmmaMinCout = 32;
constexpr double kDirectWgmmaMinWaves = 1.0;
constexpr int64_t kDirectWgmmaDeepInput = 256;

// The same kernel gathering its A tiles (any other shape; odd planes such as 7x7 since
// perf-history "wgmma gather on odd planes"), for deep
// reductions (over kGemmDeepReduction) where the halo kernels do not take the layer: 64 x
// Cout-covering tiles in 4 stages from kGatherWgmmaMinWaves waves of them, else the mma.sync
// gather kernel (split). Shallower reductions and other windows were not measured and keep the
// mma.sync kernels. Under kGatherWgmmaSplitWaves, each SM's block walks the whole reduction
// alone: split it (split_count) as the mma.sync gather kernel does.
// perf-history: "wgmma gather kernel", "copies under the wgmmas".
constexpr double kGatherWgmmaMinWaves = 0.75;
constexpr double kGatherWgmmaSplitWaves = 1.0;
// ...in 3 stages on 1x1 windows (odd planes, strided 1x1s): ConvNeXt-T's 768 -> 3072 on 7x7 at
// batch 16 took 38.5 us in 3 stages against 49.5 in 4 (conv_bench sweep, H100).
constexpr int kGatherWgmma1x1Stages = 3;

// Split-K (the gather kernel; a tile's blocks form one thread-block cluster, which sums their
// accumulators in shared memory): a block's k tiles run one after another, each paying a load
// latency, so a small grid over a deep reduction waits on the chain, not on the SMs. Splits
// double while the grid stays within kSplitMaxWaves waves and every split keeps kSplitMinKTiles
// k tiles (the cluster's exchange costs about a microsecond). Not on 1x1 layers the direct
// kernel takes (unpadded, stride 1): splitting moves them to the gather kernel, which is slower
// at every split count. At most kMaxSplits, the portable cluster size.
// perf-history: "gather split-K", "small-grid tiles".
constexpr int kMaxSplits = 8;
constexpr double kSplitMaxWaves = 2.0;
constexpr int64_t kSplitMinKTiles = 8;
// Where only 32x32 tiles make the waves (small grids: the YOLO-like model's 20x20 and 40x40
// layers at batch 1), tile and splits are chosen together: the largest tile whose grid, split as
// far as the rule above allows, makes the waves. A block then walks fewer k tiles of a wider
// tile. perf-history: "small-grid tiles".

// The wgmma halo kernel split-K (its one-square tiles; a tile's splits one cluster, as above):
// where its 64-pixel tiles make under kHaloMinWaves waves, splits double while the grid stays
// within kSplitMaxWaves waves and every split keeps kHaloSplitMinStages of the 8-channel stages;
// and where whole 64x32 tiles make too few blocks for any rule above, it takes them split if that
// grid makes kHaloMinWaves. Splits that leave fewer stages, and grids of over half a wave, lose.
// perf-history: "halo split-K"; tried: "halo split to 2 stages, or up to a wave".
constexpr int64_t kHaloSplitMinStages = 4;

// An image network's first layer (conv_scalar_stem_fits: 3x3 over <= 4 channels into <= 16)
// that gemm's stem kernel does not take (strides that differ; see kGemmStemTilesPerBlock) goes
// to scalar's stem path, a thread computing 4 pixels x all output channels from one read of its
// inputs, from this many of its 256-item blocks per SM; smaller grids keep gemm. Measured at 3
// input channels; 1, 2 and 4 take the same path unmeasured. perf-history: "scalar stem path",
// "stem loads a row ahead".
constexpr double kStemMinBlocksPerSm = 0.75;
// gemm's stem kernel takes those layers where it can (the same stride both ways): tiles of 64
// output columns by the most rows, 8, 4 or 2, whose tiles number at least kGemmStemTilesPerBlock
// times its persistent grid (kGemmStemBlocksPerSm blocks an SM, shapes.h), else 2: the most rows
// that still keep every block busy. The rule misses batch 2 by 8%. perf-history: "gemm stem
// kernel".
constexpr double kGemmStemTilesPerBlock = 3.0;
// ...from this many of its 2-row tiles an SM; below, gemm's generic rules (the gather kernel),
// which win on grids that small. perf-history: "gemm stem kernel".
constexpr double kGemmStemMinTilesPerSm = 0.5;

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// gemm's stem kernel's tiles of kGemmStemCols output columns by `rows` rows.
int64_t stem_tiles(const ConvShape& s, int rows) {
  return s.n * ceil_div(s.ho, rows) * ceil_div(s.wo, kGemmStemCols);
}

// Whether gemm's stem kernel takes `s` (kGemmStemMinTilesPerSm): the selector's rule and the
// gemm tiles both ask.
bool gemm_stem_takes(const ConvShape& s, const DeviceProfile& device) {
  return conv_gemm_stem_fits(s) &&
         double(stem_tiles(s, 2)) >= kGemmStemMinTilesPerSm * device.sm_count;
}

// Split-K for a grid of `blocks` tiles over `steps` pipeline steps (either kernel's): splits
// double while the grid stays within kSplitMaxWaves waves and every split keeps `min_steps`.
int split_count(int64_t blocks, int64_t steps, int64_t min_steps, int sms) {
  int splits = 1;
  while (splits < kMaxSplits && double(blocks * splits * 2) <= kSplitMaxWaves * sms &&
         steps >= min_steps * splits * 2)
    splits *= 2;
  return splits;
}

}  // namespace

ConvChoice select_conv_kernel(const ConvShape& s, const DeviceProfile& device) {
  const int64_t reduction = s.c / s.groups * s.r * s.s;
  if (s.groups != 1)
    return {ConvKernel::Scalar, "groups > 1: scalar (depthwise and grouped paths)"};
  if (conv_supports(ConvKernel::Gemv, s) && s.n <= kGemvMaxRows)
    return {ConvKernel::Gemv, fmt::format("linear layer, {} rows <= {}: gemv streams the weights",
                                          s.n, kGemvMaxRows)};
  if (gemm_stem_takes(s, device))
    return {ConvKernel::Gemm,
            fmt::format("3x3, {} -> {} channels, {} tiles >= {} per SM: gemm's stem kernel", s.c,
                        s.k, stem_tiles(s, 2), kGemmStemMinTilesPerSm)};
  if (conv_scalar_stem_fits(s)) {
    const int64_t blocks = ceil_div(conv_scalar_stem_items(s), kScalarThreads);
    if (double(blocks) >= kStemMinBlocksPerSm * device.sm_count)
      return {ConvKernel::Scalar,
              fmt::format("3x3, {} -> {} channels, {} blocks >= {} per SM: scalar's stem path", s.c,
                          s.k, blocks, kStemMinBlocksPerSm)};
  }
  if (reduction < kGemmMinReduction)
    return {ConvKernel::Tiled,
            fmt::format("reduction {} < {}: tiled", reduction, kGemmMinReduction)};
  // Scalar wins no groups == 1 suite shape (tiled is faster even on the smallest), so it is
  // left to grouped convolutions. perf-history: "tile sweep".
  return {ConvKernel::Gemm, fmt::format("reduction {} >= {}: gemm", reduction, kGemmMinReduction)};
}

namespace {

// The smallest of `sizes` (ascending) that covers `extent`, else the largest.
int smallest_covering(const std::vector<int>& sizes, int64_t extent) {
  for (int size : sizes)
    if (size >= extent) return size;
  return sizes.back();
}

// Squares of 8x8 outputs a halo kernel covers; a plane that 8 does not divide is padded up.
int64_t halo_squares(const ConvShape& s) {
  return s.n * ceil_div(s.ho, 8) * ceil_div(s.wo, 8);
}

// Blocks of m / 64 squares by n channels.
int64_t halo_blocks(const ConvShape& s, int m, int n) {
  return ceil_div(halo_squares(s), m / 64) * ceil_div(s.k, n);
}

// Whether a halo kernel may take `s` at all: its window, enough input channels, little waste.
bool halo_takes(const ConvShape& s, double min_useful = kHaloMinUseful) {
  return conv_gemm_halo_fits(s) && s.c >= kHaloMinChannels &&
         double(s.n * s.ho * s.wo) >= min_useful * double(halo_squares(s) * 64);
}

bool halo_wins(const ConvShape& s, int n_tile, const DeviceProfile& device) {
  if (!halo_takes(s)) return false;
  return double(halo_blocks(s, 256, n_tile)) >= kHaloMinWaves * device.sm_count;
}

// Splits for a wgmma halo grid of `blocks` one-square tiles (see kHaloSplitMinStages): none
// from half a wave; its steps are stages of 8 input channels.
int halo_splits(const ConvShape& s, int64_t blocks, const DeviceProfile& device) {
  if (double(blocks) >= kHaloMinWaves * device.sm_count) return 1;
  return split_count(blocks, ceil_div(s.c, 8), kHaloSplitMinStages, device.sm_count);
}

// The wgmma halo tiles for `s`, or nullopt where that kernel does not take it.
std::optional<ConvTiles> halo_wgmma_tiles(const ConvShape& s, int cover,
                                          const DeviceProfile& device) {
  if (!device.wgmma) return std::nullopt;
  if (!halo_takes(s, s.stride_h == 2 ? kHaloMinUseful : kHaloWgmmaMinUseful)) return std::nullopt;
  const auto fills = [&](int m, int n, double waves = kHaloMinWaves, int splits = 1) {
    return double(halo_blocks(s, m, n) * splits) >= waves * device.sm_count;
  };
  // Tiles of one square split where their grid is small.
  const auto split = [&](ConvTiles t) {
    if (t.m == 64) t.splits = halo_splits(s, halo_blocks(s, t.m, t.n), device);
    return t;
  };
  if (s.stride_h == 2) {
    if (s.c >= kHaloWgmmaStride2MinChannels) {
      int m = 128;
      if (cover == 128 && fills(256, 128)) m = 256;
      if (cover == 64 && !fills(128, 64, kHaloWgmmaStride2NarrowWaves)) m = 64;
      const int stages = m > 64 && ceil_div(s.c, 8) > kHaloWgmmaStride2DeepSteps
                             ? halo_wgmma_max_stages(m, cover, 2)
                             : kHaloWgmmaStages;
      if (fills(m, cover)) return ConvTiles{m, cover, 72, stages, 1, true};
    } else if (fills(128, cover)) {
      // Below kHaloWgmmaStride2MinChannels: 128 x Cout-cover tiles where they make half a wave, in
      // 3 stages, at any batch: ahead of the mma.sync halo kernel at every batch measured but 2.
      // perf-history: "narrow stride 2 on wgmma", "narrow stride 2 without a wave cap".
      return ConvTiles{128, cover, 72, kHaloWgmmaStages, 1, true};
    }
    // Grids too small for either halo kernel's 4-square blocks: 64x64 tiles from
    // kHaloWgmmaMinWaves, at any depth.
    if (cover >= 64 && !fills(256, cover) && fills(64, 64, kHaloWgmmaMinWaves))
      return split({64, 64, 72, kHaloWgmmaStages, 1, true});
  } else {
    if (halo_persistent_fits(s) && s.k >= kPersistentMinCout)
      return ConvTiles{64, 32, 72, kHaloWgmmaStages, 1, true, true};
    struct Candidate {
      int m, n;
      double waves;
    };
    // Up to 16 output channels, 64x16 tiles (m64n16 wgmmas), see kHaloWgmmaStages.
    const bool narrow = s.k <= 16;
    const int m0 = narrow ? 64 : cover == 128 ? 256 : 128, n0 = narrow ? 16 : cover;
    for (const auto& [m, n, waves] :
         {Candidate{m0, n0, kHaloMinWaves}, {64, 64, kHaloMinWaves}, {64, 32, kHaloWgmmaMinWaves}})
      if (n <= cover && fills(m, n, waves)) {
        const bool small = m * n <= 64 * 64 && double(halo_blocks(s, m, n)) < device.sm_count;
        const int stages = small
                               ? std::min(kHaloWgmmaSmallGridStages, halo_wgmma_max_stages(m, n, 1))
                               : kHaloWgmmaStages;
        return split({m, n, 72, stages, 1, true});
      }
  }
  const ConvTiles t = split({64, 32, 72, kHaloWgmmaSmallGridStages, 1, true});
  if (t.splits > 1 && fills(64, 32, kHaloWgmmaMinWaves, t.splits)) return t;
  return std::nullopt;
}

}  // namespace

ConvTiles conv_tiles(ConvKernel kernel, const ConvShape& s, const DeviceProfile& device,
                     bool tensor_copies) {
  const int64_t pixels = s.n * s.ho * s.wo;
  const int sms = device.sm_count;
  ConvTiles t;
  switch (kernel) {
    case ConvKernel::Scalar:
      // Output pixels a block and channels a thread: one output a thread, or on the stem and
      // grouped paths (taken whenever they fit) items of kStemItemOutputs pixels by every
      // channel (of a group's chunk of at most kStemMaxCout).
      t.m = kScalarThreads;
      t.n = 1;
      if (conv_scalar_stem_fits(s)) {
        t.m = kScalarThreads * kStemItemOutputs;
        t.n = int(s.k);
      } else if (const int kc = conv_scalar_grouped_block(s)) {
        t.m = kScalarThreads * kStemItemOutputs;
        t.n = kc;
      }
      break;
    case ConvKernel::Tiled:
      // 64 pixels, or 32 where 64 makes under two waves: m = 128 is never faster on the suite.
      // perf-history: "tile sweep".
      t.n = smallest_covering({8, 16, 32}, s.k);
      t.m = ceil_div(pixels, 64) * ceil_div(s.k, t.n) >= 2 * int64_t(sms) ? 64 : 32;
      t.k = 8;  // input channels staged per step
      break;
    case ConvKernel::Gemv:
      t.m = kGemvRows;  // rows of x a warp sums at once (launch.h)
      t.n = kGemvCols;  // output columns a block, one a warp
      break;
    case ConvKernel::Gemm: {
      const int cover = smallest_covering({32, 64, 128}, s.k);
      const auto tiles_of = [&](int m, int n) { return ceil_div(pixels, m) * ceil_div(s.k, n); };
      t.stages = 3;
      if (gemm_stem_takes(s, device)) {
        t = {128, 16, kGemmStemK, 0};
        for (int rows : {8, 4}) {
          if (double(stem_tiles(s, rows)) >= kGemmStemTilesPerBlock * kGemmStemBlocksPerSm * sms) {
            t.m = kGemmStemCols * rows;
            break;
          }
        }
        break;
      }
      if (const auto wg = halo_wgmma_tiles(s, cover, device)) {
        t = *wg;
        break;
      }
      if (device.wgmma && conv_gemm_direct_fits(s) && s.k >= kDirectWgmmaMinCout) {
        // n covering Cout, else half of it (not under 32): the first whose tiles make a wave.
        const auto fills = [&](int n) {
          return n >= 32 && double(tiles_of(64, n)) >= kDirectWgmmaMinWaves * sms;
        };
        // Where A comes by tensor copies (conv_gemm_direct_tma), half the covering n wherever those
        // tiles make a wave, and 3 stages from two waves: a block then issues no copies but one
        // thread's, and smaller blocks, more of them an SM, hide each other's waits; the sweep put
        // these tiles first on the model's batch-16 1x1 layers. perf-history: "tensor copies for
        // the 1x1". That was on planes of whole tiles; on the others (kDirectTmaMaxPad) tensor
        // copies were measured on the tiles the rule picks for cp.async, which they keep.
        // perf-history: "tensor copies on padded planes".
        const bool tma = tensor_copies && (s.h * s.w) % 64 == 0 &&
                         conv_gemm_direct_tma(s, ConvTiles{64, cover, 32, 3, 1, true});
        const int n = fills(cover) && !(tma && fills(cover / 2)) ? cover : cover / 2;
        if (fills(n)) {
          const bool four = (!tma && n >= s.k && (s.c >= kDirectWgmmaDeepInput || n == 128)) ||
                            double(tiles_of(64, n)) < kGemmWaves * sms;
          t = {64, n, 32, four ? 4 : 3, 1, true};
          break;
        }
      }
      if (halo_wins(s, cover, device)) {
        t.m = 256;
        t.n = cover;
        t.k = 72;  // 8 input channels x 9 taps per stage
        if (s.stride_h == 2) t.stages = kHaloStride2Stages;
        break;
      }
      // Split-K where few blocks would each walk a long reduction (clusters: Hopper on), on the
      // gather kernels only.
      const int64_t ktiles = ceil_div(s.c * s.r * s.s, 32);
      const auto splits_for = [&](int64_t blocks) {
        return split_count(blocks, ktiles, kSplitMinKTiles, sms);
      };
      const ConvTiles gather{64, cover, 32, s.r * s.s == 1 ? kGatherWgmma1x1Stages : 4, 1, true};
      const int64_t gather_tiles = tiles_of(64, cover);
      if (device.wgmma && conv_gemm_wgmma_kernel(gather, s) == WgmmaKernel::Gather &&
          s.k >= kDirectWgmmaMinCout && s.c * s.r * s.s > kGemmDeepReduction &&
          double(gather_tiles) >= kGatherWgmmaMinWaves * sms) {
        t = gather;
        if (double(gather_tiles) < kGatherWgmmaSplitWaves * sms)
          t.splits = splits_for(gather_tiles);
        break;
      }
      // The largest tile (m x n, then the wider n) whose grid has the waves it needs, else the
      // smallest: a small grid of narrow tiles beats a few wide ones. perf-history: "tile sweep".
      const bool deep = s.c * s.r * s.s > kGemmDeepReduction;
      const double waves = deep ? kGemmDeepWaves : kGemmWaves;
      t.k = 32;
      t.stages = deep ? 3 : 2;
      t.m = t.n = 32;
      // The largest tile m x n (n not past the Cout cover, m not past the pixels') for which
      // fill(m, n) holds: rows past the last pixel are zeros the MMAs still multiply (a linear
      // layer's few rows). perf-history: "tiles no taller than the pixels".
      const int m_cover = smallest_covering({32, 64, 128}, pixels);
      const auto largest = [&](auto fill) {
        int best_area = 0;
        for (int n : {128, 64, 32})
          for (int m : {128, 64, 32})
            if (n <= cover && m <= m_cover && m * n > best_area && fill(m, n)) {
              best_area = m * n;
              t.m = m;
              t.n = n;
            }
      };
      largest([&](int m, int n) { return double(tiles_of(m, n)) >= waves * sms; });
      if (device.cc_major >= 9 && !conv_gemm_direct_fits(s)) {
        if (t.m == 32 && t.n == 32)
          largest([&](int m, int n) {
            const int64_t blocks = tiles_of(m, n);
            return double(blocks * splits_for(blocks)) >= waves * sms;
          });
        t.splits = splits_for(tiles_of(t.m, t.n));
      }
      if (t.m * t.n <= kGemmSmallGridMaxTile &&
          double(tiles_of(t.m, t.n) * t.splits) < kGemmWaves * sms)
        t.stages = kGemmSmallGridStages;
      break;
    }
  }
  return t;
}

std::vector<ConvTiles> conv_built_tiles(ConvKernel kernel, const DeviceProfile& device) {
  std::vector<ConvTiles> out;
  if (kernel == ConvKernel::Gemv) {
    out.push_back({8, 8});
  } else if (kernel == ConvKernel::Tiled) {
    for (int m : {32, 64, 128})
      for (int n : {8, 16, 32}) out.push_back({m, n, 8, 0});
  } else if (kernel == ConvKernel::Gemm) {
    for (int m : {32, 64, 128})
      for (int n : {32, 64, 128})
        for (int stages : {2, 3, 4}) out.push_back({m, n, 32, stages});
    // Split-K on every tile, at the depths lowering gives split grids (3; 4 on small ones).
    for (int m : {32, 64, 128})
      for (int n : {32, 64, 128})
        for (int stages : {3, 4})
          for (int splits : {2, 4, 8}) out.push_back({m, n, 32, stages, splits});
    // The stem kernel; on other shapes its tiles run the gather kernel.
    for (int m : {128, 256, 512}) out.push_back({m, 16, kGemmStemK, 0});
    // The 3x3 halo kernel; on other shapes these tiles run the k = 32 kernel.
    for (int m : {64, 128, 256})
      for (int n : {32, 64, 128})
        for (int stages : {2, 3, 4}) out.push_back({m, n, 72, stages});
    // ...and on warpgroup MMA (stages past what shared memory holds run as many as fit), with
    // the 1x1 direct kernel's tiles (on other shapes they run the mma.sync k = 32 kernels).
    if (device.wgmma) {
      for (int m : {64, 128, 256})
        for (int n : {16, 32, 64, 128})
          for (int stages : {3, 4}) out.push_back({m, n, 72, stages, 1, true});
      // The persistent kernel's (on shapes it does not take, the same tiles as they are).
      for (int n : {16, 32}) out.push_back({64, n, 72, kHaloWgmmaStages, 1, true, true});
      // Split-K on its one-square tiles, those of the small grids.
      for (int n : {16, 32, 64, 128})
        for (int stages : {3, 4})
          for (int splits : {2, 4, 8}) out.push_back({64, n, 72, stages, splits, true});
      for (int m : {64, 128})
        for (int n : {32, 64, 128})
          for (int stages : {2, 3, 4}) out.push_back({m, n, 32, stages, 1, true});
      // ...and split-K on them (lowering takes 64 x n in 4 stages under a wave of gathering
      // tiles; the rest for conv_bench --sweep).
      for (int m : {64, 128})
        for (int n : {32, 64, 128})
          for (int stages : {3, 4})
            for (int splits : {2, 4, 8}) out.push_back({m, n, 32, stages, splits, true});
    }
  }
  return out;
}

namespace {

// Which kernel runs a resize (cuda::resize): nearest by integer factors that read input o / f as
// upsample_nearest does, else resize's own.
std::string resize_rule(const ResizeMode& m, const Shape& x, const Shape& y) {
  const int64_t fh = resize_nearest_factor(m, x[x.size() - 2], y[y.size() - 2]);
  const int64_t fw = resize_nearest_factor(m, x.back(), y.back());
  if (fh > 0 && fw > 0)
    return fmt::format("nearest by {}x{}, input o / factor: the upsample_nearest kernel", fh, fw);
  return "one kernel";
}

// Which of maxpool2d's kernels runs a pool (maxpool_kernel), and why.
std::string maxpool_rule(const PoolShape& p) {
  const int64_t floats = maxpool_plane_floats(p);
  switch (maxpool_kernel(p)) {
    case MaxPoolKernel::Same:
      return fmt::format("{0}x{0} at stride 1 padded by {1}: the plane with -inf borders", p.kh,
                         p.kh / 2);
    case MaxPoolKernel::Plane:
      return fmt::format("plane and row maxima {} <= {} floats: a plane a block", floats,
                         kPoolPlaneFloats);
    case MaxPoolKernel::Window:
      break;
  }
  return fmt::format("plane and row maxima {} > {} floats: an output a thread", floats,
                     kPoolPlaneFloats);
}

// A fused conv's weights packed for the wgmma kernels' tiles `t` (pack_wgmma_weights), or an
// undefined tensor where the weight is not a float32 initializer (known only at run time).
Tensor packed_weights(const Graph& g, const Node& node, const ConvShape& cs, const ConvTiles& t) {
  const std::string& w = node.inputs[1];
  const Tensor* init = g.is_weight(w) ? &g.weights.at(w).data : nullptr;
  if (!init || init->dtype() != DType::F32) return {};
  Tensor weight = init->to(Device::CPU);
  if (!weight.contiguous()) weight = weight.clone();
  Tensor packed = Tensor::empty({wgmma_packed_floats(cs, t)});
  pack_wgmma_weights(cs, t, static_cast<const float*>(weight.raw()),
                     static_cast<float*>(packed.raw()));
  return packed;
}

// The upsamplings a fused conv can read through (FoldedUpsample): conv <- concat (on the
// channels) <- upsample_nearest, the concat and the upsampling absorbed as the fusion rules
// absorb (can_absorb: one reader each, no graph output), on tiles that take it
// (conv_gemm_upsample_fits). One a conv: the YOLO neck's C2f blocks read one each. Why: the
// upsampling writes four times its input, which the conv then reads back; folded, neither
// happens. perf-history: "upsampling fold".
void fold_upsamples(const Graph& g, std::vector<NodePlan>& nodes, const DeviceProfile& profile) {
  const UseIndex uses(g);
  const Pat pattern = op(OpKind::FusedConv2d, {op(OpKind::Concat, {}, "cat")}, "conv");
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    NodePlan& np = nodes[i];
    if (g.nodes[i].op != OpKind::FusedConv2d || np.conv != ConvKernel::Gemm) continue;
    std::optional<Match> m = match(g, uses, pattern, int(i));
    if (!m) continue;
    const Node& cat = m->node("cat");
    if (g.value(cat.outputs[0]).shape.size() != 4) continue;
    const int64_t axis = cat.attrs.i("axis");
    if (axis != 1 && axis != -3) continue;
    const ConvShape cs = conv_shape(g, g.nodes[i]);
    int64_t c0 = 0;
    for (size_t slot = 0; slot < cat.inputs.size(); ++slot) {
      const std::string& part = cat.inputs[slot];
      const int u = uses.producer(part);
      const int64_t channels = g.value(part).shape[1];
      c0 += channels;
      if (u < 0 || g.nodes[size_t(u)].op != OpKind::UpsampleNearest) continue;
      const Node& up = g.nodes[size_t(u)];
      const std::vector<int64_t>& scale = up.attrs.ints("scale");
      Match with_up = *m;
      with_up.nodes.push_back(u);
      with_up.links.insert({m->node_of.at("cat"), slot});
      // Such a conv copies A by cp.async, whose tiles differ from the tensor copies' (conv_tiles).
      const ConvTiles plain = conv_tiles(np.conv, cs, profile, false);
      if (g.is_weight(up.inputs[0]) || !np.tiles.wgmma ||
          !conv_gemm_upsample_fits(cs, plain, scale[0], scale[1]) ||
          !can_absorb(g, uses, with_up, OpKind::FusedConv2d, nullptr).empty())
        continue;
      if (!(plain == np.tiles)) {
        np.tiles = plain;
        np.packed = packed_weights(g, g.nodes[i], cs, plain);
      }
      np.up = FoldedUpsample{up.name, up.inputs[0], c0 - channels, channels, scale[0], scale[1]};
      nodes[size_t(u)].folded_into = g.nodes[i].name;
      break;
    }
  }
}

// The conv -> conv folds below: calls fold(i, f) for each fused conv i that reads the output of
// the fused conv f, where the fusion rules would absorb f into i (can_absorb: i alone reads it,
// it is no graph output), neither has a residual and f has no fold of its own yet (a conv with
// one folded into it must run: that one's output is never made). Never under a forced kernel,
// which tests and benchmarks mean for every conv, nor without the wgmma kernels.
template <class Fold>
void for_conv_folds(const Graph& g, const std::vector<NodePlan>& nodes, const LowerOptions& options,
                    Fold&& fold) {
  if (options.force || !options.profile.wgmma) return;
  const UseIndex uses(g);
  const Pat pattern = op(OpKind::FusedConv2d, {op(OpKind::FusedConv2d, {}, "first")}, "conv");
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (g.nodes[i].op != OpKind::FusedConv2d || g.nodes[i].inputs.size() > 4) continue;
    std::optional<Match> m = match(g, uses, pattern, int(i));
    if (!m) continue;
    const size_t f = size_t(m->node_of.at("first"));
    if (g.nodes[f].inputs.size() > 4 || !nodes[f].folded_into.empty() || nodes[f].pre ||
        !can_absorb(g, uses, *m, OpKind::FusedConv2d, nullptr).empty())
      continue;
    fold(i, f);
  }
}

// A stem conv folded into the 3x3 stride-2 conv that alone reads it (FoldedConv): the pair
// kernel (conv_pair.cu) computes the first one's outputs where the second would load them, where
// it takes the two shapes (conv_pair_fits). Why: the first conv writes the model's largest
// tensor, which the second reads back (the YOLO-like model's first two layers).
// perf-history: "conv pair".
void fold_conv_pairs(const Graph& g, std::vector<NodePlan>& nodes, const LowerOptions& options) {
  for_conv_folds(g, nodes, options, [&](size_t i, size_t f) {
    const Node& first = g.nodes[f];
    const ConvShape a = conv_shape(g, first);
    if (!conv_pair_fits(a, conv_shape(g, g.nodes[i]))) return;
    nodes[i].pre = FoldedConv{first.name, a, conv_activation(first)};
    nodes[f].folded_into = g.nodes[i].name;
  });
}

// A 1x1 conv folded into the 3x3 conv whose output it alone reads (NodePlan::post): the first
// conv's kernel runs the 1x1 on its accumulators (conv_chain_fits) and stores only the 1x1's
// outputs. Where neither conv has another fold and the 1x1's weight, scale and shift are float32
// initializers (packed after the first conv's weights, pack_conv_chain). Why: the 1x1 reads back
// whole what the 3x3 wrote. perf-history: "conv chain".
void fold_conv_chains(const Graph& g, std::vector<NodePlan>& nodes, const LowerOptions& options) {
  const auto f32_weight = [&](const std::string& name) -> const Tensor* {
    if (!g.is_weight(name)) return nullptr;
    const Tensor& t = g.weights.at(name).data;
    return t.dtype() == DType::F32 ? &t : nullptr;
  };
  for_conv_folds(g, nodes, options, [&](size_t i, size_t f) {
    const Node &conv = g.nodes[i], &first = g.nodes[f];
    NodePlan& host = nodes[f];
    if (nodes[i].up || nodes[i].pre || !nodes[i].folded_into.empty() || host.up ||
        !host.packed.defined())
      return;
    const ConvShape b = conv_shape(g, conv);
    if (!conv_chain_fits(conv_shape(g, first), host.tiles, b)) return;
    const Tensor *w = f32_weight(conv.inputs[1]), *scale = f32_weight(conv.inputs[2]),
                 *shift = f32_weight(conv.inputs[3]);
    if (!w || !scale || !shift) return;
    const auto host_floats = [](const Tensor* t) {
      Tensor c = t->to(Device::CPU);
      return c.contiguous() ? c : c.clone();
    };
    const Tensor wc = host_floats(w), sc = host_floats(scale), fc = host_floats(shift);
    const int64_t a_floats = host.packed.numel();
    Tensor packed = Tensor::empty({a_floats + kChainTailFloats});
    std::memcpy(packed.raw(), host.packed.raw(), size_t(a_floats) * sizeof(float));
    pack_conv_chain(b, static_cast<const float*>(wc.raw()), static_cast<const float*>(sc.raw()),
                    static_cast<const float*>(fc.raw()),
                    static_cast<float*>(packed.raw()) + a_floats);
    host.packed = std::move(packed);
    host.post = FoldedConv{conv.name, b, conv_activation(conv)};
    nodes[i].folded_into = first.name;
  });
}

// SPPF's cascade of max-pools, each pooling the one before with the same "same" window: the
// first one's kernel computes up to kMaxPoolChain of them on the plane it staged, so the others
// launch nothing and read nothing back. The pools' outputs all stay (the concat reads them), so
// nothing is absorbed. perf-history: "pool chain".
void chain_pools(const Graph& g, std::vector<NodePlan>& nodes) {
  const UseIndex uses(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& pool = g.nodes[i];
    if (pool.op != OpKind::MaxPool2d) continue;
    const PoolShape p =
        pool_shape(pool, g.value(pool.inputs[0]).shape, g.value(pool.outputs[0]).shape);
    const int before = uses.producer(pool.inputs[0]);
    if (maxpool_kernel(p) != MaxPoolKernel::Same || before < 0) continue;
    const Node& prev = g.nodes[size_t(before)];
    if (prev.op != OpKind::MaxPool2d || !(prev.attrs == pool.attrs) ||
        g.value(prev.inputs[0]).shape != g.value(pool.inputs[0]).shape)
      continue;
    const std::string& head_name = nodes[size_t(before)].folded_into;
    const size_t head =
        head_name.empty() ? size_t(before) : size_t(g.find_node(head_name) - g.nodes.data());
    if (nodes[head].chain.size() + 1 >= size_t(kMaxPoolChain)) continue;
    nodes[head].chain.push_back(pool.name);
    nodes[i].folded_into = g.nodes[head].name;
  }
}

// The transform a fused_elementwise applies, where it is x [* scale] [+ shift] [relu] with
// per-channel float32 constants (C values along dim 1 of a 4-D x) and x is not broadcast.
std::optional<FoldedPrologue> prologue_of(const Graph& g, const Node& ew, int64_t c) {
  const Shape& x = g.value(ew.inputs[0]).shape;
  if (x.size() != 4 || x[1] != c || g.is_weight(ew.inputs[0]) ||
      x != g.value(ew.outputs[0]).shape)
    return std::nullopt;
  const auto per_channel = [&](int operand) {
    const std::string& name = ew.inputs[size_t(operand)];
    if (!g.is_weight(name) || g.weights.at(name).data.dtype() != DType::F32) return false;
    const Shape& s = g.value(name).shape;  // [C, 1, 1] or [1, C, 1, 1] against [N, C, H, W]
    return (s.size() == 3 || s.size() == 4) && s[s.size() - 3] == c && shape_numel(s) == c;
  };
  const ChainProgram prog = node_chain(ew);
  FoldedPrologue p;
  p.node = ew.name;
  int k = 0;
  const auto binary = [&](Binary op, int& slot) {
    if (k == prog.steps) return;
    const ChainStep& st = prog.step[k];
    if (st.operand > 0 && st.op == op && per_channel(st.operand)) slot = st.operand, ++k;
  };
  binary(Binary::Mul, p.scale);
  binary(Binary::Add, p.shift);
  if (k < prog.steps && prog.step[k].operand < 0 &&
      (prog.step[k].act.kind == Activation::Relu || prog.step[k].act.kind == Activation::None))
    p.act = prog.step[k++].act;
  if (k != prog.steps || (p.scale < 0 && p.shift < 0)) return std::nullopt;
  return p;
}

// DenseNet's batchnorm -> relu before each layer's 1x1 conv, a fused_elementwise only that conv
// reads: the conv's kernel applies it to x as it loads it (FoldedPrologue), so the elementwise's
// output, as large as x, is neither written nor read back. Exact for a 1x1 conv without padding
// (no padded zeros to transform); past the input channels the direct kernel transforms nothing
// and meets zero weights. Where the conv runs the wgmma direct kernel unsplit with no other fold.
// perf-history: "DenseNet prologue".
void fold_prologues(const Graph& g, std::vector<NodePlan>& nodes, const LowerOptions& options) {
  if (!options.prologue || options.force || !options.profile.wgmma) return;
  const UseIndex uses(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& conv = g.nodes[i];
    NodePlan& np = nodes[i];
    if (conv.op != OpKind::FusedConv2d || np.conv != ConvKernel::Gemm || !np.packed.defined() ||
        np.tiles.splits != 1 || np.up || np.pre || np.post || !np.folded_into.empty())
      continue;
    const ConvShape cs = conv_shape(g, conv);
    if (conv_gemm_wgmma_kernel(np.tiles, cs) != WgmmaKernel::Direct) continue;
    const int e = uses.producer(conv.inputs[0]);
    if (e < 0) continue;
    const Node& ew = g.nodes[size_t(e)];
    if (ew.op != OpKind::FusedElementwise || g.is_output(ew.outputs[0]) ||
        uses.consumers(ew.outputs[0]).size() != 1 || !nodes[size_t(e)].folded_into.empty())
      continue;
    std::optional<FoldedPrologue> pro = prologue_of(g, ew, cs.c);
    if (!pro) continue;
    np.pro = std::move(pro);
    nodes[size_t(e)].folded_into = conv.name;
  }
}

}  // namespace

Plan lower(Graph graph, const LowerOptions& options) {
  verify(graph, "lowering");
  Plan plan;
  plan.device = options.device;
  for (const Node& node : graph.nodes) {
    NodePlan np;
    if (options.device == Device::CPU) {
      np.kernel = "cpu";
      np.rule = "CPU reference";
    } else if (node.op == OpKind::FusedConv2d || node.op == OpKind::Conv2d) {
      // A conv2d left unfused (fusion off, or a bias computed at run time) takes the same
      // kernels: scale 1, its bias the shift.
      ConvShape cs = conv_shape(graph, node);
      ConvChoice c = select_conv_kernel(cs, options.profile);
      if (options.force && conv_supports(*options.force, cs))
        c = {*options.force, "forced"};
      else if (options.force)
        c.rule = fmt::format("forced {} cannot run this shape (groups={}); {}",
                             conv_kernel_name(*options.force), cs.groups, c.rule);
      np.conv = c.kernel;
      np.kernel = conv_kernel_name(c.kernel);
      np.rule = c.rule;
      np.tiles = conv_tiles(c.kernel, cs, options.profile);
      if (np.tiles.wgmma) {
        // The wgmma kernels read their weights packed ahead; a weight that is not a float32
        // initializer (known only at run time) keeps the mma.sync kernels.
        np.packed = packed_weights(graph, node, cs, np.tiles);
        if (!np.packed.defined()) {
          DeviceProfile sync = options.profile;
          sync.wgmma = false;
          np.tiles = conv_tiles(c.kernel, cs, sync);
        }
      }
    } else if (node.op == OpKind::MaxPool2d) {
      np.kernel = op_name(node.op);
      np.rule = maxpool_rule(
          pool_shape(node, graph.value(node.inputs[0]).shape, graph.value(node.outputs[0]).shape));
    } else if (node.op == OpKind::Linear) {
      np.kernel = op_name(node.op);
      const int64_t k = graph.value(node.inputs[1]).shape[1];
      const int64_t rows = k == 0 ? 0 : shape_numel(graph.value(node.inputs[0]).shape) / k;
      np.rule = linear_runs_gemv(rows)
                    ? fmt::format("{} rows <= {}: gemv streams the weights", rows, kGemvRows)
                    : fmt::format("{} rows > {}: tiles of the product", rows, kGemvRows);
    } else if (node.op == OpKind::FusedElementwise) {
      np.kernel = op_name(node.op);
      np.rule = fmt::format("one kernel: {}", chain_str(node_chain(node)));
    } else if (node.op == OpKind::Resize) {
      np.kernel = op_name(node.op);
      np.rule = resize_rule(resize_mode(node), graph.value(node.inputs[0]).shape,
                            graph.value(node.outputs[0]).shape);
    } else if (node.op == OpKind::Flatten || node.op == OpKind::Reshape) {
      np.kernel = "view";  // both backends return their input renamed (memory.cpp)
      np.rule = "no kernel: its input under another shape";
    } else {
      np.kernel = op_name(node.op);
      np.rule = "one kernel";
    }
    plan.nodes.push_back(std::move(np));
  }
  if (options.device == Device::CUDA) {
    fold_upsamples(graph, plan.nodes, options.profile);
    fold_conv_pairs(graph, plan.nodes, options);
    fold_conv_chains(graph, plan.nodes, options);
    chain_pools(graph, plan.nodes);
    fold_prologues(graph, plan.nodes, options);
  }
  plan.graph = std::move(graph);
  return plan;
}

}  // namespace epilog
