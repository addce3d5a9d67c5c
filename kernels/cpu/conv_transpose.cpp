// Transposed convolution, naively: each output gathers the inputs whose scatter lands on it,
// summed in double.
#include "detail.h"
#include "epilog/kernels/cpu.h"

namespace epilog::cpu {

void conv_transpose2d(const ConvShape& s, const float* x, const float* w, const float* bias,
                      float* y) {
  const int64_t cg = s.c / s.groups, kg = s.k / s.groups;
#pragma omp parallel for schedule(static) if (detail::worth_threads(s.n * s.k * s.ho * s.wo * cg))
  for (int64_t plane = 0; plane < s.n * s.k; ++plane) {
    const int64_t b = plane / s.k, k = plane % s.k, g = k / kg;
    for (int64_t oh = 0; oh < s.ho; ++oh)
      for (int64_t ow = 0; ow < s.wo; ++ow) {
        double sum = bias ? bias[k] : 0.0;
        for (int64_t i = 0; i < s.r; ++i) {
          const int64_t ih = transposed_source(oh, s.pad_t, i, s.dil_h, s.stride_h, s.h);
          for (int64_t j = 0; ih >= 0 && j < s.s; ++j) {
            const int64_t iw = transposed_source(ow, s.pad_l, j, s.dil_w, s.stride_w, s.w);
            for (int64_t ci = 0; iw >= 0 && ci < cg; ++ci) {
              const int64_t c = g * cg + ci;
              sum += double(x[((b * s.c + c) * s.h + ih) * s.w + iw]) *
                     w[((c * kg + k % kg) * s.r + i) * s.s + j];
            }
          }
        }
        y[(plane * s.ho + oh) * s.wo + ow] = float(sum);
      }
  }
}

}  // namespace epilog::cpu
