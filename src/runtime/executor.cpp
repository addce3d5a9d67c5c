#include "epilog/runtime/executor.h"

#include <chrono>
#include <set>

namespace epilog {

#ifndef EPILOG_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend() {
  return nullptr;
}
bool cuda_available() {
  return false;
}
std::optional<DeviceProfile> cuda_device_profile() {
  return std::nullopt;
}
#endif

Executor::Executor(Plan plan, Backend& backend) : plan_(std::move(plan)), backend_(backend) {
  verify(graph_, "executor");
  if (plan_.device != backend_.device() || plan_.nodes.size() != graph_.nodes.size())
    fail("executor: the plan was lowered for {}, the backend runs on {}", device_name(plan_.device),
         device_name(backend_.device()));
  for (const auto& [name, w] : graph_.weights) weights_[name] = w.data.to(backend_.device());
  // Free each intermediate right after its last reader.
  std::map<std::string, size_t> last_use;
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    for (const std::string& in : graph_.nodes[i].inputs) last_use[in] = i;
    for (const std::string& out : graph_.nodes[i].outputs) last_use.emplace(out, i);
  }
  release_after_.resize(graph_.nodes.size());
  for (const auto& [value, i] : last_use)
    if (!graph_.is_output(value) && !graph_.is_weight(value) && !graph_.is_input(value))
      release_after_[i].push_back(value);
}

std::map<std::string, Tensor> Executor::run(const std::map<std::string, Tensor>& inputs) {
  for (const auto& [name, t] : inputs) {
    if (!graph_.is_input(name))
      fail("run: '{}' is not an input of the graph (inputs: {})", name,
           fmt::join(graph_.inputs, ", "));
    const Shape& want = graph_.value(name).shape;
    if (t.shape() != want)
      fail("run: input '{}' has shape {}, the graph expects {}", name, shape_str(t.shape()),
           shape_str(want));
    if (t.dtype() != DType::F32)
      fail("run: input '{}' is {}, expected f32", name, dtype_name(t.dtype()));
  }
  for (const std::string& name : graph_.inputs)
    if (!inputs.count(name)) fail("run: input '{}' was not given", name);

  timings_.clear();
  std::map<std::string, Tensor> env;
  const bool record = recording_on_ && !profile_ && backend_.can_record();
  if (!record) {
    for (const auto& [name, t] : inputs) env[name] = t.to(backend_.device());
    execute(env, false);
  } else {
    for (const auto& [name, t] : inputs) {
      Tensor& buffer = buffers_[name];
      if (!buffer.defined()) buffer = Tensor::empty(t.shape(), DType::F32, backend_.device());
      buffer.copy_from(t);
    }
    if (recording_) {
      recording_->replay();
    } else {
      // The first run allocates every buffer (allocation cannot be recorded), the recording
      // then captures the launches over the same buffers.
      execute(buffers_, true);
      recording_ = backend_.record([this] { execute(buffers_, true); });
    }
    env = buffers_;
  }
  backend_.synchronize();
  std::map<std::string, Tensor> result;
  for (const std::string& out : graph_.outputs) {
    auto w = weights_.find(out);
    result[out] = w != weights_.end() ? w->second : env.at(out);
  }
  return result;
}

void Executor::replay() {
  if (!recording_) fail("replay: nothing recorded yet (run() first, on a backend that records)");
  recording_->replay();
  backend_.synchronize();
}

void Executor::execute(std::map<std::string, Tensor>& env, bool keep) {
  using Clock = std::chrono::steady_clock;
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& node = graph_.nodes[i];
    std::vector<Tensor> ins;
    for (const std::string& in : node.inputs) {
      auto w = weights_.find(in);
      ins.push_back(w != weights_.end() ? w->second : env.at(in));
    }
    std::vector<Tensor> outs;
    for (const std::string& out : node.outputs) {
      auto kept = env.find(out);
      outs.push_back(keep && kept != env.end()
                         ? kept->second
                         : Tensor::empty(graph_.value(out).shape, DType::F32, backend_.device()));
    }
    auto t0 = Clock::now();
    backend_.run(node, plan_.nodes[i], ins, outs);
    if (profile_) {
      backend_.synchronize();
      double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      timings_.push_back({node.name, node.op, ms});
    }
    for (size_t j = 0; j < outs.size(); ++j) env[node.outputs[j]] = std::move(outs[j]);
    if (!keep)
      for (const std::string& dead : release_after_[i]) env.erase(dead);
    if (progress_) progress_(i + 1, graph_.nodes.size());
  }
}

}  // namespace epilog
