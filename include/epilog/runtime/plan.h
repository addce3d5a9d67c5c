// A lowered graph: the graph plus, for every node, the kernel that runs it on the target.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "epilog/graph/conv_kernel.h"
#include "epilog/graph/graph.h"
#include "epilog/graph/pointwise.h"

namespace epilog {

// What the kernel selector needs to know of the GPU.
struct DeviceProfile {
  std::string name;
  int sm_count = 0;
  bool detected = false;  // read off a device, not a default
  int cc_major = 9;       // compute capability: split-K's thread-block clusters need 9 (Hopper)
  bool wgmma = true;      // Hopper's warpgroup MMA: compute capability 9.0 and sm_90a code built
};

// An upsample_nearest folded into the loads of the fused_conv2d that reads it through a concat:
// the conv reads its input's channels [c0, c0 + channels) from `source` (the upsampling's input)
// at the source's resolution, so the upsampling writes nothing. Lowering folds where the conv
// runs gemm's wgmma direct kernel (conv_gemm_upsample_fits), the upsampling's only reader is the
// concat and the concat's only reader is the conv, neither being a graph output; the executor
// applies it while that concat runs in place (InPlacePlan::folded).
struct FoldedUpsample {
  std::string node;    // the upsample_nearest
  std::string source;  // its input
  int64_t c0 = 0, channels = 0;
  int64_t scale_h = 1, scale_w = 1;
};

// A fused_conv2d whose work the kernel of a neighbouring one does, so that the first one's
// outputs are never stored. NodePlan::pre, a conv pair (conv_pair_fits): the second conv's
// kernel makes the first one's outputs in shared memory where it would load them.
// NodePlan::post, a conv chain (conv_chain_fits): the first conv's kernel runs the second, a 1x1
// conv, on its accumulators and stores that one's outputs. Lowering folds on CUDA where the
// kernel takes the two shapes and the fusion rules would absorb the first conv (can_absorb: one
// reader, no graph output); the executor applies it while copy avoidance is on, as it does the
// upsamplings.
struct FoldedConv {
  std::string node;  // the other conv: the first of a pair, the second of a chain
  ConvShape shape;   // its shape
  Act act;
};

// A fused_elementwise that only scales, shifts (per input channel) and activates the input of
// the 1x1 conv that alone reads it (DenseNet's batchnorm -> relu before each layer's 1x1): the
// conv's kernel applies it to the values it loads, so the elementwise writes nothing. Lowering
// folds where the conv runs the wgmma direct kernel unsplit and LowerOptions::prologue is on; the
// executor applies it while copy avoidance is on. `scale` and `shift` index the elementwise's
// inputs (-1: none), each a per-channel constant.
struct FoldedPrologue {
  std::string node;  // the fused_elementwise
  int scale = -1, shift = -1;
  Act act;  // relu or none
};

struct NodePlan {
  std::string kernel;  // "scalar", "tiled", "gemm" for fused_conv2d on CUDA; else the op's
  std::string rule;    // why this kernel (the selector's rule, or the override)
  ConvKernel conv = ConvKernel::Scalar;
  ConvTiles tiles;
  Tensor packed;                     // tiles.wgmma: the weights as pack_wgmma_weights lays them out
  std::optional<FoldedUpsample> up;  // fused_conv2d: an upsampling folded into its loads
  std::optional<FoldedConv> pre;     // fused_conv2d: the conv before it, folded into its loads
  // fused_conv2d: the 1x1 conv after it, run on its accumulators; `packed` then ends in that
  // conv's weights, scale and shift (pack_conv_chain).
  std::optional<FoldedConv> post;
  std::optional<FoldedPrologue> pro;  // fused_conv2d: a per-channel transform of its input
  // maxpool2d: the max-pools after it that its kernel computes too (SPPF's cascade: each pools
  // the one before, with the same "same" window; kMaxPoolChain in all at most).
  std::vector<std::string> chain;
  // The node that does this one's work in its place: for an upsample_nearest the fused_conv2d
  // that reads its input, for a folded fused_conv2d the one that reads its output (a pair's
  // first conv) or whose output it reads (a chain's 1x1), for a chained maxpool2d the chain's
  // first pool, for a folded fused_elementwise the conv that applies it (FoldedPrologue).
  std::string folded_into;
};

struct Plan {
  Graph graph;
  Device device = Device::CPU;
  std::vector<NodePlan> nodes;  // parallel to graph.nodes
  bool in_place = true;         // the executor starts with its copy avoidance on or off
  bool share_memory = true;     // and with its activations sharing memory (plan_memory) or not
};

}  // namespace epilog
