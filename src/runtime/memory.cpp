// The executor's memory plan: activations placed in one arena by liveness.
#include <algorithm>
#include <limits>
#include <set>

#include "epilog/runtime/executor.h"

namespace epilog {

MemoryPlan plan_memory(const Plan& plan, const InPlacePlan& ip, bool in_place) {
  const Graph& g = plan.graph;
  // flatten and reshape return a view of their input (the backends' kernels replace the output
  // with it, whether copy avoidance is on or not): their output lives in their input's storage.
  std::map<std::string, std::string> view_of;
  for (const Node& node : g.nodes)
    if (node.op == OpKind::Flatten || node.op == OpKind::Reshape) {
      auto v = view_of.find(node.inputs[0]);
      view_of[node.outputs[0]] = v == view_of.end() ? node.inputs[0] : v->second;
    }
  // The value whose storage holds `v`: a view's input, a split part's whole, a concat slot's
  // buffer.
  const auto owner = [&](const std::string& value) -> const std::string& {
    auto w = view_of.find(value);
    const std::string& v = w == view_of.end() ? value : w->second;
    if (!in_place) return v;
    auto b = ip.base.find(v);
    const std::string& base = b == ip.base.end() ? v : b->second;
    auto s = ip.slots.find(base);
    return s == ip.slots.end() ? base : s->second.buffer;
  };
  struct Span {
    size_t first = std::numeric_limits<size_t>::max(), last = 0;
  };
  std::map<std::string, Span> spans;  // by owner
  const auto touch = [&](const std::string& v, size_t i) {
    Span& s = spans[owner(v)];
    s.first = std::min(s.first, i);
    s.last = std::max(s.last, i);
  };
  // What node i reads and makes as Executor::execute runs it.
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& node = g.nodes[i];
    if (in_place && ip.folded[i] &&
        (node.op == OpKind::FusedConv2d || node.op == OpKind::FusedElementwise))
      continue;  // a neighbour's
    const int f = in_place ? std::max(ip.pre[i], ip.pro[i]) : -1;  // at most one of them
    const Node* first = f >= 0 ? &g.nodes[size_t(f)] : nullptr;
    const Node* second = in_place && ip.post[i] >= 0 ? &g.nodes[size_t(ip.post[i])] : nullptr;
    for (const std::string& in : node.inputs)
      touch(first && in == first->outputs[0] ? first->inputs[0] : in, i);
    if (in_place && ip.up[i] >= 0) touch(plan.nodes[i].up->source, i);
    for (const std::string& out : second ? second->outputs : node.outputs) touch(out, i);
    if (in_place)
      for (const std::string& next : plan.nodes[i].chain) touch(g.find_node(next)->outputs[0], i);
  }
  std::set<std::string> kept_out;  // owners the caller keeps: graph inputs, weights, outputs
  for (const std::string& v : g.inputs) kept_out.insert(owner(v));
  for (const std::string& v : g.outputs) kept_out.insert(owner(v));

  MemoryPlan mp;
  std::vector<std::string> order;
  for (const auto& [value, span] : spans) {
    if (g.is_weight(value)) continue;
    const size_t bytes = size_t(shape_numel(g.value(value).shape)) * sizeof(float);
    if (kept_out.count(value)) {
      mp.outside_bytes += bytes;
      continue;
    }
    MemoryPlan::Block& b = mp.blocks[value];
    b.bytes = (bytes + MemoryPlan::kAlign - 1) / MemoryPlan::kAlign * MemoryPlan::kAlign;
    b.first = span.first;
    b.last = span.last;
    mp.unshared_bytes += b.bytes;
    order.push_back(value);
  }
  // Largest first (then earliest, then by name: deterministic), each at the lowest offset where
  // it overlaps no block placed before it that is live at the same time.
  std::sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
    const MemoryPlan::Block &x = mp.blocks.at(a), &y = mp.blocks.at(b);
    if (x.bytes != y.bytes) return x.bytes > y.bytes;
    if (x.first != y.first) return x.first < y.first;
    return a < b;
  });
  std::vector<const MemoryPlan::Block*> placed;
  for (const std::string& value : order) {
    MemoryPlan::Block& b = mp.blocks.at(value);
    std::vector<std::pair<size_t, size_t>> taken;  // (offset, end) of the live ones
    for (const MemoryPlan::Block* p : placed)
      if (p->first <= b.last && b.first <= p->last)
        taken.push_back({p->offset, p->offset + p->bytes});
    std::sort(taken.begin(), taken.end());
    size_t offset = 0;
    for (const auto& [begin, end] : taken) {
      if (begin >= offset + b.bytes) break;
      offset = std::max(offset, end);
    }
    b.offset = offset;
    mp.arena_bytes = std::max(mp.arena_bytes, offset + b.bytes);
    placed.push_back(&b);
  }
  return mp;
}

MemoryUse memory_use(const Plan& plan) {
  const Graph& g = plan.graph;
  MemoryUse use;
  for (const auto& [name, w] : g.weights) use.weights += w.data.nbytes();
  for (const NodePlan& np : plan.nodes)
    if (np.packed.defined()) use.weights += np.packed.nbytes();
  const MemoryPlan mp = plan_memory(plan, plan_in_place(plan), plan.in_place);
  use.inputs_outputs = mp.outside_bytes;
  use.unshared = mp.unshared_bytes;
  use.activations = plan.share_memory ? mp.arena_bytes : mp.unshared_bytes;
  return use;
}

std::string MemoryUse::summary() const {
  const auto mib = [](size_t bytes) { return double(bytes) / double(1 << 20); };
  return fmt::format(
      "weights {:.1f} MiB, activations {:.1f} MiB at peak ({:.1f} MiB unshared), inputs and "
      "outputs {:.1f} MiB, workspace {:.1f} MiB",
      mib(weights), mib(activations), mib(unshared), mib(inputs_outputs), mib(workspace));
}

}  // namespace epilog
