// The graph IR: verify() accepts well-formed graphs and rejects each kind of malformed one;
// toposort, UseIndex, infer_graph_shapes and the Graph queries.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "epilog/graph/graph.h"
#include "error_matcher.h"

using epilog::Attrs;
using epilog::AttrValue;
using epilog::Graph;
using epilog::Node;
using epilog::OpKind;
using epilog::Shape;
using epilog::Tensor;

namespace {

void add_input(Graph& g, const std::string& name, const Shape& shape) {
  g.inputs.push_back(name);
  g.values[name] = {shape};
}

void add_weight(Graph& g, const std::string& name, const Shape& shape) {
  g.weights[name] = {Tensor::zeros(shape), std::nullopt};
  g.values[name] = {shape};
}

// Appends a node with normalized attributes and records its inferred output shapes.
Node& add_node(Graph& g, const std::string& name, OpKind op, std::vector<std::string> inputs,
               Attrs attrs = {}, std::vector<std::string> outputs = {}) {
  Node n;
  n.name = name;
  n.op = op;
  n.attrs = epilog::normalize_attrs(op, name, attrs);
  n.inputs = std::move(inputs);
  n.outputs = outputs.empty() ? std::vector<std::string>{name} : std::move(outputs);
  std::vector<Shape> in_shapes;
  for (const std::string& in : n.inputs) in_shapes.push_back(g.values.at(in).shape);
  std::vector<Shape> out_shapes = epilog::infer_shapes(op, name, n.attrs, in_shapes);
  for (size_t i = 0; i < out_shapes.size(); ++i) g.values[n.outputs[i]] = {out_shapes[i]};
  g.nodes.push_back(std::move(n));
  return g.nodes.back();
}

Attrs padding1() {
  Attrs a;
  a.set("padding", AttrValue{int64_t{1}});
  return a;
}

// x[1,4,8,8] -> conv c (weight w[8,4,3,3], padding 1) -> silu s -> output s.
Graph small_graph() {
  Graph g;
  add_input(g, "x", {1, 4, 8, 8});
  add_weight(g, "w", {8, 4, 3, 3});
  add_node(g, "c", OpKind::Conv2d, {"x", "w"}, padding1());
  add_node(g, "s", OpKind::Silu, {"c"});
  g.outputs = {"s"};
  return g;
}

// x -> relu a, x -> sigmoid b, add(a, b) -> d; outputs d and a.
Graph diamond() {
  Graph g;
  add_input(g, "x", {2, 3});
  add_node(g, "a", OpKind::Relu, {"x"});
  add_node(g, "b", OpKind::Sigmoid, {"x"});
  add_node(g, "d", OpKind::Add, {"a", "b"});
  g.outputs = {"d", "a"};
  return g;
}

std::vector<std::string> node_names(const Graph& g) {
  std::vector<std::string> names;
  for (const Node& n : g.nodes) names.push_back(n.name);
  return names;
}

// Every node comes after the producers of its inputs.
bool in_topological_order(const Graph& g) {
  std::set<std::string> seen(g.inputs.begin(), g.inputs.end());
  for (const auto& [name, w] : g.weights) seen.insert(name);
  for (const Node& n : g.nodes) {
    for (const std::string& in : n.inputs)
      if (!seen.count(in)) return false;
    for (const std::string& out : n.outputs) seen.insert(out);
  }
  return true;
}

}  // namespace

TEST_CASE("verify: accepts well-formed graphs", "[verify]") {
  Graph g = small_graph();
  REQUIRE_NOTHROW(epilog::verify(g));
  REQUIRE_NOTHROW(epilog::verify(g, "after fuse"));
  REQUIRE_NOTHROW(epilog::verify(diamond()));

  // A multi-output node, a variadic node, an unused weight and an input that is an output.
  Graph m;
  add_input(m, "x", {1, 8, 4, 4});
  add_weight(m, "unused", {3});
  add_node(m, "sp", OpKind::Split, {"x"},
           [] {
             Attrs a;
             a.set("axis", AttrValue{int64_t{1}});
             a.set("sizes", AttrValue{std::vector<int64_t>{2, 6}});
             return a;
           }(),
           {"sp.0", "sp.1"});
  add_node(m, "cat", OpKind::Concat, {"sp.1", "sp.0", "sp.1"}, [] {
    Attrs a;
    a.set("axis", AttrValue{int64_t{1}});
    return a;
  }());
  m.outputs = {"cat", "x", "sp.0"};
  REQUIRE(m.values.at("cat").shape == Shape{1, 14, 4, 4});
  REQUIRE_NOTHROW(epilog::verify(m));

  // An empty graph is well-formed.
  REQUIRE_NOTHROW(epilog::verify(Graph{}));
}

