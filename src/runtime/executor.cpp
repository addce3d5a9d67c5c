#include "epilog/runtime/executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>

namespace epilog {

namespace {
std::atomic<int> cuda_probe_count{0};
}  // namespace

namespace detail {
void count_cuda_probe() {
  ++cuda_probe_count;
}
}  // namespace detail

int cuda_probes() {
  return cuda_probe_count;
}

#ifndef EPILOG_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend() {
  return nullptr;
}
bool cuda_available() {
  detail::count_cuda_probe();
  return false;
}
std::optional<DeviceProfile> cuda_device_profile() {
  cuda_available();
  return std::nullopt;
}
#endif

Executor::Executor(Plan plan, Backend& backend,
                   std::shared_ptr<const std::map<std::string, Tensor>> weights)
    : plan_(std::move(plan)), backend_(backend), weights_(std::move(weights)) {
  verify(graph(), "executor");
  if (plan_.device != backend_.device() || plan_.nodes.size() != graph().nodes.size())
    fail("executor: the plan was lowered for {}, the backend runs on {}", device_name(plan_.device),
         device_name(backend_.device()));
  if (!weights_) {
    auto uploaded = std::make_shared<std::map<std::string, Tensor>>();
    for (const auto& [name, w] : graph().weights)
      (*uploaded)[name] = upload(w.data, fmt::format("weight '{}'", name));
    weights_ = std::move(uploaded);
  }
  for (size_t i = 0; i < plan_.nodes.size(); ++i)
    if (plan_.nodes[i].packed.defined())
      plan_.nodes[i].packed = upload(
          plan_.nodes[i].packed, fmt::format("the packed weights of '{}'", graph().nodes[i].name));
  in_place_on_ = plan_.in_place;
  in_place_ = plan_in_place(plan_);
  share_memory_ = plan_.share_memory;
  // Free each intermediate right after its last reader (a conv that reads through a folded
  // upsampling reads its source, a conv pair the folded conv's input, a conv with a prologue the
  // elementwise's).
  std::map<std::string, size_t> last_use;
  for (size_t i = 0; i < graph().nodes.size(); ++i) {
    for (const std::string& in : graph().nodes[i].inputs) last_use[in] = i;
    if (in_place_.up[i] >= 0) last_use[plan_.nodes[i].up->source] = i;
    for (const int f : {in_place_.pre[i], in_place_.pro[i]})
      if (f >= 0)
        for (const std::string& in : graph().nodes[size_t(f)].inputs) last_use[in] = i;
    for (const std::string& out : graph().nodes[i].outputs) last_use.emplace(out, i);
  }
  release_after_.resize(graph().nodes.size());
  for (const auto& [value, i] : last_use)
    if (!graph().is_output(value) && !graph().is_weight(value) && !graph().is_input(value))
      release_after_[i].push_back(value);
}

namespace {

// Whether a slab along `axis` is one run of every item of dim 0: the dims between are all 1.
// Then a split's parts and a concat's inputs are parts of each item (Tensor::part), contiguous
// when dim 0 is 1.
bool runs_of_items(const Shape& shape, int64_t axis) {
  if (axis < 1) return false;
  for (int64_t i = 1; i < axis; ++i)
    if (shape[i] != 1) return false;
  return true;
}

int64_t node_axis(const Node& node, size_t rank) {
  const int64_t axis = node.attrs.i("axis");
  return axis < 0 ? axis + int64_t(rank) : axis;
}

int64_t item_count(const Shape& shape) {
  return shape.empty() || shape[0] == 0 ? 0 : shape_numel(shape) / shape[0];
}

// The ops whose kernels (CPU and CUDA) read and write tensors whose items along dim 0 lie
// apart (Tensor::part): the only ones the executor hands such a tensor.
bool takes_strided(const Graph& g, const Node& node) {
  switch (node.op) {
    case OpKind::FusedConv2d:
    case OpKind::Conv2d:
    case OpKind::MaxPool2d:
    case OpKind::AvgPool2d:
    case OpKind::UpsampleNearest:
    case OpKind::Concat:
    case OpKind::Split:
    case OpKind::ChannelShuffle:
    case OpKind::FusedElementwise:  // chain_shape walks every tensor by its item stride
      return true;
    case OpKind::Add: {
      const Shape& y = g.value(node.outputs[0]).shape;
      return std::all_of(node.inputs.begin(), node.inputs.end(),
                         [&](const std::string& in) { return g.value(in).shape == y; });
    }
    default:
      return false;
  }
}

}  // namespace

