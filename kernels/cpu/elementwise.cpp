// Elementwise kernels: inference batchnorm, activations, the broadcasting binary ops and chains
// of them (fused_elementwise).
#include <algorithm>
#include <cmath>
#include <vector>

#include "detail.h"
#include "epilog/kernels/cpu.h"

namespace epilog::cpu {
namespace {

// Elements per job of the elementwise loops: big enough that per-job work (index arithmetic,
// the activation switch) does not show.
constexpr int64_t kPiece = 16384;

// Dims of the output with the element strides of both operands (0 where one broadcasts).
struct BroadcastDim {
  int64_t size, sa, sb;
};

// y's dims with a's and b's strides, size-1 dims dropped and neighbours merged wherever both
// operands step through them as through one dim, so [N,C,H,W] + [1,C,1,1] becomes
// [N, C, H*W] with b strides (0, 1, 0) and the inner loop runs over all of H*W.
std::vector<BroadcastDim> broadcast_dims(const Shape& a, const Shape& b, const Shape& y) {
  const size_t rank = y.size();
  EPILOG_ASSERT(rank == std::max(a.size(), b.size()), "binary {} and {} into {}", shape_str(a),
                shape_str(b), shape_str(y));
  std::vector<BroadcastDim> dims(rank);
  int64_t stride_a = 1, stride_b = 1;
  for (size_t i = 0; i < rank; ++i) {  // from the back, where shapes align
    const size_t d = rank - 1 - i;
    const int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    EPILOG_ASSERT((da == db || da == 1 || db == 1) && y[d] == (da == 1 ? db : da),
                  "binary {} and {} do not broadcast to {}", shape_str(a), shape_str(b),
                  shape_str(y));
    dims[d] = {y[d], da == 1 ? 0 : stride_a, db == 1 ? 0 : stride_b};
    stride_a *= da;
    stride_b *= db;
  }
  std::vector<BroadcastDim> merged;
  for (const BroadcastDim& d : dims) {
    if (d.size == 1) continue;
    if (!merged.empty()) {
      BroadcastDim& prev = merged.back();
      if (prev.sa == d.sa * d.size && prev.sb == d.sb * d.size) {
        prev = {prev.size * d.size, d.sa, d.sb};
        continue;
      }
    }
    merged.push_back(d);
  }
  if (merged.empty()) merged.push_back({1, 0, 0});
  return merged;
}

// One inner run of n elements; a and b each either step by one or stay put.
template <Binary Op>
void binary_run(const float* a, int64_t sa, const float* b, int64_t sb, float* y, int64_t n) {
  if (sa == 1 && sb == 1)
    for (int64_t j = 0; j < n; ++j) y[j] = binary_apply(Op, a[j], b[j]);
  else if (sa == 1)
    for (int64_t j = 0; j < n; ++j) y[j] = binary_apply(Op, a[j], b[0]);
  else if (sb == 1)
    for (int64_t j = 0; j < n; ++j) y[j] = binary_apply(Op, a[0], b[j]);
  else
    for (int64_t j = 0; j < n; ++j) y[j] = binary_apply(Op, a[0], b[0]);
}

template <Binary Op>
void binary_impl(const std::vector<BroadcastDim>& dims, const float* a, const float* b, float* y) {
  const BroadcastDim inner = dims.back();
  // The inner dim is the last merged run of each operand, so it steps by 1 or not at all.
  EPILOG_ASSERT((inner.sa == 0 || inner.sa == 1) && (inner.sb == 0 || inner.sb == 1));
  const int64_t outer_rank = static_cast<int64_t>(dims.size()) - 1;
  int64_t outer = 1;
  for (int64_t d = 0; d < outer_rank; ++d) outer *= dims[d].size;
  // Jobs are pieces of inner runs, so that two same-shape tensors (one run) still split.
  const int64_t pieces = (inner.size + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) if (detail::worth_threads(outer * inner.size))
  for (int64_t job = 0; job < outer * pieces; ++job) {
    const int64_t o = job / pieces, j0 = job % pieces * kPiece;
    int64_t oa = j0 * inner.sa, ob = j0 * inner.sb, rest = o;
    for (int64_t d = outer_rank - 1; d >= 0; --d) {
      const int64_t idx = rest % dims[d].size;
      rest /= dims[d].size;
      oa += idx * dims[d].sa;
      ob += idx * dims[d].sb;
    }
    binary_run<Op>(a + oa, inner.sa, b + ob, inner.sb, y + o * inner.size + j0,
                   std::min(kPiece, inner.size - j0));
  }
}

}  // namespace

void batchnorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& mean,
               const Tensor& var, double eps, Tensor& y) {
  EPILOG_ASSERT(x.rank() >= 2 && y.shape() == x.shape(), "batchnorm x {} y {}",
                shape_str(x.shape()), shape_str(y.shape()));
  const int64_t n = x.dim(0), c = x.dim(1);
  int64_t inner = 1;
  for (int d = 2; d < x.rank(); ++d) inner *= x.dim(d);
  for (const Tensor* p : {&gamma, &beta, &mean, &var})
    EPILOG_ASSERT(p->shape() == Shape{c}, "batchnorm parameter {} for {} channels",
                  shape_str(p->shape()), c);
  const float *xp = x.f32(), *gp = gamma.f32(), *bp = beta.f32(), *mp = mean.f32(), *vp = var.f32();
  float* yp = y.f32();
#pragma omp parallel for schedule(static) if (detail::worth_threads(x.numel()))
  for (int64_t plane = 0; plane < n * c; ++plane) {
    const int64_t ch = plane % c;
    // gamma / sqrt(var + eps) in double: one rounding instead of three.
    const float a = static_cast<float>(gp[ch] / std::sqrt(double(vp[ch]) + eps));
    const float m = mp[ch], b = bp[ch];
    const float* src = xp + plane * inner;
    float* dst = yp + plane * inner;
    for (int64_t i = 0; i < inner; ++i) dst[i] = (src[i] - m) * a + b;
  }
}

