// Graphs whose lowerings for CUDA, together, pick every kernel the launchers choose among (the
// conv kernels and gemm's variants, max-pooling's kernels, linear's, matmul's), for the tests that check
// that what runs is what explain says: test_launch.cpp checks that explain names them all (no
// GPU needed), gpu/test_gpu_launch.cpp that each node launches what explain names.
#pragma once

#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "epilog/graph/lowering.h"
#include "epilog/graph/passes.h"
#include "epilog/io/builder.h"
#include "epilog/runtime/executor.h"
#include "test_graphs.h"

namespace epilog::test {

struct LaunchCase {
  std::string name;
  Graph graph;  // as built: launch_plan optimizes it
  std::optional<ConvKernel> force;
  bool fuse = true;
  bool in_place = true;  // the executor's copy avoidance
};

// conv -> batchnorm -> SiLU.
inline Val conv_bn_silu(Builder& b, Val x, const std::string& name, const ConvOpts& opts) {
  return b.silu(b.batchnorm(b.conv2d(x, name, opts), name + ".bn"), name + ".act");
}

// One conv -> batchnorm -> SiLU on input `shape`.
inline LaunchCase one_conv(const std::string& name, const Shape& shape, const ConvOpts& opts) {
  Builder b(/*seed=*/21);
  b.output(conv_bn_silu(b, b.input("x", shape), "conv", opts));
  return {name, b.build(), std::nullopt};
}

inline std::vector<LaunchCase> launch_cases() {
  std::vector<LaunchCase> cases;
  // gemm's stem kernel, then a 1x1 into 16 channels: under kDirectWgmmaMinCout, the mma.sync
  // direct kernel.
  {
    Builder b(1);
    Val x = conv_bn_silu(b, b.input("x", {1, 3, 256, 256}), "stem",
                         ConvOpts(16, 3).stride(2).padding(1));
    b.output(conv_bn_silu(b, x, "pw", ConvOpts(16, 1)));
    cases.push_back({"stem, then a narrow 1x1", b.build(), std::nullopt});
  }
  // A stem folded into the stride-2 conv that reads it (the conv pair, wgmma only).
  {
    Builder b(2);
    Val x = conv_bn_silu(b, b.input("x", {2, 3, 96, 128}), "stem",
                         ConvOpts(16, 3).stride(2).padding(1));
    x = conv_bn_silu(b, x, "down", ConvOpts(32, 3).stride(2).padding(1));
    b.output(conv_bn_silu(b, x, "head", ConvOpts(24, 1)));
    cases.push_back({"conv pair", b.build(), std::nullopt});
  }
  // Strides that differ: scalar's stem path; depthwise and grouped convs: scalar's depthwise
  // and grouped paths, and a dilated grouped conv its general kernel; a linear layer as a 1x1
  // conv over a 1x1 plane at batch 2: gemv; a shallow reduction: tiled.
  cases.push_back(
      one_conv("scalar stem", {4, 3, 256, 256}, ConvOpts(16, 3).stride(2, 1).padding(1)));
  {
    Builder b(3);
    Val x =
        conv_bn_silu(b, b.input("x", {8, 32, 64, 64}), "dw", ConvOpts(32, 3).padding(1).groups(32));
    x = conv_bn_silu(b, x, "grouped", ConvOpts(32, 3).padding(1).groups(2));
    b.output(conv_bn_silu(b, x, "dilated", ConvOpts(32, 3).padding(2).dilation(2).groups(4)));
    Val v = b.input("v", {2, 64, 1, 1});
    b.output(conv_bn_silu(b, v, "fc", ConvOpts(32, 1)));
    cases.push_back({"scalar and gemv", b.build(), std::nullopt});
  }
  {
    Builder b(4);
    b.output(conv_bn_silu(b, b.input("x", {2, 8, 20, 20}), "narrow", ConvOpts(16, 1)));
    cases.push_back({"tiled", b.build(), std::nullopt});
  }
  // The 3x3 halo kernel: 4-square tiles (wgmma; mma.sync without it), one-square tiles in wide
  // rows, the persistent kernel, split-K over a deep reduction on a small grid.
  cases.push_back(one_conv("halo, large plane", {1, 64, 160, 160}, ConvOpts(64, 3).padding(1)));
  cases.push_back(one_conv("halo, one-square tiles", {1, 64, 80, 80}, ConvOpts(64, 3).padding(1)));
  cases.push_back(one_conv("halo, persistent", {1, 32, 80, 80}, ConvOpts(32, 3).padding(1)));
  cases.push_back(one_conv("halo, split", {1, 256, 20, 20}, ConvOpts(64, 3).padding(1)));
  // The k = 32 kernels gathering their A tiles: mma.sync split-K on a small grid, wgmma, wgmma
  // split.
  cases.push_back(
      one_conv("gather, split", {1, 256, 20, 20}, ConvOpts(64, 3).stride(2).padding(1)));
  cases.push_back(one_conv("gather, wgmma", {1, 64, 96, 96}, ConvOpts(64, 5).padding(2)));
  cases.push_back(one_conv("gather, wgmma split", {1, 64, 80, 80}, ConvOpts(64, 5).padding(2)));
  // The 1x1 direct kernel on wgmma: by tensor copies (64 input channels), by cp.async (32), and
  // reading channels through a folded upsampling.
  cases.push_back(one_conv("direct, tensor copies", {1, 64, 96, 96}, ConvOpts(64, 1)));
  cases.push_back(one_conv("direct, cp.async", {1, 32, 96, 96}, ConvOpts(64, 1)));
  cases.push_back({"direct, upsampled", join_graph(true), std::nullopt});
  // A 3x3 stride-2 conv with the 1x1 that alone reads it on its accumulators (the conv chain).
  {
    Builder b(5);
    Val x = conv_bn_silu(b, b.input("x", {2, 24, 150, 198}), "down",
                         ConvOpts(64, 3).stride(2).padding(1));
    x = conv_bn_silu(b, x, "cv1", ConvOpts(64, 1));
    b.output(conv_bn_silu(b, x, "head", ConvOpts(24, 3).padding(1)));
    cases.push_back({"conv chain", b.build(), std::nullopt});
  }
  // Max-pooling: SPPF's cascade as one kernel, the "same" window alone, a window over a plane
  // that fits shared memory, one over a plane that does not.
  {
    Builder b(6);
    Val x = b.conv2d(b.input("x", {2, 8, 20, 20}), "conv", ConvOpts(24, 1));
    const PoolOpts five = PoolOpts(5).stride(1).padding(2);
    Val p1 = b.maxpool2d(x, five, "p1");
    Val p2 = b.maxpool2d(p1, five, "p2");
    Val p3 = b.maxpool2d(p2, five, "p3");
    b.output(b.concat({x, p1, p2, p3}, 1, "cat"));
    b.output(b.maxpool2d(b.input("y", {1, 8, 20, 20}), five, "same"));
    b.output(b.maxpool2d(b.input("z", {1, 8, 20, 20}), PoolOpts(2), "plane"));
    b.output(
        b.maxpool2d(b.input("w", {1, 8, 100, 130}), PoolOpts(3).stride(1).padding(1), "window"));
    cases.push_back({"max-pools", b.build(), std::nullopt});
  }
  // linear unfused: the gemv kernel for a few rows, the tiled one for more.
  {
    Builder b(7);
    b.output(b.linear(b.input("few", {4, 32}), "fc_few", 16));
    b.output(b.linear(b.input("many", {40, 32}), "fc_many", 16));
    cases.push_back({"linear", b.build(), std::nullopt, /*fuse=*/false});
  }
  // matmul: TF32 tiles for a product an mma deep and wide (attention's q @ k^T, batched, a
  // partial tile), the SIMT tiles for a GEMV-like one (n = 1) and a shallow one (k = 3).
  {
    Builder b(9);
    b.output(b.matmul(b.input("q", {2, 3, 50, 16}), b.input("kt", {2, 3, 16, 50}), "qk"));
    b.output(b.matmul(b.input("m", {2, 40, 24}), b.input("v", {24, 1}), "mv"));
    b.output(b.matmul(b.input("s", {40, 3}), b.input("w", {3, 20}), "shallow"));
    cases.push_back({"matmul", b.build(), std::nullopt});
  }
  // x a view 2 floats into its input (a split along the width of a 1-row plane): not 16-byte
  // aligned, gemm forced runs its 1x1 on the gather kernel, not the direct one; copied, direct.
  {
    Builder b(8);
    const std::vector<Val> parts = b.split(b.input("x", {1, 1, 1, 40}), 3, {2, 32, 6}, "cut");
    b.output(parts[0]);
    b.output(b.conv2d(parts[1], "odd", ConvOpts(32, 1)));
    b.output(parts[2]);
    Graph g = b.build();
    cases.push_back({"gemm on a misaligned view", g, ConvKernel::Gemm});
    cases.push_back({"gemm on a misaligned view, copied", g, ConvKernel::Gemm, true, false});
  }
  return cases;
}

// The case's plan on `profile`.
inline Plan launch_plan(const LaunchCase& c, const DeviceProfile& profile) {
  Graph g = c.graph;
  PassOptions po;
  po.fuse = c.fuse;
  optimize(g, po);
  LowerOptions lo;
  lo.device = Device::CUDA;
  lo.profile = profile;
  lo.force = c.force;
  Plan p = lower(std::move(g), lo);
  p.in_place = c.in_place;
  return p;
}

// A launch's family: its kernel and the words of its tiles without the sizes ("splits=4" as
// "split", "chain=3" as "chain"): "gemm halo split wgmma wide", "scalar depthwise", "tiled".
inline std::string launch_family(const std::string& kernel, const std::string& tiles) {
  if (kernel == "gemm pair") return kernel;
  std::string family = kernel, word;
  std::istringstream in(tiles);
  while (in >> word) {
    if (word.rfind("splits=", 0) == 0)
      family += " split";
    else if (word.rfind("chain=", 0) == 0)
      family += " chain";
    else if (word.find('=') == std::string::npos)
      family += " " + word;
  }
  return family;
}

// The families launch_cases must cover: on a device with the wgmma kernels, and without them
// (with thread-block clusters, for split-K, where `clusters`).
inline std::set<std::string> launch_families(bool wgmma, bool clusters) {
  std::set<std::string> f = {"scalar stem",
                             "scalar depthwise",
                             "scalar general",
                             "scalar grouped",
                             "tiled",
                             "gemv",
                             "gemm stem",
                             "gemm direct",
                             "gemm gather",
                             "maxpool2d same chain",
                             "maxpool2d same",
                             "maxpool2d plane",
                             "maxpool2d window",
                             "linear gemv",
                             "linear tiled",
                             "matmul tf32",
                             "matmul simt"};
  if (clusters) f.insert("gemm gather split");
  if (wgmma) {
    f.insert({"gemm halo wgmma", "gemm halo wgmma wide", "gemm halo wgmma persistent",
              "gemm halo split wgmma wide", "gemm gather wgmma", "gemm gather split wgmma",
              "gemm direct wgmma", "gemm direct wgmma tma", "gemm direct wgmma up",
              "gemm chain halo wgmma", "gemm pair"});
  } else {
    f.insert("gemm halo");
  }
  return f;
}

// Whether explain must name a launch for node i (node_choices' tiles): a conv, a max-pool or a
// linear layer that runs a kernel of its own, a matmul with outputs.
inline bool has_launch_choice(const Plan& plan, const NodeChoice& choice, size_t i) {
  const OpKind op = plan.graph.nodes[i].op;
  if (op == OpKind::MatMul)  // an empty product launches nothing
    return shape_numel(plan.graph.value(plan.graph.nodes[i].outputs[0]).shape) > 0;
  return (op == OpKind::FusedConv2d || op == OpKind::Conv2d || op == OpKind::MaxPool2d ||
          op == OpKind::Linear) &&
         choice.kernel != "folded" && choice.kernel != "in place";
}

}  // namespace epilog::test
