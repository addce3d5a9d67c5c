// Kernel selection and tile sizes: pure functions, checked with worked numbers.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "epilog/epilog.h"
#include "epilog/graph/lowering.h"
#include "epilog/graph/passes.h"
#include "epilog/io/builder.h"
#include "epilog/runtime/executor.h"
#include "epilog/runtime/params.h"
#include "test_graphs.h"
#include "yolo_like.h"

using namespace epilog;

namespace {

// A suite-style shape: padding k/2, dilation 1.
ConvShape shape(int64_t n, int64_t cin, int64_t hw, int64_t cout, int64_t k, int64_t stride = 1,
                int64_t groups = 1) {
  int64_t p = k / 2, out = (hw + 2 * p - k) / stride + 1;
  return ConvShape{n, cin, hw, hw, cout, k, k, out, out, stride, stride, p, p, 1, 1, groups};
}

// A first layer, 3 -> 16 channels over a square plane of `hw`, at stride 1 down and 2 across.
ConvShape stride_1x2(int64_t n, int64_t hw) {
  return ConvShape{n, 3, hw, hw, 16, 3, 3, hw, hw / 2, 1, 2, 1, 1, 1, 1, 1};
}

// A GPU with n SMs, without the warpgroup MMA kernels (the mma.sync halo kernel's rules).
DeviceProfile sms(int n) {
  DeviceProfile p{"test", n, false};
  p.wgmma = false;
  return p;
}

// The YOLO neck's join, fused: a 1x1 conv (k x k) over concat(upsample_nearest(a), s), a and s
// each made by a conv.
struct Join {
  int64_t n = 16, c_low = 256, h_low = 20, w_low = 20, c_skip = 128, k = 1, scale = 2;
  bool up_first = true;
  bool up_is_output = false, cat_is_output = false;  // a second reader
};

Graph join_graph(const Join& j) {
  Builder b(5);
  Val a = test::conv_bn_silu(b, b.input("lo", {j.n, 8, j.h_low, j.w_low}), "a", j.c_low, 1);
  Val s = test::conv_bn_silu(b, b.input("hi", {j.n, 8, j.scale * j.h_low, j.scale * j.w_low}), "s",
                             j.c_skip, 1);
  Val u = b.upsample_nearest(a, j.scale, "up");
  Val cat = b.concat(j.up_first ? std::vector<Val>{u, s} : std::vector<Val>{s, u}, 1, "cat");
  b.output(test::conv_bn_silu(b, cat, "join", 128, j.k));
  if (j.up_is_output) b.output(u);
  if (j.cat_is_output) b.output(cat);
  Graph g = b.build();
  optimize(g);
  return g;
}

const NodePlan& node_plan(const Plan& p, const std::string& name) {
  for (size_t i = 0; i < p.graph.nodes.size(); ++i)
    if (p.graph.nodes[i].name == name) return p.nodes[i];
  FAIL("no node " << name);
  throw;
}

}  // namespace

TEST_CASE("lowering: select_conv_kernel follows its ordered rules", "[lowering]") {
  struct Row {
    ConvShape s;
    ConvKernel want;
    const char* rule_part;
  };
  const std::vector<Row> rows = {
      {shape(16, 96, 56, 96, 3, 1, 96), ConvKernel::Scalar, "groups"},  // depthwise
      {shape(1, 8, 320, 8, 1), ConvKernel::Tiled, "reduction 8 < 16"},
      // A first layer with the same stride both ways: gemm's stem kernel from 0.5 of its tiles
      // of 2 rows by 64 columns per SM (66): 160 x 5 at 640x640, 32 at 128x128 (4 x 32 at
      // batch 4), 320 x 5 at stride 1 from 320x320.
      {shape(1, 3, 640, 16, 3, 2), ConvKernel::Gemm,
       "3 -> 16 channels, 800 tiles >= 0.5 per SM: gemm's stem kernel"},
      {shape(4, 3, 128, 16, 3, 2), ConvKernel::Gemm, "128 tiles >= 0.5 per SM: gemm's stem"},
      {shape(1, 3, 128, 16, 3, 2), ConvKernel::Gemm, "reduction 27 >= 16"},
      {shape(1, 1, 320, 8, 3, 1), ConvKernel::Gemm, "1 -> 8 channels, 800 tiles"},
      // Strides 1 x 2: scalar's stem path from 0.75 blocks of 256 items per SM (99 at 132 SMs):
      // 640 rows of 80 items make 200 blocks, 480 of 60 113, 400 of 50 79.
      {stride_1x2(1, 640), ConvKernel::Scalar, "200 blocks >= 0.75 per SM: scalar's stem"},
      {stride_1x2(1, 480), ConvKernel::Scalar, "113 blocks >= 0.75 per SM: scalar's stem"},
      {stride_1x2(1, 400), ConvKernel::Gemm, "reduction 27 >= 16"},
      {shape(1, 3, 640, 32, 3, 2), ConvKernel::Gemm, "reduction 27 >= 16"},  // Cout > 16
      {shape(1, 5, 640, 16, 3, 2), ConvKernel::Gemm, "reduction 45 >= 16"},  // Cin > 4
      {shape(1, 15, 80, 16, 1), ConvKernel::Tiled, "reduction 15 < 16"},
      {shape(1, 16, 80, 16, 1), ConvKernel::Gemm, "reduction 16 >= 16"},
      {shape(1, 64, 80, 8, 1), ConvKernel::Gemm, "reduction 64 >= 16"},
      {shape(1, 16, 160, 16, 3), ConvKernel::Gemm, "reduction 144 >= 16"},
      {shape(1, 32, 80, 64, 1), ConvKernel::Gemm, "reduction 32 >= 16"},
      {shape(16, 64, 80, 64, 3), ConvKernel::Gemm, "reduction 576"},
      {shape(32, 16, 320, 32, 3, 2), ConvKernel::Gemm, "reduction 144"},
      // A linear layer (1x1 conv over a 1x1 plane): gemv up to 8 rows, then gemm.
      {shape(1, 25088, 1, 4096, 1), ConvKernel::Gemv, "1 rows <= 8: gemv"},
      {shape(8, 512, 1, 1000, 1), ConvKernel::Gemv, "8 rows <= 8: gemv"},
      {shape(9, 512, 1, 1000, 1), ConvKernel::Gemm, "reduction 512 >= 16"},
      {shape(1, 512, 2, 1000, 1), ConvKernel::Gemm, "reduction 512 >= 16"},  // a 2x2 plane
  };
  for (const Row& r : rows) {
    ConvChoice c = select_conv_kernel(r.s, h200_profile());
    INFO("Cin " << r.s.c << " Cout " << r.s.k << " k " << r.s.r << " -> " << c.rule);
    CHECK(c.kernel == r.want);
    CHECK_THAT(c.rule, Catch::Contains(r.rule_part));
  }
}

