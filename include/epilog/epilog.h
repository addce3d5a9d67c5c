// The whole pipeline in one call: optimize (canonicalize, reparameterize, fuse, dead-code
// elimination) and lower a graph for a device. compile() reads no environment;
// CompileOptions::with_env() applies the debug switches:
//   EPILOG_DISABLE_FUSION=1            skip reparameterization and fusion (A/B comparisons)
//   EPILOG_DUMP_DIR=DIR                dump the graph before and after every pass (text, DOT, JSON)
//   EPILOG_FORCE_CONV_KERNEL=scalar|tiled|gemm|gemv   one kernel for every fused conv on CUDA
//   EPILOG_DISABLE_IN_PLACE=1          copy every concat and split (A/B comparisons)
//   EPILOG_DISABLE_MEMORY_PLAN=1       every activation in its own buffer (A/B comparisons)
//   EPILOG_DISABLE_PROLOGUE=1          no batchnorm -> relu folded into a 1x1 conv's loads
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "epilog/graph/lowering.h"
#include "epilog/graph/passes.h"
#include "epilog/runtime/executor.h"

namespace epilog {

struct CompileOptions {
  Device device = Device::CPU;
  bool fuse = true;
  std::string dump_dir;  // empty: no dumps
  std::optional<ConvKernel> force_conv;
  int sm_count = 0;          // 0: the local GPU's, else the default H200 profile
  bool in_place = true;      // the executor's copy avoidance (Plan::in_place)
  bool share_memory = true;  // the executor's memory plan (Plan::share_memory)
  bool prologue = true;      // LowerOptions::prologue (EPILOG_DISABLE_PROLOGUE=1)

  // Applies the EPILOG_* environment switches on top of these options.
  CompileOptions with_env() const;
};

struct Compiled {
  Plan plan;
  PassReport report;
  DeviceProfile profile;
};

Compiled compile(Graph graph, const CompileOptions& options);

// A model to serve: optimized once for a device, run at any batch size from any number of
// threads at once. Who owns what:
//   Model     the optimized graph, its weights on the device (uploaded once and shared by every
//             executor) and, per batch size, a plan lowered on first use and kept;
//   Executor  the execution state of one run in flight (its backend, so on CUDA a stream of its
//             own, its activation arena, its CUDA-graph recording): a Model keeps one per batch
//             size and thread that ran at once, each reused by the next run at that batch;
//   outputs   run() returns tensors that own their memory, on the model's device (copied out of
//             the executor's buffers on its stream); a Session's run() returns views of them.
class Model {
  struct Runner;

 public:
  // An executor held by one caller (a serving thread) until the session ends, at one batch size.
  // Its run() returns outputs that are views of the executor's buffers, valid until the
  // session's next run or its end: no copy, so a run costs what a fresh executor's does. A
  // session is used by one thread at a time and must end before its model.
  class Session {
   public:
    Session(Session&&) noexcept;
    Session& operator=(Session&&) = delete;
    ~Session();  // hands the executor back to the model
    std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs);
    int64_t batch() const { return batch_; }

   private:
    friend class Model;
    Session(Model& model, int64_t batch, std::unique_ptr<Runner> runner);
    Model* model_;
    int64_t batch_;
    std::unique_ptr<Runner> runner_;
  };

 public:
  // Optimizes `graph` (at whatever batch it has) for options.device.
  Model(Graph graph, const CompileOptions& options);
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // The batch is the inputs' dim 0; the other dims must be the graph's. Thread-safe.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs);
  // The plan for a batch size (lowered on first use). Thread-safe.
  std::shared_ptr<const Plan> plan(int64_t batch);
  // A session at `batch` (its plan lowered on first use). Thread-safe.
  Session session(int64_t batch);
  const PassReport& report() const { return report_; }
  Device device() const { return options_.device; }

 private:
  struct Runner {  // an executor and the backend it runs on
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Executor> executor;
  };
  std::unique_ptr<Runner> take(int64_t batch);
  void give_back(int64_t batch, std::unique_ptr<Runner> runner);

  CompileOptions options_;
  Graph graph_;  // optimized
  PassReport report_;
  std::mutex mu_;  // guards what follows
  std::map<int64_t, std::shared_ptr<const Plan>> plans_;
  std::map<int64_t, std::vector<std::unique_ptr<Runner>>> idle_;
  std::mutex upload_mu_;                                          // guards what follows
  std::shared_ptr<const std::map<std::string, Tensor>> weights_;  // on the device, once made
};

// "cpu", "cuda" or "auto" (the GPU when there is one).
Device resolve_device(const std::string& name);
std::unique_ptr<Backend> make_backend(Device device);

// Writes DIR/NN-stage.txt, .dot and .json.
void dump_stage(const std::string& dir, int index, const std::string& stage, const Graph& graph);

}  // namespace epilog