TEST_CASE("verify: dangling and undefined references", "[verify]") {
  SECTION("node input that nothing defines") {
    Graph g = small_graph();
    g.nodes[1].inputs = {"nope"};
    REQUIRE_ERROR(epilog::verify(g), "verify: ", "[silu] node 's': input 'nope' is not defined");
  }
  SECTION("graph output that nothing defines") {
    Graph g = small_graph();
    g.outputs.push_back("ghost");
    REQUIRE_ERROR(epilog::verify(g), "graph output 'ghost' is not defined");
  }
  SECTION("the stage is named") {
    Graph g = small_graph();
    g.outputs.push_back("ghost");
    REQUIRE_ERROR(epilog::verify(g, "after fuse"), "verify (after fuse): graph output 'ghost'");
  }
  SECTION("output listed twice") {
    Graph g = small_graph();
    g.outputs = {"s", "c", "s"};
    REQUIRE_ERROR(epilog::verify(g), "graph output 's' is listed twice");
  }
}

TEST_CASE("verify: duplicate names", "[verify]") {
  SECTION("two nodes with the same name") {
    Graph g = small_graph();
    add_node(g, "s", OpKind::Relu, {"c"}, {}, {"r"});
    REQUIRE_ERROR(epilog::verify(g), "duplicate node name 's'");
  }
  SECTION("node output named like a graph input") {
    Graph g = small_graph();
    g.nodes[1].outputs = {"x"};
    g.values.erase("s");
    g.outputs = {"x"};
    REQUIRE_ERROR(epilog::verify(g), "duplicate name 'x'", "graph input", "node 's'");
  }
  SECTION("node output named like a weight") {
    Graph g = small_graph();
    g.nodes[1].outputs = {"w"};
    g.values.erase("s");
    g.outputs = {"w"};
    REQUIRE_ERROR(epilog::verify(g), "duplicate name 'w'", "weight", "node 's'");
  }
  SECTION("two nodes with the same output") {
    Graph g = small_graph();
    add_node(g, "s2", OpKind::Relu, {"c"}, {}, {"s"});
    REQUIRE_ERROR(epilog::verify(g), "duplicate name 's': defined by node 's' and by node 's2'");
  }
  SECTION("weight named like a graph input") {
    Graph g = small_graph();
    g.weights["x"] = {Tensor::zeros({1, 4, 8, 8}), std::nullopt};
    REQUIRE_ERROR(epilog::verify(g), "duplicate name 'x': defined by graph input and by weight");
  }
  SECTION("the same graph input twice") {
    Graph g = small_graph();
    g.inputs.push_back("x");
    REQUIRE_ERROR(epilog::verify(g), "duplicate name 'x'", "graph input");
  }
  SECTION("a node with two equal outputs") {
    Graph g;
    add_input(g, "x", {1, 8, 4, 4});
    Attrs a;
    a.set("axis", AttrValue{int64_t{1}});
    a.set("sizes", AttrValue{std::vector<int64_t>{4, 4}});
    add_node(g, "sp", OpKind::Split, {"x"}, a, {"y", "y"});
    g.outputs = {"y"};
    REQUIRE_ERROR(epilog::verify(g), "duplicate name 'y'", "node 'sp'");
  }
  SECTION("empty value name") {
    Graph g = small_graph();
    g.inputs.push_back("");
    g.values[""] = {{1}};
    REQUIRE_ERROR(epilog::verify(g), "empty name");
  }
}

