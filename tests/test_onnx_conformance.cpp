// The ONNX backend test cases of Debian's libonnx-testdata (folders node/, pytorch-converted/,
// pytorch-operator/) imported and run on the CPU. Every case is printed as pass, fail or
// unsupported (the importer threw OnnxUnsupported); a test fails when any case fails.
//
// Match, for every output: NaN where the reference has NaN, the same infinity where it has one,
// and max_i |got_i - want_i| / max_i |want_i| <= 1e-4 over the finite elements (the error
// relative to the output's scale, as test_util.h's max_rel_err; an all-zero reference compares
// absolutely).
//
// epilog graphs are static, so a case's integer inputs (shapes, indices, split sizes) and float
// inputs read only as parameters (Resize/Upsample scales or roi, Dropout's ratio, Clip's
// bounds, Pad's value, CastLike's type, PRelu's slope) are bound as constants from the case's
// data before import, as a model exported with those values would hold them.
//
//   EPILOG_ONNX_TESTDATA=DIR   the data folder (default /usr/share/libonnx-testdata/data)
//   EPILOG_ONNX_CASES=TEXT     only the cases whose name contains TEXT
//   EPILOG_ONNX_DEVICE=cuda    run the cases on the GPU (the GPU script sets it, together with
//                              EPILOG_FORCE_CONV_KERNEL=tiled: the tolerance is float32's, and
//                              gemm's TF32 is held to 2e-3 by the GPU conv tests instead)
#ifdef EPILOG_HAVE_ONNX

#include <onnx/onnx_pb.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "epilog/epilog.h"
#include "epilog/io/onnx.h"
#include "test_util.h"

