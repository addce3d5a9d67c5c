// Canonicalization and fusion rules, dead-code elimination and the pass pipeline.
#include "epilog/graph/passes.h"

#include <cmath>
#include <set>

namespace epilog {
namespace {

std::string unique_weight_name(const Graph& g, const std::string& base) {
  std::string name = base;
  for (int i = 1; g.values.count(name); ++i) name = fmt::format("{}_{}", base, i);
  return name;
}

// The batchnorm (and the conv bias) must be constants for the fold to happen at compile time.
std::string foldable(const Match& m) {
  const Graph& g = *m.graph;
  const Node& conv = m.node("conv");
  if (conv.inputs.size() > 2 && !g.is_weight(conv.inputs[2]))
    return fmt::format("the bias of '{}' is computed, not a constant", conv.name);
  const Node* bn = m.find("bn");
  for (size_t i = 1; bn && i < bn->inputs.size(); ++i)
    if (!g.is_weight(bn->inputs[i]))
      return fmt::format("batchnorm '{}' is not in inference form ({} is computed, not a constant)",
                         bn->name, op_info(OpKind::BatchNorm).input_name(i));
  return "";
}

// scale = gamma / sqrt(var + eps), shift = beta + (bias - mean) * scale, in float64.
Replacement fuse_conv(const Match& m, const std::string& activation) {
  const Graph& g = *m.graph;
  const Node& conv = m.node("conv");
  const Node* bn = m.find("bn");
  const Node& root = g.nodes[m.root];
  const int64_t k = g.value(conv.inputs[1]).shape[0];
  std::vector<double> scale(k, 1.0), shift(k, 0.0);
  if (conv.inputs.size() > 2) {
    const float* bias = g.weights.at(conv.inputs[2]).data.f32();
    for (int64_t c = 0; c < k; ++c) shift[c] = bias[c];
  }
  if (bn) {
    auto param = [&](int i) { return g.weights.at(bn->inputs[i]).data.f32(); };
    const float *gamma = param(1), *beta = param(2), *mean = param(3), *var = param(4);
    double eps = bn->attrs.f("eps");
    for (int64_t c = 0; c < k; ++c) {
      scale[c] = double(gamma[c]) / std::sqrt(double(var[c]) + eps);
      shift[c] = double(beta[c]) + (shift[c] - double(mean[c])) * scale[c];
    }
  }
  Replacement r;
  Tensor ts = Tensor::empty({k}), tb = Tensor::empty({k});
  for (int64_t c = 0; c < k; ++c) {
    ts.f32()[c] = static_cast<float>(scale[c]);
    tb.f32()[c] = static_cast<float>(shift[c]);
  }
  std::string sname = unique_weight_name(g, conv.name + ".scale");
  std::string bname = unique_weight_name(g, conv.name + ".shift");
  r.weights[sname] = ts;
  r.weights[bname] = tb;
  Attrs attrs = conv.attrs;
  attrs.set("activation", activation);
  r.nodes.push_back(Node{conv.name,
                         OpKind::FusedConv2d,
                         normalize_attrs(OpKind::FusedConv2d, conv.name, attrs),
                         {conv.inputs[0], conv.inputs[1], sname, bname},
                         {root.outputs[0]}});
  return r;
}

}  // namespace

std::vector<Rule> canonicalize_rules() {
  return {Rule{
      "mul(x,sigmoid(x))->silu",
      op(OpKind::Mul, {any("x"), op(OpKind::Sigmoid, {any("x")}, "sigmoid")}, "mul"), OpKind::Silu,
      nullptr, [](const Match& m) {
        const Node& mul = m.node("mul");
        return Replacement{{Node{mul.name, OpKind::Silu, {}, {m.value("x")}, mul.outputs}}, {}};
      }}};
}

std::vector<Rule> fusion_rules() {
  const Pat conv = op(OpKind::Conv2d, {}, "conv");
  const Pat bn = op(OpKind::BatchNorm, {conv}, "bn");
  std::vector<Rule> rules;
  // The activation attribute of fused_conv2d is the activation op's own name.
  for (OpKind kind : {OpKind::Silu, OpKind::Relu, OpKind::Sigmoid}) {
    std::string name = op_name(kind);
    auto apply = [name](const Match& m) { return fuse_conv(m, name); };
    rules.push_back({"conv2d->batchnorm->" + name, op(kind, {bn}, "act"), OpKind::FusedConv2d,
                     foldable, apply});
    rules.push_back(
        {"conv2d->" + name, op(kind, {conv}, "act"), OpKind::FusedConv2d, foldable, apply});
  }
  rules.push_back({"conv2d->batchnorm", bn, OpKind::FusedConv2d, foldable,
                   [](const Match& m) { return fuse_conv(m, "none"); }});
  // A residual add after the activation (x + block(x)) goes into the same epilogue; it only
  // matches once the chain before it is fused, which the rewriter's repeat gets to.
  rules.push_back({"fused_conv2d->add",
                   op(OpKind::Add, {op(OpKind::FusedConv2d, {}, "conv"), any("residual")}, "add"),
                   OpKind::FusedConv2d,
                   [](const Match& m) -> std::string {
                     const Graph& g = *m.graph;
                     const Node& conv = m.node("conv");
                     if (conv.inputs.size() > 4)
                       return fmt::format("'{}' already adds a residual", conv.name);
                     const Shape& y = g.value(conv.outputs[0]).shape;
                     if (g.value(m.value("residual")).shape != y)
                       return fmt::format("the add broadcasts {} onto {}",
                                          shape_str(g.value(m.value("residual")).shape),
                                          shape_str(y));
                     return "";
                   },
                   [](const Match& m) {
                     Node fused = m.node("conv");
                     fused.inputs.push_back(m.value("residual"));
                     fused.outputs = m.node("add").outputs;
                     return Replacement{{fused}, {}};
                   }});
  return rules;
}

int eliminate_dead_code(Graph& graph) {
  std::set<std::string> live(graph.outputs.begin(), graph.outputs.end());
  std::vector<Node> kept;
  int removed = 0;
  for (auto it = graph.nodes.rbegin(); it != graph.nodes.rend(); ++it) {
    bool used = std::any_of(it->outputs.begin(), it->outputs.end(),
                            [&](const std::string& o) { return live.count(o) != 0; });
    if (!used) {
      for (const std::string& o : it->outputs) graph.values.erase(o);
      ++removed;
      continue;
    }
    live.insert(it->inputs.begin(), it->inputs.end());
    kept.push_back(std::move(*it));
  }
  graph.nodes.assign(std::make_move_iterator(kept.rbegin()), std::make_move_iterator(kept.rend()));
  for (auto it = graph.weights.begin(); it != graph.weights.end();) {
    if (live.count(it->first)) {
      ++it;
    } else {
      graph.values.erase(it->first);
      it = graph.weights.erase(it);
    }
  }
  return removed;
}

std::string PassReport::summary() const {
  std::vector<std::string> parts;
  for (const auto& h : hits) parts.push_back(fmt::format("{} {} {}", h.verb, h.count, h.rule));
  parts.push_back(fmt::format("removed {} dead nodes", dead_nodes));
  return fmt::format("{}", fmt::join(parts, ", "));
}

PassReport optimize(Graph& graph, const PassOptions& options) {
  PassReport report;
  int stage = 0;
  auto after = [&](const std::string& name) {
    verify(graph, "after " + name);
    if (options.on_stage) options.on_stage(stage++, name, graph);
  };
  verify(graph, "before passes");
  if (options.on_stage) options.on_stage(stage++, "source", graph);

  auto run_rules = [&](const std::string& verb, const std::vector<Rule>& rules) {
    RewriteStats s = rewrite(graph, rules, options.has_kernel);
    for (const auto& [rule, n] : s.hits) report.hits.push_back({verb, rule, n});
    for (const auto& [why, n] : s.refused) report.refusals.push_back(why);
  };
  run_rules("canonicalized", canonicalize_rules());
  after("canonicalize");
  if (options.fuse) {
    run_rules("fused", fusion_rules());
    after("fuse");
  }
  report.dead_nodes = eliminate_dead_code(graph);
  after("dce");
  return report;
}

}  // namespace epilog
