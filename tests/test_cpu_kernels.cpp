// The CPU reference kernels (epilog/kernels/cpu.h): hand-worked numbers for each kernel, then
// seeded random inputs against naive float64 re-computations written here.
//
// Tolerances. float32 has unit roundoff u = 2^-24 (~6e-8). A float sum of K products t_i, in
// any order (the GEMM's k-blocking makes block sums, then adds them), is off by at most
// (K + 1) u sum|t_i|: each term goes through at most K roundings (Higham, Accuracy and
// Stability of Numerical Algorithms, ch. 3-4).
// Scaling and shifting add a rounding each, so a conv/GEMM output before its activation must
// lie within (K + 3) u mag of the float64 value, mag = |scale| sum|t_i| + |shift|. The
// activations are at most 1.1-Lipschitz (SiLU's slope stays in [-0.1, 1.1]) and expf plus the
// division round a few times more, so after the activation we allow 1.1 that bound plus
// 8 u |ref|. These are worst-case bounds yet still tight: a wrong index or a missed term moves
// an output by about one whole term, ~mag / K, which is more than 100x the bound for every
// K used here. Elementwise ops that round once (add, mul, copies) must match exactly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "epilog/kernels/cpu.h"
#include "epilog/runtime/params.h"
#include "kernel_check.h"
#include "test_util.h"

using epilog::Act;
using epilog::Activation;
using epilog::ConvShape;
using epilog::PoolShape;
using epilog::Shape;
using epilog::Tensor;
namespace cpu = epilog::cpu;
using epilog::test::expect_close;
using epilog::test::expect_exact;
using epilog::test::expect_values;
using epilog::test::poisoned;
using epilog::test::strides_of;
using epilog::test::unravel;
using epilog::test::values;

namespace {

constexpr double kU = 6e-8;  // float32 unit roundoff 2^-24, rounded up
// 2^18 elements: at the kernels' threshold for using several threads (kernels/cpu/detail.h), so
// that cases of this shape run the multi-threaded paths.
const Shape kThreaded{2, 8, 128, 128};
const std::vector<Act>& kActs = epilog::test::epilogue_acts();
// And the rest of the pointwise functions, for the elementwise tests.
const Act kMathActs[] = {Activation::Exp,           Activation::Erf, Activation::Sqrt,
                         Activation::Reciprocal,    Activation::Log, Act(Activation::Pow, 3.0f),
                         Act(Activation::Pow, 2.0f)};

double act_ref(const Act& a, double v) {
  const double softplus = v > 30 ? v : std::log1p(std::exp(v));
  switch (a.kind) {
    case Activation::None:
      return v;
    case Activation::Silu:
      return v / (1.0 + std::exp(-v));
    case Activation::Relu:
      return v > 0 ? v : 0.0;
    case Activation::Sigmoid:
      return 1.0 / (1.0 + std::exp(-v));
    case Activation::Clip:
      return std::min(std::max(v, double(a.a)), double(a.b));
    case Activation::LeakyRelu:
      return v >= 0 ? v : a.a * v;
    case Activation::HardSigmoid:
      return std::min(std::max(a.a * v + a.b, 0.0), 1.0);
    case Activation::HardSwish:
      return v * std::min(std::max(v + 3, 0.0), 6.0) / 6;
    case Activation::Tanh:
      return std::tanh(v);
    case Activation::Gelu:
      return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    case Activation::GeluTanh:
      return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    case Activation::Mish:
      return v * std::tanh(softplus);
    case Activation::Softplus:
      return softplus;
    case Activation::Elu:
      return v > 0 ? v : a.a * std::expm1(v);
    case Activation::Exp:
      return std::exp(v);
    case Activation::Erf:
      return std::erf(v);
    case Activation::Sqrt:
      return std::sqrt(v);
    case Activation::Reciprocal:
      return 1 / v;
    case Activation::Neg:
      return -v;
    case Activation::Abs:
      return std::fabs(v);
    case Activation::Log:
      return std::log(v);
    case Activation::Pow:
      return std::pow(v, double(a.a));
  }
  return NAN;
}

// Output extent of a window as PyTorch computes it (ceil mode: the last window must start
// inside the input or its leading padding).
int64_t out_extent(int64_t in, int64_t pad_begin, int64_t pad_end, int64_t window, int64_t stride,
                   bool ceil_mode = false) {
  int64_t span = in + pad_begin + pad_end - window;
  int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad_begin) --out;
  return out;
}

// -- convolution --

// stride and dil are the vertical ones; stride_w and dil_w, when not 0, the horizontal ones.
struct ConvCase {
  int64_t n, c, h, w, k, r, s, stride, pad_t, pad_l, pad_b, pad_r, dil, groups;
  int64_t stride_w, dil_w;
};

ConvShape conv_shape(const ConvCase& t) {
  const int64_t sw = t.stride_w ? t.stride_w : t.stride, dw = t.dil_w ? t.dil_w : t.dil;
  int64_t ho = out_extent(t.h, t.pad_t, t.pad_b, t.dil * (t.r - 1) + 1, t.stride);
  int64_t wo = out_extent(t.w, t.pad_l, t.pad_r, dw * (t.s - 1) + 1, sw);
  return ConvShape{t.n, t.c,      t.h, t.w,     t.k,     t.r,   t.s, ho,
                   wo,  t.stride, sw,  t.pad_t, t.pad_l, t.dil, dw,  t.groups};
}

// Direct 7-loop convolution in double: the sum and the sum of |terms| of every output.
void conv_ref(const ConvShape& cs, const float* x, const float* w, std::vector<double>& sum,
              std::vector<double>& mag) {
  const int64_t cg = cs.c / cs.groups, kg = cs.k / cs.groups;
  sum.assign(cs.n * cs.k * cs.ho * cs.wo, 0.0);
  mag.assign(sum.size(), 0.0);
  for (int64_t b = 0; b < cs.n; ++b)
    for (int64_t ko = 0; ko < cs.k; ++ko)
      for (int64_t oh = 0; oh < cs.ho; ++oh)
        for (int64_t ow = 0; ow < cs.wo; ++ow) {
          double acc = 0, m = 0;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t i = 0; i < cs.r; ++i)
              for (int64_t j = 0; j < cs.s; ++j) {
                int64_t ih = oh * cs.stride_h - cs.pad_t + i * cs.dil_h;
                int64_t iw = ow * cs.stride_w - cs.pad_l + j * cs.dil_w;
                if (ih < 0 || ih >= cs.h || iw < 0 || iw >= cs.w) continue;
                int64_t c = ko / kg * cg + ci;
                double t = double(x[((b * cs.c + c) * cs.h + ih) * cs.w + iw]) *
                           double(w[((ko * cg + ci) * cs.r + i) * cs.s + j]);
                acc += t;
                m += std::fabs(t);
              }
          int64_t o = ((b * cs.k + ko) * cs.ho + oh) * cs.wo + ow;
          sum[o] = acc;
          mag[o] = m;
        }
}

