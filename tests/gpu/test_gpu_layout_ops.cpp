// The layout, reduction, normalization, resampling and matmul ops' CUDA kernels against the CPU
// reference on one-node graphs (test::run_node: random inputs, device outputs poisoned with NaN,
// so any element a kernel does not write fails). Tolerance test::kFloat32Op, except where noted:
// copies must match exactly; sums and normalizations in float32 against the CPU's float64 sums.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <tuple>
#include <vector>

#include "epilog/epilog.h"
#include "epilog/io/builder.h"
#include "epilog/kernels/launch.h"
#include "gpu_util.h"
#include "test_util.h"

using namespace epilog;

namespace {

// Sums in float32 (reductions, matmul) against the magnitude: the same op on |inputs|, the sum of
// the terms' sizes; a float32 sum of K terms in any order is off by at most (K + 1) u of it, and
// the kernels' sums are at most 130 terms deep in a chain (lanes, then shuffles).
constexpr test::Tolerance kFloat32Sum{1e-5, 1e-5, "float32 sum"};
// matmul's TF32 kernel against the same magnitude: each operand rounded to 10 mantissa bits, as
// gemm's convs (gpu_util.h kTf32Conv says why 2.5e-3 of it bounds a reduction up to 4096 deep).
constexpr test::Tolerance kTf32Sum{2.5e-3, 2e-3, "TF32 sum"};
// Softmax and the normalizations: results of order 1 after float32 sums of up to 4100 terms.
constexpr test::Tolerance kFloat32Norm{2e-5, 2e-5, "float32 normalization"};
constexpr test::Tolerance kExact{0, 0, "copy"};

// Runs the op `make` adds to a graph of inputs of `shapes` ("x", or "a" and "b") on both backends.
// With `magnitude`, the bound scales with the op's result on the inputs' absolute values.
void check_op(const std::vector<Shape>& shapes,
              const std::function<Val(Builder&, std::vector<Val>)>& make,
              const test::Tolerance& tol = test::kFloat32Op, bool magnitude = false) {
  Builder b(5);
  std::vector<Val> xs;
  const char* names[] = {"a", "b"};
  for (size_t i = 0; i < shapes.size(); ++i)
    xs.push_back(b.input(shapes.size() == 1 ? "x" : names[i], shapes[i]));
  b.output(make(b, xs));
  const Graph g = b.build();
  INFO(op_name(g.nodes[0].op) << " of " << shape_str(shapes[0]));
  const test::Outputs o = test::run_node(g);
  Tensor mag;
  if (magnitude) {
    std::vector<Tensor> abs_in;
    for (const Tensor& t : o.inputs) {
      abs_in.push_back(t.clone());
      for (int64_t i = 0; i < t.numel(); ++i) abs_in.back().f32()[i] = std::abs(t.f32()[i]);
    }
    std::vector<Tensor> out{Tensor::empty(o.cpu[0].shape())};
    make_cpu_backend()->run(g.nodes[0], NodePlan{}, abs_in, out);
    mag = out[0];
  }
  test::require_close(o.gpu[0], o.cpu[0], g.nodes[0].name, tol, magnitude ? &mag : nullptr);
}

}  // namespace

TEST_CASE("gpu layout ops: transpose, any permutation, tiled and generic", "[gpu][ops]") {
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{2, 64, 56, 56}, {0, 2, 3, 1}},        // NCHW -> NHWC (tiled: x's innermost moves)
      {{2, 56, 56, 96}, {0, 3, 1, 2}},        // NHWC -> NCHW
      {{3, 33, 17, 65}, {0, 2, 3, 1}},        // partial tiles
      {{1, 2, 58, 28, 28}, {0, 2, 1, 3, 4}},  // channel shuffle (generic: inner runs kept)
      {{5, 7}, {1, 0}},
      {{4, 1, 3, 1, 6}, {4, 3, 2, 1, 0}},
      {{2, 3, 4, 5, 6, 7}, {5, 0, 4, 1, 3, 2}}};
  for (const auto& [shape, perm] : cases)
    check_op(
        {shape}, [&](Builder& b, std::vector<Val> v) { return b.transpose(v[0], perm); }, kExact);
}

