#include "epilog/runtime/params.h"

namespace epilog {

ConvShape conv_shape(const Graph& graph, const Node& node) {
  return conv_shape(node, graph.value(node.inputs[0]).shape, graph.value(node.inputs[1]).shape,
                    graph.value(node.outputs[0]).shape);
}

ConvShape conv_shape(const Node& node, const Shape& x, const Shape& w, const Shape& y) {
  EPILOG_ASSERT(node.op == OpKind::Conv2d || node.op == OpKind::FusedConv2d);
  const auto& s = node.attrs.ints("stride");
  const auto& p = node.attrs.ints("padding");
  const auto& d = node.attrs.ints("dilation");
  return ConvShape{x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2],
                   y[3], s[0], s[1], p[0], p[1], d[0], d[1], node.attrs.i("groups")};
}

ConvShape conv_shape(const Node& node, const std::vector<Tensor>& in, const Tensor& y) {
  const Tensor& x = in.at(0);
  ConvShape s = conv_shape(node, x.shape(), in.at(1).shape(), y.shape());
  s.x_stride = x.item_stride(), s.y_stride = y.item_stride();
  if (const Tensor* r = conv_residual(node, in)) s.r_stride = r->item_stride();
  return s;
}

const Tensor* conv_residual(const Node& node, const std::vector<Tensor>& in) {
  return node.op == OpKind::FusedConv2d && node.inputs.size() > 4 && in.size() > 4 ? &in[4]
                                                                                   : nullptr;
}

PoolShape pool_shape(const Node& node, const Shape& x, const Shape& y) {
  EPILOG_ASSERT(node.op == OpKind::MaxPool2d || node.op == OpKind::AvgPool2d);
  const auto& k = node.attrs.ints("kernel");
  const auto& s = node.attrs.ints("stride");
  const auto& p = node.attrs.ints("padding");
  bool include_pad = node.op == OpKind::AvgPool2d && node.attrs.i("count_include_pad") != 0;
  return PoolShape{x[0], x[1], x[2], x[3], y[2], y[3], k[0],       k[1],
                   s[0], s[1], p[0], p[1], p[2], p[3], include_pad};
}

PoolShape pool_shape(const Node& node, const Tensor& x, const Tensor& y) {
  PoolShape s = pool_shape(node, x.shape(), y.shape());
  s.x_stride = x.item_stride(), s.y_stride = y.item_stride();
  return s;
}

}  // namespace epilog
