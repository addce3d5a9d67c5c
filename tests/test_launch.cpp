// What runs is what explain says, the part that needs no GPU: the launch choices of launch.h (the
// fallbacks the CUDA launchers used to make on their own, now that function's answer), the
// layout explain reads x's alignment and stride from (value_places), the log the launchers
// write, and that the graphs of gpu/test_gpu_launch.cpp make explain name every kernel the
// launchers choose among.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "epilog/graph/lowering.h"
#include "epilog/io/builder.h"
#include "epilog/kernels/launch.h"
#include "epilog/runtime/executor.h"
#include "epilog/runtime/launch_log.h"
#include "launch_graphs.h"

using namespace epilog;

namespace {

// A square conv of n images: c -> k channels, an r x r window, stride, padding, dilation, groups.
ConvShape conv(int64_t n, int64_t c, int64_t hw, int64_t k, int64_t r, int64_t stride, int64_t pad,
               int64_t dil = 1, int64_t groups = 1) {
  const int64_t o = (hw + 2 * pad - dil * (r - 1) - 1) / stride + 1;
  return ConvShape{n, c, hw, hw, k, r, r, o, o, stride, stride, pad, pad, dil, dil, groups};
}

std::string gemm(const ConvShape& s, const ConvTiles& t, const ConvOperands& o = {}) {
  return gemm_launch_str(conv_gemm_launch(s, t, o));
}

ConvOperands misaligned() {
  ConvOperands o;
  o.x_aligned = false;
  return o;
}

}  // namespace