TEST_CASE("gpu layout ops: channel_shuffle, the gather of a 4-D view of x", "[gpu][ops]") {
  const std::vector<std::pair<Shape, int64_t>> cases = {{{2, 116, 28, 28}, 2},  // ShuffleNetV2's
                                                        {{3, 12, 5, 7}, 3},
                                                        {{2, 8}, 4},
                                                        {{1, 6, 2, 3, 5}, 6},
                                                        {{2, 5, 3, 3}, 1}};
  for (const auto& [shape, groups] : cases)
    check_op(
        {shape}, [&](Builder& b, std::vector<Val> v) { return b.channel_shuffle(v[0], groups); },
        kExact);
}

TEST_CASE("gpu layout ops: channel_shuffle of parts, one a split's strided view", "[gpu][ops]") {
  // ShuffleNetV2's stride-1 block reads the first half of a split (a view whose images lie apart)
  // and its branch's output; odd sizes take the one-float path.
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> cases = {{58, 28, 2}, {6, 5, 3}};
  for (const auto& [c, hw, groups] : cases) {
    INFO(c << " + " << c << " channels of " << hw << "x" << hw << " in " << groups << " groups");
    Builder b(5);
    const Shape part{2, c, hw, hw};
    b.output(b.channel_shuffle({b.input("x1", part), b.input("x2", part)}, groups));
    const Graph g = b.build();
    const Tensor whole = Tensor::randn({2, 2 * c, hw, hw}, 7);
    Tensor x1 = Tensor::empty(part);  // whole's second half, contiguous
    const int64_t item = c * hw * hw;
    for (int64_t n = 0; n < 2; ++n)
      std::copy(whole.f32() + (2 * n + 1) * item, whole.f32() + (2 * n + 2) * item,
                x1.f32() + n * item);
    const Tensor device_whole = whole.to(Device::CUDA);
    const Tensor view = device_whole.part(item, part);
    REQUIRE_FALSE(view.contiguous());
    const test::Outputs o = test::run_node(g, {{"x1", x1}}, {{"x1", view}});
    test::require_close(o.gpu[0], o.cpu[0], "shuffle of parts", kExact);
  }
}

TEST_CASE("gpu layout ops: reshape is a view on the device too", "[gpu][ops]") {
  check_op(
      {{2, 116, 28, 28}},
      [](Builder& b, std::vector<Val> v) {
        return b.reshape(v[0], {0, 2, 58, 28, 28});
      },
      kExact);
}

TEST_CASE("gpu layout ops: slice, steps and clamping", "[gpu][ops]") {
  const Shape s{2, 7, 9, 10};
  const std::vector<std::vector<std::vector<int64_t>>> cases = {
      // starts, ends, axes, steps
      {{1, 2}, {5, 100}, {1, 3}, {1, 1}},
      {{-1, 0}, {INT64_MIN, 9}, {2, 3}, {-2, 3}},
      {{0}, {1}, {0}, {1}},
      {{3, 4, 1}, {-1, 8, 9}, {1, 2, 3}, {2, 1, 4}}};
  for (const auto& c : cases)
    check_op(
        {s}, [&](Builder& b, std::vector<Val> v) { return b.slice(v[0], c[0], c[1], c[2], c[3]); },
        kExact);
}

TEST_CASE("gpu layout ops: pad in every mode", "[gpu][ops]") {
  for (const char* mode : {"constant", "reflect", "edge"})
    for (const std::vector<int64_t>& pads : {std::vector<int64_t>{0, 0, 1, 2, 0, 0, 3, 1},
                                             std::vector<int64_t>{1, 2, 0, 0, 0, 1, 2, 2}})
      check_op(
          {{2, 3, 9, 11}},
          [&](Builder& b, std::vector<Val> v) { return b.pad(v[0], pads, mode, 0.5); }, kExact);
}

