// Lowering: a kernel for every node on the target device. For fused_conv2d on CUDA the choice
// between the scalar, tiled and gemm kernels is made by select_conv_kernel (the thresholds
// live there, each with the measurement that chose it) and the tile sizes by conv_tiles.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "epilog/graph/conv_kernel.h"
#include "epilog/runtime/plan.h"

namespace epilog {

// The card the thresholds were measured on (NVIDIA H200, 132 SMs): the profile `explain` uses
// on a machine without a GPU.
DeviceProfile h200_profile();

std::optional<ConvKernel> parse_conv_kernel(const std::string& name);

struct ConvChoice {
  ConvKernel kernel;
  std::string rule;
};

// Ordered predicates ending in the generic kernel. Pure: same shape and profile, same answer.
ConvChoice select_conv_kernel(const ConvShape& shape, const DeviceProfile& device);

// Tile sizes for a kernel on a layer: the largest tile whose grid still fills about two waves
// of the SMs, smaller tiles for small layers. Pure. tensor_copies false: the tiles for gemm's
// 1x1 direct kernel copying A by cp.async where it would take tensor copies (a conv that reads
// channels through an upsampling loads them so).
ConvTiles conv_tiles(ConvKernel kernel, const ConvShape& shape, const DeviceProfile& device,
                     bool tensor_copies = true);

// Every tile combination a kernel is compiled for (the headers of conv_tiled.cu and
// conv_gemm.cu) that can run on `device` (the wgmma tiles only where device.wgmma): what the GPU
// tests run each kernel with and what `conv_bench --sweep` times.
std::vector<ConvTiles> conv_built_tiles(ConvKernel kernel, const DeviceProfile& device);

struct LowerOptions {
  Device device = Device::CPU;
  DeviceProfile profile = h200_profile();
  std::optional<ConvKernel> force;  // tests and benchmarks: one kernel for every fused conv
  // Fold per-channel input transforms into the 1x1 convs that read them (FoldedPrologue).
  bool prologue = true;
};

Plan lower(Graph graph, const LowerOptions& options);

// The kernel and the rule that chose it for node i; none where `in_place[i]`: the splits that
// return views, the concats whose inputs are made in their buffer and the upsamplings folded
// into a conv's loads (plan_in_place, which the executor follows unless in-place is off). A
// conv's rule names the upsampling it reads through while that one is folded. `tiles`: for the
// kernels with a choice among kernels to make at launch (the convs, max-pooling, linear), the
// launch it makes, in the words the CUDA launchers log it (launch.h, runtime/launch_log.h): on
// the operands as the executor lays them out (value_places; an empty `in_place` is copy
// avoidance off), a graph input assumed 16-byte aligned. What runs is what this says.
struct NodeChoice {
  std::string kernel, rule;
  std::string tiles = {};
};
std::vector<NodeChoice> node_choices(const Plan& plan, const std::vector<bool>& in_place);

// A table: node, op, shapes, kernel, tiles, the rule that chose it (node_choices).
std::string explain(const Plan& plan, const std::vector<bool>& in_place = {});

}  // namespace epilog
