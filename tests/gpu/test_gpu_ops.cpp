// Every op's CUDA kernel against the CPU reference on one-node graphs, the conv dispatch of
// the backend, the caching device allocator and host/device copies.
//
// Error, per element (test::check_close): |gpu - cpu| <= atol + rtol * |cpu|, NaN on one side
// only fails, NaN on both passes. Exact-math ops: test::kFloat32Op (1e-5 and 1e-5); conv
// kernels against their outputs' magnitudes (test::conv_magnitude): kSimtConv, or kTf32Conv for
// gemm. Device outputs start as NaN, so any element a kernel does not write fails.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "epilog/graph/activation.h"
#include "epilog/graph/lowering.h"
#include "epilog/io/builder.h"
#include "epilog/kernels/cuda.h"
#include "epilog/runtime/executor.h"
#include "epilog/runtime/params.h"
#include "gpu_util.h"

using namespace epilog;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

using test::cuda_backend;
using test::Outputs;
using test::require_close;
using test::run_node;

// Runs and compares every output (test::kFloat32Op).
void check(const Graph& g) {
  const Outputs o = run_node(g);
  for (size_t i = 0; i < o.cpu.size(); ++i)
    require_close(o.gpu[i], o.cpu[i], g.nodes[0].name + " output " + std::to_string(i));
}

Attrs pool_attrs(std::vector<int64_t> kernel, std::vector<int64_t> stride,
                 std::vector<int64_t> padding, bool ceil_mode) {
  Attrs a;
  a.set("kernel", kernel);
  a.set("stride", stride);
  a.set("padding", padding);
  a.set("ceil_mode", int64_t{ceil_mode});
  return a;
}

}  // namespace

// -- elementwise --

TEST_CASE("gpu ops: silu, relu and sigmoid match the CPU", "[gpu][ops]") {
  // Odd sizes (scalar path), multiples of 4 (float4 path), one element, and more elements than
  // one wave of threads covers (the grid-stride loop).
  const std::vector<Shape> shapes = {
      {2, 3, 5, 7}, {4, 16, 8, 8}, {1}, {2, 5, 333, 335}, {4, 16, 160, 160}};
  for (OpKind op : {OpKind::Silu, OpKind::Relu, OpKind::Sigmoid})
    for (const Shape& s : shapes) {
      Builder b(1);
      Val x = b.input("x", s);
      b.output(b.node(op, {x}, {}, "act")[0]);
      INFO(op_name(op) << " " << shape_str(s));
      check(b.build());
    }
}

TEST_CASE("gpu ops: every activation alone matches the CPU", "[gpu][ops][activation]") {
  // The op alone runs one kernel per kind with its math inlined (elementwise.cu InlineAct; mish
  // by its own formula there). Odd sizes (a float an item, the unroll's tail), a multiple of 4
  // (float4 items), one element, and more items than a wave of blocks. Inputs randn * 6, with
  // the ends of the ranges set in (mish and softplus switch formulas past 20, exp overflows past
  // 88; no zeros, whose reciprocal and log are infinite): NaN where the CPU's is NaN too (log,
  // sqrt and pow 0.5 below 0) passes.
  // clang-format off
  const std::vector<Act> acts = {
      Act(Activation::Silu),       Act(Activation::Relu),        Act(Activation::Sigmoid),
      Act(Activation::Clip, 0, 6), Act(Activation::LeakyRelu, 0.1f),
      Act(Activation::HardSigmoid, 1.0f / 6, 0.5f),              Act(Activation::HardSwish),
      Act(Activation::Tanh),       Act(Activation::Gelu),        Act(Activation::GeluTanh),
      Act(Activation::Mish),       Act(Activation::Softplus),    Act(Activation::Elu, 0.5f),
      Act(Activation::Exp),        Act(Activation::Erf),         Act(Activation::Sqrt),
      Act(Activation::Reciprocal), Act(Activation::Neg),         Act(Activation::Abs),
      Act(Activation::Log),        Act(Activation::Pow, 3.0f),   Act(Activation::Pow, 0.5f)};
  // clang-format on
  CHECK(acts.size() == size_t(kNumActivations));  // every kind but none (no op), pow twice
  const std::vector<Shape> shapes = {
      {2, 3, 5, 7}, {4, 16, 8, 8}, {1}, {3, 5, 67, 61}, {2, 32, 96, 96}};
  const float ends[] = {19.9f,  20.0f,   20.5f, 25.0f, 44.0f,  50.0f, -15.0f, -30.0f,
                        -90.0f, -100.0f, 88.0f, 1e-3f, -1e-3f, 0.5f,  -0.5f,  3.0f};
  for (const Act& act : acts)
    for (const Shape& s : shapes) {
      Builder b(1);
      Val x = b.input("x", s);
      b.output(b.activation(x, act, "act"));
      Tensor in = Tensor::randn(s, 11, 6.0f);
      for (int64_t i = 0; i < in.numel() && i < 16; ++i) in.f32()[in.numel() - 1 - i] = ends[i];
      INFO(op_name(activation_op(act).first)
           << " (" << act.a << ", " << act.b << ") " << shape_str(s));
      const Outputs o = run_node(b.build(), {{"x", in}});
      require_close(o.gpu[0], o.cpu[0], "activation");
    }
}