TEST_CASE("gpu layout ops: resize, nearest and bilinear in every coordinate mode", "[gpu][ops]") {
  for (const char* coord : {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"})
    for (const std::vector<int64_t>& sizes :
         {std::vector<int64_t>{2, 3, 26, 30}, std::vector<int64_t>{2, 3, 5, 4},
          std::vector<int64_t>{2, 3, 1, 1}}) {
      check_op({{2, 3, 13, 15}}, [&](Builder& b, std::vector<Val> v) {
        return b.resize(v[0], sizes, "linear", coord);
      });
      for (const char* nearest : {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"})
        check_op(
            {{2, 3, 13, 15}},
            [&](Builder& b, std::vector<Val> v) {
              return b.resize(v[0], sizes, "nearest", coord, nearest);
            },
            kExact);
    }
}

TEST_CASE("gpu layout ops: pad, merged dims, odd widths and many blocks", "[gpu][ops][pad]") {
  // The kernel merges dims (constant: an unpadded dim into the one before it; reflect and edge:
  // only unpadded neighbours), so pads on every single dim, on inner ones only and on outer ones
  // only, ranks 1 to 5, size-1 dims, and tensors past one wave of blocks (the op_bench shapes
  // at batch 2: TF-same, reflection pad 1 and the stem's pad 3).
  struct Case {
    Shape x;
    std::vector<int64_t> pads;
  };
  const std::vector<Case> cases = {
      {{2, 96, 112, 112}, {0, 0, 0, 0, 0, 0, 1, 1}},
      {{2, 64, 64, 64}, {0, 0, 1, 1, 0, 0, 1, 1}},
      {{2, 3, 256, 256}, {0, 0, 3, 3, 0, 0, 3, 3}},
      {{3, 5, 7, 9}, {0, 2, 0, 0, 0, 1, 0, 0}},  // channels only (constant: H * W merged)
      {{3, 5, 7, 9}, {1, 0, 0, 2, 2, 0, 0, 3}},  // batch and width
      {{3, 5, 7, 9}, {1, 1, 2, 2, 1, 3, 4, 1}},  // every dim
      {{1, 1, 7, 1}, {0, 0, 3, 0, 0, 0, 2, 0}},  // size-1 dims
      {{13}, {4, 7}},                            // one dim
      {{2, 3, 1, 5, 6}, {0, 1, 0, 2, 0, 0, 0, 0, 3, 1}},
      {{4, 2, 3, 2}, {0, 0, 1, 1, 0, 0, 1, 1}}};  // reflect of a dim of 2 (pad 1)
  for (const char* mode : {"constant", "reflect", "edge"})
    for (const Case& c : cases) {
      INFO(mode << " pad of " << shape_str(c.x));
      check_op(
          {c.x}, [&](Builder& b, std::vector<Val> v) { return b.pad(v[0], c.pads, mode, -1.5); },
          kExact);
    }
}

TEST_CASE("gpu layout ops: resize, integer factors, float4 rows and many blocks",
          "[gpu][ops][resize]") {
  // Nearest by integer factors runs as upsample_nearest where the mode reads o / factor (the
  // host checks every index; half_pixel with round_prefer_ceil does at x2, align_corners does
  // not), else the resize kernel: float4 rows where the output width is a multiple of 4, a
  // float an item otherwise. Downsampling, a factor on one axis only, and op_bench's shapes at
  // batch 2 (x2 of 64 x 64, DeepLab's 33 -> 520 bilinear).
  struct Case {
    Shape x;
    std::vector<int64_t> sizes;
  };
  const std::vector<Case> cases = {
      {{2, 16, 64, 64}, {2, 16, 128, 128}}, {{2, 21, 33, 33}, {2, 21, 520, 520}},
      {{2, 3, 13, 15}, {2, 3, 39, 30}},     {{2, 3, 13, 15}, {2, 3, 13, 45}},
      {{2, 3, 12, 16}, {2, 3, 6, 8}},       {{2, 3, 13, 15}, {2, 3, 17, 19}},
      {{1, 2, 1, 1}, {1, 2, 4, 4}},         {{3, 7, 9}, {3, 21, 36}}};
  for (const Case& c : cases)
    for (const char* coord : {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"}) {
      INFO(shape_str(c.x) << " -> " << shape_str(c.sizes) << ", " << coord);
      check_op({c.x}, [&](Builder& b, std::vector<Val> v) {
        return b.resize(v[0], c.sizes, "linear", coord);
      });
      for (const char* nearest : {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"})
        check_op(
            {c.x},
            [&](Builder& b, std::vector<Val> v) {
              return b.resize(v[0], c.sizes, "nearest", coord, nearest);
            },
            kExact);
    }
}

TEST_CASE("gpu layout ops: transpose tiles and strided slices at scale", "[gpu][ops][gather]") {
  // Tiles of 64 (along x's stride-1 dim) by 32, partial ones at both ends, several images; the
  // generic gather's unrolled items past one wave; YOLOv5's Focus slice x[..., ::2, ::2].
  const std::vector<std::pair<Shape, std::vector<int64_t>>> perms = {
      {{2, 96, 56, 56}, {0, 2, 3, 1}}, {{2, 56, 56, 96}, {0, 3, 1, 2}},
      {{3, 3, 65, 33}, {0, 2, 3, 1}},  {{2, 130, 7, 5}, {0, 2, 3, 1}},
      {{5, 129, 31}, {0, 2, 1}},       {{2, 3, 4, 70, 40}, {0, 1, 3, 4, 2}}};
  for (const auto& [shape, perm] : perms)
    check_op(
        {shape}, [&](Builder& b, std::vector<Val> v) { return b.transpose(v[0], perm); }, kExact);
  const std::vector<std::vector<std::vector<int64_t>>> slices = {
      // starts, ends, axes, steps
      {{0, 0}, {640, 640}, {2, 3}, {2, 2}},
      {{1, 0}, {640, 640}, {2, 3}, {2, 2}},
      {{0, 1}, {640, 640}, {2, 3}, {2, 2}},
      {{4, 3}, {-1, 600}, {1, 3}, {1, 3}},
      {{639}, {INT64_MIN}, {3}, {-1}}};
  for (const auto& c : slices)
    check_op(
        {{2, 6, 640, 640}},
        [&](Builder& b, std::vector<Val> v) { return b.slice(v[0], c[0], c[1], c[2], c[3]); },
        kExact);
}

TEST_CASE("gpu layout ops: reductions over rows and strided axes", "[gpu][ops]") {
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{4, 96, 28, 28}, {2, 3}},                    // SE: H x W per (n, c), a warp a row
      {{2, 8, 64, 64}, {2, 3}},                     // rows of 4096: a block a row
      {{4, 96, 28, 28}, {1}},                       // over channels: strided
      {{3, 5, 7}, {0, 2}},                          // two reduced runs apart
      {{6, 1000}, {-1}},         {{3, 4, 5}, {}}};  // everything
  for (OpKind op : {OpKind::ReduceMean, OpKind::ReduceSum, OpKind::ReduceMax, OpKind::ReduceMin})
    for (const auto& [shape, axes] : cases)
      check_op(
          {shape}, [&](Builder& b, std::vector<Val> v) { return b.reduce(op, v[0], axes); },
          kFloat32Sum, true);
}

TEST_CASE("gpu layout ops: reductions over columns (the channels of NCHW) and odd axes",
          "[gpu][ops][reduce]") {
  // The columns kernel where the last kept dim is x's innermost and at least 8 wide and an
  // output reduces at least 32 elements: reduced axes of 1 (no reduction: rows), 257 elements,
  // the op_bench shape (mean over C of [16, 256, 56, 56], kept dims), no outer dim, two reduced
  // dims apart (decoded an element); the strided kernel on a 4-wide inner dim, on 3 and 15
  // elements, and on ResNeSt's sum over its 2 radix maps. The float4 columns where every
  // stride is a multiple of 4: the op_bench shape, and two with a last tile part empty.
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{2, 48, 12, 12}, {1}},   {{3, 40, 2, 20}, {1}},
      {{16, 256, 56, 56}, {1}}, {{2, 1, 40}, {1}},    {{4, 3, 50}, {1}},
      {{2, 257, 9, 9}, {1}},    {{257, 33}, {0}},     {{3, 5, 7, 8}, {0, 2}},
      {{6, 5, 9, 8}, {0, 2}},   {{3, 257, 4}, {1}},   {{2, 3, 70, 5}, {1}},
      {{5, 300, 17}, {0, 1}},   {{2, 2, 64, 28, 28}, {1}}};
  for (OpKind op : {OpKind::ReduceMean, OpKind::ReduceSum, OpKind::ReduceMax, OpKind::ReduceMin})
    for (const auto& [shape, axes] : cases)
      for (const bool keep : {true, false})
        check_op(
            {shape},
            [&](Builder& b, std::vector<Val> v) { return b.reduce(op, v[0], axes, keep); },
            kFloat32Sum, true);
}

TEST_CASE("gpu layout ops: reduce_min and reduce_max propagate NaN", "[gpu][ops]") {
  // A NaN in a row run by a warp, in one run by a block, in a strided column and in a column
  // tile's column.
  for (const auto& [shape, axes] : std::vector<std::pair<Shape, std::vector<int64_t>>>{
           {{4, 96}, {1}}, {{2, 4096}, {1}}, {{96, 4}, {0}}, {{96, 40}, {0}}})
    for (OpKind op : {OpKind::ReduceMin, OpKind::ReduceMax}) {
      Builder b(5);
      b.output(b.reduce(op, b.input("x", shape), axes));
      const Graph g = b.build();
      INFO(op_name(op) << " of " << shape_str(shape));
      Tensor x = Tensor::randn(shape, 3);
      x.f32()[37] = std::numeric_limits<float>::quiet_NaN();
      const test::Outputs o = test::run_node(g, {{"x", x}});
      test::require_close(o.gpu[0], o.cpu[0], g.nodes[0].name, kExact);
      const Tensor got = o.gpu[0].to(Device::CPU);
      int64_t nans = 0;
      for (int64_t i = 0; i < got.numel(); ++i) nans += std::isnan(got.f32()[i]) ? 1 : 0;
      CHECK(nans == 1);
    }
}

TEST_CASE("gpu layout ops: reduce_prod over rows and strided axes", "[gpu][ops]") {
  // Values near 1, so that products of thousands of them stay of order 1; a float32 product of n
  // terms is off by at most about n u of itself (2.5e-4 for the 4096 of a block row).
  constexpr test::Tolerance kFloat32Prod{0, 3e-4, "float32 product"};
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {{{4, 96, 28, 28}, {2, 3}},
                                                                     {{2, 8, 64, 64}, {2, 3}},
                                                                     {{4, 96, 7, 7}, {1}},
                                                                     {{2, 257, 9, 9}, {1}},
                                                                     {{3, 5, 7}, {0, 2}},
                                                                     {{3, 4, 5}, {}}};
  for (const auto& [shape, axes] : cases) {
    Builder b(5);
    b.output(b.reduce(OpKind::ReduceProd, b.input("x", shape), axes));
    const Graph g = b.build();
    INFO("reduce_prod of " << shape_str(shape));
    Tensor x = Tensor::randn(shape, 4, 0.02f);
    for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] += 1.0f;
    const test::Outputs o = test::run_node(g, {{"x", x}});
    test::require_close(o.gpu[0], o.cpu[0], g.nodes[0].name, kFloat32Prod);
  }
}

TEST_CASE("gpu layout ops: softmax and log_softmax over the last and inner axes",
          "[gpu][ops][softmax]") {
  // Rows by a warp, rows by a block (4100), strided columns.
  const std::vector<std::pair<Shape, int64_t>> cases = {
      {{8, 1000}, -1}, {{2, 3, 4100}, -1}, {{4, 16, 49}, 1}, {{2, 5, 7, 3}, 0}};
  // Rows in registers (up to 1024: several rows a warp up to 16, then a warp a row) and longer
  // rows by a block: lengths 1, 2, 7 (5 rows: a warp's second group of 4 half empty), 16, 32, 33,
  // 196 (ViT's attention, the op_bench shape), 1000, 1024, 1025 and 4097.
  const std::vector<Shape> rows = {{3, 1},    {9, 2},   {5, 7},    {7, 16},   {3, 32},
                                   {5, 33},   {16, 12, 196, 196},  {6, 1000}, {3, 1024},
                                   {2, 1025}, {3, 4097}};
  for (bool log : {false, true}) {
    const auto make = [log](Builder& b, Val x, int64_t axis) {
      return log ? b.log_softmax(x, axis) : b.softmax(x, axis);
    };
    for (const auto& [shape, axis] : cases)
      check_op(
          {shape}, [&](Builder& b, std::vector<Val> v) { return make(b, v[0], axis); },
          kFloat32Norm);
    for (const Shape& shape : rows)
      check_op(
          {shape}, [&](Builder& b, std::vector<Val> v) { return make(b, v[0], -1); },
          kFloat32Norm);
    // Large inputs, a row and a column: the max comes out before any e^x.
    for (int64_t axis : {-1, 0}) {
      Builder b(5);
      b.output(make(b, b.input("x", {4, 300}), axis));
      const Graph g = b.build();
      Tensor x = Tensor::randn({4, 300}, 8);
      for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] += 10000.0f;
      const test::Outputs o = test::run_node(g, {{"x", x}});
      test::require_close(o.gpu[0], o.cpu[0], std::string(op_name(g.nodes[0].op)) + " of x + 1e4",
                          kFloat32Norm);
    }
  }
}

TEST_CASE("gpu layout ops: layer_norm, group_norm and instance_norm", "[gpu][ops]") {
  check_op(
      {{2, 56, 56, 96}}, [](Builder& b, std::vector<Val> v) { return b.layer_norm(v[0], "ln"); },
      kFloat32Norm);
  check_op(
      {{2, 7, 1500}}, [](Builder& b, std::vector<Val> v) { return b.layer_norm(v[0], "ln"); },
      kFloat32Norm);
  check_op(
      {{2, 4, 6, 5}}, [](Builder& b, std::vector<Val> v) { return b.layer_norm(v[0], "ln", 1); },
      kFloat32Norm);
  // Over dims with dims after them (columns): ConvNeXt's channels-first LayerNorm, and two
  // middle dims. On a 132-SM card the planes take column tiles of 8, 16 and 32, and 7x7 leaves
  // dead threads in its last tile.
  for (const Shape& shape :
       std::vector<Shape>{{2, 96, 14, 14}, {1, 768, 7, 7}, {8, 40, 28, 28}, {6, 64, 56, 56}})
    check_op(
        {shape},
        [](Builder& b, std::vector<Val> v) { return b.layer_norm(v[0], "ln", 1, 1e-6, 1); },
        kFloat32Norm);
  check_op(
      {{2, 3, 4, 5, 6}},
      [](Builder& b, std::vector<Val> v) { return b.layer_norm(v[0], "ln", 1, 1e-5, 2); },
      kFloat32Norm);
  for (int64_t groups : {1, 4, 32})
    check_op(
        {{2, 64, 14, 14}},
        [&](Builder& b, std::vector<Val> v) { return b.group_norm(v[0], "gn", groups); },
        kFloat32Norm);
  check_op(
      {{2, 16, 9, 9}}, [](Builder& b, std::vector<Val> v) { return b.instance_norm(v[0], "in"); },
      kFloat32Norm);
}

TEST_CASE("gpu layout ops: long normalized rows split over a cluster", "[gpu][ops][norm]") {
  // Rows over kWarpRowMax: held in registers by a cluster of up to 8 blocks (one block off
  // Hopper, up to 4096), past 32768 a block a row re-reading it. group_norm at the op_bench shape
  // (512 groups of 25088), groups of one channel (4096 each) and of all channels (25600, and
  // 40000: a block), instance_norm's planes (1600), layer_norm just past a warp's row (1025) and
  // a cluster's 8 x 4096 exactly.
  const std::vector<std::pair<Shape, int64_t>> groups = {{{16, 256, 56, 56}, 32},
                                                         {{2, 8, 64, 64}, 8},
                                                         {{2, 16, 40, 40}, 1},
                                                         {{1, 4, 100, 100}, 1},
                                                         {{3, 6, 33, 31}, 3}};
  for (const auto& [shape, g] : groups)
    check_op(
        {shape}, [&](Builder& b, std::vector<Val> v) { return b.group_norm(v[0], "gn", g); },
        kFloat32Norm);
  check_op(
      {{2, 4, 40, 40}}, [](Builder& b, std::vector<Val> v) { return b.instance_norm(v[0], "in"); },
      kFloat32Norm);
  for (const Shape& shape : std::vector<Shape>{{3, 1025}, {2, 32768}, {5, 4096}, {2, 2, 9000}})
    check_op(
        {shape}, [](Builder& b, std::vector<Val> v) { return b.layer_norm(v[0], "ln"); },
        kFloat32Norm);
}

TEST_CASE("gpu layout ops: batched matmul with broadcasting", "[gpu][ops][matmul]") {
  // TF32 where matmul_runs_tf32 says (k and n at least 8), within kTf32Sum of the magnitude; the
  // SIMT kernel's fp32 within kFloat32Sum. ViT's attention products (the op_bench shapes), edges
  // of every size, 16-byte copies and 4-byte ones (k or n not a multiple of 4), batches that fold
  // into m and ones that broadcast either operand.
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{192, 196, 64}, {192, 64, 196}},  // q @ k^T
      {{192, 196, 196}, {192, 196, 64}},  // p @ v
      {{2, 56, 56, 96}, {96, 384}},       // convnext's linear: folded into one matrix
      {{3, 1, 37, 70}, {1, 4, 70, 65}},   // both broadcast, partial tiles
      {{4, 65, 130}, {4, 130, 33}},
      {{2, 3, 67, 9}, {3, 9, 130}},       // b broadcast over the outer batch: no fold
      {{6, 129, 257}, {257, 31}},         // odd k and n: 4-byte copies, folded
      {{7, 33, 8}, {8, 8}},               // one mma deep and wide
      {{1, 100}, {100, 300}},             // m = 1
      {{5, 1, 9}, {9, 13}},               // m = 1 a batch, folded to 5 rows
      {{50, 7}, {2, 3, 7, 9}},            // k = 7: SIMT
      {{2, 1, 100}, {2, 100, 1}},         // n = 1 (GEMV-like): SIMT
      {{1, 1}, {1, 1}},                   // m = n = k = 1
      {{3, 4, 1}, {1, 5}}};               // k = 1
  for (const auto& [sa, sb] : cases) {
    const bool tf32 = matmul_runs_tf32(sb.back(), sb[sb.size() - 2]);
    INFO((tf32 ? "tf32" : "simt") << ": " << shape_str(sa) << " @ " << shape_str(sb));
    check_op(
        {sa, sb}, [](Builder& b, std::vector<Val> v) { return b.matmul(v[0], v[1]); },
        tf32 ? kTf32Sum : kFloat32Sum, true);
  }
}

