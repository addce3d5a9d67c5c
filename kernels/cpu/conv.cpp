// conv2d with its epilogue: im2col + GEMM per (image, group), or a direct loop for depthwise.
//
// Per image b and group g (cg = c / groups input and kg = k / groups output channels), the
// convolution is the GEMM
//   Y_g[kg, ho*wo] = W_g[kg, cg*r*s] * col[cg*r*s, ho*wo]
// with W_g rows of the weight as stored ([k, cg, r, s] is already row-major [k, cg*r*s]) and
// col[(ci*r + i)*s + j, oh*wo + ow] = x[b, g*cg + ci, oh*sh - pad_t + i*dh, ow*sw - pad_l + j*dw]
// (0 outside the input). A 1x1, stride-1, unpadded conv needs no col: the input plane is it.
// Depthwise convs (one input channel per group) would make r*s-deep GEMMs, so they take a
// direct loop instead. Either way the epilogue runs on each output row as it is finished.
#include <algorithm>
#include <memory>
#include <vector>

#include "detail.h"
#include "epilog/kernels/cpu.h"

namespace epilog::cpu {
namespace {

using detail::Epilogue;
using detail::Range;
using detail::valid_range;

// col for image plane group `x` (cg channels of h*w) as laid out in the file comment.
void im2col(const ConvShape& cs, int64_t cg, const float* x, float* col) {
  const int64_t rows = cg * cs.r * cs.s;
  const int64_t npix = cs.ho * cs.wo;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t ci = row / (cs.r * cs.s);
    const int64_t i = row / cs.s % cs.r;
    const int64_t j = row % cs.s;
    const float* plane = x + ci * cs.h * cs.w;
    const int64_t col_off = j * cs.dil_w - cs.pad_l;
    const Range ow = valid_range(col_off, cs.stride_w, cs.w, cs.wo);
    float* dst = col + row * npix;
    for (int64_t oh = 0; oh < cs.ho; ++oh, dst += cs.wo) {
      const int64_t ih = oh * cs.stride_h - cs.pad_t + i * cs.dil_h;
      if (ih < 0 || ih >= cs.h || ow.lo == ow.hi) {
        std::fill(dst, dst + cs.wo, 0.0f);
        continue;
      }
      // src[q] is the input under output column ow.lo + q.
      const float* src = plane + ih * cs.w + (ow.lo * cs.stride_w + col_off);
      float* out = dst + ow.lo;
      std::fill(dst, out, 0.0f);
      if (cs.stride_w == 1)
        for (int64_t q = 0; q < ow.hi - ow.lo; ++q) out[q] = src[q];
      else
        for (int64_t q = 0; q < ow.hi - ow.lo; ++q) out[q] = src[q * cs.stride_w];
      std::fill(dst + ow.hi, dst + cs.wo, 0.0f);
    }
  }
}

// One input channel per group: each output plane (b, ko) reads input plane (b, ko / kg) only.
void conv_depthwise(const ConvShape& cs, const float* x, const float* w, const Epilogue& ep,
                    float* y) {
  const int64_t kg = cs.k / cs.groups;
#pragma omp parallel for schedule(static)
  for (int64_t plane = 0; plane < cs.n * cs.k; ++plane) {
    const int64_t b = plane / cs.k, ko = plane % cs.k;
    const float* in = x + (b * cs.c + ko / kg) * cs.h * cs.w;
    const float* wk = w + ko * cs.r * cs.s;
    float* out = y + plane * cs.ho * cs.wo;
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

}  // namespace

void conv2d(const ConvShape& cs, const float* x, const float* w, const float* scale,
            const float* shift, Activation act, float* y) {
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
  std::unique_ptr<float[]> col(direct ? nullptr : new float[depth * npix]);
  for (int64_t b = 0; b < cs.n; ++b) {
    for (int64_t g = 0; g < cs.groups; ++g) {
      const float* xg = x + (b * cs.c + g * cg) * cs.h * cs.w;
      if (!direct) im2col(cs, cg, xg, col.get());
      const Epilogue epg{scale ? scale + g * kg : nullptr, shift ? shift + g * kg : nullptr, act};
      detail::gemm(kg, npix, depth, w + g * kg * depth, depth, direct ? xg : col.get(), npix,
                   y + (b * cs.k + g * kg) * npix, npix, false, epg);
    }
  }
}

}  // namespace epilog::cpu