Tensor run_conv(const ConvShape& cs, const Tensor& x, const Tensor& w, const float* scale,
                const float* shift, const Act& act) {
  Tensor y = poisoned({cs.n, cs.k, cs.ho, cs.wo});
  cpu::conv2d(cs, x.f32(), w.f32(), scale, shift, act, y.f32());
  return y;
}

// Runs one conv case with every activation and with no epilogue parameters, a shift only
// (conv2d with bias) and a scale and shift (fused_conv2d), against the double reference.
void check_conv_case(const ConvCase& t, uint64_t seed) {
  const ConvShape cs = conv_shape(t);
  INFO(
      fmt::format("n{} c{} {}x{} -> k{} {}x{} kernel {}x{} stride {}x{} pad {},{},{},{} "
                  "dilation {}x{} groups {}",
                  t.n, t.c, t.h, t.w, t.k, cs.ho, cs.wo, t.r, t.s, cs.stride_h, cs.stride_w,
                  t.pad_t, t.pad_l, t.pad_b, t.pad_r, cs.dil_h, cs.dil_w, t.groups));
  Tensor x = Tensor::randn({cs.n, cs.c, cs.h, cs.w}, seed);
  Tensor w = Tensor::randn({cs.k, cs.c / cs.groups, cs.r, cs.s}, seed + 1, 0.5f);
  Tensor scale = Tensor::randn({cs.k}, seed + 2);
  Tensor shift = Tensor::randn({cs.k}, seed + 3);
  std::vector<double> sum, mag;
  conv_ref(cs, x.f32(), w.f32(), sum, mag);
  const double depth = double(cs.c / cs.groups * cs.r * cs.s);
  const int64_t plane = cs.ho * cs.wo;

  for (int epi = 0; epi < 3; ++epi) {
    const float* sc = epi == 2 ? scale.f32() : nullptr;
    const float* sh = epi >= 1 ? shift.f32() : nullptr;
    for (const Act& act : kActs) {
      INFO("epilogue " << (epi == 0   ? "none"
                           : epi == 1 ? "shift"
                                      : "scale+shift")
                       << ", " << activation_name(act.kind));
      Tensor y = run_conv(cs, x, w, sc, sh, act);
      std::vector<double> ref(sum.size()), tol(sum.size());
      for (size_t o = 0; o < sum.size(); ++o) {
        int64_t ko = int64_t(o) / plane % cs.k;
        double a = sc ? sc[ko] : 1.0, b = sh ? sh[ko] : 0.0;
        double v = sum[o] * a + b;
        double m = mag[o] * std::fabs(a) + std::fabs(b);
        ref[o] = act_ref(act, v);
        // The sum's rounding through a slope of up to 1.5, the activation's own (a few ulp of
        // its result, and of its input where it cancels, as 1 + erf(v) does for GELU).
        tol[o] = 1.65 * (depth + 3) * kU * m + 8 * kU * (std::fabs(ref[o]) + std::fabs(v));
      }
      expect_close(y.f32(), ref, tol);
    }
  }
}

// -- pooling --

PoolShape pool_shape(int64_t n, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw,
                     int64_t stride, int64_t pad_t, int64_t pad_l, int64_t pad_b, int64_t pad_r,
                     bool ceil_mode, bool include_pad) {
  int64_t ho = out_extent(h, pad_t, pad_b, kh, stride, ceil_mode);
  int64_t wo = out_extent(w, pad_l, pad_r, kw, stride, ceil_mode);
  return PoolShape{n,      c,      h,     w,     ho,    wo,    kh,         kw,
                   stride, stride, pad_t, pad_l, pad_b, pad_r, include_pad};
}

