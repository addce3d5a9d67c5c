#include "epilog/io/dump.h"

#include <set>

namespace epilog {
namespace {

// Short names keep text dump lines readable; other attributes print under their own name.
const char* short_name(const std::string& attr) {
  static const std::map<std::string, const char*> names = {
      {"stride", "s"}, {"padding", "p"}, {"dilation", "d"}, {"groups", "g"}, {"activation", "act"}};
  auto it = names.find(attr);
  return it == names.end() ? attr.c_str() : it->second;
}

std::string ints_str(const std::vector<int64_t>& v) {
  if (!v.empty() && std::all_of(v.begin(), v.end(), [&](int64_t x) { return x == v[0]; }) &&
      v.size() <= 4)
    return std::to_string(v[0]);
  return fmt::format("{}", fmt::join(v, v.size() == 2 ? "x" : ","));
}

std::string attr_str(const AttrValue& v) {
  switch (v.index()) {
    case 0:
      return std::to_string(std::get<int64_t>(v));
    case 1:
      return fmt::format("{}", std::get<double>(v));
    case 2:
      return ints_str(std::get<std::vector<int64_t>>(v));
    default:
      return std::get<std::string>(v);
  }
}

// "k=3x3 s=2 p=1": the kernel of conv-like ops, then every attribute not at its default.
std::string attrs_str(const Graph& graph, const Node& node) {
  std::vector<std::string> parts;
  if (node.op == OpKind::Conv2d || node.op == OpKind::FusedConv2d) {
    const Shape& w = graph.value(node.inputs[1]).shape;
    parts.push_back(fmt::format("k={}x{}", w[2], w[3]));
  }
  const OpInfo& info = op_info(node.op);
  for (const AttrSpec& spec : info.attrs) {
    const AttrValue& v = node.attrs.all().at(spec.name);
    if ((spec.fallback && *spec.fallback == v) || node.op == OpKind::FusedElementwise) continue;
    parts.push_back(fmt::format("{}={}", short_name(spec.name), attr_str(v)));
  }
  return parts.empty() ? "" : fmt::format(" {{{}}}", fmt::join(parts, " "));
}

// The op, and for a fused_elementwise its steps: "fused_elementwise[sigmoid, mul(x1)]".
std::string op_label(const Node& node) {
  if (node.op != OpKind::FusedElementwise) return op_name(node.op);
  return fmt::format("{}[{}]", op_name(node.op), node.attrs.s("program"));
}

std::string operand(const Graph& graph, const std::string& name) {
  return (graph.is_weight(name) ? "@" : "%") + name;
}

std::string dot_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

nlohmann::ordered_json attr_json(const AttrValue& v) {
  switch (v.index()) {
    case 0:
      return std::get<int64_t>(v);
    case 1:
      return std::get<double>(v);
    case 2:
      return std::get<std::vector<int64_t>>(v);
    default:
      return std::get<std::string>(v);
  }
}

// Pretty JSON with short objects and lists of numbers kept on one line, so that a dumped model
// reads (and diffs) one weight per line and one node per few lines.
void write_json(const nlohmann::ordered_json& j, int indent, std::string& out) {
  auto flat = [](const nlohmann::ordered_json& a) {
    return std::none_of(a.begin(), a.end(), [](const auto& e) { return e.is_structured(); });
  };
  std::string pad(indent + 1, ' ');
  std::string compact = j.is_structured() ? j.dump() : "";
  if (j.is_structured() && compact.size() <= 100 && indent > 0) {
    out += compact;
  } else if (j.is_object() && !j.empty()) {
    out += "{\n";
    size_t i = 0;
    for (const auto& [k, v] : j.items()) {
      out += pad + nlohmann::ordered_json(k).dump() + ": ";
      write_json(v, indent + 1, out);
      out += ++i < j.size() ? ",\n" : "\n";
    }
    out += std::string(indent, ' ') + "}";
  } else if (j.is_array() && !j.empty() && !flat(j)) {
    out += "[\n";
    for (size_t i = 0; i < j.size(); ++i) {
      out += pad;
      write_json(j[i], indent + 1, out);
      out += i + 1 < j.size() ? ",\n" : "\n";
    }
    out += std::string(indent, ' ') + "]";
  } else {
    out += j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::strict);
  }
}

}  // namespace