TEST_CASE("gpu ops: log matches the CPU, NaN below 0", "[gpu][ops]") {
  // |x| for most elements, a few negative ones (NaN on both sides); odd sizes and float4 ones.
  for (const Shape& s : std::vector<Shape>{{2, 3, 5, 7}, {4, 16, 8, 8}, {1}}) {
    Builder b(1);
    Val x = b.input("x", s);
    b.output(b.activation(x, Activation::Log, "log"));
    const Graph g = b.build();
    INFO("log " << shape_str(s));
    Tensor in = Tensor::randn(s, 7, 3.0f);
    for (int64_t i = 0; i < in.numel(); ++i)
      if (i % 11 != 5) in.f32()[i] = std::abs(in.f32()[i]) + 1e-3f;
    const Outputs o = run_node(g, {{"x", in}});
    require_close(o.gpu[0], o.cpu[0], "log");
  }
}

TEST_CASE("gpu ops: activations of views at unaligned offsets", "[gpu][ops]") {
  // Rows of 6 floats: row 1 starts 24 bytes in, so the float4 path must not be taken even
  // though the element count is a multiple of 4.
  Builder b(1);
  Val x = b.input("x", {2, 6});
  b.output(b.silu(x, "act"));
  const Graph g = b.build();
  const Tensor host = Tensor::randn({3, 6}, 5);
  const Tensor view = host.slice(1, 3);
  const Outputs o = run_node(g, {{"x", view.clone()}}, {{"x", host.to(Device::CUDA).slice(1, 3)}});
  require_close(o.gpu[0], o.cpu[0], "silu of a view");
}

TEST_CASE("gpu ops: batchnorm matches the CPU", "[gpu][ops]") {
  const std::vector<Shape> shapes = {
      {2, 3, 5, 7}, {4, 16, 8, 8}, {3, 5}, {2, 4, 3, 2, 5}, {2, 32, 97, 101}};
  for (const Shape& s : shapes)
    for (double eps : {1e-5, 1e-3}) {
      Builder b(2);
      Val x = b.input("x", s);
      b.output(b.batchnorm(x, "bn", eps));
      INFO(shape_str(s) << " eps " << eps);
      check(b.build());
    }
}

TEST_CASE("gpu ops: add and mul broadcast as NumPy does", "[gpu][ops]") {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{2, 3, 5, 7}, {2, 3, 5, 7}},              // equal, odd: flat scalar path
      {{4, 16, 8, 8}, {4, 16, 8, 8}},            // equal: flat float4 path
      {{2, 3, 5, 7}, {1, 3, 1, 1}},              // per channel
      {{4, 16, 8, 8}, {1, 16, 1, 1}},            // per channel, float4 rows
      {{2, 3, 5, 7}, {2, 3, 1, 1}},              // [N,C,1,1]
      {{2, 3, 5, 7}, {1}},                       // scalar
      {{1}, {2, 3, 5, 7}},                       // scalar first
      {{2, 3, 5, 7}, {7}},                       // rank mismatch, last dim
      {{5, 7}, {2, 3, 5, 7}},                    // rank mismatch, smaller first
      {{2, 3, 8, 8}, {3, 1, 8}},                 // rank mismatch with a broadcast inside
      {{2, 1, 5, 1}, {1, 3, 1, 7}},              // both operands broadcast
      {{3, 1}, {1, 4}},                          // outer product
      {{1}, {1}},                                // one element
      {{2, 1, 3, 1, 2, 5}, {1, 4, 1, 2, 1, 5}},  // the most dims the kernel takes
      {{8, 64, 40, 40}, {8, 64, 40, 40}},        // several waves
      {{8, 64, 40, 40}, {1, 64, 1, 1}},
  };
  for (OpKind op : {OpKind::Add, OpKind::Mul, OpKind::Sub, OpKind::Div, OpKind::Max, OpKind::Min})
    for (const auto& [sa, sb] : cases) {
      Builder b(3);
      Val a = b.input("a", sa), c = b.input("b", sb);
      b.output(b.node(op, {a, c}, {}, "op")[0]);
      INFO(op_name(op) << " " << shape_str(sa) << " x " << shape_str(sb));
      check(b.build());
    }
}

