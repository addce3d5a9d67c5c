// Runs a graph on a backend: named inputs in, named outputs out.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "epilog/runtime/plan.h"

namespace epilog {

// One device's kernels, keyed by op kind. Outputs arrive allocated with the inferred shapes on
// the backend's device; a view op may replace them with views of its input.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  // Throws Error "[op] has no <device> implementation" for an op it lacks. `inputs` are the
  // node's, then for a conv reading through a folded upsampling (NodePlan::up) its source.
  virtual void run(const Node& node, const NodePlan& plan, const std::vector<Tensor>& inputs,
                   std::vector<Tensor>& outputs) = 0;
  // Waits for queued work (a no-op on the CPU).
  virtual void synchronize() {}
  // Copies src into dst (same shape and dtype) after the work queued so far: on CUDA a copy
  // between contiguous device tensors is queued on the backend's stream (done by the next
  // synchronize()); any other copy is Tensor::copy_from, a full barrier.
  virtual void copy(const Tensor& src, Tensor& dst) { dst.copy_from(src); }

  // A replayable recording of the launches some code made (a CUDA graph): one launch replays a
  // whole model, without the host cost of each kernel.
  class Recording {
   public:
    virtual ~Recording() = default;
    virtual void replay() = 0;
  };
  virtual bool can_record() const { return false; }
  // Records what `body` launches on this backend (only where can_record()).
  virtual std::unique_ptr<Recording> record(const std::function<void()>& body) {
    (void)body;
    fail("{} backend cannot record launches", device_name(device()));
  }
};

std::unique_ptr<Backend> make_cpu_backend();
// Null when this build or machine has no CUDA device.
std::unique_ptr<Backend> make_cuda_backend();
// Asks the CUDA runtime for a usable device once (later calls answer from memory).
bool cuda_available();
// How often this process called cuda_available (so also cuda_device_profile and
// make_cuda_backend): tests check that compiling for the CPU asks nothing of CUDA.
int cuda_probes();
// The local GPU's name and SM count; nullopt without one.
std::optional<DeviceProfile> cuda_device_profile();

// The copies the executor avoids in `g` (Executor::set_in_place says which): by node index,
// whether a split returns views of its input, whether a concat finds its inputs already in its
// buffer, and whether it is the start of a longer concat's (its inputs begin that one's: DenseNet);
// and, for each value made straight into a concat's buffer, where.
struct InPlacePlan {
  struct Slot {
    std::string buffer;  // the concat output whose buffer holds the value
    int64_t offset;      // in elements, within each item of dim 0
  };
  std::vector<bool> view;
  std::vector<bool> concat;
  // Each split part and concat prefix made a view: the value it is part of.
  std::map<std::string, std::string> base;
  // The nodes whose work another does (NodePlan::folded_into): the upsamplings folded into a
  // conv's loads whose concat runs in place (nothing reads what they would write) and the
  // chained max-pools (empty from the Graph form).
  std::vector<bool> folded;
  // By node, the node folded into it, or -1 (empty from the Graph form): the upsampling a conv
  // reads through (NodePlan::up), the conv before it whose input it reads (NodePlan::pre), the
  // 1x1 conv it runs on its accumulators (NodePlan::post), the elementwise it applies to its
  // input (NodePlan::pro).
  std::vector<int> up, pre, post, pro;
  std::map<std::string, Slot> slots;
  // Whether node i runs without a kernel: a view, an in-place concat or a folded node.
  bool no_kernel(size_t i) const {
    return view[i] || concat[i] || (i < folded.size() && folded[i]);
  }
};
InPlacePlan plan_in_place(const Graph& g);
InPlacePlan plan_in_place(const Plan& plan);
// By node, whether it runs without a kernel under `plan` (a view, an in-place concat or a folded
// upsampling; none when plan.in_place is off): what explain marks.
std::vector<bool> in_place_mask(const Plan& plan);

