// The layout, reduction, normalization, resampling and matmul ops on the CPU reference backend,
// run as one-node graphs (shape inference, attribute reading and kernel together): hand-worked
// numbers, then seeded random inputs against float64 re-computations written here.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "epilog/io/builder.h"
#include "epilog/kernels/cpu.h"
#include "epilog/runtime/params.h"
#include "error_matcher.h"
#include "kernel_check.h"
#include "test_util.h"

using namespace epilog;
using test::expect_close;
using test::expect_values;
using test::strides_of;
using test::unravel;

namespace {

constexpr double kU = 6e-8;  // float32 unit roundoff

// Runs the single op `make` adds to a graph of one input `x` (and more, given) on the CPU.
Tensor run1(const std::vector<std::pair<std::string, Tensor>>& inputs,
            const std::function<Val(Builder&, const std::vector<Val>&)>& make) {
  Builder b(7);
  std::vector<Val> xs;
  std::map<std::string, Tensor> feeds;
  for (const auto& [name, t] : inputs) {
    xs.push_back(b.input(name, t.shape()));
    feeds[name] = t;
  }
  b.output(make(b, xs));
  const Graph g = b.build();
  auto out = test::run_cpu(g, feeds);
  REQUIRE(out.size() == 1);
  return out.begin()->second;
}

Tensor run1(const Tensor& x, const std::function<Val(Builder&, Val)>& make) {
  return run1({{"x", x}}, [&](Builder& b, const std::vector<Val>& v) { return make(b, v[0]); });
}

// y[i] = f(multi-index of y's element i) for a reference computed per element.
std::vector<double> per_element(const Shape& y,
                                const std::function<double(const std::vector<int64_t>&)>& f) {
  std::vector<double> ref(size_t(shape_numel(y)));
  for (int64_t i = 0; i < shape_numel(y); ++i) ref[size_t(i)] = f(unravel(i, y));
  return ref;
}

double at(const Tensor& x, const std::vector<int64_t>& idx) {
  const std::vector<int64_t> st = strides_of(x.shape());
  int64_t off = 0;
  for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * st[d];
  return x.f32()[off];
}

}  // namespace

// -- transpose, reshape --

TEST_CASE("cpu ops: transpose worked example and random permutations", "[cpu][transpose]") {
  const Tensor x = Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, 6});
  expect_values(run1(x,
                     [](Builder& b, Val v) {
                       return b.transpose(v, {1, 0});
                     }),
                {1, 4, 2, 5, 3, 6});
  expect_values(run1(x, [](Builder& b, Val v) { return b.transpose(v, {}); }),  // reverses
                {1, 4, 2, 5, 3, 6});
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{2, 3, 4, 5}, {0, 2, 3, 1}},        // NCHW -> NHWC
      {{2, 5, 6, 3}, {0, 3, 1, 2}},        // NHWC -> NCHW
      {{1, 2, 3, 4, 5}, {0, 2, 1, 3, 4}},  // channel shuffle's swap
      {{3, 1, 4, 2}, {3, 1, 0, 2}},        // with a size-1 dim
      {{4, 5, 6}, {2, 1, 0}},
      {{7}, {0}},
      {{2, 3, 4, 5, 2, 3}, {5, 4, 3, 2, 1, 0}}};
  uint64_t seed = 10;
  for (const auto& [shape, perm] : cases) {
    INFO(shape_str(shape) << " perm " << fmt::format("{}", fmt::join(perm, ",")));
    const Tensor xr = Tensor::randn(shape, ++seed);
    const Tensor y = run1(xr, [&](Builder& b, Val v) { return b.transpose(v, perm); });
    Shape ys;
    for (int64_t p : perm) ys.push_back(shape[size_t(p)]);
    REQUIRE(y.shape() == ys);
    expect_close(y.f32(),
                 per_element(ys,
                             [&](const std::vector<int64_t>& i) {
                               std::vector<int64_t> src(shape.size());
                               for (size_t d = 0; d < perm.size(); ++d) src[size_t(perm[d])] = i[d];
                               return at(xr, src);
                             }),
                 std::vector<double>(size_t(xr.numel()), 0.0));
  }
}

TEST_CASE("cpu ops: reshape keeps the elements, 0 and -1 as ONNX", "[cpu][reshape]") {
  const Tensor x = Tensor::randn({2, 6, 4, 5}, 3);
  const Tensor y = run1(x, [](Builder& b, Val v) { return b.reshape(v, {0, 2, 3, -1}); });
  REQUIRE(y.shape() == Shape{2, 2, 3, 20});
  expect_values(y, std::vector<double>(x.f32(), x.f32() + x.numel()));
  Builder b;
  Val v = b.input("x", {2, 6, 4, 5});
  REQUIRE_THROWS_MATCHES(b.reshape(v, {7, -1}, "r"), Error,
                         test::Says({"[reshape]", "'r'", "240"}));
  REQUIRE_THROWS_MATCHES(b.reshape(v, {-1, -1}, "r"), Error, test::Says({"more than one -1"}));
  REQUIRE_THROWS_MATCHES(b.transpose(v, {0, 1, 1, 2}, "t"), Error,
                         test::Says({"[transpose]", "'t'", "not a permutation"}));
}

