// The ONNX importer's parts, private to src/io:
//
//   onnx.cpp         the driver: the model, its inputs and outputs, each node to its handler
//   onnx_node.cpp    what a handler reads and writes: inputs, attributes, emitted nodes
//   onnx_tensor.cpp  tensor decoding: TensorProto (typed fields, raw_data, external data) -> Const
//   onnx_fold.cpp    constant folding: the import-time arithmetic on constants
//   onnx_ops.cpp     the op list, the table of handlers and the helpers they share (onnx_ops.h)
//   onnx_ops_math.cpp, onnx_ops_nn.cpp, onnx_ops_layout.cpp
//                    the op handlers, one function per ONNX op, by family: elementwise,
//                    reductions and linear layers; conv, norms, softmax, pools and resizing;
//                    layout, constants and shape arithmetic
//
// Adding an op handler (in its family's file):
//   1. Write `void op_name(Importer& im)`. It states the attributes it reads (im.allow) and its
//      input and output counts (im.arity), reads inputs as graph values (im.dyn) or constants
//      (im.cst, im.ints_in, scalar_in), and either emits epilog nodes (im.emit(OpKind::..., ins,
//      attrs, {im.out(0)})), names an existing value (im.set_alias, pass_through) or folds to a
//      constant (im.set_const). Forms that changed with the opset branch on im.opset() (an
//      attribute that became an input, as Split's sizes in 13 or ReduceMean's axes in 18).
//      Everything it cannot map throws through im.unsupported or im.unsupported_attr, which name
//      the file, the node and the op; a malformed node throws through im.bad or im.bad_attr.
//   2. Add one line to its family's table (add_*_handlers, at the bottom of the file) and one
//      to the op list atop onnx_ops.cpp, and a test in tests/test_onnx_forms.cpp (models built
//      with tests/onnx_model.h).
//   For instance, an elementwise op of one input is
//      void op_tanh(Importer& im) { unary(im, OpKind::Tanh); }
//   Clip, Pad and ReduceMean already read every form of their opsets (reduce_args serves every
//   Reduce* op) and refuse what the op table cannot express yet: a clip, pad or reduction op
//   replaces that refusal with an im.emit.
#pragma once

#ifdef EPILOG_HAVE_ONNX

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "epilog/graph/graph.h"
#include "epilog/io/onnx.h"

namespace epilog::onnx_import {

// Opsets 11 to 21: what PyTorch's exporters write (the TorchScript one 11 to 17 as asked, the
// dynamo one 18 or 20). Opsets 6 to 10 differ only in attributes the handlers read (legacy
// broadcasting, is_test, the attribute forms of Slice, Unsqueeze and Upsample), and the ONNX
// test data for PyTorch-converted modules is opset 6.
constexpr int64_t kMinOpset = 6;
constexpr int64_t kMaxOpset = 21;

// As in the JSON loader: no real model comes near these, and refusing more keeps the int64
// arithmetic of shape inference clear of overflow for any input file.
constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxNumel = int64_t(1) << 40;
constexpr size_t kMaxRank = 32;
// Folding can make a constant bigger than its inputs (ConstantOfShape, a broadcast); the shape
// arithmetic folding is for never comes near this.
constexpr int64_t kMaxFolded = int64_t(1) << 20;

std::string dtype_str(int dtype);
std::string attr_type_str(int type);
bool is_int_dtype(int dtype);

// Elements of `dims`, or -1 when a dim is negative or the count passes `limit`.
int64_t checked_numel(const Shape& dims, int64_t limit);
std::vector<int64_t> strides_of(const Shape& dims);

// Calls f(index) for every multi-index of `dims` in row-major order.
template <typename F>
void for_each_index(const Shape& dims, F&& f) {
  if (checked_numel(dims, kMaxNumel) <= 0) return;
  std::vector<int64_t> idx(dims.size(), 0);
  while (true) {
    f(idx);
    size_t d = dims.size();
    while (d > 0 && ++idx[d - 1] == dims[d - 1]) idx[--d] = 0;
    if (d == 0) return;
  }
}

// -- constants --

// A tensor known at import: an initializer, a Constant node or folded shape arithmetic.
// float16 and bfloat16 arrive as FLOAT; the integer types and BOOL are held as int64 values.
struct Const {
  int32_t dtype = onnx::TensorProto::FLOAT;
  Shape dims;  // may hold zeros
  std::vector<float> f;
  std::vector<int64_t> i;

  bool is_float() const { return dtype == onnx::TensorProto::FLOAT; }
  int64_t numel() const { return int64_t(is_float() ? f.size() : i.size()); }
  std::string describe() const { return fmt::format("{} {}", dtype_str(dtype), shape_str(dims)); }
};

Const int_const(Shape dims, std::vector<int64_t> values);
// The elements of `src` at flat positions `at`, shaped `dims`.
Const take(const Const& src, Shape dims, const std::vector<int64_t>& at);

// -- tensor decoding (onnx_tensor.cpp) --

// Reads the values of TensorProtos: typed fields, raw_data or an external file. `source` and
// `base_dir` are the model's; `what` says which tensor ("initializer 'w'").
class TensorReader {
 public:
  TensorReader(const std::string& source, const std::string& base_dir)
      : source_(source), base_dir_(base_dir) {}

