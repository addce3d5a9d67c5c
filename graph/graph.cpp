// Graph queries, topological order, shape inference over a graph and the verifier.
#include <algorithm>
#include <set>

#include "epilog/graph/graph.h"

namespace epilog {

const Value& Graph::value(const std::string& name) const {
  auto it = values.find(name);
  if (it == values.end()) fail("graph: no value named '{}'", name);
  return it->second;
}

bool Graph::is_input(const std::string& name) const {
  return std::find(inputs.begin(), inputs.end(), name) != inputs.end();
}

bool Graph::is_output(const std::string& name) const {
  return std::find(outputs.begin(), outputs.end(), name) != outputs.end();
}

const Node* Graph::find_node(const std::string& name) const {
  for (const Node& n : nodes)
    if (n.name == name) return &n;
  return nullptr;
}

std::string Graph::unique_name(const std::string& base) const {
  std::string name = base;
  for (int i = 1; values.count(name) || find_node(name); ++i) name = fmt::format("{}_{}", base, i);
  return name;
}

std::map<OpKind, int> Graph::op_counts() const {
  std::map<OpKind, int> counts;
  for (const Node& n : nodes) counts[n.op]++;
  return counts;
}

UseIndex::UseIndex(const Graph& graph) {
  for (int i = 0; i < static_cast<int>(graph.nodes.size()); ++i) {
    for (const std::string& in : graph.nodes[i].inputs) consumers_[in].push_back(i);
    for (const std::string& out : graph.nodes[i].outputs) producer_[out] = i;
  }
}

int UseIndex::producer(const std::string& value) const {
  auto it = producer_.find(value);
  return it == producer_.end() ? -1 : it->second;
}

const std::vector<int>& UseIndex::consumers(const std::string& value) const {
  static const std::vector<int> none;
  auto it = consumers_.find(value);
  return it == consumers_.end() ? none : it->second;
}

void toposort(Graph& graph) {
  UseIndex uses(graph);
  const size_t n = graph.nodes.size();
  enum State : uint8_t { kNew, kOpen, kDone };
  std::vector<State> state(n, kNew);
  std::vector<size_t> order;
  order.reserve(n);
  // Iterative depth-first search: emit producers before consumers, keeping the given order
  // where it is already valid.
  for (size_t root = 0; root < n; ++root) {
    if (state[root] != kNew) continue;
    std::vector<std::pair<size_t, size_t>> stack{{root, 0}};  // node, next input to visit
    state[root] = kOpen;
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      const auto& ins = graph.nodes[node].inputs;
      if (next < ins.size()) {
        int p = uses.producer(ins[next++]);
        if (p < 0 || state[p] == kDone) continue;
        if (state[p] == kOpen)
          fail(
              "graph: cycle through node '{}': its output '{}', read by node '{}', depends on "
              "itself",
              graph.nodes[p].name, ins[next - 1], graph.nodes[node].name);
        state[p] = kOpen;
        stack.push_back({size_t(p), 0});
      } else {
        state[node] = kDone;
        order.push_back(node);
        stack.pop_back();
      }
    }
  }
  std::vector<Node> sorted;
  sorted.reserve(n);
  for (size_t i : order) sorted.push_back(std::move(graph.nodes[i]));
  graph.nodes = std::move(sorted);
}

void infer_graph_shapes(Graph& graph) {
  for (const Node& node : graph.nodes) {
    std::vector<Shape> in_shapes;
    for (const std::string& in : node.inputs) {
      auto it = graph.values.find(in);
      if (it == graph.values.end())
        fail("[{}] node '{}': input '{}' is not defined", op_name(node.op), node.name, in);
      in_shapes.push_back(it->second.shape);
    }
    auto out_shapes = infer_shapes(node.op, node.name, node.attrs, in_shapes);
    if (out_shapes.size() != node.outputs.size())
      fail("[{}] node '{}': has {} outputs, expected {}", op_name(node.op), node.name,
           node.outputs.size(), out_shapes.size());
    for (size_t i = 0; i < out_shapes.size(); ++i)
      graph.values[node.outputs[i]] = Value{out_shapes[i], DType::F32};
  }
}

