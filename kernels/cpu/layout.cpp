// Layout kernels: strided gathers (transpose, slice), the channel shuffle, depth_to_space and
// space_to_depth, padding and resizing. Naive on purpose: each output element is computed from
// its own index, as the op's definition states it.
#include <algorithm>
#include <vector>

#include "detail.h"
#include "epilog/kernels/cpu.h"

namespace epilog::cpu {
namespace {

// Visits every index of `shape` in row-major order, calling f(flat index, multi-index).
template <class F>
void for_each_index(const Shape& shape, F&& f) {
  const int64_t n = shape_numel(shape);
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    f(i, idx);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

std::vector<int64_t> strides_of(const Shape& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

// The index of a padded dim's element o in the input of size n, or -1 for the constant.
int64_t pad_source(PadMode mode, int64_t o, int64_t n) {
  if (o >= 0 && o < n) return o;
  switch (mode) {
    case PadMode::Constant:
      return -1;
    case PadMode::Edge:
      return o < 0 ? 0 : n - 1;
    case PadMode::Reflect:
      return o < 0 ? -o : 2 * (n - 1) - o;
  }
  return -1;
}

}  // namespace

void gather(const Tensor& x, int64_t offset, const std::vector<int64_t>& strides, Tensor& y) {
  EPILOG_ASSERT(strides.size() == y.shape().size() && x.contiguous() && y.contiguous(),
                "gather from {} into {}", shape_str(x.shape()), shape_str(y.shape()));
  const float* xp = x.f32();
  float* yp = y.f32();
  for_each_index(y.shape(), [&](int64_t i, const std::vector<int64_t>& idx) {
    int64_t src = offset;
    for (size_t d = 0; d < idx.size(); ++d) src += idx[d] * strides[d];
    EPILOG_ASSERT(src >= 0 && src < x.numel());
    yp[i] = xp[src];
  });
}

void channel_shuffle(const std::vector<const Tensor*>& parts, int64_t groups, Tensor& y) {
  const Shape& ys = y.shape();
  EPILOG_ASSERT(ys.size() >= 2 && groups >= 1 && ys[1] % groups == 0 && !parts.empty(),
                "channel_shuffle of {} parts into {} in {} groups", parts.size(), shape_str(ys),
                groups);
  if (y.numel() == 0) return;
  const int64_t c = ys[1], per = c / groups, inner = y.numel() / (ys[0] * c);
  // x's channels: the part of each and its channel there
  std::vector<std::pair<const Tensor*, int64_t>> src;
  for (const Tensor* p : parts) {
    EPILOG_ASSERT(p->rank() == y.rank() && p->dim(0) == ys[0] &&
                      p->numel() == ys[0] * p->dim(1) * inner,
                  "channel_shuffle part {} into {}", shape_str(p->shape()), shape_str(ys));
    for (int64_t ch = 0; ch < p->dim(1); ++ch) src.push_back({p, ch});
  }
  EPILOG_ASSERT(int64_t(src.size()) == c, "channel_shuffle parts of {} channels into {}",
                src.size(), shape_str(ys));
  float* yp = y.f32();
  for (int64_t n = 0; n < ys[0]; ++n)
    for (int64_t i = 0; i < groups; ++i)
      for (int64_t j = 0; j < per; ++j) {
        const auto [x, ch] = src[size_t(i * per + j)];
        const float* from = x->f32() + n * x->item_stride() + ch * inner;
        std::copy(from, from + inner, yp + n * y.item_stride() + (j * groups + i) * inner);
      }
}

void depth_space(const Tensor& x, int64_t bh, int64_t bw, bool crd, bool to_space, Tensor& y,
                 int64_t crop_t, int64_t crop_l) {
  const Tensor& deep = to_space ? x : y;
  const Tensor& wide = to_space ? y : x;
  const Shape &ds = deep.shape(), &ws = wide.shape();
  EPILOG_ASSERT(ds.size() == 4 && ws.size() == 4 && bh >= 1 && bw >= 1 && ds[0] == ws[0] &&
                    ds[1] == ws[1] * bh * bw && crop_t >= 0 && crop_l >= 0 &&
                    crop_t + ws[2] <= ds[2] * bh && crop_l + ws[3] <= ds[3] * bw &&
                    (to_space || (crop_t == 0 && crop_l == 0 && ws[2] == ds[2] * bh &&
                                  ws[3] == ds[3] * bw)) &&
                    x.contiguous() && y.contiguous(),
                "depth_space between {} and {} in blocks of {}x{} (crop {}, {})", shape_str(ds),
                shape_str(ws), bh, bw, crop_t, crop_l);
  const int64_t c = ws[1], h = ds[2], w = ds[3];
  const float* xp = x.f32();
  float* yp = y.f32();
  for (int64_t n = 0; n < ws[0]; ++n)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t oh = 0; oh < ws[2]; ++oh)
        for (int64_t ow = 0; ow < ws[3]; ++ow) {
          const int64_t fh = oh + crop_t, fw = ow + crop_l, i = fh % bh, j = fw % bw;
          const int64_t dc = crd ? ch * bh * bw + i * bw + j : (i * bw + j) * c + ch;
          const int64_t d = ((n * ds[1] + dc) * h + fh / bh) * w + fw / bw;
          const int64_t o = ((n * c + ch) * ws[2] + oh) * ws[3] + ow;
          if (to_space)
            yp[o] = xp[d];
          else
            yp[d] = xp[o];
        }
}

void pad(const Tensor& x, const std::vector<int64_t>& begins, PadMode mode, float value,
         Tensor& y) {
  const Shape& xs = x.shape();
  EPILOG_ASSERT(begins.size() == xs.size() && y.rank() == x.rank(), "pad {} into {}", shape_str(xs),
                shape_str(y.shape()));
  const std::vector<int64_t> st = strides_of(xs);
  const float* xp = x.f32();
  float* yp = y.f32();
  for_each_index(y.shape(), [&](int64_t i, const std::vector<int64_t>& idx) {
    int64_t src = 0;
    for (size_t d = 0; d < idx.size() && src >= 0; ++d) {
      const int64_t s = pad_source(mode, idx[d] - begins[d], xs[d]);
      src = s < 0 ? -1 : src + s * st[d];
    }
    yp[i] = src < 0 ? value : xp[src];
  });
}

void resize(const Tensor& x, const ResizeMode& mode, Tensor& y) {
  EPILOG_ASSERT(x.rank() >= 2 && y.rank() == x.rank(), "resize {} into {}", shape_str(x.shape()),
                shape_str(y.shape()));
  const int64_t h = x.dim(-2), w = x.dim(-1), ho = y.dim(-2), wo = y.dim(-1);
  const int64_t planes = x.numel() / (h * w);
  EPILOG_ASSERT(planes * ho * wo == y.numel(), "resize {} into {}", shape_str(x.shape()),
                shape_str(y.shape()));
  const float* xp = x.f32();
  float* yp = y.f32();
#pragma omp parallel for schedule(static) if (detail::worth_threads(y.numel()))
  for (int64_t p = 0; p < planes; ++p) {
    const float* src = xp + p * h * w;
    for (int64_t oh = 0; oh < ho; ++oh)
      for (int64_t ow = 0; ow < wo; ++ow) {
        const float sy = resize_source(mode.coord, oh, h, ho);
        const float sx = resize_source(mode.coord, ow, w, wo);
        float v;
        if (!mode.linear) {
          v = src[resize_nearest(mode.nearest, sy, h) * w + resize_nearest(mode.nearest, sx, w)];
        } else {
          const LinearTap ty = resize_linear(sy, h), tx = resize_linear(sx, w);
          const float top = src[ty.i0 * w + tx.i0] * (1 - tx.w1) + src[ty.i0 * w + tx.i1] * tx.w1;
          const float bot = src[ty.i1 * w + tx.i0] * (1 - tx.w1) + src[ty.i1 * w + tx.i1] * tx.w1;
          v = top * (1 - ty.w1) + bot * ty.w1;
        }
        yp[(p * ho + oh) * wo + ow] = v;
      }
  }
}

}  // namespace epilog::cpu
