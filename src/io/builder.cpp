#include "epilog/io/builder.h"

#include <algorithm>
#include <set>

#include "epilog/io/init.h"

namespace epilog {

void Builder::set_weights(std::map<std::string, Tensor> data) {
  for (const auto& [name, t] : data) {
    if (graph_.weights.count(name))
      fail(
          "builder: set_weights: weight '{}' was already made from the seed; call set_weights "
          "before the ops that use it",
          name);
    if (t.dtype() != DType::F32 || t.device() != Device::CPU)
      fail("builder: set_weights: weight '{}' is {} on {}, expected f32 on cpu", name,
           dtype_name(t.dtype()), device_name(t.device()));
  }
  data_ = std::move(data);
}

Val Builder::input(const std::string& name, const Shape& shape) {
  if (graph_.values.count(name)) fail("builder: input '{}' is already defined", name);
  for (int64_t d : shape)
    if (d < 1)
      fail("builder: input '{}' has shape {}: every dim must be >= 1", name, shape_str(shape));
  graph_.inputs.push_back(name);
  graph_.values[name] = Value{shape, DType::F32};
  return {name};
}

void Builder::output(Val v) {
  graph_.value(v.name);  // throws for an unknown value
  if (graph_.is_output(v.name)) fail("builder: '{}' is already an output", v.name);
  graph_.outputs.push_back(v.name);
}

Val Builder::weight(const std::string& name, const Shape& shape, OpKind op,
                    const std::string& role) {
  if (graph_.values.count(name)) fail("builder: weight '{}' is already defined", name);
  Weight w;
  auto it = data_.find(name);
  if (it != data_.end()) {
    if (it->second.shape() != shape)
      fail("[{}] weight '{}': data has shape {}, expected {}", op_name(op), name,
           shape_str(it->second.shape()), shape_str(shape));
    w.data = it->second;
  } else {
    w.data = init_weight(name, shape, op, role, seed_);
    w.seed = seed_;
  }
  graph_.weights[name] = std::move(w);
  graph_.values[name] = Value{shape, DType::F32};
  return {name};
}

std::string Builder::fresh_name(OpKind op, const std::string& name) {
  if (!name.empty()) return name;
  std::string n;
  do {
    n = fmt::format("{}_{}", op_name(op), counters_[op_name(op)]++);
  } while (graph_.values.count(n) || graph_.find_node(n));
  return n;
}

std::vector<Val> Builder::node(OpKind op, const std::vector<Val>& inputs, const Attrs& attrs,
                               const std::string& name) {
  Node n;
  n.name = fresh_name(op, name);
  n.op = op;
  if (graph_.find_node(n.name)) fail("[{}] node '{}': name is already used", op_name(op), n.name);
  n.attrs = normalize_attrs(op, n.name, attrs);
  std::vector<Shape> in_shapes;
  for (const Val& v : inputs) {
    auto it = graph_.values.find(v.name);
    if (it == graph_.values.end())
      fail("[{}] node '{}': input '{}' is not defined", op_name(op), n.name, v.name);
    n.inputs.push_back(v.name);
    in_shapes.push_back(it->second.shape);
  }
  std::vector<Shape> out_shapes = infer_shapes(op, n.name, n.attrs, in_shapes);
  // Check every output name before recording any, so that a failed call leaves no value behind.
  for (size_t i = 0; i < out_shapes.size(); ++i) {
    std::string out = out_shapes.size() == 1 ? n.name : fmt::format("{}.{}", n.name, i);
    if (graph_.values.count(out))
      fail("[{}] node '{}': output name '{}' is already used", op_name(op), n.name, out);
    n.outputs.push_back(out);
  }
  std::vector<Val> outs;
  for (size_t i = 0; i < out_shapes.size(); ++i) {
    graph_.values[n.outputs[i]] = Value{out_shapes[i], DType::F32};
    outs.push_back({n.outputs[i]});
  }
  graph_.nodes.push_back(std::move(n));
  return outs;
}

Val Builder::transactional(const std::function<Val()>& body) {
  std::vector<std::string> before;
  for (const auto& [name, w] : graph_.weights) before.push_back(name);
  try {
    return body();
  } catch (...) {
    for (auto it = graph_.weights.begin(); it != graph_.weights.end();) {
      if (std::binary_search(before.begin(), before.end(), it->first)) {
        ++it;
      } else {
        graph_.values.erase(it->first);
        it = graph_.weights.erase(it);
      }
    }
    throw;
  }
}

Val Builder::single(OpKind op, const std::vector<Val>& inputs, const Attrs& attrs,
                    const std::string& name) {
  return node(op, inputs, attrs, name).front();
}

Val Builder::conv2d(Val x, const std::string& name, const ConvOpts& o) {
  return conv(OpKind::Conv2d, x, name, o);
}

Val Builder::conv_transpose2d(Val x, const std::string& name, const ConvOpts& o) {
  return conv(OpKind::ConvTranspose2d, x, name, o);
}

Val Builder::conv(OpKind op, Val x, const std::string& name, const ConvOpts& o) {
  return transactional([&] {
    const Shape& xs = shape(x);
    if (xs.size() != 4)
      fail("[{}] node '{}': input '{}' has shape {}, expected 4 dims (NCHW)", op_name(op), name,
           x.name, shape_str(xs));
    const bool transposed = op == OpKind::ConvTranspose2d;
    if (o.groups_ < 1 || xs[1] % o.groups_ != 0 || (transposed && o.out_channels_ % o.groups_))
      fail("[{}] node '{}': groups={} does not divide the {} input channels{}", op_name(op), name,
           o.groups_, xs[1],
           transposed ? fmt::format(" and {} output channels", o.out_channels_) : "");
    const Shape w = transposed
                        ? Shape{xs[1], o.out_channels_ / o.groups_, o.kernel_[0], o.kernel_[1]}
                        : Shape{o.out_channels_, xs[1] / o.groups_, o.kernel_[0], o.kernel_[1]};
    std::vector<Val> ins{x, weight(name + ".weight", w, op, "weight")};
    if (o.bias_) ins.push_back(weight(name + ".bias", {o.out_channels_}, op, "bias"));
    Attrs a;
    a.set("stride", o.stride_);
    a.set("padding", o.padding_);
    a.set("dilation", o.dilation_);
    a.set("groups", o.groups_);
    if (transposed) a.set("output_padding", o.output_padding_);
    return single(op, ins, a, name);
  });
}

Val Builder::batchnorm(Val x, const std::string& name, double eps) {
  return transactional([&] {
    const Shape& xs = shape(x);
    if (xs.size() < 2)
      fail("[batchnorm] node '{}': input '{}' has shape {}, expected at least 2 dims", name, x.name,
           shape_str(xs));
    std::vector<Val> ins{x};
    for (const char* role : {"weight", "bias", "running_mean", "running_var"})
      ins.push_back(weight(name + "." + role, {xs[1]}, OpKind::BatchNorm, role));
    Attrs a;
    a.set("eps", eps);
    return single(OpKind::BatchNorm, ins, a, name);
  });
}

Val Builder::linear(Val x, const std::string& name, int64_t out_features, bool bias) {
  return transactional([&] {
    const Shape& xs = shape(x);
    if (xs.size() < 2)
      fail("[linear] node '{}': input '{}' has shape {}, expected at least 2 dims", name, x.name,
           shape_str(xs));
    std::vector<Val> ins{
        x, weight(name + ".weight", {out_features, xs.back()}, OpKind::Linear, "weight")};
    if (bias) ins.push_back(weight(name + ".bias", {out_features}, OpKind::Linear, "bias"));
    return single(OpKind::Linear, ins, {}, name);
  });
}

Val Builder::silu(Val x, const std::string& name) {
  return single(OpKind::Silu, {x}, {}, name);
}
Val Builder::relu(Val x, const std::string& name) {
  return single(OpKind::Relu, {x}, {}, name);
}
Val Builder::sigmoid(Val x, const std::string& name) {
  return single(OpKind::Sigmoid, {x}, {}, name);
}
Val Builder::activation(Val x, const Act& act, const std::string& name) {
  const auto [op, attrs] = activation_op(act);
  return single(op, {x}, attrs, name);
}
Val Builder::add(Val a, Val b, const std::string& name) {
  return single(OpKind::Add, {a, b}, {}, name);
}
Val Builder::mul(Val a, Val b, const std::string& name) {
  return single(OpKind::Mul, {a, b}, {}, name);
}

Val Builder::concat(const std::vector<Val>& xs, int64_t axis, const std::string& name) {
  Attrs a;
  a.set("axis", axis);
  return single(OpKind::Concat, xs, a, name);
}

std::vector<Val> Builder::split(Val x, int64_t axis, const std::vector<int64_t>& sizes,
                                const std::string& name) {
  Attrs a;
  a.set("axis", axis);
  a.set("sizes", sizes);
  return node(OpKind::Split, {x}, a, name);
}

std::vector<Val> Builder::chunk(Val x, int64_t chunks, int64_t axis, const std::string& name) {
  const Shape& xs = shape(x);
  int64_t rank = static_cast<int64_t>(xs.size());
  int64_t ax = axis < 0 ? axis + rank : axis;
  if (chunks < 1 || ax < 0 || ax >= rank)
    fail("[split] node '{}': cannot chunk {} into {} along axis {}", name, shape_str(xs), chunks,
         axis);
  int64_t step = (xs[ax] + chunks - 1) / chunks;
  std::vector<int64_t> sizes;
  for (int64_t left = xs[ax]; left > 0; left -= step) sizes.push_back(std::min(step, left));
  return split(x, axis, sizes, name);
}

namespace {
Attrs pool_attrs(const std::vector<int64_t>& k, const std::vector<int64_t>& s,
                 const std::vector<int64_t>& p, bool ceil_mode) {
  Attrs a;
  a.set("kernel", k);
  a.set("stride", s);
  a.set("padding", p);
  a.set("ceil_mode", int64_t{ceil_mode});
  return a;
}
}  // namespace

Val Builder::maxpool2d(Val x, const PoolOpts& o, const std::string& name) {
  return single(OpKind::MaxPool2d, {x}, pool_attrs(o.kernel_, o.stride_, o.padding_, o.ceil_mode_),
                name);
}

Val Builder::avgpool2d(Val x, const PoolOpts& o, const std::string& name) {
  Attrs a = pool_attrs(o.kernel_, o.stride_, o.padding_, o.ceil_mode_);
  a.set("count_include_pad", int64_t{o.count_include_pad_});
  return single(OpKind::AvgPool2d, {x}, a, name);
}

Val Builder::global_avgpool(Val x, const std::string& name) {
  return single(OpKind::GlobalAvgPool, {x}, {}, name);
}

Val Builder::upsample_nearest(Val x, int64_t scale, const std::string& name) {
  Attrs a;
  a.set("scale", scale);
  return single(OpKind::UpsampleNearest, {x}, a, name);
}

Val Builder::flatten(Val x, int64_t axis, const std::string& name) {
  Attrs a;
  a.set("axis", axis);
  return single(OpKind::Flatten, {x}, a, name);
}

Val Builder::binary(OpKind op, Val a, Val b, const std::string& name) {
  return single(op, {a, b}, {}, name);
}
Val Builder::sub(Val a, Val b, const std::string& name) {
  return single(OpKind::Sub, {a, b}, {}, name);
}
Val Builder::div(Val a, Val b, const std::string& name) {
  return single(OpKind::Div, {a, b}, {}, name);
}

Val Builder::transpose(Val x, const std::vector<int64_t>& perm, const std::string& name) {
  Attrs a;
  a.set("perm", perm);
  return single(OpKind::Transpose, {x}, a, name);
}

Val Builder::channel_shuffle(Val x, int64_t groups, const std::string& name) {
  return channel_shuffle(std::vector<Val>{x}, groups, name);
}

Val Builder::channel_shuffle(const std::vector<Val>& parts, int64_t groups,
                             const std::string& name) {
  Attrs a;
  a.set("groups", groups);
  return single(OpKind::ChannelShuffle, parts, a, name);
}

Val Builder::depth_space(OpKind op, Val x, const std::vector<int64_t>& blocksize,
                         const std::string& mode, const std::string& name,
                         const std::vector<int64_t>& crop) {
  Attrs a;
  if (blocksize.size() == 1)
    a.set("blocksize", blocksize[0]);
  else
    a.set("blocksize", blocksize);
  a.set("mode", mode);
  if (!crop.empty()) a.set("crop", crop);
  return single(op, {x}, a, name);
}

Val Builder::reshape(Val x, const std::vector<int64_t>& shape, const std::string& name) {
  Attrs a;
  a.set("shape", shape);
  return single(OpKind::Reshape, {x}, a, name);
}

Val Builder::slice(Val x, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                   const std::vector<int64_t>& axes, const std::vector<int64_t>& steps,
                   const std::string& name) {
  Attrs a;
  a.set("starts", starts);
  a.set("ends", ends);
  a.set("axes", axes);
  a.set("steps", steps);
  return single(OpKind::Slice, {x}, a, name);
}

Val Builder::pad(Val x, const std::vector<int64_t>& pads, const std::string& mode, double value,
                 const std::string& name) {
  Attrs a;
  a.set("pads", pads);
  a.set("mode", mode);
  a.set("value", value);
  return single(OpKind::Pad, {x}, a, name);
}

Val Builder::reduce(OpKind op, Val x, const std::vector<int64_t>& axes, bool keepdims,
                    const std::string& name) {
  Attrs a;
  a.set("axes", axes);
  a.set("keepdims", int64_t{keepdims});
  return single(op, {x}, a, name);
}

Val Builder::softmax(Val x, int64_t axis, const std::string& name) {
  Attrs a;
  a.set("axis", axis);
  return single(OpKind::Softmax, {x}, a, name);
}

Val Builder::log_softmax(Val x, int64_t axis, const std::string& name) {
  Attrs a;
  a.set("axis", axis);
  return single(OpKind::LogSoftmax, {x}, a, name);
}

Val Builder::resize(Val x, const std::vector<int64_t>& sizes, const std::string& mode,
                    const std::string& coordinate_mode, const std::string& nearest_mode,
                    const std::string& name) {
  Attrs a;
  a.set("sizes", sizes);
  a.set("mode", mode);
  a.set("coordinate_mode", coordinate_mode);
  a.set("nearest_mode", nearest_mode);
  return single(OpKind::Resize, {x}, a, name);
}

Val Builder::matmul(Val a, Val b, const std::string& name) {
  return single(OpKind::MatMul, {a, b}, {}, name);
}

Val Builder::layer_norm(Val x, const std::string& name, int64_t axis, double eps,
                        int64_t last_axis) {
  return transactional([&] {
    const Shape& xs = shape(x);
    const int64_t rank = int64_t(xs.size()), ax = axis < 0 ? axis + rank : axis;
    const int64_t last = last_axis < 0 ? last_axis + rank : last_axis;
    if (ax < 0 || ax >= rank || last < ax || last >= rank)
      fail("[layer_norm] node '{}': axis {} to last_axis {} is out of range for {}", name, axis,
           last_axis, shape_str(xs));
    const Shape dims(xs.begin() + ax, xs.begin() + last + 1);
    Attrs a;
    a.set("axis", axis);
    a.set("last_axis", last_axis);
    a.set("eps", eps);
    return single(OpKind::LayerNorm,
                  {x, weight(name + ".weight", dims, OpKind::LayerNorm, "scale"),
                   weight(name + ".bias", dims, OpKind::LayerNorm, "bias")},
                  a, name);
  });
}

Val Builder::group_norm(Val x, const std::string& name, int64_t groups, double eps) {
  Attrs a;
  a.set("groups", groups);
  a.set("eps", eps);
  return channel_norm(OpKind::GroupNorm, x, name, a);
}

Val Builder::instance_norm(Val x, const std::string& name, double eps) {
  Attrs a;
  a.set("eps", eps);
  return channel_norm(OpKind::InstanceNorm, x, name, a);
}

Val Builder::channel_norm(OpKind op, Val x, const std::string& name, const Attrs& attrs) {
  return transactional([&] {
    const Shape& xs = shape(x);
    if (xs.size() < 2)
      fail("[{}] node '{}': input '{}' has shape {}, expected at least 2 dims", op_name(op), name,
           x.name, shape_str(xs));
    return single(op,
                  {x, weight(name + ".weight", {xs[1]}, op, "scale"),
                   weight(name + ".bias", {xs[1]}, op, "bias")},
                  attrs, name);
  });
}

Graph Builder::build() {
  for (const auto& [name, t] : data_)
    if (!graph_.weights.count(name))
      fail("builder: weight data '{}' was given but no op uses a weight of that name", name);
  if (graph_.outputs.empty()) fail("builder: the graph has no outputs (call output())");
  verify(graph_, "builder");
  Graph g = std::move(graph_);
  graph_ = Graph{};
  return g;
}

}  // namespace epilog