InPlacePlan plan_in_place(const Graph& g) {
  const size_t n = g.nodes.size();
  InPlacePlan plan;
  plan.view.assign(n, false);
  plan.concat.assign(n, false);
  std::map<std::string, size_t> producer;
  std::map<std::string, std::vector<size_t>> readers;
  for (size_t i = 0; i < n; ++i) {
    for (const std::string& out : g.nodes[i].outputs) producer[out] = i;
    for (const std::string& in : g.nodes[i].inputs) readers[in].push_back(i);
  }
  // Whether `value` may be a strided part of a batch: every reader takes one, and it is not
  // handed to the caller.
  auto may_stride = [&](const std::string& value) {
    if (g.is_output(value)) return false;
    for (size_t r : readers[value])
      if (!takes_strided(g, g.nodes[r])) return false;
    return true;
  };

  // Split parts that are runs of every item of their input: value -> (the value that owns the
  // storage, offset within an item). With more than one item they are strided.
  std::map<std::string, std::pair<std::string, int64_t>> alias;
  auto owner = [&alias](const std::string& v) {
    auto a = alias.find(v);
    return a == alias.end() ? std::make_pair(v, int64_t(0)) : a->second;
  };
  for (size_t i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    if (node.op != OpKind::Split) continue;
    const Shape& x = g.value(node.inputs[0]).shape;
    if (!runs_of_items(x, node_axis(node, x.size()))) continue;
    bool ok = true;
    if (x[0] > 1)
      for (const std::string& out : node.outputs) ok = ok && may_stride(out);
    if (!ok) continue;
    plan.view[i] = true;
    auto [base, offset] = owner(node.inputs[0]);
    for (const std::string& out : node.outputs) {
      alias[out] = {base, offset};
      plan.base[out] = base;
      offset += item_count(g.value(out).shape);
    }
  }

  // Concats whose inputs begin a longer concat's on the same axis (DenseNet's: each layer
  // concatenates every feature before it): views of the longest one's buffer (`top`), whose
  // slots then hold the shared inputs once. They are planned once it runs in place.
  std::vector<int> top(n, -1);
  for (size_t i = 0; i < n; ++i) {
    const Node& a = g.nodes[i];
    if (a.op != OpKind::Concat) continue;
    const size_t rank = g.value(a.outputs[0]).shape.size();
    for (size_t j = i + 1; j < n; ++j) {
      const Node& b = g.nodes[j];
      if (b.op == OpKind::Concat && b.inputs.size() > a.inputs.size() &&
          node_axis(b, rank) == node_axis(a, rank) &&
          std::equal(a.inputs.begin(), a.inputs.end(), b.inputs.begin()) &&
          (top[i] < 0 || b.inputs.size() > g.nodes[size_t(top[i])].inputs.size()))
        top[i] = int(j);
    }
  }

  // Concats whose inputs can all be written in place: each input is (a run of) a value made by
  // a kernel (not a view, not a concat, not a graph input, weight or output), placed in no other
  // concat but the views above, and the places tile the output's items exactly. With more than
  // one item the value becomes a strided part of the concat's buffer: its producer and readers
  // must take that.
  const auto place_concat = [&](size_t i) {
    const Node& node = g.nodes[i];
    const Shape& y = g.value(node.outputs[0]).shape;
    if (!runs_of_items(y, node_axis(node, y.size()))) return;
    const bool batched = y[0] > 1;
    std::map<std::string, int64_t> at;  // owner -> its offset within an item of the concat
    bool ok = true;
    int64_t offset = 0;
    for (const std::string& in : node.inputs) {
      const auto [base, within] = owner(in);
      auto p = producer.find(base);
      ok = ok && p != producer.end() && !g.is_output(base) && !plan.slots.count(base) &&
           !plan.view[p->second] && g.nodes[p->second].op != OpKind::Concat &&
           g.nodes[p->second].op != OpKind::Flatten && g.nodes[p->second].op != OpKind::Reshape;
      ok = ok && (!batched || (takes_strided(g, g.nodes[p->second]) && may_stride(base)));
      auto [it, fresh] = at.emplace(base, offset - within);
      ok = ok && (fresh || it->second == offset - within);
      offset += item_count(g.value(in).shape);
    }
    if (!ok) return;
    std::vector<std::pair<int64_t, int64_t>> spans;  // (begin, end) of each owner in an item
    for (const auto& [base, begin] : at)
      spans.push_back({begin, begin + item_count(g.value(base).shape)});
    std::sort(spans.begin(), spans.end());
    int64_t end = 0;
    for (const auto& [b, e] : spans) {
      ok = ok && b == end;
      end = e;
    }
    if (!ok || end != item_count(y)) return;
    plan.concat[i] = true;
    for (const auto& [base, begin] : at) plan.slots[base] = {node.outputs[0], begin};
  };
  for (size_t i = 0; i < n; ++i)
    if (g.nodes[i].op == OpKind::Concat && top[i] < 0) place_concat(i);
  // A prefix is the start of each item of its top's buffer where that runs in place (else it
  // copies, from the slots); where it does not, the prefix is placed on its own.
  for (size_t i = 0; i < n; ++i) {
    if (top[i] < 0) continue;
    if (!plan.concat[size_t(top[i])]) {
      place_concat(i);
      continue;
    }
    const std::string& out = g.nodes[i].outputs[0];
    if (g.value(out).shape[0] > 1 ? !may_stride(out) : g.is_output(out)) continue;
    plan.view[i] = true;
    plan.base[out] = g.nodes[size_t(top[i])].outputs[0];
  }
  return plan;
}