TEST_CASE("lowering: conv_tiles fills two waves of SMs, smaller tiles for small layers",
          "[lowering]") {
  struct Row {
    ConvKernel kernel;
    ConvShape s;
    int sm_count;
    ConvTiles want;
  };
  const std::vector<Row> rows = {
      // 16*80*80 = 102400 pixels: 800 blocks of 128 x 64 already fill 2 x 132 SMs.
      {ConvKernel::Gemm, shape(16, 64, 80, 64, 1), 132, {128, 64, 32, 2}},
      // 6400 pixels: only 32 x 32 tiles make 2 waves (200 x 2 = 400 blocks).
      {ConvKernel::Gemm, shape(1, 64, 80, 64, 1), 132, {32, 32, 32, 2}},
      // The same layer on a 16-SM part: 50 blocks of 128 x 64 fill 2 x 16.
      {ConvKernel::Gemm, shape(1, 64, 80, 64, 1), 16, {128, 64, 32, 2}},
      // 400 pixels: nothing fills two waves; the smallest tile, not the 128 covering Cout 256,
      // and as its 104 blocks are under two waves, 4 stages.
      {ConvKernel::Gemm, shape(1, 256, 20, 256, 1), 132, {32, 32, 32, 4}},
      // Cout 16: the narrowest column block, 32 wide (200 blocks: 4 stages).
      {ConvKernel::Gemm, shape(1, 64, 80, 16, 1), 132, {32, 32, 32, 4}},
      // A deep reduction (K = 576) needs 0.75 waves, 64 x 64 makes 100 blocks >= 99; and 3
      // pipeline stages where a shallow one has 2. Its 18 k tiles split in 2 (200 blocks).
      {ConvKernel::Gemm, shape(1, 64, 80, 64, 3), 132, {64, 64, 32, 4, 2}},
      // K = 1152 (36 k tiles) over 400 pixels: only 32 x 32 makes 0.75 waves whole (104
      // blocks), so tile and splits are chosen together: 26 tiles of 32 x 128 in 4 splits of 9
      // k tiles make 104 blocks (64 x 64 makes as many, 112, and is no larger).
      {ConvKernel::Gemm, shape(1, 128, 40, 256, 3, 2), 132, {32, 128, 32, 4, 4}},
      // K = 1152, Cout 128 over 400 pixels: 32 x 64 in 4 splits (104 blocks); 64 x 64 or
      // 32 x 128 in 4 make 56 and 52, and 8 splits would leave 4.5 k tiles each.
      {ConvKernel::Gemm, shape(1, 128, 20, 128, 3), 132, {32, 64, 32, 4, 4}},
      // A 1x1 layer stays whole (splitting it would leave the direct kernel): 512 input
      // channels over 400 pixels, 104 blocks of 32 x 32.
      {ConvKernel::Gemm, shape(1, 512, 20, 256, 1), 132, {32, 32, 32, 4}},
      // The same on 64 SMs: 52 blocks of 32 x 64 fill 0.75 waves; split in 2 (104 <= 128).
      {ConvKernel::Gemm, shape(1, 128, 40, 256, 3, 2), 64, {32, 64, 32, 4, 2}},
      // K = 288 on 64 SMs: 32 x 32 tiles make 13 x 2 = 26 blocks; 9 k tiles stay whole, in 4
      // stages.
      {ConvKernel::Gemm, shape(1, 32, 40, 64, 3, 2), 64, {32, 32, 32, 4}},
      // K = 1600 (5x5, no halo kernel): 128 x 64 makes 200 blocks; under two waves, but too
      // large a tile for a fourth stage.
      {ConvKernel::Gemm, shape(16, 64, 40, 64, 5), 132, {128, 64, 32, 3}},
      // 3x3 stride 1: the halo kernel (k = 72); 16 x 10 x 10 squares of 8x8, 4 per block: 400
      // blocks >= 66 (half the SMs).
      {ConvKernel::Gemm, shape(16, 64, 80, 64, 3), 132, {256, 64, 72, 3}},
      // 16 x 5 x 5 squares of a 40 plane: 100 blocks of 4 >= 66.
      {ConvKernel::Gemm, shape(16, 128, 40, 128, 3), 132, {256, 128, 72, 3}},
      // 3x3 stride 2: the halo kernel too, 32 x 20 x 20 squares: 3200 blocks, with 2 stages.
      {ConvKernel::Gemm, shape(32, 16, 320, 32, 3, 2), 132, {256, 32, 72, 2}},
      // 3x3 stride 2 onto 20x20 (69% of its squares): the gather kernel, though 4-square
      // blocks would make 144.
      {ConvKernel::Gemm, shape(16, 128, 40, 256, 3, 2), 132, {128, 128, 32, 3, 2}},
      // 3x3 with 7 input channels (under a stage's 8): the gather kernel, though 400 blocks.
      {ConvKernel::Gemm, shape(1, 7, 640, 16, 3, 2), 132, {128, 32, 32, 2}},
      // 8 input channels: the halo kernel.
      {ConvKernel::Gemm, shape(1, 8, 640, 16, 3, 2), 132, {256, 32, 72, 2}},
      // 3x3 stride 2 with 25 blocks (1 x 10 x 10 squares, n = 64): under 66, gather; 100
      // blocks of 64 x 64, whole (9 k tiles), in 4 stages.
      {ConvKernel::Gemm, shape(1, 32, 160, 64, 3, 2), 132, {64, 64, 32, 4}},
      // A linear layer of 16 rows (vgg11_bn's first classifier layer, batch 16): no tile taller
      // than 32 rows; 32 tiles of 32 x 128 in 8 splits of 98 k tiles (256 blocks).
      {ConvKernel::Gemm, shape(16, 25088, 1, 4096, 1), 132, {32, 128, 32, 4, 8}},
      // tiled: Cout 16 -> 16 channels; 25600 pixels -> 400 blocks of 64 >= 264.
      {ConvKernel::Tiled, shape(1, 16, 160, 16, 3), 132, {64, 16, 8, 0}},
      // tiled: Cout 64 -> 32-channel blocks (2); 6400 pixels: 64 -> 100 x 2 = 200 < 264.
      {ConvKernel::Tiled, shape(1, 64, 80, 64, 3), 132, {32, 32, 8, 0}},
      // tiled never takes 128 pixels: 102400 pixels, 1600 blocks of 64.
      {ConvKernel::Tiled, shape(1, 8, 320, 8, 1), 132, {64, 8, 8, 0}},
      // scalar: 256 outputs a block, one a thread; on the stem path 256 items of 4 pixels by
      // all 16 channels.
      {ConvKernel::Scalar, shape(16, 96, 56, 96, 3, 1, 96), 132, {256, 1, 0, 0}},
      {ConvKernel::Scalar, shape(1, 3, 640, 16, 3, 2), 132, {1024, 16, 0, 0}},
      // gemm's stem kernel: 64 columns by the most rows (8, 4, 2) whose tiles make 3 for each of
      // 3 x 132 resident blocks (1188), else 2. 320x320 outputs: 5 column tiles by 40 of 8 rows.
      {ConvKernel::Gemm, shape(16, 3, 640, 16, 3, 2), 132, {512, 16, 36, 0}},  // 3200 tiles
      {ConvKernel::Gemm, shape(4, 3, 640, 16, 3, 2), 132, {256, 16, 36, 0}},  // 800 of 8, 1600 of 4
      {ConvKernel::Gemm, shape(1, 3, 640, 16, 3, 2), 132, {128, 16, 36, 0}},  // 400 of 4
      {ConvKernel::Gemm, shape(1, 3, 640, 16, 3, 2), 16, {512, 16, 36, 0}},   // 200 >= 144
      // Under 0.5 tiles of 2 rows an SM (32 < 66), the generic rules: 32 x 32 gather tiles.
      {ConvKernel::Gemm, shape(1, 3, 128, 16, 3, 2), 132, {32, 32, 32, 4}},
  };
  for (const Row& r : rows) {
    ConvTiles t = conv_tiles(r.kernel, r.s, sms(r.sm_count));
    INFO(conv_kernel_name(r.kernel)
         << " Cout " << r.s.k << " pixels " << r.s.n * r.s.ho * r.s.wo << " SMs " << r.sm_count);
    CHECK(t.m == r.want.m);
    CHECK(t.n == r.want.n);
    CHECK(t.k == r.want.k);
    CHECK(t.stages == r.want.stages);
    CHECK(t.splits == r.want.splits);
    CHECK_FALSE(t.wgmma);
  }
  // With warpgroup MMA (Hopper, sm_90a build) the stride-1 halo layers take the wgmma kernel:
  // up to 32 -> 32 channels, from 17 output channels, its persistent form (64 x 32 tiles), else n
  // covering Cout with m = 256 for n = 128, else 128, where that grid makes half a wave, else
  // 64x64 (n not past the cover), else 64x32 from 0.375 waves; 3 stages, 4 for tiles up to 64x64
  // under a wave. Stride 2 keeps the mma.sync halo kernel below 64 channels on large grids.
  struct Wg {
    ConvShape s;
    ConvTiles want;
  };
  DeviceProfile hopper = sms(132);
  hopper.wgmma = true;
  for (const Wg& r : std::vector<Wg>{
           {shape(16, 64, 80, 64, 3), {128, 64, 72, 3, 1, true}},     // 800 blocks
           {shape(16, 128, 40, 128, 3), {256, 128, 72, 3, 1, true}},  // 100 blocks
           // 16 output channels: the plain 64x16 tiles (400 and 6400 blocks).
           {shape(1, 16, 160, 16, 3), {64, 16, 72, 3, 1, true}},
           {shape(16, 16, 160, 16, 3), {64, 16, 72, 3, 1, true}},
           {shape(16, 32, 80, 32, 3), {64, 32, 72, 3, 1, true, true}},
           {shape(16, 16, 80, 17, 3), {64, 32, 72, 3, 1, true, true}},
           // 33 channels either way: not persistent.
           {shape(16, 33, 80, 32, 3), {128, 32, 72, 3, 1, true}},
           {shape(16, 32, 80, 33, 3), {128, 64, 72, 3, 1, true}},
           // 100 squares: 128x64 makes 50 blocks, 64x64 100 >= 66, half a wave: whole.
           {shape(1, 64, 80, 64, 3), {64, 64, 72, 4, 1, true}},
           // 25 squares, Cout 128: 256x128 makes 7 blocks, 128x128 13, 128x64 26, 64x64 50,
           // 64x32 100 (over half a wave: whole).
           {shape(1, 64, 40, 128, 3), {64, 32, 72, 4, 1, true}},
           {shape(1, 32, 80, 32, 3), {64, 32, 72, 3, 1, true, true}},
           // 25 squares, Cout 64: 64x64 makes 25 blocks, 64x32 50, enough for the last tiles
           // (0.375 waves), in 2 splits; 9 squares, Cout 128: 64x32 makes 36, too few whole,
           // but 144 in 4 splits of 4 stages (8 would leave 2 each).
           {shape(1, 64, 40, 64, 3), {64, 32, 72, 4, 2, true}},
           // 16 squares, Cout 64: 64x32 makes 32 blocks, 64 in 2 splits (over 0.375 waves).
           {shape(1, 64, 32, 64, 3), {64, 32, 72, 4, 2, true}},
           {shape(1, 128, 20, 128, 3), {64, 32, 72, 4, 4, true}},
           // 4 squares, Cout 32: 64x32 in 2 splits makes 8 blocks, too few: the gather kernel.
           {shape(1, 64, 16, 32, 3),
            conv_tiles(ConvKernel::Gemm, shape(1, 64, 16, 32, 3), sms(132))},
           // 1 x 3 x 3 squares at 48 channels: 6 stages, too few to split: the gather kernel.
           {shape(1, 48, 20, 128, 3),
            conv_tiles(ConvKernel::Gemm, shape(1, 48, 20, 128, 3), sms(132))},
           // 400 squares, Cout 256: 256x128 makes 200 blocks.
           {shape(16, 128, 40, 256, 3), {256, 128, 72, 3, 1, true}},
           // 100 squares (36x36 planes, 81% of their squares): 256x128 makes 25 blocks, 64x64
           // 200.
           {shape(4, 128, 36, 128, 3), {64, 64, 72, 3, 1, true}},
           // A 20x20 plane fills 69% of its 3x3 squares: enough for wgmma (144 squares; 256x128
           // makes 36 blocks, 64x64 288); a 12x12 one fills 56%: the gather kernel, as without
           // wgmma.
           {shape(16, 128, 20, 128, 3), {64, 64, 72, 3, 1, true}},
           {shape(16, 128, 12, 128, 3),
            conv_tiles(ConvKernel::Gemm, shape(16, 128, 12, 128, 3), sms(132))},
           // Under 32 input channels at stride 2, where 128 x 32 makes half a wave (20 x 20
           // squares an image: 200 blocks at batch 1, 6400 at 32, 48 waves).
           {shape(1, 16, 320, 32, 3, 2), {128, 32, 72, 3, 1, true}},
           {shape(16, 16, 320, 32, 3, 2), {128, 32, 72, 3, 1, true}},
           {shape(32, 16, 320, 32, 3, 2), {128, 32, 72, 3, 1, true}},
           // Stride 2 from 32 input channels: Cout-covering tiles, m = 256 for n = 128 where that
           // makes half a wave (here 100 blocks), else 128; 4 stages or as many as fit (3 for
           // 256x128); nor onto a 20x20 plane (69% used). At batch 1 (25 squares), where neither
           // halo kernel's 4-square blocks fill, 64x64 tiles make 50 blocks >= 49.5: 3 stages,
           // split in 2, also at 32 input channels (100 squares; its 4 channel stages whole); at
           // Cout 64 (25 blocks) 64x32 tiles in 2 splits.
           {shape(16, 64, 80, 128, 3, 2), {256, 128, 72, 3, 1, true}},
           {shape(8, 64, 80, 128, 3, 2), {128, 128, 72, 4, 1, true}},  // 256x128: 50 blocks
           // At Cout 64, 64x64 where 128x64 makes under two waves (400 squares: 200 blocks;
           // 1600: 800).
           {shape(16, 64, 80, 64, 3, 2), {64, 64, 72, 3, 1, true}},
           {shape(64, 64, 80, 64, 3, 2), {128, 64, 72, 4, 1, true}},
           {shape(1, 64, 80, 128, 3, 2), {64, 64, 72, 3, 2, true}},
           {shape(1, 32, 160, 64, 3, 2), {64, 64, 72, 3, 1, true}},
           {shape(1, 64, 80, 64, 3, 2), {64, 32, 72, 4, 2, true}},
           // 64 squares at Cout 64: 64x64 under half a wave, from 0.375, in 2 splits.
           {shape(1, 64, 128, 64, 3, 2), {64, 64, 72, 3, 2, true}},
           // Onto a 20x20 plane (no halo kernel), deeper than 256: the wgmma kernel gathering
           // A, 64 x Cout-covering tiles in 4 stages from 0.75 waves (200 and 100 tiles), under
           // one wave split in 2 (36 k tiles); at batch 4 (50 tiles) and on a shallow reduction
           // the mma.sync gather kernel.
           {shape(16, 128, 40, 256, 3, 2), {64, 128, 32, 4, 1, true}},
           {shape(16, 128, 40, 128, 3, 2), {64, 128, 32, 4, 2, true}},
           {shape(10, 128, 40, 256, 3, 2), {64, 128, 32, 4, 2, true}},  // 126 tiles
           {shape(11, 128, 40, 256, 3, 2), {64, 128, 32, 4, 1, true}},  // 138 tiles
           {shape(4, 128, 40, 256, 3, 2),
            conv_tiles(ConvKernel::Gemm, shape(4, 128, 40, 256, 3, 2), sms(132))},
           {shape(64, 16, 40, 128, 3, 2),
            conv_tiles(ConvKernel::Gemm, shape(64, 16, 40, 128, 3, 2), sms(132))},
           // From 32 input channels; at 32 (4 channel stages) in 3 stages.
           {shape(16, 32, 160, 64, 3, 2), {128, 64, 72, 3, 1, true}},
           {shape(1, 7, 640, 16, 3, 2), {128, 32, 32, 2}},  // no halo kernel: no wgmma
           // The gather kernel on 1x1 windows of odd planes (ConvNeXt-T's 768 -> 3072 on 7x7,
           // 13 x 24 tiles): 3 stages.
           {shape(16, 768, 7, 3072, 1), {64, 128, 32, 3, 1, true}},
           // 1x1, stride 1, from 32 output channels: the direct kernel on wgmma from one wave
           // of 64 x Cout-covering tiles; 4 stages where one n tile covers Cout, from 256 input
           // channels or at n = 128 (not at 192 -> 64). At batch 1 (25 x 2 tiles), or with 16
           // channels, the mma.sync kernels;
           // where the covering tiles make under a wave, half as many channels (not a quarter)
           // if those make one, in 4 stages under two waves. Planes of 400 pixels, or 32 input
           // channels, do not take tensor copies (conv_gemm_direct_tma).
           {shape(1, 192, 80, 64, 1), {64, 32, 32, 4, 1, true}},     // 200 tiles
           {shape(16, 256, 20, 128, 1), {64, 64, 32, 4, 1, true}},   // 64x128: 100 tiles
           {shape(48, 384, 20, 128, 1), {64, 128, 32, 4, 1, true}},  // 300 tiles
           {shape(48, 192, 20, 64, 1), {64, 64, 32, 3, 1, true}},
           {shape(16, 32, 160, 32, 1), {64, 32, 32, 3, 1, true}},
           // With tensor copies: half the covering n where that makes a wave, 3 stages from two
           // waves (1600, 800 and 3200 tiles here).
           {shape(16, 256, 40, 256, 1), {64, 64, 32, 3, 1, true}},
           {shape(16, 384, 40, 128, 1), {64, 64, 32, 3, 1, true}},
           {shape(16, 192, 40, 128, 1), {64, 64, 32, 3, 1, true}},
           {shape(16, 128, 40, 128, 1), {64, 64, 32, 3, 1, true}},
           {shape(16, 192, 80, 64, 1), {64, 32, 32, 3, 1, true}},
           {shape(16, 64, 80, 64, 1), {64, 32, 32, 3, 1, true}},
           // Two n tiles of 128 over 132 x 64 pixels: 264 tiles, two waves, 3 stages; 256
           // tiles (128 x 64 pixels), under two waves, 4.
           {shape(33, 48, 16, 256, 1), {64, 128, 32, 3, 1, true}},
           {shape(32, 48, 16, 256, 1), {64, 128, 32, 4, 1, true}},
           {shape(1, 256, 40, 256, 1),
            conv_tiles(ConvKernel::Gemm, shape(1, 256, 40, 256, 1), sms(132))},
           {shape(16, 64, 80, 16, 1),
            conv_tiles(ConvKernel::Gemm, shape(16, 64, 80, 16, 1), sms(132))},
       }) {
    INFO("Cin " << r.s.c << " Cout " << r.s.k << " stride " << r.s.stride_h);
    CHECK(conv_tiles(ConvKernel::Gemm, r.s, hopper) == r.want);
  }
  // gemm's tiles for a depthwise layer (gemm never runs one: conv_supports) are not wgmma ones,
  // which would have a benchmark run them.
  ConvShape depthwise = shape(16, 96, 56, 96, 3);
  depthwise.groups = 96;
  CHECK_FALSE(conv_tiles(ConvKernel::Gemm, depthwise, hopper).wgmma);
  // Split-K's thread-block clusters need Hopper: before it, the same layer keeps whole tiles.
  DeviceProfile ampere = sms(108);
  ampere.cc_major = 8;
  CHECK(conv_tiles(ConvKernel::Gemm, shape(1, 128, 40, 256, 3, 2), sms(108)).splits == 4);
  CHECK(conv_tiles(ConvKernel::Gemm, shape(1, 128, 40, 256, 3, 2), ampere).splits == 1);
}

