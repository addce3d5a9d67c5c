// Reductions and normalizations, each summed (or multiplied) in double: the plain loops of the
// definitions.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "detail.h"
#include "epilog/kernels/cpu.h"

namespace epilog::cpu {
namespace {

// The mean and 1 / sqrt(biased variance + eps) of x[0], x[stride], ... x[(n - 1) * stride], two
// passes in double.
struct Moments {
  double mean, rstd;
};
Moments moments(const float* x, int64_t n, int64_t stride, double eps) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i * stride];
  const double mean = sum / double(n);
  double var = 0;
  for (int64_t i = 0; i < n; ++i) var += (x[i * stride] - mean) * (x[i * stride] - mean);
  return {mean, 1.0 / std::sqrt(var / double(n) + eps)};
}

}  // namespace

void reduce(Reduce op, const Tensor& x, const std::vector<bool>& reduced, Tensor& y) {
  const Shape& xs = x.shape();
  EPILOG_ASSERT(reduced.size() == xs.size(), "reduce {} over {} dims", shape_str(xs),
                reduced.size());
  // Element strides of y along x's dims: 0 where a dim is reduced.
  std::vector<int64_t> ystride(xs.size(), 0);
  int64_t kept = 1, count = 1;
  for (size_t d = xs.size(); d-- > 0;) {
    if (reduced[d]) {
      count *= xs[d];
    } else {
      ystride[d] = kept;
      kept *= xs[d];
    }
  }
  EPILOG_ASSERT(kept == y.numel(), "reduce {} into {}", shape_str(xs), shape_str(y.shape()));
  const double inf = std::numeric_limits<double>::infinity();
  const double init = op == Reduce::Max    ? -inf
                      : op == Reduce::Min  ? inf
                      : op == Reduce::Prod ? 1.0
                                           : 0.0;
  std::vector<double> acc(size_t(kept), init);
  std::vector<int64_t> idx(xs.size(), 0);
  const float* xp = x.f32();
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t o = 0;
    for (size_t d = 0; d < xs.size(); ++d) o += idx[d] * ystride[d];
    double& a = acc[size_t(o)];
    const double v = xp[i];
    switch (op) {
      case Reduce::Max:  // NaN wins, and stays
        if (std::isnan(v) || v > a) a = std::isnan(a) ? a : v;
        break;
      case Reduce::Min:
        if (std::isnan(v) || v < a) a = std::isnan(a) ? a : v;
        break;
      case Reduce::Prod:
        a *= v;
        break;
      case Reduce::Mean:
      case Reduce::Sum:
        a += v;
        break;
    }
    for (size_t d = xs.size(); d-- > 0;) {
      if (++idx[d] < xs[d]) break;
      idx[d] = 0;
    }
  }
  float* yp = y.f32();
  for (int64_t o = 0; o < kept; ++o)
    yp[o] = float(op == Reduce::Mean ? acc[size_t(o)] / double(count) : acc[size_t(o)]);
}

void softmax(const Tensor& x, int64_t axis, Tensor& y, bool log) {
  EPILOG_ASSERT(axis >= 0 && axis < x.rank() && y.shape() == x.shape(), "softmax {} on axis {}",
                shape_str(x.shape()), axis);
  const AxisView v = axis_view(x.shape(), axis);
  const int64_t n = x.dim(int(axis));
  const float* xp = x.f32();
  float* yp = y.f32();
#pragma omp parallel for schedule(static) if (detail::worth_threads(x.numel()))
  for (int64_t row = 0; row < v.outer * v.inner; ++row) {
    const int64_t base = row / v.inner * n * v.inner + row % v.inner;
    double top = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t j = 0; j < n; ++j) top = std::max(top, double(xp[base + j * v.inner]));
    for (int64_t j = 0; j < n; ++j) sum += std::exp(xp[base + j * v.inner] - top);
    const double log_sum = std::log(sum);
    for (int64_t j = 0; j < n; ++j) {
      const double shifted = xp[base + j * v.inner] - top;
      yp[base + j * v.inner] = float(log ? shifted - log_sum : std::exp(shifted) / sum);
    }
  }
}

