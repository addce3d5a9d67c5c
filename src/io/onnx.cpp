// The ONNX importer's driver: a ModelProto becomes a static Graph of epilog's ops. It reads the
// opset, the graph's inputs and outputs, and hands each node to the handler of its op type
// (onnx_ops.cpp, where the op mapping is listed). The parts are described in onnx_import.h.
#include "epilog/io/onnx.h"

#ifndef EPILOG_HAVE_ONNX

#include <cerrno>
#include <cstring>
#include <fstream>

namespace epilog {
namespace {
// A file that is not there says so first, as it would in a build with ONNX.
[[noreturn]] void no_onnx(const std::string& what, bool is_file = false) {
  if (is_file && !std::ifstream(what)) fail("{}: cannot open ({})", what, std::strerror(errno));
  fail(
      "{}: this build has no ONNX support (install libonnx-dev and libprotobuf-dev, then "
      "configure again)",
      what);
}
}  // namespace

bool onnx_available() {
  return false;
}
Graph load_onnx(const std::string& path, const LoadOptions&) {
  no_onnx(path, true);
}
Graph parse_onnx(const void*, size_t, const std::string& source, const std::string&,
                 const LoadOptions&) {
  no_onnx(source);
}
Tensor read_onnx_tensor(const std::string& path) {
  no_onnx(path, true);
}

}  // namespace epilog

#else

#include <climits>
#include <filesystem>

#include "file.h"
#include "onnx_import.h"

