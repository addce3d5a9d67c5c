// The whole pipeline in one call: optimize (canonicalize, fuse, dead-code elimination) and lower
// a graph for a device. compile() reads no environment; CompileOptions::with_env() applies the
// debug switches:
//   EPILOG_DISABLE_FUSION=1            skip the fusion pass (A/B comparisons)
//   EPILOG_DUMP_DIR=DIR                dump the graph before and after every pass (text, DOT, JSON)
//   EPILOG_FORCE_CONV_KERNEL=scalar|tiled|gemm   one kernel for every fused conv on CUDA
//   EPILOG_DISABLE_IN_PLACE=1          copy every concat and split (A/B comparisons)
//   EPILOG_DISABLE_MEMORY_PLAN=1       every activation in its own buffer (A/B comparisons)
#pragma once

#include <optional>
#include <string>

#include "epilog/graph/lowering.h"
#include "epilog/graph/passes.h"
#include "epilog/runtime/executor.h"

namespace epilog {

struct CompileOptions {
  Device device = Device::CPU;
  bool fuse = true;
  std::string dump_dir;  // empty: no dumps
  std::optional<ConvKernel> force_conv;
  int sm_count = 0;      // 0: the local GPU's, else the default H200 profile
  bool in_place = true;      // the executor's copy avoidance (Plan::in_place)
  bool share_memory = true;  // the executor's memory plan (Plan::share_memory)

  // Applies the EPILOG_* environment switches on top of these options.
  CompileOptions with_env() const;
};

struct Compiled {
  Plan plan;
  PassReport report;
  DeviceProfile profile;
};

Compiled compile(Graph graph, const CompileOptions& options);

// "cpu", "cuda" or "auto" (the GPU when there is one).
Device resolve_device(const std::string& name);
std::unique_ptr<Backend> make_backend(Device device);

// Writes DIR/NN-stage.txt, .dot and .json.
void dump_stage(const std::string& dir, int index, const std::string& stage, const Graph& graph);

}  // namespace epilog