TEST_CASE("verify: cycles and node order", "[verify]") {
  SECTION("two nodes feeding each other") {
    Graph g;
    add_input(g, "x", {2, 3});
    g.values["a"] = {{2, 3}};
    g.values["b"] = {{2, 3}};
    g.nodes.push_back({"a", OpKind::Relu, {}, {"b"}, {"a"}});
    g.nodes.push_back({"b", OpKind::Sigmoid, {}, {"a"}, {"b"}});
    g.outputs = {"b"};
    REQUIRE_ERROR(epilog::verify(g), "cycle");
    REQUIRE_ERROR(epilog::verify(g, "after fuse"), "verify (after fuse)", "cycle");
  }
  SECTION("a node reading its own output") {
    Graph g = small_graph();
    g.nodes[1].inputs = {"s"};
    REQUIRE_ERROR(epilog::verify(g), "cycle", "'s'");
  }
  SECTION("a longer cycle behind a valid prefix") {
    Graph g = small_graph();
    // c -> r1 -> r2 -> r3 -> r1 (r1 reads r3's output)
    add_node(g, "r1", OpKind::Relu, {"c"});
    add_node(g, "r2", OpKind::Relu, {"r1"});
    add_node(g, "r3", OpKind::Relu, {"r2"});
    g.nodes[2].inputs = {"r3"};
    REQUIRE_ERROR(epilog::verify(g), "cycle");
  }
  SECTION("out of order without a cycle") {
    Graph g = small_graph();
    std::swap(g.nodes[0], g.nodes[1]);
    REQUIRE_ERROR(epilog::verify(g),
                  "[silu] node 's': input 'c' is used before node order defines it");
  }
}

TEST_CASE("verify: arity and attributes", "[verify]") {
  SECTION("too many inputs") {
    Graph g = small_graph();
    g.nodes[1].inputs = {"c", "c"};
    REQUIRE_ERROR(epilog::verify(g), "verify: ", "[silu] node 's': has 2 inputs, expected 1");
  }
  SECTION("too few inputs") {
    Graph g = small_graph();
    g.nodes[0].inputs = {"x"};
    REQUIRE_ERROR(epilog::verify(g), "[conv2d] node 'c': has 1 inputs, expected 2 to 3");
  }
  SECTION("one output too many") {
    Graph g = small_graph();
    g.nodes[1].outputs.push_back("s.extra");
    g.values["s.extra"] = {{1, 8, 8, 8}};
    REQUIRE_ERROR(epilog::verify(g), "[silu] node 's': has 2 outputs, expected 1");
  }
  SECTION("no outputs") {
    Graph g = small_graph();
    g.nodes[1].outputs.clear();
    g.values.erase("s");
    g.outputs.clear();
    REQUIRE_ERROR(epilog::verify(g), "[silu] node 's': has 0 outputs, expected 1");
  }
  SECTION("an attribute missing") {
    Graph g = small_graph();
    Attrs a;
    for (const auto& [name, v] : g.nodes[0].attrs.all())
      if (name != "groups") a.set(name, v);
    g.nodes[0].attrs = a;
    REQUIRE_ERROR(epilog::verify(g), "[conv2d] node 'c': attributes are not normalized");
  }
  SECTION("a scalar where the table wants a list") {
    Graph g = small_graph();
    g.nodes[0].attrs.set("stride", AttrValue{int64_t{1}});
    REQUIRE_ERROR(epilog::verify(g), "[conv2d] node 'c': attributes are not normalized");
  }
  SECTION("an unknown attribute") {
    Graph g = small_graph();
    g.nodes[1].attrs.set("alpha", AttrValue{1.0});
    REQUIRE_ERROR(epilog::verify(g), "verify: ", "[silu] node 's'", "unknown attribute 'alpha'");
  }
  SECTION("an attribute of the wrong type") {
    Graph g = small_graph();
    g.nodes[0].attrs.set("groups", AttrValue{std::string("1")});
    REQUIRE_ERROR(epilog::verify(g), "[conv2d] node 'c'", "attribute 'groups' must be int");
  }
}

