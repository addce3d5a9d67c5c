// The CPU backend: op kinds mapped to the reference kernels of kernels/cpu.
#include <array>

#include "epilog/kernels/cpu.h"
#include "epilog/runtime/executor.h"
#include "epilog/runtime/params.h"

namespace epilog {
namespace {

using In = const std::vector<Tensor>&;
using Out = std::vector<Tensor>&;
using CpuKernel = void (*)(const Node&, In, Out);

const float* opt(In in, size_t i) {
  return i < in.size() ? in[i].f32() : nullptr;
}

void conv(const Node& n, In in, Out out) {
  ConvShape cs = conv_shape(n, in, out[0]);
  const Tensor* residual = conv_residual(n, in);
  if (n.op == OpKind::Conv2d)
    cpu::conv2d(cs, in[0].f32(), in[1].f32(), nullptr, opt(in, 2), Activation::None, out[0].f32());
  else
    cpu::conv2d(cs, in[0].f32(), in[1].f32(), in[2].f32(), in[3].f32(), conv_activation(n),
                out[0].f32(), residual ? residual->f32() : nullptr, fused_residual_first(n));
}

const std::array<CpuKernel, kNumOps>& kernels() {
  static const std::array<CpuKernel, kNumOps> table = [] {
    std::array<CpuKernel, kNumOps> t{};
    auto at = [&t](OpKind op) -> CpuKernel& { return t[static_cast<size_t>(op)]; };
    at(OpKind::Conv2d) = conv;
    at(OpKind::FusedConv2d) = conv;
    at(OpKind::BatchNorm) = [](const Node& n, In in, Out out) {
      cpu::batchnorm(in[0], in[1], in[2], in[3], in[4], n.attrs.f("eps"), out[0]);
    };
    for (int op = 0; op < kNumOps; ++op)
      if (is_activation_op(OpKind(op)))
        t[size_t(op)] = [](const Node& n, In in, Out out) {
          cpu::activation(*node_activation(n), in[0], out[0]);
        };
    for (int op = 0; op < kNumOps; ++op)
      if (binary_kind(OpKind(op)))
        t[size_t(op)] = [](const Node& n, In in, Out out) {
          cpu::binary(*binary_kind(n.op), in[0], in[1], out[0]);
        };
    at(OpKind::FusedElementwise) = [](const Node& n, In in, Out out) {
      std::vector<const float*> xs;
      for (const Tensor& t : in) xs.push_back(t.f32());
      cpu::fused_elementwise(node_chain(n), chain_shape(n, in, out[0]), xs.data(), out[0].f32());
    };
    at(OpKind::Concat) = [](const Node& n, In in, Out out) {
      std::vector<const Tensor*> xs;
      for (const Tensor& t : in) xs.push_back(&t);
      int64_t axis = n.attrs.i("axis");
      cpu::concat(xs, axis < 0 ? axis + in[0].rank() : axis, out[0]);
    };
    at(OpKind::Split) = [](const Node& n, In in, Out out) {
      int64_t axis = n.attrs.i("axis");
      cpu::split(in[0], axis < 0 ? axis + in[0].rank() : axis, out);
    };
    at(OpKind::MaxPool2d) = [](const Node& n, In in, Out out) {
      cpu::maxpool2d(pool_shape(n, in[0], out[0]), in[0].f32(), out[0].f32());
    };
    at(OpKind::AvgPool2d) = [](const Node& n, In in, Out out) {
      cpu::avgpool2d(pool_shape(n, in[0], out[0]), in[0].f32(), out[0].f32());
    };
    at(OpKind::GlobalAvgPool) = [](const Node&, In in, Out out) {
      cpu::global_avgpool(in[0], out[0]);
    };
    at(OpKind::UpsampleNearest) = [](const Node& n, In in, Out out) {
      const auto& s = n.attrs.ints("scale");
      cpu::upsample_nearest(in[0], s[0], s[1], out[0]);
    };
    at(OpKind::Flatten) = [](const Node&, In in, Out out) {
      out[0] = in[0].reshape(out[0].shape());
    };
    at(OpKind::Linear) = [](const Node&, In in, Out out) {
      cpu::linear(in[0], in[1], in.size() > 2 ? in[2] : Tensor{}, out[0]);
    };
    for (OpKind op : {OpKind::Transpose, OpKind::Slice})
      at(op) = [](const Node& n, In in, Out out) {
        const GatherView v = gather_view(n, in[0].shape());
        cpu::gather(in[0], v.offset, v.strides, out[0]);
      };
    at(OpKind::Reshape) = at(OpKind::Flatten);
    at(OpKind::ChannelShuffle) = [](const Node& n, In in, Out out) {
      std::vector<const Tensor*> parts;
      for (const Tensor& x : in) parts.push_back(&x);
      cpu::channel_shuffle(parts, n.attrs.i("groups"), out[0]);
    };
    for (OpKind op : {OpKind::DepthToSpace, OpKind::SpaceToDepth})
      at(op) = [](const Node& n, In in, Out out) {
        const auto& b = n.attrs.ints("blocksize");
        const bool to_space = n.op == OpKind::DepthToSpace;
        cpu::depth_space(in[0], b[0], b[1], n.attrs.s("mode") == "CRD", to_space, out[0],
                         to_space ? n.attrs.ints("crop")[0] : 0,
                         to_space ? n.attrs.ints("crop")[1] : 0);
      };
    at(OpKind::Pad) = [](const Node& n, In in, Out out) {
      const std::string& mode = n.attrs.s("mode");
      const auto& pads = n.attrs.ints("pads");
      cpu::pad(in[0], {pads.begin(), pads.begin() + in[0].rank()},
               mode == "constant"  ? cpu::PadMode::Constant
               : mode == "reflect" ? cpu::PadMode::Reflect
                                   : cpu::PadMode::Edge,
               float(n.attrs.f("value")), out[0]);
    };
    for (OpKind op : {OpKind::ReduceMean, OpKind::ReduceSum, OpKind::ReduceMax, OpKind::ReduceMin,
                      OpKind::ReduceProd})
      at(op) = [](const Node& n, In in, Out out) {
        cpu::reduce(*reduce_kind(n.op), in[0], reduced_dims(n, in[0].shape()), out[0]);
      };
    for (OpKind op : {OpKind::Softmax, OpKind::LogSoftmax})
      at(op) = [](const Node& n, In in, Out out) {
        cpu::softmax(in[0], axis_attr(n, in[0].rank()), out[0], n.op == OpKind::LogSoftmax);
      };
    at(OpKind::LayerNorm) = [](const Node& n, In in, Out out) {
      cpu::layer_norm(in[0], axis_attr(n, in[0].rank()), axis_attr(n, in[0].rank(), "last_axis"),
                      in[1], in.size() > 2 ? in[2] : Tensor{}, n.attrs.f("eps"), out[0]);
    };
    at(OpKind::GroupNorm) = [](const Node& n, In in, Out out) {
      cpu::group_norm(in[0], n.attrs.i("groups"), in[1], in[2], n.attrs.f("eps"), out[0]);
    };
    at(OpKind::InstanceNorm) = [](const Node& n, In in, Out out) {
      cpu::group_norm(in[0], in[0].dim(1), in[1], in[2], n.attrs.f("eps"), out[0]);
    };
    at(OpKind::Resize) = [](const Node& n, In in, Out out) {
      cpu::resize(in[0], resize_mode(n), out[0]);
    };
    at(OpKind::ConvTranspose2d) = [](const Node& n, In in, Out out) {
      cpu::conv_transpose2d(conv_shape(n, in[0].shape(), in[1].shape(), out[0].shape()),
                            in[0].f32(), in[1].f32(), opt(in, 2), out[0].f32());
    };
    at(OpKind::MatMul) = [](const Node&, In in, Out out) { cpu::matmul(in[0], in[1], out[0]); };
    return t;
  }();
  return table;
}

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::CPU; }
  void run(const Node& node, const NodePlan&, const std::vector<Tensor>& inputs,
           std::vector<Tensor>& outputs) override {
    CpuKernel k = kernels()[static_cast<size_t>(node.op)];
    if (!k) fail("[{}] has no CPU implementation", op_name(node.op));
    // Handed more than the node's own inputs or outputs, it is running a fold (a neighbour's
    // work, which lowering plans only for CUDA): these kernels would leave that work undone.
    if (inputs.size() > node.inputs.size() || outputs.size() > node.outputs.size())
      fail(
          "[{}] node '{}': handed {} inputs and {} outputs for its {} and {}: a fold, which only "
          "the CUDA backend runs",
          op_name(node.op), node.name, inputs.size(), outputs.size(), node.inputs.size(),
          node.outputs.size());
    k(node, inputs, outputs);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace epilog