  Const read(const onnx::TensorProto& t, const std::string& what) const;

 private:
  std::string read_external(const onnx::TensorProto& t, const std::string& what,
                            size_t bytes) const;

  const std::string& source_;
  const std::string& base_dir_;
};

// -- constant folding (onnx_fold.cpp) --

// What folding throws for a malformed node; the driver puts the file, the node and the op in
// front, as Importer::bad does.
class FoldError : public Error {
 public:
  using Error::Error;
};

// Refuses a folded constant of more than kMaxRank dims or more elements than kMaxFolded (or
// than its inputs had).
void check_folded(const Shape& dims, int64_t inputs_numel);
int64_t axis_of(int64_t axis, size_t rank, const char* what = "axis");
Shape broadcast(const Shape& a, const Shape& b);
// a op b for op in + - * /, with broadcasting; integer overflow and division by zero throw.
// op: '+', '-', '*', '/', '^' (Pow), '%' (C's remainder, fmod for floats) or 'm' (integers:
// the remainder with the divisor's sign, Python's %).
Const fold_binary(const Const& a, const Const& b, char op);
// Equal, Less, LessOrEqual, Greater, GreaterOrEqual, And, Or, Xor (`op`): a BOOL constant.
Const fold_compare(const Const& a, const Const& b, const std::string& op);
Const fold_where(const Const& cond, const Const& x, const Const& y);
Const fold_range(const Const& start, const Const& limit, const Const& delta);
// ONNX CumSum of a constant along `axis`.
Const fold_cumsum(const Const& x, int64_t axis, bool exclusive, bool reverse);
Const fold_concat(const std::vector<const Const*>& xs, int64_t axis);

struct SliceAxis {
  int64_t axis, start, count, step;
};
Const fold_slice(const Const& x, const std::vector<SliceAxis>& axes);
Const fold_transpose(const Const& x, const std::vector<int64_t>& perm);
Const fold_gather(const Const& data, const Const& indices, int64_t axis);
Const fold_cast(const Const& c, int64_t to);
// The dims a Reshape to `spec` gives (0 copies the input dim unless allowzero, -1 is inferred).
Shape reshaped(const Shape& in, const std::vector<int64_t>& spec, bool allowzero);

// -- the importer (onnx.cpp, onnx_node.cpp) --

// One import of one model. The driver (load) walks the nodes; each node's handler reads it
// through in()/cst()/dyn() and the attribute accessors. Every message goes through
// bad()/unsupported(), which put the file, the node and its op type in front.
class Importer {
 public:
  Importer(const std::string& source, const std::string& base_dir, const LoadOptions& options)
      : source_(source), options_(options), reader_(source, base_dir) {}

  Graph load(const onnx::ModelProto& model);

  // -- messages --

  std::string where() const { return fmt::format("node '{}' ({})", name_, op_); }

  template <typename... Args>
  [[noreturn]] void bad(fmt::format_string<Args...> format, Args&&... args) const {
    throw Error(fmt::format("{}: {}: {}", source_, where(),
                            fmt::format(format, std::forward<Args>(args)...)));
  }
  template <typename... Args>
  [[noreturn]] void unsupported(fmt::format_string<Args...> format, Args&&... args) const {
    throw OnnxUnsupported(fmt::format("{}: {}: {}", source_, where(),
                                      fmt::format(format, std::forward<Args>(args)...)));
  }
  template <typename... Args>
  [[noreturn]] void bad_attr(const std::string& attr, fmt::format_string<Args...> format,
                             Args&&... args) const {
    throw Error(fmt::format("{}: {}: attribute '{}': {}", source_, where(), attr,
                            fmt::format(format, std::forward<Args>(args)...)));
  }
  template <typename... Args>
  [[noreturn]] void unsupported_attr(const std::string& attr, fmt::format_string<Args...> format,
                                     Args&&... args) const {
    throw OnnxUnsupported(fmt::format("{}: {}: attribute '{}': {}", source_, where(), attr,
                                      fmt::format(format, std::forward<Args>(args)...)));
  }

  // -- the model --

  int64_t opset() const { return opset_; }
  // With the batch rebound (LoadOptions::batch): the batch the file's inputs were exported at,
  // and the one they have now; else 0 and 0.
  int64_t file_batch() const { return file_batch_; }
  int64_t batch() const { return options_.batch > 0 ? options_.batch : 0; }
  const TensorReader& reader() const { return reader_; }
  // Refuses a shape beyond epilog's limits; `what` names the value.
  void check_size(const Shape& shape, const std::string& what) const;
  std::string fresh_node(const std::string& base);
  std::string fresh_value(const std::string& base) const;

  // -- values --