// The conv_transpose2d kernel itself (one node, no passes: the rewrite does not run), on the
// shapes it runs in models (groups, depthwise, dilation) and on those the rewrite takes from it:
// phases of stride 2 and 3, partial channel blocks (K % 8), several weight chunks (C / groups
// past what shared memory holds at once), images narrower than a warp.
TEST_CASE("gpu layout ops: conv_transpose2d", "[gpu][ops][conv_transpose]") {
  const std::vector<std::pair<Shape, ConvOpts>> cases = {
      {{2, 16, 14, 14}, ConvOpts(8, 4).stride(2).padding(1).bias()},
      {{1, 6, 9, 7}, ConvOpts(4, 3).stride(2).padding(1).output_padding(1, 1).groups(2)},
      {{2, 3, 5, 5}, ConvOpts(5, 3).dilation(2).bias()},
      {{2, 64, 8, 8}, ConvOpts(20, 4).stride(2).padding(1).bias()},  // DCGAN, 2 chunks
      {{1, 200, 6, 6}, ConvOpts(8, 4).stride(2).padding(1)},         // 7 chunks, 32 each
      {{2, 32, 16, 16}, ConvOpts(16, 3).stride(2).padding(1).output_padding(1, 1)},  // CycleGAN
      {{2, 16, 9, 11}, ConvOpts(16, 3).stride(2).padding(1).groups(16).bias()},      // depthwise
      {{1, 12, 7, 5}, ConvOpts(24, 3).stride(3).padding(1, 0, 2, 1).groups(4)},
      {{2, 8, 6, 6}, ConvOpts(8, 2).stride(2).bias()},  // U-Net's, unrewritten
      {{1, 5, 3, 40}, ConvOpts(3, 5).stride(1, 3).padding(2).dilation(2)},
      {{3, 4, 1, 1}, ConvOpts(7, 4)}};  // DCGAN's first layer
  for (const auto& [shape, o] : cases)
    check_op(
        {shape}, [&](Builder& b, std::vector<Val> v) { return b.conv_transpose2d(v[0], "ct", o); },
        kFloat32Sum, true);
}