// -- fused_elementwise --

namespace {

// Chains run device math in their steps (sigmoid and silu through ex2.approx, within 3e-6 of
// their result; expf, tanhf, erff, powf within an ulp or two) on values of order 1 to 5, and
// carry that error on through the steps after, where an add or sub may cancel what it scales
// with: 3e-5 absolute bounds it with room, 1e-5 of the result the rounding of up to 8 steps.
constexpr test::Tolerance kChain{3e-5, 1e-5, "float32 chain"};

Graph chain_graph(const std::vector<Shape>& shapes, const std::string& program) {
  Builder b(4);
  std::vector<Val> xs;
  for (size_t k = 0; k < shapes.size(); ++k)
    xs.push_back(b.input("x" + std::to_string(k), shapes[k]));
  Attrs a;
  a.set("program", program);
  b.output(b.node(OpKind::FusedElementwise, xs, a, "chain")[0]);
  return b.build();
}

}  // namespace

TEST_CASE("gpu ops: fused_elementwise chains match the CPU", "[gpu][ops]") {
  struct Case {
    std::vector<Shape> shapes;
    std::string program;
  };
  const std::vector<Case> cases = {
      {{{2, 3, 5, 7}}, "relu, tanh, clip(0, 0.5)"},  // odd rows: a float an item
      {{{4, 16, 8, 8}}, "silu, neg, abs, sigmoid"},  // float4 items
      // Squeeze-excite: the gate [N,C,1,1] is the running value, broadcast up.
      {{{2, 8, 1, 1}, {2, 8, 5, 7}}, "sigmoid, mul(x1)"},
      {{{2, 8, 1, 1}, {2, 8, 8, 8}}, "sigmoid, mul(x1)"},
      {{{2, 8, 8, 8}, {2, 8, 1, 1}}, "mul(x1)"},
      {{{2, 8, 8, 8}, {8, 1, 1}, {8, 1, 1}}, "mul(x1), add(x2), relu"},  // batchnorm -> relu
      {{{2, 3, 5, 7}, {1, 3, 1, 1}}, "relu, sub(x1, v)"},
      {{{2, 3, 5, 7}, {5, 7}, {2, 1, 1, 7}}, "exp, div(x1, v), div(x2)"},
      {{{2, 3, 8, 8}, {3, 1, 8}, {8}, {2, 1, 8, 1}, {1}},  // five inputs
       "max(x1), min(x2, v), add(x3), mul(x4)"},
      {{{3, 1}, {1, 4}}, "add(x1), tanh"},  // an outer product
      {{{1}}, "relu"},
      {{{}, {2, 3}}, "neg, add(x1)"},                                               // a scalar
      {{{2, 1, 3, 1, 2, 5}, {1, 4, 1, 2, 1, 5}}, "mul(x1), gelu"},                  // six dims
      {{{8, 64, 40, 40}, {1, 64, 1, 1}, {1, 64, 1, 1}}, "mul(x1), add(x2), silu"},  // many waves
      {{{2, 3, 5, 7}},  // eight steps, the rarer activations
       "leaky_relu(0.1), hardsigmoid(0.2, 0.5), hardswish, elu(0.5), softplus, mish, gelu_tanh, "
       "erf"},
      {{{2, 3, 5, 7}, {2, 3, 5, 7}}, "abs, sqrt, reciprocal, mul(x1), pow(2)"},
      {{{2, 3, 5, 7}, {1, 3, 1, 1}}, "abs, add(x1), log, exp"},  // log: its own step too
      {{{4, 16, 8, 8}}, "tanh, mul(x0), sub(x0, v)"},            // x0 read again by a step
      {{{2, 8, 5, 7}, {8, 1, 1}}, "mul(x1), max(x0)"},                // PReLU, slopes <= 1
      {{{2, 8, 5, 7}, {1}, {8, 1, 1}}, "min(x1), mul(x2), add(x0)"},  // PReLU, slopes around 1
  };
  for (const Case& c : cases) {
    std::string shapes;
    for (const Shape& s : c.shapes) shapes += shape_str(s) + " ";
    INFO(c.program << " on " << shapes);
    const Outputs o = run_node(chain_graph(c.shapes, c.program));
    require_close(o.gpu[0], o.cpu[0], c.program, kChain);
  }
}