// Where the executor puts a value: `offset` elements into a 256-byte aligned allocation (its own,
// the arena's, or the buffer it is a view or a concat slot of), its items `item_stride` elements
// apart (0: contiguous), as Tensor::part makes them. Values not listed sit at {0, 0}. `ip` empty
// (InPlacePlan{}): copy avoidance off. What explain tells the launchers' choices from (launch.h:
// x's alignment and image stride).
struct ValuePlace {
  int64_t offset = 0, item_stride = 0;
};
std::map<std::string, ValuePlace> value_places(const Graph& g, const InPlacePlan& ip);

// Where the executor keeps the activations while sharing memory (Executor::set_memory_plan):
// every value that owns storage (a kernel's output, an in-place concat's buffer) is live from the
// first node that makes it or a value stored in it to the last node that reads one, and takes
// bytes of one arena that no value live at the same time takes. Views (split parts, concat slots)
// lie in their owner's bytes. Graph inputs, weights and the owners of graph outputs stay out of
// the arena (a caller keeps the outputs). Planned once, the same for every run, so the pointers
// a CUDA graph recorded stay valid across replays.
struct MemoryPlan {
  static constexpr size_t kAlign = 256;  // bytes: cudaMalloc's alignment, enough for TMA
  struct Block {
    size_t offset = 0, bytes = 0;  // in the arena; bytes rounded up to kAlign
    size_t first = 0, last = 0;    // the nodes that first make and last read it (inclusive)
  };
  std::map<std::string, Block> blocks;  // by owning value
  size_t arena_bytes = 0;               // the peak: the end of the highest block
  size_t unshared_bytes = 0;            // the blocks' bytes summed: what no sharing takes
  size_t outside_bytes = 0;             // the owners of graph inputs and outputs
};
// `in_place`: with the executor's copy avoidance on (ip's views, slots and folds) or off.
MemoryPlan plan_memory(const Plan& plan, const InPlacePlan& ip, bool in_place);

// A plan's device memory, in bytes: its weights (with their packed copies), its activations at
// peak (Plan::share_memory; else all of them at once, as the executor keeps them without
// sharing), what they would take unshared, its inputs and outputs, and the kernels' scratch
// space (none of them takes any today).
struct MemoryUse {
  size_t weights = 0, activations = 0, unshared = 0, inputs_outputs = 0, workspace = 0;
  std::string summary() const;  // in MiB
};
MemoryUse memory_use(const Plan& plan);

struct NodeTiming {
  std::string node;
  OpKind op;
  double ms;
};

class Executor {
 public:
  // Copies weights to the backend's device once. The plan must be lowered for that device.
  // Out of device memory here or in run(), throws OutOfMemory naming what was being allocated;
  // what was allocated is released, so that a smaller batch can run after it.
  // `weights`: the graph's weights already on the backend's device, shared with other
  // executors (a Model's); null: uploaded here.
  Executor(Plan plan, Backend& backend,
           std::shared_ptr<const std::map<std::string, Tensor>> weights = nullptr);
  // The weights on the device, to share with another executor of the same graph's weights.
  std::shared_ptr<const std::map<std::string, Tensor>> weights() const { return weights_; }

