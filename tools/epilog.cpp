// The epilog command line: run, dump, explain and bench a model.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "epilog/epilog.h"
#include "epilog/io/dump.h"
#include "epilog/io/model.h"
#include "epilog/io/npy.h"

namespace {

using namespace epilog;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// -- a small option parser that also writes each subcommand's --help --

struct Option {
  std::string name;   // "--device"; flags take no value
  std::string value;  // metavar, empty for a flag
  std::string help;
  std::string fallback;
  bool repeat = false;
};

struct Command {
  std::string name, args, summary;
  std::vector<Option> options;
};

struct Parsed {
  std::string model;
  std::map<std::string, std::vector<std::string>> values;
  bool flag(const std::string& n) const { return values.count(n) != 0; }
  std::string get(const std::string& n, const std::string& fallback = "") const {
    auto it = values.find(n);
    return it == values.end() ? fallback : it->second.back();
  }
};

void print_help(const Command& c, FILE* to) {
  std::fprintf(to, "usage: epilog %s %s\n\n%s\n\noptions:\n", c.name.c_str(), c.args.c_str(),
               c.summary.c_str());
  for (const Option& o : c.options) {
    std::string lhs = o.name + (o.value.empty() ? "" : " " + o.value);
    std::string rhs = o.help + (o.fallback.empty() ? "" : " (default: " + o.fallback + ")");
    std::fprintf(to, "  %-24s %s\n", lhs.c_str(), rhs.c_str());
  }
  std::fprintf(to, "  %-24s %s\n", "-h, --help", "show this help");
}

int64_t to_int(const std::string& option, const std::string& v, int64_t min) {
  try {
    size_t used = 0;
    long long x = std::stoll(v, &used);
    if (used == v.size() && x >= min) return x;
  } catch (const std::exception&) {
  }
  fail("{}: expected an integer >= {}, got '{}'", option, min, v);
}

// bench's --warmup-ms: a GPU that ran lighter work (another batch size, or nothing) before takes
// a while to reach its clocks; a few runs timed it up to 1.8% slow.
double warmup_ms_for(const Parsed& p, Device device) {
  const char* fallback = device == Device::CUDA ? "500" : "0";
  return double(to_int("--warmup-ms", p.get("--warmup-ms", fallback), 0));
}

// Returns false when --help was shown.
bool parse_args(const Command& c, int argc, char** argv, Parsed& p) {
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      print_help(c, stdout);
      return false;
    }
    if (a.size() > 1 && a[0] == '-') {
      auto it = std::find_if(c.options.begin(), c.options.end(),
                             [&](const Option& o) { return o.name == a; });
      if (it == c.options.end()) fail("unknown option '{}' (see epilog {} --help)", a, c.name);
      if (it->value.empty()) {
        p.values[a].push_back("1");
        continue;
      }
      if (i + 1 >= argc) fail("option {} needs a value {}", a, it->value);
      if (!it->repeat) p.values[a].clear();
      p.values[a].push_back(argv[++i]);
    } else if (p.model.empty()) {
      p.model = a;
    } else {
      fail("unexpected argument '{}'", a);
    }
  }
  if (p.model.empty()) fail("no MODEL given (see epilog {} --help)", c.name);
  return true;
}

const std::vector<Option> kModelOptions = {
    {"--weights", "FILE", "safetensors file with the model's weights", "", false},
    {"--batch", "N", "rebind the batch dimension of the inputs (bench: N,M,... sweeps)", "", false},
    {"--no-fuse", "", "skip reparameterization and fusion (also EPILOG_DISABLE_FUSION=1)", "",
     false},
    {"--dump-passes", "DIR", "dump the graph before and after every pass (also EPILOG_DUMP_DIR)",
     "", false},
};
const Option kDevice{"--device", "cpu|cuda|auto", "where to run", "auto", false};

std::vector<Option> with_model_options(std::vector<Option> own) {
  own.insert(own.end(), kModelOptions.begin(), kModelOptions.end());
  return own;
}

// --batch N, or for bench a list N,M,...
std::vector<int64_t> batches(const Parsed& p) {
  std::vector<int64_t> out;
  const std::string list = p.get("--batch");
  for (size_t at = 0; !list.empty() && at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    out.push_back(to_int("--batch", list.substr(at, comma - at), 1));
    at = comma + 1;
  }
  return out;
}

Graph load(const Parsed& p) {
  LoadOptions lo;
  lo.weights_file = p.get("--weights");
  const std::vector<int64_t> b = batches(p);
  if (b.size() > 1) fail("--batch {}: one batch size here (bench sweeps a list)", p.get("--batch"));
  if (!b.empty()) lo.batch = b[0];
  return load_model(p.model, lo);
}