TEST_CASE("cpu ops: channel_shuffle against its index formula", "[cpu][channel_shuffle]") {
  const std::vector<std::pair<Shape, int64_t>> cases = {
      {{2, 12, 3, 5}, 3}, {{1, 6, 4}, 2}, {{3, 8}, 4}, {{2, 6, 2, 2, 3}, 6}, {{2, 5, 3, 3}, 1}};
  uint64_t seed = 30;
  for (const auto& [shape, groups] : cases) {
    INFO(shape_str(shape) << " in " << groups << " groups");
    const Tensor x = Tensor::randn(shape, ++seed);
    const int64_t per = shape[1] / groups;
    // y[n, j * groups + i, ...] = x[n, i * per + j, ...]
    const std::vector<double> ref = per_element(shape, [&](std::vector<int64_t> idx) {
      idx[1] = idx[1] % groups * per + idx[1] / groups;
      return at(x, idx);
    });
    const Tensor y = run1(x, [&](Builder& b, Val v) { return b.channel_shuffle(v, groups); });
    test::expect_exact(y.f32(), ref);
  }
  Builder b;
  Val v = b.input("x", {2, 12, 3, 5});
  REQUIRE_THROWS_MATCHES(b.channel_shuffle(v, 5, "cs"), Error,
                         test::Says({"[channel_shuffle]", "'cs'", "groups=5", "12 channels"}));
}

TEST_CASE("cpu ops: channel_shuffle of parts is the shuffle of their concat, split views too",
          "[cpu][channel_shuffle]") {
  // x's split parts are views whose items lie apart (batch 2): the shuffle reads them in place.
  const Tensor x = Tensor::randn({2, 10, 3, 4}, 41), z = Tensor::randn({2, 2, 3, 4}, 42);
  for (int64_t groups : {2, 3, 4, 6}) {
    INFO(groups << " groups");
    const Tensor y = run1({{"x", x}, {"z", z}}, [&](Builder& b, const std::vector<Val>& v) {
      const std::vector<Val> s = b.split(v[0], 1, {4, 6});
      return b.channel_shuffle({s[1], v[1], s[0]}, groups);
    });
    const Tensor want = run1({{"x", x}, {"z", z}}, [&](Builder& b, const std::vector<Val>& v) {
      const std::vector<Val> s = b.split(v[0], 1, {4, 6});
      return b.channel_shuffle(b.concat({s[1], v[1], s[0]}, 1), groups);
    });
    REQUIRE(y.shape() == Shape{2, 12, 3, 4});
    test::expect_exact(y.f32(), std::vector<double>(want.f32(), want.f32() + want.numel()));
  }
  Builder b;
  Val a = b.input("a", {2, 4, 3}), c = b.input("c", {2, 4, 5});
  REQUIRE_THROWS_MATCHES(b.channel_shuffle({a, c}, 2, "cs"), Error,
                         test::Says({"[channel_shuffle]", "'cs'", "input 1", "outside axis 1"}));
  REQUIRE_THROWS_MATCHES(b.channel_shuffle(std::vector<Val>(9, a), 2, "cs"), Error,
                         test::Says({"[channel_shuffle]", "'cs'", "9 inputs, at most 8"}));
}

// -- depth_to_space, space_to_depth --

TEST_CASE("cpu ops: depth_to_space as ONNX's examples, both modes", "[cpu][depth_to_space]") {
  std::vector<float> v(48);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  const Tensor x = Tensor::from_vector({1, 8, 2, 3}, v);
  const auto run = [](const Tensor& t, OpKind op, const char* mode) {
    return run1(t, [&](Builder& b, Val v) { return b.depth_space(op, v, {2}, mode); });
  };
  const Tensor dcr = run(x, OpKind::DepthToSpace, "DCR");
  CHECK(dcr.shape() == Shape{1, 2, 4, 6});
  expect_values(dcr, {0,  12, 1,  13, 2,  14, 24, 36, 25, 37, 26, 38, 3,  15, 4,  16,
                      5,  17, 27, 39, 28, 40, 29, 41, 6,  18, 7,  19, 8,  20, 30, 42,
                      31, 43, 32, 44, 9,  21, 10, 22, 11, 23, 33, 45, 34, 46, 35, 47});
  const Tensor crd = run(x, OpKind::DepthToSpace, "CRD");
  expect_values(crd, {0,  6,  1,  7,  2,  8,  12, 18, 13, 19, 14, 20, 3,  9,  4,  10,
                      5,  11, 15, 21, 16, 22, 17, 23, 24, 30, 25, 31, 26, 32, 36, 42,
                      37, 43, 38, 44, 27, 33, 28, 34, 29, 35, 39, 45, 40, 46, 41, 47});
  // space_to_depth undoes each.
  expect_values(run(dcr, OpKind::SpaceToDepth, "DCR"), std::vector<double>(v.begin(), v.end()));
  expect_values(run(crd, OpKind::SpaceToDepth, "CRD"), std::vector<double>(v.begin(), v.end()));
  Builder b;
  Val in = b.input("x", {1, 6, 2, 2});
  REQUIRE_THROWS_MATCHES(b.depth_space(OpKind::DepthToSpace, in, {2}, "DCR", "d"), Error,
                         test::Says({"[depth_to_space]", "'d'", "blocksize 2x2", "6 channels"}));
  REQUIRE_THROWS_MATCHES(
      b.depth_space(OpKind::SpaceToDepth, b.input("z", {1, 2, 3, 4}), {2}, "DCR", "s"), Error,
      test::Says({"[space_to_depth]", "'s'", "blocksize 2x2"}));
}

