// Pattern matching, the legality helper and the fixpoint rewriter.
#include "epilog/graph/pattern.h"

#include <algorithm>
#include <functional>
#include <set>

namespace epilog {
namespace {

bool commutative(OpKind op) {
  return op == OpKind::Add || op == OpKind::Mul;
}

// The search is depth first over every way to match: `next` goes on with the rest of the
// pattern and says whether all of it matched, so that a choice (which operand of an add or mul
// is which) is undone and the other one tried when what comes after it fails: mul(x, 0.5) is
// mul(any("x"), any("half")) either way round, and the rest of the pattern decides which x is.
// On failure each function leaves m as it found it.
using Next = std::function<bool(Match&)>;

bool match_node(const Graph& g, const UseIndex& uses, const Pat& p, int idx, Match& m,
                const Next& next);

// Input `slot` of node `reader` against p.
bool match_value(const Graph& g, const UseIndex& uses, const Pat& p, int reader, size_t slot,
                 Match& m, const Next& next) {
  const std::string& value = g.nodes[size_t(reader)].inputs[slot];
  if (!p.ops.empty()) {
    const int idx = uses.producer(value);
    if (idx < 0 || g.nodes[size_t(idx)].outputs[0] != value) return false;
    const bool fresh = m.links.insert({reader, slot}).second;
    if (match_node(g, uses, p, idx, m, next)) return true;
    if (fresh) m.links.erase({reader, slot});
    return false;
  }
  if (p.bind.empty()) return next(m);
  const auto [it, fresh] = m.value_of.emplace(p.bind, value);
  if (!fresh && it->second != value) return false;
  if (next(m)) return true;
  if (fresh) m.value_of.erase(p.bind);
  return false;
}

// p's inputs from the i-th on against node idx's inputs in `order`, then next.
bool match_inputs(const Graph& g, const UseIndex& uses, const Pat& p, int idx,
                  const std::vector<size_t>& order, size_t i, Match& m, const Next& next) {
  if (i == p.inputs.size()) return next(m);
  return match_value(g, uses, p.inputs[i], idx, order[i], m, [&](Match& rest) {
    return match_inputs(g, uses, p, idx, order, i + 1, rest, next);
  });
}

bool match_node(const Graph& g, const UseIndex& uses, const Pat& p, int idx, Match& m,
                const Next& next) {
  const Node& n = g.nodes[size_t(idx)];
  if (std::find(p.ops.begin(), p.ops.end(), n.op) == p.ops.end() ||
      p.inputs.size() > n.inputs.size())
    return false;
  const Match saved = m;
  if (!p.bind.empty()) {
    auto [it, fresh] = m.node_of.emplace(p.bind, idx);
    if (!fresh && it->second != idx) return false;
    m.value_of[p.bind] = n.outputs[0];
  }
  if (std::find(m.nodes.begin(), m.nodes.end(), idx) == m.nodes.end()) m.nodes.push_back(idx);
  std::vector<std::vector<size_t>> orders{{}};
  for (size_t i = 0; i < p.inputs.size(); ++i) orders[0].push_back(i);
  if (commutative(n.op) && p.inputs.size() == 2) orders.push_back({1, 0});
  for (const auto& order : orders)
    if (match_inputs(g, uses, p, idx, order, 0, m, next)) return true;
  m = saved;
  return false;
}

}  // namespace

void replace_match(Graph& g, const Match& m, Replacement r) {
  std::set<int> gone(m.nodes.begin(), m.nodes.end());
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size());
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    if (i == m.root) {
      for (Node& n : r.nodes) nodes.push_back(std::move(n));
    } else if (!gone.count(i)) {
      nodes.push_back(std::move(g.nodes[i]));
    } else {
      for (const std::string& out : g.nodes[i].outputs) g.values.erase(out);
    }
  }
  for (const std::string& out : g.nodes[m.root].outputs) g.values.erase(out);
  for (auto& [name, t] : r.weights) {
    g.values[name] = Value{t.shape(), t.dtype()};
    g.weights[name] = Weight{std::move(t), std::nullopt};
  }
  g.nodes = std::move(nodes);
  infer_graph_shapes(g);
}

const Node& Match::node(const std::string& bind) const {
  const Node* n = find(bind);
  EPILOG_ASSERT(n, "pattern has no node bound to '{}'", bind);
  return *n;
}

const Node* Match::find(const std::string& bind) const {
  auto it = node_of.find(bind);
  return it == node_of.end() ? nullptr : &graph->nodes[it->second];
}

const std::string& Match::value(const std::string& bind) const {
  auto it = value_of.find(bind);
  EPILOG_ASSERT(it != value_of.end(), "pattern has no value bound to '{}'", bind);
  return it->second;
}

std::optional<Match> match(const Graph& graph, const UseIndex& uses, const Pat& pattern, int root) {
  Match m;
  m.graph = &graph;
  m.root = root;
  if (pattern.ops.empty() || !match_node(graph, uses, pattern, root, m, [](Match&) { return true; }))
    return std::nullopt;
  return m;
}

std::string can_absorb(const Graph& graph, const UseIndex& uses, const Match& match,
                       OpKind result_op, const KernelQuery& has_kernel) {
  for (int idx : match.nodes) {
    if (idx == match.root) continue;
    const Node& n = graph.nodes[idx];
    for (const std::string& out : n.outputs) {
      if (graph.is_output(out)) return fmt::format("'{}' is a graph output", out);
      const size_t readers = uses.consumers(out).size();
      const auto inside = std::count_if(match.links.begin(), match.links.end(), [&](auto link) {
        return graph.nodes[size_t(link.first)].inputs[link.second] == out;
      });
      if (readers != size_t(inside))
        return fmt::format("'{}' has {} consumers, {} outside the pattern", out, readers,
                           readers - size_t(inside));
    }
  }
  DType dtype = graph.value(graph.nodes[match.root].outputs[0]).dtype;
  bool ok = has_kernel ? has_kernel(result_op, dtype) : dtype == DType::F32;
  if (!ok) return fmt::format("no {} kernel for {}", op_name(result_op), dtype_name(dtype));
  return "";
}

RewriteStats rewrite(Graph& graph, const std::vector<Rule>& rules, const KernelQuery& has_kernel) {
  std::map<OpKind, std::vector<const Rule*>> by_root;
  for (const Rule& r : rules) {
    EPILOG_ASSERT(!r.pattern.ops.empty(), "rule '{}' needs an op at its root", r.name);
    for (OpKind kind : r.pattern.ops) by_root[kind].push_back(&r);
  }
  RewriteStats stats;
  for (bool changed = true; changed;) {
    changed = false;
    stats.refused.clear();  // only refusals of the final, unchanged graph are reported
    UseIndex uses(graph);
    for (int i = static_cast<int>(graph.nodes.size()) - 1; i >= 0 && !changed; --i) {
      auto it = by_root.find(graph.nodes[i].op);
      if (it == by_root.end()) continue;
      for (const Rule* rule : it->second) {
        std::optional<Match> m = match(graph, uses, rule->pattern, i);
        if (!m) continue;
        std::string why = can_absorb(graph, uses, *m, rule->result_op, has_kernel);
        if (why.empty() && rule->check) why = rule->check(*m);
        if (!why.empty()) {
          stats.refused[fmt::format("{} at '{}': {}", rule->name, graph.nodes[i].name, why)]++;
          continue;
        }
        replace_match(graph, *m, rule->apply(*m));
        stats.hits[rule->name]++;
        changed = true;
        break;
      }
    }
  }
  return stats;
}

}  // namespace epilog
