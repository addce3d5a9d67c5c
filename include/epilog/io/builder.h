// The C++ graph-builder API. A model reads like the model:
//
//   epilog::Builder b(/*seed=*/1);
//   auto x = b.input("images", {1, 3, 640, 640});
//   auto y = b.silu(b.batchnorm(b.conv2d(x, "b0.conv", ConvOpts(16, 3).stride(2).padding(1)),
//                               "b0.bn"), "b0.act");
//   b.output(y);
//   epilog::Graph g = b.build();
//
// Weights are named like PyTorch state_dict keys ("b0.conv.weight", "b0.bn.running_var") and
// come from set_weights() when given there, else from the seeded generator. Every call checks
// shapes at once and throws an Error naming the op, the node and the shapes.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "epilog/graph/activation.h"
#include "epilog/graph/graph.h"

namespace epilog {

// A value of the graph being built.
struct Val {
  std::string name;
};

class ConvOpts {
 public:
  ConvOpts(int64_t out_channels, int64_t kernel)
      : out_channels_(out_channels), kernel_{kernel, kernel} {}
  ConvOpts& kernel(int64_t kh, int64_t kw) { return kernel_ = {kh, kw}, *this; }
  ConvOpts& stride(int64_t s) { return stride_ = {s, s}, *this; }
  ConvOpts& stride(int64_t sh, int64_t sw) { return stride_ = {sh, sw}, *this; }
  ConvOpts& padding(int64_t p) { return padding_ = {p, p, p, p}, *this; }
  // Asymmetric padding, in ONNX order: top, left, bottom, right.
  ConvOpts& padding(int64_t top, int64_t left, int64_t bottom, int64_t right) {
    return padding_ = {top, left, bottom, right}, *this;
  }
  ConvOpts& dilation(int64_t d) { return dilation_ = {d, d}, *this; }
  ConvOpts& groups(int64_t g) { return groups_ = g, *this; }
  ConvOpts& bias(bool on = true) { return bias_ = on, *this; }
  // conv_transpose2d only: rows and columns added at the output's end.
  ConvOpts& output_padding(int64_t h, int64_t w) { return output_padding_ = {h, w}, *this; }

 private:
  friend class Builder;
  int64_t out_channels_;
  std::vector<int64_t> kernel_;
  std::vector<int64_t> stride_{1, 1};
  std::vector<int64_t> padding_{0, 0, 0, 0};
  std::vector<int64_t> dilation_{1, 1};
  int64_t groups_ = 1;
  bool bias_ = false;
  std::vector<int64_t> output_padding_{0, 0};
};

class PoolOpts {
 public:
  explicit PoolOpts(int64_t kernel) : kernel_{kernel, kernel}, stride_{kernel, kernel} {}
  PoolOpts& stride(int64_t s) { return stride_ = {s, s}, *this; }
  PoolOpts& padding(int64_t p) { return padding_ = {p, p, p, p}, *this; }
  PoolOpts& padding(int64_t top, int64_t left, int64_t bottom, int64_t right) {
    return padding_ = {top, left, bottom, right}, *this;
  }
  PoolOpts& ceil_mode(bool on = true) { return ceil_mode_ = on, *this; }
  PoolOpts& count_include_pad(bool on = true) { return count_include_pad_ = on, *this; }

 private:
  friend class Builder;
  std::vector<int64_t> kernel_, stride_;  // stride defaults to the kernel, as in PyTorch
  std::vector<int64_t> padding_{0, 0, 0, 0};
  bool ceil_mode_ = false;
  bool count_include_pad_ = false;
};

class Builder {
 public:
  explicit Builder(uint64_t seed = 0) : seed_(seed) {}

  // Weight data by name, for the ops added after this call; names not given here are
  // generated from the seed.
  void set_weights(std::map<std::string, Tensor> data);

  Val input(const std::string& name, const Shape& shape);
  void output(Val v);

  // Ops with weights take the name their weights are prefixed with.
  Val conv2d(Val x, const std::string& name, const ConvOpts& opts);
  // Weight [in channels, out channels / groups, kh, kw], as PyTorch's ConvTranspose2d.
  Val conv_transpose2d(Val x, const std::string& name, const ConvOpts& opts);
  Val batchnorm(Val x, const std::string& name, double eps = 1e-5);
  Val linear(Val x, const std::string& name, int64_t out_features, bool bias = true);