TEST_CASE(
    "cpu ops: depth_to_space and space_to_depth against the index formula, blocks of "
    "unequal sides",
    "[cpu][depth_to_space]") {
  uint64_t seed = 50;
  for (const char* mode : {"DCR", "CRD"})
    for (const auto& [bh, bw] : std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {2, 3}, {1, 4}}) {
      INFO(mode << " " << bh << "x" << bw);
      const bool crd = std::string(mode) == "CRD";
      const Shape deep{2, 3 * bh * bw, 3, 5};
      const Tensor x = Tensor::randn(deep, ++seed);
      const Tensor y = run1(x, [&](Builder& b, Val v) {
        return b.depth_space(OpKind::DepthToSpace, v, {bh, bw}, mode);
      });
      const Shape wide{2, 3, 3 * bh, 5 * bw};
      REQUIRE(y.shape() == wide);
      // y[n, ch, h * bh + i, w * bw + j] = x[n, dc, h, w]
      const std::vector<double> ref = per_element(wide, [&](const std::vector<int64_t>& o) {
        const int64_t i = o[2] % bh, j = o[3] % bw;
        const int64_t dc = crd ? o[1] * bh * bw + i * bw + j : (i * bw + j) * 3 + o[1];
        return at(x, {o[0], dc, o[2] / bh, o[3] / bw});
      });
      test::expect_exact(y.f32(), ref);
      const Tensor back = run1(y, [&](Builder& b, Val v) {
        return b.depth_space(OpKind::SpaceToDepth, v, {bh, bw}, mode);
      });
      REQUIRE(back.shape() == deep);
      test::expect_exact(back.f32(), std::vector<double>(x.f32(), x.f32() + x.numel()));
    }
}

TEST_CASE("cpu ops: depth_to_space's crop is the slice of its whole output",
          "[cpu][depth_to_space]") {
  uint64_t seed = 60;
  for (const char* mode : {"DCR", "CRD"})
    for (const std::vector<int64_t>& crop :
         std::vector<std::vector<int64_t>>{{1, 1, 1, 1}, {0, 2, 1, 0}, {1, 0, 0, 3}}) {
      INFO(mode << " crop " << fmt::format("{}", fmt::join(crop, ",")));
      const Tensor x = Tensor::randn({2, 12, 3, 4}, ++seed);
      const Tensor y = run1(x, [&](Builder& b, Val v) {
        return b.depth_space(OpKind::DepthToSpace, v, {2, 3}, mode, "", crop);
      });
      const Tensor whole = run1(x, [&](Builder& b, Val v) {
        return b.slice(b.depth_space(OpKind::DepthToSpace, v, {2, 3}, mode), {crop[0], crop[1]},
                       {6 - crop[2], 12 - crop[3]}, {2, 3});
      });
      REQUIRE(y.shape() == Shape{2, 2, 6 - crop[0] - crop[2], 12 - crop[1] - crop[3]});
      test::expect_exact(y.f32(), std::vector<double>(whole.f32(), whole.f32() + whole.numel()));
    }
  Builder b;
  Val in = b.input("x", {1, 8, 2, 2});
  for (const std::vector<int64_t>& crop : std::vector<std::vector<int64_t>>{
           {0, -1, 0, 0},
           {2, 0, 2, 0},
           {0, 1, 0, 3},
           {std::numeric_limits<int64_t>::max(), 0, std::numeric_limits<int64_t>::max(), 0}})
    REQUIRE_THROWS_MATCHES(b.depth_space(OpKind::DepthToSpace, in, {2}, "DCR", "d", crop), Error,
                           test::Says({"[depth_to_space]", "'d'", "crop", "leaves no output"}));
}

// -- slice, pad --