CompileOptions options_for(const Parsed& p, Device device) {
  CompileOptions co;
  co.device = device;
  co.fuse = !p.flag("--no-fuse");
  co.dump_dir = p.get("--dump-passes");
  if (p.flag("--sm-count")) co.sm_count = int(to_int("--sm-count", p.get("--sm-count"), 1));
  return co.with_env();
}

Compiled compile_for(const Parsed& p, Graph g, Device device) {
  return compile(std::move(g), options_for(p, device));
}

// Progress on a terminal only, so that logs stay clean.
void progress(const char* what, size_t done, size_t total) {
  static const bool tty = isatty(fileno(stderr));
  if (!tty) return;
  std::fprintf(stderr, "\r%s %zu/%zu", what, done, total);
  if (done == total) std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

void print_fused_kernels(const Plan& plan) {
  bool any = false;
  for (size_t i = 0; i < plan.graph.nodes.size(); ++i) {
    const Node& n = plan.graph.nodes[i];
    if (n.op != OpKind::FusedConv2d) continue;
    any = true;
    std::printf("  %-28s act=%-8s kernel %-7s (%s)\n", n.name.c_str(),
                n.attrs.s("activation").c_str(), plan.nodes[i].kernel.c_str(),
                plan.nodes[i].rule.c_str());
  }
  if (!any) std::printf("  (no fused_conv2d nodes)\n");
}

std::map<std::string, Tensor> make_inputs(const Parsed& p, const Graph& g) {
  std::map<std::string, Tensor> inputs;
  for (const std::string& spec :
       p.values.count("--input") ? p.values.at("--input") : std::vector<std::string>{}) {
    auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0) fail("--input '{}': expected NAME=FILE.npy", spec);
    std::string name = spec.substr(0, eq);
    if (!g.is_input(name))
      fail("--input {}: the model has no input '{}' (inputs: {})", spec, name,
           fmt::join(g.inputs, ", "));
    Tensor t = read_npy(spec.substr(eq + 1));
    const Shape& want = g.value(name).shape;
    const Shape& got = t.shape();
    if (got != want) {
      const bool batch_only = got.size() == want.size() && !got.empty() &&
                              std::equal(got.begin() + 1, got.end(), want.begin() + 1);
      if (batch_only)
        fail("--input {}: a batch of {}, the model is loaded at batch {}: add --batch {}", spec,
             got[0], want[0], got[0]);
      fail("--input {}: shape {}, the model's input '{}' is {}", spec, shape_str(got), name,
           shape_str(want));
    }
    inputs[name] = std::move(t);
  }
  uint64_t seed = p.flag("--seed") ? uint64_t(to_int("--seed", p.get("--seed"), 0)) : 0;
  for (const std::string& name : g.inputs)
    if (!inputs.count(name))
      inputs[name] = Tensor::randn(g.value(name).shape, hash_string(name, seed));
  return inputs;
}

std::string file_safe(std::string name) {
  for (char& c : name)
    if (c == '/' || c == '\\' || c == ':') c = '_';
  return name;
}