TEST_CASE("lowering: every tile conv_tiles picks is one of the built tiles the GPU tests run",
          "[lowering]") {
  // Layers from batch 1 to 32, planes from 10 to 320, 1x1 and 3x3 at stride 1 and 2, on GPUs
  // of 16 to 132 SMs, with and without the wgmma kernels.
  std::vector<DeviceProfile> profiles;
  for (int n : {16, 64, 132}) {
    profiles.push_back(sms(n));
    DeviceProfile hopper = sms(n);
    hopper.wgmma = true;
    profiles.push_back(hopper);
  }
  int checked = 0;
  for (const DeviceProfile& device : profiles)
    for (ConvKernel kernel : {ConvKernel::Tiled, ConvKernel::Gemm}) {
      const std::vector<ConvTiles> built = conv_built_tiles(kernel, device);
      for (int64_t n : {1, 4, 16, 32})
        for (int64_t c : {3, 8, 16, 32, 64, 128, 256, 512})
          for (int64_t hw : {10, 20, 40, 80, 160, 320})
            for (int64_t k : {8, 16, 32, 64, 128, 256})
              for (auto [r, stride] : {std::pair{1, 1}, {3, 1}, {3, 2}}) {
                const ConvShape s = shape(n, c, hw, k, r, stride);
                if (!conv_supports(kernel, s)) continue;
                const ConvTiles t = conv_tiles(kernel, s, device);
                INFO(conv_kernel_name(kernel)
                     << " n " << n << " Cin " << c << " plane " << hw << " Cout " << k << " window "
                     << r << " stride " << stride << " SMs " << device.sm_count << " wgmma "
                     << device.wgmma << ": m=" << t.m << " n=" << t.n << " k=" << t.k
                     << " stages=" << t.stages << " splits=" << t.splits);
                CHECK(std::find(built.begin(), built.end(), t) != built.end());
                ++checked;
              }
    }
  CHECK(checked > 10000);
}

