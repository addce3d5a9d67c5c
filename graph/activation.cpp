#include "epilog/graph/activation.h"

#include <charconv>

namespace epilog {
namespace {

// Each activation: its name, the op that computes it alone, and the attributes of that op that
// hold its parameters a and b (empty: none). Gelu's tanh form is the gelu op with
// approximate = "tanh".
struct ActivationInfo {
  Activation kind;
  const char* name;
  std::optional<OpKind> op;
  const char* a_attr;
  const char* b_attr;
};

const ActivationInfo kActivations[] = {
    {Activation::None, "none", std::nullopt, "", ""},
    {Activation::Silu, "silu", OpKind::Silu, "", ""},
    {Activation::Relu, "relu", OpKind::Relu, "", ""},
    {Activation::Sigmoid, "sigmoid", OpKind::Sigmoid, "", ""},
    {Activation::Clip, "clip", OpKind::Clip, "min", "max"},
    {Activation::LeakyRelu, "leaky_relu", OpKind::LeakyRelu, "alpha", ""},
    {Activation::HardSigmoid, "hardsigmoid", OpKind::HardSigmoid, "alpha", "beta"},
    {Activation::HardSwish, "hardswish", OpKind::HardSwish, "", ""},
    {Activation::Tanh, "tanh", OpKind::Tanh, "", ""},
    {Activation::Gelu, "gelu", OpKind::Gelu, "", ""},
    {Activation::GeluTanh, "gelu_tanh", std::nullopt, "", ""},
    {Activation::Mish, "mish", OpKind::Mish, "", ""},
    {Activation::Softplus, "softplus", OpKind::Softplus, "", ""},
    {Activation::Elu, "elu", OpKind::Elu, "alpha", ""},
    {Activation::Exp, "exp", OpKind::Exp, "", ""},
    {Activation::Erf, "erf", OpKind::Erf, "", ""},
    {Activation::Sqrt, "sqrt", OpKind::Sqrt, "", ""},
    {Activation::Reciprocal, "reciprocal", OpKind::Reciprocal, "", ""},
    {Activation::Neg, "neg", OpKind::Neg, "", ""},
    {Activation::Abs, "abs", OpKind::Abs, "", ""},
    {Activation::Log, "log", OpKind::Log, "", ""},
    {Activation::Pow, "pow", OpKind::Pow, "exponent", ""},
};
static_assert(sizeof(kActivations) / sizeof(kActivations[0]) == kNumActivations,
              "every activation has a row");

const ActivationInfo& info(Activation kind) {
  const ActivationInfo& row = kActivations[static_cast<size_t>(kind)];
  EPILOG_ASSERT(row.kind == kind, "activation table out of order at {}", static_cast<int>(kind));
  return row;
}

float attr_or_zero(const Attrs& attrs, const char* name) {
  return *name ? static_cast<float>(attrs.f(name)) : 0.0f;
}

// The parameters an activation takes: those its op holds in attributes.
int param_count(Activation kind) {
  return (*info(kind).a_attr ? 1 : 0) + (*info(kind).b_attr ? 1 : 0);
}

const std::pair<Binary, OpKind> kBinaries[] = {
    {Binary::Add, OpKind::Add}, {Binary::Mul, OpKind::Mul}, {Binary::Sub, OpKind::Sub},
    {Binary::Div, OpKind::Div}, {Binary::Max, OpKind::Max}, {Binary::Min, OpKind::Min},
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// "name" or "name(a, b, ...)": the name and its arguments, trimmed.
std::pair<std::string, std::vector<std::string>> split_call(const std::string& step) {
  const size_t open = step.find('(');
  if (open == std::string::npos) return {trim(step), {}};
  if (step.back() != ')') fail("'{}' does not end in ')'", step);
  std::vector<std::string> args;
  std::string arg;
  for (char c : step.substr(open + 1, step.size() - open - 2)) {
    if (c == ',') {
      args.push_back(trim(arg));
      arg.clear();
    } else {
      arg += c;
    }
  }
  args.push_back(trim(arg));
  return {trim(step.substr(0, open)), args};
}

float parse_float(const std::string& s) {
  float v = 0;
  const auto [end, err] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (err != std::errc() || end != s.data() + s.size()) fail("'{}' is not a number", s);
  return v;
}

ChainStep parse_step(const std::string& step) {
  const auto [name, args] = split_call(step);
  ChainStep s;
  for (const auto& [binary, kind] : kBinaries) {
    if (name != op_name(kind)) continue;
    s.op = binary;
    const std::string& x = args.empty() ? "" : args[0];
    if (args.empty() || args.size() > 2 || (args.size() == 2 && args[1] != "v") || x.size() != 2 ||
        x[0] != 'x' || x[1] < '0' || x[1] >= '0' + kMaxChainInputs)
      fail("'{}' is not {}(xK) or {}(xK, v) with K below {}", step, name, name, kMaxChainInputs);
    s.operand = int8_t(x[1] - '0');
    s.swap = args.size() == 2;
    return s;
  }
  const ActivationInfo* row = nullptr;
  for (const ActivationInfo& r : kActivations)
    if (name == r.name && r.kind != Activation::None) row = &r;
  if (!row) fail("'{}' is neither an activation nor a binary op", step);
  const size_t want = size_t(param_count(row->kind));
  if (args.size() != want) fail("'{}' takes {} parameters, got {}", name, want, args.size());
  s.act = Act(row->kind, want > 0 ? parse_float(args[0]) : 0.0f,
              want > 1 ? parse_float(args[1]) : 0.0f);
  return s;
}

}  // namespace

const char* activation_name(Activation kind) {
  return info(kind).name;
}

Activation parse_activation(const std::string& name) {
  for (const ActivationInfo& row : kActivations)
    if (name == row.name) return row.kind;
  fail("unknown activation '{}'", name);
}

std::optional<Act> node_activation(const Node& node) {
  for (const ActivationInfo& row : kActivations) {
    if (row.op != node.op) continue;
    if (node.op == OpKind::Gelu && node.attrs.s("approximate") == "tanh")
      return Act(Activation::GeluTanh);
    return Act(row.kind, attr_or_zero(node.attrs, row.a_attr),
               attr_or_zero(node.attrs, row.b_attr));
  }
  return std::nullopt;
}

std::pair<OpKind, Attrs> activation_op(const Act& act) {
  if (act.kind == Activation::GeluTanh) {
    Attrs attrs;
    attrs.set("approximate", std::string("tanh"));
    return {OpKind::Gelu, attrs};
  }
  const ActivationInfo& row = info(act.kind);
  if (!row.op) fail("activation '{}' has no op of its own", row.name);
  Attrs attrs;
  if (*row.a_attr) attrs.set(row.a_attr, double(act.a));
  if (*row.b_attr) attrs.set(row.b_attr, double(act.b));
  return {*row.op, attrs};
}

std::optional<Binary> binary_kind(OpKind op) {
  for (const auto& [binary, kind] : kBinaries)
    if (kind == op) return binary;
  return std::nullopt;
}

OpKind binary_op(Binary op) {
  for (const auto& [binary, kind] : kBinaries)
    if (binary == op) return kind;
  EPILOG_ASSERT(false, "unknown binary op {}", static_cast<int>(op));
  return OpKind::Add;
}

ChainProgram parse_chain(const std::string& text) {
  // Steps end at the commas outside parentheses.
  std::vector<std::string> steps{""};
  int depth = 0;
  for (char c : text) {
    depth += c == '(' ? 1 : c == ')' ? -1 : 0;
    if (c == ',' && depth == 0)
      steps.emplace_back();
    else
      steps.back() += c;
  }
  if (steps.size() > size_t(kMaxChainSteps))
    fail("{} steps, more than the {} a kernel runs", steps.size(), kMaxChainSteps);
  ChainProgram p;
  for (size_t i = 0; i < steps.size(); ++i) {
    try {
      p.step[i] = parse_step(trim(steps[i]));
    } catch (const Error& e) {
      fail("step {}: {}", i + 1, e.what());
    }
  }
  p.steps = int(steps.size());
  return p;
}

std::string chain_str(const ChainProgram& program) {
  std::vector<std::string> steps;
  for (int i = 0; i < program.steps; ++i) {
    const ChainStep& s = program.step[i];
    if (s.operand >= 0) {
      steps.push_back(
          fmt::format("{}(x{}{})", op_name(binary_op(s.op)), s.operand, s.swap ? ", v" : ""));
      continue;
    }
    const int n = param_count(s.act.kind);
    steps.push_back(n == 0 ? std::string(activation_name(s.act.kind))
                    : n == 1
                        ? fmt::format("{}({})", activation_name(s.act.kind), s.act.a)
                        : fmt::format("{}({}, {})", activation_name(s.act.kind), s.act.a, s.act.b));
  }
  return fmt::format("{}", fmt::join(steps, ", "));
}

ChainProgram node_chain(const Node& node) {
  try {
    return parse_chain(node.attrs.s("program"));
  } catch (const Error& e) {
    fail("[{}] node '{}': program '{}': {}", op_name(node.op), node.name, node.attrs.s("program"),
         e.what());
  }
}

bool is_activation_op(OpKind op) {
  for (const ActivationInfo& row : kActivations)
    if (row.op == op) return true;
  return false;
}

Act conv_activation(const Node& node) {
  if (node.op != OpKind::FusedConv2d) return {};
  return Act(parse_activation(node.attrs.s("activation")), float(node.attrs.f("alpha")),
             float(node.attrs.f("beta")));
}

bool fused_residual_first(const Node& node) {
  return node.op == OpKind::FusedConv2d && node.attrs.i("residual_first") != 0;
}

void set_conv_activation(Attrs& attrs, const Act& act) {
  attrs.set("activation", std::string(activation_name(act.kind)));
  attrs.set("alpha", double(act.a));
  attrs.set("beta", double(act.b));
}

}  // namespace epilog