TEST_CASE("cpu ops: slice as ONNX, clamped, negative steps", "[cpu][slice]") {
  const Tensor x = Tensor::from_vector({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  // ONNX's slice example: starts [1, 0], ends [2, 3], steps [1, 2] -> [[5, 7]].
  expect_values(run1(x,
                     [](Builder& b, Val v) {
                       return b.slice(v, {1, 0}, {2, 3}, {0, 1}, {1, 2});
                     }),
                {5, 7});
  // ends past the dim clamp; negative starts count from the back.
  expect_values(run1(x, [](Builder& b, Val v) { return b.slice(v, {-3}, {1000}, {1}); }),
                {2, 3, 4, 6, 7, 8});
  // A negative step walks backwards from a clamped start to a clamped end (here the front).
  expect_values(
      run1(x, [](Builder& b, Val v) { return b.slice(v, {100}, {INT64_MIN}, {-1}, {-2}); }),
      {4, 2, 8, 6});
  Builder b;
  Val v = b.input("x", {2, 4});
  REQUIRE_THROWS_MATCHES(b.slice(v, {3}, {1}, {1}, {}, "s"), Error,
                         test::Says({"[slice]", "'s'", "leave nothing"}));
  REQUIRE_THROWS_MATCHES(b.slice(v, {0}, {1}, {1}, {0}, "s"), Error, test::Says({"steps"}));

  uint64_t seed = 40;
  const Shape shape{3, 5, 7, 6};
  const Tensor xr = Tensor::randn(shape, ++seed);
  const std::vector<std::vector<int64_t>> cases = {// starts, ends, axes, steps of axes 1..3
                                                   {1, 4, 1, 1},
                                                   {-2, 100, 2, 1},
                                                   {6, -100, 3, -2},
                                                   {0, 7, 2, 3},
                                                   {-1, 0, 1, -1}};
  for (const auto& c : cases) {
    INFO(fmt::format("{}", fmt::join(c, ",")));
    const Tensor y = run1(xr, [&](Builder& bb, Val vv) {
      return bb.slice(vv, {c[0], 0}, {c[1], 4}, {c[2], 0}, {c[3], 1});
    });
    // The reference walks the axis the plain way and keeps the indices it visits.
    const int64_t n = shape[size_t(c[2])], step = c[3];
    std::vector<int64_t> keep;
    int64_t s = c[0] < 0 ? c[0] + n : c[0], e = c[1] < 0 ? c[1] + n : c[1];
    for (int64_t i = std::clamp<int64_t>(s, step > 0 ? 0 : -1, step > 0 ? n : n - 1);
         step > 0 ? i < std::min(e, n) : i > std::max<int64_t>(e, -1); i += step)
      keep.push_back(i);
    Shape ys = shape;
    ys[0] = 4 > shape[0] ? shape[0] : 4;
    ys[size_t(c[2])] = int64_t(keep.size());
    REQUIRE(y.shape() == ys);
    expect_close(y.f32(),
                 per_element(ys,
                             [&](std::vector<int64_t> i) {
                               i[size_t(c[2])] = keep[size_t(i[size_t(c[2])])];
                               return at(xr, i);
                             }),
                 std::vector<double>(size_t(y.numel()), 0.0));
  }
}

TEST_CASE("cpu ops: pad constant, reflect and edge", "[cpu][pad]") {
  const Tensor x = Tensor::from_vector({1, 3}, {1, 2, 3});
  // pads: begins (0, 2), ends (0, 1).
  expect_values(run1(x,
                     [](Builder& b, Val v) {
                       return b.pad(v, {0, 2, 0, 1}, "constant", 9);
                     }),
                {9, 9, 1, 2, 3, 9});
  expect_values(run1(x,
                     [](Builder& b, Val v) {
                       return b.pad(v, {0, 2, 0, 1}, "reflect");
                     }),
                {3, 2, 1, 2, 3, 2});
  expect_values(run1(x,
                     [](Builder& b, Val v) {
                       return b.pad(v, {0, 2, 0, 1}, "edge");
                     }),
                {1, 1, 1, 2, 3, 3});
  Builder b;
  Val v = b.input("x", {1, 3});
  REQUIRE_THROWS_MATCHES(b.pad(v, {0, 3, 0, 0}, "reflect", 0, "p"), Error,
                         test::Says({"[pad]", "'p'", "smaller than its size 3"}));
  REQUIRE_THROWS_MATCHES(b.pad(v, {0, 1}, "constant", 0, "p"), Error, test::Says({"expected 4"}));

  const Shape shape{2, 3, 5, 6};
  const Tensor xr = Tensor::randn(shape, 77);
  const std::vector<int64_t> pads{0, 1, 2, 3, 1, 0, 4, 2};
  for (const char* mode : {"constant", "reflect", "edge"}) {
    INFO(mode);
    const Tensor y = run1(xr, [&](Builder& bb, Val vv) { return bb.pad(vv, pads, mode, -2.5); });
    Shape ys = shape;
    for (size_t d = 0; d < 4; ++d) ys[d] += pads[d] + pads[d + 4];
    REQUIRE(y.shape() == ys);
    expect_close(y.f32(),
                 per_element(ys,
                             [&](std::vector<int64_t> i) {
                               for (size_t d = 0; d < 4; ++d) {
                                 int64_t k = i[d] - pads[d];
                                 const int64_t n = shape[d];
                                 if (k < 0 || k >= n) {
                                   if (std::string(mode) == "constant") return -2.5;
                                   if (std::string(mode) == "edge")
                                     k = k < 0 ? 0 : n - 1;
                                   else
                                     k = k < 0 ? -k : 2 * n - 2 - k;
                                 }
                                 i[d] = k;
                               }
                               return at(xr, i);
                             }),
                 std::vector<double>(size_t(y.numel()), 0.0));
  }
}

// -- reductions and softmax --

TEST_CASE("cpu ops: reduce_mean, reduce_sum, reduce_max, reduce_min, reduce_prod over axes",
          "[cpu][reduce]") {
  const Tensor x = Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, 9});
  expect_values(run1(x, [](Builder& b, Val v) { return b.reduce(OpKind::ReduceMean, v, {1}); }),
                {2, 6});
  expect_values(
      run1(x, [](Builder& b, Val v) { return b.reduce(OpKind::ReduceSum, v, {0}, false); }),
      {5, 7, 12});
  const Tensor all = run1(x, [](Builder& b, Val v) { return b.reduce(OpKind::ReduceMax, v, {}); });
  REQUIRE(all.shape() == Shape{1, 1});
  expect_values(all, {9});

  const Shape shape{3, 4, 5, 6};
  const Tensor xr = Tensor::randn(shape, 5);
  // Products of values near 1, so that even the product of all 360 stays of order 1.
  Tensor near_one = Tensor::randn(shape, 6, 0.05f);
  for (int64_t i = 0; i < near_one.numel(); ++i) near_one.f32()[i] += 1.0f;
  const std::vector<std::vector<int64_t>> axes_cases = {{2, 3}, {1},          {-1},
                                                        {0, 2}, {0, 1, 2, 3}, {1, 3}};
  for (OpKind op : {OpKind::ReduceMean, OpKind::ReduceSum, OpKind::ReduceMax, OpKind::ReduceMin,
                    OpKind::ReduceProd})
    for (const auto& axes : axes_cases)
      for (bool keep : {true, false}) {
        INFO(op_name(op) << " axes " << fmt::format("{}", fmt::join(axes, ",")) << " keep "
                         << keep);
        const bool prod = op == OpKind::ReduceProd;
        const Tensor& x = prod ? near_one : xr;
        const Tensor y = run1(x, [&](Builder& b, Val v) { return b.reduce(op, v, axes, keep); });
        std::vector<bool> red(4, false);
        for (int64_t a : axes) red[size_t(a < 0 ? a + 4 : a)] = true;
        Shape kept;
        for (size_t d = 0; d < 4; ++d)
          if (!red[d]) kept.push_back(shape[d]);
        std::vector<double> ref(size_t(shape_numel(kept)), op == OpKind::ReduceMax   ? -INFINITY
                                                           : op == OpKind::ReduceMin ? INFINITY
                                                           : prod                    ? 1.0
                                                                                     : 0.0);
        // What the rounding scales with: the sum of |x|, or for a product the product of |x|.
        std::vector<double> mag(ref.size(), prod ? 1.0 : 0.0);
        int64_t count = x.numel() / int64_t(ref.size());
        for (int64_t i = 0; i < x.numel(); ++i) {
          const std::vector<int64_t> idx = unravel(i, shape);
          int64_t o = 0;
          for (size_t d = 0; d < 4; ++d)
            if (!red[d]) o = o * shape[d] + idx[d];
          const double v = x.f32()[i];
          double& r = ref[size_t(o)];
          r = op == OpKind::ReduceMax   ? std::max(r, v)
              : op == OpKind::ReduceMin ? std::min(r, v)
              : prod                    ? r * v
                                        : r + v;
          mag[size_t(o)] = prod ? mag[size_t(o)] * std::fabs(v) : mag[size_t(o)] + std::fabs(v);
        }
        for (size_t o = 0; o < ref.size(); ++o)
          if (op == OpKind::ReduceMean) ref[o] /= double(count), mag[o] /= double(count);
        REQUIRE(y.numel() == int64_t(ref.size()));
        std::vector<double> tol(ref.size());
        for (size_t o = 0; o < ref.size(); ++o) tol[o] = 2 * kU * mag[o];
        expect_close(y.f32(), ref, tol);
      }
}

