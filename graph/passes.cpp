// Fusion rules, dead-code elimination and the pass pipeline (the canonicalization rules are in
// canonicalize.cpp).
#include "epilog/graph/passes.h"

#include "epilog/graph/activation.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace epilog {
namespace {

// A batchnorm's statistics and parameters must be constants for a fold at compile time.
std::string bn_constant(const Graph& g, const Node& bn) {
  for (size_t i = 1; i < bn.inputs.size(); ++i)
    if (!g.is_weight(bn.inputs[i]))
      return fmt::format("batchnorm '{}' is not in inference form ({} is computed, not a constant)",
                         bn.name, op_info(OpKind::BatchNorm).input_name(i));
  return "";
}

// The batchnorm (and the conv bias) must be constants for the fold to happen at compile time.
std::string foldable(const Match& m) {
  const Graph& g = *m.graph;
  const Node& conv = m.node("conv");
  if (conv.op == OpKind::FusedConv2d) {
    if (!g.is_weight(conv.inputs[2]) || !g.is_weight(conv.inputs[3]))
      return fmt::format("the scale or shift of '{}' is computed, not a constant", conv.name);
  } else if (conv.inputs.size() > 2 && !g.is_weight(conv.inputs[2])) {
    return fmt::format("the bias of '{}' is computed, not a constant", conv.name);
  }
  const Node* bn = m.find("bn");
  return bn ? bn_constant(g, *bn) : "";
}

// A conv2d, or a fused conv without activation or residual, and the batchnorm after it, if any,
// as one fused_conv2d: with b = gamma / sqrt(var + eps), scale = s * b and shift = beta +
// (t - mean) * b in float64, where s and t are the conv's own (1 and its bias for a conv2d).
Replacement fuse_conv(const Match& m, const Act& act) {
  const Graph& g = *m.graph;
  const Node& conv = m.node("conv");
  const Node* bn = m.find("bn");
  const Node& root = g.nodes[m.root];
  const int64_t k = g.value(conv.inputs[1]).shape[0];
  std::vector<double> scale(k, 1.0), shift(k, 0.0);
  const bool fused = conv.op == OpKind::FusedConv2d;
  if (fused) {
    const float* s = g.weights.at(conv.inputs[2]).data.f32();
    for (int64_t c = 0; c < k; ++c) scale[c] = s[c];
  }
  if (conv.inputs.size() > (fused ? 3 : 2)) {
    const float* bias = g.weights.at(conv.inputs[fused ? 3 : 2]).data.f32();
    for (int64_t c = 0; c < k; ++c) shift[c] = bias[c];
  }
  if (bn) {
    auto param = [&](int i) { return g.weights.at(bn->inputs[i]).data.f32(); };
    const float *gamma = param(1), *beta = param(2), *mean = param(3), *var = param(4);
    double eps = bn->attrs.f("eps");
    for (int64_t c = 0; c < k; ++c) {
      const double b = double(gamma[c]) / std::sqrt(double(var[c]) + eps);
      scale[c] *= b;
      shift[c] = double(beta[c]) + (shift[c] - double(mean[c])) * b;
    }
  }
  Replacement r;
  Tensor ts = Tensor::empty({k}), tb = Tensor::empty({k});
  for (int64_t c = 0; c < k; ++c) {
    ts.f32()[c] = static_cast<float>(scale[c]);
    tb.f32()[c] = static_cast<float>(shift[c]);
  }
  std::string sname = g.unique_name(conv.name + ".scale");
  std::string bname = g.unique_name(conv.name + ".shift");
  r.weights[sname] = ts;
  r.weights[bname] = tb;
  Attrs attrs = conv.attrs;
  set_conv_activation(attrs, act);
  attrs.set("residual_first", int64_t(0));
  r.nodes.push_back(Node{conv.name,
                         OpKind::FusedConv2d,
                         normalize_attrs(OpKind::FusedConv2d, conv.name, attrs),
                         {conv.inputs[0], conv.inputs[1], sname, bname},
                         {root.outputs[0]}});
  return r;
}

// A fused conv that still ends in its scale and shift: no activation yet (a residual it adds
// then comes before whatever activation follows).
std::string bare_epilogue(const Node& conv) {
  if (conv.attrs.s("activation") != "none")
    return fmt::format("'{}' already applies {}", conv.name, conv.attrs.s("activation"));
  return "";
}

// The per-channel constant a mul or add applies to a fused conv's output [n, k, h, w]: a weight
// of k values laid out as [k, 1, 1], [1, k, 1, 1] or a scalar; else the reason it is not one.
std::string per_channel(const Graph& g, const std::string& value, int64_t k) {
  if (!g.is_weight(value)) return fmt::format("'{}' is computed, not a constant", value);
  const Shape& s = g.value(value).shape;
  int64_t n = shape_numel(s);
  if (n == 1) return "";
  // Right-aligned against [n, k, h, w]: the k is third from the back, everything else 1.
  if (n != k || s.size() < 3 || s[s.size() - 3] != k || s.size() > 4)
    return fmt::format("'{}' of shape {} is not one value per channel", value, shape_str(s));
  return "";
}

// The fused conv's scale and shift, the constant c (per_channel) applied to them: both times c
// for a mul, the shift plus c for an add.
Replacement fold_affine(const Match& m, bool mul) {
  const Graph& g = *m.graph;
  Node fused = m.node("conv");
  const int64_t k = g.value(fused.inputs[1]).shape[0];
  const Tensor& c = g.weights.at(m.value("c")).data;
  const auto at = [&](int64_t i) { return double(c.f32()[c.numel() == 1 ? 0 : i]); };
  Tensor ts = g.weights.at(fused.inputs[2]).data.clone(), tb = g.weights.at(fused.inputs[3]).data.clone();
  for (int64_t i = 0; i < k; ++i) {
    if (mul) ts.f32()[i] = float(double(ts.f32()[i]) * at(i));
    tb.f32()[i] = float(mul ? double(tb.f32()[i]) * at(i) : double(tb.f32()[i]) + at(i));
  }
  Replacement r;
  const std::string sname = g.unique_name(fused.name + ".scale");
  const std::string bname = g.unique_name(fused.name + ".shift");
  r.weights[sname] = ts;
  r.weights[bname] = tb;
  fused.inputs[2] = sname;
  fused.inputs[3] = bname;
  fused.outputs = m.node("op").outputs;
  r.nodes.push_back(fused);
  return r;
}

// The unary ops a conv's epilogue takes in (graph/activation.h).
std::vector<OpKind> activation_ops() {
  std::vector<OpKind> ops;
  for (int i = 0; i < kNumOps; ++i)
    if (is_activation_op(OpKind(i))) ops.push_back(OpKind(i));
  return ops;
}

// A linear layer whose weight is a constant as a 1x1 conv over a 1x1 plane, so that it takes the
// one conv path (its bias the shift, the convs' epilogue, the selector's gemv and gemm kernels):
// x [..., k] is viewed as [m, k, 1, 1] and the conv's [m, n, 1, 1] as y [..., n] (reshapes are
// views: no copies).
Replacement linear_as_conv(const Match& m) {
  const Graph& g = *m.graph;
  const Node& lin = m.node("linear");
  const Shape& w = g.value(lin.inputs[1]).shape;
  Replacement r;
  const std::string x4 = g.unique_name(lin.name + ".x"),
                    y4 = g.unique_name(lin.name + ".y");
  const auto reshape = [](const std::string& name, std::vector<int64_t> shape,
                          const std::string& in, const std::string& out) {
    Attrs a;
    a.set("shape", std::move(shape));
    return Node{name, OpKind::Reshape, normalize_attrs(OpKind::Reshape, name, a), {in}, {out}};
  };
  const std::vector<std::string> conv_in = linear_conv_inputs(g, lin, x4, r);
  r.nodes.push_back(reshape(lin.name + ".to_4d", {-1, w[1], 1, 1}, lin.inputs[0], x4));
  r.nodes.push_back(Node{lin.name, OpKind::Conv2d, normalize_attrs(OpKind::Conv2d, lin.name, {}),
                         conv_in, {y4}});
  // Back to x's dims with n features: the batch stays free (-1), the rest as x has them.
  std::vector<int64_t> back(g.value(lin.inputs[0]).shape);
  back.front() = -1;
  back.back() = w[0];
  r.nodes.push_back(reshape(lin.name + ".to_nd", std::move(back), y4, lin.outputs[0]));
  return r;
}

// -- what the conv rules leave: batchnorms before a conv, elementwise chains --

// A batchnorm as y = x * s[c] + t[c] over axis 1: s = gamma / sqrt(var + eps), t = beta -
// mean * s, in float64.
struct Affine {
  std::vector<double> s, t;
};
Affine bn_affine(const Graph& g, const Node& bn) {
  auto param = [&](int i) { return g.weights.at(bn.inputs[size_t(i)]).data.f32(); };
  const float *gamma = param(1), *beta = param(2), *mean = param(3), *var = param(4);
  const int64_t c = g.value(bn.inputs[1]).shape[0];
  Affine a{std::vector<double>(size_t(c)), std::vector<double>(size_t(c))};
  for (int64_t i = 0; i < c; ++i) {
    a.s[size_t(i)] = double(gamma[i]) / std::sqrt(double(var[i]) + bn.attrs.f("eps"));
    a.t[size_t(i)] = double(beta[i]) - double(mean[i]) * a.s[size_t(i)];
  }
  return a;
}

// The batchnorm before a fused conv, in its weights: conv(x * s + t, w) = conv(x, w * s[c]) +
// b[k], b[k] = sum over c, i, j of w[k, c, i, j] * t[c] (input channel c of group k / (K /
// groups)), which the conv's epilogue adds times its scale: shift' = shift + scale * b. All in
// float64, each weight rounded once. Exact where every tap reads x, so not where the conv pads.
std::string input_foldable(const Match& m) {
  const Graph& g = *m.graph;
  const Node &conv = m.node("conv"), &bn = m.node("bn");
  std::string why = bn_constant(g, bn);
  for (size_t i = 1; why.empty() && i < 4; ++i)
    if (!g.is_weight(conv.inputs[i]))
      why = fmt::format("the {} of '{}' is computed, not a constant",
                        op_info(conv.op).input_name(i), conv.name);
  const std::vector<int64_t>& pad = conv.attrs.ints("padding");
  if (why.empty() && std::any_of(pad.begin(), pad.end(), [](int64_t p) { return p != 0; }))
    why = fmt::format(
        "'{}' pads its input ({}), and its padded zeros are not shifted as the batchnorm shifts "
        "'{}': folded into the weights it would not be exact",
        conv.name, fmt::join(pad, ","), bn.inputs[0]);
  return why;
}

Replacement fold_input_bn(const Match& m) {
  const Graph& g = *m.graph;
  Node conv = m.node("conv");
  const Affine a = bn_affine(g, m.node("bn"));
  const Tensor& w = g.weights.at(conv.inputs[1]).data;
  const float *scale = g.weights.at(conv.inputs[2]).data.f32(),
              *shift = g.weights.at(conv.inputs[3]).data.f32();
  const int64_t k = w.dim(0), per_group = w.dim(1), taps = w.numel() / (k * per_group);
  const int64_t k_per_group = k / conv.attrs.i("groups");
  Tensor wf = Tensor::empty(w.shape()), tb = Tensor::empty({k});
  for (int64_t o = 0; o < k; ++o) {
    const int64_t c0 = o / k_per_group * per_group;  // the first input channel of o's group
    double b = 0;
    for (int64_t c = 0; c < per_group; ++c)
      for (int64_t tap = 0; tap < taps; ++tap) {
        const int64_t at = (o * per_group + c) * taps + tap;
        const double v = w.f32()[at];
        wf.f32()[at] = float(v * a.s[size_t(c0 + c)]);
        b += v * a.t[size_t(c0 + c)];
      }
    tb.f32()[o] = float(double(shift[o]) + double(scale[o]) * b);
  }
  Replacement r;
  const std::string wname = g.unique_name(conv.name + ".weight");
  const std::string bname = g.unique_name(conv.name + ".shift");
  r.weights[wname] = wf;
  r.weights[bname] = tb;
  conv.inputs[0] = m.node("bn").inputs[0];
  conv.inputs[1] = wname;
  conv.inputs[3] = bname;
  r.nodes.push_back(conv);
  return r;
}

// The links of an elementwise chain.
bool chain_link(OpKind op) {
  return is_activation_op(op) || binary_kind(op) || op == OpKind::FusedElementwise ||
         op == OpKind::BatchNorm;
}

// Whether a chain could take in the producer of `value` later: a link read by one node alone.
bool link_value(const Graph& g, const std::string& value) {
  if (g.is_output(value)) return false;
  bool made_by_link = false;
  int readers = 0;
  for (const Node& n : g.nodes) {
    made_by_link = made_by_link || (n.outputs[0] == value && chain_link(n.op));
    readers += int(std::count(n.inputs.begin(), n.inputs.end(), value));
  }
  return made_by_link && readers == 1;
}

// The input a node starting a chain takes its running value from: a binary op's second where
// only that one could grow the chain further up.
size_t running_input(const Graph& g, const Node& n) {
  return binary_kind(n.op) && !link_value(g, n.inputs[0]) && link_value(g, n.inputs[1]) ? 1 : 0;
}

// A node of a chain as fused_elementwise's inputs and steps, its running value input `main`;
// a batchnorm is a per-channel scale and shift, two new constants [C, 1, ...] against x.
struct Chain {
  std::vector<std::string> inputs;
  ChainProgram program;
  std::map<std::string, Tensor> weights;
};

Chain chain_of(const Graph& g, const Node& n, size_t main) {
  Chain c;
  ChainProgram& p = c.program;
  c.inputs.push_back(n.inputs[main]);
  if (n.op == OpKind::FusedElementwise) {
    c.inputs = n.inputs;
    p = node_chain(n);
  } else if (std::optional<Act> act = node_activation(n)) {
    p.step[p.steps++].act = *act;
  } else if (std::optional<Binary> op = binary_kind(n.op)) {
    // Which side the running value is on shows only where the operands do not commute.
    c.inputs.push_back(n.inputs[1 - main]);
    const bool commutes = *op == Binary::Add || *op == Binary::Mul;
    p.step[p.steps++] = ChainStep{Act(), *op, 1, main == 1 && !commutes};
  } else {
    EPILOG_ASSERT(n.op == OpKind::BatchNorm, "no chain step for {}", op_name(n.op));
    const Affine a = bn_affine(g, n);
    const int64_t channels = int64_t(a.s.size());
    Shape shape(g.value(n.inputs[0]).shape.size() - 1, 1);
    shape[0] = channels;
    for (const auto& [part, v] : {std::pair{".scale", &a.s}, std::pair{".shift", &a.t}}) {
      Tensor t = Tensor::empty(shape);
      for (int64_t i = 0; i < channels; ++i) t.f32()[i] = float((*v)[size_t(i)]);
      const std::string name = g.unique_name(n.name + part);
      c.weights[name] = t;
      c.inputs.push_back(name);
    }
    p.step[p.steps++] = ChainStep{Act(), Binary::Mul, 1, false};
    p.step[p.steps++] = ChainStep{Act(), Binary::Add, 2, false};
  }
  return c;
}

// The chain of node "first", then the steps of node "last" on its result, their other inputs
// added to the chain's (once each): into `out`, or the reason it cannot be one kernel.
std::string merge_chain(const Match& m, Chain& out) {
  const Graph& g = *m.graph;
  const Node &first = m.node("first"), &last = m.node("last");
  for (const Node* n : {&first, &last}) {
    const std::string why = n->op == OpKind::BatchNorm ? bn_constant(g, *n) : "";
    if (!why.empty()) return why;
  }
  const Shape& y = g.value(last.outputs[0]).shape;
  if (y.size() > size_t(kMaxChainRank))
    return fmt::format("its output {} has more than {} dims", shape_str(y), kMaxChainRank);
  const std::string& mid = first.outputs[0];
  const size_t main =
      size_t(std::find(last.inputs.begin(), last.inputs.end(), mid) - last.inputs.begin());
  out = chain_of(g, first, running_input(g, first));
  Chain tail = chain_of(g, last, main);
  out.weights.insert(tail.weights.begin(), tail.weights.end());
  for (int i = 0; i < tail.program.steps; ++i) {
    ChainStep s = tail.program.step[i];
    if (s.operand >= 0) {
      const std::string& v = tail.inputs[size_t(s.operand)];
      if (v == mid) return fmt::format("'{}' reads '{}' again in a step", last.name, mid);
      auto it = std::find(out.inputs.begin(), out.inputs.end(), v);
      s.operand = int8_t(it - out.inputs.begin());
      if (it == out.inputs.end()) out.inputs.push_back(v);
    }
    if (out.program.steps == kMaxChainSteps)
      return fmt::format("the chain would take more than {} steps", kMaxChainSteps);
    out.program.step[out.program.steps++] = s;
  }
  if (out.inputs.size() > size_t(kMaxChainInputs))
    return fmt::format("the chain would read {} inputs, more than {}", out.inputs.size(),
                       kMaxChainInputs);
  return "";
}

Replacement fuse_chain(const Match& m) {
  Chain c;
  const std::string why = merge_chain(m, c);
  EPILOG_ASSERT(why.empty(), "{}", why);
  const Node& last = m.node("last");
  Attrs attrs;
  attrs.set("program", chain_str(c.program));
  return Replacement{
      {Node{last.name, OpKind::FusedElementwise,
            normalize_attrs(OpKind::FusedElementwise, last.name, attrs), c.inputs, last.outputs}},
      std::move(c.weights)};
}

}  // namespace