  bool defined(const std::string& name) const;
  // The constant of an ONNX name (an initializer is decoded on first use), or null.
  const Const* constant(const std::string& name);
  void add_weight(const std::string& name, const Const& c);
  // The graph value for a constant that flows into an op: a weight of its name.
  std::string materialize(const std::string& name, const Const& c);
  const Shape& value_shape(const std::string& value) const { return graph_.values.at(value).shape; }

  // -- the current node's inputs and outputs --

  const onnx::NodeProto& node() const { return *node_; }
  // The node's name in the graph (its ONNX name, made unique) and its op type.
  const std::string& name() const { return name_; }
  const std::string& op() const { return op_; }
  int n_in() const { return node_->input_size(); }
  int n_out() const { return node_->output_size(); }
  bool has_in(int k) const { return k < n_in() && !node_->input(k).empty(); }
  bool has_out(int k) const { return k < n_out() && !node_->output(k).empty(); }
  // Output k is named and read by a node or the graph's outputs (exporters name optional
  // outputs, as MaxPool's indices, that nothing reads).
  bool used_out(int k) const { return has_out(k) && uses(node_->output(k)) > 0; }
  const std::string& in_name(int k) const { return node_->input(k); }

  // Input and output counts: `min_in` inputs must be given, at most `max_in` listed; the first
  // output must be named.
  void arity(int min_in, int max_in, int max_out = 1) const;
  const Const* const_in(int k) { return has_in(k) ? constant(in_name(k)) : nullptr; }
  bool all_const();
  // Input k, which must be known at import (`role` says what it is to the op).
  const Const& cst(int k, const char* role);
  std::vector<int64_t> ints_in(int k, const char* role);
  // The graph value of input k (a constant becomes a weight).
  std::string dyn(int k);
  Shape shape_in(int k);

  // The graph value name for output k: the ONNX name, or a fresh one for an unnamed output.
  std::string out(int k);
  // Output k is the graph value `value` under another name.
  void set_alias(int k, const std::string& value) {
    if (has_out(k)) dyn_[node_->output(k)] = value;
  }
  void set_const(int k, Const c) {
    if (has_out(k)) consts_[node_->output(k)] = std::move(c);
  }

  static Attrs attrs(std::initializer_list<std::pair<const char*, AttrValue> > values);

  // Adds a node of epilog's IR. The first node made for an ONNX node takes its name; helpers
  // take "<name>.<suffix>".
  void emit(OpKind op, std::vector<std::string> ins, const Attrs& given,
            std::vector<std::string> outs, const std::string& suffix = "");

  // -- attributes --

  // Refuses attributes the handler does not read: an unknown one might change the meaning.
  void allow(std::initializer_list<const char*> names) const;
  const onnx::AttributeProto* attr(const char* name, int type) const;
  int64_t attr_int(const char* name, int64_t fallback) const;
  int64_t attr_int_req(const char* name) const;
  float attr_float(const char* name, float fallback) const;
  std::string attr_string(const char* name, const std::string& fallback) const;
  std::optional<std::vector<int64_t> > attr_ints(const char* name) const;
  std::optional<std::vector<float> > attr_floats(const char* name) const;
  bool has_attr(const char* name) const { return attrs_.count(name) != 0; }
  const std::map<std::string, const onnx::AttributeProto*>& attributes() const { return attrs_; }

  // -- state a handler may read across nodes --

  Graph& graph() { return graph_; }
  std::map<std::string, std::string>& dyn_values() { return dyn_; }
  std::map<std::string, size_t>& linear_of() { return linear_of_; }
  int uses(const std::string& name) const {
    auto it = uses_.find(name);
    return it == uses_.end() ? 0 : it->second;
  }

 private:
  void read_opset(const onnx::ModelProto& model);
  void read_inputs(const onnx::GraphProto& g);
  void read_outputs(const onnx::GraphProto& g);
  void name_output(const std::string& out, const std::string& value);
  void check_declared_shape(const onnx::ValueInfoProto& v, const std::string& what);
  void import_node(const onnx::NodeProto& node);

  const std::string& source_;
  const LoadOptions& options_;
  int64_t file_batch_ = 0;
  TensorReader reader_;
  int64_t opset_ = -1;
  Graph graph_;

  std::map<std::string, const onnx::TensorProto*> initializers_;
  std::map<std::string, Const> consts_;            // ONNX name -> constant
  std::map<std::string, std::string> dyn_;         // ONNX name -> graph value
  std::map<std::string, std::string> weights_of_;  // ONNX constant name -> its weight
  std::map<std::string, size_t> linear_of_;        // MatMul output -> its linear node
  std::map<std::string, int> uses_;                // readers of each ONNX value (outputs count)
  std::set<std::string> output_names_;
  std::set<std::string> onnx_names_;
  std::set<std::string> node_names_;

  const onnx::NodeProto* node_ = nullptr;
  std::string name_, op_;
  std::map<std::string, const onnx::AttributeProto*> attrs_;
};

// -- op handlers (onnx_ops*.cpp) --

using OpHandler = void (*)(Importer&);
// ONNX op type -> its handler.
const std::map<std::string, OpHandler>& op_handlers();

}  // namespace epilog::onnx_import

#endif  // EPILOG_HAVE_ONNX