TEST_CASE("launch: the gemm kernel, stages and splits that conv_gemm runs for tiles on a shape",
          "[launch]") {
  // The wgmma halo kernel: no more stages than 8-channel stages of the reduction where unsplit,
  // at least 3 split; splits halved until each keeps a stage; wide rows where x's rows are
  // 16-byte aligned on one-square tiles of 32 or more channels without a residual between 17
  // and 63 (register A).
  const ConvShape c16 = conv(1, 16, 40, 64, 3, 1, 1);
  CHECK(gemm(c16, {128, 64, 72, 3, 1, true}) == "halo m=128 n=64 k=72 stages=2 wgmma");
  CHECK(gemm(c16, {64, 32, 72, 4, 8, true}) == "halo m=64 n=32 k=72 stages=4 splits=2 wgmma wide");
  CHECK(gemm(c16, {64, 32, 72, 4, 8, true}, misaligned()) ==
        "halo m=64 n=32 k=72 stages=4 splits=2 wgmma");
  ConvOperands residual;
  residual.residual = true;
  const ConvShape c64 = conv(1, 64, 80, 32, 3, 1, 1);
  CHECK(gemm(c64, {64, 32, 72, 3, 1, true}) == "halo m=64 n=32 k=72 stages=3 wgmma wide");
  CHECK(gemm(c64, {64, 32, 72, 3, 1, true}, residual) == "halo m=64 n=32 k=72 stages=3 wgmma");
  // The persistent kernel where x's rows are 16-byte aligned, else its tiles as they are.
  const ConvShape c32 = conv(1, 32, 80, 32, 3, 1, 1);
  const ConvTiles persistent{64, 32, 72, 3, 1, true, true};
  CHECK(gemm(c32, persistent) == "halo m=64 n=32 k=72 wgmma persistent");
  CHECK(gemm(c32, persistent, misaligned()) == "halo m=64 n=32 k=72 stages=3 wgmma");
  ConvShape strided = c32;
  strided.x_stride = 32 * 80 * 80 + 2;  // a part of a batch whose images are not 4-float aligned
  CHECK(gemm(strided, persistent) == "halo m=64 n=32 k=72 stages=3 wgmma");
  // The mma.sync halo kernel: at most the reduction's stages + 1, and what shared memory holds.
  CHECK(gemm(conv(1, 8, 40, 32, 3, 1, 1), {256, 32, 72, 3}) == "halo m=256 n=32 k=72 stages=2");
  CHECK(halo_mma_max_stages(256, 128, 2) == 3);
  CHECK(halo_mma_max_stages(256, 128, 1) == 4);
  CHECK(halo_mma_max_stages(64, 32, 2) == 4);

  // Halo tiles on a 1x1 shape: the k = 32 kernels at the same n (at least 32) and m at most
  // 128, on mma.sync (no wgmma kernel takes k = 72 there): the direct kernel.
  const ConvShape pw = conv(1, 64, 20, 16, 1, 1, 0);
  CHECK(gemm(pw, {256, 16, 72, 3, 1, true}) == "direct m=128 n=32 k=32 stages=3");
  // Stem tiles on a shape the stem kernel does not take: the gather kernel at 128x32, 2 stages.
  CHECK(gemm(conv(1, 8, 20, 16, 3, 1, 1), {256, 16, kGemmStemK, 0}) ==
        "gather m=128 n=32 k=32 stages=2");
  CHECK(gemm(conv(1, 3, 256, 16, 3, 2, 1), {512, 16, kGemmStemK, 0}) == "stem m=512 n=16 k=36");
  // The wgmma direct kernel: by tensor copies; on a misaligned x the same tiles gathering A;
  // reading channels through an upsampling, by cp.async.
  const ConvShape wide1x1 = conv(1, 64, 96, 64, 1, 1, 0);
  const ConvTiles direct{64, 64, 32, 3, 1, true};
  CHECK(gemm(wide1x1, direct) == "direct m=64 n=64 k=32 stages=3 wgmma tma");
  CHECK(gemm(wide1x1, direct, misaligned()) == "gather m=64 n=64 k=32 stages=3 wgmma");
  ConvOperands up;
  up.up = true;
  CHECK(gemm(wide1x1, direct, up) == "direct m=64 n=64 k=32 stages=3 wgmma up");
  // mma.sync: splits halved until each keeps a k tile, the gather kernel's stages to its k tiles
  // + 1; the direct kernel takes no splits, so split tiles on a 1x1 shape gather.
  CHECK(gemm(conv(1, 16, 20, 32, 3, 1, 1), {64, 32, 32, 4, 8}) ==
        "gather m=64 n=32 k=32 stages=3 splits=4");
  CHECK(gemm(conv(1, 64, 20, 32, 1, 1, 0), {64, 32, 32, 3, 2}) ==
        "gather m=64 n=32 k=32 stages=2 splits=2");
  CHECK(gemm(conv(1, 64, 20, 32, 1, 1, 0), {64, 32, 32, 3}) == "direct m=64 n=32 k=32 stages=3");
}

