// The graph IR: named inputs, outputs and weights, and nodes in topological order. Every value
// (input, weight or node output) has a shape in `values`.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "epilog/graph/op.h"
#include "epilog/tensor.h"

namespace epilog {

struct Value {
  Shape shape;
  DType dtype = DType::F32;
  bool operator==(const Value& o) const { return shape == o.shape && dtype == o.dtype; }
};

// Plain data: what the node computes, not how. Kernels attach per backend.
struct Node {
  std::string name;
  OpKind op;
  Attrs attrs;
  std::vector<std::string> inputs;  // value names
  std::vector<std::string> outputs;
  bool operator==(const Node& o) const {
    return name == o.name && op == o.op && attrs == o.attrs && inputs == o.inputs &&
           outputs == o.outputs;
  }
};

// An initializer. `seed` is set when the data came from the seeded generator, so that dumps can
// describe it by its seed instead of its numbers.
struct Weight {
  Tensor data;
  std::optional<uint64_t> seed;
};

struct Graph {
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::map<std::string, Weight> weights;
  std::map<std::string, Value> values;
  std::vector<Node> nodes;

  const Value& value(const std::string& name) const;
  bool is_input(const std::string& name) const;
  bool is_output(const std::string& name) const;
  bool is_weight(const std::string& name) const { return weights.count(name) != 0; }
  const Node* find_node(const std::string& name) const;
  // `base`, or base_1, base_2, ...: the first that names no value and no node, for what a pass
  // adds.
  std::string unique_name(const std::string& base) const;
  // Nodes per op kind, for structural checks and pass statistics.
  std::map<OpKind, int> op_counts() const;
};

// Who produces and who reads each value; rebuilt after a graph changes.
class UseIndex {
 public:
  explicit UseIndex(const Graph& graph);
  // Index into graph.nodes of the producer, or -1 for inputs and weights.
  int producer(const std::string& value) const;
  // Indices of consuming nodes, once per use.
  const std::vector<int>& consumers(const std::string& value) const;

 private:
  std::map<std::string, int> producer_;
  std::map<std::string, std::vector<int>> consumers_;
};

// Orders nodes so that each comes after the producers of its inputs (stable for graphs already
// in order). Throws Error naming a node on the cycle.
void toposort(Graph& graph);

// Recomputes every node's output shapes in order; errors name op and node.
void infer_graph_shapes(Graph& graph);

// Checks the invariants every pass must keep: unique names, defined references, topological
// order (no cycles), arity, attributes and shapes. `where` names the stage in the message
// ("after fuse: ...").
void verify(const Graph& graph, const std::string& where = "");

}  // namespace epilog