int cmd_run(const Parsed& p) {
  auto t0 = Clock::now();
  Graph g = load(p);
  Device device = resolve_device(p.get("--device", "auto"));
  if (p.flag("--show-graphs")) std::printf("== graph before fusion\n%s", dump_text(g).c_str());
  Compiled c = compile_for(p, std::move(g), device);
  if (p.flag("--show-graphs"))
    std::printf("== graph after fusion (%s)\n%s", c.report.summary().c_str(),
                dump_text(c.plan.graph).c_str());
  else
    std::printf("passes: %s\n", c.report.summary().c_str());
  double prep_ms = ms_since(t0);
  const Graph& graph = c.plan.graph;
  std::map<std::string, Tensor> inputs = make_inputs(p, graph);

  std::printf("kernels on %s:\n", device_name(device));
  print_fused_kernels(c.plan);
  if (device == Device::CPU) {
    // What the same graph would run on a GPU, so that the choice shows on any machine.
    LowerOptions gpu;
    gpu.device = Device::CUDA;
    gpu.profile = h200_profile();
    std::printf("kernels on a CUDA GPU (%s; tiles: epilog explain):\n", gpu.profile.name.c_str());
    print_fused_kernels(lower(c.plan.graph, gpu));
  }
  auto backend = make_backend(device);
  Executor ex(c.plan, *backend);
  ex.set_progress([](size_t done, size_t total) { progress("running node", done, total); });
  auto t1 = Clock::now();
  auto outs = ex.run(inputs);
  double run_ms = ms_since(t1);

  std::string out_dir = p.get("--output");
  if (!out_dir.empty()) std::filesystem::create_directories(out_dir);
  std::printf("outputs:\n");
  for (const std::string& name : graph.outputs) {
    Tensor t = outs.at(name).to(Device::CPU);
    const float* v = t.f32();
    double sum = 0, lo = v[0], hi = v[0];
    for (int64_t i = 0; i < t.numel(); ++i) {
      sum += v[i];
      lo = std::min<double>(lo, v[i]);
      hi = std::max<double>(hi, v[i]);
    }
    std::string bytes(static_cast<const char*>(t.raw()), t.nbytes());
    std::printf("  %-24s %-18s min %10.5f max %10.5f mean %11.6f checksum %016llx\n", name.c_str(),
                shape_str(t.shape()).c_str(), lo, hi, sum / double(t.numel()),
                static_cast<unsigned long long>(hash_string(bytes)));
    if (!out_dir.empty()) write_npy(out_dir + "/" + file_safe(name) + ".npy", t);
  }
  std::printf("time: load+compile %.1f ms, run %.2f ms on %s\n", prep_ms, run_ms,
              device_name(device));
  std::printf("memory: %s\n", memory_use(c.plan).summary().c_str());
  return 0;
}

int cmd_dump(const Parsed& p) {
  std::string stage = p.get("--stage", "fused");
  DumpFormat format = parse_dump_format(p.get("--format", "text"));
  if (stage != "source" && stage != "fused" && stage != "lowered")
    fail("--stage '{}': expected source, fused or lowered", stage);
  Graph g = load(p);
  std::string text;
  std::string note;
  if (stage == "source") {
    text = dump(g, format);
  } else {
    Compiled c = compile_for(p, std::move(g), resolve_device(p.get("--device", "auto")));
    note = c.report.summary();
    if (stage == "fused") {
      text = dump(c.plan.graph, format);
    } else if (format == DumpFormat::Json) {
      nlohmann::ordered_json j = to_json(c.plan.graph);
      const std::vector<NodeChoice> choices = node_choices(c.plan, in_place_mask(c.plan));
      for (size_t i = 0; i < c.plan.nodes.size(); ++i)
        j["lowering"][c.plan.graph.nodes[i].name] = {
            {"kernel", choices[i].kernel}, {"tiles", choices[i].tiles}, {"rule", choices[i].rule}};
      text = j.dump(1) + "\n";
    } else if (format == DumpFormat::Text) {
      text = explain(c.plan, in_place_mask(c.plan));
    } else {
      text = dump(c.plan.graph, format);
    }
  }
  std::string out = p.get("-o");
  if (out.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
  } else {
    std::ofstream f(out);
    f << text;
    if (!f) fail("cannot write '{}'", out);
  }
  if (!note.empty()) std::fprintf(stderr, "%s\n", note.c_str());
  return 0;
}

int cmd_explain(const Parsed& p) {
  Graph g = load(p);
  std::string dev = p.get("--device", "cuda");
  // explain shows the GPU lowering even on a machine without a GPU.
  Device device = dev == "cpu" ? Device::CPU : Device::CUDA;
  if (dev != "cpu" && dev != "cuda") fail("--device '{}': expected cpu or cuda", dev);
  Compiled c = compile_for(p, std::move(g), device);
  std::printf("target: %s, %s (%d SMs)\npasses: %s\n", device_name(device), c.profile.name.c_str(),
              c.profile.sm_count, c.report.summary().c_str());
  for (const std::string& r : c.report.refusals) std::printf("not fused: %s\n", r.c_str());
  std::printf("memory: %s\n", memory_use(c.plan).summary().c_str());
  std::printf("%s", explain(c.plan, in_place_mask(c.plan)).c_str());
  return 0;
}

// Untimed runs, at least `warmup` of them and for at least `warmup_ms`, then the times of
// `iters` runs in ms, sorted.
std::vector<double> time_runs(const std::function<void()>& run, int64_t warmup, double warmup_ms,
                              int64_t iters) {
  const auto start = Clock::now();
  for (int64_t i = 0; i < warmup || ms_since(start) < warmup_ms; ++i) {
    run();
    if (i < warmup) progress("warm-up", size_t(i + 1), size_t(warmup));
  }
  std::vector<double> times;
  for (int64_t i = 0; i < iters; ++i) {
    auto t0 = Clock::now();
    run();
    times.push_back(ms_since(t0));
    progress("iteration", size_t(i + 1), size_t(iters));
  }
  std::sort(times.begin(), times.end());
  return times;
}