TEST_CASE("lowering: the wgmma halo kernel's weights are packed in its layout, rounded to TF32",
          "[lowering]") {
  // 16 x 12 x 40 x 40 -> 20, 3x3: 400 squares of the wgmma halo kernel; Cin 12 fills one and a
  // half stages of 8 channels, Cout 20 a fraction of the 32 packed rows of its one n tile.
  auto build = [](bool weight_is_input) {
    Builder b(7);
    Val x = b.input("x", {16, 12, 40, 40});
    Val w = weight_is_input
                ? b.input("w", {20, 12, 3, 3})
                : b.weight("conv.weight", {20, 12, 3, 3}, OpKind::FusedConv2d, "weight");
    Val scale = b.weight("conv.scale", {20}, OpKind::FusedConv2d, "scale");
    Val shift = b.weight("conv.shift", {20}, OpKind::FusedConv2d, "shift");
    Attrs a;
    a.set("stride", std::vector<int64_t>{1, 1});
    a.set("padding", std::vector<int64_t>{1, 1, 1, 1});
    a.set("groups", int64_t(1));
    a.set("activation", std::string("silu"));
    b.output(b.node(OpKind::FusedConv2d, {x, w, scale, shift}, a, "conv")[0]);
    return b.build();
  };
  LowerOptions cuda;
  cuda.device = Device::CUDA;
  const Graph g = build(false);
  const Plan p = lower(g, cuda);
  REQUIRE(p.nodes[0].tiles.wgmma);
  const ConvShape s = conv_shape(g, g.nodes[0]);
  const Tensor& packed = p.nodes[0].packed;
  REQUIRE(packed.defined());
  REQUIRE(p.nodes[0].tiles.n == 32);
  REQUIRE(packed.numel() == wgmma_packed_floats(s, p.nodes[0].tiles));
  CHECK(packed.numel() == 2 * 72 * 32);  // 2 stages x 18 runs x 32 rows x 4 channels
  const Tensor& w = g.weights.at("conv.weight").data;
  int zeros = 0;
  for (int64_t kt = 0; kt < 2; ++kt)
    for (int64_t tap = 0; tap < 9; ++tap)
      for (int64_t chunk = 0; chunk < 2; ++chunk)
        for (int64_t n = 0; n < 32; ++n)
          for (int64_t e = 0; e < 4; ++e) {
            const int64_t c = 8 * kt + 4 * chunk + e;
            // What the tensor core reads is the top 19 bits: the weight rounded to 11
            // significant bits, ties away from zero; 0 past Cout and Cin.
            uint32_t bits;
            std::memcpy(&bits, &packed.f32()[(((kt * 9 + tap) * 2 + chunk) * 32 + n) * 4 + e], 4);
            bits &= ~0x1fffu;
            float read;
            std::memcpy(&read, &bits, 4);
            if (n >= 20 || c >= 12) {
              zeros += read == 0.0f;
              continue;
            }
            int exp = 0;
            const double m = std::frexp(double(w.f32()[(n * 12 + c) * 9 + tap]), &exp);
            REQUIRE(double(read) == std::ldexp(std::round(std::ldexp(m, 11)), exp - 11));
          }
  CHECK(zeros == 2 * 9 * 2 * 32 * 4 - 20 * 12 * 9);

  // Cout 40 in tiles of 32: tile 1 follows all of tile 0's stages, its rows past Cout zero.
  const ConvShape s40 = shape(1, 12, 8, 40, 3);
  const ConvTiles halo32{128, 32, 72, 3, 1, true};
  std::vector<float> w40(40 * 12 * 9), p40(size_t(wgmma_packed_floats(s40, halo32)));
  for (size_t i = 0; i < w40.size(); ++i) w40[i] = float(i + 1);  // all distinct
  pack_wgmma_weights(s40, halo32, w40.data(), p40.data());
  CHECK(p40.size() == 2 * 2 * 72 * 32);  // 2 n tiles x 2 stages x 18 runs x 32 rows x 4
  auto at = [&](int64_t nt, int64_t kt, int64_t tc, int64_t r, int64_t e) {
    uint32_t bits;
    std::memcpy(&bits, &p40[size_t((((nt * 2 + kt) * 18 + tc) * 32 + r) * 4 + e)], 4);
    bits &= ~0x1fffu;
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
  };
  auto tf32 = [](float v) {  // as checked above: rounded to nearest, low 13 bits dropped
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits = (bits + 0x1000u) & ~0x1fffu;
    std::memcpy(&v, &bits, 4);
    return v;
  };
  // Output channel 35 = tile 1, row 3; input channel 9 = stage 1, chunk 0, element 1; tap 4.
  CHECK(at(1, 1, 2 * 4, 3, 1) == tf32(w40[(35 * 12 + 9) * 9 + 4]));
  CHECK(at(0, 0, 2 * 8 + 1, 31, 3) == tf32(w40[(31 * 12 + 7) * 9 + 8]));
  CHECK(at(1, 0, 0, 8, 0) == 0.0f);  // channel 40: past Cout
  CHECK(at(1, 1, 1, 0, 0) == 0.0f);  // input channel 12: past Cin

  // A weight known only at run time cannot be packed: the mma.sync halo kernel.
  const Plan q = lower(build(true), cuda);
  CHECK_FALSE(q.nodes[0].tiles.wgmma);
  CHECK(q.nodes[0].tiles.k == 72);
  CHECK_FALSE(q.nodes[0].packed.defined());
}

TEST_CASE("lowering: the wgmma direct kernel copies its input by tensor copies where it may",
          "[lowering]") {
  const ConvTiles t64{64, 128, 32, 3, 1, true}, t128{128, 128, 32, 3, 1, true};
  struct Row {
    ConvShape s;
    ConvTiles t;
    bool tma;
  };
  ConvShape slab = shape(16, 256, 40, 256, 1);
  slab.x_stride = 258 * 40 * 40;  // channels of a larger batch: still a multiple of 4
  ConvShape odd_slab = shape(2, 64, 8, 64, 1);
  odd_slab.x_stride = 64 * 64 + 2;  // images not 16 bytes apart
  const std::vector<Row> rows = {
      {shape(16, 256, 40, 256, 1), t64, true},   // 1600 pixels: 25 tiles of 64 an image
      {shape(16, 256, 40, 256, 1), t128, true},  // 13 tiles of 128, 64 rows past the plane
      {shape(16, 256, 32, 256, 1), t128, true},
      {shape(16, 64, 80, 64, 1), t64, true},      // two k tiles: kDirectTmaMinDepth
      {shape(16, 32, 80, 64, 1), t64, false},     // one
      {shape(16, 256, 20, 256, 1), t64, true},    // 400 pixels in 448: 11% padding
      {shape(16, 256, 20, 256, 1), t128, false},  // in 512: 22%, over kDirectTmaMaxPad
      {shape(16, 256, 10, 256, 1), t64, false},   // 100 in 128
      {shape(2, 64, 30, 64, 1), t128, true},      // 900 in 1024: 12.1%
      {shape(16, 256, 40, 256, 3), t64, false},   // 3x3: the gather kernel
      {shape(16, 256, 40, 256, 1), {64, 128, 32, 3, 2, true}, false},   // split
      {shape(16, 256, 40, 256, 1), {64, 128, 32, 3, 1, false}, false},  // mma.sync tiles
      {slab, t64, true},
      {odd_slab, t64, false},
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    INFO("row " << i);
    CHECK(conv_gemm_direct_tma(rows[i].s, rows[i].t) == rows[i].tma);
  }
}

TEST_CASE("lowering: the wgmma k = 32 kernel's weights are packed in its layout", "[lowering]") {
  // 40 -> 72 channels, 1x1: Cin fills one and a quarter stages of 32, Cout two n tiles of 64.
  const ConvShape s = shape(16, 40, 40, 72, 1);
  REQUIRE(conv_gemm_direct_fits(s));
  const ConvTiles t{128, 64, 32, 4, 1, true};
  REQUIRE(conv_gemm_wgmma_kernel(t, s) == WgmmaKernel::Direct);
  std::vector<float> w(72 * 40), p(size_t(wgmma_packed_floats(s, t)));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 1.0f + float(i) / 4096.0f;  // all distinct
  pack_wgmma_weights(s, t, w.data(), p.data());
  CHECK(p.size() == 2 * 2 * 32 * 64);  // 2 n tiles x 2 stages x 32 channels x 64 rows
  auto at = [&](int64_t nt, int64_t kt, int64_t q, int64_t r, int64_t e) {
    return p[size_t((((nt * 2 + kt) * 8 + q) * 64 + r) * 4 + e)];
  };
  auto tf32 = [](float v) {  // what the tensor core reads of the rounded value
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits = (bits + 0x1000u) & ~0x1fffu;
    std::memcpy(&v, &bits, 4);
    return v;
  };
  auto read = [](float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits &= ~0x1fffu;
    std::memcpy(&v, &bits, 4);
    return v;
  };
  // Run q holds k step q / 2; column e of its first half is channel 2e of the step, of its
  // second 2e + 1. Output channel 70 = tile 1 row 6; input channel 37 = stage 1, step 0, 2*2 + 1.
  CHECK(read(at(1, 1, 1, 6, 2)) == tf32(w[70 * 40 + 37]));
  // Channel 13 = stage 0, step 1 (8..15), 2*2 + 1: run 3, column 2.
  CHECK(read(at(0, 0, 3, 5, 2)) == tf32(w[5 * 40 + 13]));
  CHECK(read(at(0, 0, 2, 5, 0)) == tf32(w[5 * 40 + 8]));
  CHECK(read(at(1, 0, 0, 8, 0)) == 0.0f);  // output channel 72: past Cout
  CHECK(read(at(0, 1, 2, 0, 0)) == 0.0f);  // input channel 40: past Cin
  // Every weight lands exactly once; the rest reads as zero.
  int nonzero = 0;
  for (float v : p) nonzero += read(v) != 0.0f;
  CHECK(nonzero == 72 * 40);

  // Tiles no wgmma kernel takes pack nothing: k = 72 on a 1x1 shape, mma.sync tiles, groups.
  // An odd output plane is the gathering form's too.
  CHECK(wgmma_packed_floats(s, ConvTiles{128, 64, 72, 3, 1, true}) == 0);
  CHECK(wgmma_packed_floats(s, ConvTiles{128, 64, 32, 4, 1, false}) == 0);
  CHECK(conv_gemm_wgmma_kernel(t, shape(16, 40, 41, 72, 3)) == WgmmaKernel::Gather);
  CHECK(wgmma_packed_floats(shape(16, 40, 41, 72, 3), t) > 0);
  ConvShape grouped = shape(16, 40, 40, 72, 3);
  grouped.groups = 2;
  CHECK(wgmma_packed_floats(grouped, t) == 0);

  // On a 3x3 shape the same tiles gather A: the stages run over the whole reduction
  // kk = 9c + 3i + j (40 x 9 = 360 steps: 12 stages, the last a quarter full).
  const ConvShape s3 = shape(16, 40, 40, 72, 3);
  REQUIRE(conv_gemm_wgmma_kernel(t, s3) == WgmmaKernel::Gather);
  std::vector<float> w3(72 * 40 * 9), p3(size_t(wgmma_packed_floats(s3, t)));
  for (size_t i = 0; i < w3.size(); ++i) w3[i] = 1.0f + float(i) / 65536.0f;
  pack_wgmma_weights(s3, t, w3.data(), p3.data());
  CHECK(p3.size() == 2 * 12 * 32 * 64);
  auto at3 = [&](int64_t nt, int64_t kt, int64_t q, int64_t r, int64_t e) {
    return p3[size_t((((nt * 12 + kt) * 8 + q) * 64 + r) * 4 + e)];
  };
  // Output channel 70, step 357 (channel 39, tap 6) = stage 11, step 5 of it: k step 0 (0..7),
  // 2*2 + 1: run 1, column 2.
  CHECK(read(at3(1, 11, 1, 6, 2)) == tf32(w3[70 * 360 + 357]));
  CHECK(read(at3(0, 0, 3, 5, 2)) == tf32(w3[5 * 360 + 13]));
  CHECK(read(at3(1, 11, 1, 6, 3)) == tf32(w3[70 * 360 + 359]));  // the last step
  CHECK(read(at3(1, 11, 2, 6, 0)) == 0.0f);                      // step 360: past it
  nonzero = 0;
  for (float v : p3) nonzero += read(v) != 0.0f;
  CHECK(nonzero == 72 * 360);
}

