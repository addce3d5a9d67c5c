// Data movement: concat and split along any axis, nearest-neighbour upsampling.
#include <algorithm>
#include <vector>

#include "detail.h"
#include "epilog/kernels/cpu.h"

namespace epilog::cpu {
namespace {

// Checks that `part` matches `whole` outside `axis`.
void check_part(const char* op, const Shape& part, const Shape& whole, int64_t axis) {
  bool ok = part.size() == whole.size();
  for (size_t d = 0; ok && d < part.size(); ++d) ok = int64_t(d) == axis || part[d] == whole[d];
  EPILOG_ASSERT(ok, "{} part {} does not fit {} along axis {}", op, shape_str(part),
                shape_str(whole), axis);
}

// Start of row o of t viewed as [outer, row]: a strided t (Tensor::part) keeps each item of
// dim 0 item_stride() elements apart, its outer / dim(0) rows contiguous within the item.
int64_t row_start(const Tensor& t, int64_t o, int64_t row, int64_t outer) {
  if (t.contiguous()) return o * row;
  const int64_t per = outer / t.dim(0);
  EPILOG_ASSERT(per > 0, "a strided {} split or joined on axis 0", shape_str(t.shape()));
  return o / per * t.item_stride() + o % per * row;
}

}  // namespace

void concat(const std::vector<const Tensor*>& xs, int64_t axis, Tensor& y) {
  EPILOG_ASSERT(!xs.empty() && axis >= 0 && axis < y.rank(), "concat of {} on axis {} into {}",
                xs.size(), axis, shape_str(y.shape()));
  const AxisView v = axis_view(y.shape(), axis);
  std::vector<int64_t> rows, offsets;
  std::vector<const float*> parts;
  int64_t total = 0;
  for (const Tensor* x : xs) {
    check_part("concat", x->shape(), y.shape(), axis);
    rows.push_back(x->dim(static_cast<int>(axis)) * v.inner);
    offsets.push_back(total * v.inner);
    total += x->dim(static_cast<int>(axis));
    parts.push_back(x->f32());
  }
  EPILOG_ASSERT(total == y.dim(static_cast<int>(axis)), "concat parts add to {} on axis {}, y {}",
                total, axis, shape_str(y.shape()));
  const int64_t row = total * v.inner, np = static_cast<int64_t>(parts.size());
  float* yp = y.f32();
#pragma omp parallel for schedule(static) if (detail::worth_threads(y.numel()))
  for (int64_t job = 0; job < v.outer * np; ++job) {
    const int64_t o = job / np, i = job % np;
    const float* src = parts[i] + row_start(*xs[i], o, rows[i], v.outer);
    std::copy(src, src + rows[i], yp + row_start(y, o, row, v.outer) + offsets[i]);
  }
}

void split(const Tensor& x, int64_t axis, std::vector<Tensor>& ys) {
  EPILOG_ASSERT(!ys.empty() && axis >= 0 && axis < x.rank(), "split of {} on axis {} into {}",
                shape_str(x.shape()), axis, ys.size());
  const AxisView v = axis_view(x.shape(), axis);
  std::vector<int64_t> rows, offsets;
  std::vector<float*> parts;
  int64_t total = 0;
  for (Tensor& y : ys) {
    check_part("split", y.shape(), x.shape(), axis);
    rows.push_back(y.dim(static_cast<int>(axis)) * v.inner);
    offsets.push_back(total * v.inner);
    total += y.dim(static_cast<int>(axis));
    parts.push_back(y.f32());
  }
  EPILOG_ASSERT(total == x.dim(static_cast<int>(axis)), "split parts add to {} on axis {}, x {}",
                total, axis, shape_str(x.shape()));
  const int64_t row = total * v.inner, np = static_cast<int64_t>(parts.size());
  const float* xp = x.f32();
#pragma omp parallel for schedule(static) if (detail::worth_threads(x.numel()))
  for (int64_t job = 0; job < v.outer * np; ++job) {
    const int64_t o = job / np, i = job % np;
    const float* src = xp + row_start(x, o, row, v.outer) + offsets[i];
    std::copy(src, src + rows[i], parts[i] + row_start(ys[i], o, rows[i], v.outer));
  }
}

void upsample_nearest(const Tensor& x, int64_t scale_h, int64_t scale_w, Tensor& y) {
  EPILOG_ASSERT(x.rank() >= 2 && scale_h > 0 && scale_w > 0, "upsample {} by {}x{}",
                shape_str(x.shape()), scale_h, scale_w);
  const int64_t h = x.dim(-2), w = x.dim(-1), ho = h * scale_h, wo = w * scale_w;
  Shape expect = x.shape();
  expect[expect.size() - 2] = ho;
  expect[expect.size() - 1] = wo;
  EPILOG_ASSERT(y.shape() == expect, "upsample {} by {}x{} into {}", shape_str(x.shape()), scale_h,
                scale_w, shape_str(y.shape()));
  const int64_t planes = h * w == 0 ? 0 : x.numel() / (h * w);
  const float* xp = x.f32();
  float* yp = y.f32();
#pragma omp parallel for schedule(static) if (detail::worth_threads(y.numel()))
  for (int64_t row = 0; row < planes * ho; ++row) {
    const int64_t plane = row / ho, oh = row % ho;
    const float* src = xp + row_start(x, plane, h * w, planes) + oh / scale_h * w;
    float* dst = yp + row_start(y, plane, ho * wo, planes) + oh * wo;
    for (int64_t iw = 0; iw < w; ++iw)
      for (int64_t t = 0; t < scale_w; ++t) dst[iw * scale_w + t] = src[iw];
  }
}

}  // namespace epilog::cpu
