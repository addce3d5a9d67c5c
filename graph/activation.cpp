#include "epilog/graph/activation.h"

namespace epilog {
namespace {

// Each activation: its name, the op that computes it alone, and the attributes of that op that
// hold its parameters a and b (empty: none). Gelu's tanh form is the gelu op with
// approximate = "tanh".
struct ActivationInfo {
  Activation kind;
  const char* name;
  std::optional<OpKind> op;
  const char* a_attr;
  const char* b_attr;
};

const ActivationInfo kActivations[] = {
    {Activation::None, "none", std::nullopt, "", ""},
    {Activation::Silu, "silu", OpKind::Silu, "", ""},
    {Activation::Relu, "relu", OpKind::Relu, "", ""},
    {Activation::Sigmoid, "sigmoid", OpKind::Sigmoid, "", ""},
    {Activation::Clip, "clip", OpKind::Clip, "min", "max"},
    {Activation::LeakyRelu, "leaky_relu", OpKind::LeakyRelu, "alpha", ""},
    {Activation::HardSigmoid, "hardsigmoid", OpKind::HardSigmoid, "alpha", "beta"},
    {Activation::HardSwish, "hardswish", OpKind::HardSwish, "", ""},
    {Activation::Tanh, "tanh", OpKind::Tanh, "", ""},
    {Activation::Gelu, "gelu", OpKind::Gelu, "", ""},
    {Activation::GeluTanh, "gelu_tanh", std::nullopt, "", ""},
    {Activation::Mish, "mish", OpKind::Mish, "", ""},
    {Activation::Softplus, "softplus", OpKind::Softplus, "", ""},
    {Activation::Elu, "elu", OpKind::Elu, "alpha", ""},
    {Activation::Exp, "exp", OpKind::Exp, "", ""},
    {Activation::Erf, "erf", OpKind::Erf, "", ""},
    {Activation::Sqrt, "sqrt", OpKind::Sqrt, "", ""},
    {Activation::Reciprocal, "reciprocal", OpKind::Reciprocal, "", ""},
    {Activation::Neg, "neg", OpKind::Neg, "", ""},
    {Activation::Abs, "abs", OpKind::Abs, "", ""},
    {Activation::Pow, "pow", OpKind::Pow, "exponent", ""},
};
static_assert(sizeof(kActivations) / sizeof(kActivations[0]) == kNumActivations,
              "every activation has a row");

const ActivationInfo& info(Activation kind) {
  const ActivationInfo& row = kActivations[static_cast<size_t>(kind)];
  EPILOG_ASSERT(row.kind == kind, "activation table out of order at {}", static_cast<int>(kind));
  return row;
}

float attr_or_zero(const Attrs& attrs, const char* name) {
  return *name ? static_cast<float>(attrs.f(name)) : 0.0f;
}

}  // namespace

const char* activation_name(Activation kind) {
  return info(kind).name;
}

Activation parse_activation(const std::string& name) {
  for (const ActivationInfo& row : kActivations)
    if (name == row.name) return row.kind;
  fail("unknown activation '{}'", name);
}

std::optional<Act> node_activation(const Node& node) {
  for (const ActivationInfo& row : kActivations) {
    if (row.op != node.op) continue;
    if (node.op == OpKind::Gelu && node.attrs.s("approximate") == "tanh")
      return Act(Activation::GeluTanh);
    return Act(row.kind, attr_or_zero(node.attrs, row.a_attr),
               attr_or_zero(node.attrs, row.b_attr));
  }
  return std::nullopt;
}

std::pair<OpKind, Attrs> activation_op(const Act& act) {
  if (act.kind == Activation::GeluTanh) {
    Attrs attrs;
    attrs.set("approximate", std::string("tanh"));
    return {OpKind::Gelu, attrs};
  }
  const ActivationInfo& row = info(act.kind);
  if (!row.op) fail("activation '{}' has no op of its own", row.name);
  Attrs attrs;
  if (*row.a_attr) attrs.set(row.a_attr, double(act.a));
  if (*row.b_attr) attrs.set(row.b_attr, double(act.b));
  return {*row.op, attrs};
}

bool is_activation_op(OpKind op) {
  for (const ActivationInfo& row : kActivations)
    if (row.op == op) return true;
  return false;
}

Act conv_activation(const Node& node) {
  if (node.op != OpKind::FusedConv2d) return {};
  return Act(parse_activation(node.attrs.s("activation")), float(node.attrs.f("alpha")),
             float(node.attrs.f("beta")));
}

bool fused_residual_first(const Node& node) {
  return node.op == OpKind::FusedConv2d && node.attrs.i("residual_first") != 0;
}

void set_conv_activation(Attrs& attrs, const Act& act) {
  attrs.set("activation", std::string(activation_name(act.kind)));
  attrs.set("alpha", double(act.a));
  attrs.set("beta", double(act.b));
}

}  // namespace epilog