TEST_CASE("lowering: a conv2d left unfused takes the fused conv's kernel and tiles", "[lowering]") {
  // One conv path: with fusion off (or a bias computed at run time) a conv2d still runs on the
  // kernels the selector picks for its shape, never a kernel of its own.
  Builder b(1);
  Val x = b.input("x", {4, 32, 20, 20});
  Val y = b.conv2d(x, "c1", ConvOpts(64, 3).padding(1).bias());
  y = b.conv2d(y, "c2", ConvOpts(8, 1));
  b.output(b.conv2d(y, "c3", ConvOpts(8, 3).groups(8).padding(1)));
  Graph raw = b.build(), fused = raw;
  optimize(fused);
  LowerOptions cuda;
  cuda.device = Device::CUDA;
  const Plan p = lower(raw, cuda), q = lower(fused, cuda);
  REQUIRE(p.nodes.size() == 3);
  REQUIRE(q.nodes.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(p.graph.nodes[i].op == OpKind::Conv2d);
    CHECK(q.graph.nodes[i].op == OpKind::FusedConv2d);
    CHECK(p.nodes[i].kernel == q.nodes[i].kernel);
    CHECK(p.nodes[i].rule == q.nodes[i].rule);
    CHECK(p.nodes[i].tiles == q.nodes[i].tiles);
  }
  CHECK(p.nodes[0].kernel == "gemm");
  CHECK(p.nodes[2].kernel == "scalar");
}

TEST_CASE("lowering: plans every node, honours a forced kernel, explains the choice",
          "[lowering]") {
  Builder b(1);
  Val x = b.input("x", {1, 32, 20, 20});
  Val y = b.silu(b.batchnorm(b.conv2d(x, "c1", ConvOpts(64, 1)), "bn1"), "a1");
  y = b.silu(b.batchnorm(b.conv2d(y, "c2", ConvOpts(8, 1)), "bn2"), "a2");
  y = b.silu(b.batchnorm(b.conv2d(y, "c3", ConvOpts(8, 1)), "bn3"), "a3");
  b.output(b.maxpool2d(y, PoolOpts(2), "pool"));
  Graph g = b.build();
  optimize(g);

  Plan cpu = lower(g, LowerOptions{});
  REQUIRE(cpu.nodes.size() == 4);
  CHECK(cpu.nodes[0].kernel == "cpu");

  LowerOptions cuda;
  cuda.device = Device::CUDA;
  Plan p = lower(g, cuda);
  CHECK(p.nodes[0].kernel == "gemm");
  CHECK(p.nodes[1].kernel == "gemm");
  CHECK(p.nodes[2].kernel == "tiled");  // a reduction of 8
  CHECK(p.nodes[3].kernel == "maxpool2d");
  CHECK_THAT(p.nodes[3].rule, Catch::Contains("a plane a block"));
  std::string text = explain(p);
  CHECK_THAT(text, Catch::Contains("c1") && Catch::Contains("gemm") &&
                       Catch::Contains("reduction 32 >= 16: gemm") &&
                       Catch::Contains("reduction 8 < 16: tiled") && Catch::Contains("stages=4"));
  CHECK_THAT(text, !Catch::Contains("residual"));

  // Each max-pool kernel, and why: SPPF's 5x5 "same" window, another window, a plane too large
  // for shared memory.
  for (const auto& [shape, opts, want] : std::vector<std::tuple<Shape, PoolOpts, std::string>>{
           {{1, 8, 20, 20}, PoolOpts(5).stride(1).padding(2), "5x5 at stride 1 padded by 2"},
           {{1, 8, 20, 20}, PoolOpts(5).stride(1).padding(1), "a plane a block"},
           {{1, 8, 100, 130}, PoolOpts(3).stride(1).padding(1), "an output a thread"}}) {
    Builder bp(3);
    bp.output(bp.maxpool2d(bp.input("x", shape), opts, "pool"));
    const Plan pp = lower(bp.build(), cuda);
    INFO(shape_str(shape));
    CHECK_THAT(pp.nodes[0].rule, Catch::Contains(want));
  }

  // A residual add fused into the conv shows on its line.
  Builder br(2);
  Val xr = br.input("x", {1, 8, 10, 10});
  br.output(br.add(br.silu(br.conv2d(xr, "cr", ConvOpts(8, 3).padding(1)), "ar"), xr, "sum"));
  Graph gr = br.build();
  optimize(gr);
  CHECK_THAT(explain(lower(gr, cuda)),
             Catch::Contains("[1,8,10,10] -> [1,8,10,10] + residual") && Catch::Contains("cr"));

  // flatten and reshape launch nothing: each is its input under another shape.
  Builder bv(5);
  const Val flat = bv.flatten(bv.global_avgpool(bv.input("x", {2, 8, 4, 4})), 1, "flat");
  bv.output(bv.reshape(flat, {2, 2, 4}, "shaped"));
  const Plan pv = lower(bv.build(), cuda);
  REQUIRE(pv.nodes.size() == 3);
  CHECK(pv.nodes[0].kernel == "global_avgpool");
  CHECK(pv.nodes[1].kernel == "view");
  CHECK(pv.nodes[2].kernel == "view");
  CHECK_THAT(explain(pv), Catch::Contains("no kernel: its input under another shape"));

  // The persistent halo kernel stages a square's whole reduction: its line shows no stages.
  Builder bq(4);
  Val xq = bq.input("x", {16, 32, 80, 80});
  bq.output(bq.silu(bq.conv2d(xq, "cq", ConvOpts(32, 3).padding(1)), "aq"));
  Graph gq = bq.build();
  optimize(gq);
  CHECK_THAT(explain(lower(gq, cuda)),
             Catch::Contains("m=64 n=32 k=72 wgmma persistent") && !Catch::Contains("stages="));

  cuda.force = ConvKernel::Tiled;
  Plan f = lower(g, cuda);
  CHECK(f.nodes[0].kernel == "tiled");
  CHECK(f.nodes[0].rule == "forced");
  CHECK(f.nodes[1].kernel == "tiled");
  CHECK(f.nodes[2].rule == "forced");
  CHECK(parse_conv_kernel("gemm") == ConvKernel::Gemm);

  // A forced kernel that cannot run a layer leaves the selector's choice, and says why.
  Builder d(1);
  Val dx = d.input("x", {1, 16, 8, 8});
  d.output(d.silu(d.batchnorm(d.conv2d(dx, "dw", ConvOpts(16, 3).padding(1).groups(16)), "bn")));
  Graph dg = d.build();
  optimize(dg);
  cuda.force = ConvKernel::Gemm;
  Plan dp = lower(dg, cuda);
  CHECK(dp.nodes[0].kernel == "scalar");
  CHECK_THAT(dp.nodes[0].rule, Catch::StartsWith("forced gemm cannot run this shape (groups=16)"));
  CHECK_FALSE(parse_conv_kernel("fast"));
}

TEST_CASE(
    "lowering: an upsampling that only a 1x1 conv reads, through a concat, is folded into "
    "the conv's loads",
    "[lowering]") {
  LowerOptions cuda;
  cuda.device = Device::CUDA;
  const Plan p = lower(join_graph({}), cuda);
  const NodePlan& conv = node_plan(p, "join");
  REQUIRE(conv.up);
  CHECK(conv.up->node == "up");
  CHECK(conv.up->source == "a.act");
  CHECK(conv.up->c0 == 0);
  CHECK(conv.up->channels == 256);
  CHECK(conv.up->scale_h == 2);
  CHECK(conv.up->scale_w == 2);
  // It copies A by cp.async: the tiles for that (64x64 in 3 stages with tensor copies), and
  // its weights packed for them.
  CHECK(conv.tiles == ConvTiles{64, 128, 32, 4, 1, true});
  const ConvShape join_shape = conv_shape(p.graph, *p.graph.find_node("join"));
  CHECK(conv_tiles(ConvKernel::Gemm, join_shape, cuda.profile) ==
        ConvTiles{64, 64, 32, 3, 1, true});
  CHECK(conv.packed.numel() == wgmma_packed_floats(join_shape, conv.tiles));
  CHECK(node_plan(p, "up").folded_into == "join");
  // explain says so where the concat runs in place (the executor folds it only then).
  const std::vector<bool> mask = in_place_mask(p);
  const std::string text = explain(p, mask);
  CHECK_THAT(text, Catch::Contains("folded") &&
                       Catch::Contains("no kernel: join reads its input upsampled") &&
                       Catch::Contains("channels 0..255 read from a.act upsampled 2x2"));
  CHECK_THAT(explain(p), !Catch::Contains("folded") && !Catch::Contains("read from"));
  // Reading through the upsampling it copies A by cp.async; reading the concat, by tensor copies.
  CHECK_THAT(text, !Catch::Contains("wgmma tma"));
  CHECK_THAT(explain(p), Catch::Contains("m=64 n=128 k=32 stages=4 wgmma tma"));
  const InPlacePlan ip = plan_in_place(p);  // nodes a, s, up, cat, join
  CHECK(ip.folded == std::vector<bool>{false, false, true, false, false});
  CHECK(ip.concat == std::vector<bool>{false, false, false, true, false});

  Join second;  // the upsampled part after the other one
  second.up_first = false;
  const Plan q = lower(join_graph(second), cuda);
  REQUIRE(node_plan(q, "join").up);
  CHECK(node_plan(q, "join").up->c0 == 128);
  CHECK_THAT(explain(q, in_place_mask(q)), Catch::Contains("channels 128..383 read from a.act"));

  // Refused: a second reader of the upsampled value or of the concat, a 3x3 conv (the halo
  // kernel), an output row that is not whole 4-pixel chunks, a scale of 4, no wgmma, the CPU, a
  // forced kernel.
  Join up_out, cat_out, k3, odd, x4;
  up_out.up_is_output = true;
  cat_out.cat_is_output = true;
  k3.k = 3;
  odd.w_low = 9;  // 18 columns
  x4.scale = 4;
  LowerOptions cpu, sync = cuda, tiled = cuda;
  sync.profile.wgmma = false;
  tiled.force = ConvKernel::Tiled;
  for (const auto& [why, g, options] : std::vector<std::tuple<std::string, Graph, LowerOptions>>{
           {"upsampled value read twice", join_graph(up_out), cuda},
           {"concat read twice", join_graph(cat_out), cuda},
           {"3x3 conv", join_graph(k3), cuda},
           {"18 columns", join_graph(odd), cuda},
           {"scale 4", join_graph(x4), cuda},
           {"no wgmma", join_graph({}), sync},
           {"cpu", join_graph({}), cpu},
           {"forced tiled", join_graph({}), tiled}}) {
    INFO(why);
    const Plan r = lower(g, options);
    CHECK_FALSE(node_plan(r, "join").up);
    CHECK(node_plan(r, "up").folded_into.empty());
    CHECK_THAT(explain(r, in_place_mask(r)), !Catch::Contains("folded"));
    if (why == "18 columns" || why == "scale 4") {  // the kernel but for the chunks or scale
      CHECK(node_plan(r, "join").tiles.wgmma);
      CHECK(node_plan(r, "join").tiles.k == 32);
    }
  }
}