std::string linear_constants(const Graph& g, const Node& linear) {
  if (!g.is_weight(linear.inputs[1]))
    return fmt::format("the weight of '{}' is computed, not a constant", linear.name);
  if (linear.inputs.size() > 2 && !g.is_weight(linear.inputs[2]))
    return fmt::format("the bias of '{}' is computed, not a constant", linear.name);
  return "";
}

std::vector<std::string> linear_conv_inputs(const Graph& g, const Node& linear,
                                            const std::string& x, Replacement& r) {
  const Shape& w = g.value(linear.inputs[1]).shape;
  const std::string name = g.unique_name(linear.inputs[1] + ".1x1");
  r.weights[name] = g.weights.at(linear.inputs[1]).data.clone().reshape({w[0], w[1], 1, 1});
  std::vector<std::string> ins{x, name};
  if (linear.inputs.size() > 2) ins.push_back(linear.inputs[2]);
  return ins;
}

std::vector<Rule> fusion_rules() {
  const Pat conv = op(OpKind::Conv2d, {}, "conv");
  const Pat bn = op(OpKind::BatchNorm, {conv}, "bn");
  const Pat fused = op(OpKind::FusedConv2d, {}, "conv");
  std::vector<Rule> rules;
  rules.push_back({"linear->conv2d(1x1)", op(OpKind::Linear, {}, "linear"), OpKind::Conv2d,
                   [](const Match& m) { return linear_constants(*m.graph, m.node("linear")); },
                   linear_as_conv});
  // The activation attribute of fused_conv2d is the activation op's own name.
  for (OpKind kind : activation_ops()) {
    const std::string name = op_name(kind);
    // An activation after a view (reshape, flatten) runs before it instead, where it meets the
    // op that made the values: act(reshape(y)) == reshape(act(y)). Linear layers need it (their
    // conv's output is reshaped back to 2-D before the activation).
    for (OpKind view : {OpKind::Reshape, OpKind::Flatten})
      rules.push_back({std::string(op_name(view)) + "->" + name,
                       op(kind, {op(view, {any("x")}, "layout")}, "act"), kind, nullptr,
                       activation_first});
    const auto apply = [](const Match& m) { return fuse_conv(m, *node_activation(m.node("act"))); };
    rules.push_back({"conv2d->batchnorm->" + name, op(kind, {bn}, "act"), OpKind::FusedConv2d,
                     foldable, apply});
    rules.push_back(
        {"conv2d->" + name, op(kind, {conv}, "act"), OpKind::FusedConv2d, foldable, apply});
    // A fused conv without an activation takes one in: a residual it adds comes first then
    // (ResNet's relu(bn(conv(x)) + x), exported with the batchnorm folded into the conv).
    rules.push_back({"fused_conv2d->" + name, op(kind, {fused}, "act"), OpKind::FusedConv2d,
                     [](const Match& m) { return bare_epilogue(m.node("conv")); },
                     [](const Match& m) {
                       Node f = m.node("conv");
                       set_conv_activation(f.attrs, *node_activation(m.node("act")));
                       if (f.inputs.size() > 4) f.attrs.set("residual_first", int64_t(1));
                       f.outputs = m.node("act").outputs;
                       return Replacement{{f}, {}};
                     }});
  }
  rules.push_back({"conv2d->batchnorm", bn, OpKind::FusedConv2d, foldable,
                   [](const Match& m) { return fuse_conv(m, Act()); }});
  // A residual add goes into the same epilogue: after the activation (x + block(x)), or, where
  // the conv has none yet, before whatever activation comes next. It only matches once the
  // chain before it is fused, which the rewriter's repeat gets to.
  rules.push_back({"fused_conv2d->add",
                   op(OpKind::Add, {fused, any("residual")}, "add"), OpKind::FusedConv2d,
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
                     fused.attrs.set("residual_first", int64_t(bare_epilogue(fused).empty()));
                     fused.outputs = m.node("add").outputs;
                     return Replacement{{fused}, {}};
                   }});
  // A batchnorm after a conv that was fused alone (its output read elsewhere when it was
  // first fused, say): what conv2d->batchnorm would have done.
  rules.push_back({"fused_conv2d->batchnorm", op(OpKind::BatchNorm, {fused}, "bn"),
                   OpKind::FusedConv2d,
                   [](const Match& m) {
                     const Node& conv = m.node("conv");
                     if (conv.inputs.size() > 4)
                       return fmt::format("'{}' already adds a residual", conv.name);
                     std::string why = bare_epilogue(conv);
                     return why.empty() ? foldable(m) : why;
                   },
                   [](const Match& m) { return fuse_conv(m, Act()); }});
  // A per-channel constant scale or offset after the conv (a batchnorm some exporter spelled as
  // mul and add, a layer scale) joins its scale and shift.
  for (OpKind kind : {OpKind::Mul, OpKind::Add}) {
    const bool mul = kind == OpKind::Mul;
    rules.push_back({std::string("fused_conv2d->") + (mul ? "mul" : "add") + "(per channel)",
                     op(kind, {fused, any("c")}, "op"), OpKind::FusedConv2d,
                     [](const Match& m) -> std::string {
                       const Node& conv = m.node("conv");
                       if (conv.inputs.size() > 4)
                         return fmt::format("'{}' already adds a residual", conv.name);
                       std::string why = bare_epilogue(conv);
                       if (why.empty())
                         why = per_channel(*m.graph, m.value("c"),
                                           m.graph->value(conv.inputs[1]).shape[0]);
                       return why.empty() ? foldable(m) : why;
                     },
                     [mul](const Match& m) { return fold_affine(m, mul); }});
  }
  // Last, every conv left: one conv path, whatever follows it. Its bias is the shift.
  rules.push_back({"conv2d", conv, OpKind::FusedConv2d, foldable,
                   [](const Match& m) { return fuse_conv(m, Act()); }});
  return rules;
}

