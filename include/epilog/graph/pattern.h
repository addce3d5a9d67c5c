// Declarative DAG patterns over the graph and a rewriter that applies rules until nothing
// changes. A rule is a pattern, a cheap check and an apply:
//
//   Rule{"conv2d->batchnorm->silu",
//        op(OpKind::Silu, {op(OpKind::BatchNorm, {op(OpKind::Conv2d, {}, "conv")}, "bn")}, "act"),
//        check_foldable, apply_fuse};
//
// Every match passes the one legality helper (can_absorb) before its rule sees it.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "epilog/graph/graph.h"

namespace epilog {

// Matches either a node of one of the kinds `ops` whose first inputs match `inputs` in order
// (operands of add and mul in either order), or, with no ops, any value. A binding name used twice must bind
// the same value both times: mul(any("x"), sigmoid(any("x"))) is x * sigmoid(x), and a node
// pattern bound twice matches one node read twice (LayerNorm's x - mean, read by the square and
// the division).
struct Pat {
  std::vector<OpKind> ops;
  std::vector<Pat> inputs;
  std::string bind;
};

inline Pat op(OpKind kind, std::vector<Pat> inputs = {}, std::string bind = "") {
  return Pat{{kind}, std::move(inputs), std::move(bind)};
}
// A node of any of `kinds`: a category of ops (the unary ones, the elementwise ones, ...).
inline Pat one_of(std::vector<OpKind> kinds, std::vector<Pat> inputs = {}, std::string bind = "") {
  return Pat{std::move(kinds), std::move(inputs), std::move(bind)};
}
inline Pat any(std::string bind = "") {
  return Pat{{}, {}, std::move(bind)};
}

struct Match {
  const Graph* graph = nullptr;
  int root = -1;                                // index of the root node
  std::vector<int> nodes;                       // every matched node, root first
  std::map<std::string, int> node_of;           // binding -> node index
  std::map<std::string, std::string> value_of;  // binding -> value name (nodes: first output)
  // The reads the pattern followed into a matched node: (reading node, input slot).
  std::set<std::pair<int, size_t>> links;

  const Node& node(const std::string& bind) const;
  const Node* find(const std::string& bind) const;  // null when the binding is absent
  const std::string& value(const std::string& bind) const;
};

// What the backend can run, for the legality check; the default accepts float32 only.
using KernelQuery = std::function<bool(OpKind op, DType dtype)>;

// The one legality helper: the matched nodes other than the root disappear into
// `result_op`, so nothing but the pattern's own links may read them (for a chain: exactly one
// consumer each), none may produce a graph output, and the backend must have a kernel for
// `result_op` at the root's dtype. Returns the reason it refuses, or an empty string.
std::string can_absorb(const Graph& graph, const UseIndex& uses, const Match& match,
                       OpKind result_op, const KernelQuery& has_kernel);

// Replacements built by a rule's apply. `nodes` take the root's place; the matched nodes are
// removed; `weights` are added to the graph.
struct Replacement {
  std::vector<Node> nodes;
  std::map<std::string, Tensor> weights;
};

// Removes the matched nodes, puts the replacement where the root was and infers shapes again.
void replace_match(Graph& graph, const Match& match, Replacement replacement);

struct Rule {
  std::string name;  // "conv2d->batchnorm->silu": the hit counter's key
  Pat pattern;
  OpKind result_op;  // what the match becomes, for the legality helper
  // Cheap rule-specific conditions: the reason to refuse, or "" to go ahead. May be empty.
  std::function<std::string(const Match&)> check;
  std::function<Replacement(const Match&)> apply;
};

// Tries the pattern rooted at node `root`.
std::optional<Match> match(const Graph& graph, const UseIndex& uses, const Pat& pattern, int root);

struct RewriteStats {
  std::map<std::string, int> hits;     // rule name -> times applied
  std::map<std::string, int> refused;  // "rule at 'node': reason" -> times refused
};

// Applies rules (indexed by each op their root takes; earlier rules first) until no rule matches.
// Visits consumers before producers so that the longest chain ending at a node wins.
RewriteStats rewrite(Graph& graph, const std::vector<Rule>& rules, const KernelQuery& has_kernel);

}  // namespace epilog