TEST_CASE("launch: scalar's paths, linear's, matmul's and max-pooling's kernels", "[launch]") {
  const ConvShape stem = conv(1, 3, 64, 16, 3, 2, 1);
  CHECK(conv_scalar_path(stem, true) == ScalarPath::Stem);
  CHECK(scalar_launch_str(ScalarPath::Stem, stem) == "stem m=1024 n=16");
  const ConvShape dw = conv(1, 32, 40, 32, 3, 1, 1, 1, 32);
  CHECK(conv_scalar_path(dw, true) == ScalarPath::Depthwise);
  CHECK(conv_scalar_path(dw, false) == ScalarPath::Depthwise);
  // A window whose one output row stages more than kDwMaxSmem: the general kernel.
  const ConvShape dilated = conv(1, 8, 600, 8, 3, 1, 200, 200, 8);
  CHECK(conv_scalar_path(dilated, true) == ScalarPath::General);
  CHECK(scalar_launch_str(ScalarPath::General, dilated) == "general m=256 n=1");
  // Grouped 3x3s up to kGroupedMaxCin channels a group: the stem kernel, a group's channels
  // 16, 8 or 4 at a time, the most that keep kGroupedMinItems thread items; smaller grids, wider
  // groups, other windows and dilations the general kernel.
  const ConvShape regnet = conv(16, 48, 56, 48, 3, 1, 1, 1, 6);  // RegNet's first stage
  CHECK(conv_scalar_path(regnet, true) == ScalarPath::Grouped);
  CHECK(conv_scalar_path(regnet, false) == ScalarPath::Grouped);
  CHECK(conv_scalar_grouped_channels(regnet) == 16);
  CHECK(scalar_launch_str(ScalarPath::Grouped, regnet) == "grouped m=1024 n=8");
  // Its last stage, 7x7: 16 x 7 x 2 items a group, 55 groups, 4 channels a block.
  CHECK(conv_scalar_grouped_channels(conv(16, 440, 7, 440, 3, 1, 1, 1, 55)) == 4);
  const ConvShape wide = conv(8, 64, 32, 128, 3, 1, 1, 1, 2);  // 4096 items x 4 chunks of 16
  CHECK(conv_scalar_grouped_channels(wide) == 16);
  CHECK(scalar_launch_str(ScalarPath::Grouped, wide) == "grouped m=1024 n=16");
  CHECK(conv_scalar_grouped_channels(conv(1, 48, 56, 48, 3, 1, 1, 1, 6)) == 0);  // batch 1
  CHECK(conv_scalar_path(conv(1, 48, 56, 48, 3, 1, 1, 1, 6), true) == ScalarPath::General);
  CHECK(conv_scalar_path(conv(64, 2 * (kGroupedMaxCin + 1), 8, 8, 3, 1, 1, 1, 2), true) ==
        ScalarPath::General);
  CHECK(conv_scalar_path(conv(64, 32, 40, 32, 3, 1, 2, 2, 2), true) == ScalarPath::General);
  CHECK(conv_scalar_path(conv(64, 32, 40, 32, 5, 1, 2, 1, 2), true) == ScalarPath::General);

  CHECK(std::string(linear_launch_str(kGemvRows)) == "gemv");
  CHECK(std::string(linear_launch_str(kGemvRows + 1)) == "tiled");
  // matmul: TF32 from an mma's depth and width (k, n >= 8) on, whatever m.
  CHECK(matmul_runs_tf32(8, 8));
  CHECK(matmul_runs_tf32(196, 64));
  CHECK_FALSE(matmul_runs_tf32(7, 196));
  CHECK_FALSE(matmul_runs_tf32(196, 7));
  CHECK_FALSE(matmul_runs_tf32(1, 1000));
  CHECK(matmul_launch_str(196, 64) == "tf32 m=64 n=64 k=32 stages=2");
  CHECK(matmul_launch_str(1, 64) == "simt m=64 n=64 k=16");
  CHECK(maxpool_launch_str(MaxPoolKernel::Same, 3) == "same chain=3");
  CHECK(maxpool_launch_str(MaxPoolKernel::Window) == "window");
}

TEST_CASE("launch: value_places puts split parts and concat slots where the executor does",
          "[launch]") {
  for (const int64_t batch : {int64_t(1), int64_t(2)}) {
    Builder b(1);
    Val x = b.input("x", {batch, 8, 6, 6});
    const std::vector<Val> parts = b.split(b.conv2d(x, "c1", ConvOpts(16, 1)), 1, {3, 13}, "cut");
    Val a = b.conv2d(parts[1], "a", ConvOpts(4, 3).padding(1));
    Val c = b.conv2d(parts[0], "c", ConvOpts(4, 1));
    b.output(b.conv2d(b.concat({c, a}, 1, "cat"), "out", ConvOpts(8, 1)));
    const Graph g = b.build();
    const InPlacePlan ip = plan_in_place(g);
    const std::map<std::string, ValuePlace> at = value_places(g, ip);
    INFO("batch " << batch);
    // Parts of c1's output (16 channels of 36), then a in cat's buffer after c (8 of 36).
    const int64_t c1 = batch > 1 ? 16 * 36 : 0, cat = batch > 1 ? 8 * 36 : 0;
    CHECK(at.at(parts[0].name).offset == 0);
    CHECK(at.at(parts[0].name).item_stride == c1);
    CHECK(at.at(parts[1].name).offset == 3 * 36);
    CHECK(at.at(parts[1].name).item_stride == c1);
    CHECK(at.at(c.name).offset == 0);
    CHECK(at.at(c.name).item_stride == cat);
    CHECK(at.at(a.name).offset == 4 * 36);
    CHECK(at.at(a.name).item_stride == cat);
    CHECK(at.count(x.name) == 0);  // its own allocation: {0, 0}
    // Copy avoidance off: every value its own.
    CHECK(value_places(g, InPlacePlan{}).empty());
  }
}

