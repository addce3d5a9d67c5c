// Structural reparameterization: the convs an add tree sums over one value become one conv
// (RepVGG's 3x3 + 1x1 + identity branches, ACNet's 3x3 + 1x3 + 3x1, RepGhost's conv + identity).
#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "epilog/graph/passes.h"

namespace epilog {
namespace {

const char* const kRule = "add(conv2d,conv2d,...)->conv2d";

// An operand of the add tree: conv2d(x), batchnorm(conv2d(x)), batchnorm(x), x, or anything
// else, which stays an operand of the add.
struct Branch {
  std::string value;
  int conv = -1, bn = -1;  // node indices; neither for x itself
  std::string input;       // x: what the conv or the batchnorm reads, else the value itself
};

// Whether an add's output belongs to the tree of the add that reads it.
bool inner(const Graph& g, const UseIndex& uses, const std::string& value) {
  const std::vector<int>& readers = uses.consumers(value);
  return !g.is_output(value) && readers.size() == 1 && g.nodes[readers[0]].op == OpKind::Add;
}

// The adds of the tree at `add`, and their operands in order.
void collect(const Graph& g, const UseIndex& uses, int add, std::vector<int>& adds,
             std::vector<std::string>& operands) {
  adds.push_back(add);
  for (const std::string& in : g.nodes[add].inputs) {
    const int p = uses.producer(in);
    if (p >= 0 && g.nodes[p].op == OpKind::Add && inner(g, uses, in))
      collect(g, uses, p, adds, operands);
    else
      operands.push_back(in);
  }
}

// What an operand is, read backwards: [batchnorm(] [conv2d(] input [)] [)].
Branch classify(const Graph& g, const UseIndex& uses, const std::string& value) {
  Branch b{value, -1, -1, value};
  int p = uses.producer(value);
  if (p >= 0 && g.nodes[p].op == OpKind::BatchNorm) {
    b.bn = p;
    b.input = g.nodes[p].inputs[0];
    p = uses.producer(b.input);
  }
  if (p >= 0 && g.nodes[p].op == OpKind::Conv2d) {
    b.conv = p;
    b.input = g.nodes[p].inputs[0];
  }
  return b;
}

std::string describe(const Graph& g, const Node& conv) {
  const Shape& w = g.value(conv.inputs[1]).shape;
  return fmt::format("'{}' ({}x{}, padding {})", conv.name, w[2], w[3],
                     fmt::join(conv.attrs.ints("padding"), ","));
}

// Row and column of the big conv's kernel where the branch's first tap lands: the branch reads
// input row o * stride - pad + i * dilation for its tap i, so the offset is (big pad - pad) /
// dilation. The identity branch is a 1x1 kernel without padding. None where the taps fall
// between the big kernel's or outside it. With equal output shapes (checked) the top and left
// padding decide it; the rest only sets the output size.
std::optional<std::array<int64_t, 2>> origin(const Graph& g, const Node& big, const Branch& b) {
  const Shape& window = g.value(big.inputs[1]).shape;
  const std::vector<int64_t>& pad = big.attrs.ints("padding");
  const std::vector<int64_t>& dilation = big.attrs.ints("dilation");
  std::array<int64_t, 2> at{};
  for (int a = 0; a < 2; ++a) {
    int64_t k = 1, p = 0;
    if (b.conv >= 0) {
      k = g.value(g.nodes[b.conv].inputs[1]).shape[2 + a];
      p = g.nodes[b.conv].attrs.ints("padding")[a];
    }
    const int64_t shift = pad[a] - p;
    if (shift < 0 || shift % dilation[a] != 0 || shift / dilation[a] + k > window[2 + a])
      return std::nullopt;
    at[a] = shift / dilation[a];
  }
  return at;
}

struct Plan {
  Match match;                    // the adds of the tree (root first), the merged convs and bns
  std::vector<Branch> merged;     // the branches on x, every one a conv or an identity
  std::vector<std::string> rest;  // the operands the add keeps
  std::string x;
  int big = -1;  // the conv whose window holds every other branch's taps
};

// Fills the plan for the add tree at `root`; returns why it cannot merge. An empty reason with
// nothing merged: no two branches to merge, nothing to say.
std::string plan(const Graph& g, const UseIndex& uses, int root, const KernelQuery& has_kernel,
                 Plan& p) {
  std::vector<int> adds;
  std::vector<std::string> operands;
  collect(g, uses, root, adds, operands);
  std::vector<Branch> branches;
  std::map<std::string, int> convs_of, bns_of;  // x -> the convs, the batchnorms that read it
  int convs = 0;
  for (const std::string& v : operands) {
    const Branch& b = branches.emplace_back(classify(g, uses, v));
    if (b.conv >= 0) ++convs, ++convs_of[b.input];
    if (b.bn >= 0) ++bns_of[g.nodes[b.bn].inputs[0]];
  }
  // x: the value most convs read, where two do; else one conv's input that a batchnorm also
  // reads, an identity branch (RepGhost's dw conv + batchnorm).
  const auto most =
      std::max_element(convs_of.begin(), convs_of.end(),
                       [](const auto& a, const auto& b) { return a.second < b.second; });
  if (most != convs_of.end() && most->second >= 2) {
    p.x = most->first;
  } else {
    for (const auto& [x, n] : convs_of)
      if (bns_of.count(x)) p.x = x;
    if (p.x.empty() && convs < 2) return "";
    if (p.x.empty()) {
      std::vector<std::string> xs;
      for (const auto& [x, n] : convs_of) xs.push_back("'" + x + "'");
      return fmt::format("the convs read different values ({})", fmt::join(xs, ", "));
    }
  }
  for (Branch b : branches) {
    if (b.value == p.x) {
      b = Branch{b.value, -1, -1, p.x};
    } else if (b.bn >= 0 && g.nodes[b.bn].inputs[0] == p.x) {  // x may itself be a conv's
      b.conv = -1;
      b.input = p.x;
    }
    if (b.input == p.x)
      p.merged.push_back(b);
    else
      p.rest.push_back(b.value);
  }

  for (const Branch& b : p.merged) {
    for (int idx : {b.conv, b.bn}) {
      if (idx < 0) continue;
      const Node& n = g.nodes[idx];
      for (size_t i = 1; i < n.inputs.size(); ++i)
        if (!g.is_weight(n.inputs[i]))
          return fmt::format("{} '{}' of '{}' is computed, not a constant",
                             op_info(n.op).input_name(i), n.inputs[i], n.name);
    }
    if (b.conv < 0) continue;
    const Node& c = g.nodes[b.conv];
    if (p.big < 0) {
      p.big = b.conv;
      continue;
    }
    const Node& first = g.nodes[p.big];
    for (const char* attr : {"stride", "dilation"})
      if (c.attrs.ints(attr) != first.attrs.ints(attr))
        return fmt::format("'{}' has {} {} and '{}' {}", c.name, attr,
                           fmt::join(c.attrs.ints(attr), "x"), first.name,
                           fmt::join(first.attrs.ints(attr), "x"));
    if (c.attrs.i("groups") != first.attrs.i("groups"))
      return fmt::format("'{}' has {} groups and '{}' {}", c.name, c.attrs.i("groups"), first.name,
                         first.attrs.i("groups"));
    const auto area = [&](const Node& n) {
      const Shape& w = g.value(n.inputs[1]).shape;
      return w[2] * w[3];
    };
    if (area(c) > area(first)) p.big = b.conv;
  }

  const Node& big = g.nodes[p.big];
  const Shape& y = g.value(g.nodes[root].outputs[0]).shape;
  for (const Branch& b : p.merged) {
    const int64_t in = g.value(p.x).shape[1], out = g.value(big.inputs[1]).shape[0];
    if (b.conv < 0 && (big.attrs.ints("stride") != std::vector<int64_t>{1, 1} || in != out))
      return fmt::format(
          "the identity branch '{}' needs stride 1 and as many channels in as out (stride {}, "
          "{} -> {} channels)",
          b.value, fmt::join(big.attrs.ints("stride"), "x"), in, out);
    if (g.value(b.value).shape != y)
      return fmt::format("'{}' of shape {} is broadcast onto {}", b.value,
                         shape_str(g.value(b.value).shape), shape_str(y));
    if (!origin(g, big, b))
      return fmt::format("{} does not line up inside {}",
                         b.conv >= 0 ? describe(g, g.nodes[b.conv])
                                     : fmt::format("the identity branch '{}'", b.value),
                         describe(g, big));
  }

  p.match.graph = &g;
  p.match.root = root;
  p.match.nodes = adds;
  for (const Branch& b : p.merged)
    for (int idx : {b.conv, b.bn})
      if (idx >= 0) p.match.nodes.push_back(idx);
  // The tree's own reads (an add of its inner adds, a batchnorm of its conv): can_absorb lets
  // nothing else read what disappears.
  std::set<std::string> made;
  for (int idx : p.match.nodes) made.insert(g.nodes[idx].outputs.begin(), g.nodes[idx].outputs.end());
  for (int idx : p.match.nodes)
    for (size_t slot = 0; slot < g.nodes[idx].inputs.size(); ++slot)
      if (made.count(g.nodes[idx].inputs[slot])) p.match.links.insert({idx, slot});
  return can_absorb(g, uses, p.match, OpKind::Conv2d, has_kernel);
}

// One conv2d(x) with the big conv's attributes: kernel = sum of each branch's kernel (the
// identity's a 1 at channel o's own input) times its batchnorm's gamma / sqrt(var + eps), bias =
// sum of (conv bias - mean) * that + beta; in float64, rounded once. The adds keep the rest.
Replacement merge(const Graph& g, const Plan& p) {
  const Node& big = g.nodes[p.big];
  const Node& root = g.nodes[p.match.root];
  const Shape& ws = g.value(big.inputs[1]).shape;  // [out, in / groups, kh, kw]
  const int64_t out = ws[0], per_group = ws[1], kh = ws[2], kw = ws[3];
  std::vector<double> weight(out * per_group * kh * kw, 0.0), bias(out, 0.0);
  const auto at = [&](int64_t o, int64_t c, int64_t i, int64_t j) {
    return ((o * per_group + c) * kh + i) * kw + j;
  };
  for (const Branch& b : p.merged) {
    std::vector<double> scale(out, 1.0), shift(out, 0.0);
    if (b.bn >= 0) {
      const Node& bn = g.nodes[b.bn];
      const auto param = [&](int i) { return g.weights.at(bn.inputs[i]).data.f32(); };
      const float *gamma = param(1), *beta = param(2), *mean = param(3), *var = param(4);
      for (int64_t o = 0; o < out; ++o) {
        scale[o] = double(gamma[o]) / std::sqrt(double(var[o]) + bn.attrs.f("eps"));
        shift[o] = double(beta[o]) - double(mean[o]) * scale[o];
      }
    }
    const std::array<int64_t, 2> o0 = *origin(g, big, b);
    if (b.conv < 0) {
      for (int64_t o = 0; o < out; ++o) weight[at(o, o % per_group, o0[0], o0[1])] += scale[o];
    } else {
      const Node& c = g.nodes[b.conv];
      const Tensor& k = g.weights.at(c.inputs[1]).data;
      const int64_t bh = k.shape()[2], bw = k.shape()[3];
      const float* w = k.f32();
      for (int64_t o = 0; o < out; ++o)
        for (int64_t ci = 0; ci < per_group; ++ci)
          for (int64_t i = 0; i < bh; ++i)
            for (int64_t j = 0; j < bw; ++j)
              weight[at(o, ci, o0[0] + i, o0[1] + j)] +=
                  double(w[((o * per_group + ci) * bh + i) * bw + j]) * scale[o];
      if (c.inputs.size() > 2) {
        const float* cb = g.weights.at(c.inputs[2]).data.f32();
        for (int64_t o = 0; o < out; ++o) bias[o] += double(cb[o]) * scale[o];
      }
    }
    for (int64_t o = 0; o < out; ++o) bias[o] += shift[o];
  }

  Replacement r;
  Tensor tw = Tensor::empty(ws), tb = Tensor::empty({out});
  for (size_t i = 0; i < weight.size(); ++i) tw.f32()[i] = float(weight[i]);
  for (int64_t o = 0; o < out; ++o) tb.f32()[o] = float(bias[o]);
  const std::string wname = g.unique_name(big.name + ".reparam.weight");
  const std::string bname = g.unique_name(big.name + ".reparam.bias");
  r.weights[wname] = tw;
  r.weights[bname] = tb;
  std::string sum = p.rest.empty() ? root.outputs[0] : big.outputs[0];
  r.nodes.push_back(Node{big.name, OpKind::Conv2d, big.attrs, {p.x, wname, bname}, {sum}});
  for (size_t i = 0; i < p.rest.size(); ++i) {
    const bool last = i + 1 == p.rest.size();
    const std::string name =
        last ? root.name : g.unique_name(fmt::format("{}.{}", root.name, i + 1));
    const std::string value = last ? root.outputs[0] : name;
    r.nodes.push_back(
        Node{name, OpKind::Add, normalize_attrs(OpKind::Add, name, {}), {sum, p.rest[i]}, {value}});
    sum = value;
  }
  return r;
}

}  // namespace

RewriteStats reparameterize(Graph& graph, const KernelQuery& has_kernel) {
  RewriteStats stats;
  for (bool changed = true; changed;) {
    changed = false;
    stats.refused.clear();  // as rewrite(): the refusals of the final graph
    const UseIndex uses(graph);
    for (int i = 0; i < static_cast<int>(graph.nodes.size()) && !changed; ++i) {
      const Node& n = graph.nodes[i];
      if (n.op != OpKind::Add || inner(graph, uses, n.outputs[0])) continue;
      Plan p;
      const std::string why = plan(graph, uses, i, has_kernel, p);
      if (!why.empty()) {
        stats.refused[fmt::format("{} at '{}': {}", kRule, n.name, why)]++;
      } else if (!p.merged.empty()) {
        replace_match(graph, p.match, merge(graph, p));
        stats.hits[kRule]++;
        changed = true;
      }
    }
  }
  return stats;
}

}  // namespace epilog
