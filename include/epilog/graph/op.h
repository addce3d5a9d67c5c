// Op kinds, attributes and the op table's entries (declared in ops.def).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "epilog/common.h"

namespace epilog {

enum class OpKind : uint8_t {
#define EPILOG_OP(kind, name, inputs, attrs, infer) kind,
#include "epilog/graph/ops.def"
#undef EPILOG_OP
};

constexpr int kNumOps = 0
#define EPILOG_OP(kind, name, inputs, attrs, infer) +1
#include "epilog/graph/ops.def"
#undef EPILOG_OP
    ;

// channel_shuffle's inputs (ops.def): the parts one CUDA launch reads.
constexpr int kMaxShuffleInputs = 8;

using AttrValue = std::variant<int64_t, double, std::vector<int64_t>, std::string>;
enum class AttrType : uint8_t { Int, Float, Ints, String };
const char* attr_type_name(AttrType type);

// Every node carries all attributes of its op (defaults filled in when the node is made), in
// name order, so that dumps are deterministic.
class Attrs {
 public:
  int64_t i(const std::string& name) const;
  double f(const std::string& name) const;
  const std::vector<int64_t>& ints(const std::string& name) const;
  const std::string& s(const std::string& name) const;

  void set(const std::string& name, AttrValue value) { values_[name] = std::move(value); }
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  const std::map<std::string, AttrValue>& all() const { return values_; }
  bool operator==(const Attrs& other) const { return values_ == other.values_; }

 private:
  const AttrValue& get(const std::string& name) const;
  std::map<std::string, AttrValue> values_;
};

struct AttrSpec {
  std::string name;
  AttrType type;
  std::optional<AttrValue> fallback;  // nullopt: required
  int length = 0;                     // Ints: fixed length, 0 for any
  std::vector<std::string> choices;   // String: allowed values, empty for any
};

// What shape inference sees of a node. fail() prefixes the op and node name.
struct InferContext {
  OpKind op;
  const std::string& node;
  const Attrs& attrs;
  const std::vector<Shape>& inputs;

  template <typename... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) const;
};

using InferFn = std::vector<Shape> (*)(const InferContext&);

struct OpInfo {
  OpKind kind;
  std::string name;
  std::vector<std::string> inputs;  // names without the "?" / "..." markers
  int min_inputs;
  int max_inputs;  // -1: unbounded
  std::vector<AttrSpec> attrs;
  InferFn infer;

  const AttrSpec* attr(const std::string& name) const;
  // Name of input slot i ("x", "weight", ...); variadic inputs repeat the last name.
  const std::string& input_name(size_t i) const;
};

const OpInfo& op_info(OpKind kind);
const char* op_name(OpKind kind);
std::optional<OpKind> parse_op(const std::string& name);

// Checks attribute names, types, lengths and choices against the op's specs and fills in
// defaults; scalars broadcast to fixed-length lists and integers widen to floats.
// Errors name the op and node.
Attrs normalize_attrs(OpKind op, const std::string& node, const Attrs& given);

// Output shapes for a node, checking input arity first. Throws Error naming op and node.
std::vector<Shape> infer_shapes(OpKind op, const std::string& node, const Attrs& attrs,
                                const std::vector<Shape>& inputs);

// Attributes of layout ops as shape inference reads them (checked; errors name op and node), for
// the backends too: transpose's permutation of input 0's dims, slice's start and step of every
// dim of input 0 with the output shape (ONNX clamping done), the dims a reduction reduces.
std::vector<int64_t> transpose_perm(const InferContext& ctx);
struct SliceDims {
  std::vector<int64_t> start, step;
  Shape out;
};
SliceDims slice_dims(const InferContext& ctx);
std::vector<bool> reduce_axes(const InferContext& ctx);

template <typename... Args>
void InferContext::fail(fmt::format_string<Args...> format, Args&&... args) const {
  throw Error(fmt::format("[{}] node '{}': {}", op_name(op), node,
                          fmt::format(format, std::forward<Args>(args)...)));
}

}  // namespace epilog