TEST_CASE("launch: explain tells a misaligned view's gemm launch from a copy's", "[launch]") {
  for (const test::LaunchCase& c : test::launch_cases()) {
    if (c.name.rfind("gemm on a misaligned view", 0) != 0) continue;
    const Plan p = test::launch_plan(c, h200_profile());
    const std::vector<NodeChoice> choices = node_choices(p, in_place_mask(p));
    const Node* odd = p.graph.find_node("odd");
    REQUIRE(odd);
    const NodeChoice& choice = choices[size_t(odd - p.graph.nodes.data())];
    INFO(c.name << "\n" << explain(p, in_place_mask(p)));
    CHECK(choice.kernel == "gemm");
    CHECK(choice.tiles ==
          (c.in_place ? "gather m=32 n=32 k=32 stages=2" : "direct m=32 n=32 k=32 stages=4"));
  }
}

TEST_CASE("launch: the log collects a thread's launches while installed", "[launch]") {
  CHECK(LaunchLog::current() == nullptr);
  log_launch("gemm", [] { return "never asked"; });  // no log: nothing runs
  {
    LaunchLog outer;
    CHECK(LaunchLog::current() == &outer);
    outer.set_node("n1");
    log_launch("gemm", [] { return "halo m=64 n=32 k=72 stages=3 wgmma"; });
    {
      LaunchLog inner;
      inner.set_node("n2");
      log_launch("tiled", [] { return "m=64 n=32 k=8"; });
      REQUIRE(inner.records().size() == 1);
      CHECK(inner.records()[0].node == "n2");
    }
    CHECK(LaunchLog::current() == &outer);
    REQUIRE(outer.records().size() == 1);
    CHECK(outer.records()[0].node == "n1");
    CHECK(outer.records()[0].kernel == "gemm");
    CHECK(outer.records()[0].tiles == "halo m=64 n=32 k=72 stages=3 wgmma");
  }
  CHECK(LaunchLog::current() == nullptr);
}

TEST_CASE("launch: the GPU test's graphs make explain name every kernel the launchers choose among",
          "[launch]") {
  // On the default profile (an H200) with the wgmma kernels and without: every conv, max-pool and
  // linear layer that runs gets a launch, and together they cover the families.
  for (const bool wgmma : {true, false}) {
    DeviceProfile profile = h200_profile();
    profile.wgmma = wgmma;
    std::set<std::string> covered;
    for (const test::LaunchCase& c : test::launch_cases()) {
      const Plan p = test::launch_plan(c, profile);
      const std::vector<bool> mask = in_place_mask(p);
      const std::vector<NodeChoice> choices = node_choices(p, mask);
      INFO(c.name << (wgmma ? ", wgmma" : ", mma.sync") << "\n" << explain(p, mask));
      for (size_t i = 0; i < choices.size(); ++i) {
        INFO("node " << p.graph.nodes[i].name);
        CHECK(test::has_launch_choice(p, choices[i], i) == !choices[i].tiles.empty());
        if (!choices[i].tiles.empty())
          covered.insert(test::launch_family(choices[i].kernel, choices[i].tiles));
      }
    }
    std::string all;
    for (const std::string& f : covered) all += "\n  " + f;
    INFO((wgmma ? "with wgmma" : "without wgmma") << ", covered:" << all);
    for (const std::string& f : test::launch_families(wgmma, true)) {
      INFO("family " << f);
      CHECK(covered.count(f) == 1);
    }
  }
}