InPlacePlan plan_in_place(const Plan& plan) {
  const Graph& g = plan.graph;
  InPlacePlan ip = plan_in_place(g);
  ip.folded.assign(g.nodes.size(), false);
  const UseIndex uses(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (plan.nodes[i].folded_into.empty()) continue;
    // Made by the chain's first pool; made by the conv that reads it; applied by the conv.
    if (g.nodes[i].op == OpKind::MaxPool2d || g.nodes[i].op == OpKind::FusedConv2d ||
        g.nodes[i].op == OpKind::FusedElementwise) {
      ip.folded[i] = true;
      continue;
    }
    // An upsampling's only reader, its concat, must not read what it would write.
    const std::vector<int>& readers = uses.consumers(g.nodes[i].outputs[0]);
    ip.folded[i] = readers.size() == 1 && ip.concat[size_t(readers[0])];
  }
  // The node named `name` where copy avoidance folds it, else -1.
  const auto folded_at = [&](const std::string& name) {
    const Node* n = g.find_node(name);
    const int at = n ? int(n - g.nodes.data()) : -1;
    return at >= 0 && ip.folded[size_t(at)] ? at : -1;
  };
  ip.up.assign(g.nodes.size(), -1);
  ip.pre.assign(g.nodes.size(), -1);
  ip.post.assign(g.nodes.size(), -1);
  ip.pro.assign(g.nodes.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (plan.nodes[i].up) ip.up[i] = folded_at(plan.nodes[i].up->node);
    if (plan.nodes[i].pre) ip.pre[i] = folded_at(plan.nodes[i].pre->node);
    if (plan.nodes[i].post) ip.post[i] = folded_at(plan.nodes[i].post->node);
    if (plan.nodes[i].pro) ip.pro[i] = folded_at(plan.nodes[i].pro->node);
  }
  return ip;
}