// bench --batch N,M,...: one Model, a plan per batch size, each timed end to end.
int bench_sweep(const Parsed& p, const std::vector<int64_t>& sizes) {
  LoadOptions lo;
  lo.weights_file = p.get("--weights");
  // A symbolic batch dim needs a size to load at; the Model plans each batch from there.
  lo.batch = sizes[0];
  Graph g = load_model(p.model, lo);
  const Device device = resolve_device(p.get("--device", "auto"));
  Model model(g, options_for(p, device));
  const int64_t iters = to_int("--iters", p.get("--iters", "20"), 1);
  const int64_t warmup = to_int("--warmup", p.get("--warmup", "3"), 0);
  const double warmup_ms = warmup_ms_for(p, device);
  const uint64_t seed = p.flag("--seed") ? uint64_t(to_int("--seed", p.get("--seed"), 0)) : 0;
  std::printf("%s on %s, %s; end to end (inputs in, outputs left in a session's buffers), %lld "
              "iterations each\n",
              p.model.c_str(), device_name(device), model.report().summary().c_str(),
              (long long)iters);
  for (const int64_t batch : sizes) {
    std::map<std::string, Tensor> inputs;
    for (const std::string& name : g.inputs) {
      Shape shape = g.value(name).shape;
      if (shape.empty()) fail("--batch: input '{}' is a scalar", name);
      shape[0] = batch;
      inputs[name] = Tensor::randn(shape, hash_string(name, seed)).to(device);
    }
    // A session, as a serving thread holds one: outputs stay in the executor's buffers.
    Model::Session session = model.session(batch);
    const std::vector<double> times =
        time_runs([&] { session.run(inputs); }, warmup, warmup_ms, iters);
    const double median = times[times.size() / 2];
    const MemoryUse mem = memory_use(*model.plan(batch));
    const double mib = double(1 << 20);
    std::printf(
        "  batch %-5lld median %9.3f ms  min %9.3f ms  %10.1f images/s  activations %.1f MiB  "
        "workspace %.1f MiB  inputs and outputs %.1f MiB\n",
        (long long)batch, median, times.front(), 1000.0 * double(batch) / median,
        double(mem.activations) / mib, double(mem.workspace) / mib,
        double(mem.inputs_outputs) / mib);
  }
  return 0;
}