namespace epilog {

namespace fs = std::filesystem;

namespace onnx_import {

using onnx::AttributeProto;
using onnx::NodeProto;
using onnx::TensorProto;

Graph Importer::load(const onnx::ModelProto& model) {
  if (!options_.weights_file.empty())
    fail(
        "{}: a weights file ('{}') is for JSON models; an ONNX model carries its weights "
        "(initializers and external data files)",
        source_, options_.weights_file);
  if (!model.has_graph()) fail("{}: the model has no graph (is this an ONNX model?)", source_);
  read_opset(model);
  const onnx::GraphProto& g = model.graph();
  if (g.sparse_initializer_size() > 0)
    throw OnnxUnsupported(fmt::format("{}: sparse initializers are not supported", source_));
  for (const TensorProto& t : g.initializer()) {
    if (t.name().empty()) fail("{}: an initializer has no name", source_);
    if (!initializers_.emplace(t.name(), &t).second)
      fail("{}: initializer '{}' is defined twice", source_, t.name());
  }
  // Derived names must not take a name the model uses later.
  for (const auto& v : g.input()) onnx_names_.insert(v.name());
  for (const auto& v : g.output()) onnx_names_.insert(v.name());
  for (const auto& [n, t] : initializers_) onnx_names_.insert(n);
  for (const NodeProto& n : g.node()) {
    for (const std::string& o : n.output()) onnx_names_.insert(o);
    for (const std::string& i : n.input()) ++uses_[i];
  }
  for (const auto& v : g.output()) {
    ++uses_[v.name()];
    output_names_.insert(v.name());
  }

  read_inputs(g);
  for (const NodeProto& n : g.node()) import_node(n);
  read_outputs(g);
  try {
    verify(graph_);
  } catch (const Error& e) {
    fail("{}: {}", source_, e.what());
  }
  return std::move(graph_);
}

// -- model level --

void Importer::read_opset(const onnx::ModelProto& model) {
  std::vector<std::string> others;
  for (const auto& o : model.opset_import()) {
    if (o.domain().empty() || o.domain() == "ai.onnx")
      opset_ = o.version();
    else
      others.push_back(o.domain());
  }
  if (opset_ < 0 && !others.empty())
    throw OnnxUnsupported(
        fmt::format("{}: the model imports only op domains {} (epilog imports "
                    "the default ONNX domain)",
                    source_, fmt::join(others, ", ")));
  if (opset_ < 0) fail("{}: the model has no opset_import (is this an ONNX model?)", source_);
  if (opset_ < kMinOpset || opset_ > kMaxOpset)
    throw OnnxUnsupported(
        fmt::format("{}: opset {} is not supported (epilog imports opsets {} to {}; "
                    "re-export with opset_version={})",
                    source_, opset_, kMinOpset, kMaxOpset, kMaxOpset));
}

void Importer::read_inputs(const onnx::GraphProto& g) {
  std::set<std::string> seen;
  for (const auto& v : g.input()) {
    const std::string& n = v.name();
    if (n.empty()) fail("{}: a graph input has no name", source_);
    if (!seen.insert(n).second) fail("{}: graph input '{}' is listed twice", source_, n);
    // Before IR version 4 weights were listed as inputs too; their initializer is the value.
    if (initializers_.count(n)) continue;
    std::string what = fmt::format("graph input '{}'", n);
    if (!v.type().has_tensor_type())
      throw OnnxUnsupported(fmt::format("{}: {} is not a tensor", source_, what));
    const auto& tt = v.type().tensor_type();
    if (tt.elem_type() != TensorProto::FLOAT)
      throw OnnxUnsupported(
          fmt::format("{}: {} is {}; epilog's graph inputs are float32{}", source_, what,
                      dtype_str(tt.elem_type()),
                      is_int_dtype(tt.elem_type()) ? " (integer tensors must be constants)" : ""));
    if (!tt.has_shape()) fail("{}: {} has no shape; epilog needs static shapes", source_, what);
    Shape shape;
    for (int d = 0; d < tt.shape().dim_size(); ++d) {
      const auto& dim = tt.shape().dim(d);
      if (d == 0 && options_.batch > 0) {
        if (dim.has_dim_value()) file_batch_ = dim.dim_value();
        shape.push_back(options_.batch);
      } else if (dim.has_dim_value()) {
        if (dim.dim_value() < 1)
          fail("{}: {} has dim {} of size {}; epilog needs sizes >= 1", source_, what, d,
               dim.dim_value());
        shape.push_back(dim.dim_value());
      } else if (d == 0) {
        fail(
            "{}: {} has a symbolic batch dim ('{}'): give the batch size (epilog --batch N, "
            "LoadOptions::batch)",
            source_, what, dim.dim_param());
      } else {
        fail(
            "{}: {} has a symbolic dim {} ('{}'); epilog needs static shapes (export with "
            "fixed sizes)",
            source_, what, d, dim.dim_param());
      }
    }
    if (options_.batch > 0 && shape.empty())
      fail("{}: {} is a scalar, so it has no batch dim to set", source_, what);
    check_size(shape, what);
    graph_.inputs.push_back(n);
    graph_.values[n] = Value{shape, DType::F32};
    dyn_[n] = n;
  }
}

void Importer::read_outputs(const onnx::GraphProto& g) {
  name_ = "";
  if (g.output_size() == 0) fail("{}: the graph has no outputs", source_);
  for (const auto& v : g.output()) {
    const std::string& o = v.name();
    std::string what = fmt::format("graph output '{}'", o);
    if (o.empty()) fail("{}: a graph output has no name", source_);
    if (v.type().has_tensor_type() && v.type().tensor_type().elem_type() != TensorProto::FLOAT &&
        v.type().tensor_type().elem_type() != TensorProto::UNDEFINED)
      throw OnnxUnsupported(fmt::format("{}: {} is {}; epilog's outputs are float32", source_, what,
                                        dtype_str(v.type().tensor_type().elem_type())));
    if (graph_.is_output(o)) fail("{}: {} is listed twice", source_, what);
    if (const Const* c = constant(o)) {
      // A constant output: a weight of the output's name.
      if (!c->is_float())
        throw OnnxUnsupported(
            fmt::format("{}: {} is an integer constant ({}); epilog's outputs are float32", source_,
                        what, dtype_str(c->dtype)));
      if (checked_numel(c->dims, kMaxNumel) == 0)
        throw OnnxUnsupported(
            fmt::format("{}: {} is empty ({})", source_, what, shape_str(c->dims)));
      check_size(c->dims, what);
      if (!graph_.is_weight(o)) add_weight(o, *c);
    } else {
      auto it = dyn_.find(o);
      if (it == dyn_.end())
        fail("{}: {} is not defined by a graph input, an initializer or a node", source_, what);
      if (it->second != o) name_output(o, it->second);
    }
    graph_.outputs.push_back(o);
    check_declared_shape(v, what);
  }
}

// An output that names another value (after Identity, a no-op Reshape, a 1x upsample): the
// value takes the output's name when only this output stands for it, else a copy is made.
void Importer::name_output(const std::string& out, const std::string& value) {
  const bool node_made = !graph_.is_input(value) && !graph_.is_weight(value);
  // Renaming updates every ONNX name that stood for the value, so a second output naming it
  // finds a graph output and gets a copy.
  const bool claimed = graph_.is_output(value) || output_names_.count(value);
  if (node_made && !claimed) {
    for (Node& n : graph_.nodes) {
      for (std::string& i : n.inputs)
        if (i == value) i = out;
      for (std::string& o : n.outputs)
        if (o == value) o = out;
    }
    graph_.values[out] = graph_.values.at(value);
    graph_.values.erase(value);
    for (auto& e : dyn_)
      if (e.second == value) e.second = out;
    return;
  }
  if (graph_.is_weight(value)) {
    graph_.weights[out] = graph_.weights.at(value);
    graph_.values[out] = graph_.values.at(value);
    return;
  }
  // A one-input concat is a copy; epilog has no identity op.
  const Shape& s = graph_.values.at(value).shape;
  if (s.empty())
    throw OnnxUnsupported(fmt::format(
        "{}: graph output '{}' is the scalar '{}' under another name, which epilog cannot copy",
        source_, out, value));
  name_ = fresh_node(out + ".copy");
  op_ = "Identity";
  emit(OpKind::Concat, {value}, attrs({{"axis", int64_t(0)}}), {out});
}

// A declared static output shape must be what the import infers: a cheap check that the
// mapping of every op on the way kept the model's meaning.
void Importer::check_declared_shape(const onnx::ValueInfoProto& v, const std::string& what) {
  if (options_.batch > 0 || !v.type().has_tensor_type() || !v.type().tensor_type().has_shape())
    return;
  Shape declared;
  for (const auto& dim : v.type().tensor_type().shape().dim()) {
    if (!dim.has_dim_value()) return;
    declared.push_back(dim.dim_value());
  }
  const Shape& got = graph_.values.at(v.name()).shape;
  if (declared != got)
    fail("{}: {} is declared as {} but the import infers {}", source_, what, shape_str(declared),
         shape_str(got));
}

// -- nodes --

void Importer::import_node(const NodeProto& node) {
  node_ = &node;
  op_ = node.op_type();
  name_ = node.name();
  if (name_.empty()) {
    std::string first;
    for (const std::string& o : node.output())
      if (!o.empty() && first.empty()) first = o;
    name_ = fmt::format("{}_{}", op_.empty() ? "node" : op_, first);
  }
  name_ = fresh_node(name_);
  attrs_.clear();
  for (const AttributeProto& a : node.attribute()) {
    if (!attrs_.emplace(a.name(), &a).second) bad("attribute '{}' is given twice", a.name());
    if (!a.ref_attr_name().empty())
      unsupported_attr(a.name(), "refers to a function attribute ('{}')", a.ref_attr_name());
  }
  if (!node.domain().empty() && node.domain() != "ai.onnx")
    unsupported("ops of domain '{}' are not supported (epilog imports the default ONNX domain)",
                node.domain());
  for (const std::string& i : node.input())
    if (!i.empty() && !defined(i))
      bad("input '{}' is not defined by a graph input, an initializer or an earlier node "
          "(nodes must be in topological order)",
          i);
  for (const std::string& o : node.output())
    if (!o.empty() && defined(o)) bad("output '{}' is already defined", o);

  auto h = op_handlers().find(op_);
  if (h == op_handlers().end()) {
    std::vector<std::string> known;
    for (const auto& [n, f] : op_handlers()) known.push_back(n);
    unsupported("op '{}' is not supported (epilog imports {})", op_, fmt::join(known, ", "));
  }
  try {
    h->second(*this);
  } catch (const FoldError& e) {
    bad("{}", e.what());
  }
  for (const std::string& o : node.output())
    EPILOG_ASSERT(o.empty() || defined(o) || uses(o) == 0, "{}: output '{}' was not made", where(),
                  o);
}

}  // namespace onnx_import

using onnx_import::checked_numel;
using onnx_import::Const;
using onnx_import::dtype_str;

bool onnx_available() {
  return true;
}

Graph parse_onnx(const void* data, size_t size, const std::string& source,
                 const std::string& base_dir, const LoadOptions& options) {
  if (size > size_t(INT_MAX))
    fail("{}: {} bytes is more than protobuf parses (2 GiB); keep the weights in external data",
         source, size);
  onnx::ModelProto model;
  if (!model.ParseFromArray(data, int(size)))
    fail("{}: not a valid ONNX model (the protobuf does not parse: truncated or corrupt file?)",
         source);
  return onnx_import::Importer(source, base_dir, options).load(model);
}

Graph load_onnx(const std::string& path, const LoadOptions& options) {
  std::string bytes = read_file(path);
  return parse_onnx(bytes.data(), bytes.size(), path, fs::path(path).parent_path().string(),
                    options);
}

Tensor read_onnx_tensor(const std::string& path) {
  std::string bytes = read_file(path);
  onnx::TensorProto t;
  if (bytes.size() > size_t(INT_MAX) || !t.ParseFromArray(bytes.data(), int(bytes.size())))
    fail("{}: not a valid ONNX TensorProto (truncated or corrupt file?)", path);
  const std::string dir = fs::path(path).parent_path().string();
  Const c = onnx_import::TensorReader(path, dir).read(t, "tensor");
  if (!c.is_float())
    throw OnnxUnsupported(
        fmt::format("{}: tensor is {}; epilog's tensors are float32", path, dtype_str(c.dtype)));
  if (checked_numel(c.dims, onnx_import::kMaxNumel) == 0)
    throw OnnxUnsupported(fmt::format("{}: tensor is empty ({})", path, shape_str(c.dims)));
  return Tensor::from_vector(c.dims, c.f);
}

}  // namespace epilog

#endif  // EPILOG_HAVE_ONNX
