// A lowered graph: the graph plus, for every node, the kernel that runs it on the target.
#pragma once

#include <string>
#include <vector>

#include "epilog/graph/graph.h"
#include "epilog/kernels/shapes.h"

namespace epilog {

// What the kernel selector needs to know of the GPU.
struct DeviceProfile {
  std::string name;
  int sm_count = 0;
  bool detected = false;  // read off a device, not a default
  int cc_major = 9;       // compute capability: split-K's thread-block clusters need 9 (Hopper)
  bool wgmma = true;      // Hopper's warpgroup MMA: compute capability 9.0 and sm_90a code built
};

struct NodePlan {
  std::string kernel;  // "scalar", "tiled", "gemm" for fused_conv2d on CUDA; else the op's
  std::string rule;    // why this kernel (the selector's rule, or the override)
  ConvKernel conv = ConvKernel::Scalar;
  ConvTiles tiles;
  Tensor packed;  // tiles.wgmma: the weights as pack_wgmma_weights lays them out
};

struct Plan {
  Graph graph;
  Device device = Device::CPU;
  std::vector<NodePlan> nodes;  // parallel to graph.nodes
  bool in_place = true;         // the executor starts with its copy avoidance on or off
};

}  // namespace epilog
