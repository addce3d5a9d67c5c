// The activations and binary ops (graph/pointwise.h) as the graph spells them: which unary op is
// which activation, with which attributes for its parameters, fused_conv2d's activation
// attributes, and fused_elementwise's program.
#pragma once

#include <optional>
#include <string>

#include "epilog/graph/graph.h"
#include "epilog/graph/pointwise.h"

namespace epilog {

const char* activation_name(Activation kind);  // "none", "silu", "leaky_relu", ...
Activation parse_activation(const std::string& name);  // throws Error on an unknown name

// The activation a unary op node computes (relu, clip, leaky_relu, gelu, pow, ...), with its
// parameters; nullopt for every other op.
std::optional<Act> node_activation(const Node& node);
bool is_activation_op(OpKind op);
// The op and attributes that compute `act` alone: node_activation's inverse. Throws for None.
std::pair<OpKind, Attrs> activation_op(const Act& act);

// The binary elementwise op (add, mul, sub, div, max, min) a node kind computes, or nullopt; and
// the node kind of a binary op.
std::optional<Binary> binary_kind(OpKind op);
OpKind binary_op(Binary op);

// fused_elementwise's attribute "program": its steps in order, separated by ", ". A unary step
// is an activation as fused_conv2d names it, with its parameters in parentheses where it has
// any ("sigmoid", "clip(0, 6)", "gelu_tanh"); a binary step is an op with the input it reads,
// the running value on its left ("mul(x1)": v * x1) or, marked by a second argument v, on its
// right ("sub(x2, v)": x2 - v). Errors name the step.
ChainProgram parse_chain(const std::string& text);
std::string chain_str(const ChainProgram& program);
// A fused_elementwise node's program; errors name the op and node.
ChainProgram node_chain(const Node& node);

// fused_conv2d's activation with its parameters (alpha, beta); None for conv2d.
Act conv_activation(const Node& node);
// Whether a fused_conv2d adds its residual before the activation (attribute residual_first).
bool fused_residual_first(const Node& node);
// Sets fused_conv2d attributes activation, alpha and beta to `act`.
void set_conv_activation(Attrs& attrs, const Act& act);

}  // namespace epilog