void activation(Act act, const Tensor& x, Tensor& y) {
  EPILOG_ASSERT(y.shape() == x.shape(), "activation x {} y {}", shape_str(x.shape()),
                shape_str(y.shape()));
  const float* xp = x.f32();
  float* yp = y.f32();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (detail::worth_threads(n))
  for (int64_t i0 = 0; i0 < n; i0 += kPiece)
    detail::activate_span(act, xp + i0, yp + i0, std::min(kPiece, n - i0));
}

void binary(Binary op, const Tensor& a, const Tensor& b, Tensor& y) {
  if (!a.contiguous() || !b.contiguous() || !y.contiguous()) {
    // Channel slabs of a batch (Tensor::part): same shapes only, one item of dim 0 at a time.
    EPILOG_ASSERT(a.shape() == y.shape() && b.shape() == y.shape(),
                  "binary on strided tensors needs equal shapes: {} and {} into {}",
                  shape_str(a.shape()), shape_str(b.shape()), shape_str(y.shape()));
    for (int64_t i = 0; i < y.dim(0); ++i) {
      Tensor yi = y.slice(i, i + 1);
      binary(op, a.slice(i, i + 1), b.slice(i, i + 1), yi);
    }
    return;
  }
  const std::vector<BroadcastDim> dims = broadcast_dims(a.shape(), b.shape(), y.shape());
  if (y.numel() == 0) return;
  switch (op) {
    case Binary::Add:
      return binary_impl<Binary::Add>(dims, a.f32(), b.f32(), y.f32());
    case Binary::Mul:
      return binary_impl<Binary::Mul>(dims, a.f32(), b.f32(), y.f32());
    case Binary::Sub:
      return binary_impl<Binary::Sub>(dims, a.f32(), b.f32(), y.f32());
    case Binary::Div:
      return binary_impl<Binary::Div>(dims, a.f32(), b.f32(), y.f32());
    case Binary::Max:
      return binary_impl<Binary::Max>(dims, a.f32(), b.f32(), y.f32());
    case Binary::Min:
      return binary_impl<Binary::Min>(dims, a.f32(), b.f32(), y.f32());
  }
  EPILOG_ASSERT(false, "unknown binary op {}", static_cast<int>(op));
}

void fused_elementwise(const ChainProgram& p, const ChainShape& s, const float* const* x,
                       float* y) {
  const int last = s.rank - 1;
  const int64_t inner = s.size[last];
  int64_t rows = 1;
  for (int d = 0; d < last; ++d) rows *= s.size[d];
  // Jobs are pieces of rows, so that one long row (equal shapes) still splits.
  const int64_t pieces = (inner + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) if (detail::worth_threads(rows * inner))
  for (int64_t job = 0; job < rows * pieces; ++job) {
    const int64_t row = job / pieces, j0 = job % pieces * kPiece;
    int64_t at[kMaxChainInputs] = {}, y_at = 0, rest = row;
    for (int d = last - 1; d >= 0; --d) {
      const int64_t i = rest % s.size[d];
      rest /= s.size[d];
      for (int k = 0; k < s.inputs; ++k) at[k] += i * s.stride[k][d];
      y_at += i * s.y_stride[d];
    }
    const auto read = [&](int k, int64_t j) { return x[k][at[k] + j * s.stride[k][last]]; };
    for (int64_t j = j0; j < std::min(inner, j0 + kPiece); ++j) {
      float v = read(0, j);
      for (int t = 0; t < p.steps; ++t) {
        const ChainStep& step = p.step[t];
        v = chain_step(step, v, step.operand < 0 ? 0.0f : read(step.operand, j));
      }
      y[y_at + j * s.y_stride[last]] = v;
    }
  }
}

}  // namespace epilog::cpu