int cmd_bench(const Parsed& p) {
  if (const std::vector<int64_t> sizes = batches(p); sizes.size() > 1) return bench_sweep(p, sizes);
  Graph g = load(p);
  Device device = resolve_device(p.get("--device", "auto"));
  Compiled c = compile_for(p, std::move(g), device);
  int64_t iters = to_int("--iters", p.get("--iters", "20"), 1);
  int64_t warmup = to_int("--warmup", p.get("--warmup", "3"), 0);
  const double warmup_ms = warmup_ms_for(p, device);
  auto inputs = make_inputs(p, c.plan.graph);
  auto backend = make_backend(device);
  Executor ex(c.plan, *backend);
  for (auto& [name, t] : inputs) t = t.to(device);
  const std::vector<double> times = time_runs([&] { ex.run(inputs); }, warmup, warmup_ms, iters);
  std::printf("%s on %s, %s\n", p.model.c_str(), device_name(device), c.report.summary().c_str());
  std::printf("memory: %s\n", memory_use(c.plan).summary().c_str());
  std::printf("end to end: median %.3f ms, min %.3f ms, max %.3f ms over %lld iterations\n",
              times[times.size() / 2], times.front(), times.back(), (long long)times.size());
  if (ex.replaying()) {
    // The model alone: one CUDA-graph launch, no input copy.
    std::vector<double> replays;
    for (int64_t i = 0; i < iters; ++i) {
      auto t0 = Clock::now();
      ex.replay();
      replays.push_back(ms_since(t0));
    }
    std::sort(replays.begin(), replays.end());
    std::printf("graph replay: median %.3f ms, min %.3f ms, max %.3f ms\n",
                replays[replays.size() / 2], replays.front(), replays.back());
  }

  // Per node: profiled runs synchronize after every node, so they add a little overhead.
  ex.set_profile(true);
  int64_t prof_iters = std::min<int64_t>(iters, 5);
  std::map<std::string, std::vector<double>> per_node;
  for (int64_t i = 0; i < prof_iters; ++i) {
    ex.run(inputs);
    for (const NodeTiming& t : ex.timings()) per_node[t.node].push_back(t.ms);
  }
  struct Row {
    std::string node, op, kernel;
    double ms;
  };
  std::vector<Row> rows;
  double total = 0;
  const std::vector<NodeChoice> choices = node_choices(c.plan, in_place_mask(c.plan));
  for (size_t i = 0; i < c.plan.graph.nodes.size(); ++i) {
    const Node& n = c.plan.graph.nodes[i];
    auto& v = per_node[n.name];
    std::sort(v.begin(), v.end());
    rows.push_back({n.name, op_name(n.op), choices[i].kernel, v[v.size() / 2]});
    total += rows.back().ms;
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
  std::printf("per node (median of %lld profiled runs, sum %.3f ms):\n", (long long)prof_iters,
              total);
  for (const Row& r : rows)
    std::printf("  %-28s %-16s %-8s %9.3f ms %5.1f%%\n", r.node.c_str(), r.op.c_str(),
                r.kernel.c_str(), r.ms, 100.0 * r.ms / total);
  return 0;
}

void print_usage(FILE* to) {
  std::fprintf(to,
               "usage: epilog <command> MODEL [options]\n\n"
               "Loads a model (.json, .onnx), fuses conv -> batchnorm -> activation chains and\n"
               "runs it on the GPU or the CPU.\n\n"
               "commands:\n"
               "  run      run a model on seeded random (or given) inputs, print its outputs\n"
               "  dump     print the graph before or after fusion (text, dot, json)\n"
               "  explain  show the kernel chosen for every node and why\n"
               "  bench    time a model end to end and per node\n\n"
               "  epilog <command> --help   options of a command\n"
               "  epilog --version          print the version\n");
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<Command> commands = {
      {"run", "MODEL [options]",
       "Runs MODEL and prints each output's shape, statistics and checksum.",
       with_model_options(
           {kDevice,
            {"--input", "NAME=FILE.npy", "an input (repeatable); others are seeded random", "",
             true},
            {"--output", "DIR", "write each output as DIR/NAME.npy", "", false},
            {"--seed", "N", "seed of the random inputs", "0", false},
            {"--show-graphs", "", "print the graph before and after fusion", "", false}})},
      {"dump", "MODEL [options]", "Prints the graph of MODEL at a stage of the pipeline.",
       with_model_options({{"--stage", "source|fused|lowered", "which graph", "fused", false},
                           {"--format", "text|dot|json", "output format", "text", false},
                           {"-o", "FILE", "write to FILE instead of stdout", "", false},
                           kDevice})},
      {"explain", "MODEL [options]",
       "For every node of the lowered graph: op, shapes, chosen kernel, the rule that chose it\n"
       "and the tile sizes. Works without a GPU (a default H200 profile is used).",
       with_model_options({{"--device", "cpu|cuda", "target to lower for", "cuda", false},
                           {"--sm-count", "N",
                            "SM count of the target (default: local GPU, else 132)", "", false}})},
      {"bench", "MODEL [options]",
       "Times MODEL: warm-up, timed iterations (median/min/max), then a per-node breakdown.",
       with_model_options({kDevice,
                           {"--iters", "N", "timed iterations", "20", false},
                           {"--warmup", "N", "untimed iterations first, at least", "3", false},
                           {"--warmup-ms", "MS",
                            "and untimed iterations for at least this long (GPU clocks settle)",
                            "500 on cuda, 0 on cpu", false},
                           {"--seed", "N", "seed of the random inputs", "0", false}})},
  };
  std::map<std::string, std::function<int(const Parsed&)>> handlers = {
      {"run", cmd_run}, {"dump", cmd_dump}, {"explain", cmd_explain}, {"bench", cmd_bench}};

  if (argc < 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") {
    print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string name = argv[1];
  if (name == "--version") {
    std::printf("epilog %s (%s)\n", EPILOG_VERSION,
                cuda_available() ? "CUDA device found" : "no CUDA device, CPU backend");
    return 0;
  }
  auto cmd = std::find_if(commands.begin(), commands.end(),
                          [&](const Command& c) { return c.name == name; });
  if (cmd == commands.end()) {
    std::fprintf(stderr, "epilog: unknown command '%s'\n\n", name.c_str());
    print_usage(stderr);
    return 2;
  }
  try {
    Parsed p;
    if (!parse_args(*cmd, argc - 2, argv + 2, p)) return 0;
    return handlers.at(name)(p);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "epilog %s: %s\n", name.c_str(), e.what());
    return 1;
  }
}