TEST_CASE("gpu ops: fused_elementwise on channel slabs of a batch", "[gpu][ops]") {
  // Channels 4..11 of 12 read, channels 2..9 of 12 written: dim 0 steps by the image. 7 wide
  // rows (a float an item) and 8 (float4 items on strided rows).
  for (const int64_t w : {7, 8}) {
    INFO("planes 5 x " << w);
    const int64_t plane = 5 * w;
    const Shape part{2, 8, 5, w}, whole{2, 12, 5, w};
    const Graph g = chain_graph({part, part}, "add(x1), relu, mul(x1)");
    const Node& node = g.nodes[0];
    const Tensor a = Tensor::randn(whole, 1), b = Tensor::randn(part, 2);
    std::vector<Tensor> cpu{Tensor::empty(part)};
    make_cpu_backend()->run(node, NodePlan{}, {a.part(4 * plane, part).clone(), b}, cpu);
    const Tensor dev_a = a.to(Device::CUDA);
    Tensor dev_y = Tensor::full(whole, kNaN).to(Device::CUDA);
    std::vector<Tensor> gpu{dev_y.part(2 * plane, part)};
    cuda_backend().run(node, NodePlan{}, {dev_a.part(4 * plane, part), b.to(Device::CUDA)}, gpu);
    cuda_backend().synchronize();
    require_close(gpu[0], cpu[0], "a chain on slabs", kChain);
    // The channels around the slab are not written.
    const Tensor y = dev_y.to(Device::CPU);
    int64_t written = 0;
    for (int64_t i = 0; i < y.numel(); ++i) {
      const int64_t c = i / plane % 12;
      if (c < 2 || c >= 10) written += !std::isnan(y.f32()[i]);
    }
    CHECK(written == 0);
  }
}

// -- data movement --

TEST_CASE("gpu ops: concat on every axis", "[gpu][ops]") {
  struct Case {
    std::vector<Shape> parts;
    int64_t axis;
  };
  const std::vector<Case> cases = {
      {{{1, 3, 5, 7}, {2, 3, 5, 7}}, 0},
      {{{2, 3, 5, 7}, {2, 4, 5, 7}, {2, 1, 5, 7}}, 1},
      {{{2, 8, 8, 8}, {2, 4, 8, 8}}, 1},  // float4 rows
      {{{2, 3, 5, 7}, {2, 3, 2, 7}}, 2},
      {{{2, 3, 5, 7}, {2, 3, 5, 1}, {2, 3, 5, 4}}, -1},
      {{{2, 3, 5, 7}, {2, 3, 5, 7}}, -3},
      {{{3, 5}, {3, 2}}, 1},
      {{{4, 32, 40, 40}, {4, 32, 40, 40}, {4, 32, 40, 40}, {4, 32, 40, 40}}, 1},  // SPPF-like
  };
  for (const Case& c : cases) {
    Builder b(4);
    std::vector<Val> xs;
    for (size_t i = 0; i < c.parts.size(); ++i)
      xs.push_back(b.input("x" + std::to_string(i), c.parts[i]));
    b.output(b.concat(xs, c.axis, "cat"));
    INFO("axis " << c.axis << ", first part " << shape_str(c.parts[0]));
    check(b.build());
  }
}

TEST_CASE("gpu ops: split and chunk on every axis", "[gpu][ops]") {
  struct Case {
    Shape x;
    int64_t axis;
    std::vector<int64_t> sizes;
  };
  const std::vector<Case> cases = {
      {{3, 3, 5, 7}, 0, {1, 2}},      {{2, 8, 5, 7}, 1, {3, 4, 1}},  {{2, 8, 8, 8}, 1, {4, 4}},
      {{2, 3, 5, 7}, 2, {2, 3}},      {{2, 3, 5, 7}, -1, {1, 2, 4}}, {{2, 3, 5, 7}, 3, {7}},
      {{4, 64, 40, 40}, 1, {32, 32}},
  };
  for (const Case& c : cases) {
    Builder b(5);
    Val x = b.input("x", c.x);
    for (Val v : b.split(x, c.axis, c.sizes, "split")) b.output(v);
    INFO(shape_str(c.x) << " axis " << c.axis);
    check(b.build());
  }
  Builder b(5);
  Val x = b.input("x", {2, 7, 3, 5});
  for (Val v : b.chunk(x, 3, 1, "chunk")) b.output(v);  // 3, 3, 1
  check(b.build());
}

TEST_CASE("gpu ops: concat and split, all parts in one launch", "[gpu][ops][concat]") {
  // copy_slabs takes up to kMaxSlabs parts a launch, float4 parts apart from the others: 11
  // parts (two launches), parts of 9 floats a channel (rows and starts of every alignment, so
  // float4 and scalar parts mixed), and SPPF's four equal ones.
  std::vector<Shape> many, odd;
  for (int64_t k = 1; k <= 11; ++k) many.push_back({2, k, 4, 4});
  for (int64_t k : {1, 4, 3, 8, 2, 4}) odd.push_back({3, k, 3, 3});
  const std::vector<std::vector<Shape>> cases = {
      many, odd, {{16, 64, 20, 20}, {16, 64, 20, 20}, {16, 64, 20, 20}, {16, 64, 20, 20}}};
  for (const std::vector<Shape>& parts : cases) {
    INFO(parts.size() << " parts, the first " << shape_str(parts[0]));
    Builder b(4);
    std::vector<Val> xs;
    int64_t channels = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      xs.push_back(b.input("x" + std::to_string(i), parts[i]));
      channels += parts[i][1];
    }
    b.output(b.concat(xs, 1, "cat"));
    check(b.build());
    Builder s(5);
    Val x = s.input("x", {parts[0][0], channels, parts[0][2], parts[0][3]});
    std::vector<int64_t> sizes;
    for (const Shape& p : parts) sizes.push_back(p[1]);
    for (Val v : s.split(x, 1, sizes, "split")) s.output(v);
    check(s.build());
  }
}