TEST_CASE("lowering: SPPF's cascade of max-pools runs as one kernel, up to three in a row",
          "[lowering]") {
  // x -> p1 -> p2 -> p3 -> p4 (5x5 "same" pools), p5 a 3x3 one after p4, q a pool of x beside
  // p1, all read by one concat.
  Builder b(2);
  Val x = b.input("x", {16, 128, 20, 20});
  const PoolOpts five = PoolOpts(5).stride(1).padding(2), three = PoolOpts(3).stride(1).padding(1);
  Val p1 = b.maxpool2d(x, five, "p1");
  Val p2 = b.maxpool2d(p1, five, "p2");
  Val p3 = b.maxpool2d(p2, five, "p3");
  Val p4 = b.maxpool2d(p3, five, "p4");
  Val p5 = b.maxpool2d(p4, three, "p5");
  Val q = b.maxpool2d(x, five, "q");
  b.output(b.concat({x, p1, p2, p3, p4, p5, q}, 1, "cat"));
  const Graph g = b.build();
  LowerOptions cuda;
  cuda.device = Device::CUDA;
  const Plan p = lower(g, cuda);
  CHECK(node_plan(p, "p1").chain == std::vector<std::string>{"p2", "p3"});
  CHECK(node_plan(p, "p2").folded_into == "p1");
  CHECK(node_plan(p, "p3").folded_into == "p1");
  // Three at most: p4 starts a chain of its own, which p5's other window does not join; q pools
  // x, not p1.
  CHECK(node_plan(p, "p4").folded_into.empty());
  CHECK(node_plan(p, "p4").chain.empty());
  CHECK(node_plan(p, "p5").folded_into.empty());
  CHECK(node_plan(p, "q").folded_into.empty());
  CHECK(node_plan(p, "q").chain.empty());
  const std::string text = explain(p, in_place_mask(p));
  CHECK_THAT(text, Catch::Contains("then p2, p3, each pooling the one before") &&
                       Catch::Contains("no kernel: p1 makes it on its staged plane"));
  CHECK_THAT(explain(p), !Catch::Contains("folded") && !Catch::Contains("then p2"));
  CHECK(plan_in_place(p).folded ==
        std::vector<bool>{false, true, true, false, false, false, false});

  // A window the "same" kernel does not take, and the CPU: no chain.
  Builder b2(2);
  Val y = b2.input("y", {1, 8, 20, 20});
  const PoolOpts seven = PoolOpts(7).stride(1).padding(3);
  b2.output(b2.maxpool2d(b2.maxpool2d(y, seven, "a"), seven, "b"));
  const Graph g2 = b2.build();
  CHECK(node_plan(lower(g2, cuda), "b").folded_into.empty());
  CHECK(node_plan(lower(g, LowerOptions{}), "p2").folded_into.empty());
}

// A stem (a conv over c channels into `mid`, 3x3, stride 2) and the conv that reads it (3x3,
// stride `stride2`, into `out`), each with batchnorm and SiLU, fused.
struct Stem {
  int64_t c = 3, mid = 16, out = 32, stride2 = 2;
  bool mid_is_output = false, second_reader = false;
  bool first_residual = false, second_residual = false;  // x + conv(...) after either conv
};

Graph stem_graph(const Stem& st) {
  Builder b(7);
  Val mid = test::conv_bn_silu(b, b.input("images", {16, st.c, 640, 640}), "b0", st.mid, 3, 2);
  if (st.first_residual) mid = b.add(mid, b.input("r0", {16, st.mid, 320, 320}), "b0.add");
  Val y = test::conv_bn_silu(b, mid, "b1", st.out, 3, st.stride2);
  const int64_t side = 320 / st.stride2;
  if (st.second_residual) y = b.add(y, b.input("r1", {16, st.out, side, side}), "b1.add");
  b.output(y);
  if (st.mid_is_output) b.output(mid);
  if (st.second_reader) b.output(b.relu(mid, "other"));
  Graph g = b.build();
  optimize(g);
  return g;
}

TEST_CASE("lowering: a stem conv is folded into the conv that alone reads it (conv pair)",
          "[lowering]") {
  LowerOptions cuda;
  cuda.device = Device::CUDA;
  const Plan p = lower(stem_graph({}), cuda);
  const NodePlan& second = node_plan(p, "b1");
  REQUIRE(second.pre);
  CHECK(second.pre->node == "b0");
  CHECK(second.pre->act == Activation::Silu);
  CHECK(second.pre->shape.c == 3);
  CHECK(second.pre->shape.k == 16);
  CHECK(second.pre->shape.ho == 320);
  CHECK(node_plan(p, "b0").folded_into == "b1");
  // Each keeps its own kernel, which runs while copy avoidance is off.
  CHECK(node_plan(p, "b0").kernel == "gemm");
  CHECK(second.tiles.wgmma);
  const InPlacePlan ip = plan_in_place(p);
  CHECK(ip.folded == std::vector<bool>{true, false});
  const std::string text = explain(p, in_place_mask(p));
  CHECK_THAT(text, Catch::Contains("no kernel: b1 makes its outputs where it loads them") &&
                       Catch::Contains("gemm pair") &&
                       Catch::Contains("also computes b0 (3 -> 16 channels)"));
  CHECK_THAT(explain(p), !Catch::Contains("folded") && !Catch::Contains("gemm pair"));

  // Refused: the stem's output read twice or a graph output (can_absorb), a residual after
  // either conv (the pair's kernel adds none), 4 input channels, 32 channels between, 64 out, a
  // second conv at stride 1, no wgmma, the CPU, a forced kernel.
  Stem out, twice, res0, res1, c4, mid32, out64, s1;
  out.mid_is_output = true;
  res0.first_residual = true;
  res1.second_residual = true;
  twice.second_reader = true;
  c4.c = 4;
  mid32.mid = 32;
  out64.out = 64;
  s1.stride2 = 1;
  LowerOptions cpu, sync = cuda, gemm = cuda;
  sync.profile.wgmma = false;
  gemm.force = ConvKernel::Gemm;
  for (const auto& [why, g, options] : std::vector<std::tuple<std::string, Graph, LowerOptions>>{
           {"stem output is a graph output", stem_graph(out), cuda},
           {"stem output read twice", stem_graph(twice), cuda},
           {"stem adds a residual", stem_graph(res0), cuda},
           {"second conv adds a residual", stem_graph(res1), cuda},
           {"4 input channels", stem_graph(c4), cuda},
           {"32 channels between", stem_graph(mid32), cuda},
           {"64 output channels", stem_graph(out64), cuda},
           {"second conv at stride 1", stem_graph(s1), cuda},
           {"no wgmma", stem_graph({}), sync},
           {"cpu", stem_graph({}), cpu},
           {"forced gemm", stem_graph({}), gemm}}) {
    INFO(why);
    const Plan r = lower(g, options);
    CHECK_FALSE(node_plan(r, "b1").pre);
    CHECK(node_plan(r, "b0").folded_into.empty());
    CHECK_THAT(explain(r, in_place_mask(r)), !Catch::Contains("gemm pair"));
  }
}

TEST_CASE("lowering: a conv with one folded into it is not folded into the next", "[lowering]") {
  // 3 -> 3 -> 16 -> 32 channels, each 3x3 at stride 2: the first pair folds; the second conv,
  // whose kernel then computes the first, must run for the third to read its output.
  Builder b(9);
  Val x = b.input("images", {2, 3, 128, 128});
  for (const auto& [name, k] : {std::pair<const char*, int64_t>{"c0", 3}, {"c1", 16}, {"c2", 32}})
    x = b.silu(b.batchnorm(b.conv2d(x, name, ConvOpts(k, 3).stride(2).padding(1)),
                           std::string(name) + ".bn"));
  b.output(x);
  Graph g = b.build();
  optimize(g);
  LowerOptions cuda;
  cuda.device = Device::CUDA;
  const Plan p = lower(g, cuda);
  REQUIRE(node_plan(p, "c1").pre);
  CHECK(node_plan(p, "c1").pre->node == "c0");
  CHECK(node_plan(p, "c0").folded_into == "c1");
  CHECK_FALSE(node_plan(p, "c2").pre);
  CHECK(node_plan(p, "c1").folded_into.empty());
  CHECK(plan_in_place(p).folded == std::vector<bool>{true, false, false});
}

// A 3x3 conv at stride `stride` (32 -> `mid` channels at batch 16 onto 80x80 at stride 2) and
// the conv that reads it (`k2` x `k2`, into `out`), each with batchnorm and SiLU, fused: the
// YOLO-like backbone's b3 and b4.cv1.
struct Chain {
  int64_t mid = 64, out = 64, k2 = 1, stride = 2;
  bool mid_is_output = false, second_reader = false;
  bool first_residual = false, second_residual = false;  // x + conv(...) after either conv
};

Graph chain_graph(const Chain& ch) {
  Builder b(11);
  const int64_t hw = ch.stride == 2 ? 160 : 80;
  Val mid = test::conv_bn_silu(b, b.input("x", {16, 32, hw, hw}), "b3", ch.mid, 3, ch.stride);
  if (ch.first_residual) mid = b.add(mid, b.input("r3", {16, ch.mid, 80, 80}), "b3.add");
  Val y = test::conv_bn_silu(b, mid, "b4", ch.out, ch.k2);
  if (ch.second_residual) y = b.add(y, b.input("r4", {16, ch.out, 80, 80}), "b4.add");
  b.output(y);
  if (ch.mid_is_output) b.output(mid);
  if (ch.second_reader) b.output(b.relu(mid, "other"));
  Graph g = b.build();
  optimize(g);
  return g;
}

