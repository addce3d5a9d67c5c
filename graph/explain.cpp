// What `explain` says of a plan: each node's kernel, the launch it makes and the rule that chose
// it, as the launchers do it (the GPU tests compare the two).
#include <map>
#include <string>
#include <vector>

#include "epilog/graph/lowering.h"
#include "epilog/kernels/launch.h"
#include "epilog/runtime/executor.h"
#include "epilog/runtime/params.h"

namespace epilog {

namespace {

// The node `name` where the executor folds it into a neighbour (copy avoidance on), else null.
const Node* folded_node(const Plan& plan, const std::vector<bool>& in_place,
                        const std::string& name) {
  const Node* n = plan.graph.find_node(name);
  const size_t at = n ? size_t(n - plan.graph.nodes.data()) : in_place.size();
  return at < in_place.size() && in_place[at] ? n : nullptr;
}

// Whether node i, a fused conv with an upsampling folded in (NodePlan::up), reads through it at
// run time: the executor folds it only where the concat runs in place.
bool reads_upsampled(const Plan& plan, const std::vector<bool>& in_place, size_t i) {
  const NodePlan& np = plan.nodes[i];
  return np.up && folded_node(plan, in_place, np.up->node);
}

// The elementwise node i, a fused conv, applies to its input at run time (NodePlan::pro), or null.
const Node* prologue_node(const Plan& plan, const std::vector<bool>& in_place, size_t i) {
  const NodePlan& np = plan.nodes[i];
  return np.pro ? folded_node(plan, in_place, np.pro->node) : nullptr;
}

// Node i's kernel and the rule that chose it (node_choices adds the tiles).
NodeChoice kernel_and_rule(const Plan& plan, const std::vector<bool>& in_place, size_t i) {
  const auto masked = [&](size_t j) { return j < in_place.size() && in_place[j]; };
  const Node& node = plan.graph.nodes[i];
  const NodePlan& np = plan.nodes[i];
  if (masked(i) && node.op == OpKind::UpsampleNearest)
    return {"folded", fmt::format("no kernel: {} reads its input upsampled", np.folded_into)};
  if (masked(i) && node.op == OpKind::MaxPool2d)
    return {"folded", fmt::format("no kernel: {} makes it on its staged plane", np.folded_into)};
  if (masked(i) && node.op == OpKind::FusedElementwise)
    return {"folded", fmt::format("no kernel: {} applies it to the values it loads (a prologue)",
                                  np.folded_into)};
  if (masked(i) && node.op == OpKind::FusedConv2d) {
    const Node* host = plan.graph.find_node(np.folded_into);
    if (host && plan.nodes[size_t(host - plan.graph.nodes.data())].post)
      return {"folded", fmt::format("no kernel: {} runs it on its accumulators (conv chain)",
                                    np.folded_into)};
    return {"folded", fmt::format("no kernel: {} makes its outputs where it loads them (conv pair)",
                                  np.folded_into)};
  }
  if (masked(i))
    return {"in place", node.op == OpKind::Split
                            ? "no copy: its parts are views of its input"
                            : "no copy: its inputs are made in its buffer, or in that of a "
                              "longer concat whose start it is"};
  if (!np.chain.empty() && !in_place.empty())
    return {np.kernel, fmt::format("{}; then {}, each pooling the one before", np.rule,
                                   fmt::join(np.chain, ", "))};
  if (reads_upsampled(plan, in_place, i))
    return {np.kernel, fmt::format("{}; channels {}..{} read from {} upsampled {}x{}", np.rule,
                                   np.up->c0, np.up->c0 + np.up->channels - 1, np.up->source,
                                   np.up->scale_h, np.up->scale_w)};
  if (np.pre && folded_node(plan, in_place, np.pre->node))
    return {"gemm pair", fmt::format("also computes {} ({} -> {} channels), its outputs never "
                                     "stored",
                                     np.pre->node, np.pre->shape.c, np.pre->shape.k)};
  if (np.post && folded_node(plan, in_place, np.post->node))
    return {"gemm chain",
            fmt::format("{}; also runs {} (1x1, {} -> {} channels), its own outputs never stored",
                        np.rule, np.post->node, np.post->shape.c, np.post->shape.k)};
  if (const Node* ew = prologue_node(plan, in_place, i)) {
    const FoldedPrologue& p = *np.pro;
    const std::string ops = fmt::format(
        "{}{}{}", p.scale >= 0 ? "scale, " : "", p.shift >= 0 ? "shift, " : "",
        p.act.kind == Activation::Relu ? "relu" : "no activation");
    return {np.kernel, fmt::format("{}; applies {} ({}) to {} as it loads it", np.rule, ew->name,
                                   ops, ew->inputs[0])};
  }
  return {np.kernel, np.rule};
}

// The launch node i's kernel runs, as explain's tiles column shows it and the CUDA launchers log
// it (launch.h): for the kernels with a choice to make, the one they make on the operands as the
// executor lays them out (`places`).
std::string launch_tiles(const Plan& plan, const std::vector<bool>& in_place,
                         const std::map<std::string, ValuePlace>& places, size_t i,
                         const std::string& kernel) {
  const Graph& g = plan.graph;
  const Node& n = g.nodes[i];
  const NodePlan& np = plan.nodes[i];
  if (plan.device != Device::CUDA || kernel == "folded" || kernel == "in place" ||
      kernel == "view")
    return "";
  if (kernel == "gemm pair") return conv_pair_tiles_str();
  if (n.op == OpKind::FusedConv2d || n.op == OpKind::Conv2d) {
    ConvShape cs = conv_shape(g, n);
    const Node* pro = prologue_node(plan, in_place, i);  // then it reads that node's input
    const auto at = places.find(pro ? pro->inputs[0] : n.inputs[0]);
    const ValuePlace x = at == places.end() ? ValuePlace{} : at->second;
    cs.x_stride = x.item_stride;
    const bool aligned = x.offset % 4 == 0;  // allocations are 256-byte aligned (kAlign)
    switch (np.conv) {
      case ConvKernel::Scalar:
        return scalar_launch_str(conv_scalar_path(cs, aligned), cs);
      case ConvKernel::Tiled:
      case ConvKernel::Gemv:
        return conv_tiles_str(np.tiles);
      case ConvKernel::Gemm: {
        // A conv chain's first conv has no residual and reads no upsampling (conv_chain_fits).
        const bool chain = kernel == "gemm chain";
        const bool residual = !chain && n.op == OpKind::FusedConv2d && n.inputs.size() > 4;
        const bool up = !chain && reads_upsampled(plan, in_place, i);
        return gemm_launch_str(
            conv_gemm_launch(cs, np.tiles, {aligned, residual, up, pro != nullptr}));
      }
    }
  }
  if (n.op == OpKind::MaxPool2d) {
    const PoolShape p = pool_shape(n, g.value(n.inputs[0]).shape, g.value(n.outputs[0]).shape);
    return maxpool_launch_str(maxpool_kernel(p), in_place.empty() ? 1 : int(np.chain.size()) + 1);
  }
  if (n.op == OpKind::Linear) {
    const int64_t k = g.value(n.inputs[1]).shape[1];
    return linear_launch_str(k == 0 ? 0 : shape_numel(g.value(n.inputs[0]).shape) / k);
  }
  if (n.op == OpKind::MatMul) {
    const Shape& b = g.value(n.inputs[1]).shape;
    const Shape& y = g.value(n.outputs[0]).shape;
    // No launch where the product is empty (cuda::matmul returns at once).
    if (shape_numel(y) == 0) return "";
    return matmul_launch_str(b.back(), b[b.size() - 2]);
  }
  return "";
}

}  // namespace

std::vector<NodeChoice> node_choices(const Plan& plan, const std::vector<bool>& in_place) {
  // The executor lays the values out as plan_in_place says where copy avoidance is on.
  const std::map<std::string, ValuePlace> places =
      value_places(plan.graph, in_place.empty() ? InPlacePlan{} : plan_in_place(plan));
  std::vector<NodeChoice> out;
  for (size_t i = 0; i < plan.graph.nodes.size(); ++i) {
    out.push_back(kernel_and_rule(plan, in_place, i));
    out.back().tiles = launch_tiles(plan, in_place, places, i, out.back().kernel);
  }
  return out;
}

std::string explain(const Plan& plan, const std::vector<bool>& in_place) {
  const Graph& g = plan.graph;
  const std::vector<NodeChoice> choices = node_choices(plan, in_place);
  // The rule last: it is free text, and the longest ones would push a column after it askew.
  std::string out = fmt::format("{:<24} {:<17} {:<46} {:<17} {:<50} {}\n", "node", "op",
                                "input -> output", "kernel", "tiles", "rule");
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    std::string io = fmt::format("{} -> {}", shape_str(g.value(n.inputs[0]).shape),
                                 shape_str(g.value(n.outputs[0]).shape));
    if (n.op == OpKind::FusedConv2d && n.inputs.size() > 4) io += " + residual";
    const NodeChoice& choice = choices[i];
    out += fmt::format("{:<24} {:<17} {:<46} {:<17} {:<50} {}\n", n.name, op_name(n.op), io,
                       choice.kernel, choice.tiles, choice.rule);
  }
  return out;
}

}  // namespace epilog