TEST_CASE("gpu ops: concat and split of channel slabs of a batch", "[gpu][ops][concat]") {
  // Parts and outputs as the executor makes them: channels of a larger batch, items 12 planes
  // apart. Planes of 5 x 7 (slabs at odd offsets: a float an item) and 5 x 8 (float4 items on
  // strided rows); the channels around a written slab stay as they were.
  for (const int64_t w : {7, 8}) {
    INFO("planes 5 x " << w);
    const int64_t plane = 5 * w;
    const Shape whole{2, 12, 5, w}, a_shape{2, 3, 5, w}, b_shape{2, 5, 5, w}, y_shape{2, 8, 5, w};
    const Tensor host = Tensor::randn(whole, 3), other = Tensor::randn(b_shape, 4);
    const Tensor dev_host = host.to(Device::CUDA);
    const auto unwritten = [&](const Tensor& dev, int64_t c0, int64_t c1) {
      const Tensor t = dev.to(Device::CPU);
      int64_t written = 0;
      for (int64_t i = 0; i < t.numel(); ++i) {
        const int64_t c = i / plane % 12;
        if (c < c0 || c >= c1) written += !std::isnan(t.f32()[i]);
      }
      return written;
    };
    {  // concat of channels 1..3 of `host` and a contiguous part into channels 3..10 of y
      Builder b(4);
      b.output(b.concat({b.input("a", a_shape), b.input("b", b_shape)}, 1, "cat"));
      const Graph g = b.build();
      std::vector<Tensor> cpu{Tensor::empty(y_shape)};
      make_cpu_backend()->run(g.nodes[0], NodePlan{}, {host.part(plane, a_shape).clone(), other},
                              cpu);
      Tensor dev_y = Tensor::full(whole, kNaN).to(Device::CUDA);
      std::vector<Tensor> gpu{dev_y.part(3 * plane, y_shape)};
      cuda_backend().run(g.nodes[0], NodePlan{},
                         {dev_host.part(plane, a_shape), other.to(Device::CUDA)}, gpu);
      cuda_backend().synchronize();
      require_close(gpu[0], cpu[0], "concat of slabs", test::Tolerance{0, 0, "copy"});
      CHECK(unwritten(dev_y, 3, 11) == 0);
    }
    {  // split of channels 3..10 of `host` into a slab (channels 1..3 of y) and a contiguous part
      Builder b(5);
      for (Val v : b.split(b.input("x", y_shape), 1, {3, 5}, "split")) b.output(v);
      const Graph g = b.build();
      std::vector<Tensor> cpu{Tensor::empty(a_shape), Tensor::empty(b_shape)};
      make_cpu_backend()->run(g.nodes[0], NodePlan{}, {host.part(3 * plane, y_shape).clone()}, cpu);
      Tensor dev_y = Tensor::full(whole, kNaN).to(Device::CUDA);
      std::vector<Tensor> gpu{dev_y.part(plane, a_shape),
                              Tensor::full(b_shape, kNaN).to(Device::CUDA)};
      cuda_backend().run(g.nodes[0], NodePlan{}, {dev_host.part(3 * plane, y_shape)}, gpu);
      cuda_backend().synchronize();
      require_close(gpu[0], cpu[0], "split into a slab", test::Tolerance{0, 0, "copy"});
      require_close(gpu[1], cpu[1], "split from a slab", test::Tolerance{0, 0, "copy"});
      CHECK(unwritten(dev_y, 1, 4) == 0);
    }
  }
}

TEST_CASE("gpu ops: upsample_nearest by 2 and by (2, 3)", "[gpu][ops]") {
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{2, 3, 5, 7}, {2, 2}}, {{2, 3, 5, 7}, {2, 3}}, {{1, 4, 8, 8}, {2, 2}},
      {{2, 3, 5, 7}, {3, 2}}, {{2, 3, 5, 7}, {1, 1}}, {{4, 64, 20, 20}, {2, 2}},
  };
  for (const auto& [s, scale] : cases) {
    Builder b(6);
    Val x = b.input("x", s);
    Attrs a;
    a.set("scale", scale);
    b.output(b.node(OpKind::UpsampleNearest, {x}, a, "up")[0]);
    INFO(shape_str(s) << " scale " << scale[0] << "x" << scale[1]);
    check(b.build());
  }
}

