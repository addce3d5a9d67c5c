// Errors, shapes and dtypes: the vocabulary every layer of epilog shares.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace epilog {

// User and model errors. Messages start with the op or file they concern, e.g.
// "[conv2d] node 'b0.conv': weight has 3 dims, expected 4".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace epilog

// Internal invariants only: a failure here is a bug in epilog, not in the user's model.
#define EPILOG_ASSERT(cond, ...)                                                                \
  do {                                                                                          \
    if (!(cond)) ::epilog::assert_fail(#cond, __FILE__, __LINE__, fmt::format("" __VA_ARGS__)); \
  } while (0)

namespace epilog {

using Shape = std::vector<int64_t>;

// "[1,16,320,320]"
std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);

// A shape seen as [outer, shape[axis], inner]: the rows that concat and split copy.
struct AxisView {
  int64_t outer = 1, inner = 1;
};
AxisView axis_view(const Shape& shape, int64_t axis);

enum class DType : uint8_t { F32, F16, BF16 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "f32", "f16", "bf16"
DType parse_dtype(const std::string& name);

// Weights and random inputs come from this generator so that a seed means the same numbers on
// every platform (std::normal_distribution is implementation-defined).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  float uniform(float lo, float hi);
  float normal(float mean, float stddev);

 private:
  uint64_t state_;
};

// A stable 64-bit hash (FNV-1a) for deriving per-name seeds.
uint64_t hash_string(const std::string& s, uint64_t seed = 0);

}  // namespace epilog