void layer_norm(const Tensor& x, int64_t axis, int64_t last_axis, const Tensor& scale,
                const Tensor& bias, double eps, Tensor& y) {
  EPILOG_ASSERT(axis >= 0 && axis <= last_axis && last_axis < x.rank() && y.shape() == x.shape(),
                "layer_norm {} from {} to {}", shape_str(x.shape()), axis, last_axis);
  // x as [outer, n, inner]: each of the outer * inner columns of n values is normalized.
  const int64_t inner = axis_view(x.shape(), last_axis).inner;
  const int64_t n = x.numel() / axis_view(x.shape(), axis).outer / inner;
  EPILOG_ASSERT(scale.numel() == n && (!bias.defined() || bias.numel() == n));
  const float *xp = x.f32(), *sp = scale.f32(), *bp = bias.defined() ? bias.f32() : nullptr;
  float* yp = y.f32();
  const int64_t columns = x.numel() / n;
#pragma omp parallel for schedule(static) if (detail::worth_threads(x.numel()))
  for (int64_t c = 0; c < columns; ++c) {
    const int64_t base = c / inner * n * inner + c % inner;
    const Moments m = moments(xp + base, n, inner, eps);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t at = base + j * inner;
      yp[at] = float((xp[at] - m.mean) * m.rstd * sp[j] + (bp ? bp[j] : 0.0));
    }
  }
}

void group_norm(const Tensor& x, int64_t groups, const Tensor& scale, const Tensor& bias,
                double eps, Tensor& y) {
  EPILOG_ASSERT(x.rank() >= 2 && y.shape() == x.shape() && x.dim(1) % groups == 0,
                "group_norm {} in {} groups", shape_str(x.shape()), groups);
  const int64_t c = x.dim(1), inner = x.numel() / (x.dim(0) * c), per = c / groups * inner;
  const float *xp = x.f32(), *sp = scale.f32(), *bp = bias.f32();
  float* yp = y.f32();
#pragma omp parallel for schedule(static) if (detail::worth_threads(x.numel()))
  for (int64_t r = 0; r < x.dim(0) * groups; ++r) {
    const float* row = xp + r * per;
    const Moments m = moments(row, per, 1, eps);
    for (int64_t j = 0; j < per; ++j) {
      const int64_t ch = r % groups * (c / groups) + j / inner;
      yp[r * per + j] = float((row[j] - m.mean) * m.rstd * sp[ch] + bp[ch]);
    }
  }
}

void matmul(const Tensor& a, const Tensor& b, Tensor& y) {
  const Shape &as = a.shape(), &bs = b.shape(), &ys = y.shape();
  EPILOG_ASSERT(as.size() >= 2 && bs.size() >= 2 && ys.size() >= 2, "matmul {} by {} into {}",
                shape_str(as), shape_str(bs), shape_str(ys));
  const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  EPILOG_ASSERT(bs[bs.size() - 2] == k && ys[ys.size() - 2] == m && ys.back() == n);
  // Each batch index of y walks a's and b's batches with stride 0 where they broadcast.
  const size_t batch_rank = ys.size() - 2;
  std::vector<int64_t> sa(batch_rank, 0), sb(batch_rank, 0);
  int64_t step_a = m * k, step_b = k * n;
  for (size_t i = 0; i < batch_rank; ++i) {
    const size_t d = batch_rank - 1 - i;
    const int64_t da = i + 2 < as.size() ? as[as.size() - 3 - i] : 1;
    const int64_t db = i + 2 < bs.size() ? bs[bs.size() - 3 - i] : 1;
    sa[d] = da == 1 ? 0 : step_a;
    sb[d] = db == 1 ? 0 : step_b;
    step_a *= da;
    step_b *= db;
  }
  const int64_t batches = y.numel() / (m * n);
  for (int64_t bi = 0; bi < batches; ++bi) {
    int64_t oa = 0, ob = 0, rest = bi;
    for (size_t d = batch_rank; d-- > 0;) {
      const int64_t idx = rest % ys[d];
      rest /= ys[d];
      oa += idx * sa[d];
      ob += idx * sb[d];
    }
    sgemm(m, n, k, a.f32() + oa, k, b.f32() + ob, n, y.f32() + bi * m * n, n, false);
  }
}

}  // namespace epilog::cpu