TEST_CASE("gpu ops: flatten is a view", "[gpu][ops]") {
  for (int64_t axis : {0, 1, 2, 4}) {
    Builder b(7);
    Val x = b.input("x", {2, 3, 5, 7});
    b.output(b.flatten(x, axis, "flat"));
    INFO("axis " << axis);
    check(b.build());
  }
}

// -- pooling --

namespace {

struct PoolCase {
  Shape x;
  std::vector<int64_t> kernel, stride, padding;
  bool ceil_mode;
};

const std::vector<PoolCase>& pool_cases() {
  static const std::vector<PoolCase> cases = {
      {{2, 3, 7, 9}, {2, 2}, {2, 2}, {0, 0, 0, 0}, false},
      {{2, 3, 7, 9}, {2, 2}, {2, 2}, {0, 0, 0, 0}, true},  // ceil: partial last window
      {{2, 3, 7, 9}, {3, 3}, {2, 2}, {1, 1, 1, 1}, false},
      {{2, 3, 7, 9}, {3, 3}, {2, 2}, {1, 1, 1, 1}, true},
      {{2, 3, 8, 8}, {5, 5}, {1, 1}, {2, 2, 2, 2}, false},   // SPPF
      {{2, 5, 9, 11}, {3, 3}, {1, 1}, {1, 1, 1, 1}, false},  // "same" 3x3, odd plane
      {{1, 4, 3, 2}, {5, 5}, {1, 1}, {2, 2, 2, 2}, false},   // "same" window wider than the plane
      {{1, 2, 6, 6}, {5, 5}, {1, 1}, {2, 1, 2, 3}, false},   // stride 1, padding not "same"
      {{2, 3, 9, 10}, {3, 2}, {2, 1}, {1, 0, 0, 1}, true},   // non-square, asymmetric padding
      {{1, 2, 5, 5}, {5, 5}, {5, 5}, {0, 0, 0, 0}, false},   // one window over everything
      {{2, 16, 40, 40}, {5, 5}, {1, 1}, {2, 2, 2, 2}, false},
      // wider than the unrolled row loop (8): the kernel's generic loop
      {{2, 3, 20, 24}, {9, 11}, {2, 3}, {4, 5, 4, 5}, true},
      // max: more planes than a wave of blocks (the plane kernel's grid-stride loop), and a
      // plane too large for shared memory (the per-output kernel)
      {{2, 600, 6, 7}, {5, 5}, {1, 1}, {2, 2, 2, 2}, false},
      {{1, 2, 100, 130}, {3, 3}, {1, 1}, {1, 1, 1, 1}, false},
  };
  return cases;
}

}  // namespace

TEST_CASE("gpu ops: maxpool2d with padding and ceil_mode", "[gpu][ops]") {
  for (const PoolCase& c : pool_cases()) {
    Builder b(8);
    Val x = b.input("x", c.x);
    b.output(b.node(OpKind::MaxPool2d, {x}, pool_attrs(c.kernel, c.stride, c.padding, c.ceil_mode),
                    "pool")[0]);
    INFO(shape_str(c.x) << " kernel " << c.kernel[0] << "x" << c.kernel[1] << " stride "
                        << c.stride[0] << "x" << c.stride[1] << " pad " << c.padding[0] << ","
                        << c.padding[1] << "," << c.padding[2] << "," << c.padding[3] << " ceil "
                        << c.ceil_mode);
    check(b.build());
  }
}

TEST_CASE("gpu ops: maxpool2d propagates NaN", "[gpu][ops]") {
  // 2x2 at stride 2 (the plane kernel) and 5x5 "same" (SPPF's kernel).
  for (const bool same : {false, true}) {
    Builder b(8);
    Val x = b.input("x", {1, 1, 4, 4});
    const Attrs a = same ? pool_attrs({5, 5}, {1, 1}, {2, 2, 2, 2}, false)
                         : pool_attrs({2, 2}, {2, 2}, {0, 0, 0, 0}, false);
    b.output(b.node(OpKind::MaxPool2d, {x}, a, "pool")[0]);
    Tensor in = Tensor::randn({1, 1, 4, 4}, 9);
    in.f32()[5] = kNaN;  // in window (0, 0) either way, not its first element
    const Outputs o = run_node(b.build(), {{"x", in}});
    INFO(same);
    REQUIRE(std::isnan(o.cpu[0].f32()[0]));
    require_close(o.gpu[0], o.cpu[0], "maxpool with a NaN");
  }
}

