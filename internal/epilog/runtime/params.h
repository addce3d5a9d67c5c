// Kernel geometry read off graph nodes, shared by the backends and the kernel selector: the
// library's own, as kernels/shapes.h whose types it returns (not installed).
#pragma once

#include <optional>

#include "epilog/graph/activation.h"
#include "epilog/graph/graph.h"
#include "epilog/kernels/shapes.h"

namespace epilog {

// For conv2d, fused_conv2d and conv_transpose2d nodes, from the shapes of input, weight and
// output (conv_transpose2d: its x, weight [c, k / groups, r, s] and y, which the shape reads as
// a conv's, y's plane the output positions its stride and padding place the input on).
ConvShape conv_shape(const Node& node, const Shape& x, const Shape& w, const Shape& y);
ConvShape conv_shape(const Graph& graph, const Node& node);
// From the tensors a backend runs on (x, weight, ... [, residual]): also the image strides of
// x, y and the residual.
ConvShape conv_shape(const Node& node, const std::vector<Tensor>& in, const Tensor& y);
// fused_conv2d's residual input, or null.
const Tensor* conv_residual(const Node& node, const std::vector<Tensor>& in);

// fused_elementwise's inputs and output as its kernels walk them (ChainShape): also the item
// strides of parts. Errors name the op and node.
ChainShape chain_shape(const Node& node, const std::vector<Tensor>& in, const Tensor& y);

// For maxpool2d and avgpool2d nodes.
PoolShape pool_shape(const Node& node, const Shape& x, const Shape& y);
PoolShape pool_shape(const Node& node, const Tensor& x, const Tensor& y);  // with image strides

// transpose and slice as a strided view of x (contiguous, shape x): the view's element i_0, ...,
// i_r (over `sizes`, in row-major order) is x[offset + sum_d i_d * strides[d]], and y
// (contiguous) holds them in that order; sizes is y's shape.
struct GatherView {
  int64_t offset = 0;
  Shape sizes;
  std::vector<int64_t> strides;
};
GatherView gather_view(const Node& node, const Shape& x);
// resize's mode, coordinate mode and nearest rounding.
ResizeMode resize_mode(const Node& node);
// reduce_mean, reduce_sum, reduce_max, reduce_min, reduce_prod: the dims of x (shape) they
// reduce, and the reduction each is (none for other ops).
std::vector<bool> reduced_dims(const Node& node, const Shape& x);
std::optional<Reduce> reduce_kind(OpKind op);
// An axis attribute made non-negative for rank `rank`.
int64_t axis_attr(const Node& node, int64_t rank, const char* attr = "axis");

}  // namespace epilog