std::vector<Rule> input_fold_rules() {
  return {{"batchnorm->fused_conv2d",
           op(OpKind::FusedConv2d, {op(OpKind::BatchNorm, {}, "bn")}, "conv"), OpKind::FusedConv2d,
           input_foldable, fold_input_bn}};
}

std::vector<Rule> elementwise_rules() {
  std::vector<OpKind> binary, links;
  for (int i = 0; i < kNumOps; ++i) {
    if (binary_kind(OpKind(i))) binary.push_back(OpKind(i));
    if (chain_link(OpKind(i))) links.push_back(OpKind(i));
  }
  const Pat first = one_of(links, {}, "first");
  const auto check = [](const Match& m) {
    Chain c;
    return merge_chain(m, c);
  };
  // The running value goes on through input 0 of any link, or input 1 of a binary op.
  return {{"elementwise chain", one_of(links, {first}, "last"), OpKind::FusedElementwise, check,
           fuse_chain},
          {"elementwise chain", one_of(binary, {any(), first}, "last"), OpKind::FusedElementwise,
           check, fuse_chain}};
}

namespace {

// A grouped conv runs on the scalar kernels; a group this wide runs faster as a conv of its own
// on gemm: its reduction (input channels x taps) at least the gemm threshold, at least
// kSplitMinGroupCout outputs (the wgmma direct kernel's minimum), and at most kMaxSplitGroups
// launches. ResNeSt-14d at batch 16 (H100): its radix convs (2 groups of 64 to 512 channels)
// took 2.98 ms each on the scalar kernel. perf-history: "wide groups split".
constexpr int64_t kMaxSplitGroups = 8;
constexpr int64_t kSplitMinGroupReduction = 16;
constexpr int64_t kSplitMinGroupCout = 32;

// Whether a conv's groups are each wide enough for gemm (the others, depthwise convs among them,
// are no candidates: lowering's explain says why they run grouped).
bool wide(const Graph& g, const Node& conv) {
  const int64_t groups = conv.attrs.i("groups");
  const Shape& w = g.value(conv.inputs[1]).shape;  // [Cout, Cin / groups, R, S]
  return groups >= 2 && w[1] * w[2] * w[3] >= kSplitMinGroupReduction &&
         w[0] / groups >= kSplitMinGroupCout;
}

// Why a conv of wide groups stays one, or "".
std::string splittable(const Match& m) {
  const Graph& g = *m.graph;
  const Node& conv = m.node("conv");
  const int64_t groups = conv.attrs.i("groups");
  if (groups > kMaxSplitGroups)
    return fmt::format("{} groups, more than {} launches", groups, kMaxSplitGroups);
  for (size_t i = 1; i < 4; ++i)
    if (!g.is_weight(conv.inputs[i])) return fmt::format("'{}' is computed", conv.inputs[i]);
  return "";
}

// Rows [i * n, (i + 1) * n) of t's dim 0.
Tensor rows_of(const Tensor& t, int64_t i, int64_t n) {
  Shape s = t.shape();
  s[0] = n;
  Tensor out = Tensor::empty(s);
  const int64_t per = shape_numel(s);
  std::copy(t.f32() + i * per, t.f32() + (i + 1) * per, out.f32());
  return out;
}

Replacement split_groups(const Match& m) {
  const Graph& g = *m.graph;
  const Node& conv = m.node("conv");
  const int64_t groups = conv.attrs.i("groups");
  const int64_t cin = g.value(conv.inputs[1]).shape[1], cout = g.value(conv.inputs[1]).shape[0];
  const bool residual = conv.inputs.size() > 4;
  Replacement r;
  // A split of `value` on the channels into `groups` parts of `each`: the parts' names.
  const auto split = [&](const std::string& value, int64_t each, const std::string& what) {
    Attrs a;
    a.set("axis", int64_t(1));
    a.set("sizes", std::vector<int64_t>(size_t(groups), each));
    const std::string name = g.unique_name(conv.name + "." + what);
    std::vector<std::string> parts;
    for (int64_t i = 0; i < groups; ++i)
      parts.push_back(g.unique_name(fmt::format("{}.{}", name, i)));
    r.nodes.push_back(Node{name, OpKind::Split, normalize_attrs(OpKind::Split, name, a), {value},
                           parts});
    return parts;
  };
  const std::vector<std::string> xs = split(conv.inputs[0], cin, "groups");
  const std::vector<std::string> rs =
      residual ? split(conv.inputs[4], cout / groups, "residuals") : std::vector<std::string>{};
  Attrs attrs = conv.attrs;
  attrs.set("groups", int64_t(1));
  std::vector<std::string> ys;
  for (int64_t i = 0; i < groups; ++i) {
    const std::string name = g.unique_name(fmt::format("{}.g{}", conv.name, i));
    std::vector<std::string> in{xs[size_t(i)]};
    for (size_t k = 1; k < 4; ++k) {
      const std::string w = g.unique_name(fmt::format("{}.{}", name, k == 1   ? "weight"
                                                                      : k == 2 ? "scale"
                                                                               : "shift"));
      r.weights[w] = rows_of(g.weights.at(conv.inputs[k]).data, i, cout / groups);
      in.push_back(w);
    }
    if (residual) in.push_back(rs[size_t(i)]);
    ys.push_back(g.unique_name(name + ".y"));
    r.nodes.push_back(Node{name, OpKind::FusedConv2d,
                           normalize_attrs(OpKind::FusedConv2d, name, attrs), in, {ys.back()}});
  }
  Attrs cat;
  cat.set("axis", int64_t(1));
  const std::string name = g.unique_name(conv.name + ".concat");
  r.nodes.push_back(Node{name, OpKind::Concat, normalize_attrs(OpKind::Concat, name, cat), ys,
                         conv.outputs});
  return r;
}

}  // namespace