namespace {

[[noreturn]] void reject(const std::string& where, const std::string& what) {
  throw Error(fmt::format("verify{}: {}", where.empty() ? "" : " (" + where + ")", what));
}

}  // namespace

void verify(const Graph& graph, const std::string& where) {
  auto node_err = [&](const Node& n, const std::string& what) {
    reject(where, fmt::format("[{}] node '{}': {}", op_name(n.op), n.name, what));
  };

  // Each value is defined exactly once: as an input, a weight or one node output.
  std::map<std::string, std::string> defined;  // value -> what defines it
  auto define = [&](const std::string& name, const std::string& by) {
    if (name.empty()) reject(where, fmt::format("{} defines a value with an empty name", by));
    auto [it, fresh] = defined.emplace(name, by);
    if (!fresh)
      reject(where,
             fmt::format("duplicate name '{}': defined by {} and by {}", name, it->second, by));
  };
  for (const std::string& in : graph.inputs) define(in, "graph input");
  for (const auto& [name, w] : graph.weights) {
    define(name, "weight");
    if (!w.data.defined()) reject(where, fmt::format("weight '{}' has no data", name));
  }
  std::set<std::string> node_names;
  for (const Node& n : graph.nodes) {
    if (!node_names.insert(n.name).second)
      reject(where, fmt::format("duplicate node name '{}'", n.name));
    for (const std::string& out : n.outputs) define(out, fmt::format("node '{}'", n.name));
  }

  // References: every input defined earlier (or a cycle), every output defined.
  std::set<std::string> available(graph.inputs.begin(), graph.inputs.end());
  for (const auto& [name, w] : graph.weights) available.insert(name);
  for (const Node& n : graph.nodes) {
    for (const std::string& in : n.inputs) {
      if (available.count(in)) continue;
      if (!defined.count(in)) node_err(n, fmt::format("input '{}' is not defined", in));
      Graph copy = graph;
      try {
        toposort(copy);  // throws on a cycle, naming it
      } catch (const Error& e) {
        reject(where, e.what());
      }
      node_err(n, fmt::format("input '{}' is used before node order defines it", in));
    }
    for (const std::string& out : n.outputs) available.insert(out);
  }
  std::set<std::string> outs;
  for (const std::string& out : graph.outputs) {
    if (!defined.count(out)) reject(where, fmt::format("graph output '{}' is not defined", out));
    if (!outs.insert(out).second)
      reject(where, fmt::format("graph output '{}' is listed twice", out));
  }

  // Shapes recorded for every value and nothing else.
  for (const auto& [name, by] : defined)
    if (!graph.values.count(name))
      reject(where, fmt::format("value '{}' (defined by {}) has no shape", name, by));
  for (const auto& [name, v] : graph.values)
    if (!defined.count(name))
      reject(where, fmt::format("value '{}' has a shape but nothing defines it", name));
  for (const auto& [name, w] : graph.weights)
    if (w.data.shape() != graph.values.at(name).shape)
      reject(where, fmt::format("weight '{}' holds {} but its value says {}", name,
                                shape_str(w.data.shape()), shape_str(graph.values.at(name).shape)));

  // Arity, attributes and shapes, against the op table.
  for (const Node& n : graph.nodes) {
    Attrs normal;
    try {
      normal = normalize_attrs(n.op, n.name, n.attrs);
    } catch (const Error& e) {
      reject(where, e.what());
    }
    if (!(normal == n.attrs)) node_err(n, "attributes are not normalized");
    std::vector<Shape> in_shapes;
    for (const std::string& in : n.inputs) in_shapes.push_back(graph.values.at(in).shape);
    std::vector<Shape> expect;
    try {
      expect = infer_shapes(n.op, n.name, n.attrs, in_shapes);
    } catch (const Error& e) {
      reject(where, e.what());
    }
    if (expect.size() != n.outputs.size())
      node_err(n, fmt::format("has {} outputs, expected {}", n.outputs.size(), expect.size()));
    for (size_t i = 0; i < expect.size(); ++i) {
      const Shape& got = graph.values.at(n.outputs[i]).shape;
      if (got != expect[i])
        node_err(n, fmt::format("output '{}' is recorded as {} but infers to {}", n.outputs[i],
                                shape_str(got), shape_str(expect[i])));
    }
  }
}

}  // namespace epilog