  // The rest take an optional node name; an empty one becomes "<op>_<n>".
  Val silu(Val x, const std::string& name = "");
  Val relu(Val x, const std::string& name = "");
  Val sigmoid(Val x, const std::string& name = "");
  // Any pointwise activation op with its parameters: clip(-1, 1), leaky_relu(0.1), gelu, ...
  Val activation(Val x, const Act& act, const std::string& name = "");
  Val add(Val a, Val b, const std::string& name = "");
  Val mul(Val a, Val b, const std::string& name = "");
  Val concat(const std::vector<Val>& xs, int64_t axis, const std::string& name = "");
  std::vector<Val> split(Val x, int64_t axis, const std::vector<int64_t>& sizes,
                         const std::string& name = "");
  // torch.chunk: `chunks` equal parts along `axis` (the last one smaller when it does not
  // divide).
  std::vector<Val> chunk(Val x, int64_t chunks, int64_t axis, const std::string& name = "");
  Val maxpool2d(Val x, const PoolOpts& opts, const std::string& name = "");
  Val avgpool2d(Val x, const PoolOpts& opts, const std::string& name = "");
  Val global_avgpool(Val x, const std::string& name = "");
  Val upsample_nearest(Val x, int64_t scale, const std::string& name = "");
  Val flatten(Val x, int64_t axis = 1, const std::string& name = "");
  // Binary elementwise ops with NumPy broadcasting: add, mul, sub, div, max or min.
  Val binary(OpKind op, Val a, Val b, const std::string& name = "");
  Val sub(Val a, Val b, const std::string& name = "");
  Val div(Val a, Val b, const std::string& name = "");
  Val transpose(Val x, const std::vector<int64_t>& perm, const std::string& name = "");
  // ShuffleNet's channel shuffle of x [N, C, ...] in `groups` groups; of parts, of their concat
  // on dim 1 (at most kMaxShuffleInputs).
  Val channel_shuffle(Val x, int64_t groups, const std::string& name = "");
  Val channel_shuffle(const std::vector<Val>& parts, int64_t groups, const std::string& name = "");
  // OpKind::DepthToSpace or SpaceToDepth (ONNX's) in blocks of blocksize [bh, bw] (one value:
  // square), mode "DCR" or "CRD" (PyTorch's pixel_shuffle and pixel_unshuffle); depth_to_space's
  // crop [top, left, bottom, right] (empty: none) drops those rows and columns of its output.
  Val depth_space(OpKind op, Val x, const std::vector<int64_t>& blocksize,
                  const std::string& mode = "DCR", const std::string& name = "",
                  const std::vector<int64_t>& crop = {});
  // ONNX Reshape: 0 keeps the dim, one -1 takes what is left.
  Val reshape(Val x, const std::vector<int64_t>& shape, const std::string& name = "");
  // ONNX Slice (axes empty: the first starts.size() dims; steps empty: 1).
  Val slice(Val x, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
            const std::vector<int64_t>& axes = {}, const std::vector<int64_t>& steps = {},
            const std::string& name = "");
  // pads: begins of every dim, then ends; mode "constant", "reflect" or "edge".
  Val pad(Val x, const std::vector<int64_t>& pads, const std::string& mode = "constant",
          double value = 0, const std::string& name = "");
  // reduce_mean, reduce_sum, reduce_max, reduce_min or reduce_prod over `axes` (all when empty).
  Val reduce(OpKind op, Val x, const std::vector<int64_t>& axes, bool keepdims = true,
             const std::string& name = "");
  Val softmax(Val x, int64_t axis = -1, const std::string& name = "");
  Val log_softmax(Val x, int64_t axis = -1, const std::string& name = "");
  // ONNX Resize to `sizes` (only the last two dims may change).
  Val resize(Val x, const std::vector<int64_t>& sizes, const std::string& mode = "nearest",
             const std::string& coordinate_mode = "half_pixel",
             const std::string& nearest_mode = "round_prefer_floor", const std::string& name = "");
  Val matmul(Val a, Val b, const std::string& name = "");
  // Normalizations with weights "<name>.weight" and "<name>.bias" (PyTorch's names); layer_norm
  // over x's dims from axis to last_axis (both included).
  Val layer_norm(Val x, const std::string& name, int64_t axis = -1, double eps = 1e-5,
                 int64_t last_axis = -1);
  Val group_norm(Val x, const std::string& name, int64_t groups, double eps = 1e-5);
  Val instance_norm(Val x, const std::string& name, double eps = 1e-5);

  // A named weight, filled from set_weights() or the seed (initialized as input `role` of
  // `op` would be, e.g. {BatchNorm, "running_var"} is positive).
  Val weight(const std::string& name, const Shape& shape, OpKind op, const std::string& role);

  // Any op of the table; returns the outputs. Single-output nodes name their output after the
  // node; split outputs are "<name>.0", "<name>.1", ...
  std::vector<Val> node(OpKind op, const std::vector<Val>& inputs, const Attrs& attrs,
                        const std::string& name = "");

  const Shape& shape(Val v) const { return graph_.value(v.name).shape; }
  // Verifies and hands over the graph. Weight data given but never used is an error (a typo
  // in a name would otherwise silently fall back to random weights).
  Graph build();

 private:
  Val single(OpKind op, const std::vector<Val>& inputs, const Attrs& attrs,
             const std::string& name);
  // Runs an op call that creates weights; if it throws, its weights are removed again so that
  // a failed call leaves the graph as it was.
  Val transactional(const std::function<Val()>& body);
  std::string fresh_name(OpKind op, const std::string& name);
  // conv2d and conv_transpose2d with their weights.
  Val conv(OpKind op, Val x, const std::string& name, const ConvOpts& o);
  // group_norm and instance_norm: x [N, C, ...] with a scale and a bias per channel.
  Val channel_norm(OpKind op, Val x, const std::string& name, const Attrs& attrs);

  uint64_t seed_;
  Graph graph_;
  std::map<std::string, Tensor> data_;
  std::map<std::string, int> counters_;
};

}  // namespace epilog