  // Inputs by name (on any device; checked against the graph's shapes). Outputs come back on
  // the backend's device. With recording on (the default) and a backend that can record, the
  // first run keeps every intermediate where it made it and records the launches, and later
  // runs replay the recording: then the returned outputs share the executor's buffers and hold
  // until the next run(). Without recording, the outputs own their memory. Either way the
  // intermediates share the memory plan's arena (set_memory_plan); with it off, each has a
  // buffer of its own, kept while recording, else freed after its last reader.
  // Outputs::Owned copies outputs that would share the executor's buffers into memory of their
  // own, queued with the run (no barrier per output): what a caller that keeps them needs.
  enum class Outputs { Views, Owned };
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs,
                                    Outputs outputs = Outputs::Views);
  void set_recording(bool on) { recording_on_ = on; }
  bool replaying() const { return recording_ != nullptr; }
  // Replays the recording on the inputs of the last run and waits for it: the device time of
  // the model alone, for benchmarks. Needs a recording (replaying()).
  void replay();

  // With profiling on, run() synchronizes after each node and records its time.
  void set_profile(bool on) { profile_ = on; }
  const std::vector<NodeTiming>& timings() const { return timings_; }
  // Called after each node with (done, total): progress for long CPU runs.
  void set_progress(std::function<void(size_t, size_t)> fn) { progress_ = std::move(fn); }
  const Graph& graph() const { return plan_.graph; }

  // Copies the executor avoids (on by default; off for A/B comparisons, before the first run):
  // a split whose parts are runs of every item of its input (nothing but ones between dim 0
  // and the axis, as a chunk of an NCHW batch on the channels) returns views; a concat of such
  // runs has the producers of its inputs write straight into its output buffer and then costs
  // nothing. With a batch over 1 those views are strided (Tensor::part), so they are made only
  // where every kernel that writes or reads them takes strides (fused_conv2d, conv2d, add of
  // equal shapes, max-pooling, upsampling, concat, split). An upsampling folded into a conv's
  // loads (FoldedUpsample) whose concat runs so runs no kernel: the conv reads its input. Nor
  // does a max-pool chained to the one before it (NodePlan::chain): the first pool makes it, nor
  // a conv folded into the next one's loads (FoldedConv): that one's kernel reads its input,
  // nor a 1x1 conv run on the accumulators of the conv before it (a conv chain).
  // Starts as the plan says (Plan::in_place; EPILOG_DISABLE_IN_PLACE=1 turns it off).
  void set_in_place(bool on) {
    in_place_on_ = on;
    memory_.reset();
  }
  // Activations share one arena by liveness (plan_memory; on by default, off for A/B
  // comparisons, before the first run): planned and allocated on the first run. Starts as the
  // plan says (Plan::share_memory; EPILOG_DISABLE_MEMORY_PLAN=1 turns it off).
  void set_memory_plan(bool on) {
    share_memory_ = on;
    memory_.reset();
  }
  // The plan the executor follows; null before the first run or with sharing off.
  const MemoryPlan* memory_plan() const { return memory_.get(); }
  // The nodes that run as views, in place or folded (node order); none when it is off.
  std::vector<std::string> in_place_nodes() const;

 private:
  // No member refers into another: an executor may be moved (kept in a growing vector).
  Plan plan_;
  Backend& backend_;
  std::shared_ptr<const std::map<std::string, Tensor>> weights_;  // on the backend's device
  std::vector<std::vector<std::string>> release_after_;           // values dead after node i
  bool profile_ = false;
  std::vector<NodeTiming> timings_;
  std::function<void(size_t, size_t)> progress_;
  bool recording_on_ = true;
  std::map<std::string, Tensor> buffers_;  // every value, kept while recording
  std::unique_ptr<Backend::Recording> recording_;
  bool in_place_on_ = true;
  InPlacePlan in_place_;
  bool share_memory_ = true;
  std::unique_ptr<MemoryPlan> memory_;
  Tensor arena_;  // memory_'s blocks, on the backend's device

  // A fresh tensor for value `name`: its block of the arena where the memory plan has one.
  Tensor allocate(const std::string& name);
  // Allocates a tensor of `shape` for `what`; out of device memory, throws OutOfMemory saying
  // what, how much it needed, how much was free, and that a smaller batch needs less.
  Tensor allocate(const Shape& shape, const std::string& what) const;
  // `t` on the backend's device (itself where it is there), allocated as allocate() does.
  Tensor upload(const Tensor& t, const std::string& what) const;

  // Runs every node; `keep` keeps all values in env (and reuses the buffers found there).
  void execute(std::map<std::string, Tensor>& env, bool keep);
};

}  // namespace epilog
