// Kernel selection for fused convolutions and the lowering of a graph to a plan.
#include "epilog/graph/lowering.h"

#include <algorithm>

#include "epilog/runtime/params.h"

namespace epilog {

DeviceProfile h200_profile() {
  return {"NVIDIA H200 (default profile)", 132, false};
}

const char* conv_kernel_name(ConvKernel kernel) {
  switch (kernel) {
    case ConvKernel::Scalar:
      return "scalar";
    case ConvKernel::Tiled:
      return "tiled";
    case ConvKernel::Gemm:
      return "gemm";
  }
  return "?";
}

std::optional<ConvKernel> parse_conv_kernel(const std::string& name) {
  for (ConvKernel k : {ConvKernel::Scalar, ConvKernel::Tiled, ConvKernel::Gemm})
    if (name == conv_kernel_name(k)) return k;
  return std::nullopt;
}

// -- the thresholds --
// Each number was chosen by tools/conv_bench on an NVIDIA H200 (2026-11-30, docs/perf.md;
// microseconds per conv -> batchnorm -> silu layer, CUDA-graph replay, median).

// Below this reduction depth (Cin/groups * Kh * Kw) gemm's 32-deep k tiles are mostly zero
// padding: b1_c8_8_1x1_320 (K = 8) tiled 5.8 vs gemm 16.6; b1_c3_16_3x3s2_640 (K = 27) tiled
// 17.0 vs gemm 17.4.
constexpr int64_t kGemmMinReduction = 32;
// From this many output channels up gemm's tensor cores win: b1_c64_24_1x1_80 gemm 4.8 vs
// tiled 6.0, and every suite shape with Cout >= 32 (b16_c64_64_3x3_80: gemm 121 vs tiled 308).
// Below it tiled wins or ties: b1_c16_16_3x3_160 tiled 11.2 vs gemm 14.3, b1_c64_16_1x1_80
// 4.5 vs 4.5.
constexpr int64_t kGemmMinCout = 24;

ConvChoice select_conv_kernel(const ConvShape& s, const DeviceProfile&) {
  const int64_t reduction = s.c / s.groups * s.r * s.s;
  if (s.groups != 1) return {ConvKernel::Scalar, "groups > 1: only scalar handles groups"};
  if (reduction < kGemmMinReduction)
    return {ConvKernel::Tiled,
            fmt::format("reduction {} < {}: tiled", reduction, kGemmMinReduction)};
  if (s.k >= kGemmMinCout)
    return {ConvKernel::Gemm, fmt::format("Cout {} >= {}: gemm", s.k, kGemmMinCout)};
  // Scalar wins no groups == 1 suite shape on the H200 (tiled is 1.2x to 4x faster even on the
  // smallest, b1_c64_8_1x1_80: 4.5 vs 5.5), so it is left to grouped convolutions.
  return {ConvKernel::Tiled, fmt::format("Cout {} < {}: tiled", s.k, kGemmMinCout)};
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The largest of `sizes` (descending) whose grid has at least two waves of blocks.
int largest_filling(const std::vector<int>& sizes, int64_t other_blocks, int64_t extent,
                    int sm_count) {
  for (int size : sizes)
    if (ceil_div(extent, size) * other_blocks >= 2 * int64_t(sm_count)) return size;
  return sizes.back();
}

// The smallest of `sizes` (ascending) that covers `extent`, else the largest.
int smallest_covering(const std::vector<int>& sizes, int64_t extent) {
  for (int size : sizes)
    if (size >= extent) return size;
  return sizes.back();
}

// Whether gemm runs a 3x3 layer on the halo kernel (k = 72), whose blocks hold 1, 2 or 4 squares
// of 8x8 output pixels (a plane that 8 does not divide is padded up to whole squares). Measured
// (conv_bench, H200, docs/perf.md): with 4 squares per block at stride 1 it beats the k = 32
// gather kernel, b16_c64_64_3x3_80 84.8 vs 116 us; with 1 square per block it loses,
// b1_c64_64_3x3_80 38.5 vs 16.4 and b16_c128_128_3x3_40 224 vs 108; at stride 2 it loses even
// with 4, b32_c16_32_3x3s2_320 294 vs 196.
bool halo_wins(const ConvShape& s, int n_tile, const DeviceProfile& device) {
  if (!conv_gemm_halo_fits(s) || s.stride_h != 1) return false;
  const int64_t squares = s.n * ceil_div(s.ho, 8) * ceil_div(s.wo, 8);
  return ceil_div(squares, 4) * ceil_div(s.k, n_tile) >= 2 * int64_t(device.sm_count);
}

}  // namespace

ConvTiles conv_tiles(ConvKernel kernel, const ConvShape& s, const DeviceProfile& device) {
  const int64_t pixels = s.n * s.ho * s.wo;
  ConvTiles t;
  switch (kernel) {
    case ConvKernel::Scalar:
      t.m = 256;  // threads per block, one output each
      t.n = 1;
      break;
    case ConvKernel::Tiled:
      t.n = smallest_covering({8, 16, 32}, s.k);
      t.m = largest_filling({128, 64, 32}, ceil_div(s.k, t.n), pixels, device.sm_count);
      t.k = 8;  // input channels staged per step
      break;
    case ConvKernel::Gemm:
      t.n = smallest_covering({32, 64, 128}, s.k);
      t.stages = 3;
      if (halo_wins(s, t.n, device)) {
        t.m = 256;
        t.k = 72;  // 8 input channels x 9 taps per stage
      } else {
        t.m = largest_filling({128, 64, 32}, ceil_div(s.k, t.n), pixels, device.sm_count);
        t.k = 32;
      }
      break;
  }
  return t;
}

std::vector<ConvTiles> conv_built_tiles(ConvKernel kernel) {
  std::vector<ConvTiles> out;
  if (kernel == ConvKernel::Tiled) {
    for (int m : {32, 64, 128})
      for (int n : {8, 16, 32}) out.push_back({m, n, 8, 0});
  } else if (kernel == ConvKernel::Gemm) {
    for (int m : {32, 64, 128})
      for (int n : {32, 64, 128})
        for (int stages : {2, 3, 4}) out.push_back({m, n, 32, stages});
    // The 3x3 halo kernel; on other shapes these tiles run the k = 32 kernel.
    for (int m : {64, 128, 256})
      for (int n : {32, 64, 128})
        for (int stages : {2, 3, 4}) out.push_back({m, n, 72, stages});
  }
  return out;
}

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
    } else {
      np.kernel = op_name(node.op);
      np.rule = "one kernel";
    }
    plan.nodes.push_back(std::move(np));
  }
  plan.graph = std::move(graph);
  return plan;
}

std::string explain(const Plan& plan) {
  const Graph& g = plan.graph;
  std::string out = fmt::format("{:<24} {:<16} {:<36} {:<8} {:<40} {}\n", "node", "op",
                                "input -> output", "kernel", "rule", "tiles");
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const NodePlan& np = plan.nodes[i];
    std::string io = fmt::format("{} -> {}", shape_str(g.value(n.inputs[0]).shape),
                                 shape_str(g.value(n.outputs[0]).shape));
    std::string tiles;
    if (np.tiles.m) {
      tiles = fmt::format("m={} n={}", np.tiles.m, np.tiles.n);
      if (np.tiles.k) tiles += fmt::format(" k={}", np.tiles.k);
      if (np.tiles.stages) tiles += fmt::format(" stages={}", np.tiles.stages);
    }
    out += fmt::format("{:<24} {:<16} {:<36} {:<8} {:<40} {}\n", n.name, op_name(n.op), io,
                       np.kernel, np.rule, tiles);
  }
  return out;
}

}  // namespace epilog