TEST_CASE("verify: shapes", "[verify]") {
  SECTION("recorded output shape differs from the inferred one") {
    Graph g = small_graph();
    g.values["c"] = {{1, 8, 4, 4}};
    REQUIRE_ERROR(epilog::verify(g),
                  "[conv2d] node 'c': output 'c' is recorded as [1,8,4,4] but infers to [1,8,8,8]");
  }
  SECTION("a changed input shape no longer matches what follows") {
    Graph g = small_graph();
    g.values["x"] = {{1, 4, 16, 16}};
    REQUIRE_ERROR(epilog::verify(g), "[conv2d] node 'c'", "recorded as [1,8,8,8]",
                  "infers to [1,8,16,16]");
  }
  SECTION("shape inference itself fails") {
    Graph g = small_graph();
    g.values["x"] = {{1, 3, 8, 8}};
    REQUIRE_ERROR(epilog::verify(g, "after load"), "verify (after load): ", "[conv2d] node 'c'",
                  "input has 3 channels");
  }
  SECTION("weight tensor shape differs from its value") {
    Graph g = small_graph();
    g.weights["w"].data = Tensor::zeros({8, 4, 1, 1});
    REQUIRE_ERROR(epilog::verify(g), "weight 'w' holds [8,4,1,1] but its value says [8,4,3,3]");
  }
  SECTION("weight without data") {
    Graph g = small_graph();
    g.weights["w"].data = Tensor();
    REQUIRE_ERROR(epilog::verify(g), "weight 'w' has no data");
  }
  SECTION("a value with a shape that nothing defines") {
    Graph g = small_graph();
    g.values["orphan"] = {{3}};
    REQUIRE_ERROR(epilog::verify(g), "value 'orphan' has a shape but nothing defines it");
  }
  SECTION("a defined value without a shape") {
    Graph g = small_graph();
    g.values.erase("c");
    REQUIRE_ERROR(epilog::verify(g), "value 'c' (defined by node 'c') has no shape");
  }
  SECTION("a weight without a shape") {
    Graph g = small_graph();
    g.values.erase("w");
    REQUIRE_ERROR(epilog::verify(g), "value 'w' (defined by weight) has no shape");
  }
}

TEST_CASE("verify: toposort reorders out-of-order graphs", "[verify]") {
  SECTION("graphs already in order keep their order") {
    Graph g = diamond();
    epilog::toposort(g);
    REQUIRE(node_names(g) == std::vector<std::string>{"a", "b", "d"});
    // Another valid order of the same graph is kept too.
    std::swap(g.nodes[0], g.nodes[1]);
    epilog::toposort(g);
    REQUIRE(node_names(g) == std::vector<std::string>{"b", "a", "d"});
  }
  SECTION("a consumer before its producer") {
    Graph g = small_graph();
    Graph sorted = g;
    std::swap(g.nodes[0], g.nodes[1]);
    REQUIRE_THROWS(epilog::verify(g));
    epilog::toposort(g);
    REQUIRE(node_names(g) == std::vector<std::string>{"c", "s"});
    REQUIRE(g.nodes == sorted.nodes);
    REQUIRE_NOTHROW(epilog::verify(g));
  }
  SECTION("fully reversed chain") {
    Graph g = small_graph();
    add_node(g, "r1", OpKind::Relu, {"s"});
    add_node(g, "r2", OpKind::Sigmoid, {"r1"});
    add_node(g, "r3", OpKind::Relu, {"r2"});
    g.outputs = {"r3"};
    std::reverse(g.nodes.begin(), g.nodes.end());
    epilog::toposort(g);
    REQUIRE(node_names(g) == std::vector<std::string>{"c", "s", "r1", "r2", "r3"});
    REQUIRE_NOTHROW(epilog::verify(g));
  }
  SECTION("independent nodes keep their relative order") {
    // d (reads a and b) listed first; a and b independent, listed b then a.
    Graph g = diamond();
    g.nodes = {g.nodes[2], g.nodes[1], g.nodes[0]};
    epilog::toposort(g);
    REQUIRE(in_topological_order(g));
    REQUIRE(g.nodes.size() == 3);
    REQUIRE(g.nodes[2].name == "d");
    REQUIRE_NOTHROW(epilog::verify(g));
    // A node nothing depends on stays where it was relative to the other roots.
    Graph h = diamond();
    add_node(h, "e", OpKind::Relu, {"x"});
    std::swap(h.nodes[0], h.nodes[2]);  // d, b, a, e
    epilog::toposort(h);
    REQUIRE(in_topological_order(h));
    REQUIRE(h.nodes.back().name == "e");
  }
  SECTION("a cycle throws and leaves the graph as it was") {
    Graph g;
    add_input(g, "x", {2, 3});
    g.values["a"] = {{2, 3}};
    g.values["b"] = {{2, 3}};
    g.nodes.push_back({"a", OpKind::Relu, {}, {"b"}, {"a"}});
    g.nodes.push_back({"b", OpKind::Relu, {}, {"a"}, {"b"}});
    std::vector<Node> before = g.nodes;
    REQUIRE_ERROR(epilog::toposort(g),
                  "cycle through node 'a': its output 'a', read by node 'b', depends on itself");
    REQUIRE(g.nodes == before);
  }
  SECTION("a self-loop throws naming the node") {
    Graph g = small_graph();
    g.nodes[1].inputs = {"s"};
    REQUIRE_ERROR(epilog::toposort(g), "cycle", "node 's'");
  }
  SECTION("inputs that nothing produces are no obstacle") {
    Graph g = small_graph();
    g.nodes[1].inputs = {"nope"};
    REQUIRE_NOTHROW(epilog::toposort(g));
    REQUIRE(node_names(g) == std::vector<std::string>{"c", "s"});
  }
}