// Not a rewrite() rule: that would report every ungrouped conv as a refusal.
RewriteStats split_wide_groups(Graph& graph, const KernelQuery& has_kernel) {
  const std::string rule = "fused_conv2d(groups)->fused_conv2d per group";
  RewriteStats stats;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (node.op != OpKind::FusedConv2d || !wide(graph, node)) continue;
    Match m;
    m.graph = &graph;
    m.root = int(i);
    m.nodes = {int(i)};
    m.node_of["conv"] = int(i);
    m.value_of["conv"] = node.outputs[0];
    std::string why = can_absorb(graph, UseIndex(graph), m, OpKind::FusedConv2d, has_kernel);
    if (why.empty()) why = splittable(m);
    if (!why.empty()) {
      stats.refused[fmt::format("{} at '{}': {}", rule, node.name, why)]++;
      continue;
    }
    replace_match(graph, m, split_groups(m));  // its nodes take i's place: the split first
    stats.hits[rule]++;
  }
  return stats;
}

// Where every reader of a channel_shuffle is a groups-1 conv reading it as x, the convs read
// the shuffle's parts concatenated instead, their weights' input channels permuted to match:
// shuffle(x) channel j * groups + i is x's channel i * (C / groups) + j. The concat runs in
// place where its producers can write into it; one part is read as it is. A pass, not a rule:
// a rule would report every shuffle a split or a depthwise conv reads as refused.
int read_shuffles_through_convs(Graph& graph) {
  const UseIndex uses(graph);
  int moved = 0;
  for (Node& shuffle : graph.nodes) {
    if (shuffle.op != OpKind::ChannelShuffle || graph.is_output(shuffle.outputs[0])) continue;
    const std::vector<int>& readers = uses.consumers(shuffle.outputs[0]);
    const bool convs = !readers.empty() && std::all_of(readers.begin(), readers.end(), [&](int r) {
      const Node& conv = graph.nodes[size_t(r)];
      return conv.op == OpKind::FusedConv2d && conv.attrs.i("groups") == 1 &&
             conv.inputs[0] == shuffle.outputs[0] &&
             std::count(conv.inputs.begin(), conv.inputs.end(), conv.inputs[0]) == 1 &&
             graph.is_weight(conv.inputs[1]) &&
             graph.weights.at(conv.inputs[1]).data.dtype() == DType::F32;
    });
    if (!convs) continue;
    const int64_t c = graph.value(shuffle.outputs[0]).shape[1];
    const int64_t groups = shuffle.attrs.i("groups"), per = c / groups;
    for (int r : readers) {
      Node& conv = graph.nodes[size_t(r)];
      const Tensor& w = graph.weights.at(conv.inputs[1]).data;  // [K, C, R, S]
      Tensor p = Tensor::empty(w.shape());
      const int64_t taps = w.numel() / (w.dim(0) * c);
      for (int64_t k = 0; k < w.dim(0); ++k)
        for (int64_t i = 0; i < groups; ++i)
          for (int64_t j = 0; j < per; ++j) {
            const float* from = w.f32() + (k * c + j * groups + i) * taps;
            std::copy(from, from + taps, p.f32() + (k * c + i * per + j) * taps);
          }
      const std::string name = graph.unique_name(conv.inputs[1] + ".unshuffled");
      graph.values[name] = graph.value(conv.inputs[1]);
      graph.weights[name] = Weight{std::move(p), std::nullopt};
      conv.inputs[1] = name;
    }
    if (shuffle.inputs.size() == 1) {
      for (int r : readers) graph.nodes[size_t(r)].inputs[0] = shuffle.inputs[0];
    } else {
      Attrs cat;
      cat.set("axis", int64_t(1));
      shuffle.op = OpKind::Concat;
      shuffle.attrs = normalize_attrs(OpKind::Concat, shuffle.name, cat);
    }
    ++moved;
  }
  return moved;
}