namespace {

// One depth_to_space or space_to_depth node of blocksize [bh, bw] on x of `shape`, on both
// backends: a copy, exact.
void check_depth_space(OpKind op, const Shape& shape, int64_t bh, int64_t bw, const char* mode,
                       const std::vector<int64_t>& crop = {}) {
  INFO(mode << " " << bh << "x" << bw << " crop " << fmt::format("{}", fmt::join(crop, ",")));
  check_op(
      {shape},
      [&](Builder& b, std::vector<Val> v) {
        return b.depth_space(op, v[0], {bh, bw}, mode, "", crop);
      },
      kExact);
}

}  // namespace

// Rows of the wide side a multiple of 4 (float4) and not, blocks square and not, both modes.
TEST_CASE("gpu layout ops: depth_to_space and space_to_depth, both modes", "[gpu][ops]") {
  for (const char* mode : {"DCR", "CRD"}) {
    check_depth_space(OpKind::DepthToSpace, {2, 64, 16, 16}, 2, 2, mode);  // pixel_shuffle
    check_depth_space(OpKind::DepthToSpace, {1, 27, 5, 7}, 3, 3, mode);
    check_depth_space(OpKind::DepthToSpace, {2, 12, 4, 5}, 2, 3, mode);
    check_depth_space(OpKind::DepthToSpace, {1, 8, 3, 1}, 1, 4, mode);
    check_depth_space(OpKind::SpaceToDepth, {2, 16, 32, 32}, 2, 2, mode);
    check_depth_space(OpKind::SpaceToDepth, {1, 3, 15, 21}, 3, 3, mode);
    check_depth_space(OpKind::SpaceToDepth, {2, 5, 4, 9}, 2, 3, mode);
    // Cropped (a conv_transpose2d's rewrite): float4 rows and not, offsets odd and even.
    check_depth_space(OpKind::DepthToSpace, {2, 64, 17, 17}, 2, 2, mode, {1, 1, 1, 1});
    check_depth_space(OpKind::DepthToSpace, {1, 18, 5, 7}, 3, 2, mode, {2, 0, 1, 3});
  }
}