TEST_CASE("verify: UseIndex producers and consumers", "[verify]") {
  Graph g = diamond();
  // e = mul(a, a): a is read twice by e.
  add_node(g, "e", OpKind::Mul, {"a", "a"});
  epilog::UseIndex uses(g);
  REQUIRE(uses.producer("x") == -1);
  REQUIRE(uses.producer("a") == 0);
  REQUIRE(uses.producer("b") == 1);
  REQUIRE(uses.producer("d") == 2);
  REQUIRE(uses.producer("e") == 3);
  REQUIRE(uses.producer("nope") == -1);
  REQUIRE(uses.consumers("x") == std::vector<int>{0, 1});
  REQUIRE(uses.consumers("a") == std::vector<int>{2, 3, 3});
  REQUIRE(uses.consumers("b") == std::vector<int>{2});
  REQUIRE(uses.consumers("d").empty());
  REQUIRE(uses.consumers("nope").empty());

  Graph s = small_graph();
  epilog::UseIndex su(s);
  REQUIRE(su.producer("w") == -1);
  REQUIRE(su.consumers("w") == std::vector<int>{0});
  REQUIRE(su.producer("s") == 1);
  REQUIRE(su.consumers("c") == std::vector<int>{1});
}

TEST_CASE("verify: infer_graph_shapes recomputes every output", "[verify]") {
  Graph g = small_graph();
  g.values["x"] = {{2, 4, 16, 16}};
  g.values["c"] = {{9}};
  g.values["s"] = {{9}};
  REQUIRE_THROWS(epilog::verify(g));
  epilog::infer_graph_shapes(g);
  REQUIRE(g.values.at("c").shape == Shape{2, 8, 16, 16});
  REQUIRE(g.values.at("s").shape == Shape{2, 8, 16, 16});
  REQUIRE_NOTHROW(epilog::verify(g));

  Graph bad = small_graph();
  bad.values["x"] = {{2, 5, 16, 16}};
  REQUIRE_ERROR(epilog::infer_graph_shapes(bad), "[conv2d] node 'c'", "input has 5 channels");

  Graph dangling = small_graph();
  dangling.nodes[1].inputs = {"nope"};
  REQUIRE_ERROR(epilog::infer_graph_shapes(dangling),
                "[silu] node 's': input 'nope' is not defined");

  Graph outs = small_graph();
  outs.nodes[1].outputs.push_back("s2");
  REQUIRE_ERROR(epilog::infer_graph_shapes(outs), "[silu] node 's': has 2 outputs, expected 1");
}

TEST_CASE("verify: Graph queries", "[verify]") {
  Graph g = small_graph();
  REQUIRE(g.value("c").shape == Shape{1, 8, 8, 8});
  REQUIRE(g.value("w").shape == Shape{8, 4, 3, 3});
  REQUIRE_ERROR(g.value("nope"), "no value named 'nope'");
  REQUIRE(g.is_input("x"));
  REQUIRE_FALSE(g.is_input("s"));
  REQUIRE(g.is_output("s"));
  REQUIRE_FALSE(g.is_output("c"));
  REQUIRE(g.is_weight("w"));
  REQUIRE_FALSE(g.is_weight("x"));
  REQUIRE(g.find_node("c") != nullptr);
  REQUIRE(g.find_node("c")->op == OpKind::Conv2d);
  REQUIRE(g.find_node("nope") == nullptr);
  auto counts = g.op_counts();
  REQUIRE(counts.size() == 2);
  REQUIRE(counts[OpKind::Conv2d] == 1);
  REQUIRE(counts[OpKind::Silu] == 1);
}
