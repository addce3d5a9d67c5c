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
                out[0].f32(), residual ? residual->f32() : nullptr,
                fused_residual_first(n));
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
    at(OpKind::Add) = [](const Node&, In in, Out out) {
      cpu::binary(cpu::Binary::Add, in[0], in[1], out[0]);
    };
    at(OpKind::Mul) = [](const Node&, In in, Out out) {
      cpu::binary(cpu::Binary::Mul, in[0], in[1], out[0]);
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
      cpu::avgpool2d(pool_shape(n, in[0].shape(), out[0].shape()), in[0].f32(), out[0].f32());
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