TEST_CASE("cpu ops: reduce_min and reduce_prod worked examples, NaN and infinities",
          "[cpu][reduce]") {
  const Tensor x = Tensor::from_vector({2, 3}, {1, -2, 3, 4, 0.5f, -9});
  expect_values(run1(x, [](Builder& b, Val v) { return b.reduce(OpKind::ReduceMin, v, {1}); }),
                {-2, -9});
  expect_values(
      run1(x, [](Builder& b, Val v) { return b.reduce(OpKind::ReduceMin, v, {0}, false); }),
      {1, -2, -9});
  expect_values(run1(x, [](Builder& b, Val v) { return b.reduce(OpKind::ReduceProd, v, {1}); }),
                {-6, -18});
  const Tensor all = run1(x, [](Builder& b, Val v) { return b.reduce(OpKind::ReduceProd, v, {}); });
  REQUIRE(all.shape() == Shape{1, 1});
  expect_values(all, {108});
  // A NaN anywhere in a run is its min (as reduce_max's max), wherever it comes; -inf is a
  // min like any other; a product with inf is inf, with inf and 0 NaN.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = INFINITY;
  const Tensor special =
      Tensor::from_vector({4, 3}, {nan, 1, 2, 1, nan, -3, -inf, 5, 1, 2, inf, 0});
  const Tensor mins =
      run1(special, [](Builder& b, Val v) { return b.reduce(OpKind::ReduceMin, v, {1}, false); });
  CHECK(std::isnan(mins.f32()[0]));
  CHECK(std::isnan(mins.f32()[1]));
  CHECK(mins.f32()[2] == -inf);
  CHECK(mins.f32()[3] == 0);
  const Tensor prods =
      run1(special, [](Builder& b, Val v) { return b.reduce(OpKind::ReduceProd, v, {1}, false); });
  CHECK(std::isnan(prods.f32()[0]));
  CHECK(prods.f32()[2] == -inf);
  CHECK(std::isnan(prods.f32()[3]));
}

TEST_CASE("cpu ops: softmax and log_softmax over any axis against float64", "[cpu][softmax]") {
  // Worked examples: 1/8, 1/4, 5/8 and their logs; shifted by 1000 the same (the max comes out
  // before any e^x), within the inputs' rounding near 1000.
  for (float shift : {0.0f, 1000.0f}) {
    INFO("shift " << shift);
    const Tensor x =
        Tensor::from_vector({1, 3}, {shift, shift + std::log(2.0f), shift + std::log(5.0f)});
    expect_values(run1(x, [](Builder& b, Val v) { return b.softmax(v, -1); }), {0.125, 0.25, 0.625},
                  shift > 0 ? 1e-4 : 1e-7);
    expect_values(run1(x, [](Builder& b, Val v) { return b.log_softmax(v, -1); }),
                  {std::log(0.125), std::log(0.25), std::log(0.625)}, shift > 0 ? 1e-4 : 1e-7);
  }
  const Shape shape{2, 3, 4, 5};
  const Tensor xr = Tensor::randn(shape, 9, 3.0f);
  for (bool log : {false, true})
    for (int64_t axis : {-1, 1, 0, 2}) {
      INFO((log ? "log_softmax" : "softmax") << " axis " << axis);
      const Tensor y = run1(
          xr, [&](Builder& b, Val v) { return log ? b.log_softmax(v, axis) : b.softmax(v, axis); });
      const size_t a = size_t(axis < 0 ? axis + 4 : axis);
      std::vector<double> tol;  // log_softmax: the rounding of x - max and of the result
      const std::vector<double> ref = per_element(shape, [&](std::vector<int64_t> i) {
        const double xi = at(xr, i);
        double top = -INFINITY, sum = 0;
        for (i[a] = 0; i[a] < shape[a]; ++i[a]) top = std::max(top, at(xr, i));
        for (i[a] = 0; i[a] < shape[a]; ++i[a]) sum += std::exp(at(xr, i) - top);
        const double want = log ? xi - top - std::log(sum) : std::exp(xi - top) / sum;
        tol.push_back(log ? 4 * kU * (std::fabs(want) + std::fabs(xi) + std::fabs(top)) : 1e-6);
        return want;
      });
      expect_close(y.f32(), ref, tol);
    }
}

// -- normalization --