std::map<std::string, ValuePlace> value_places(const Graph& g, const InPlacePlan& ip) {
  std::map<std::string, ValuePlace> at;
  const auto place = [&](const std::string& v) {
    auto it = at.find(v);
    return it == at.end() ? ValuePlace{} : it->second;
  };
  // `v` as a part of `whole` at `offset` elements into each item (Tensor::part).
  const auto part = [&](const std::string& whole, int64_t offset, const std::string& v) {
    const ValuePlace w = place(whole);
    const Shape& shape = g.value(whole).shape;
    const int64_t items = shape.empty() ? 1 : shape[0];
    const int64_t stride = w.item_stride ? w.item_stride : item_count(shape);
    const int64_t count = item_count(g.value(v).shape);
    at[v] = {w.offset + offset, items > 1 && count != stride ? stride : 0};
  };
  // Node order: a value's whole is placed before its parts.
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& node = g.nodes[i];
    if (node.op == OpKind::Flatten || node.op == OpKind::Reshape) {
      at[node.outputs[0]] = {place(node.inputs[0]).offset, 0};  // a view of a contiguous input
    } else if (i < ip.view.size() && ip.view[i] && node.op == OpKind::Concat) {
      part(ip.base.at(node.outputs[0]), 0, node.outputs[0]);  // a prefix of a longer concat
    } else if (i < ip.view.size() && ip.view[i]) {
      int64_t offset = 0;
      for (const std::string& out : node.outputs) {
        part(node.inputs[0], offset, out);
        offset += item_count(g.value(out).shape);
      }
    } else {
      for (const std::string& out : node.outputs) {
        auto slot = ip.slots.find(out);
        if (slot != ip.slots.end()) part(slot->second.buffer, slot->second.offset, out);
      }
    }
  }
  return at;
}

std::vector<bool> in_place_mask(const Plan& plan) {
  if (!plan.in_place) return {};
  const InPlacePlan ip = plan_in_place(plan);
  std::vector<bool> mask(ip.view.size());
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = ip.no_kernel(i);
  return mask;
}

std::vector<std::string> Executor::in_place_nodes() const {
  std::vector<std::string> out;
  if (!in_place_on_) return out;
  for (size_t i = 0; i < graph().nodes.size(); ++i)
    if (in_place_.no_kernel(i)) out.push_back(graph().nodes[i].name);
  return out;
}

std::map<std::string, Tensor> Executor::run(const std::map<std::string, Tensor>& inputs,
                                            Outputs outputs) {
  for (const auto& [name, t] : inputs) {
    if (!graph().is_input(name))
      fail("run: '{}' is not an input of the graph (inputs: {})", name,
           fmt::join(graph().inputs, ", "));
    const Shape& want = graph().value(name).shape;
    if (t.shape() != want)
      fail("run: input '{}' has shape {}, the graph expects {}", name, shape_str(t.shape()),
           shape_str(want));
    if (t.dtype() != DType::F32)
      fail("run: input '{}' is {}, expected f32", name, dtype_name(t.dtype()));
  }
  for (const std::string& name : graph().inputs)
    if (!inputs.count(name)) fail("run: input '{}' was not given", name);

  if (share_memory_ && !memory_) {
    auto mp = std::make_unique<MemoryPlan>(plan_memory(plan_, in_place_, in_place_on_));
    arena_ =
        allocate({int64_t(mp->arena_bytes / sizeof(float))},
                 fmt::format("the activations ({} values sharing one arena)", mp->blocks.size()));
    memory_ = std::move(mp);
  }
  if (!share_memory_) arena_ = Tensor();
  timings_.clear();
  std::map<std::string, Tensor> env;
  const bool record = recording_on_ && !profile_ && backend_.can_record();
  if (!record) {
    for (const auto& [name, t] : inputs) env[name] = upload(t, fmt::format("input '{}'", name));
    execute(env, false);
  } else {
    for (const auto& [name, t] : inputs) {
      Tensor& buffer = buffers_[name];
      if (!buffer.defined()) buffer = allocate(t.shape(), fmt::format("input '{}'", name));
      backend_.copy(t, buffer);
    }
    if (recording_) {
      recording_->replay();
    } else {
      // The first run allocates every buffer (allocation cannot be recorded), the recording
      // then captures the launches over the same buffers.
      execute(buffers_, true);
      recording_ = backend_.record([this] { execute(buffers_, true); });
    }
  }
  const std::map<std::string, Tensor>& values = record ? buffers_ : env;  // no copy a run
  std::map<std::string, Tensor> result;
  for (const std::string& out : graph().outputs) {
    auto w = weights_->find(out);
    result[out] = w != weights_->end() ? w->second : values.at(out);
  }
  if (outputs == Outputs::Owned)
    for (auto& [name, t] : result) {
      // Without recording, a kernel's output owns its memory already (the arena never holds
      // it); the recording's buffers, weights and inputs are shared.
      if (!record && !weights_->count(name) && !graph().is_input(name)) continue;
      Tensor own = allocate(t.shape(), fmt::format("output '{}'", name));
      backend_.copy(t, own);
      t = own;
    }
  backend_.synchronize();
  return result;
}

