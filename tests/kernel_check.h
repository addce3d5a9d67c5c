// Checks the CPU kernel tests share: poisoned outputs, element-by-element comparisons against
// float64 references, and index helpers for contiguous shapes.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "epilog/tensor.h"

namespace epilog::test {

// Outputs start as NaN so that an element the kernel never writes fails every comparison.
inline Tensor poisoned(const Shape& shape) {
  return Tensor::full(shape, NAN);
}

inline std::vector<float> values(const Tensor& t) {
  return {t.f32(), t.f32() + t.numel()};
}

// |out[i] - ref[i]| <= tol[i] for every i; NaN fails. Reports the first few misses.
inline void expect_close(const float* out, const std::vector<double>& ref,
                         const std::vector<double>& tol) {
  REQUIRE(ref.size() == tol.size());
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < ref.size(); ++i) {
    double d = std::fabs(double(out[i]) - ref[i]);
    if (!(d <= tol[i])) {
      if (bad < 5)
        first += fmt::format("  [{}] got {} want {} (tol {:.3g})\n", i, out[i], ref[i], tol[i]);
      ++bad;
    }
  }
  INFO(bad << " of " << ref.size() << " elements off:\n" << first);
  CHECK(bad == 0);
}

inline void expect_exact(const float* out, const std::vector<double>& ref) {
  expect_close(out, ref, std::vector<double>(ref.size(), 0.0));
}

inline void expect_values(const Tensor& t, const std::vector<double>& want, double tol = 0.0) {
  REQUIRE(t.numel() == static_cast<int64_t>(want.size()));
  expect_close(t.f32(), want, std::vector<double>(want.size(), tol));
}

// Strides of a contiguous shape, in elements.
inline std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int d = int(s.size()) - 2; d >= 0; --d) st[d] = st[d + 1] * s[d + 1];
  return st;
}

// The multi-index of flat index i in shape s.
inline std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (int d = int(s.size()) - 1; d >= 0; --d) {
    idx[d] = i % s[d];
    i /= s[d];
  }
  return idx;
}

}  // namespace epilog::test