std::string dump_text(const Graph& graph) {
  std::string out;
  for (const std::string& in : graph.inputs)
    out += fmt::format("input %{} : {}\n", in, shape_str(graph.value(in).shape));
  for (const Node& node : graph.nodes) {
    std::vector<std::string> outs, shapes, ins;
    for (const std::string& o : node.outputs) {
      outs.push_back("%" + o);
      shapes.push_back(shape_str(graph.value(o).shape));
    }
    for (const std::string& i : node.inputs) ins.push_back(operand(graph, i));
    std::string name_note = node.outputs.size() == 1 && node.outputs[0] == node.name
                                ? ""
                                : fmt::format("  # {}", node.name);
    out += fmt::format("{} = {}({}){} : {}{}\n", fmt::join(outs, ", "), op_label(node),
                       fmt::join(ins, ", "), attrs_str(graph, node), fmt::join(shapes, ", "),
                       name_note);
  }
  for (const std::string& o : graph.outputs) out += fmt::format("output {}\n", operand(graph, o));
  return out;
}

std::string dump_dot(const Graph& graph) {
  std::string out =
      "digraph epilog {\n  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10];\n";
  for (const std::string& in : graph.inputs)
    out += fmt::format("  \"v:{0}\" [shape=ellipse, label=\"{0}\\n{1}\"];\n", dot_escape(in),
                       shape_str(graph.value(in).shape));
  UseIndex uses(graph);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    const bool fused = node.op == OpKind::FusedConv2d || node.op == OpKind::FusedElementwise;
    out += fmt::format(
        "  \"n:{}\" [shape=box, label=\"{}\\n{}{}\"{}];\n", dot_escape(node.name),
        dot_escape(node.name), dot_escape(op_label(node)), dot_escape(attrs_str(graph, node)),
        fused ? ", style=\"filled,bold\", fillcolor=\"#ffcc66\", penwidth=2" : ", style=rounded");
    for (const std::string& in : node.inputs) {
      if (graph.is_weight(in)) continue;
      int p = uses.producer(in);
      std::string from = p < 0 ? "v:" + in : "n:" + graph.nodes[p].name;
      out += fmt::format("  \"{}\" -> \"n:{}\" [label=\"{}\"];\n", dot_escape(from),
                         dot_escape(node.name), shape_str(graph.value(in).shape));
    }
  }
  for (const std::string& o : graph.outputs) {
    out += fmt::format(
        "  \"out:{0}\" [shape=ellipse, style=filled, fillcolor=\"#dddddd\", "
        "label=\"{0}\\n{1}\"];\n",
        dot_escape(o), shape_str(graph.value(o).shape));
    int p = uses.producer(o);
    std::string from = p < 0 ? "v:" + o : "n:" + graph.nodes[p].name;
    out += fmt::format("  \"{}\" -> \"out:{}\";\n", dot_escape(from), dot_escape(o));
  }
  return out + "}\n";
}

nlohmann::ordered_json to_json(const Graph& graph, const JsonDumpOptions& options) {
  using json = nlohmann::ordered_json;
  json j;
  j["format"] = "epilog";
  j["version"] = 1;
  j["inputs"] = json::array();
  for (const std::string& in : graph.inputs)
    j["inputs"].push_back({{"name", in}, {"shape", graph.value(in).shape}});
  j["outputs"] = json::array();
  for (const std::string& o : graph.outputs)
    j["outputs"].push_back({{"name", o}, {"shape", graph.value(o).shape}});
  if (!options.weights_file.empty()) j["weights_file"] = options.weights_file;
  j["weights"] = json::object();
  for (const auto& [name, w] : graph.weights) {
    json e = {{"shape", w.data.shape()}};
    if (w.seed) {
      e["init"] = {{"seed", *w.seed}};
    } else if (options.weights_file.empty() || (options.in_file && !options.in_file(name, w))) {
      Tensor host = w.data.to(Device::CPU);
      const float* p = host.f32();
      e["data"] = std::vector<float>(p, p + host.numel());
    }
    j["weights"][name] = std::move(e);
  }
  j["nodes"] = json::array();
  for (const Node& node : graph.nodes) {
    json attrs = json::object();
    for (const auto& [k, v] : node.attrs.all()) attrs[k] = attr_json(v);
    j["nodes"].push_back({{"name", node.name},
                          {"op", op_name(node.op)},
                          {"inputs", node.inputs},
                          {"outputs", node.outputs},
                          {"attrs", std::move(attrs)}});
  }
  return j;
}

std::string dump_json(const Graph& graph, const JsonDumpOptions& options) {
  std::string out;
  write_json(to_json(graph, options), 0, out);
  return out + "\n";
}

DumpFormat parse_dump_format(const std::string& name) {
  if (name == "text") return DumpFormat::Text;
  if (name == "dot") return DumpFormat::Dot;
  if (name == "json") return DumpFormat::Json;
  fail("unknown dump format '{}' (expected text, dot or json)", name);
}

std::string dump(const Graph& graph, DumpFormat format) {
  switch (format) {
    case DumpFormat::Text:
      return dump_text(graph);
    case DumpFormat::Dot:
      return dump_dot(graph);
    case DumpFormat::Json:
      return dump_json(graph);
  }
  return "";
}

}  // namespace epilog