// A conv_transpose2d through compile() and the executor, as a model runs it: the rewrite makes
// a conv2d (gemm, TF32) and a depth_to_space (cropping where the output is not a whole number of
// strides), a batchnorm and a relu after it fused into the conv. Against the graph as built on
// the CPU (no passes), over the magnitude of the same graph on |x| and |weights|.
TEST_CASE("gpu layout ops: conv_transpose2d rewritten, through the executor",
          "[gpu][ops][conv_transpose]") {
  const std::vector<std::tuple<Shape, ConvOpts, bool>> cases = {
      {{4, 64, 16, 16}, ConvOpts(32, 2).stride(2).bias(), false},   // U-Net
      {{2, 64, 8, 8}, ConvOpts(32, 4).stride(2).padding(1), true},  // DCGAN
      {{2, 32, 16, 16}, ConvOpts(16, 3).stride(2).padding(1).output_padding(1, 1), false},
      {{2, 32, 15, 13}, ConvOpts(16, 3).stride(2).padding(1).bias(), true},  // cropped
      {{1, 16, 9, 9}, ConvOpts(8, 2).kernel(2, 3).stride(2, 3).bias(), false}};
  for (const auto& [shape, o, bn_relu] : cases) {
    Builder b(61);
    Val y = b.conv_transpose2d(b.input("x", shape), "up", o);
    if (bn_relu) y = b.relu(b.batchnorm(y, "bn"), "act");
    b.output(y);
    const Graph source = b.build();
    INFO(shape_str(shape) << " -> " << shape_str(source.value(source.outputs[0]).shape));
    CompileOptions co;
    co.device = Device::CUDA;
    Compiled c = compile(source, co);
    const auto counts = c.plan.graph.op_counts();
    CHECK(counts.count(OpKind::ConvTranspose2d) == 0);
    CHECK(counts.at(OpKind::DepthToSpace) == 1);
    INFO(explain(c.plan));
    const std::map<std::string, Tensor> in{{"x", Tensor::randn(shape, 62)}};
    std::unique_ptr<Backend> backend = make_backend(Device::CUDA);
    Executor ex(std::move(c.plan), *backend);
    const Tensor got = ex.run(in).at(source.outputs[0]).to(Device::CPU);
    const Tensor want = test::run_cpu(source, in).at(source.outputs[0]);
    // The magnitude: the graph on |x| with |weights|, batchnorm's mean 0 (its variance kept).
    Graph abs_graph = source;
    for (auto& [name, w] : abs_graph.weights) {
      if (name.find("running_var") != std::string::npos) continue;
      const bool mean = name.find("running_mean") != std::string::npos;
      w.data = w.data.clone();
      for (int64_t i = 0; i < w.data.numel(); ++i)
        w.data.f32()[i] = mean ? 0.0f : std::abs(w.data.f32()[i]);
    }
    Tensor abs_x = in.at("x").clone();
    for (int64_t i = 0; i < abs_x.numel(); ++i) abs_x.f32()[i] = std::abs(abs_x.f32()[i]);
    const Tensor mag = test::run_cpu(abs_graph, {{"x", abs_x}}).at(source.outputs[0]);
    test::require_close(got, want, "up", test::kTf32Conv, &mag);
  }
}