// Visits every window tap; `inside` says whether it lies on the input, `padded` whether it
// lies on the padded input [-pad_begin, in + pad_end), which bounds the window in PyTorch.
void pool_ref(const PoolShape& ps, const float* x, std::vector<double>& mx,
              std::vector<double>& avg) {
  mx.assign(ps.n * ps.c * ps.ho * ps.wo, 0.0);
  avg.assign(mx.size(), 0.0);
  for (int64_t p = 0; p < ps.n * ps.c; ++p)
    for (int64_t oh = 0; oh < ps.ho; ++oh)
      for (int64_t ow = 0; ow < ps.wo; ++ow) {
        double best = -INFINITY, sum = 0;
        int64_t inside = 0, padded = 0;
        for (int64_t i = 0; i < ps.kh; ++i)
          for (int64_t j = 0; j < ps.kw; ++j) {
            int64_t ih = oh * ps.stride_h - ps.pad_t + i, iw = ow * ps.stride_w - ps.pad_l + j;
            if (ih < ps.h + ps.pad_b && iw < ps.w + ps.pad_r) ++padded;
            if (ih < 0 || ih >= ps.h || iw < 0 || iw >= ps.w) continue;
            double v = x[(p * ps.h + ih) * ps.w + iw];
            best = std::max(best, v);
            sum += v;
            ++inside;
          }
        int64_t o = (p * ps.ho + oh) * ps.wo + ow;
        mx[o] = best;
        avg[o] = sum / double(ps.count_include_pad ? padded : inside);
      }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// sgemm

TEST_CASE("cpu kernels: sgemm worked example", "[cpu][gemm]") {
  // [1 2 3]   [1 0]   [1*1+2*2+3*3  1*0+2*1+3*-1]   [14 -1]
  // [4 5 6] x [2 1] = [4*1+5*2+6*3  4*0+5*1+6*-1] = [32 -1]
  //           [3 -1]
  const std::vector<float> a{1, 2, 3, 4, 5, 6}, b{1, 0, 2, 1, 3, -1};
  std::vector<float> c(4, NAN);
  cpu::sgemm(2, 2, 3, a.data(), 3, b.data(), 2, c.data(), 2, false);
  CHECK(c == std::vector<float>{14, -1, 32, -1});

  SECTION("accumulate adds to C") {
    std::vector<float> acc{1, 2, 3, 4};
    cpu::sgemm(2, 2, 3, a.data(), 3, b.data(), 2, acc.data(), 2, true);
    CHECK(acc == std::vector<float>{15, 1, 35, 3});
  }
  SECTION("leading dimensions: a 2x2 corner of each operand, C's padding left alone") {
    // A's first two columns, B's first two rows, into columns 0-1 of a 2x3 C.
    std::vector<float> cc{NAN, NAN, 7, NAN, NAN, 7};
    cpu::sgemm(2, 2, 2, a.data(), 3, b.data(), 2, cc.data(), 3, false);
    // [1 2; 4 5] x [1 0; 2 1] = [5 2; 14 5]
    CHECK(cc == std::vector<float>{5, 2, 7, 14, 5, 7});
  }
  SECTION("k = 0 is an empty sum") {
    std::vector<float> z(4, NAN);
    cpu::sgemm(2, 2, 0, a.data(), 3, b.data(), 2, z.data(), 2, false);
    CHECK(z == std::vector<float>{0, 0, 0, 0});
    std::vector<float> keep{1, 2, 3, 4};
    cpu::sgemm(2, 2, 0, a.data(), 3, b.data(), 2, keep.data(), 2, true);
    CHECK(keep == std::vector<float>{1, 2, 3, 4});
  }
}

TEST_CASE("cpu kernels: sgemm random against float64", "[cpu][gemm]") {
  // Sizes straddle the micro-tile (4 x 16) and the blocks (k 256, m 128, n 256).
  struct Case {
    int64_t m, n, k, pad;  // pad: extra columns of lda, ldb and ldc
  };
  const Case cases[] = {{1, 1, 1, 0},     {3, 5, 7, 0},    {4, 16, 8, 0},   {5, 17, 9, 3},
                        {37, 61, 300, 0}, {130, 20, 3, 1}, {9, 300, 40, 2}, {131, 259, 257, 5}};
  uint64_t seed = 100;
  for (const Case& t : cases) {
    for (bool accumulate : {false, true}) {
      INFO("m " << t.m << " n " << t.n << " k " << t.k << " pad " << t.pad << " accumulate "
                << accumulate);
      const int64_t lda = t.k + t.pad, ldb = t.n + t.pad, ldc = t.n + t.pad;
      Tensor a = Tensor::randn({t.m, lda}, ++seed), b = Tensor::randn({t.k, ldb}, ++seed);
      Tensor c0 = Tensor::randn({t.m, ldc}, ++seed);
      Tensor c = c0.clone();
      if (!accumulate)  // what sgemm writes starts as NaN; its padding keeps c0's values
        for (int64_t i = 0; i < t.m; ++i) std::fill_n(c.f32() + i * ldc, t.n, NAN);
      cpu::sgemm(t.m, t.n, t.k, a.f32(), lda, b.f32(), ldb, c.f32(), ldc, accumulate);

      std::vector<double> ref(t.m * ldc), tol(t.m * ldc, 0.0);
      for (int64_t i = 0; i < t.m; ++i)
        for (int64_t j = 0; j < ldc; ++j) {
          const int64_t o = i * ldc + j;
          ref[o] = c0.f32()[o];  // padding columns must come back untouched
          if (j >= t.n) continue;
          double sum = accumulate ? double(c0.f32()[o]) : 0.0, mag = std::fabs(sum);
          for (int64_t p = 0; p < t.k; ++p) {
            double term = double(a.f32()[i * lda + p]) * double(b.f32()[p * ldb + j]);
            sum += term;
            mag += std::fabs(term);
          }
          ref[o] = sum;
          tol[o] = (t.k + 2) * kU * mag;
        }
      expect_close(c.f32(), ref, tol);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// conv2d

TEST_CASE("cpu kernels: conv2d worked examples", "[cpu][conv]") {
  SECTION("1x1, two input channels: y = 2 x0 - x1") {
    ConvShape cs{1, 2, 2, 2, 1, 1, 1, 2, 2, 1, 1, 0, 0, 1, 1, 1};
    Tensor x = Tensor::from_vector({1, 2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
    Tensor w = Tensor::from_vector({1, 2, 1, 1}, {2, -1});
    expect_values(run_conv(cs, x, w, nullptr, nullptr, Activation::None), {-3, -2, -1, 0});
  }
  SECTION("3x3 padding 1 on ones counts the taps inside; then scale 2, shift -10, relu") {
    ConvShape cs{1, 1, 3, 3, 1, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1};
    Tensor x = Tensor::full({1, 1, 3, 3}, 1.0f), w = Tensor::full({1, 1, 3, 3}, 1.0f);
    expect_values(run_conv(cs, x, w, nullptr, nullptr, Activation::None),
                  {4, 6, 4, 6, 9, 6, 4, 6, 4});
    const float scale = 2, shift = -10;
    expect_values(run_conv(cs, x, w, &scale, &shift, Activation::Relu),
                  {0, 2, 0, 2, 8, 2, 0, 2, 0});
    expect_values(run_conv(cs, x, w, nullptr, &shift, Activation::None),
                  {-6, -4, -6, -4, -1, -4, -6, -4, -6});
  }
  SECTION("2x2 stride 2, padding top 1 and right 1 only") {
    // x = 1..9 in a 3x3; windows rows {-1,0},{1,2} x cols {0,1},{2,3}.
    ConvShape cs{1, 1, 3, 3, 1, 2, 2, 2, 2, 2, 2, 1, 0, 1, 1, 1};
    Tensor x = Tensor::from_vector({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
    Tensor w = Tensor::full({1, 1, 2, 2}, 1.0f);
    expect_values(run_conv(cs, x, w, nullptr, nullptr, Activation::None),
                  {1 + 2, 3, 4 + 5 + 7 + 8, 6 + 9});
  }
  SECTION("2x2 dilation 2: taps (0,0) (0,2) (2,0) (2,2)") {
    // x[i][j] = 5i + j, weights 1 2 3 4: y = 10 (5 oh + ow) + 2*2 + 3*10 + 4*12 = 50 oh + 10 ow +
    // 82
    std::vector<float> xv(25);
    for (int i = 0; i < 25; ++i) xv[i] = float(i);
    ConvShape cs{1, 1, 5, 5, 1, 2, 2, 3, 3, 1, 1, 0, 0, 2, 2, 1};
    Tensor x = Tensor::from_vector({1, 1, 5, 5}, xv);
    Tensor w = Tensor::from_vector({1, 1, 2, 2}, {1, 2, 3, 4});
    expect_values(run_conv(cs, x, w, nullptr, nullptr, Activation::None),
                  {82, 92, 102, 132, 142, 152, 182, 192, 202});
  }
  SECTION("groups 2, 1x1: y0 = x0 + x1, y1 = x2 - x3") {
    ConvShape cs{1, 4, 1, 2, 2, 1, 1, 1, 2, 1, 1, 0, 0, 1, 1, 2};
    Tensor x = Tensor::from_vector({1, 4, 1, 2}, {1, 2, 10, 20, 100, 200, 1000, 2000});
    Tensor w = Tensor::from_vector({2, 2, 1, 1}, {1, 1, 1, -1});
    expect_values(run_conv(cs, x, w, nullptr, nullptr, Activation::None), {11, 22, -900, -1800});
  }
  SECTION("depthwise with two outputs per channel, batch 2, shift") {
    // c 2 -> k 4, groups 2: outputs 0,1 read channel 0 and outputs 2,3 channel 1.
    ConvShape cs{2, 2, 1, 2, 4, 1, 2, 1, 1, 1, 1, 0, 0, 1, 1, 2};
    Tensor x = Tensor::from_vector({2, 2, 1, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
    Tensor w = Tensor::from_vector({4, 1, 1, 2}, {1, 1, 1, -1, 2, 0, 0, 2});
    const std::vector<float> shift{0, 0, 0, 0.5f};
    expect_values(run_conv(cs, x, w, nullptr, shift.data(), Activation::None),
                  {3, -1, 6, 8.5, 11, -1, 14, 16.5});
  }
  SECTION("silu and sigmoid of known values") {
    // y = x * 1, so the outputs are the activations of x itself.
    ConvShape cs{1, 1, 1, 3, 1, 1, 1, 1, 3, 1, 1, 0, 0, 1, 1, 1};
    Tensor x = Tensor::from_vector({1, 1, 1, 3}, {0, 2, -1});
    Tensor w = Tensor::full({1, 1, 1, 1}, 1.0f);
    // silu(2) = 2 / (1 + e^-2), silu(-1) = -1 / (1 + e)
    expect_values(run_conv(cs, x, w, nullptr, nullptr, Activation::Silu),
                  {0, 1.7615941559557649, -0.2689414213699951}, 1e-6);
    expect_values(run_conv(cs, x, w, nullptr, nullptr, Activation::Sigmoid),
                  {0.5, 0.8807970779778823, 0.2689414213699951}, 1e-6);
  }
}

TEST_CASE("cpu kernels: conv2d random against float64", "[cpu][conv]") {
  // {n, c, h, w, k, r, s, stride, pad t, l, b, r, dilation, groups, stride_w, dilation_w}
  // (stride_w and dilation_w 0: as stride and dilation)
  const ConvCase cases[] = {
      {1, 8, 7, 9, 12, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0},      // 1x1 straight on the input
      {3, 5, 6, 5, 3, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0},       // 1x1, batch 3
      {1, 6, 9, 7, 5, 1, 1, 2, 0, 0, 0, 0, 1, 1, 0, 0},       // 1x1 stride 2
      {1, 4, 5, 5, 6, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0},       // 1x1, bottom/right padding only
      {1, 4, 5, 6, 6, 1, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0},       // 1x1, bottom padding only
      {1, 4, 6, 5, 3, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0},       // 1x1, right padding only
      {3, 5, 11, 13, 7, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0},     // 3x3 same, odd sizes, batch 3
      {1, 16, 17, 15, 20, 3, 3, 2, 1, 1, 1, 1, 1, 1, 0, 0},   // 3x3 stride 2
      {1, 3, 9, 10, 8, 3, 3, 1, 0, 0, 0, 0, 1, 1, 0, 0},      // 3x3 no padding
      {1, 3, 9, 9, 8, 5, 5, 1, 2, 2, 2, 2, 1, 1, 0, 0},       // 5x5
      {1, 2, 13, 11, 4, 5, 5, 2, 2, 2, 2, 2, 1, 1, 0, 0},     // 5x5 stride 2
      {1, 3, 23, 21, 16, 7, 7, 2, 3, 3, 3, 3, 1, 1, 0, 0},    // 7x7 stride 2 (a stem)
      {1, 4, 12, 11, 6, 3, 3, 1, 2, 2, 2, 2, 2, 1, 0, 0},     // dilation 2
      {1, 4, 9, 8, 5, 3, 3, 1, 0, 2, 1, 0, 1, 1, 0, 0},       // asymmetric padding
      {2, 3, 9, 12, 5, 3, 5, 1, 1, 2, 1, 2, 1, 1, 2, 0},      // 3x5, strides 1x2
      {1, 4, 11, 10, 4, 3, 2, 2, 2, 1, 2, 1, 2, 1, 1, 3},     // 3x2, strides 2x1, dilation 2x3
      {3, 6, 9, 7, 4, 3, 3, 1, 1, 1, 1, 1, 1, 2, 0, 0},       // groups 2, batch 3
      {1, 12, 8, 9, 6, 3, 3, 2, 1, 1, 1, 1, 1, 3, 0, 0},      // groups 3, stride 2
      {1, 6, 8, 13, 6, 1, 3, 1, 0, 3, 0, 3, 1, 3, 0, 3},      // groups 3, 1x3, dilation 1x3
      {1, 6, 9, 11, 6, 3, 3, 1, 1, 1, 1, 1, 1, 6, 0, 0},      // depthwise
      {3, 4, 10, 9, 8, 3, 3, 2, 2, 2, 2, 2, 2, 4, 0, 0},      // depthwise x2, stride 2, dil 2
      {1, 4, 12, 9, 8, 3, 3, 1, 1, 2, 1, 2, 1, 4, 3, 2},      // depthwise x2, strides 1x3, dil 1x2
      {1, 5, 11, 12, 5, 5, 5, 1, 1, 2, 3, 0, 1, 5, 0, 0},     // depthwise 5x5, asymmetric pad
      {1, 40, 17, 17, 136, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0},  // depth 360, 136 rows, 289 cols
      {1, 16, 64, 64, 16, 3, 3, 1, 1, 1, 1, 1, 1, 16, 0, 0},  // depthwise, big enough to thread
  };
  uint64_t seed = 1000;
  for (const ConvCase& t : cases) check_conv_case(t, seed += 10);
}

// ---------------------------------------------------------------------------------------------
// batchnorm

TEST_CASE("cpu kernels: batchnorm worked example", "[cpu][batchnorm]") {
  // y = (x - mean) / sqrt(var + eps) * gamma + beta, per column (axis 1) of a [2, 2].
  Tensor x = Tensor::from_vector({2, 2}, {1, 2, 3, 4});
  Tensor gamma = Tensor::from_vector({2}, {1, 2}), beta = Tensor::from_vector({2}, {0, 1});
  Tensor mean = Tensor::from_vector({2}, {1, 2});
  SECTION("eps 0") {
    Tensor var = Tensor::from_vector({2}, {4, 1});
    Tensor y = poisoned({2, 2});
    cpu::batchnorm(x, gamma, beta, mean, var, 0.0, y);
    // (1-1)/2*1+0, (2-2)/1*2+1, (3-1)/2*1+0, (4-2)/1*2+1
    expect_values(y, {0, 1, 1, 5});
  }
  SECTION("eps adds to the variance") {
    Tensor var = Tensor::from_vector({2}, {3, 0});
    Tensor y = poisoned({2, 2});
    cpu::batchnorm(x, gamma, beta, mean, var, 1.0, y);
    // sqrt(3 + 1) = 2, sqrt(0 + 1) = 1
    expect_values(y, {0, 1, 1, 5});
  }
  SECTION("rank 4: axis 1 is the channel, the rest are positions") {
    Tensor x4 = Tensor::from_vector({1, 2, 1, 2}, {1, 3, 2, 4});
    Tensor var = Tensor::from_vector({2}, {4, 1});
    Tensor y = poisoned({1, 2, 1, 2});
    cpu::batchnorm(x4, gamma, beta, mean, var, 0.0, y);
    expect_values(y, {0, 1, 1, 5});
  }
}

TEST_CASE("cpu kernels: batchnorm random against float64", "[cpu][batchnorm]") {
  const Shape shapes[] = {{3, 5}, {2, 4, 7}, {2, 3, 5, 6}, {1, 6, 2, 3, 4}, kThreaded};
  uint64_t seed = 2000;
  for (const Shape& s : shapes) {
    INFO("shape " << epilog::shape_str(s));
    const int64_t c = s[1], inner = epilog::shape_numel(s) / (s[0] * c);
    Tensor x = Tensor::randn(s, ++seed, 2.0f);
    Tensor gamma = Tensor::randn({c}, ++seed), beta = Tensor::randn({c}, ++seed);
    Tensor mean = Tensor::randn({c}, ++seed);
    Tensor var = Tensor::randn({c}, ++seed);
    for (int64_t i = 0; i < c; ++i) var.f32()[i] = std::fabs(var.f32()[i]) + 0.1f;
    const double eps = 1e-3;
    Tensor y = poisoned(s);
    cpu::batchnorm(x, gamma, beta, mean, var, eps, y);
    std::vector<double> ref(x.numel()), tol(x.numel());
    for (int64_t i = 0; i < x.numel(); ++i) {
      int64_t ch = i / inner % c;
      double inv = 1.0 / std::sqrt(double(var.f32()[ch]) + eps);
      double d = double(x.f32()[i]) - mean.f32()[ch];
      ref[i] = d * inv * gamma.f32()[ch] + beta.f32()[ch];
      // A handful of roundings on terms of magnitude |d * inv * gamma| and |beta|.
      tol[i] = 8 * kU * (std::fabs(d * inv * gamma.f32()[ch]) + std::fabs(beta.f32()[ch]));
    }
    expect_close(y.f32(), ref, tol);
  }
}

// ---------------------------------------------------------------------------------------------
// activation

TEST_CASE("cpu kernels: activation worked examples", "[cpu][activation]") {
  Tensor x = Tensor::from_vector({5}, {-2, -1, 0, 1, 2});
  Tensor y = poisoned({5});
  cpu::activation(Activation::Relu, x, y);
  expect_values(y, {0, 0, 0, 1, 2});
  cpu::activation(Activation::None, x, y);
  expect_values(y, {-2, -1, 0, 1, 2});
  cpu::activation(Activation::Sigmoid, x, y);
  expect_values(
      y, {0.11920292202211755, 0.2689414213699951, 0.5, 0.7310585786300049, 0.8807970779778823},
      1e-7);
  cpu::activation(Activation::Silu, x, y);
  expect_values(
      y, {-0.23840584404423515, -0.2689414213699951, 0, 0.7310585786300049, 1.7615941559557649},
      1e-6);
}

TEST_CASE("cpu kernels: activation random against float64", "[cpu][activation]") {
  const Shape shapes[] = {{1}, {7, 3}, {2, 3, 5, 7}, {40000}, kThreaded};
  std::vector<Act> acts = kActs;
  acts.insert(acts.end(), std::begin(kMathActs), std::end(kMathActs));
  uint64_t seed = 3000;
  for (const Shape& s : shapes)
    for (const Act& act : acts) {
      INFO("shape " << epilog::shape_str(s) << " " << activation_name(act.kind) << " " << act.a);
      Tensor x = Tensor::randn(s, ++seed, 4.0f);
      if (act.kind == Activation::Sqrt || act.kind == Activation::Log)
        for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = std::fabs(x.f32()[i]);
      std::vector<double> ref(x.numel()), tol(x.numel());
      for (int64_t i = 0; i < x.numel(); ++i) {
        const double v = x.f32()[i];
        ref[i] = act_ref(act, v);
        // A few ulp of the result; where the function cancels (1 + erf(v) in GELU) or grows
        // faster than its input (exp, pow), of its input times its slope there.
        const double slope = std::fabs(act_ref(act, v * (1 + 1e-6)) - ref[i]) / 1e-6;
        tol[i] = 8 * kU * (std::fabs(ref[i]) + std::fabs(v) + slope);
      }
      Tensor y = poisoned(s);
      cpu::activation(act, x, y);
      expect_close(y.f32(), ref, tol);
      cpu::activation(act, x, x);  // in place
      expect_close(x.f32(), ref, tol);
    }
}

// ---------------------------------------------------------------------------------------------
// binary (NumPy broadcasting)

namespace {

Shape broadcast(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    out[out.size() - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

// Offset into x (shape xs) of the output element at multi-index idx, NumPy style.
int64_t broadcast_offset(const std::vector<int64_t>& idx, const Shape& xs) {
  const std::vector<int64_t> st = strides_of(xs);
  int64_t off = 0, lead = int64_t(idx.size() - xs.size());
  for (size_t d = 0; d < xs.size(); ++d) off += (xs[d] == 1 ? 0 : idx[lead + d]) * st[d];
  return off;
}

double binary_ref(cpu::Binary op, double a, double b) {
  switch (op) {
    case cpu::Binary::Add:
      return a + b;
    case cpu::Binary::Mul:
      return a * b;
    case cpu::Binary::Sub:
      return a - b;
    case cpu::Binary::Div:
      return a / b;
    case cpu::Binary::Max:
      return std::max(a, b);
    case cpu::Binary::Min:
      return std::min(a, b);
  }
  return NAN;
}

}  // namespace

TEST_CASE("cpu kernels: binary worked examples", "[cpu][binary]") {
  SECTION("sub, div, max and min of [2,2] and a row [2], NaN winning max and min") {
    Tensor a = Tensor::from_vector({2, 2}, {1, 8, -3, NAN});
    Tensor b = Tensor::from_vector({2}, {2, 4});
    Tensor y = poisoned({2, 2});
    cpu::binary(cpu::Binary::Sub, a, b, y);
    CHECK(values(y)[0] == -1);
    CHECK(values(y)[1] == 4);
    CHECK(values(y)[2] == -5);
    cpu::binary(cpu::Binary::Div, a, b, y);
    CHECK(values(y)[0] == 0.5f);
    CHECK(values(y)[1] == 2);
    CHECK(values(y)[2] == -1.5f);
    cpu::binary(cpu::Binary::Max, a, b, y);
    CHECK(values(y)[0] == 2);
    CHECK(values(y)[1] == 8);
    CHECK(values(y)[2] == 2);
    CHECK(std::isnan(values(y)[3]));
    cpu::binary(cpu::Binary::Min, b, a, y);
    CHECK(values(y)[0] == 1);
    CHECK(values(y)[1] == 4);
    CHECK(values(y)[2] == -3);
    CHECK(std::isnan(values(y)[3]));
  }
  SECTION("[2,3] + [3] adds the row to each row") {
    Tensor a = Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, 6});
    Tensor b = Tensor::from_vector({3}, {10, 20, 30});
    Tensor y = poisoned({2, 3});
    cpu::binary(cpu::Binary::Add, a, b, y);
    expect_values(y, {11, 22, 33, 14, 25, 36});
  }
  SECTION("[2,1] * [1,3] is an outer product") {
    Tensor a = Tensor::from_vector({2, 1}, {2, 3});
    Tensor b = Tensor::from_vector({1, 3}, {1, 10, 100});
    Tensor y = poisoned({2, 3});
    cpu::binary(cpu::Binary::Mul, a, b, y);
    expect_values(y, {2, 20, 200, 3, 30, 300});
  }
  SECTION("[1,2,2,2] * [1,2,1,1] scales each channel; the scalar-like [1] on the left") {
    Tensor a = Tensor::from_vector({1, 2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
    Tensor b = Tensor::from_vector({1, 2, 1, 1}, {10, -1});
    Tensor y = poisoned({1, 2, 2, 2});
    cpu::binary(cpu::Binary::Mul, a, b, y);
    expect_values(y, {10, 20, 30, 40, -5, -6, -7, -8});
    Tensor s = Tensor::from_vector({1}, {0.5f});
    cpu::binary(cpu::Binary::Add, s, a, y);
    expect_values(y, {1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5});
  }
}

TEST_CASE("cpu kernels: binary broadcasting random against float64", "[cpu][binary]") {
  const std::pair<Shape, Shape> cases[] = {
      {{2, 3, 4, 5}, {2, 3, 4, 5}},     // same shape
      {{2, 3, 4, 5}, {1, 3, 1, 1}},     // per channel
      {{2, 3, 4, 5}, {2, 3, 1, 1}},     // per image and channel
      {{2, 3, 4, 5}, {1}},              // scalar-like
      {{2, 3, 4, 5}, {5}},              // rank mismatch: a row
      {{3, 1, 1}, {2, 3, 4, 5}},        // rank mismatch, smaller on the left
      {{2, 1, 4, 1}, {1, 3, 1, 5}},     // both broadcast
      {{2, 3, 4, 5}, {2, 1, 4, 5}},     // a middle dim only
      {{4, 1}, {3}},                    // rank 2 from rank 1 and 2
      {{2, 1, 5, 1, 3}, {4, 5, 2, 1}},  // rank 5 and 4, both broadcast
      {{1, 1}, {1, 1}},                 // a single element
      {kThreaded, kThreaded},           // big enough to thread: one run split in pieces
      {kThreaded, {1, 8, 1, 1}},        // big enough to thread, per channel
  };
  uint64_t seed = 4000;
  for (const auto& [sa, sb] : cases)
    for (cpu::Binary op : {cpu::Binary::Add, cpu::Binary::Mul, cpu::Binary::Sub, cpu::Binary::Div,
                           cpu::Binary::Max, cpu::Binary::Min}) {
      INFO(epilog::shape_str(sa) << " op " << int(op) << " " << epilog::shape_str(sb));
      Tensor a = Tensor::randn(sa, ++seed), b = Tensor::randn(sb, ++seed);
      const Shape sy = broadcast(sa, sb);
      Tensor y = poisoned(sy);
      cpu::binary(op, a, b, y);
      std::vector<double> ref(y.numel());
      for (int64_t i = 0; i < y.numel(); ++i) {
        std::vector<int64_t> idx = unravel(i, sy);
        double va = a.f32()[broadcast_offset(idx, sa)], vb = b.f32()[broadcast_offset(idx, sb)];
        // One float operation rounds the exact result once: float(double) is that rounding.
        ref[i] = static_cast<float>(binary_ref(op, va, vb));
      }
      expect_exact(y.f32(), ref);
    }
}

// ---------------------------------------------------------------------------------------------
// concat and split

TEST_CASE("cpu kernels: concat and split worked examples", "[cpu][concat][split]") {
  Tensor a = Tensor::from_vector({2, 2}, {1, 2, 3, 4});
  Tensor b = Tensor::from_vector({2, 1}, {5, 6});
  Tensor y = poisoned({2, 3});
  cpu::concat({&a, &b}, 1, y);
  expect_values(y, {1, 2, 5, 3, 4, 6});

  Tensor c = Tensor::from_vector({1, 2}, {7, 8});
  Tensor y0 = poisoned({3, 2});
  cpu::concat({&a, &c}, 0, y0);
  expect_values(y0, {1, 2, 3, 4, 7, 8});

  std::vector<Tensor> parts{poisoned({2, 1}), poisoned({2, 2})};
  cpu::split(y, 1, parts);
  expect_values(parts[0], {1, 3});
  expect_values(parts[1], {2, 5, 4, 6});
}

TEST_CASE("cpu kernels: concat and split random, any rank and axis", "[cpu][concat][split]") {
  uint64_t seed = 5000;
  // The last is big enough to thread on some axes.
  const Shape bases[] = {{7}, {3, 4}, {2, 3, 4}, {2, 5, 3, 3}, {2, 2, 3, 2, 3}, {2, 4, 160, 80}};
  for (const Shape& base : bases)
    for (int64_t axis = 0; axis < int64_t(base.size()); ++axis) {
      INFO("base " << epilog::shape_str(base) << " axis " << axis);
      // Three parts of 1, 2 and 3 along the axis.
      std::vector<Tensor> xs;
      std::vector<const Tensor*> ptrs;
      Shape sy = base;
      sy[axis] = 0;
      for (int64_t len : {1, 2, 3}) {
        Shape s = base;
        s[axis] = len;
        xs.push_back(Tensor::randn(s, ++seed));
        sy[axis] += len;
      }
      for (const Tensor& t : xs) ptrs.push_back(&t);
      Tensor y = poisoned(sy);
      cpu::concat(ptrs, axis, y);

      // y at multi-index idx comes from the part whose range along axis holds idx[axis].
      std::vector<double> ref(y.numel());
      for (int64_t i = 0; i < y.numel(); ++i) {
        std::vector<int64_t> idx = unravel(i, sy);
        size_t part = 0;
        while (idx[axis] >= xs[part].shape()[axis]) idx[axis] -= xs[part++].shape()[axis];
        const std::vector<int64_t> st = strides_of(xs[part].shape());
        int64_t off = 0;
        for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * st[d];
        ref[i] = xs[part].f32()[off];
      }
      expect_exact(y.f32(), ref);

      std::vector<Tensor> back;
      for (const Tensor& t : xs) back.push_back(poisoned(t.shape()));
      cpu::split(y, axis, back);
      for (size_t p = 0; p < xs.size(); ++p) CHECK(values(back[p]) == values(xs[p]));
    }
}

// ---------------------------------------------------------------------------------------------
// maxpool2d and avgpool2d

TEST_CASE("cpu kernels: maxpool2d worked examples", "[cpu][pool]") {
  std::vector<float> v16(16), v25(25);
  for (int i = 0; i < 16; ++i) v16[i] = float(i + 1);
  for (int i = 0; i < 25; ++i) v25[i] = float(i + 1);
  SECTION("2x2 stride 2") {
    PoolShape ps = pool_shape(1, 1, 4, 4, 2, 2, 2, 0, 0, 0, 0, false, false);
    Tensor x = Tensor::from_vector({1, 1, 4, 4}, v16);
    Tensor y = poisoned({1, 1, 2, 2});
    cpu::maxpool2d(ps, x.f32(), y.f32());
    expect_values(y, {6, 8, 14, 16});
  }
  SECTION("padding never wins, even over negative inputs") {
    PoolShape ps = pool_shape(1, 1, 2, 2, 3, 3, 1, 1, 1, 1, 1, false, false);
    Tensor x = Tensor::from_vector({1, 1, 2, 2}, {-5, -6, -7, -8});
    Tensor y = poisoned({1, 1, 2, 2});
    cpu::maxpool2d(ps, x.f32(), y.f32());
    expect_values(y, {-5, -5, -5, -5});
  }
  SECTION("ceil mode keeps a clipped last window") {
    PoolShape ps = pool_shape(1, 1, 5, 5, 2, 2, 2, 0, 0, 0, 0, true, false);
    REQUIRE((ps.ho == 3 && ps.wo == 3));
    Tensor x = Tensor::from_vector({1, 1, 5, 5}, v25);
    Tensor y = poisoned({1, 1, 3, 3});
    cpu::maxpool2d(ps, x.f32(), y.f32());
    expect_values(y, {7, 9, 10, 17, 19, 20, 22, 24, 25});
  }
  SECTION("NaN propagates, as in PyTorch, wherever it sits in the window") {
    PoolShape ps = pool_shape(1, 1, 2, 4, 2, 2, 2, 0, 0, 0, 0, false, false);
    Tensor x = Tensor::from_vector({1, 1, 2, 4}, {1, NAN, NAN, 5, 3, 4, 6, 7});
    Tensor y = poisoned({1, 1, 1, 2});
    y.f32()[0] = y.f32()[1] = 0;  // NaN must come from the input
    cpu::maxpool2d(ps, x.f32(), y.f32());
    CHECK(std::isnan(y.f32()[0]));
    CHECK(std::isnan(y.f32()[1]));
  }
  SECTION("asymmetric padding: left 1 only") {
    PoolShape ps = pool_shape(1, 1, 1, 4, 1, 2, 2, 0, 1, 0, 0, false, false);
    REQUIRE(ps.wo == 2);
    Tensor x = Tensor::from_vector({1, 1, 1, 4}, {3, 1, 4, 1});
    Tensor y = poisoned({1, 1, 1, 2});
    cpu::maxpool2d(ps, x.f32(), y.f32());
    expect_values(y, {3, 4});  // windows {pad, 3} and {1, 4}
  }
}

TEST_CASE("cpu kernels: avgpool2d worked examples", "[cpu][pool]") {
  Tensor x = Tensor::from_vector({1, 1, 2, 2}, {1, 2, 3, 4});
  SECTION("2x2 stride 1 padding 1, both divisors") {
    Tensor y = poisoned({1, 1, 3, 3});
    PoolShape incl = pool_shape(1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 1, false, true);
    cpu::avgpool2d(incl, x.f32(), y.f32());
    expect_values(y, {0.25, 0.75, 0.5, 1, 2.5, 1.5, 0.75, 1.75, 1});
    PoolShape excl = pool_shape(1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 1, false, false);
    cpu::avgpool2d(excl, x.f32(), y.f32());
    expect_values(y, {1, 1.5, 2, 2, 2.5, 3, 3, 3.5, 4});
  }
  SECTION("bottom padding counts in the divisor only with count_include_pad") {
    // 2x2 windows, stride 1, padding bottom 1: rows {0,1} and {1, pad}.
    Tensor y = poisoned({1, 1, 2, 1});
    cpu::avgpool2d(pool_shape(1, 1, 2, 2, 2, 2, 1, 0, 0, 1, 0, false, true), x.f32(), y.f32());
    expect_values(y, {2.5, 1.75});
    cpu::avgpool2d(pool_shape(1, 1, 2, 2, 2, 2, 1, 0, 0, 1, 0, false, false), x.f32(), y.f32());
    expect_values(y, {2.5, 3.5});
  }
  SECTION("ceil mode: a window past the padded input is clipped, even counting padding") {
    // 3x3 input 1..9, 2x2 stride 2, no padding: the last row and column windows hold 2 and 1
    // elements and divide by that (PyTorch), with or without count_include_pad.
    Tensor x9 = Tensor::from_vector({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
    for (bool include : {true, false}) {
      PoolShape ps = pool_shape(1, 1, 3, 3, 2, 2, 2, 0, 0, 0, 0, true, include);
      REQUIRE((ps.ho == 2 && ps.wo == 2));
      Tensor y = poisoned({1, 1, 2, 2});
      cpu::avgpool2d(ps, x9.f32(), y.f32());
      expect_values(y, {3, 4.5, 7.5, 9});
    }
  }
}

TEST_CASE("cpu kernels: pooling random against float64", "[cpu][pool]") {
  // {n, c, h, w, kh, kw, stride, pad t, l, b, r, ceil}
  struct Case {
    int64_t n, c, h, w, kh, kw, stride, pt, pl, pb, pr;
    bool ceil;
  };
  const Case cases[] = {
      {1, 3, 8, 8, 2, 2, 2, 0, 0, 0, 0, false},   {2, 2, 9, 7, 3, 3, 2, 1, 1, 1, 1, false},
      {1, 2, 9, 7, 3, 3, 2, 1, 1, 1, 1, true},    {1, 4, 10, 10, 5, 5, 1, 2, 2, 2, 2, false},
      {1, 2, 11, 10, 3, 2, 3, 0, 1, 2, 0, true},  {3, 1, 6, 9, 3, 3, 2, 2, 0, 0, 1, true},
      {1, 2, 7, 7, 4, 4, 3, 1, 2, 3, 0, false},   {1, 1, 5, 12, 2, 3, 2, 1, 1, 1, 1, true},
      {1, 8, 64, 64, 3, 3, 1, 1, 1, 1, 1, false},  // big enough to thread
  };
  uint64_t seed = 6000;
  for (const Case& t : cases)
    for (bool include : {false, true}) {
      PoolShape ps = pool_shape(t.n, t.c, t.h, t.w, t.kh, t.kw, t.stride, t.pt, t.pl, t.pb, t.pr,
                                t.ceil, include);
      INFO(
          fmt::format("n{} c{} {}x{} kernel {}x{} stride {} pad {},{},{},{} ceil {} -> {}x{}, "
                      "count_include_pad {}",
                      t.n, t.c, t.h, t.w, t.kh, t.kw, t.stride, t.pt, t.pl, t.pb, t.pr, t.ceil,
                      ps.ho, ps.wo, include));
      Tensor x = Tensor::randn({t.n, t.c, t.h, t.w}, ++seed);
      std::vector<double> mx, avg;
      pool_ref(ps, x.f32(), mx, avg);
      Tensor y = poisoned({t.n, t.c, ps.ho, ps.wo});
      if (!include) {  // max ignores count_include_pad; check it once per case
        cpu::maxpool2d(ps, x.f32(), y.f32());
        expect_exact(y.f32(), mx);
      }
      y = poisoned({t.n, t.c, ps.ho, ps.wo});
      cpu::avgpool2d(ps, x.f32(), y.f32());
      std::vector<double> tol(avg.size());
      for (size_t i = 0; i < avg.size(); ++i) tol[i] = 2 * kU * std::fabs(avg[i]) + 1e-12;
      expect_close(y.f32(), avg, tol);
    }
}

// ---------------------------------------------------------------------------------------------
// global_avgpool

TEST_CASE("cpu kernels: global_avgpool", "[cpu][pool]") {
  SECTION("worked example, rank 4") {
    Tensor x = Tensor::from_vector({1, 2, 2, 2}, {1, 2, 3, 4, -1, -1, 5, 9});
    Tensor y = poisoned({1, 2, 1, 1});
    cpu::global_avgpool(x, y);
    expect_values(y, {2.5, 3});
  }
  SECTION("worked example, rank 3") {
    Tensor x = Tensor::from_vector({2, 1, 3}, {1, 2, 6, 0, 0, 1.5});
    Tensor y = poisoned({2, 1, 1});
    cpu::global_avgpool(x, y);
    expect_values(y, {3, 0.5});
  }
  SECTION("random ranks 3 to 5 against float64") {
    const Shape shapes[] = {{2, 3, 7}, {2, 4, 5, 6}, {1, 3, 2, 3, 4}, {1, 2, 100, 100}, kThreaded};
    uint64_t seed = 7000;
    for (const Shape& s : shapes) {
      INFO("shape " << epilog::shape_str(s));
      Tensor x = Tensor::randn(s, ++seed);
      Shape so = s;
      std::fill(so.begin() + 2, so.end(), 1);
      Tensor y = poisoned(so);
      cpu::global_avgpool(x, y);
      const int64_t inner = x.numel() / (s[0] * s[1]);
      std::vector<double> ref(s[0] * s[1]), tol(ref.size());
      for (size_t p = 0; p < ref.size(); ++p) {
        double sum = 0, mag = 0;
        for (int64_t i = 0; i < inner; ++i) {
          sum += x.f32()[p * inner + i];
          mag += std::fabs(x.f32()[p * inner + i]);
        }
        ref[p] = sum / double(inner);
        // Summed in double, rounded to float once: u of the result, plus double rounding of
        // the sum (~inner * 1.1e-16 * mag), far below float's.
        tol[p] = kU * std::fabs(ref[p]) + 1e-13 * mag;
      }
      expect_close(y.f32(), ref, tol);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// upsample_nearest

TEST_CASE("cpu kernels: upsample_nearest", "[cpu][upsample]") {
  SECTION("worked example, 2x3") {
    Tensor x = Tensor::from_vector({1, 1, 2, 2}, {1, 2, 3, 4});
    Tensor y = poisoned({1, 1, 4, 6});
    cpu::upsample_nearest(x, 2, 3, y);
    expect_values(y, {1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2,  //
                      3, 3, 3, 4, 4, 4, 3, 3, 3, 4, 4, 4});
  }
  SECTION("random: y[.., i, j] = x[.., i / sh, j / sw]") {
    // {n, c, h, w, scale h, scale w}; the last is big enough to thread.
    const int64_t cases[][6] = {{2, 3, 5, 7, 1, 1},
                                {2, 3, 5, 7, 2, 2},
                                {2, 3, 5, 7, 3, 1},
                                {2, 3, 5, 7, 1, 4},
                                {1, 4, 128, 128, 2, 2}};
    uint64_t seed = 8000;
    for (const auto& t : cases) {
      const int64_t c = t[1], h = t[2], w = t[3], sh = t[4], sw = t[5];
      INFO("x [" << t[0] << "," << c << "," << h << "," << w << "] scale " << sh << "x" << sw);
      Tensor x = Tensor::randn({t[0], c, h, w}, ++seed);
      const Shape so{t[0], c, h * sh, w * sw};
      Tensor y = poisoned(so);
      cpu::upsample_nearest(x, sh, sw, y);
      std::vector<double> ref(y.numel());
      for (int64_t i = 0; i < y.numel(); ++i) {
        std::vector<int64_t> idx = unravel(i, so);
        ref[i] = x.f32()[((idx[0] * c + idx[1]) * h + idx[2] / sh) * w + idx[3] / sw];
      }
      expect_exact(y.f32(), ref);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// linear

TEST_CASE("cpu kernels: linear worked example", "[cpu][linear]") {
  // y[m, n] = sum_k x[m, k] w[n, k] + b[n]
  Tensor x = Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor w = Tensor::from_vector({2, 3}, {1, 0, -1, 0.5, 0.5, 0.5});
  Tensor b = Tensor::from_vector({2}, {10, 20});
  Tensor y = poisoned({2, 2});
  cpu::linear(x, w, b, y);
  expect_values(y, {1 - 3 + 10, 3 + 20, 4 - 6 + 10, 7.5 + 20});
  y = poisoned({2, 2});
  cpu::linear(x, w, Tensor{}, y);
  expect_values(y, {-2, 3, -2, 7.5});
}

TEST_CASE("cpu kernels: linear random against float64", "[cpu][linear]") {
  struct Case {
    int64_t m, n, k;
  };
  const Case cases[] = {{1, 10, 16}, {3, 17, 5}, {4, 130, 300}, {7, 1, 9}, {64, 96, 200}};
  uint64_t seed = 9000;
  for (const Case& t : cases)
    for (bool bias : {false, true}) {
      INFO("m " << t.m << " n " << t.n << " k " << t.k << " bias " << bias);
      Tensor x = Tensor::randn({t.m, t.k}, ++seed), w = Tensor::randn({t.n, t.k}, ++seed);
      Tensor b = bias ? Tensor::randn({t.n}, ++seed) : Tensor{};
      Tensor y = poisoned({t.m, t.n});
      cpu::linear(x, w, b, y);
      std::vector<double> ref(t.m * t.n), tol(ref.size());
      for (int64_t i = 0; i < t.m; ++i)
        for (int64_t j = 0; j < t.n; ++j) {
          double sum = bias ? double(b.f32()[j]) : 0.0, mag = std::fabs(sum);
          for (int64_t p = 0; p < t.k; ++p) {
            double term = double(x.f32()[i * t.k + p]) * double(w.f32()[j * t.k + p]);
            sum += term;
            mag += std::fabs(term);
          }
          ref[i * t.n + j] = sum;
          tol[i * t.n + j] = (t.k + 2) * kU * mag;
        }
      expect_close(y.f32(), ref, tol);
    }
}
