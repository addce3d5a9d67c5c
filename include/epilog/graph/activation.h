// The activations (kernels/shapes.h) as the graph spells them: which unary op is which
// activation, with which attributes for its parameters, and fused_conv2d's activation attributes.
#pragma once

#include <optional>
#include <string>

#include "epilog/graph/graph.h"
#include "epilog/kernels/shapes.h"

namespace epilog {

const char* activation_name(Activation kind);  // "none", "silu", "leaky_relu", ...
Activation parse_activation(const std::string& name);  // throws Error on an unknown name

// The activation a unary op node computes (relu, clip, leaky_relu, gelu, pow, ...), with its
// parameters; nullopt for every other op.
std::optional<Act> node_activation(const Node& node);
bool is_activation_op(OpKind op);
// The op and attributes that compute `act` alone: node_activation's inverse. Throws for None.
std::pair<OpKind, Attrs> activation_op(const Act& act);

// fused_conv2d's activation with its parameters (alpha, beta); None for conv2d.
Act conv_activation(const Node& node);
// Whether a fused_conv2d adds its residual before the activation (attribute residual_first).
bool fused_residual_first(const Node& node);
// Sets fused_conv2d attributes activation, alpha and beta to `act`.
void set_conv_activation(Attrs& attrs, const Act& act);

}  // namespace epilog
