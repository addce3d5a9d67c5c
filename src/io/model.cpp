// The JSON model loader and saver; the format is described in model.h.
#include "epilog/io/model.h"

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "epilog/io/dump.h"
#include "epilog/io/init.h"
#include "epilog/io/onnx.h"
#include "epilog/io/safetensors.h"
#include "file.h"

namespace epilog {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// No real model comes near these; refusing bigger sizes keeps the int64 arithmetic of shape
// inference (products of dims and attributes) clear of overflow for any input file.
constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxNumel = int64_t(1) << 40;

// Saving: weights up to this many elements stay inline, where a reader of the JSON sees them.
constexpr int64_t kMaxInline = 64;

// A JSON value in a message, short enough to read. Nested values are only described: dump()
// recurses, and a hostile file can nest deeper than the stack.
std::string brief(const json& j) {
  if (j.is_structured() &&
      std::any_of(j.begin(), j.end(), [](const json& e) { return e.is_structured(); }))
    return j.is_array() ? "a nested list" : "an object";
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

// "(did you mean conv2d?)" for a near miss, else the whole list.
std::string op_suggestion(const std::string& name) {
  std::vector<std::string> close, all;
  for (int k = 0; k < kNumOps; ++k) {
    std::string op = op_name(static_cast<OpKind>(k));
    all.push_back(op);
    bool near = name.size() <= 32 && edit_distance(name, op) <= 2;
    bool part = name.size() >= 3 &&
                (op.find(name) != std::string::npos || name.find(op) != std::string::npos);
    if (near || part) close.push_back(op);
  }
  if (!close.empty()) return fmt::format(" (did you mean {}?)", fmt::join(close, ", "));
  return fmt::format(" (known ops: {})", fmt::join(all, ", "));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

struct WeightSpec {
  std::string where;
  Shape shape;
  Tensor data;  // from "data"
  std::optional<uint64_t> seed;
};

struct OutputSpec {
  std::string name;
  std::string where;
  std::optional<Shape> shape;
};

// One load of one file. Every error goes through fail_at(), which puts the file and the place
// in it (a JSON path, or a node by index, name and op) in front of the problem.
class JsonLoader {
 public:
  JsonLoader(const std::string& source, const std::string& base_dir, const LoadOptions& options)
      : source_(source), base_dir_(base_dir), options_(options) {}

  Graph load(const std::string& text) {
    json doc = parse(text);
    object(doc, "top level",
           {"format", "version", "inputs", "outputs", "weights_file", "weights", "nodes"});
    const json& format = require(doc, "format", "top level");
    if (format != "epilog") fail_at("format", "is {}, expected \"epilog\"", brief(format));
    const json& version = require(doc, "version", "top level");
    if (version != 1)
      fail_at("version", "{} is not supported (this build reads version 1)", brief(version));

    read_inputs(require(doc, "inputs", "top level"));
    if (const json* w = member(doc, "weights")) read_weights(*w);
    read_nodes(require(doc, "nodes", "top level"));
    read_outputs(require(doc, "outputs", "top level"));
    check_references();

    try {
      toposort(graph_);
    } catch (const Error& e) {
      fail("{}: {}", source_, e.what());
    }
    infer_all("");
    // Roles come from graph order: dump_json writes that order and toposort keeps it, so a
    // dumped model loads with the same roles (and the builder's weights with theirs).
    std::map<std::string, std::pair<OpKind, std::string>> roles;
    for (const Node& n : graph_.nodes)
      for (size_t k = 0; k < n.inputs.size(); ++k)
        roles.emplace(n.inputs[k], std::make_pair(n.op, op_info(n.op).input_name(k)));
    for (const OutputSpec& o : outputs_)
      if (o.shape && *o.shape != graph_.values.at(o.name).shape)
        fail_at(o.where, "shape {} does not match the inferred {}", shape_str(*o.shape),
                shape_str(graph_.values.at(o.name).shape));

    read_weight_data(doc, roles);
    if (options_.batch > 0) rebatch();
    try {
      verify(graph_);
    } catch (const Error& e) {
      fail("{}: {}", source_, e.what());
    }
    return std::move(graph_);
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail_at(const std::string& where, fmt::format_string<Args...> format,
                            Args&&... args) const {
    throw Error(fmt::format("{}: {}: {}", source_, where,
                            fmt::format(format, std::forward<Args>(args)...)));
  }

  json parse(const std::string& text) const {
    // nlohmann keeps the last of two equal keys; a duplicated weight or attribute would then
    // be dropped without a word, so they are refused here.
    std::vector<std::set<std::string>> open;  // the keys of each object being parsed
    json::parser_callback_t check = [&](int, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::object_start) {
        open.emplace_back();
      } else if (event == json::parse_event_t::object_end) {
        open.pop_back();
      } else if (event == json::parse_event_t::key &&
                 !open.back().insert(parsed.get<std::string>()).second) {
        fail("{}: invalid JSON: key {} appears twice in one object", source_, brief(parsed));
      }
      return true;
    };
    try {
      return json::parse(text, check);
    } catch (const json::parse_error& e) {
      std::string what = e.what();
      size_t cut = what.find("] ");
      fail("{}: invalid JSON at byte {}: {}", source_, e.byte,
           cut == std::string::npos ? what : what.substr(cut + 2));
    } catch (const json::exception& e) {
      fail("{}: invalid JSON: {}", source_, e.what());
    }
  }

  // -- typed access to the document --

  const json& object(const json& j, const std::string& where,
                     std::initializer_list<const char*> keys) const {
    if (!j.is_object()) fail_at(where, "expected an object, got {}", brief(j));
    for (const auto& item : j.items())
      if (std::find_if(keys.begin(), keys.end(), [&](const char* k) { return item.key() == k; }) ==
          keys.end())
        fail_at(where, "unknown key \"{}\" (expected {})", item.key(), fmt::join(keys, ", "));
    return j;
  }

  const json* member(const json& obj, const char* key) const {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }

  const json& require(const json& obj, const char* key, const std::string& where) const {
    const json* j = member(obj, key);
    if (!j) fail_at(where, "missing \"{}\"", key);
    return *j;
  }

  const json& array(const json& j, const std::string& where) const {
    if (!j.is_array()) fail_at(where, "expected a list, got {}", brief(j));
    return j;
  }

  std::string name(const json& j, const std::string& where) const {
    if (!j.is_string() || j.get_ref<const std::string&>().empty())
      fail_at(where, "expected a non-empty name, got {}", brief(j));
    return j.get<std::string>();
  }

  int64_t integer(const json& j, const std::string& where, int64_t lo, int64_t hi) const {
    if (!j.is_number_integer()) fail_at(where, "expected an integer, got {}", brief(j));
    // Unsigned first: above 2^63 a signed read would wrap around.
    bool ok = j.is_number_unsigned() ? j.get<uint64_t>() <= static_cast<uint64_t>(hi)
                                     : j.get<int64_t>() <= hi;
    ok = ok && j.get<int64_t>() >= lo;
    if (!ok) fail_at(where, "{} is out of range [{}, {}]", brief(j), lo, hi);
    return j.get<int64_t>();
  }

  void check_size(const Shape& shape, const std::string& where) const {
    int64_t n = 1;
    for (int64_t d : shape)
      if (d > kMaxDim || __builtin_mul_overflow(n, d, &n) || n > kMaxNumel)
        fail_at(where, "shape {} is beyond epilog's limits (dims up to 2^31-1, 2^40 elements)",
                shape_str(shape));
  }

  Shape shape(const json& j, const std::string& where) const {
    array(j, where);
    Shape s;
    for (size_t k = 0; k < j.size(); ++k)
      s.push_back(integer(j[k], fmt::format("{}[{}]", where, k), 1, kMaxDim));
    check_size(s, where);
    return s;
  }

  void define(const std::string& value, const std::string& where) {
    auto [it, fresh] = defined_.emplace(value, where);
    if (!fresh) fail_at(where, "'{}' is already defined by {}", value, it->second);
  }

  // -- sections --

  void read_inputs(const json& inputs) {
    array(inputs, "inputs");
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::string where = fmt::format("inputs[{}]", i);
      object(inputs[i], where, {"name", "shape"});
      std::string n = name(require(inputs[i], "name", where), where + ".name");
      Shape s = shape(require(inputs[i], "shape", where), where + ".shape");
      define(n, where);
      graph_.inputs.push_back(n);
      graph_.values[n] = Value{s, DType::F32};
    }
  }

  void read_weights(const json& weights) {
    if (!weights.is_object()) fail_at("weights", "expected an object, got {}", brief(weights));
    for (const auto& item : weights.items()) {
      const std::string& n = item.key();
      const json& e = item.value();
      WeightSpec spec;
      spec.where = fmt::format("weights[\"{}\"]", n);
      if (n.empty()) fail_at(spec.where, "a weight needs a non-empty name");
      object(e, spec.where, {"shape", "data", "init"});
      spec.shape = shape(require(e, "shape", spec.where), spec.where + ".shape");
      const json* data = member(e, "data");
      const json* init = member(e, "init");
      if (data && init) fail_at(spec.where, "has both \"data\" and \"init\"; give one");
      if (data) spec.data = inline_data(*data, spec.shape, spec.where + ".data");
      if (init) {
        object(*init, spec.where + ".init", {"seed"});
        const json& seed = require(*init, "seed", spec.where + ".init");
        if (!seed.is_number_unsigned())
          fail_at(spec.where + ".init.seed", "expected a non-negative integer, got {}",
                  brief(seed));
        spec.seed = seed.get<uint64_t>();
      }
      define(n, spec.where);
      graph_.values[n] = Value{spec.shape, DType::F32};
      weights_.emplace(n, std::move(spec));
    }
  }

  Tensor inline_data(const json& data, const Shape& shape, const std::string& where) const {
    array(data, where);
    if (static_cast<int64_t>(data.size()) != shape_numel(shape))
      fail_at(where, "has {} numbers but shape {} holds {}", data.size(), shape_str(shape),
              shape_numel(shape));
    Tensor t = Tensor::empty(shape);
    float* p = t.f32();
    for (size_t k = 0; k < data.size(); ++k) {
      if (!data[k].is_number())
        fail_at(fmt::format("{}[{}]", where, k), "expected a number, got {}", brief(data[k]));
      double v = data[k].get<double>();
      if (!(std::fabs(v) <= FLT_MAX))
        fail_at(fmt::format("{}[{}]", where, k), "{} is outside the float32 range", v);
      p[k] = static_cast<float>(v);
    }
    return t;
  }

  AttrValue attr(const json& v, const std::string& where) const {
    if (v.is_number_integer()) return integer(v, where, -kMaxDim, kMaxDim);
    if (v.is_number_float()) return v.get<double>();
    if (v.is_string()) return v.get<std::string>();
    if (v.is_array()) {
      std::vector<int64_t> ints;
      for (size_t k = 0; k < v.size(); ++k)
        ints.push_back(integer(v[k], fmt::format("{}[{}]", where, k), -kMaxDim, kMaxDim));
      return ints;
    }
    fail_at(where, "is {}; an attribute is an int, a float, a list of ints or a string", brief(v));
  }

  std::vector<std::string> names(const json& j, const std::string& where) const {
    array(j, where);
    std::vector<std::string> out;
    for (size_t k = 0; k < j.size(); ++k)
      out.push_back(name(j[k], fmt::format("{}[{}]", where, k)));
    return out;
  }

  void read_nodes(const json& nodes) {
    array(nodes, "nodes");
    for (size_t i = 0; i < nodes.size(); ++i) {
      const json& n = nodes[i];
      std::string where = fmt::format("nodes[{}]", i);
      object(n, where, {"name", "op", "inputs", "outputs", "attrs"});
      Node node;
      node.name = name(require(n, "name", where), where + ".name");
      where = fmt::format("nodes[{}] '{}'", i, node.name);
      std::string op = name(require(n, "op", where), where + ": op");
      auto kind = parse_op(op);
      if (!kind) fail_at(where, "unknown op '{}'{}", op, op_suggestion(op));
      node.op = *kind;
      where = fmt::format("nodes[{}] '{}' ({})", i, node.name, op);
      auto [other, fresh] = node_index_.emplace(node.name, i);
      if (!fresh) fail_at(where, "node name is already used by nodes[{}]", other->second);
      node_where_.push_back(where);

      node.inputs = names(require(n, "inputs", where), where + ": inputs");
      node.outputs = names(require(n, "outputs", where), where + ": outputs");
      Attrs given;
      if (const json* attrs = member(n, "attrs")) {
        if (!attrs->is_object()) fail_at(where, "attrs is {}, expected an object", brief(*attrs));
        for (const auto& item : attrs->items())
          given.set(item.key(), attr(item.value(), where + ": attrs." + item.key()));
      }
      try {
        node.attrs = normalize_attrs(node.op, node.name, given);
      } catch (const Error& e) {
        fail_at(fmt::format("nodes[{}]", i), "{}", e.what());
      }
      for (const std::string& out : node.outputs) define(out, where);
      graph_.nodes.push_back(std::move(node));
    }
  }

  void read_outputs(const json& outputs) {
    array(outputs, "outputs");
    if (outputs.empty()) fail_at("outputs", "is empty; a model needs at least one output");
    for (size_t i = 0; i < outputs.size(); ++i) {
      std::string where = fmt::format("outputs[{}]", i);
      object(outputs[i], where, {"name", "shape"});
      OutputSpec o;
      o.name = name(require(outputs[i], "name", where), where + ".name");
      o.where = fmt::format("outputs[{}] '{}'", i, o.name);
      if (const json* s = member(outputs[i], "shape")) o.shape = shape(*s, o.where + ".shape");
      if (graph_.is_output(o.name)) fail_at(o.where, "is listed twice");
      graph_.outputs.push_back(o.name);
      outputs_.push_back(std::move(o));
    }
  }

  void check_references() const {
    for (size_t i = 0; i < graph_.nodes.size(); ++i)
      for (const std::string& in : graph_.nodes[i].inputs)
        if (!defined_.count(in)) fail_at(node_where_[i], "input '{}' is not defined", in);
    for (const OutputSpec& o : outputs_)
      if (!defined_.count(o.name))
        fail_at(o.where, "is not defined by an input, a weight or a node");
  }

  // Node output shapes, in graph order. `context` is added to messages (" with batch 8").
  void infer_all(const std::string& context) {
    for (const Node& node : graph_.nodes) {
      size_t i = node_index_.at(node.name);
      std::vector<Shape> in_shapes;
      for (const std::string& in : node.inputs) in_shapes.push_back(graph_.values.at(in).shape);
      std::vector<Shape> out_shapes;
      try {
        out_shapes = infer_shapes(node.op, node.name, node.attrs, in_shapes);
      } catch (const Error& e) {
        fail_at(fmt::format("nodes[{}]{}", i, context), "{}", e.what());
      }
      if (out_shapes.size() != node.outputs.size())
        fail_at(node_where_[i] + context, "lists {} outputs but {} makes {}", node.outputs.size(),
                op_name(node.op), out_shapes.size());
      for (size_t k = 0; k < out_shapes.size(); ++k) {
        check_size(out_shapes[k],
                   fmt::format("{}{}: output '{}'", node_where_[i], context, node.outputs[k]));
        graph_.values[node.outputs[k]] = Value{out_shapes[k], DType::F32};
      }
    }
  }

  void read_weight_data(const json& doc,
                        const std::map<std::string, std::pair<OpKind, std::string>>& roles) {
    std::string file;
    if (const json* wf = member(doc, "weights_file"))
      file = (fs::path(base_dir_) / name(*wf, "weights_file")).string();
    if (!options_.weights_file.empty()) file = options_.weights_file;
    std::map<std::string, Tensor> tensors;
    if (!file.empty()) {
      try {
        tensors = read_safetensors(file);
      } catch (const Error& e) {
        fail("{}: weights_file: {}", source_, e.what());
      }
      // An unknown tensor is most likely a misspelled weight, which would otherwise be left to
      // "init" or inline data without a word. PyTorch's batchnorm step counters are harmless.
      std::vector<std::string> extra;
      for (const auto& [n, t] : tensors)
        if (!weights_.count(n) && !ends_with(n, ".num_batches_tracked"))
          extra.push_back("'" + n + "'");
      if (!extra.empty()) {
        size_t shown = std::min<size_t>(extra.size(), 5);
        fail("{}: weights_file {} holds {} tensor(s) that no weight of the model names: {}{}",
             source_, file, extra.size(), fmt::join(extra.begin(), extra.begin() + shown, ", "),
             shown < extra.size() ? ", ..." : "");
      }
    }
    for (auto& [n, spec] : weights_) {
      Weight w;
      auto t = tensors.find(n);
      if (t != tensors.end()) {
        if (t->second.shape() != spec.shape)
          fail_at(spec.where, "shape {} in the model but {} in {}", shape_str(spec.shape),
                  shape_str(t->second.shape()), file);
        w.data = t->second;
      } else if (spec.data.defined()) {
        w.data = spec.data;
      } else if (spec.seed) {
        auto role = roles.find(n);
        if (role == roles.end())
          fail_at(spec.where,
                  "has \"init\" but no node reads it, so how to initialize it is "
                  "unknown");
        w.data = init_weight(n, spec.shape, role->second.first, role->second.second, *spec.seed);
        w.seed = spec.seed;
      } else if (file.empty()) {
        fail_at(spec.where, "has no data: give \"data\", \"init\" or a weights_file");
      } else {
        fail_at(spec.where, "is not in {} and has no \"data\" or \"init\"", file);
      }
      graph_.weights[n] = std::move(w);
    }
  }

  void rebatch() {
    if (options_.batch > kMaxDim)
      fail("{}: batch {} is beyond epilog's limit of 2^31-1", source_, options_.batch);
    std::string context = fmt::format(" with batch {}", options_.batch);
    for (size_t i = 0; i < graph_.inputs.size(); ++i) {
      std::string where = fmt::format("inputs[{}] '{}'", i, graph_.inputs[i]);
      Shape& s = graph_.values[graph_.inputs[i]].shape;
      if (s.empty()) fail_at(where, "is a scalar, so it has no batch dim to set");
      s[0] = options_.batch;
      check_size(s, where + context);
    }
    infer_all(context);
  }

  const std::string& source_;
  const std::string& base_dir_;
  const LoadOptions& options_;
  Graph graph_;
  std::map<std::string, std::string> defined_;  // value -> where the file defines it
  std::map<std::string, WeightSpec> weights_;
  std::map<std::string, size_t> node_index_;  // node name -> index in the file
  std::vector<std::string> node_where_;       // by index in the file
  std::vector<OutputSpec> outputs_;
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Graph parse_json_model(const std::string& text, const std::string& source,
                       const std::string& base_dir, const LoadOptions& options) {
  return JsonLoader(source, base_dir, options).load(text);
}

Graph load_model(const std::string& path, const LoadOptions& options) {
  std::string ext = lower(fs::path(path).extension().string());
  if (ext == ".onnx") return load_onnx(path, options);
  if (ext != ".json")
    fail("{}: unsupported model file type '{}' (epilog reads .json and .onnx models)", path, ext);
  return parse_json_model(read_file(path), path, fs::path(path).parent_path().string(), options);
}

void save_model(const Graph& graph, const std::string& json_path) {
  verify(graph, "save_model");
  // Non-finite numbers have no JSON spelling, so they go to the file whatever the size.
  auto to_file = [](const std::string&, const Weight& w) {
    if (w.seed) return false;
    if (w.data.numel() > kMaxInline) return true;
    Tensor host = w.data.to(Device::CPU);
    const float* p = host.f32();
    return !std::all_of(p, p + host.numel(), [](float v) { return std::isfinite(v); });
  };
  std::map<std::string, Tensor> file;
  for (const auto& [n, w] : graph.weights)
    if (to_file(n, w)) file[n] = w.data;

  fs::path json_file(json_path);
  JsonDumpOptions options;
  if (!file.empty()) {
    options.weights_file = json_file.stem().string() + ".safetensors";
    options.in_file = to_file;
  }
  std::string text;
  try {
    text = dump_json(graph, options);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: cannot write the model: {}", json_path, e.what());
  }
  if (!file.empty())
    write_safetensors((json_file.parent_path() / options.weights_file).string(), file);
  std::ofstream f(json_path, std::ios::binary | std::ios::trunc);
  if (!f) fail("{}: cannot open for writing ({})", json_path, std::strerror(errno));
  f << text;
  f.close();
  if (!f) fail("{}: write error", json_path);
}

}  // namespace epilog