TEST_CASE("lowering: a 1x1 conv is folded into the conv whose output it alone reads (conv chain)",
          "[lowering]") {
  LowerOptions cuda;
  cuda.device = Device::CUDA;
  const Graph g = chain_graph({});
  const Plan p = lower(g, cuda);
  const NodePlan& first = node_plan(p, "b3");
  REQUIRE(first.post);
  CHECK(first.post->node == "b4");
  CHECK(first.post->act == Activation::Silu);
  CHECK(first.post->shape.c == 64);
  CHECK(first.post->shape.k == 64);
  CHECK(first.post->shape.ho == 80);
  CHECK(node_plan(p, "b4").folded_into == "b3");
  REQUIRE(conv_chain_fits(conv_shape(p.graph, p.graph.nodes[0]), first.tiles, first.post->shape));
  // The first conv's packed weights, then the 1x1's weights, scale and shift.
  const int64_t own = wgmma_packed_floats(conv_shape(p.graph, p.graph.nodes[0]), first.tiles);
  REQUIRE(first.packed.numel() == own + kChainTailFloats);
  const float* tail = first.packed.f32() + own;
  const Tensor& scale = g.weights.at(g.nodes[1].inputs[2]).data;
  const Tensor& shift = g.weights.at(g.nodes[1].inputs[3]).data;
  CHECK(std::memcmp(tail + kChainC * kChainC, scale.f32(), 4 * kChainC) == 0);
  CHECK(std::memcmp(tail + kChainC * kChainC + kChainC, shift.f32(), 4 * kChainC) == 0);
  // The 1x1 keeps its own kernel and packed weights, which run while copy avoidance is off.
  CHECK(node_plan(p, "b4").kernel == "gemm");
  CHECK(node_plan(p, "b4").packed.numel() == kChainC * kChainC);
  CHECK(plan_in_place(p).folded == std::vector<bool>{false, true});
  const std::string text = explain(p, in_place_mask(p));
  CHECK_THAT(text, Catch::Contains("no kernel: b3 runs it on its accumulators (conv chain)") &&
                       Catch::Contains("gemm chain") &&
                       Catch::Contains("also runs b4 (1x1, 64 -> 64 channels)"));
  CHECK_THAT(explain(p), !Catch::Contains("folded") && !Catch::Contains("gemm chain"));

  // Refused: the intermediate read twice or a graph output (can_absorb), a residual after
  // either conv (the chain's kernel adds none), 32 or 128 channels between, 32 out, a 3x3
  // second conv, no wgmma, the CPU, a forced kernel.
  Chain out, twice, res3, res4, mid32, mid128, out32, k3;
  out.mid_is_output = true;
  res3.first_residual = true;
  res4.second_residual = true;
  twice.second_reader = true;
  mid32.mid = 32;
  mid128.mid = 128;
  out32.out = 32;
  k3.k2 = 3;
  LowerOptions cpu, sync = cuda, gemm = cuda;
  sync.profile.wgmma = false;
  gemm.force = ConvKernel::Gemm;
  for (const auto& [why, graph, options] :
       std::vector<std::tuple<std::string, Graph, LowerOptions>>{
           {"intermediate is a graph output", chain_graph(out), cuda},
           {"intermediate read twice", chain_graph(twice), cuda},
           {"first conv adds a residual", chain_graph(res3), cuda},
           {"second conv adds a residual", chain_graph(res4), cuda},
           {"32 channels between", chain_graph(mid32), cuda},
           {"128 channels between", chain_graph(mid128), cuda},
           {"32 output channels", chain_graph(out32), cuda},
           {"3x3 second conv", chain_graph(k3), cuda},
           {"no wgmma", chain_graph({}), sync},
           {"cpu", chain_graph({}), cpu},
           {"forced gemm", chain_graph({}), gemm}}) {
    INFO(why);
    const Plan r = lower(graph, options);
    CHECK_FALSE(node_plan(r, "b3").post);
    CHECK(node_plan(r, "b4").folded_into.empty());
    CHECK_THAT(explain(r, in_place_mask(r)), !Catch::Contains("gemm chain"));
  }
}

TEST_CASE("lowering: the YOLO-like model folds b4.cv1 into b3 at batch 16", "[lowering]") {
  Builder b(1);
  Graph g = yolo::yolo_like(b, /*batch=*/16, /*size=*/640);
  optimize(g);
  LowerOptions cuda;
  cuda.device = Device::CUDA;
  const Plan p = lower(g, cuda);
  std::vector<std::string> chained;
  for (size_t i = 0; i < p.nodes.size(); ++i)
    if (p.nodes[i].post) chained.push_back(p.graph.nodes[i].name + " <- " + p.nodes[i].post->node);
  CHECK(chained == std::vector<std::string>{"b3.conv <- b4.cv1.conv"});
}

