// The importer's node context: what an op handler reads (inputs, constants, attributes) and
// writes (epilog nodes, aliases, folded constants). See onnx_import.h.
#ifdef EPILOG_HAVE_ONNX

#include <algorithm>

#include "onnx_import.h"

namespace epilog::onnx_import {

using onnx::AttributeProto;

// -- names --

std::string Importer::fresh_node(const std::string& base) {
  std::string n = base;
  for (int k = 1; node_names_.count(n); ++k) n = fmt::format("{}_{}", base, k);
  node_names_.insert(n);
  return n;
}

std::string Importer::fresh_value(const std::string& base) const {
  std::string n = base;
  for (int k = 1; onnx_names_.count(n) || graph_.values.count(n); ++k)
    n = fmt::format("{}_{}", base, k);
  return n;
}

void Importer::check_size(const Shape& shape, const std::string& what) const {
  if (shape.size() > kMaxRank || checked_numel(shape, kMaxNumel) < 0 ||
      std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d > kMaxDim; }))
    fail("{}: {} has shape {}, beyond epilog's limits (dims up to 2^31-1, 2^40 elements)", source_,
         what, shape_str(shape));
}

// -- values --

bool Importer::defined(const std::string& name) const {
  return consts_.count(name) || initializers_.count(name) || dyn_.count(name);
}

const Const* Importer::constant(const std::string& name) {
  auto it = consts_.find(name);
  if (it != consts_.end()) return &it->second;
  auto init = initializers_.find(name);
  if (init == initializers_.end()) return nullptr;
  Const c = reader_.read(*init->second, fmt::format("initializer '{}'", name));
  return &consts_.emplace(name, std::move(c)).first->second;
}

void Importer::add_weight(const std::string& name, const Const& c) {
  EPILOG_ASSERT(c.is_float() && !graph_.values.count(name));
  graph_.weights[name] = Weight{Tensor::from_vector(c.dims, c.f), std::nullopt};
  graph_.values[name] = Value{c.dims, DType::F32};
}

std::string Importer::materialize(const std::string& name, const Const& c) {
  auto it = weights_of_.find(name);
  if (it != weights_of_.end()) return it->second;
  if (!c.is_float())
    unsupported("input '{}' is an integer constant ({}); only float32 tensors flow at run time",
                name, dtype_str(c.dtype));
  if (checked_numel(c.dims, kMaxNumel) == 0)
    unsupported("input '{}' is an empty tensor {}", name, shape_str(c.dims));
  check_size(c.dims, fmt::format("{}: input '{}'", where(), name));
  std::string w = graph_.values.count(name) ? fresh_value(name) : name;
  add_weight(w, c);
  weights_of_[name] = w;
  return w;
}

// -- the current node's inputs and outputs --

void Importer::arity(int min_in, int max_in, int max_out) const {
  if (n_in() > max_in) bad("has {} inputs, expected at most {}", n_in(), max_in);
  for (int k = 0; k < min_in; ++k)
    if (!has_in(k)) bad("input {} is missing ({} required)", k, min_in);
  if (n_out() > max_out) bad("has {} outputs, expected at most {}", n_out(), max_out);
  if (!has_out(0)) bad("has no output");
}

bool Importer::all_const() {
  for (int k = 0; k < n_in(); ++k)
    if (has_in(k) && !const_in(k)) return false;
  return true;
}

const Const& Importer::cst(int k, const char* role) {
  EPILOG_ASSERT(has_in(k));
  const Const* c = const_in(k);
  if (!c)
    unsupported("input '{}' ({}) is computed at run time; epilog needs it to be a constant",
                in_name(k), role);
  return *c;
}

std::vector<int64_t> Importer::ints_in(int k, const char* role) {
  const Const& c = cst(k, role);
  if (c.is_float()) bad("input '{}' ({}) is float, expected integers", in_name(k), role);
  if (c.dims.size() > 1)
    bad("input '{}' ({}) has shape {}, expected 1-D", in_name(k), role, shape_str(c.dims));
  return c.i;
}

std::string Importer::dyn(int k) {
  EPILOG_ASSERT(has_in(k));
  if (const Const* c = const_in(k)) return materialize(in_name(k), *c);
  return dyn_.at(in_name(k));
}

Shape Importer::shape_in(int k) {
  if (const Const* c = const_in(k)) return c->dims;
  return value_shape(dyn_.at(in_name(k)));
}

