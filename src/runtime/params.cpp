#include "epilog/runtime/params.h"

namespace epilog {

ConvShape conv_shape(const Graph& graph, const Node& node) {
  return conv_shape(node, graph.value(node.inputs[0]).shape, graph.value(node.inputs[1]).shape,
                    graph.value(node.outputs[0]).shape);
}

ConvShape conv_shape(const Node& node, const Shape& x, const Shape& w, const Shape& y) {
  EPILOG_ASSERT(node.op == OpKind::Conv2d || node.op == OpKind::FusedConv2d ||
                node.op == OpKind::ConvTranspose2d);
  const auto& s = node.attrs.ints("stride");
  const auto& p = node.attrs.ints("padding");
  const auto& d = node.attrs.ints("dilation");
  return ConvShape{x[0], x[1], x[2], x[3], y[1], w[2], w[3], y[2],
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

ChainShape chain_shape(const Node& node, const std::vector<Tensor>& in, const Tensor& y) {
  const auto bad = [&](const std::string& why) {
    fail("[{}] node '{}': {}", op_name(node.op), node.name, why);
  };
  if (in.empty() || in.size() > size_t(kMaxChainInputs))
    bad(fmt::format("{} inputs, expected 1 to {}", in.size(), kMaxChainInputs));
  // Every tensor's strides against y's dims, from the back where shapes align; dim 0 of each
  // steps by its item stride (a part of a larger batch's items).
  const Shape& ys = y.shape();
  const size_t rank = ys.size();
  std::vector<std::vector<int64_t>> strides(in.size() + 1, std::vector<int64_t>(rank, 0));
  const auto walk = [&](const Tensor& t, std::vector<int64_t>& out) {
    const Shape& s = t.shape();
    if (s.size() > rank)
      bad(fmt::format("input {} does not broadcast to the output {}", shape_str(s), shape_str(ys)));
    int64_t stride = 1;
    for (size_t i = 0; i < s.size(); ++i) {
      const size_t d = rank - 1 - i, e = s.size() - 1 - i;
      if (s[e] != 1 && s[e] != ys[d])
        bad(fmt::format("input {} does not broadcast to the output {}", shape_str(s),
                        shape_str(ys)));
      out[d] = s[e] == 1 ? 0 : e == 0 && !t.contiguous() ? t.item_stride() : stride;
      stride *= s[e];
    }
  };
  for (size_t k = 0; k < in.size(); ++k) walk(in[k], strides[k]);
  walk(y, strides.back());
  ChainShape cs;
  cs.inputs = int(in.size());
  const auto set = [&](int at, size_t d) {
    cs.size[at] = ys[d];
    for (size_t k = 0; k < in.size(); ++k) cs.stride[k][at] = strides[k][d];
    cs.y_stride[at] = strides.back()[d];
  };
  for (size_t d = 0; d < rank; ++d) {
    if (ys[d] == 1) continue;
    // Merged into the dim before where every tensor steps through both as through one.
    bool chains = cs.rank > 0;
    for (size_t k = 0; chains && k <= in.size(); ++k)
      chains = strides[k][d] * ys[d] ==
               (k < in.size() ? cs.stride[k][cs.rank - 1] : cs.y_stride[cs.rank - 1]);
    if (chains) {
      const int64_t size = cs.size[cs.rank - 1] * ys[d];
      set(cs.rank - 1, d);
      cs.size[cs.rank - 1] = size;
      continue;
    }
    if (cs.rank == kMaxChainRank)
      bad(fmt::format("output {} has more than {} dims the inputs walk apart", shape_str(ys),
                      kMaxChainRank));
    set(cs.rank++, d);
  }
  if (cs.rank == 0) cs.size[cs.rank++] = 1;  // one element, every stride 0
  return cs;
}

GatherView gather_view(const Node& node, const Shape& x) {
  const std::vector<Shape> shapes{x};
  const InferContext ctx{node.op, node.name, node.attrs, shapes};
  std::vector<int64_t> stride(x.size(), 1);
  for (size_t d = x.size(); d-- > 1;) stride[d - 1] = stride[d] * x[d];
  GatherView v;
  if (node.op == OpKind::Transpose) {
    for (int64_t p : transpose_perm(ctx)) {
      v.sizes.push_back(x[size_t(p)]);
      v.strides.push_back(stride[size_t(p)]);
    }
    return v;
  }
  EPILOG_ASSERT(node.op == OpKind::Slice, "gather_view of a {}", op_name(node.op));
  const SliceDims s = slice_dims(ctx);
  v.sizes = s.out;
  for (size_t d = 0; d < x.size(); ++d) {
    v.offset += s.start[d] * stride[d];
    v.strides.push_back(s.step[d] * stride[d]);
  }
  return v;
}

ResizeMode resize_mode(const Node& node) {
  ResizeMode m;
  m.linear = node.attrs.s("mode") == "linear";
  const std::string& c = node.attrs.s("coordinate_mode");
  m.coord = c == "half_pixel"           ? ResizeCoord::HalfPixel
            : c == "pytorch_half_pixel" ? ResizeCoord::PytorchHalfPixel
            : c == "align_corners"      ? ResizeCoord::AlignCorners
                                        : ResizeCoord::Asymmetric;
  const std::string& r = node.attrs.s("nearest_mode");
  m.nearest = r == "round_prefer_floor"  ? NearestMode::RoundPreferFloor
              : r == "round_prefer_ceil" ? NearestMode::RoundPreferCeil
              : r == "floor"             ? NearestMode::Floor
                                         : NearestMode::Ceil;
  return m;
}

std::vector<bool> reduced_dims(const Node& node, const Shape& x) {
  const std::vector<Shape> shapes{x};
  return reduce_axes(InferContext{node.op, node.name, node.attrs, shapes});
}

std::optional<Reduce> reduce_kind(OpKind op) {
  switch (op) {
    case OpKind::ReduceMean:
      return Reduce::Mean;
    case OpKind::ReduceSum:
      return Reduce::Sum;
    case OpKind::ReduceMax:
      return Reduce::Max;
    case OpKind::ReduceMin:
      return Reduce::Min;
    case OpKind::ReduceProd:
      return Reduce::Prod;
    default:
      return std::nullopt;
  }
}

int64_t axis_attr(const Node& node, int64_t rank, const char* attr) {
  const int64_t axis = node.attrs.i(attr);
  return axis < 0 ? axis + rank : axis;
}

}  // namespace epilog