TEST_CASE("gpu ops: avgpool2d with padding, ceil_mode and count_include_pad", "[gpu][ops]") {
  for (const PoolCase& c : pool_cases())
    for (bool include_pad : {false, true}) {
      Builder b(9);
      Val x = b.input("x", c.x);
      Attrs a = pool_attrs(c.kernel, c.stride, c.padding, c.ceil_mode);
      a.set("count_include_pad", int64_t{include_pad});
      b.output(b.node(OpKind::AvgPool2d, {x}, a, "pool")[0]);
      INFO(shape_str(c.x) << " kernel " << c.kernel[0] << "x" << c.kernel[1] << " pad "
                          << c.padding[0] << "," << c.padding[1] << "," << c.padding[2] << ","
                          << c.padding[3] << " ceil " << c.ceil_mode << " count_include_pad "
                          << include_pad);
      check(b.build());
    }
}

TEST_CASE("gpu ops: global_avgpool by warp and by block", "[gpu][ops]") {
  // Rows up to 1024 floats take a warp each, longer ones a block; float4 loads need rows that
  // are multiples of 4.
  const std::vector<Shape> shapes = {{2, 3, 5, 7},   {2, 16, 8, 8},    {1, 3, 64, 65},
                                     {2, 4, 64, 64}, {3, 4, 10},       {2, 3, 2, 3, 5},
                                     {1, 1, 1, 1},   {16, 256, 20, 20}};
  for (const Shape& s : shapes) {
    Builder b(10);
    Val x = b.input("x", s);
    b.output(b.global_avgpool(x, "gap"));
    INFO(shape_str(s));
    check(b.build());
  }
}

// -- linear --

TEST_CASE("gpu ops: linear with and without bias", "[gpu][ops]") {
  struct Case {
    int64_t m, k, n;
  };
  // M up to 8 takes the GEMV path (float4 where k % 4 == 0), above it the tiled one.
  const std::vector<Case> cases = {{5, 7, 3},       {33, 70, 65},  {64, 128, 64}, {1, 1, 1},
                                   {130, 300, 129}, {2, 1000, 10}, {257, 64, 17}, {1, 4096, 1000},
                                   {8, 516, 77},    {9, 516, 77},  {3, 1001, 33}};
  for (const Case& c : cases)
    for (bool bias : {true, false}) {
      Builder b(11);
      Val x = b.input("x", {c.m, c.k});
      b.output(b.linear(x, "fc", c.n, bias));
      INFO("m " << c.m << " k " << c.k << " n " << c.n << " bias " << bias);
      check(b.build());
    }
}

// -- convolution dispatch (the kernels' own tests live with them; this checks the backend's
// choice of launcher, its bias/scale/shift wiring and the refusal of unsupported shapes) --

TEST_CASE("gpu ops: conv2d and fused_conv2d dispatch to each conv kernel", "[gpu][ops][conv]") {
  struct Case {
    Shape x;
    int64_t cout, k, stride, pad, groups;
  };
  const std::vector<Case> cases = {{{2, 3, 17, 19}, 16, 3, 2, 1, 1},
                                   {{2, 32, 10, 10}, 64, 1, 1, 0, 1},
                                   {{1, 8, 9, 9}, 8, 3, 1, 1, 8}};
  for (const Case& c : cases)
    for (ConvKernel kernel : {ConvKernel::Scalar, ConvKernel::Tiled, ConvKernel::Gemm})
      for (int variant = 0; variant < 3; ++variant) {  // conv2d, conv2d + bias, fused
        Builder b(12);
        Val x = b.input("x", c.x);
        const int64_t cin = c.x[1];
        if (variant < 2) {
          b.output(b.conv2d(x, "conv",
                            ConvOpts(c.cout, c.k)
                                .stride(c.stride)
                                .padding(c.pad)
                                .groups(c.groups)
                                .bias(variant == 1)));
        } else {
          Val w = b.weight("conv.weight", {c.cout, cin / c.groups, c.k, c.k}, OpKind::FusedConv2d,
                           "weight");
          Val scale = b.weight("conv.scale", {c.cout}, OpKind::FusedConv2d, "scale");
          Val shift = b.weight("conv.shift", {c.cout}, OpKind::FusedConv2d, "shift");
          Attrs a;
          a.set("stride", std::vector<int64_t>{c.stride, c.stride});
          a.set("padding", std::vector<int64_t>{c.pad, c.pad, c.pad, c.pad});
          a.set("groups", c.groups);
          a.set("activation", std::string("silu"));
          b.output(b.node(OpKind::FusedConv2d, {x, w, scale, shift}, a, "conv")[0]);
        }
        const Graph g = b.build();
        const ConvShape cs = conv_shape(g, g.nodes[0]);
        NodePlan plan;
        plan.conv = kernel;
        plan.kernel = conv_kernel_name(kernel);
        // Tiles without warpgroup MMA: its kernel reads weights packed by lowering, which this
        // hand-made plan skips (the conv tests and the models cover it).
        DeviceProfile profile = h200_profile();
        profile.wgmma = false;
        plan.tiles = conv_tiles(kernel, cs, profile);
        INFO(conv_kernel_name(kernel)
             << " variant " << variant << " x " << shape_str(c.x) << " groups " << c.groups);
        if (!conv_supports(kernel, cs)) {
          REQUIRE_THROWS_WITH(run_node(g, {}, {}, plan),
                              Catch::Contains("cannot run") && Catch::Contains("conv"));
          continue;
        }
        const Outputs o = run_node(g, {}, {}, plan);
        // conv2d's bias and fused_conv2d's shift add no products; the fused scale multiplies them.
        const Tensor mag = test::conv_magnitude(cs, o.inputs[0], o.inputs[1],
                                                variant == 2 ? o.inputs[2].f32() : nullptr);
        require_close(o.gpu[0], o.cpu[0], "conv",
                      kernel == ConvKernel::Gemm ? test::kTf32Conv : test::kSimtConv, &mag);
      }
}