// A reshape to its input's own shape (what transposes that cancel leave) is no op: its readers
// read the input. Not where the reshape makes a graph output.
int eliminate_identity_views(Graph& graph) {
  std::map<std::string, std::string> to;
  for (const Node& n : graph.nodes)
    if (n.op == OpKind::Reshape && !graph.is_output(n.outputs[0]) &&
        graph.value(n.inputs[0]).shape == graph.value(n.outputs[0]).shape)
      to[n.outputs[0]] = to.count(n.inputs[0]) ? to.at(n.inputs[0]) : n.inputs[0];
  if (to.empty()) return 0;
  for (Node& n : graph.nodes)
    for (std::string& in : n.inputs)
      if (to.count(in)) in = to.at(in);
  return int(to.size());  // dead now: dead-code elimination removes them
}

// x + 0 whose zeros only broadcast x (ONNX's Expand) is x where the elementwise op reading it
// broadcasts x to the same shape anyway (an SE gate's x * y.expand_as(x)): that reader reads x.
// A pass, not a rule: a rule would report every other add read by a binary op as refused.
int drop_broadcast_zeros(Graph& graph) {
  std::map<std::string, size_t> made_by;
  for (size_t i = 0; i < graph.nodes.size(); ++i) made_by[graph.nodes[i].outputs[0]] = i;
  const auto zeros = [&](const std::string& v) {
    if (!graph.is_weight(v)) return false;
    const Tensor& t = graph.weights.at(v).data;
    return std::all_of(t.f32(), t.f32() + t.numel(), [](float f) { return f == 0.0f; });
  };
  int dropped = 0;
  for (Node& n : graph.nodes) {
    if (!binary_kind(n.op)) continue;
    for (std::string& in : n.inputs) {
      auto p = made_by.find(in);
      if (p == made_by.end() || graph.nodes[p->second].op != OpKind::Add) continue;
      const Node& add = graph.nodes[p->second];
      const int z = zeros(add.inputs[1]) ? 1 : zeros(add.inputs[0]) ? 0 : -1;
      if (z < 0) continue;
      const std::string x = add.inputs[size_t(1 - z)];
      std::vector<Shape> shapes;
      for (const std::string& v : n.inputs) shapes.push_back(graph.value(v == in ? x : v).shape);
      try {
        if (infer_shapes(n.op, n.name, n.attrs, shapes)[0] != graph.value(n.outputs[0]).shape)
          continue;
      } catch (const Error&) {
        continue;
      }
      in = x;
      ++dropped;
    }
  }
  return dropped;
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

  auto record = [&](const std::string& verb, const RewriteStats& s) {
    for (const auto& [rule, n] : s.hits) report.hits.push_back({verb, rule, n});
    for (const auto& [why, n] : s.refused) report.refusals.push_back(why);
  };
  record("canonicalized", rewrite(graph, canonicalize_rules(), options.has_kernel));
  if (const int views = eliminate_identity_views(graph)) {
    report.hits.push_back({"removed", "identity view", views});
    report.dead_nodes += eliminate_dead_code(graph);  // the views, read by no one now
  }
  if (const int adds = drop_broadcast_zeros(graph)) {
    report.hits.push_back({"removed", "add of broadcast zeros", adds});
    report.dead_nodes += eliminate_dead_code(graph);
  }
  after("canonicalize");
  if (options.fuse) {
    record("reparameterized", reparameterize(graph, options.has_kernel));
    after("reparameterize");
    record("fused", rewrite(graph, fusion_rules(), options.has_kernel));
    record("fused", rewrite(graph, input_fold_rules(), options.has_kernel));
    record("fused", rewrite(graph, elementwise_rules(), options.has_kernel));
    record("split", split_wide_groups(graph, options.has_kernel));
    if (const int shuffles = read_shuffles_through_convs(graph))
      report.hits.push_back({"read through", "channel_shuffle by its convs' weights", shuffles});
    after("fuse");
  }
  report.dead_nodes += eliminate_dead_code(graph);
  after("dce");
  return report;
}

}  // namespace epilog
