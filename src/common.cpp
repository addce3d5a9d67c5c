#include "epilog/common.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace epilog {

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "epilog internal error: %s:%d: assertion '%s' failed%s%s\n", file, line,
               expr, msg.empty() ? "" : ": ", msg.c_str());
  std::abort();
}

std::string shape_str(const Shape& shape) {
  return fmt::format("[{}]", fmt::join(shape, ","));
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

AxisView axis_view(const Shape& shape, int64_t axis) {
  AxisView v;
  for (int64_t d = 0; d < axis; ++d) v.outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) v.inner *= shape[d];
  return v;
}

size_t dtype_size(DType dtype) {
  return dtype == DType::F32 ? 4 : 2;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "f32";
    case DType::F16:
      return "f16";
    case DType::BF16:
      return "bf16";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  for (DType d : {DType::F32, DType::F16, DType::BF16})
    if (name == dtype_name(d)) return d;
  fail("unknown dtype '{}' (expected f32, f16 or bf16)", name);
}

// splitmix64: tiny, fast and good enough for weights and test data.
uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float Rng::uniform(float lo, float hi) {
  double u = static_cast<double>(next() >> 11) * 0x1.0p-53;  // [0, 1)
  return static_cast<float>(lo + (hi - lo) * u);
}

float Rng::normal(float mean, float stddev) {
  // Box-Muller; 1 - u keeps the logarithm finite.
  double u1 = 1.0 - static_cast<double>(next() >> 11) * 0x1.0p-53;
  double u2 = static_cast<double>(next() >> 11) * 0x1.0p-53;
  double r = std::sqrt(-2.0 * std::log(u1));
  return static_cast<float>(mean + stddev * r * std::cos(2.0 * M_PI * u2));
}

uint64_t hash_string(const std::string& s, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace epilog
