// Pooling: 2-D max and average windows over NCHW planes, and the global average.
#include <algorithm>
#include <cmath>

#include "detail.h"
#include "epilog/kernels/cpu.h"

namespace epilog::cpu {
namespace {

void check_pool(const PoolShape& ps, const float* x, const float* y) {
  EPILOG_ASSERT(ps.n >= 0 && ps.c >= 0 && ps.h > 0 && ps.w > 0 && ps.ho > 0 && ps.wo > 0,
                "pool n {} c {} h {} w {} ho {} wo {}", ps.n, ps.c, ps.h, ps.w, ps.ho, ps.wo);
  EPILOG_ASSERT(ps.kh > 0 && ps.kw > 0 && ps.stride_h > 0 && ps.stride_w > 0);
  EPILOG_ASSERT(ps.pad_t >= 0 && ps.pad_l >= 0 && ps.pad_b >= 0 && ps.pad_r >= 0);
  EPILOG_ASSERT(x && y);
}

int64_t window_work(const PoolShape& ps) {
  return ps.n * ps.c * ps.ho * ps.wo * ps.kh * ps.kw;
}

// One axis of a window: [begin, end) clipped to the input, and its extent clipped to the
// padded input [-pad_begin, in + pad_end) (the count_include_pad divisor).
struct Window {
  int64_t begin, end, padded;
};
Window window(int64_t o, int64_t stride, int64_t pad_begin, int64_t pad_end, int64_t extent,
              int64_t in) {
  const int64_t start = o * stride - pad_begin;
  const int64_t stop = std::min(start + extent, in + pad_end);
  return {std::max<int64_t>(start, 0), std::min(stop, in), stop - start};
}

// Calls out = f(in, wh, ww) for each output element: `in` the input plane, wh and ww the
// window's rows and columns. Planes in parallel.
template <class F>
void for_each_window(const PoolShape& ps, const float* x, float* y, F f) {
  check_pool(ps, x, y);
#pragma omp parallel for schedule(static) if (detail::worth_threads(window_work(ps)))
  for (int64_t plane = 0; plane < ps.n * ps.c; ++plane) {
    const int64_t b = plane / ps.c, ch = plane % ps.c;
    const float* in = x + b * ps.x_image() + ch * ps.h * ps.w;
    float* out = y + b * ps.y_image() + ch * ps.ho * ps.wo;
    for (int64_t oh = 0; oh < ps.ho; ++oh) {
      const Window wh = window(oh, ps.stride_h, ps.pad_t, ps.pad_b, ps.kh, ps.h);
      for (int64_t ow = 0; ow < ps.wo; ++ow)
        out[oh * ps.wo + ow] = f(in, wh, window(ow, ps.stride_w, ps.pad_l, ps.pad_r, ps.kw, ps.w));
    }
  }
}

}  // namespace

void maxpool2d(const PoolShape& ps, const float* x, float* y) {
  for_each_window(ps, x, y, [&](const float* in, const Window& wh, const Window& ww) {
    // Shape inference keeps every window on at least one input element.
    EPILOG_ASSERT(wh.begin < wh.end && ww.begin < ww.end, "maxpool window holds only padding");
    float m = in[wh.begin * ps.w + ww.begin];
    for (int64_t ih = wh.begin; ih < wh.end; ++ih)
      for (int64_t iw = ww.begin; iw < ww.end; ++iw) {
        const float v = in[ih * ps.w + iw];
        if (v > m || std::isnan(v)) m = v;  // NaN propagates, as in PyTorch
      }
    return m;
  });
}

void avgpool2d(const PoolShape& ps, const float* x, float* y) {
  for_each_window(ps, x, y, [&](const float* in, const Window& wh, const Window& ww) {
    const int64_t count = ps.count_include_pad ? wh.padded * ww.padded
                                               : (wh.end - wh.begin) * (ww.end - ww.begin);
    EPILOG_ASSERT(count > 0, "avgpool window is empty");
    double sum = 0.0;
    for (int64_t ih = wh.begin; ih < wh.end; ++ih)
      for (int64_t iw = ww.begin; iw < ww.end; ++iw) sum += in[ih * ps.w + iw];
    return static_cast<float>(sum / double(count));
  });
}

void global_avgpool(const Tensor& x, Tensor& y) {
  EPILOG_ASSERT(x.rank() >= 3, "global_avgpool x {}", shape_str(x.shape()));
  Shape expect = x.shape();
  std::fill(expect.begin() + 2, expect.end(), 1);
  EPILOG_ASSERT(y.shape() == expect, "global_avgpool x {} y {}", shape_str(x.shape()),
                shape_str(y.shape()));
  const int64_t planes = x.dim(0) * x.dim(1);
  const int64_t inner = planes == 0 ? 0 : x.numel() / planes;
  EPILOG_ASSERT(planes == 0 || inner > 0, "global_avgpool over an empty {}", shape_str(x.shape()));
  const float* xp = x.f32();
  float* yp = y.f32();
#pragma omp parallel for schedule(static) if (detail::worth_threads(x.numel()))
  for (int64_t p = 0; p < planes; ++p) {
    const float* in = xp + p * inner;
    double sum = 0.0;
    for (int64_t i = 0; i < inner; ++i) sum += in[i];
    yp[p] = static_cast<float>(sum / double(inner));
  }
}

}  // namespace epilog::cpu