namespace {

// (x - mean) / sqrt(var + eps) over each group of `flat` consecutive elements.
std::vector<double> normalized(const Tensor& x, int64_t flat, double eps) {
  std::vector<double> out(size_t(x.numel()));
  for (int64_t r = 0; r < x.numel() / flat; ++r) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < flat; ++j) mean += x.f32()[r * flat + j];
    mean /= double(flat);
    for (int64_t j = 0; j < flat; ++j) var += std::pow(x.f32()[r * flat + j] - mean, 2);
    var /= double(flat);
    for (int64_t j = 0; j < flat; ++j)
      out[size_t(r * flat + j)] = (x.f32()[r * flat + j] - mean) / std::sqrt(var + eps);
  }
  return out;
}

}  // namespace

TEST_CASE("cpu ops: layer_norm, group_norm, instance_norm against float64", "[cpu][norm]") {
  SECTION("layer_norm worked example: [1, 3] over the last dim, scale 2, bias 1") {
    Builder b;
    b.set_weights({{"ln.weight", Tensor::full({3}, 2)}, {"ln.bias", Tensor::full({3}, 1)}});
    Val x = b.input("x", {1, 3});
    b.output(b.layer_norm(x, "ln", -1, 0.0));
    const auto out = test::run_cpu(b.build(), {{"x", Tensor::from_vector({1, 3}, {1, 2, 3})}});
    const double s = 2 * std::sqrt(1.5);  // 2 / sqrt(2/3)
    expect_values(out.begin()->second, {1 - s, 1, 1 + s}, 1e-6);
  }
  const Shape shape{2, 6, 5, 4};
  const Tensor xr = Tensor::randn(shape, 21, 2.0f);
  for (int64_t axis : {-1, 2, 1}) {
    INFO("layer_norm axis " << axis);
    Builder b(3);
    Val x = b.input("x", shape);
    b.output(b.layer_norm(x, "ln", axis, 1e-5));
    const Graph g = b.build();
    const Tensor y = test::run_cpu(g, {{"x", xr}}).begin()->second;
    const Tensor &scale = g.weights.at("ln.weight").data, &bias = g.weights.at("ln.bias").data;
    const int64_t flat = scale.numel();
    std::vector<double> ref = normalized(xr, flat, 1e-5);
    for (size_t i = 0; i < ref.size(); ++i)
      ref[i] = ref[i] * scale.f32()[i % size_t(flat)] + bias.f32()[i % size_t(flat)];
    expect_close(y.f32(), ref, std::vector<double>(ref.size(), 2e-6));
  }
  // Over dims with dims after them: each (outer, inner) column normalized (ConvNeXt's
  // channels-first LayerNorm is axis 1, last_axis 1 of NCHW).
  for (const auto& [axis, last] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 2}, {0, 0}}) {
    INFO("layer_norm axis " << axis << " last_axis " << last);
    Builder b(5);
    Val x = b.input("x", shape);
    b.output(b.layer_norm(x, "ln", axis, 1e-5, last));
    const Graph g = b.build();
    const Tensor y = test::run_cpu(g, {{"x", xr}}).begin()->second;
    const Tensor &scale = g.weights.at("ln.weight").data, &bias = g.weights.at("ln.bias").data;
    int64_t outer = 1, n = 1;
    for (int64_t d = 0; d <= last; ++d) (d < axis ? outer : n) *= shape[size_t(d)];
    const int64_t inner = xr.numel() / (outer * n);
    // The columns moved to rows (x as [outer, inner, n]), normalized there, and moved back.
    const auto row_at = [&](int64_t i) {
      return size_t(i / inner / n * n * inner + i % inner * n + i / inner % n);
    };
    Tensor rows = Tensor::empty({xr.numel()});
    for (int64_t i = 0; i < xr.numel(); ++i) rows.f32()[row_at(i)] = xr.f32()[i];
    const std::vector<double> norm = normalized(rows, n, 1e-5);
    std::vector<double> ref(norm.size());
    for (int64_t i = 0; i < xr.numel(); ++i) {
      const int64_t j = i / inner % n;
      ref[size_t(i)] = norm[row_at(i)] * scale.f32()[j] + bias.f32()[j];
    }
    expect_close(y.f32(), ref, std::vector<double>(ref.size(), 2e-6));
  }
  for (int64_t groups : {1, 2, 3, 6, 0}) {  // 0: instance_norm
    INFO("groups " << groups);
    Builder b(4);
    Val x = b.input("x", shape);
    b.output(groups ? b.group_norm(x, "gn", groups) : b.instance_norm(x, "gn"));
    const Graph g = b.build();
    const Tensor y = test::run_cpu(g, {{"x", xr}}).begin()->second;
    const Tensor &scale = g.weights.at("gn.weight").data, &bias = g.weights.at("gn.bias").data;
    const int64_t inner = 20, per = (groups ? 6 / groups : 1) * inner;
    std::vector<double> ref = normalized(xr, per, 1e-5);
    for (size_t i = 0; i < ref.size(); ++i) {
      const size_t c = i / size_t(inner) % 6;
      ref[i] = ref[i] * scale.f32()[c] + bias.f32()[c];
    }
    expect_close(y.f32(), ref, std::vector<double>(ref.size(), 2e-6));
  }
  Builder b;
  Val x = b.input("x", shape);
  REQUIRE_THROWS_MATCHES(b.group_norm(x, "gn", 4), Error,
                         test::Says({"[group_norm]", "'gn'", "groups=4", "6 channels"}));
  REQUIRE_THROWS_MATCHES(b.layer_norm(x, "ln", 2, 1e-5, 1), Error,
                         test::Says({"[layer_norm]", "'ln'", "axis 2 to last_axis 1"}));
}

// -- resize --

