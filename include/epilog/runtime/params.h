// Kernel geometry read off graph nodes, shared by the backends and the kernel selector.
#pragma once

#include "epilog/graph/activation.h"
#include "epilog/graph/graph.h"
#include "epilog/kernels/shapes.h"

namespace epilog {

// For conv2d and fused_conv2d nodes, from the shapes of input, weight and output.
ConvShape conv_shape(const Node& node, const Shape& x, const Shape& w, const Shape& y);
ConvShape conv_shape(const Graph& graph, const Node& node);
// From the tensors a backend runs on (x, weight, ... [, residual]): also the image strides of
// x, y and the residual.
ConvShape conv_shape(const Node& node, const std::vector<Tensor>& in, const Tensor& y);
// fused_conv2d's residual input, or null.
const Tensor* conv_residual(const Node& node, const std::vector<Tensor>& in);

// For maxpool2d and avgpool2d nodes.
PoolShape pool_shape(const Node& node, const Shape& x, const Shape& y);
PoolShape pool_shape(const Node& node, const Tensor& x, const Tensor& y);  // with image strides

}  // namespace epilog