// The chain's second conv takes A's accumulators as its MMAs' A operand as they lie (the
// kernel's chain_epilogue): lane (g, t) of warp w holds channel 8j + 2t + e of pixel rows 16w + g
// (e) and 16w + g + 8 (2 + e) in acc[j][.], and hands {acc[j][0], acc[j][2], acc[j][1],
// acc[j][3]} to k step j as columns t (rows g, g + 8) and t + 4. With the 1x1's weights packed
// by pack_conv_chain, the MMAs must sum each pixel's channels against the right weights: here
// on the host, in values TF32 holds exactly, against the plain product.
TEST_CASE("kernel geometry: pack_conv_chain orders the 1x1's weights as A's accumulators lie",
          "[lowering][shapes]") {
  constexpr int C = kChainC;
  std::vector<float> v(64 * C), w(C * C), scale(C), shift(C);
  for (int i = 0; i < 64 * C; ++i) v[size_t(i)] = float((i * 37 + 11) % 17 - 8);
  for (int i = 0; i < C * C; ++i) w[size_t(i)] = float((i * 53 + 5) % 13 - 6) / 8.0f;
  for (int c = 0; c < C; ++c) scale[size_t(c)] = 1.0f + c, shift[size_t(c)] = -2.0f * c;
  // An odd plane, which no wgmma kernel of the 1x1 alone takes (its packing must not care).
  ConvShape b{2, C, 75, 99, C, 1, 1, 75, 99, 1, 1, 0, 0, 1, 1, 1};
  std::vector<float> packed(size_t(kChainTailFloats), -1.0f);
  pack_conv_chain(b, w.data(), scale.data(), shift.data(), packed.data());
  // The MMAs' operands as the kernel builds them: A from the lanes' accumulators, B from the
  // shared-memory layout its descriptors give (k step j 2C floats x 4 on, the second column
  // chunk C x 4 floats on, row n 4 floats on).
  std::vector<float> a_op(64 * C, NAN);
  for (int warp = 0; warp < 4; ++warp)
    for (int g = 0; g < 8; ++g)
      for (int t = 0; t < 4; ++t)
        for (int j = 0; j < C / 8; ++j) {
          const auto acc = [&](int q) {
            return v[size_t((16 * warp + g + 8 * (q / 2)) * C + 8 * j + 2 * t + q % 2)];
          };
          const float frag[4] = {acc(0), acc(2), acc(1), acc(3)};
          a_op[size_t((16 * warp + g) * C + 8 * j + t)] = frag[0];
          a_op[size_t((16 * warp + g + 8) * C + 8 * j + t)] = frag[1];
          a_op[size_t((16 * warp + g) * C + 8 * j + t + 4)] = frag[2];
          a_op[size_t((16 * warp + g + 8) * C + 8 * j + t + 4)] = frag[3];
        }
  // The tensor cores read the top 19 bits of an operand (pack_wgmma_weights rounds by adding
  // half of what they drop).
  const auto tf32 = [](float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits &= ~0x1fffu;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  int64_t wrong = 0;
  for (int row = 0; row < 64; ++row)
    for (int n = 0; n < C; ++n) {
      double got = 0.0, want = 0.0;
      for (int k = 0; k < C; ++k) {
        const int j = k / 8, p = k % 8;
        got += double(a_op[size_t(row * C + k)]) *
               tf32(packed[size_t(2 * C * 4 * j + C * 4 * (p / 4) + 4 * n + p % 4)]);
        want += double(v[size_t(row * C + k)]) * w[size_t(n * C + k)];
      }
      wrong += got != want;
    }
  CHECK(wrong == 0);
  for (int c = 0; c < C; ++c) {
    CHECK(packed[size_t(C * C + c)] == scale[size_t(c)]);
    CHECK(packed[size_t(C * C + C + c)] == shift[size_t(c)]);
  }
}

TEST_CASE("kernel geometry: conv_chain_fits takes the chains it is built for",
          "[lowering][shapes]") {
  ConvShape a{16, 32, 160, 160, 64, 3, 3, 80, 80, 2, 2, 1, 1, 1, 1, 1};
  ConvShape b{16, 64, 80, 80, 64, 1, 1, 80, 80, 1, 1, 0, 0, 1, 1, 1};
  const ConvTiles t{128, 64, 72, 3, 1, true};
  CHECK(conv_chain_fits(a, t, b));
  CHECK(conv_chain_fits(a, ConvTiles{64, 64, 72, 3, 1, true}, b));
  CHECK_FALSE(conv_chain_fits(a, ConvTiles{256, 64, 72, 3, 1, true}, b));   // not built
  CHECK_FALSE(conv_chain_fits(a, ConvTiles{64, 64, 72, 3, 2, true}, b));    // split
  CHECK_FALSE(conv_chain_fits(a, ConvTiles{128, 64, 72, 3, 1, false}, b));  // mma.sync
  CHECK_FALSE(conv_chain_fits(a, ConvTiles{128, 32, 72, 3, 1, true}, b));   // half the channels
  ConvShape other = b;
  other.h = other.ho = 79;
  CHECK_FALSE(conv_chain_fits(a, t, other));  // not its output plane
  other = b;
  other.stride_h = other.stride_w = 2;
  other.ho = other.wo = 40;
  CHECK_FALSE(conv_chain_fits(a, t, other));
  other = b;
  other.k = 32;
  CHECK_FALSE(conv_chain_fits(a, t, other));
  other = b;
  other.pad_t = 1;
  other.ho = 82;
  CHECK_FALSE(conv_chain_fits(a, t, other));
}

TEST_CASE("kernel geometry: conv_pair_fits takes the stem pairs it is built for",
          "[lowering][shapes]") {
  const auto conv = [](int64_t c, int64_t hw, int64_t k, int64_t stride) {
    ConvShape s{2, c, hw, hw, k, 3, 3, 0, 0, stride, stride, 1, 1, 1, 1, 1};
    s.ho = s.wo = (hw + 2 - 3) / stride + 1;
    return s;
  };
  CHECK(conv_pair_fits(conv(3, 64, 16, 2), conv(16, 32, 32, 2)));
  CHECK(conv_pair_fits(conv(1, 64, 8, 2), conv(8, 32, 13, 2)));
  CHECK_FALSE(conv_pair_fits(conv(3, 64, 16, 2), conv(16, 33, 32, 2)));  // not its output plane
  CHECK_FALSE(conv_pair_fits(conv(3, 64, 16, 2), conv(12, 32, 32, 2)));  // not its channels
  CHECK_FALSE(conv_pair_fits(conv(3, 64, 16, 1), conv(16, 64, 32, 2)));  // stride 1 first
  ConvShape dilated = conv(16, 32, 32, 2);
  dilated.dil_h = 2;
  CHECK_FALSE(conv_pair_fits(conv(3, 64, 16, 2), dilated));
  ConvShape negative = conv(16, 32, 32, 2);
  negative.pad_l = -1;
  CHECK_FALSE(conv_pair_fits(conv(3, 64, 16, 2), negative));
}

// The kernels' multiply-shift division (shapes.h) on the host, against `/`: every divisor up to
// 4096 and large ones, numerators near 0, near multiples of the divisor and near 2^31.
TEST_CASE("lowering: nearest resizes by integer factors run the upsample_nearest kernel",
          "[lowering][resize]") {
  // resize_nearest_factor checks every output index against o / f: ONNX's "asymmetric" with
  // floor (PyTorch's nearest), half_pixel with either rounding at x2 and x3 read that way;
  // asymmetric with ceil reads o / f rounded up, not a factor; linear never upsamples.
  const auto mode = [](ResizeCoord c, NearestMode n, bool linear = false) {
    ResizeMode m;
    m.coord = c, m.nearest = n, m.linear = linear;
    return m;
  };
  using C = ResizeCoord;
  using N = NearestMode;
  CHECK(resize_nearest_factor(mode(C::Asymmetric, N::Floor), 64, 128) == 2);
  CHECK(resize_nearest_factor(mode(C::Asymmetric, N::Floor), 13, 39) == 3);
  CHECK(resize_nearest_factor(mode(C::HalfPixel, N::RoundPreferFloor), 40, 80) == 2);
  CHECK(resize_nearest_factor(mode(C::HalfPixel, N::RoundPreferCeil), 15, 45) == 3);
  CHECK(resize_nearest_factor(mode(C::Asymmetric, N::Floor), 7, 7) == 1);
  CHECK(resize_nearest_factor(mode(C::Asymmetric, N::Ceil), 64, 128) == 0);
  CHECK(resize_nearest_factor(mode(C::AlignCorners, N::Floor), 64, 128) == 0);
  CHECK(resize_nearest_factor(mode(C::Asymmetric, N::Floor), 64, 96) == 0);  // 1.5x
  CHECK(resize_nearest_factor(mode(C::Asymmetric, N::Floor), 64, 32) == 0);  // down
  CHECK(resize_nearest_factor(mode(C::Asymmetric, N::Floor, true), 64, 128) == 0);
  // Where it holds on both axes, explain names the kernel.
  LowerOptions cuda;
  cuda.device = Device::CUDA;
  for (const auto& [coord, nearest, sizes, want] :
       std::vector<std::tuple<std::string, std::string, std::vector<int64_t>, std::string>>{
           {"asymmetric", "floor", {2, 8, 32, 48}, "nearest by 2x3, input o / factor"},
           {"asymmetric", "ceil", {2, 8, 32, 48}, "one kernel"},
           {"asymmetric", "floor", {2, 8, 32, 20}, "one kernel"}}) {
    Builder b(3);
    b.output(b.resize(b.input("x", {2, 8, 16, 16}), sizes, "nearest", coord, nearest, "up"));
    const Plan p = lower(b.build(), cuda);
    INFO(coord << ", " << nearest << " to " << shape_str(sizes));
    CHECK(p.nodes[0].kernel == "resize");
    CHECK_THAT(p.nodes[0].rule, Catch::Contains(want));
  }
}

TEST_CASE("kernel geometry: fast_div equals integer division below 2^31", "[lowering][shapes]") {
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (uint32_t d :
       {6400u, 25600u, 65535u, 65536u, 65537u, 1000003u, (1u << 30) - 1, 1u << 30, (1u << 31) - 1})
    divisors.push_back(d);
  const int64_t top = (int64_t(1) << 31) - 1;
  int64_t checked = 0, wrong = 0;
  for (uint32_t d : divisors) {
    const FastDiv f = make_fastdiv(d);
    const auto check = [&](int64_t n) {
      if (n < 0 || n > top) return;
      ++checked;
      if (fast_div(int(n), f) != int(n / d)) {
        ++wrong;
        if (wrong <= 5) FAIL_CHECK("fast_div(" << n << ", " << d << ") = " << fast_div(int(n), f));
      }
    };
    for (int64_t n = 0; n < 3 * int64_t(d) && n < 20000; ++n) check(n);
    for (int64_t k : {int64_t(7), int64_t(1000), top / d - 1, top / d})
      for (int64_t e = -1; e <= 1; ++e) check(k * d + e);
    for (int64_t n = top - 64; n <= top; ++n) check(n);
  }
  CHECK(checked > 4000000);
  CHECK(wrong == 0);
}

TEST_CASE("lowering: DenseNet's batchnorm -> relu folds into the 1x1 conv that reads it (prologue)",
          "[lowering]") {
  LowerOptions cuda;
  cuda.device = Device::CUDA;
  // Layers large enough for the wgmma direct kernel's tiles (m >= 64) on the 1x1s; the first
  // reads 32 channels, too few for its tensor copies, the others 64 and 96.
  Graph g = test::dense_block(/*batch=*/8, /*c0=*/32, /*growth=*/32, /*layers=*/3, /*size=*/32,
                              /*bottleneck=*/128);
  optimize(g);
  const Plan p = lower(g, cuda);
  const std::vector<bool> mask = in_place_mask(p);
  const std::string text = explain(p, mask);
  INFO(text);
  const UseIndex uses(p.graph);
  int folds = 0;
  for (size_t i = 0; i < p.graph.nodes.size(); ++i) {
    const Node& n = p.graph.nodes[i];
    if (!p.nodes[i].pro) continue;
    ++folds;
    const int e = uses.producer(n.inputs[0]);
    REQUIRE(e >= 0);
    const Node& ew = p.graph.nodes[size_t(e)];
    CHECK(ew.op == OpKind::FusedElementwise);
    CHECK(p.nodes[i].pro->node == ew.name);
    CHECK(p.nodes[size_t(e)].folded_into == n.name);
    CHECK(p.nodes[i].pro->act == Activation::Relu);
    CHECK(p.nodes[i].pro->scale > 0);
    CHECK(p.nodes[i].pro->shift > 0);
    CHECK(mask[size_t(e)]);
    CHECK(conv_shape(p.graph, n).r == 1);
  }
  CHECK(folds == 3);  // each layer's 1x1; the 3x3s read their 1x1's output, the block's end none
  CHECK_THAT(text, Catch::Contains("applies it to the values it loads (a prologue)") &&
                       Catch::Contains("applies relu1 (scale, shift, relu) to cat1 as it loads") &&
                       Catch::Contains("wgmma pro ") && Catch::Contains("wgmma tma pro "));
  // Its output is never made: no block of the memory plan holds it.
  const InPlacePlan ip = plan_in_place(p);
  const MemoryPlan mp = plan_memory(p, ip, true);
  for (size_t i = 0; i < p.graph.nodes.size(); ++i)
    if (p.nodes[i].pro) {
      const std::string& made = p.graph.nodes[size_t(uses.producer(p.graph.nodes[i].inputs[0]))]
                                    .outputs[0];
      CHECK(mp.blocks.count(made) == 0);
    }

  // On by default, and through compile() unless EPILOG_DISABLE_PROLOGUE=1. Off when asked, on
  // the CPU, under a forced kernel, without wgmma; with copy avoidance off the executor runs the
  // elementwise.
  CHECK(LowerOptions{}.prologue);
  CHECK(CompileOptions{}.with_env().prologue);
  ::setenv("EPILOG_DISABLE_PROLOGUE", "1", 1);
  const CompileOptions from_env = CompileOptions{}.with_env();
  ::unsetenv("EPILOG_DISABLE_PROLOGUE");
  CHECK_FALSE(from_env.prologue);
  LowerOptions off = cuda, cpu, forced = cuda, sync = cuda;
  off.prologue = false;
  cpu.prologue = true;
  forced.force = ConvKernel::Gemm;
  sync.profile.wgmma = false;
  for (const LowerOptions& o : {off, cpu, forced, sync}) {
    const Plan q = lower(g, o);
    for (const NodePlan& np : q.nodes) CHECK_FALSE(np.pro);
  }
  Plan copies = p;
  copies.in_place = false;
  CHECK_THAT(explain(copies, in_place_mask(copies)), !Catch::Contains("prologue"));

  // Refused: the elementwise read twice, a graph output, an activation other than relu, an
  // operand that is not per channel, a 3x3 conv reading it.
  const auto folded = [&](Graph h) {
    optimize(h);
    const Plan q = lower(h, cuda);
    return std::any_of(q.nodes.begin(), q.nodes.end(), [](const NodePlan& np) {
      return np.pro.has_value();
    });
  };
  const auto graph = [](int variant) {
    Builder b(5);
    Val x = b.input("x", {8, 64, 32, 32});
    Val t = b.batchnorm(x, "bn");
    t = variant == 2 ? b.silu(t, "act") : b.relu(t, "act");
    if (variant == 3) t = b.add(t, b.input("full", {8, 64, 32, 32}), "plus");
    const Val y = b.conv2d(t, "conv", ConvOpts(64, variant == 4 ? 3 : 1).padding(variant == 4));
    b.output(y);
    if (variant == 1) b.output(t);
    return b.build();
  };
  CHECK(folded(graph(0)));
  CHECK_FALSE(folded(graph(1)));  // a graph output (and read twice)
  CHECK_FALSE(folded(graph(2)));  // silu
  CHECK_FALSE(folded(graph(3)));  // adds a full tensor
  CHECK_FALSE(folded(graph(4)));  // a 3x3 conv
}