void Executor::replay() {
  if (!recording_) fail("replay: nothing recorded yet (run() first, on a backend that records)");
  recording_->replay();
  backend_.synchronize();
}

Tensor Executor::allocate(const std::string& name) {
  const Shape& shape = graph().value(name).shape;
  if (memory_) {
    auto b = memory_->blocks.find(name);
    if (b != memory_->blocks.end()) {
      const int64_t at = int64_t(b->second.offset / sizeof(float));
      return arena_.slice(at, at + shape_numel(shape)).reshape(shape);
    }
  }
  return allocate(shape, fmt::format("value '{}'", name));
}

Tensor Executor::upload(const Tensor& t, const std::string& what) const {
  if (t.device() == backend_.device()) return t;
  Tensor d = allocate(t.shape(), what);
  d.copy_from(t);
  return d;
}

Tensor Executor::allocate(const Shape& shape, const std::string& what) const {
  try {
    return Tensor::empty(shape, DType::F32, backend_.device());
  } catch (const OutOfMemory& e) {
    const auto mib = [](size_t bytes) { return double(bytes) / double(1 << 20); };
    const Graph& g = graph();
    const std::string batch = g.inputs.empty() || g.value(g.inputs[0]).shape.empty()
                                  ? std::string("a smaller input")
                                  : fmt::format("a batch under {}", g.value(g.inputs[0]).shape[0]);
    throw OutOfMemory(
        fmt::format("executor: out of {} memory allocating {}: {:.1f} MiB needed, {:.1f} MiB free "
                    "of {:.1f} MiB (the model's weights {:.1f} MiB, its activations {:.1f} MiB at "
                    "peak); {} needs less ({})",
                    device_name(backend_.device()), what, mib(e.bytes), mib(e.free), mib(e.total),
                    mib(memory_use(plan_).weights), mib(memory_use(plan_).activations), batch,
                    e.what()),
        e.bytes, e.free, e.total);
  }
}

