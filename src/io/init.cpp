#include "epilog/io/init.h"

#include <cmath>

namespace epilog {

Tensor init_weight(const std::string& name, const Shape& shape, OpKind op, const std::string& role,
                   uint64_t seed) {
  Tensor t = Tensor::empty(shape);
  Rng rng(hash_string(name, seed));
  float* p = t.f32();
  const int64_t n = t.numel();
  // Fan-in of a weight: everything but the leading (output) dimension.
  int64_t fan_in = shape.empty() || shape[0] == 0 ? 1 : std::max<int64_t>(1, n / shape[0]);
  bool is_conv = op == OpKind::Conv2d || op == OpKind::FusedConv2d || op == OpKind::Linear ||
                 op == OpKind::ConvTranspose2d;
  if (is_conv && role == "weight") {
    float bound = std::sqrt(6.0f / static_cast<float>(fan_in));
    for (int64_t i = 0; i < n; ++i) p[i] = rng.uniform(-bound, bound);
  } else if (op == OpKind::BatchNorm && (role == "weight" || role == "running_var")) {
    for (int64_t i = 0; i < n; ++i) p[i] = rng.uniform(0.5f, 1.5f);
  } else if (op == OpKind::BatchNorm) {  // bias, running_mean
    for (int64_t i = 0; i < n; ++i) p[i] = rng.normal(0.0f, 0.1f);
  } else if (role == "bias") {
    for (int64_t i = 0; i < n; ++i) p[i] = rng.uniform(-0.1f, 0.1f);
  } else {
    for (int64_t i = 0; i < n; ++i) p[i] = rng.uniform(-1.0f, 1.0f);
  }
  return t;
}

}  // namespace epilog
