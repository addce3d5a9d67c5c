// Kernel selection for fused convolutions and the lowering of a graph to a plan.
#include "epilog/graph/lowering.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "epilog/graph/pattern.h"
#include "epilog/runtime/params.h"

namespace epilog {

DeviceProfile h200_profile() {
  return {"NVIDIA H200 (default profile)", 132, false};
}

std::optional<ConvKernel> parse_conv_kernel(const std::string& name) {
  for (ConvKernel k : {ConvKernel::Scalar, ConvKernel::Tiled, ConvKernel::Gemm})
    if (name == conv_kernel_name(k)) return k;
  return std::nullopt;
}

// -- the thresholds --
// Each number was chosen by tools/conv_bench --sweep on an NVIDIA H200 (2026-11-30,
// docs/perf.md; microseconds per conv -> batchnorm -> silu layer, CUDA-graph replay, median;
// every built tile combination of tiled and gemm timed on every suite shape).

// Below this reduction depth (Cin/groups * Kh * Kw) gemm's 32-deep k tiles are mostly zero
// padding: b1_c8_8_1x1_320 (K = 8) tiled 4.5 vs gemm 7.2. At K = 27 gemm wins since the
// epilogue's activation got cheap (b1_c3_16_3x3s2_640: 10.4 vs 15.9; 17.0 both before), and
// from K = 64 up on every suite shape, even at 8 output channels (b1_c64_8_1x1_80: 3.8 vs 4.4)
// and 16 (b1_c16_16_3x3_160: 7.9 vs 10.8). 16 is the middle of 8 and 27 on a log scale.
constexpr int64_t kGemmMinReduction = 16;

// A gemm grid should hold this many waves of blocks (times the SM count), with a 2-stage
// pipeline...
constexpr double kGemmWaves = 2.0;
// ...unless the reduction is deeper than this: then a block's work hides its start-up and the
// larger tile wins at under one wave: b1_c64_64_3x3_80 (K = 576) 64x64 tiles, 100 blocks, 16.2
// vs 32x32, 400 blocks, over 18.5; whereas b1_c64_64_1x1_80 (K = 64) 32x32 5.4 vs 64x64 over 5.8.
// A deep reduction also wants the third stage (b1_c64_64_3x3_80 64x64: 16.4 vs 17.6 with 2),
// a shallow one does not (b16_c64_64_1x1_80 64x64: 31.4 with 2, 34.8 with 3;
// b1_c32_32_1x1_160 64x32: 6.3 vs over 7.7; b32_c16_32_3x3s2_320 128x32: 190.9 vs 199.2).
constexpr int64_t kGemmDeepReduction = 256;
constexpr double kGemmDeepWaves = 0.75;
// Grids (tiles x splits) under kGemmWaves waves take this many stages: with a block or two an
// SM, deeper copies cost no occupancy. The YOLO-like model's batch-1 layers (2026-12-02, us):
// 1x256x40x40 -> 128 1x1 32x32 5.6 vs 6.6 with 2 stages, b1_c256_256_1x1_20 4.4 vs 4.8,
// 1x512x20x20 -> 256 1x1 6.6 vs 6.9 with 3, b1_c32_64_3x3s2_160 64x64 8.2 vs 8.6 with 3; split:
// 1x128x40x40 -> 256 stride 2 32x128 in 4 10.8 vs 11.0, 1x128x20x20 -> 128 32x64 in 4 8.5 vs
// 8.6, 1x128x40x40 -> 128 stride 2 8.9 vs 9.1.
constexpr int kGemmSmallGridStages = 4;
// ...on tiles of up to this many outputs (32x128, 64x64; four stages of them, at most 82 KB, let
// two blocks share an SM). Not on 128x128: at 4 stages one block fits an SM, so the 200 blocks of
// 16x128x40x40 -> 256 at stride 2 in 2 splits would take two waves.
constexpr int kGemmSmallGridMaxTile = 64 * 64;

// The 3x3 halo kernel (k = 72, 256 output pixels per block) from this many blocks per SM:
// b16_c128_128_3x3_40, 100 blocks: 69.7 vs the gather kernel's best 107; b1_c16_16_3x3_160,
// 100 blocks: 6.9 vs 9.3; b32_c16_32_3x3s2_320 (stride 2), 3200 blocks: 144.9 vs 176.6; but
// b1_c64_64_3x3_80, 25 blocks: over 18.5 vs 16.2.
constexpr double kHaloMinWaves = 0.5;
// ...and from this many input channels: a stage holds 8, and with fewer its MMAs and copies are
// partly zeros: b1_c3_16_3x3s2_640, 400 blocks, 14.0 vs the gather kernel's 10.3.
constexpr int64_t kHaloMinChannels = 8;
// ...and where the 8x8 squares waste little of the output plane: at least this fraction of
// their pixels exist. A 16x128x40x40 -> 256 stride-2 layer (20x20 outputs in 24x24 of squares,
// 69%): halo 72.7 vs the gather kernel's 50.7; at batch 1 16.4 vs 10.9.
constexpr double kHaloMinUseful = 0.8;
// The wgmma halo kernel (stride 1) wins at 69%: a 16x128x20x20 -> 128 layer, 128x128 tiles,
// 23.8 vs the gather kernel's 29.1 (2026-12-01; 27.9 vs 29.0 before its per-warpgroup barrier).
// Below that it was not measured, so it is not chosen there.
constexpr double kHaloWgmmaMinUseful = 0.68;
// At stride 2 the wgmma halo kernel wins from this many input channels, with n covering Cout
// and as many stages as fit, up to 4 (3 for 256x128), where the squares waste under a fifth of
// the plane and the tiles make half a wave: m = 256 for n = 128 where that grid fills, else 128.
// 16x64x80x80 -> 128: 256x128 34.7 vs 128x128 36.0 (3 stages) and 40.3 (4), the mma.sync
// kernels' best 42.9 (register A, 2026-12-01); -> 64 128x64 4 stages 26.8 with register A (29.8
// with A from shared memory, 3 stages over 32) vs 31.6; 16x32x160x160 -> 64 128x64 47.8 (3
// stages; 54.4 with 4) vs the mma.sync kernel's 55.9 as picked before (a sweep of 2026-12-02;
// it had lost, 60.1 vs 55.2, to the wgmma kernel of 2026-12-01); but b32_c16_32_3x3s2_320 212.5
// vs 147.6, and 16x16x320x320 -> 32 was even (77.1 vs 78.6, 2026-12-02; since then see
// halo_wgmma_tiles below 32 channels).
// On grids too small for the 4-square blocks of either halo kernel (under kHaloMinWaves) it takes
// stride 2 with 64x64 tiles from kHaloWgmmaMinWaves, whatever the depth: the YOLO-like model's
// batch-1 layers (2026-12-02, us, 3 stages) b1_c32_64_3x3s2_160 (100 blocks) 6.4 vs the gather
// kernel's 8.2 as picked, 1x64x80x80 -> 128 (50 blocks) 9.6 vs 11.1; 4 stages 6.7 and 10.2.
// 1x64x80x80 -> 64 would have 25 (64x32: 50, 8.9 vs the gather kernel's 8.6).
constexpr int64_t kHaloWgmmaStride2MinChannels = 32;
// ...in as many stages as fit where the reduction has more than this many stages of 8 channels,
// else kHaloWgmmaStages: a pipeline as deep as the reduction is all prologue (Cin 32: 3 stages
// 47.8 vs 4 54.4 above; Cin 64: 4 stages best).
constexpr int64_t kHaloWgmmaStride2DeepSteps = 4;
// ...but at n = 64 where its 128 x 64 blocks make under this many waves, 64x64 tiles in 3 stages:
// 16x64x80x80 -> 64 (200 blocks of 128 x 64; 2026-12-03 sweep, us) 64x64 3 stages 24.1 vs
// 128x64 26.0 (3 stages) and 26.2 (4, as picked before), 256x64 25.1; 16x32x160x160 -> 64 (800
// blocks) stays on 128x64, 47.4 vs 64x64 51.0. A/B (2026-12-03, us): 25.9 -> 23.8 at batch 16,
// 13.5 -> 12.8 at batch 8, 2x32x160x160 -> 64 10.1 -> 8.8, 4x32x160x160 -> 64 15.5 either way.
constexpr double kHaloWgmmaStride2NarrowWaves = 2.0;
// At stride 2 a block's input patches are 2.9 times those of stride 1 (17x17 vs 10x10 inputs
// under an 8x8 square): two stages (95 KB at n = 32) let two blocks share an SM, three do not.
// b32_c16_32_3x3s2_320: 148.5 with 2 stages, 193.0 with 3.
constexpr int kHaloStride2Stages = 2;
// The halo kernel on warpgroup MMA (Hopper), at stride 1: n covering Cout with m = 256 for n = 128,
// else 128, and 64x16 up to 16 output channels; where that grid is under kHaloMinWaves waves, 64x64
// (n <= Cout cover), then 64x32. With A from registers (conv_gemm_wgmma.cuh) n = 128 wants four
// warpgroups a block, and 64x64 beats the tiles of as many blocks. Sweeps and A/B calls of
// 2026-12-01 (us; 3 stages): b16_c128_128_3x3_40 256x128 43.6 vs 128x128 51.2, 128x64 53.0, 64x64
// 52.1, the mma.sync kernel's best 62.9; a 16x128x20x20 -> 128 layer (256x128: 36 blocks) 64x64
// 21.4 vs 128x64 26.8, 128x128 26.4; b16_c64_64_3x3_80 128x64 56.3 vs 64x64 56.2; 16x64x40x40 -> 64
// 128x64 16.0 vs 64x64 19.6 (400 blocks, 4 past the 396 that fit at once); b1_c64_64_3x3_80
// (128x64: 50 blocks) 64x64 8.0 vs 128x32 8.7; b16_c16_16_3x3_160 128x32 47.6 vs 64x32 49.2, 256x32
// 64.1, and with the 16-wide tiles (2026-12-02) 64x16 36.1 vs 128x16 39.6, 128x32 46.0 (the model
// 1.292 -> 1.275 ms at batch 16, 0.288 -> 0.286 at batch 1, with 128x16). 3 pipeline stages: a
// fourth pays only on some shallow grids (b1_c64_64_3x3_80 64x64 7.7) and loses elsewhere
// (b16_c64_64_3x3_80 64x64 64.4). At stride 2 it wins on some layers and loses on others: see
// kHaloWgmmaStride2MinChannels above.
constexpr int kHaloWgmmaStages = 3;
// ...and at stride 1, tiles up to 64x64 take as many as fit up to 4 where their grid is under one
// wave (a block an SM at most; 256x128 was not measured so): the YOLO-like model's batch-1 layers
// (2026-12-02, us) 1x64x40x40 -> 64 64x32 7.2 vs 7.5 with 3, 1x32x80x80 -> 32 64x32 4.8 vs 5.0,
// b1_c64_64_3x3_80 64x64 7.7 vs 8.0; the 200-block 1x16x160x160 -> 16 128x32 5.6 with either.
constexpr int kHaloWgmmaSmallGridStages = 4;
// At stride 1 gemm's persistent halo kernel (halo_persistent_fits) from this many output channels
// (its 64x32 tiles), where it loads a block's weights once for several squares; at 16 or fewer
// the plain 64x16 tiles are as fast or faster. Sweeps of 2026-12-05 (us): 16x32x80x80 -> 32
// persistent 19.5 vs 128x32 21.4, 64x32 23.0; 1x32x80x80 -> 32 4.1 vs 64x32 4.1 (4 stages);
// 16x16x160x160 -> 16 64x16 34.3 vs persistent 35.9; b1_c16_16_3x3_160 4.6 either way. The
// model (A/B in one call, four rounds) with it at 16 channels too: 0.990 and 0.991 ms -> 0.986 to
// 0.989 at batch 16, 0.270 to 0.271 -> 0.271 at batch 1.
constexpr int64_t kPersistentMinCout = 17;
// At stride 1 the wgmma halo kernel's last tiles, 64x32, may make fewer blocks than
// kHaloMinWaves asks: 1x64x40x40 -> 64, 50 blocks (0.38 waves), 7.5 us vs the gather
// kernel's best 8.2 (32x64 in 4 splits; 2026-12-02). But 1x128x20x20 -> 128, 36 blocks of 64x32
// (0.27 waves) over twice the reduction: 12.5 vs the gather kernel's 8.8 (split, below, 7.3).
// Their split form, the last fallback, from as many blocks: six small grids of 64x32 tiles, 50 or
// 64 blocks in 2 splits (0.38 to 0.48 waves: 16 squares by Cout 64, 8 by Cout 128, 25 by Cout
// 32), took 7.7 to 10.2 us on the gather kernel (32x32 in 2 splits, as picked under
// kHaloMinWaves) and 5.4 to 6.0 on these, within 8% of each one's sweep (an H100, 2026-12-05);
// resnet_like at batch 16, whose layer3.0.conv2 is one of them, 0.066 -> 0.064 ms (two rounds
// in turns).
constexpr double kHaloWgmmaMinWaves = 0.375;

// The 1x1 direct kernel on warpgroup MMA (Hopper), from kDirectWgmmaMinCout output channels and one
// wave of its tiles: 64 pixels (one warpgroup, so that several blocks share an SM and one's
// epilogue runs under another's MMAs) by n covering Cout; 4 stages where one n tile covers Cout
// (each A tile read once, from DRAM) from kDirectWgmmaDeepInput input channels, or at n = 128 (a
// sweep of 2026-12-04, us: 16x192x40x40 -> 128 64x128 16.6 vs 18.0 in 3 stages, 16x128x40x40 -> 128
// 14.6 vs 15.0, and an A/B of this rule: 18.1 -> 16.8 and 15.2 -> 14.7; but at n = 64 16x128x80x80
// -> 64 29.0 vs 26.8 and 16x192x80x80 -> 64 35.0 vs 35.2), else 3. Since the leaner epilogue
// (64x128 at 146 registers, three blocks an SM in 3 stages), an A/B of 3 against 4 stages there
// (2026-12-03, us): 16x256x40x40 -> 128 19.1 -> 20.4, 16x384x40x40 -> 128 23.7 -> 26.2, but
// b16_c256_256_1x1_40 (two n tiles sharing each A tile in L2) 31.9 -> 30.2. Earlier sweeps (us;
// mma.sync = the best mma.sync tile): b16_c256_256_1x1_40 64x128 4 stages 33.9 (3: 34.8; 128x128,
// one block an SM: 40.8) vs mma.sync 39.6; b16_c64_64_1x1_80 64x64 3 stages 23.0 (best 64x32 21.7)
// vs 23.6; 16x128x80x80 -> 64 64x64 31.5 vs 32.6; 16x64x80x80 -> 128 64x128 36.5 vs 35.9;
// 16x32x160x160 -> 32 64x32 35.5 (best 2 stages 33.5) vs 36.5. Not measured below 32 output
// channels. Where the Cout-covering tiles make under a wave, half as many channels a tile, if they
// make one (A is read once an n tile, so no narrower), with 4 stages under two waves: the YOLO-like
// model's batch-1 80x80 layers (2026-12-02, us) 1x192x80x80 -> 64 64x32 6.1 vs the mma.sync
// kernels' 7.4 as picked (best 6.2), 1x96x80x80 -> 64 4.7 vs 5.2, 1x128x80x80 -> 64 5.3 vs 5.9;
// with 3 stages 6.4, 5.0, 5.4.
constexpr int64_t kDirectWgmmaMinCout = 32;
constexpr double kDirectWgmmaMinWaves = 1.0;
constexpr int64_t kDirectWgmmaDeepInput = 256;

// The same kernel gathering its A tiles (any other shape with an even output plane), for deep
// reductions (over kGemmDeepReduction) where the halo kernels do not take the layer: 64 x
// Cout-covering tiles in 4 stages from kGatherWgmmaMinWaves waves of them, else the mma.sync
// gather kernel (split). Sweep of 2026-12-03 (us; 3x3 stride 2 from 40x40, 1152-deep, the
// YOLO-like model's b7 and n19): 16x128 -> 256 64x128 40.3 (128x128 40.3, 3 stages 41.0) vs the
// mma.sync kernels' best 50.6 (pick 51.5); 16x128 -> 128 (100 tiles, 0.76 waves) 28.6 vs 29.9
// (pick 30.0), with half the channels (64x64, 200 tiles) 33.9; 8x128 -> 256 the same 29.0 vs
// 29.2; at batch 4 (50 tiles, 0.38 waves) 29.4 vs the split mma.sync kernel's 20.7. Shallower
// reductions and other windows were not measured and keep the mma.sync kernels.
// Under one wave of such tiles, each SM's block walks the whole reduction alone: split it
// (split_count, below) as the mma.sync gather kernel does. 16x128x40x40 -> 128 at stride 2
// (the model's n19: 100 tiles, 36 k tiles): 28.9 us whole vs 24.5 in 2 splits, 4 slower (sweep
// of 2026-12-03), and 29.0 -> 24.8 as lowered (A/B); 16x128 -> 256 (200 tiles) fastest whole.
constexpr double kGatherWgmmaMinWaves = 0.75;
constexpr double kGatherWgmmaSplitWaves = 1.0;

// Split-K (the gather kernel; a tile's blocks form one thread-block cluster, which sums their
// accumulators in shared memory): a block's k tiles run one after another, each paying a load
// latency, so a small grid over a deep reduction waits on the chain, not on the SMs. Splits
// double while the grid stays within kSplitMaxWaves waves and every split keeps kSplitMinKTiles
// k tiles (the cluster's exchange costs about a microsecond): b1_c64_64_3x3_80, 18 k tiles,
// 64x64: 13.5 with 2 splits, 14.6 with none, 15.6 with 4; but b1_c32_64_3x3s2_160, 9 k tiles:
// 10.0 with 2, 9.3 with none. Not on 1x1 layers the direct kernel takes (unpadded, stride 1):
// splitting moves them to the gather kernel, slower at every split count on the YOLO-like
// model's batch-1 layers (2026-12-02, 3 stages: 1x512x20x20 -> 256 32x32 6.9 whole vs 8.9 in
// 2; 1x256x40x40 -> 128 5.8 vs 6.6; b1_c256_256_1x1_20 4.9 vs 6.4 in 2). At most kMaxSplits,
// the portable cluster size.
constexpr int kMaxSplits = 8;
constexpr double kSplitMaxWaves = 2.0;
constexpr int64_t kSplitMinKTiles = 8;
// Where only 32x32 tiles make the waves (small grids: the YOLO-like model's 20x20 and 40x40
// layers at batch 1), tile and splits are chosen together: the largest tile whose grid, split as
// far as the rule above allows, makes the waves. A block then walks fewer k tiles of a wider
// tile. Sweep of 2026-12-02 (every gather tile at 1, 2, 4 and 8 splits, 3 stages, us):
// 1x128x40x40 -> 256 stride 2, 36 k tiles: 32x32 in 2 splits 16.4, 32x128 in 4 11.2, 64x64 in
// 4 11.0 (the fastest); 1x128x20x20 -> 128: 32x32 in 4 10.0, 32x64 in 4 8.8 (the fastest);
// 1x64x80x80 -> 64 stride 2, 18 k tiles: 32x32 in 2 9.8, 32x64 in 2 8.6 (fastest 32x64 in 4,
// 8.3).

// The wgmma halo kernel split-K (its one-square tiles; a tile's splits one cluster, as above):
// where its 64-pixel tiles make under kHaloMinWaves waves, splits double while the grid stays
// within kSplitMaxWaves waves and every split keeps kHaloSplitMinStages of the 8-channel stages;
// and where whole 64x32 tiles make too few blocks for any rule above, it takes them split if that
// grid makes kHaloMinWaves. The YOLO-like model's batch-1 3x3 layers (2026-12-02, us, at the
// pipeline depths the rules above give): 1x128x20x20 -> 128 (16 stages, 36 blocks of 64x32) 64x32
// in 4 7.3, in 2 8.1, in 8 8.7, whole 12.0, vs the gather kernel's best 8.4; 1x64x40x40 -> 64 (8
// stages) 64x32 in 2 5.9, in 4 6.2, whole 7.2; b1_c64_128_3x3s2_80 64x64 in 2 8.0, in 4 9.1, whole
// 9.4; 1x64x80x80 -> 64 stride 2, 25 squares, 64x32 in 2 7.3 (64x64 in 4 7.2) vs the gather
// kernel's 8.4; but 4 stages split in 2 lose: 1x32x80x80 -> 32 5.7 vs 4.8 whole,
// b1_c32_64_3x3s2_160 8.2 vs 6.8; and so do grids of over half a wave: b1_c64_64_3x3_80 (100
// blocks of 64x64, 8 stages) 8.8 in 2 vs 8.1 whole.
constexpr int64_t kHaloSplitMinStages = 4;

// An image network's first layer (conv_scalar_stem_fits: 3x3 over <= 4 channels into <= 16)
// that gemm's stem kernel does not take (strides that differ; see kGemmStemTilesPerBlock) goes
// to scalar's stem path, a thread computing 4 pixels x all output channels from one read of its
// inputs, from this many of its 256-item blocks per SM, as it did at equal strides before that
// kernel: 3 -> 16 channels, 640x640 at stride 2, 1600 blocks (batch 16) 85.8 vs gemm's gather
// kernel 118.0, 400 (batch 4) 26.8 vs 32.1; 100 (batch 1, 0.76 an SM) 11.2 vs 10.0 before its
// loads ran a row ahead, 9.3 vs 10.0 since (A/B, 2026-12-02; the YOLO-like model at batch 1
// 0.284 -> 0.283 ms, within its noise). Smaller grids were not measured and keep gemm. Measured
// at 3 input channels; 1, 2 and 4 take the same path unmeasured.
constexpr double kStemMinBlocksPerSm = 0.75;
// gemm's stem kernel takes those layers where it can (the same stride both ways): tiles of 64
// output columns by the most rows, 8, 4 or 2, whose tiles number at least kGemmStemTilesPerBlock
// times its persistent grid (kGemmStemBlocksPerSm blocks an SM, shapes.h), else 2. 3 -> 16
// channels, 640x640 at stride 2 (2026-12-04, us; rows 2 / 4 / 8 / 16, scalar's stem path after the
// bar): batch 1 7.1 / 7.7 / 7.7 / 10.3 | 9.3; batch 2 12.1 / 11.2 / 13.2 / 13.5 | 12.8; batch
// 4 21.6 / 18.6 / 19.7 / 24.2 | 24.2; batch 8 38.3 / 32.8 / 33.0 / 40.8 | 43.4 (the call before);
// batch 16 75.6 / 64.6 / 62.0 / 71.6 | 77.1. The rule misses batch 2 by 8%. 1x3x320x320 -> 16 at
// stride 1: 6.9 / 7.3 / 6.9 / 9.5 | 8.4.
constexpr double kGemmStemTilesPerBlock = 3.0;
// ...from this many of its 2-row tiles an SM; below, gemm's generic rules (the gather kernel),
// as before it: 3 -> 16 channels from 128x128 at stride 2 (effnet_like's and resnet_like's first
// layer; 2026-12-04, us, the stem kernel at lowering's tiles vs the gather kernel as picked):
// batch 1 (32 tiles) 3.0 vs 2.7, batch 4 (128) 3.4 vs 4.1, batch 16 (512) 6.1 vs 6.6.
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
  if (s.groups != 1) return {ConvKernel::Scalar, "groups > 1: only scalar handles groups"};
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
  // Scalar wins no groups == 1 suite shape on the H200 (tiled is 1.2x to 4x faster even on the
  // smallest), so it is left to grouped convolutions.
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
      // 3 stages. 16 -> 32 channels from 320x320 at stride 2 (the YOLO-like model's second layer),
      // us, the mma.sync halo kernel's 256x32 as picked before against it: batch 1 (200 blocks of
      // 128 x 32, 1.5 waves) 9.0 vs 7.5 (2026-12-02); 2026-12-03: batch 4 (6 waves) 24.3 vs 22.5, 8
      // 43.9 vs 40.1, 12 58.7 vs 56.6, 16 77.9 vs 73.9, 24 (36 waves) 110.7 vs 109.5, and the one
      // loss taken, batch 2 (3 waves) 12.7 vs 13.2. The model 0.735 -> 0.727 ms at batch 8, 1.166
      // -> 1.161 at batch 16 (one call). Batch 32 (b32_c16_32_3x3s2_320, 48 waves) had lost, 142.9
      // vs 144.7, and was kept off up to 40 waves, until the kernel's stage buffers came down to
      // the reduction's two (b77b781): a sweep of 2026-12-04 had 131.5 against 141.0, and
      // conv_bench as lowered now 124.6 (141.3 on the mma.sync kernel in the call before).
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
      // Output pixels a block and channels a thread: one output a thread, or on the stem path
      // (taken whenever it fits) items of kStemItemOutputs pixels by every channel.
      t.m = kScalarThreads;
      t.n = 1;
      if (conv_scalar_stem_fits(s)) {
        t.m = kScalarThreads * kStemItemOutputs;
        t.n = int(s.k);
      }
      break;
    case ConvKernel::Tiled:
      // 64 pixels, or 32 where 64 makes under two waves: m = 128 is never faster on the suite
      // (b1_c8_8_1x1_320: 64 -> 4.9, 128 -> 5.8; the batch-16 shapes 2% to 6% slower).
      t.n = smallest_covering({8, 16, 32}, s.k);
      t.m = ceil_div(pixels, 64) * ceil_div(s.k, t.n) >= 2 * int64_t(sms) ? 64 : 32;
      t.k = 8;  // input channels staged per step
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
        // thread's, and smaller blocks, more of them an SM, hide each other's waits. A sweep of the
        // YOLO-like model's batch-16 1x1 layers with tensor copies (an H100, 2026-12-05, us; the
        // rule's tiles vs those picked before): 16x128x40x40 -> 128 64x64 13.1 (the sweep's best)
        // vs 64x128 in 4 stages 14.6, 16x192x40x40 -> 128 16.0 (best) vs 17.5, 16x256x40x40 ->
        // 128 18.2 (best) vs 19.5, 16x128x80x80 -> 64 64x32 29.3 (best) vs 64x64 31.5, 16x96x80x80
        // -> 64 25.5 (best) vs 26.5, b16_c256_256_1x1_40 64x64 29.3 (best) vs 64x128 29.9,
        // b16_c64_64_1x1_80 64x32 21.3 (best 21.2) vs 64x64 21.4.
        // That was on planes of whole tiles; on the others (the 20x20 layers of kDirectTmaMaxPad)
        // tensor copies were measured on the tiles the rule picks for cp.async, which they keep.
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
      const ConvTiles gather{64, cover, 32, 4, 1, true};
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
      // smallest: b1_c128_128_1x1_40 32x32 4.8 vs the 32x128 that covers Cout 7.5.
      const bool deep = s.c * s.r * s.s > kGemmDeepReduction;
      const double waves = deep ? kGemmDeepWaves : kGemmWaves;
      t.k = 32;
      t.stages = deep ? 3 : 2;
      t.m = t.n = 32;
      // The largest tile m x n (n not past the Cout cover) for which fill(m, n) holds.
      const auto largest = [&](auto fill) {
        int best_area = 0;
        for (int n : {128, 64, 32})
          for (int m : {128, 64, 32})
            if (n <= cover && m * n > best_area && fill(m, n)) {
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
  if (kernel == ConvKernel::Tiled) {
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
// happens.
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
    for (const std::string& part : cat.inputs) {
      const int u = uses.producer(part);
      const int64_t channels = g.value(part).shape[1];
      c0 += channels;
      if (u < 0 || g.nodes[size_t(u)].op != OpKind::UpsampleNearest) continue;
      const Node& up = g.nodes[size_t(u)];
      const std::vector<int64_t>& scale = up.attrs.ints("scale");
      Match with_up = *m;
      with_up.nodes.push_back(u);
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
// initializers (packed after the first conv's weights, pack_conv_chain).
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
// launch nothing and read nothing back (three 16x128x20x20 pools: 6.8 to 6.9 us each). The
// pools' outputs all stay (the concat reads them), so nothing is absorbed.
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
    } else if (node.op == OpKind::FusedConv2d) {
      ConvShape cs = conv_shape(graph, node);
      ConvChoice c = select_conv_kernel(cs, options.profile);
      if (options.force && conv_supports(*options.force, cs))
        c = {*options.force, "forced"};
      else if (options.force)
        c.rule = fmt::format("forced {} cannot run groups={}; {}", conv_kernel_name(*options.force),
                             cs.groups, c.rule);
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
  }
  plan.graph = std::move(graph);
  return plan;
}

namespace {

// Whether node i, a fused conv with an upsampling folded in (NodePlan::up), reads through it at
// run time: the executor folds it only where the concat runs in place.
bool reads_upsampled(const Plan& plan, const std::vector<bool>& in_place, size_t i) {
  const NodePlan& np = plan.nodes[i];
  if (!np.up) return false;
  const Node* up = plan.graph.find_node(np.up->node);
  const size_t u = up ? size_t(up - plan.graph.nodes.data()) : in_place.size();
  return u < in_place.size() && in_place[u];
}

}  // namespace

NodeChoice node_choice(const Plan& plan, const std::vector<bool>& in_place, size_t i) {
  const auto masked = [&](size_t j) { return j < in_place.size() && in_place[j]; };
  const Node& node = plan.graph.nodes[i];
  const NodePlan& np = plan.nodes[i];
  if (masked(i) && node.op == OpKind::UpsampleNearest)
    return {"folded", fmt::format("no kernel: {} reads its input upsampled", np.folded_into)};
  if (masked(i) && node.op == OpKind::MaxPool2d)
    return {"folded", fmt::format("no kernel: {} makes it on its staged plane", np.folded_into)};
  if (masked(i) && node.op == OpKind::FusedConv2d) {
    const Node* host = plan.graph.find_node(np.folded_into);
    if (host && plan.nodes[size_t(host - plan.graph.nodes.data())].post)
      return {"folded", fmt::format("no kernel: {} runs it on its accumulators (conv chain)",
                                    np.folded_into)};
    return {"folded", fmt::format("no kernel: {} makes its outputs where it loads them (conv pair)",
                                  np.folded_into)};
  }
  if (masked(i))
    return {"in place", node.op == OpKind::Split ? "no copy: its parts are views of its input"
                                                 : "no copy: its inputs are made in its buffer"};
  if (!np.chain.empty() && !in_place.empty())
    return {np.kernel, fmt::format("{}; then {}, each pooling the one before", np.rule,
                                   fmt::join(np.chain, ", "))};
  if (reads_upsampled(plan, in_place, i))
    return {np.kernel, fmt::format("{}; channels {}..{} read from {} upsampled {}x{}", np.rule,
                                   np.up->c0, np.up->c0 + np.up->channels - 1, np.up->source,
                                   np.up->scale_h, np.up->scale_w)};
  if (np.pre) {
    const Node* first = plan.graph.find_node(np.pre->node);
    if (first && masked(size_t(first - plan.graph.nodes.data())))
      return {"gemm pair", fmt::format("also computes {} ({} -> {} channels), its outputs never "
                                       "stored",
                                       np.pre->node, np.pre->shape.c, np.pre->shape.k)};
  }
  if (np.post) {
    const Node* second = plan.graph.find_node(np.post->node);
    if (second && masked(size_t(second - plan.graph.nodes.data())))
      return {"gemm chain",
              fmt::format("{}; also runs {} (1x1, {} -> {} channels), its own "
                          "outputs never stored",
                          np.rule, np.post->node, np.post->shape.c, np.post->shape.k)};
  }
  return {np.kernel, np.rule};
}

std::string explain(const Plan& plan, const std::vector<bool>& in_place) {
  const Graph& g = plan.graph;
  // The rule last: it is free text, and the longest ones would push a column after it askew.
  std::string out = fmt::format("{:<24} {:<16} {:<46} {:<16} {:<38} {}\n", "node", "op",
                                "input -> output", "kernel", "tiles", "rule");
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const NodePlan& np = plan.nodes[i];
    std::string io = fmt::format("{} -> {}", shape_str(g.value(n.inputs[0]).shape),
                                 shape_str(g.value(n.outputs[0]).shape));
    if (n.op == OpKind::FusedConv2d && n.inputs.size() > 4) io += " + residual";
    const NodeChoice choice = node_choice(plan, in_place, i);
    std::string tiles;
    if (choice.kernel == "gemm pair") {
      tiles = fmt::format("8x8 squares x {} channels wgmma", kPairMaxCout);
    } else if (np.tiles.m && choice.kernel != "folded") {
      tiles = fmt::format("m={} n={}", np.tiles.m, np.tiles.n);
      if (np.tiles.k) tiles += fmt::format(" k={}", np.tiles.k);
      // The persistent kernel stages a square's whole reduction: it has no pipeline depth.
      if (np.tiles.stages && !np.tiles.persistent)
        tiles += fmt::format(" stages={}", np.tiles.stages);
      if (np.tiles.splits > 1) tiles += fmt::format(" splits={}", np.tiles.splits);
      if (np.tiles.wgmma) tiles += " wgmma";
      // A conv reading through an upsampling copies A by cp.async.
      if (n.op == OpKind::FusedConv2d && !reads_upsampled(plan, in_place, i) &&
          conv_gemm_direct_tma(conv_shape(g, n), np.tiles))
        tiles += " tma";
      if (np.tiles.persistent) tiles += " persistent";
    }
    out += fmt::format("{:<24} {:<16} {:<46} {:<16} {:<38} {}\n", n.name, op_name(n.op), io,
                       choice.kernel, tiles, choice.rule);
  }
  return out;
}

}  // namespace epilog
