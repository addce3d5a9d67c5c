#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "epilog/epilog.h"
#include "epilog/io/dump.h"

namespace epilog {

CompileOptions CompileOptions::with_env() const {
  CompileOptions o = *this;
  if (const char* v = std::getenv("EPILOG_DISABLE_FUSION"); v && std::string(v) == "1")
    o.fuse = false;
  if (const char* v = std::getenv("EPILOG_DUMP_DIR"); v && *v) o.dump_dir = v;
  if (const char* v = std::getenv("EPILOG_DISABLE_IN_PLACE"); v && std::string(v) == "1")
    o.in_place = false;
  if (const char* v = std::getenv("EPILOG_DISABLE_MEMORY_PLAN"); v && std::string(v) == "1")
    o.share_memory = false;
  if (const char* v = std::getenv("EPILOG_FORCE_CONV_KERNEL"); v && *v) {
    o.force_conv = parse_conv_kernel(v);
    if (!o.force_conv) fail("EPILOG_FORCE_CONV_KERNEL='{}': expected scalar, tiled or gemm", v);
  }
  return o;
}

void dump_stage(const std::string& dir, int index, const std::string& stage, const Graph& graph) {
  std::filesystem::create_directories(dir);
  std::string base = fmt::format("{}/{:02d}-{}", dir, index, stage);
  for (auto [ext, format] :
       {std::pair{".txt", DumpFormat::Text}, std::pair{".dot", DumpFormat::Dot},
        std::pair{".json", DumpFormat::Json}}) {
    std::ofstream f(base + ext);
    f << dump(graph, format);
    if (!f) fail("cannot write dump '{}{}'", base, ext);
  }
}

Compiled compile(Graph graph, const CompileOptions& options) {
  Compiled c;
  PassOptions po;
  po.fuse = options.fuse;
  if (!options.dump_dir.empty())
    po.on_stage = [&](int i, const std::string& stage, const Graph& g) {
      dump_stage(options.dump_dir, i, stage, g);
    };
  c.report = optimize(graph, po);
  LowerOptions lo;
  lo.device = options.device;
  lo.force = options.force_conv;
  // Only a CUDA target asks for the local GPU: a compile for the CPU leaves CUDA uninitialised.
  if (options.device == Device::CUDA)
    if (auto local = cuda_device_profile()) lo.profile = *local;
  if (options.sm_count > 0) {
    lo.profile.sm_count = options.sm_count;
    lo.profile.name += fmt::format(", {} SMs given", options.sm_count);
  }
  c.profile = lo.profile;
  c.plan = lower(std::move(graph), lo);
  c.plan.in_place = options.in_place;
  c.plan.share_memory = options.share_memory;
  if (!options.dump_dir.empty()) {
    std::ofstream f(options.dump_dir + "/lowered.txt");
    f << explain(c.plan, in_place_mask(c.plan));
  }
  return c;
}

Device resolve_device(const std::string& name) {
  if (name == "cpu") return Device::CPU;
  if (name == "cuda") {
    if (!cuda_available()) fail("--device cuda: no CUDA device is available on this machine");
    return Device::CUDA;
  }
  if (name == "auto") return cuda_available() ? Device::CUDA : Device::CPU;
  fail("unknown device '{}' (expected cpu, cuda or auto)", name);
}

std::unique_ptr<Backend> make_backend(Device device) {
  if (device == Device::CPU) return make_cpu_backend();
  auto b = make_cuda_backend();
  if (!b) fail("no CUDA backend: this build has no CUDA support or there is no device");
  return b;
}

}  // namespace epilog