void Executor::execute(std::map<std::string, Tensor>& env, bool keep) {
  using Clock = std::chrono::steady_clock;
  const auto value = [&](const std::string& name) {
    auto w = weights_->find(name);
    return w != weights_->end() ? w->second : env.at(name);
  };
  for (size_t i = 0; i < graph().nodes.size(); ++i) {
    const Node& node = graph().nodes[i];
    if (in_place_on_ && in_place_.folded[i] &&
        (node.op == OpKind::FusedConv2d || node.op == OpKind::FusedElementwise)) {
      // A conv whose work a neighbour's kernel does (a conv pair or chain), an elementwise the
      // conv reading it applies (a prologue): nothing runs here.
      if (profile_) timings_.push_back({node.name, node.op, 0.0});
      if (progress_) progress_(i + 1, graph().nodes.size());
      continue;
    }
    std::vector<Tensor> ins;
    // The node folded into this one's loads (a conv pair's first conv, a prologue's elementwise;
    // never both, fold_prologues): its input takes its output's place.
    const int into = in_place_on_ ? std::max(in_place_.pre[i], in_place_.pro[i]) : -1;
    const Node* first = into >= 0 ? &graph().nodes[size_t(into)] : nullptr;
    for (const std::string& in : node.inputs)
      ins.push_back(first && in == first->outputs[0] ? value(first->inputs[0]) : value(in));
    // Then a prologue's scale and shift (FoldedPrologue), or a folded conv's weight, scale and
    // shift (FoldedConv): for a pair its input took its output's place; a chain makes the 1x1's
    // outputs instead of its own.
    const bool pro = in_place_on_ && in_place_.pro[i] >= 0;
    if (pro)
      for (const int k : {plan_.nodes[i].pro->scale, plan_.nodes[i].pro->shift})
        if (k >= 0) ins.push_back(value(first->inputs[size_t(k)]));
    const Node* second = in_place_on_ && in_place_.post[i] >= 0
                             ? &graph().nodes[size_t(in_place_.post[i])]
                             : nullptr;
    for (const Node* f : {pro ? nullptr : first, second})
      if (f)
        for (size_t j = 1; j < f->inputs.size(); ++j) ins.push_back(value(f->inputs[j]));
    const std::vector<std::string>& out_names = second ? second->outputs : node.outputs;
    const bool view = in_place_on_ && in_place_.view[i];
    const bool in_place = in_place_on_ && in_place_.concat[i];
    const bool folded = in_place_on_ && in_place_.folded[i];
    if (in_place_on_ && in_place_.up[i] >= 0) ins.push_back(env.at(plan_.nodes[i].up->source));
    // A kernel's output: kept from the recording run, made by a chain's first pool, or made.
    const auto output = [&](const std::string& out, bool made) {
      const Shape& shape = graph().value(out).shape;
      auto kept = env.find(out);
      auto slot = in_place_.slots.find(out);
      if ((keep || made) && kept != env.end()) return kept->second;
      if (in_place_on_ && slot != in_place_.slots.end()) {
        // The first value made for a concat allocates its buffer.
        Tensor& buffer = env[slot->second.buffer];
        if (!buffer.defined()) buffer = allocate(slot->second.buffer);
        return buffer.part(slot->second.offset, shape);
      }
      return allocate(out);
    };
    std::vector<Tensor> outs;
    for (const std::string& out : out_names) {
      if (in_place)
        outs.push_back(env.at(out));  // every input is already in this buffer
      else if (view)
        outs.emplace_back();  // made below
      else
        outs.push_back(output(out, folded && node.op == OpKind::MaxPool2d));
    }
    // The first pool of a chain makes the outputs of the ones after it.
    if (in_place_on_)
      for (const std::string& next : plan_.nodes[i].chain) {
        const std::string& out = graph().find_node(next)->outputs[0];
        outs.push_back(env[out] = output(out, false));
      }
    auto t0 = Clock::now();
    if (view && node.op == OpKind::Concat) {
      // A prefix of a longer concat: its inputs are in that one's buffer already.
      const std::string& out = node.outputs[0];
      outs[0] = env.at(in_place_.base.at(out)).part(0, graph().value(out).shape);
    } else if (view) {
      int64_t offset = 0;
      for (size_t j = 0; j < outs.size(); ++j) {
        const Shape& shape = graph().value(node.outputs[j]).shape;
        outs[j] = ins[0].part(offset, shape);
        offset += item_count(shape);
      }
    } else if (!in_place && !folded) {
      if (!takes_strided(graph(), node))
        for (const std::vector<Tensor>* ts : {&ins, &outs})
          for (const Tensor& t : *ts)
            if (!t.contiguous())
              fail("executor: node '{}' ({}) was handed a strided tensor its kernels cannot take",
                   node.name, op_name(node.op));
      backend_.run(node, plan_.nodes[i], ins, outs);
    }
    if (profile_) {
      backend_.synchronize();
      double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      timings_.push_back({node.name, node.op, ms});
    }
    for (size_t j = 0; j < out_names.size(); ++j) env[out_names[j]] = std::move(outs[j]);
    if (!keep)
      for (const std::string& dead : release_after_[i]) env.erase(dead);
    if (progress_) progress_(i + 1, graph().nodes.size());
  }
}

}  // namespace epilog