// -- memory --

TEST_CASE("gpu memory: a freed block is reused", "[gpu][memory]") {
  REQUIRE(cuda_available());
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({1000}, DType::F32, Device::CUDA);
    first = t.raw();
    REQUIRE(first != nullptr);
  }
  // 4000 and 4004 bytes round to the same 512-byte bucket.
  Tensor again = Tensor::empty({1001}, DType::F32, Device::CUDA);
  REQUIRE(again.raw() == first);
  // A live block is never handed out twice.
  Tensor other = Tensor::empty({1000}, DType::F32, Device::CUDA);
  REQUIRE(other.raw() != again.raw());
  // Large blocks (powers of two above 1 MiB) come back too.
  void* big = nullptr;
  {
    Tensor t = Tensor::empty({3, 1 << 20}, DType::F32, Device::CUDA);
    big = t.raw();
  }
  Tensor big_again = Tensor::empty({4, 1 << 20}, DType::F32, Device::CUDA);  // 12 and 16 MiB
  REQUIRE(big_again.raw() == big);
}

TEST_CASE("gpu memory: many allocations stay distinct and hold their data", "[gpu][memory]") {
  Rng rng(13);
  std::vector<Tensor> live;
  std::set<const void*> seen;
  for (int i = 0; i < 600; ++i) {
    // Mostly small, some above 1 MiB, some empty.
    const int64_t n =
        i % 50 == 0 ? (1 << 19) + int64_t(rng.uniform(0, 1 << 19)) : int64_t(rng.uniform(0, 20000));
    Tensor t = Tensor::full({n}, float(i)).to(Device::CUDA);
    if (n > 0) REQUIRE(seen.insert(t.raw()).second);
    live.push_back(t);
    if (i % 3 == 2) {  // free every third one, so later ones reuse blocks
      seen.erase(live[i - 1].raw());
      live[i - 1] = Tensor();
    }
  }
  for (size_t i = 0; i < live.size(); ++i) {
    if (!live[i].defined() || live[i].numel() == 0) continue;
    const Tensor h = live[i].to(Device::CPU);
    INFO("tensor " << i);
    REQUIRE(h.f32()[0] == float(i));
    REQUIRE(h.f32()[h.numel() - 1] == float(i));
  }
}

TEST_CASE("gpu memory: host and device copies round trip", "[gpu][memory]") {
  const Tensor host = Tensor::randn({3, 5, 7}, 14);
  const Tensor dev = host.to(Device::CUDA);
  REQUIRE(dev.device() == Device::CUDA);
  REQUIRE(dev.to(Device::CUDA).shares_storage(dev));  // no copy unless forced
  const Tensor dev2 = dev.clone();                    // device to device
  REQUIRE_FALSE(dev2.shares_storage(dev));
  const Tensor back = dev2.to(Device::CPU);
  REQUIRE(back.shape() == host.shape());
  for (int64_t i = 0; i < host.numel(); ++i) REQUIRE(back.f32()[i] == host.f32()[i]);
  // A view at an offset copies only its rows.
  const Tensor rows = dev.slice(1, 3).to(Device::CPU);
  for (int64_t i = 0; i < rows.numel(); ++i) REQUIRE(rows.f32()[i] == host.f32()[35 + i]);
  // Empty tensors copy nothing.
  REQUIRE(Tensor::empty({0, 4}).to(Device::CUDA).to(Device::CPU).numel() == 0);
}