TEST_CASE("cpu ops: resize worked examples as PyTorch and ONNX compute them", "[cpu][resize]") {
  const Tensor x = Tensor::from_vector({1, 1, 2, 2}, {1, 2, 3, 4});
  const auto resize = [&](const Tensor& in, std::vector<int64_t> sizes, const char* mode,
                          const char* coord, const char* nearest = "round_prefer_floor") {
    return run1(in, [&](Builder& b, Val v) { return b.resize(v, sizes, mode, coord, nearest); });
  };
  // F.interpolate(scale_factor=2, mode="nearest"): asymmetric, floor.
  expect_values(resize(x, {1, 1, 4, 4}, "nearest", "asymmetric", "floor"),
                {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4});
  // F.interpolate(scale_factor=2, mode="bilinear", align_corners=False).
  expect_values(resize(x, {1, 1, 4, 4}, "linear", "half_pixel"),
                {1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3, 3.25, 3.75, 4},
                1e-6);
  // align_corners=True to 3x3.
  expect_values(resize(x, {1, 1, 3, 3}, "linear", "align_corners"),
                {1, 1.5, 2, 2, 2.5, 3, 3, 3.5, 4}, 1e-6);
  // ONNX resize_downsample_sizes_nearest: [[1,2,3,4],[5,6,7,8]] to 1x2 -> [[1, 3]].
  const Tensor x8 = Tensor::from_vector({1, 1, 2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  expect_values(resize(x8, {1, 1, 1, 2}, "nearest", "half_pixel"), {1, 3});
  // pytorch_half_pixel maps a single output to coordinate 0; half_pixel to the middle.
  expect_values(resize(x8, {1, 1, 1, 1}, "linear", "pytorch_half_pixel"), {1});
  expect_values(resize(x8, {1, 1, 1, 1}, "linear", "half_pixel"), {4.5}, 1e-6);
  Builder b;
  Val v = b.input("x", {1, 2, 3, 3});
  REQUIRE_THROWS_MATCHES(b.resize(v, {1, 4, 3, 3}, "nearest", "half_pixel", "floor", "r"), Error,
                         test::Says({"[resize]", "'r'", "only the last two"}));
}

TEST_CASE("cpu ops: resize random against float64", "[cpu][resize]") {
  const Tensor xr = Tensor::randn({2, 3, 5, 7}, 33);
  const std::vector<std::vector<int64_t>> sizes = {{2, 3, 10, 14}, {2, 3, 3, 4}, {2, 3, 11, 5}};
  for (const char* coord : {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"})
    for (const auto& s : sizes) {
      INFO(coord << " to " << fmt::format("{}", fmt::join(s, ",")));
      const Tensor y = run1(xr, [&](Builder& b, Val v) { return b.resize(v, s, "linear", coord); });
      const int64_t h = 5, w = 7, ho = s[2], wo = s[3];
      const auto src = [&](int64_t o, int64_t in, int64_t out) -> double {
        const std::string c = coord;
        if (c == "align_corners") return out > 1 ? double(o) * (in - 1) / (out - 1) : 0.0;
        if (c == "asymmetric") return double(o) * in / out;
        if (c == "pytorch_half_pixel" && out == 1) return 0.0;
        return (o + 0.5) * in / out - 0.5;
      };
      const std::vector<double> ref =
          per_element(Shape(s.begin(), s.end()), [&](std::vector<int64_t> i) {
            const double sy = std::max(0.0, src(i[2], h, ho)), sx = std::max(0.0, src(i[3], w, wo));
            const int64_t y0 = std::min<int64_t>(int64_t(sy), h - 1),
                          x0 = std::min<int64_t>(int64_t(sx), w - 1);
            const int64_t y1 = std::min(y0 + 1, h - 1), x1 = std::min(x0 + 1, w - 1);
            const double ly = sy - y0, lx = sx - x0;
            auto px = [&](int64_t yy, int64_t xx) { return at(xr, {i[0], i[1], yy, xx}); };
            return (px(y0, x0) * (1 - lx) + px(y0, x1) * lx) * (1 - ly) +
                   (px(y1, x0) * (1 - lx) + px(y1, x1) * lx) * ly;
          });
      // Coordinates in float (as PyTorch): off by ~1e-7 of the plane's extent, times the slope.
      expect_close(y.f32(), ref, std::vector<double>(ref.size(), 1e-5));
    }
}

// -- matmul --

TEST_CASE("cpu ops: matmul worked example and batched broadcasting", "[cpu][matmul]") {
  const Tensor a = Tensor::from_vector({2, 2}, {1, 2, 3, 4});
  const Tensor bm = Tensor::from_vector({2, 3}, {1, 0, 2, 0, 1, 3});
  expect_values(run1({{"a", a}, {"b", bm}},
                     [](Builder& b, const std::vector<Val>& v) { return b.matmul(v[0], v[1]); }),
                {1, 2, 8, 3, 4, 18});
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{2, 7, 5, 9}, {9, 4}},        // convnext's linear: b shared
      {{3, 1, 5, 6}, {1, 4, 6, 2}},  // both broadcast
      {{4, 3, 8}, {4, 8, 5}},        // plain batch
      {{5, 7}, {2, 3, 7, 6}}};       // a shared
  uint64_t seed = 60;
  for (const auto& [sa, sb] : cases) {
    INFO(shape_str(sa) << " @ " << shape_str(sb));
    const Tensor ta = Tensor::randn(sa, ++seed), tb = Tensor::randn(sb, ++seed);
    const Tensor y = run1({{"a", ta}, {"b", tb}}, [](Builder& b, const std::vector<Val>& v) {
      return b.matmul(v[0], v[1]);
    });
    const int64_t k = sa.back();
    std::vector<double> tol;
    const std::vector<double> ref = per_element(y.shape(), [&](const std::vector<int64_t>& i) {
      const size_t r = i.size();
      double sum = 0, mag = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        std::vector<int64_t> ia(sa.size()), ib(sb.size());
        for (size_t d = 0; d + 2 < sa.size(); ++d) ia[d] = sa[d] == 1 ? 0 : i[r - sa.size() + d];
        for (size_t d = 0; d + 2 < sb.size(); ++d) ib[d] = sb[d] == 1 ? 0 : i[r - sb.size() + d];
        ia[sa.size() - 2] = i[r - 2], ia[sa.size() - 1] = kk;
        ib[sb.size() - 2] = kk, ib[sb.size() - 1] = i[r - 1];
        sum += at(ta, ia) * at(tb, ib);
        mag += std::fabs(at(ta, ia) * at(tb, ib));
      }
      tol.push_back(double(k + 1) * kU * mag);
      return sum;
    });
    expect_close(y.f32(), ref, tol);
  }
  Builder b;
  Val va = b.input("a", {2, 3}), vb = b.input("b", {4, 5});
  REQUIRE_THROWS_MATCHES(b.matmul(va, vb, "mm"), Error,
                         test::Says({"[matmul]", "'mm'", "3 columns"}));
}

// -- conv_transpose2d --

TEST_CASE("cpu ops: conv_transpose2d worked examples", "[cpu][conv_transpose]") {
  const Tensor x = Tensor::from_vector({1, 1, 2, 2}, {1, 2, 3, 4});
  const auto run = [&](const ConvOpts& o) {
    Builder b;
    b.set_weights({{"up.weight", Tensor::full({1, 1, 2, 2}, 1)}});
    Val v = b.input("x", {1, 1, 2, 2});
    b.output(b.conv_transpose2d(v, "up", o));
    return test::run_cpu(b.build(), {{"x", x}}).begin()->second;
  };
  // Stride 2 with a 2x2 kernel of ones copies each input to a 2x2 block.
  expect_values(run(ConvOpts(1, 2).stride(2)), {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4});
  // Stride 1: overlapping blocks add up.
  expect_values(run(ConvOpts(1, 2)), {1, 3, 2, 4, 10, 6, 3, 7, 4});
  // Padding 1 crops a ring off that; output_padding adds a row and a column at the end.
  expect_values(run(ConvOpts(1, 2).padding(1)), {10});
  const Tensor y = run(ConvOpts(1, 2).stride(2).output_padding(1, 1));
  CHECK(y.shape() == Shape{1, 1, 5, 5});
  CHECK(y.f32()[24] == 0);
}

TEST_CASE("cpu ops: conv_transpose2d random against a float64 scatter", "[cpu][conv_transpose]") {
  struct Case {
    Shape x;
    ConvOpts o;
  };
  const std::vector<Case> cases = {
      {{2, 4, 5, 6}, ConvOpts(6, 3).stride(2).padding(1).output_padding(1, 0).bias()},
      {{1, 6, 4, 4}, ConvOpts(4, 4).stride(2).padding(1).groups(2)},
      {{1, 3, 3, 5}, ConvOpts(2, 3).dilation(2).padding(1, 0, 2, 1)},
      {{2, 4, 3, 3}, ConvOpts(4, 1).stride(3).groups(4).bias()}};
  for (const Case& c : cases) {
    Builder b(9);
    Val v = b.input("x", c.x);
    b.output(b.conv_transpose2d(v, "ct", c.o));
    const Graph g = b.build();
    const Tensor x = Tensor::randn(c.x, 4);
    const Tensor y = test::run_cpu(g, {{"x", x}}).begin()->second;
    const Node& n = g.nodes[0];
    INFO(shape_str(c.x) << " -> " << shape_str(y.shape()));
    const Tensor& w = g.weights.at("ct.weight").data;
    const auto& st = n.attrs.ints("stride");
    const auto& pd = n.attrs.ints("padding");
    const auto& dl = n.attrs.ints("dilation");
    const int64_t groups = n.attrs.i("groups"), k = y.dim(1), cg = c.x[1] / groups, kg = k / groups;
    std::vector<double> ref(size_t(y.numel()), 0.0), mag(ref.size(), 0.0);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const std::vector<int64_t> xi = unravel(i, c.x);
      const int64_t g0 = xi[1] / cg;
      for (int64_t kk = 0; kk < kg; ++kk)
        for (int64_t r = 0; r < w.dim(2); ++r)
          for (int64_t s = 0; s < w.dim(3); ++s) {
            const int64_t oh = xi[2] * st[0] - pd[0] + r * dl[0];
            const int64_t ow = xi[3] * st[1] - pd[1] + s * dl[1];
            if (oh < 0 || oh >= y.dim(2) || ow < 0 || ow >= y.dim(3)) continue;
            const double t = double(x.f32()[i]) * at(w, {xi[1], kk, r, s});
            const size_t o = size_t(((xi[0] * k + g0 * kg + kk) * y.dim(2) + oh) * y.dim(3) + ow);
            ref[o] += t;
            mag[o] += std::fabs(t);
          }
    }
    if (g.weights.count("ct.bias"))
      for (size_t o = 0; o < ref.size(); ++o)
        ref[o] += g.weights.at("ct.bias").data.f32()[o / size_t(y.dim(2) * y.dim(3)) % size_t(k)];
    std::vector<double> tol(ref.size());
    for (size_t o = 0; o < ref.size(); ++o) tol[o] = 2 * kU * mag[o] + kU * std::fabs(ref[o]);
    expect_close(y.f32(), ref, tol);
  }
  Builder b;
  Val v = b.input("x", {1, 2, 3, 3});
  REQUIRE_THROWS_MATCHES(b.conv_transpose2d(v, "ct", ConvOpts(2, 3).stride(2).output_padding(2, 0)),
                         Error, test::Says({"[conv_transpose2d]", "'ct'", "output_padding 2"}));
}
