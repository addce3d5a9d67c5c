// conv2d with its epilogue: im2col + GEMM per (image, group), or a direct loop for depthwise.
//
// Per image b and group g (cg = c / groups input and kg = k / groups output channels), the
// convolution is the GEMM
//   Y_g[kg, ho*wo] = W_g[kg, cg*r*s] * col[cg*r*s, ho*wo]
// with W_g rows of the weight as stored ([k, cg, r, s] is already row-major [k, cg*r*s]) and
// col[(ci*r + i)*s + j, oh*wo + ow] = x[b, g*cg + ci, oh*sh - pad_t + i*dh, ow*sw - pad_l + j*dw]
// (0 outside the input). The GEMM asks for col one block at a time (im2col_block), so the
// whole column matrix never exists. A 1x1, stride-1, unpadded conv needs no col at all: the
// input planes are it.
// Depthwise convs (one input channel per group) would make r*s-deep GEMMs, so they take a
// direct loop instead. Either way the epilogue runs on each output row as it is finished.
#include <algorithm>

#include "detail.h"
#include "epilog/kernels/cpu.h"

namespace epilog::cpu {
namespace {

using detail::Epilogue;
using detail::Range;
using detail::valid_range;

// Rows [k0, k0 + kc) and columns [n0, n0 + nc) of col (see the file comment) for the cg
// channels at x, row-major with leading dimension nc. Columns are output pixels, so the block
// is walked one output-row segment at a time: one contiguous copy when stride_w is 1.
void im2col_block(const ConvShape& cs, const float* x, int64_t k0, int64_t kc, int64_t n0,
                  int64_t nc, float* dst) {
  for (int64_t p = 0; p < kc; ++p) {
    const int64_t row = k0 + p;
    const int64_t ci = row / (cs.r * cs.s), i = row / cs.s % cs.r, j = row % cs.s;
    const float* plane = x + ci * cs.h * cs.w;
    const int64_t col_off = j * cs.dil_w - cs.pad_l;
    const Range inside = valid_range(col_off, cs.stride_w, cs.w, cs.wo);
    float* out = dst + p * nc;
    for (int64_t pix = n0; pix < n0 + nc;) {
      const int64_t oh = pix / cs.wo, ow0 = pix % cs.wo;
      const int64_t ow1 = std::min(cs.wo, ow0 + (n0 + nc - pix));
      float* seg = out + (pix - n0);  // seg[q] is output column ow0 + q
      const int64_t ih = oh * cs.stride_h - cs.pad_t + i * cs.dil_h;
      const int64_t lo = std::max(ow0, inside.lo), hi = std::min(ow1, inside.hi);
      if (ih < 0 || ih >= cs.h || lo >= hi) {
        std::fill(seg, seg + (ow1 - ow0), 0.0f);
      } else {
        std::fill(seg, seg + (lo - ow0), 0.0f);
        const float* src = plane + ih * cs.w + (lo * cs.stride_w + col_off);
        float* d = seg + (lo - ow0);
        if (cs.stride_w == 1)
          for (int64_t q = 0; q < hi - lo; ++q) d[q] = src[q];
        else
          for (int64_t q = 0; q < hi - lo; ++q) d[q] = src[q * cs.stride_w];
        std::fill(seg + (hi - ow0), seg + (ow1 - ow0), 0.0f);
      }
      pix += ow1 - ow0;
    }
  }
}

// One input channel per group: each output plane (b, ko) reads input plane (b, ko / kg) only.
void conv_depthwise(const ConvShape& cs, const float* x, const float* w, const Epilogue& ep,
                    float* y) {
  const int64_t kg = cs.k / cs.groups;
  const int64_t work = cs.n * cs.k * cs.ho * cs.wo * cs.r * cs.s;
#pragma omp parallel for schedule(static) if (detail::worth_threads(work))
  for (int64_t plane = 0; plane < cs.n * cs.k; ++plane) {
    const int64_t b = plane / cs.k, ko = plane % cs.k;
    const float* in = x + b * cs.x_image() + ko / kg * cs.h * cs.w;
    const float* wk = w + ko * cs.r * cs.s;
    float* out = y + b * cs.y_image() + ko * cs.ho * cs.wo;
    for (int64_t oh = 0; oh < cs.ho; ++oh) {
      float* orow = out + oh * cs.wo;
      std::fill(orow, orow + cs.wo, 0.0f);
      for (int64_t i = 0; i < cs.r; ++i) {
        const int64_t ih = oh * cs.stride_h - cs.pad_t + i * cs.dil_h;
        if (ih < 0 || ih >= cs.h) continue;
        for (int64_t j = 0; j < cs.s; ++j) {
          const int64_t col_off = j * cs.dil_w - cs.pad_l;
          const Range ow = valid_range(col_off, cs.stride_w, cs.w, cs.wo);
          if (ow.lo == ow.hi) continue;
          const float* src = in + ih * cs.w + (ow.lo * cs.stride_w + col_off);
          float* acc = orow + ow.lo;
          const float wv = wk[i * cs.s + j];
          for (int64_t q = 0; q < ow.hi - ow.lo; ++q) acc[q] += wv * src[q * cs.stride_w];
        }
      }
      // -- epilogue --
      detail::finish_row(ep, ko, orow, cs.wo);
    }
  }
}

void conv2d_body(const ConvShape& cs, const float* x, const float* w, const float* scale,
                 const float* shift, Act act, float* y) {
  EPILOG_ASSERT(cs.n > 0 && cs.c > 0 && cs.h > 0 && cs.w > 0 && cs.k > 0 && cs.r > 0 && cs.s > 0 &&
                    cs.ho > 0 && cs.wo > 0,
                "conv2d n {} c {} h {} w {} k {} r {} s {} ho {} wo {}", cs.n, cs.c, cs.h, cs.w,
                cs.k, cs.r, cs.s, cs.ho, cs.wo);
  EPILOG_ASSERT(cs.stride_h > 0 && cs.stride_w > 0 && cs.dil_h > 0 && cs.dil_w > 0 &&
                cs.pad_t >= 0 && cs.pad_l >= 0);
  EPILOG_ASSERT(cs.groups > 0 && cs.c % cs.groups == 0 && cs.k % cs.groups == 0,
                "conv2d groups {} for {} -> {} channels", cs.groups, cs.c, cs.k);
  EPILOG_ASSERT(x && w && y);
  const int64_t cg = cs.c / cs.groups, kg = cs.k / cs.groups;
  const Epilogue ep{scale, shift, act};
  if (cg == 1) return conv_depthwise(cs, x, w, ep, y);

  const int64_t npix = cs.ho * cs.wo;
  const int64_t depth = cg * cs.r * cs.s;  // GEMM k
  const bool direct = cs.r == 1 && cs.s == 1 && cs.stride_h == 1 && cs.stride_w == 1 &&
                      cs.pad_t == 0 && cs.pad_l == 0 && cs.ho == cs.h && cs.wo == cs.w;
  for (int64_t b = 0; b < cs.n; ++b) {
    for (int64_t g = 0; g < cs.groups; ++g) {
      const float* xg = x + b * cs.x_image() + g * cg * cs.h * cs.w;
      detail::BSource src;
      if (direct) {
        src.b = xg;
        src.ldb = npix;
      } else {
        src.fill = [&cs, xg](int64_t k0, int64_t kc, int64_t n0, int64_t nc, float* dst) {
          im2col_block(cs, xg, k0, kc, n0, nc, dst);
        };
      }
      const Epilogue epg{scale ? scale + g * kg : nullptr, shift ? shift + g * kg : nullptr, act};
      detail::gemm(kg, npix, depth, w + g * kg * depth, depth, src,
                   y + b * cs.y_image() + g * kg * npix, npix, false, epg);
    }
  }
}

}  // namespace

void conv2d(const ConvShape& cs, const float* x, const float* w, const float* scale,
            const float* shift, Act act, float* y, const float* residual, bool residual_first) {
  const ResidualActs acts = split_residual_act(act, residual != nullptr, residual_first);
  conv2d_body(cs, x, w, scale, shift, acts.pre, y);
  if (!residual) return;
  // The residual as the add it replaces, with one more rounding; then the activation where it
  // comes after the add.
  const int64_t npix = cs.ho * cs.wo;
#pragma omp parallel for schedule(static) if (detail::worth_threads(cs.n * cs.k * npix))
  for (int64_t plane = 0; plane < cs.n * cs.k; ++plane) {
    const int64_t b = plane / cs.k, ko = plane % cs.k;
    float* out = y + b * cs.y_image() + ko * npix;
    const float* r = residual + b * cs.r_image() + ko * npix;
    for (int64_t p = 0; p < npix; ++p) out[p] += r[p];
    if (acts.post.kind != Activation::None) detail::activate_span(acts.post, out, out, npix);
  }
}

}  // namespace epilog::cpu
