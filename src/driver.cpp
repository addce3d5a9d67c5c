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
  if (const char* v = std::getenv("EPILOG_DISABLE_PROLOGUE"); v && std::string(v) == "1")
    o.prologue = false;
  if (const char* v = std::getenv("EPILOG_FORCE_CONV_KERNEL"); v && *v) {
    o.force_conv = parse_conv_kernel(v);
    if (!o.force_conv)
      fail("EPILOG_FORCE_CONV_KERNEL='{}': expected scalar, tiled, gemm or gemv", v);
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

namespace {

PassReport optimize_for(Graph& graph, const CompileOptions& options) {
  PassOptions po;
  po.fuse = options.fuse;
  if (!options.dump_dir.empty())
    po.on_stage = [&](int i, const std::string& stage, const Graph& g) {
      dump_stage(options.dump_dir, i, stage, g);
    };
  return optimize(graph, po);
}

// An optimized graph lowered as `options` say, into c.plan (and c.profile).
void lower_for(Graph graph, const CompileOptions& options, Compiled& c) {
  LowerOptions lo;
  lo.device = options.device;
  lo.force = options.force_conv;
  lo.prologue = options.prologue;
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
}

// `graph` with dim 0 of every input set to `batch` and every shape inferred again.
Graph at_batch(Graph graph, int64_t batch) {
  for (const std::string& name : graph.inputs) {
    Shape& shape = graph.values.at(name).shape;
    if (shape.empty()) fail("model: input '{}' is a scalar, so it has no batch dim", name);
    shape[0] = batch;
  }
  infer_graph_shapes(graph);
  verify(graph, fmt::format("at batch {}", batch));
  return graph;
}

}  // namespace

Compiled compile(Graph graph, const CompileOptions& options) {
  Compiled c;
  c.report = optimize_for(graph, options);
  lower_for(std::move(graph), options, c);
  return c;
}

Model::Model(Graph graph, const CompileOptions& options) : options_(options) {
  report_ = optimize_for(graph, options_);
  graph_ = std::move(graph);
  options_.dump_dir.clear();  // dumped once, here
}

std::shared_ptr<const Plan> Model::plan(int64_t batch) {
  if (batch < 1) fail("model: batch {}: expected 1 or more", batch);
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<const Plan>& plan = plans_[batch];
  if (!plan) {
    Compiled c;
    lower_for(at_batch(graph_, batch), options_, c);
    plan = std::make_shared<const Plan>(std::move(c.plan));
  }
  return plan;
}

std::unique_ptr<Model::Runner> Model::take(int64_t batch) {
  std::shared_ptr<const Plan> p = plan(batch);
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::unique_ptr<Runner>>& idle = idle_[batch];
    if (!idle.empty()) {
      std::unique_ptr<Runner> r = std::move(idle.back());
      idle.pop_back();
      return r;
    }
  }
  auto r = std::make_unique<Runner>();
  r->backend = make_backend(options_.device);
  // The first executor uploads the weights, the others share them.
  std::lock_guard<std::mutex> upload(upload_mu_);
  r->executor = std::make_unique<Executor>(*p, *r->backend, weights_);
  weights_ = r->executor->weights();
  return r;
}

void Model::give_back(int64_t batch, std::unique_ptr<Runner> runner) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_[batch].push_back(std::move(runner));
}

namespace {
int64_t batch_of(const std::map<std::string, Tensor>& inputs) {
  if (inputs.empty() || inputs.begin()->second.rank() == 0)
    fail("model: run needs the inputs, each with a batch dim");
  return inputs.begin()->second.dim(0);
}
}  // namespace

std::map<std::string, Tensor> Model::run(const std::map<std::string, Tensor>& inputs) {
  const int64_t batch = batch_of(inputs);
  std::unique_ptr<Runner> r = take(batch);
  // A runner whose run failed (out of memory, say) is dropped with what it holds.
  // Owned: the executor's buffers serve its next run.
  std::map<std::string, Tensor> outputs = r->executor->run(inputs, Executor::Outputs::Owned);
  give_back(batch, std::move(r));
  return outputs;
}

Model::Session Model::session(int64_t batch) { return Session(*this, batch, take(batch)); }

Model::Session::Session(Model& model, int64_t batch, std::unique_ptr<Runner> runner)
    : model_(&model), batch_(batch), runner_(std::move(runner)) {}

Model::Session::Session(Session&& o) noexcept
    : model_(o.model_), batch_(o.batch_), runner_(std::move(o.runner_)) {}

Model::Session::~Session() {
  if (runner_) model_->give_back(batch_, std::move(runner_));
}

std::map<std::string, Tensor> Model::Session::run(const std::map<std::string, Tensor>& inputs) {
  if (!runner_) fail("model session: none held (moved from, or an earlier run on it failed)");
  if (const int64_t batch = batch_of(inputs); batch != batch_)
    fail("model session: inputs at batch {}, the session runs batch {}", batch, batch_);
  try {
    return runner_->executor->run(inputs);
  } catch (...) {
    runner_.reset();  // what it holds may be half made (out of memory, say): not handed back
    throw;
  }
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