namespace {

using namespace epilog;
namespace fs = std::filesystem;

constexpr double kTolerance = 1e-4;

// Passes per folder of the full data (libonnx-testdata 1.12), at least.
const std::map<std::string, int> kMinPasses = {
    {"node", 364},
    {"pytorch-converted", 67},
    {"pytorch-operator", 28},
};

Device test_device() {
  const char* d = std::getenv("EPILOG_ONNX_DEVICE");
  return d && std::string(d) == "cuda" ? Device::CUDA : Device::CPU;
}

fs::path data_dir() {
  const char* dir = std::getenv("EPILOG_ONNX_TESTDATA");
  return dir && *dir ? dir : "/usr/share/libonnx-testdata/data";
}

std::string slurp(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// See the top of the file; infinity when NaN or infinities do not line up.
double compare(const Tensor& got, const Tensor& want) {
  const float *g = got.f32(), *w = want.f32();
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (std::isnan(w[i]) || std::isinf(w[i])) {
      bool same = std::isnan(w[i]) ? std::isnan(g[i]) : g[i] == w[i];
      if (!same) return INFINITY;
      continue;
    }
    if (!std::isfinite(g[i])) return INFINITY;
    diff = std::max(diff, std::fabs(double(g[i]) - double(w[i])));
    scale = std::max(scale, std::fabs(double(w[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

enum class Verdict { Pass, Fail, Unsupported };

struct Outcome {
  Verdict verdict;
  std::string detail;
};

// Float inputs that these op slots read are parameters, not data (CastLike reads only the type
// of its second input).
bool param_slot(const std::string& op, int k) {
  return ((op == "Resize" || op == "Upsample" || op == "Dropout" || op == "Clip") && k >= 1) ||
         ((op == "CastLike" || op == "PRelu") && k == 1) || (op == "Pad" && k == 2);
}

// The message without the "<case>: " in front (the list prints the case already).
std::string reason(const std::string& what, const std::string& source) {
  std::string r = what.rfind(source + ": ", 0) == 0 ? what.substr(source.size() + 2) : what;
  size_t list = r.find(" (epilog imports ");
  return list == std::string::npos ? r : r.substr(0, list);
}

Outcome run_case(const fs::path& dir, const std::string& source) {
  onnx::ModelProto model;
  std::string bytes = slurp(dir / "model.onnx");
  if (!model.ParseFromString(bytes)) return {Verdict::Fail, "model.onnx does not parse"};
  const onnx::GraphProto& g = model.graph();
  std::set<std::string> inits;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  std::vector<const onnx::ValueInfoProto*> inputs;
  for (const auto& v : g.input())
    if (!inits.count(v.name())) inputs.push_back(&v);
  std::set<std::string> params, unused;  // read only in parameter slots, read by no node
  for (const auto* v : inputs) {
    bool any = false, all = true;
    for (const auto& n : g.node())
      for (int k = 0; k < n.input_size(); ++k)
        if (n.input(k) == v->name()) {
          any = true;
          all = all && param_slot(n.op_type(), k);
        }
    if (any && all) params.insert(v->name());
    if (!any) unused.insert(v->name());
  }

  std::vector<fs::path> sets;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0)
      sets.push_back(e.path());
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) return {Verdict::Fail, "no test_data_set_* folder"};

  try {
    for (const fs::path& set : sets) {
      onnx::ModelProto bound = model;
      std::map<std::string, Tensor> feed;
      std::vector<std::string> constants;
      for (size_t k = 0; k < inputs.size(); ++k) {
        // Sequences and optionals have no TensorProto; the importer refuses them by type.
        const std::string& name = inputs[k]->name();
        if (!inputs[k]->type().has_tensor_type() || unused.count(name)) continue;
        fs::path file = set / fmt::format("input_{}.pb", k);
        onnx::TensorProto t;
        if (!t.ParseFromString(slurp(file)))
          return {Verdict::Fail, fmt::format("{} does not parse", file.string())};
        // ONNX 1.12 wrote the data of bfloat16 inputs as UINT16 bit patterns.
        const int declared = inputs[k]->type().tensor_type().elem_type();
        if (t.data_type() == onnx::TensorProto::UINT16 &&
            (declared == onnx::TensorProto::BFLOAT16 || declared == onnx::TensorProto::FLOAT16))
          t.set_data_type(declared);
        if (t.data_type() != onnx::TensorProto::FLOAT || params.count(name)) {
          onnx::TensorProto* init = bound.mutable_graph()->add_initializer();
          *init = t;
          init->set_name(name);
          constants.push_back(name);
        } else {
          feed[name] = read_onnx_tensor(file.string());
        }
      }
      std::string text = bound.SerializeAsString();
      Graph graph = parse_onnx(text.data(), text.size(), source, dir.string(), {});
      // An input no node reads only has to be there (some cases' data do not match its shape).
      for (const std::string& name : graph.inputs)
        if (unused.count(name)) feed[name] = Tensor::zeros(graph.value(name).shape);
      CompileOptions co = CompileOptions{}.with_env();
      co.device = test_device();
      Compiled c = compile(std::move(graph), co);
      auto backend = make_backend(co.device);
      Executor ex(c.plan, *backend);
      std::map<std::string, Tensor> got = ex.run(feed);
      for (int k = 0; k < g.output_size(); ++k) {
        const std::string& name = g.output(k).name();
        Tensor want = read_onnx_tensor((set / fmt::format("output_{}.pb", k)).string());
        const Tensor have = got.at(name).to(Device::CPU);
        if (have.shape() != want.shape())
          return {Verdict::Fail, fmt::format("output '{}' has shape {}, expected {}", name,
                                             shape_str(have.shape()), shape_str(want.shape()))};
        double err = compare(have, want);
        if (!(err <= kTolerance))
          return {Verdict::Fail, fmt::format("{}: output '{}' max relative error {:.3g}",
                                             set.filename().string(), name, err)};
      }
      if (set == sets.back() && !constants.empty())
        return {Verdict::Pass, fmt::format("(bound as constants: {})", fmt::join(constants, ", "))};
    }
  } catch (const OnnxUnsupported& e) {
    return {Verdict::Unsupported, reason(e.what(), source)};
  } catch (const std::exception& e) {
    return {Verdict::Fail, reason(e.what(), source)};
  }
  return {Verdict::Pass, ""};
}

void run_folder(const std::string& folder) {
  const fs::path root = data_dir() / folder;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    FAIL("no ONNX test data at " << root.string()
                                 << " (install libonnx-testdata, or set EPILOG_ONNX_TESTDATA to "
                                    "its data folder)");
  }
  const char* filter = std::getenv("EPILOG_ONNX_CASES");
  std::vector<fs::path> cases;
  for (const auto& e : fs::directory_iterator(root))
    if (fs::exists(e.path() / "model.onnx") &&
        (!filter || e.path().filename().string().find(filter) != std::string::npos))
      cases.push_back(e.path());
  std::sort(cases.begin(), cases.end());

  auto t0 = std::chrono::steady_clock::now();
  int counts[3] = {0, 0, 0};
  std::vector<std::string> failures;
  std::printf(
      "ONNX conformance on the %s, %s (%zu cases, tolerance %g relative to each "
      "output's max):\n",
      test_device() == Device::CUDA ? "GPU" : "CPU", root.string().c_str(), cases.size(),
      kTolerance);
  for (const fs::path& dir : cases) {
    const std::string source = folder + "/" + dir.filename().string();
    Outcome o = run_case(dir, source);
    const char* label[] = {"pass", "FAIL", "unsupported"};
    ++counts[int(o.verdict)];
    std::printf("  %-11s %s%s%s\n", label[int(o.verdict)], source.c_str(),
                o.detail.empty() ? "" : ": ", o.detail.c_str());
    if (o.verdict == Verdict::Fail) failures.push_back(source + ": " + o.detail);
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %d pass, %d fail, %d unsupported (%.1f s)\n", folder.c_str(), counts[0],
              counts[1], counts[2], s);
  std::fflush(stdout);
  INFO("failed cases:\n" << fmt::format("{}", fmt::join(failures, "\n")));
  CHECK(failures.empty());
  // A filtered run checks only what it ran.
  if (!filter) {
    INFO(folder << ": " << counts[0] << " cases pass, fewer than the " << kMinPasses.at(folder)
                << " recorded");
    CHECK(counts[0] >= kMinPasses.at(folder));
  }
}

}  // namespace

TEST_CASE("onnx conformance: node", "[onnx][conformance]") {
  run_folder("node");
}

TEST_CASE("onnx conformance: pytorch-converted", "[onnx][conformance]") {
  run_folder("pytorch-converted");
}

TEST_CASE("onnx conformance: pytorch-operator", "[onnx][conformance]") {
  run_folder("pytorch-operator");
}

#endif  // EPILOG_HAVE_ONNX