std::string Importer::out(int k) {
  if (has_out(k)) {
    dyn_[node_->output(k)] = node_->output(k);
    return node_->output(k);
  }
  return fresh_value(fmt::format("{}.out{}", name_, k));
}

Attrs Importer::attrs(std::initializer_list<std::pair<const char*, AttrValue> > values) {
  Attrs a;
  for (const auto& [k, v] : values) a.set(k, v);
  return a;
}

void Importer::emit(OpKind op, std::vector<std::string> ins, const Attrs& given,
                    std::vector<std::string> outs, const std::string& suffix) {
  std::string node = suffix.empty() ? name_ : fresh_node(name_ + "." + suffix);
  for (const auto& [k, v] : given.all()) {
    bool ok = true;
    auto small = [](int64_t x) { return x >= -kMaxDim && x <= kMaxDim; };
    if (auto* i = std::get_if<int64_t>(&v)) ok = small(*i);
    if (auto* is = std::get_if<std::vector<int64_t> >(&v))
      ok = std::all_of(is->begin(), is->end(), small);
    if (!ok) bad("{} values beyond epilog's limit of 2^31-1", k);
  }
  Attrs a;
  std::vector<Shape> in_shapes, out_shapes;
  for (const std::string& i : ins) in_shapes.push_back(value_shape(i));
  try {
    a = normalize_attrs(op, node, given);
    out_shapes = infer_shapes(op, node, a, in_shapes);
  } catch (const Error& e) {
    bad("{}", e.what());
  }
  EPILOG_ASSERT(out_shapes.size() == outs.size());
  for (size_t k = 0; k < outs.size(); ++k) {
    check_size(out_shapes[k], fmt::format("{}: output '{}'", where(), outs[k]));
    graph_.values[outs[k]] = Value{out_shapes[k], DType::F32};
  }
  graph_.nodes.push_back(Node{node, op, std::move(a), std::move(ins), std::move(outs)});
}

// -- attributes --

void Importer::allow(std::initializer_list<const char*> names) const {
  for (const auto& entry : attrs_) {
    const std::string& n = entry.first;  // clang 14 cannot capture structured bindings
    if (std::none_of(names.begin(), names.end(), [&](const char* k) { return n == k; }))
      unsupported_attr(n, "is not supported for {} (epilog reads: {})", op_,
                       names.size() ? fmt::format("{}", fmt::join(names, ", ")) : "none");
  }
}

const AttributeProto* Importer::attr(const char* name, int type) const {
  auto it = attrs_.find(name);
  if (it == attrs_.end()) return nullptr;
  const AttributeProto& a = *it->second;
  // Old models may leave the type out; then the field that is set says it.
  bool ok = a.type() == type;
  if (a.type() == AttributeProto::UNDEFINED) {
    switch (type) {
      case AttributeProto::FLOAT:
        ok = a.has_f();
        break;
      case AttributeProto::INT:
        ok = a.has_i();
        break;
      case AttributeProto::STRING:
        ok = a.has_s();
        break;
      case AttributeProto::TENSOR:
        ok = a.has_t();
        break;
      default:
        ok = true;
    }
  }
  if (!ok) bad_attr(name, "is {}, expected {}", attr_type_str(a.type()), attr_type_str(type));
  return &a;
}

int64_t Importer::attr_int(const char* name, int64_t fallback) const {
  const AttributeProto* a = attr(name, AttributeProto::INT);
  return a ? a->i() : fallback;
}
int64_t Importer::attr_int_req(const char* name) const {
  const AttributeProto* a = attr(name, AttributeProto::INT);
  if (!a) bad("attribute '{}' is required", name);
  return a->i();
}
float Importer::attr_float(const char* name, float fallback) const {
  const AttributeProto* a = attr(name, AttributeProto::FLOAT);
  return a ? a->f() : fallback;
}
std::string Importer::attr_string(const char* name, const std::string& fallback) const {
  const AttributeProto* a = attr(name, AttributeProto::STRING);
  return a ? a->s() : fallback;
}
std::optional<std::vector<int64_t> > Importer::attr_ints(const char* name) const {
  const AttributeProto* a = attr(name, AttributeProto::INTS);
  if (!a) return std::nullopt;
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}
std::optional<std::vector<float> > Importer::attr_floats(const char* name) const {
  const AttributeProto* a = attr(name, AttributeProto::FLOATS);
  if (!a) return std::nullopt;
  return std::vector<float>(a->floats().begin(), a->floats().end());
}

}  // namespace epilog::onnx_import

#endif  // EPILOG_HAVE_ONNX
