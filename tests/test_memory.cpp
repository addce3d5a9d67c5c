// The executor's memory plan: activations sharing one arena by liveness. Runs with it on must
// give the bits of runs with it off; no value may change while it is live; the arena must be
// smaller than every value at once.
#include <catch2/catch.hpp>

#include <filesystem>

#include "epilog/epilog.h"
#include "epilog/io/model.h"
#include "error_matcher.h"
#include "test_graphs.h"
#include "test_util.h"
#include "yolo_like.h"

using namespace epilog;

namespace {

// The CPU backend, keeping a copy of every value it is handed or makes, as first seen (made by
// its node, or read for the first time: an in-place concat's buffer, a split's view), and
// listing those that differ from that copy when read again: a value whose bytes another, live
// at the same time, took.
class WitnessBackend : public Backend {
 public:
  Device device() const override { return Device::CPU; }
  void run(const Node& node, const NodePlan& plan, const std::vector<Tensor>& in,
           std::vector<Tensor>& out) override {
    for (size_t j = 0; j < node.inputs.size(); ++j) {
      auto [seen, fresh] = seen_.emplace(node.inputs[j], in[j]);
      if (fresh)
        seen->second = in[j].clone();
      else if (!test::bit_equal(seen->second, in[j].clone()))  // clone: a strided part made whole
        changed.push_back(node.inputs[j] + " (read by " + node.name + ")");
    }
    cpu_->run(node, plan, in, out);
    for (size_t j = 0; j < node.outputs.size(); ++j) seen_[node.outputs[j]] = out[j].clone();
  }
  void start() { seen_.clear(); }
  std::vector<std::string> changed;

 private:
  std::unique_ptr<Backend> cpu_ = make_cpu_backend();
  std::map<std::string, Tensor> seen_;
};

// The repository's models and the YOLO-like one at batch 2 (strided in-place slabs).
std::vector<std::pair<std::string, Graph>> models() {
  std::vector<std::pair<std::string, Graph>> out;
  for (const char* name : {"demo_conv_bn_silu", "resnet_like", "effnet_like", "yolo_like"})
    out.push_back({name, load_model(test::source_dir() + "/models/" + name + ".json")});
  Builder b(3);
  out.push_back({"yolo_like at batch 2", yolo::yolo_like(b, /*batch=*/2, /*size=*/64)});
  return out;
}

// Every pair of blocks live at a common node lies apart in the arena, and within it.
void check_apart(const MemoryPlan& mp) {
  std::vector<std::pair<std::string, MemoryPlan::Block>> blocks(mp.blocks.begin(), mp.blocks.end());
  for (size_t a = 0; a < blocks.size(); ++a) {
    const MemoryPlan::Block& x = blocks[a].second;
    CHECK(x.offset % MemoryPlan::kAlign == 0);
    CHECK(x.offset + x.bytes <= mp.arena_bytes);
    for (size_t b = a + 1; b < blocks.size(); ++b) {
      const MemoryPlan::Block& y = blocks[b].second;
      if (x.first > y.last || y.first > x.last) continue;
      INFO(blocks[a].first << " and " << blocks[b].first);
      CHECK((x.offset + x.bytes <= y.offset || y.offset + y.bytes <= x.offset));
    }
  }
}

// Runs `plan` with sharing on (under the witness) and off: the same bits, nothing changed while
// live. Returns the plan the executor followed.
MemoryPlan check_runs(const Plan& plan, bool in_place, uint64_t seed) {
  const std::map<std::string, Tensor> inputs = test::random_inputs(plan.graph, seed);
  auto cpu = make_cpu_backend();
  Executor off(plan, *cpu);
  off.set_in_place(in_place);
  off.set_memory_plan(false);
  const std::map<std::string, Tensor> want = off.run(inputs);
  CHECK(off.memory_plan() == nullptr);
  WitnessBackend witness;
  Executor on(plan, witness);
  on.set_in_place(in_place);
  for (int run = 0; run < 2; ++run) {  // the second run reuses the arena
    witness.start();
    const std::map<std::string, Tensor> got = on.run(inputs);
    CHECK(witness.changed == std::vector<std::string>{});
    REQUIRE(got.size() == want.size());
    for (const auto& [name, t] : want) {
      INFO("output " << name << ", run " << run);
      CHECK(test::bit_equal(got.at(name), t));
    }
  }
  REQUIRE(on.memory_plan() != nullptr);
  return *on.memory_plan();
}

}  // namespace

TEST_CASE("memory: the models give the same outputs sharing memory, in a smaller arena",
          "[memory]") {
  for (auto& [name, g] : models()) {
    const Compiled c = compile(g, {});
    for (const bool in_place : {true, false}) {
      INFO(name << (in_place ? ", in place" : ", copies"));
      const MemoryPlan mp = check_runs(c.plan, in_place, 5);
      check_apart(mp);
      if (name == "demo_conv_bn_silu") continue;  // one conv: nothing to share
      CHECK(mp.arena_bytes < mp.unshared_bytes);
      CHECK(mp.arena_bytes > 0);
    }
  }
}

TEST_CASE("memory: the YOLO-like model's arena as planned", "[memory]") {
  // Lowered for CUDA too (its folds change what is made where), planned statically as explain
  // reports it.
  Builder b(3);
  const Graph g = yolo::yolo_like(b, /*batch=*/16, /*size=*/320);
  CompileOptions cuda;
  cuda.device = Device::CUDA;
  for (CompileOptions o : {CompileOptions{}, cuda}) {
    const Plan plan = compile(g, o).plan;
    const MemoryPlan mp = plan_memory(plan, plan_in_place(plan), true);
    check_apart(mp);
    const MemoryUse use = memory_use(plan);
    INFO(device_name(o.device) << ": " << use.summary());
    CHECK(use.activations == mp.arena_bytes);
    // Sharing takes a fraction of what every value at once would.
    CHECK(use.activations * 3 < use.unshared);
    CHECK(use.weights > 0);
    // The input and the outputs stay out of the arena.
    CHECK(use.inputs_outputs >= size_t(16 * 3 * 320 * 320 * 4));
  }
  // The same plan twice: deterministic.
  const Plan plan = compile(g, {}).plan;
  const MemoryPlan x = plan_memory(plan, plan_in_place(plan), true),
                   y = plan_memory(plan, plan_in_place(plan), true);
  REQUIRE(x.blocks.size() == y.blocks.size());
  for (const auto& [value, block] : x.blocks) CHECK(y.blocks.at(value).offset == block.offset);
}

TEST_CASE("memory: random conv nets give the same outputs sharing memory", "[memory][random]") {
  for (uint64_t seed = 1; seed <= 110; ++seed) {
    const bool large = seed > 100;
    const Graph g = test::random_convnet(seed, large);
    INFO("test::random_convnet(" << seed << (large ? ", large" : "") << ")");
    const Compiled c = compile(g, {});
    for (const bool in_place : {true, false}) check_apart(check_runs(c.plan, in_place, seed));
  }
}

TEST_CASE("memory: sharing can be switched off by option and environment", "[memory]") {
  CompileOptions o;
  o.share_memory = false;
  Builder b(3);
  const Compiled c = compile(yolo::yolo_like(b, 1, 64), o);
  CHECK_FALSE(c.plan.share_memory);
  const MemoryUse use = memory_use(c.plan);
  CHECK(use.activations == use.unshared);
  ::setenv("EPILOG_DISABLE_MEMORY_PLAN", "1", 1);
  const CompileOptions from_env = CompileOptions{}.with_env();
  ::unsetenv("EPILOG_DISABLE_MEMORY_PLAN");
  CHECK_FALSE(from_env.share_memory);
  CHECK(CompileOptions{}.with_env().share_memory);
}

namespace {

// The host allocator, refusing any one allocation over kLimit bytes as a device out of memory
// would.
constexpr size_t kLimit = size_t(256) << 10;
AllocFn host = nullptr;
std::shared_ptr<Storage> limited(size_t bytes) {
  if (bytes > kLimit) throw OutOfMemory("no room", bytes, kLimit, 2 * kLimit);
  return host(bytes);
}

}  // namespace

TEST_CASE("memory: out of memory names what was allocated and what would fit, and stays usable",
          "[memory]") {
  Builder big(3), small(3);
  const Plan at8 = compile(yolo::yolo_like(big, /*batch=*/8, /*size=*/64), {}).plan;
  const Plan at1 = compile(yolo::yolo_like(small, /*batch=*/1, /*size=*/64), {}).plan;
  REQUIRE(memory_use(at8).activations > kLimit);
  REQUIRE(memory_use(at1).activations < kLimit);
  auto cpu = make_cpu_backend();
  const std::map<std::string, Tensor> want =
      Executor(at1, *cpu).run(test::random_inputs(at1.graph, 1));
  const std::map<std::string, Tensor> inputs = test::random_inputs(at8.graph, 1);
  host = registered_allocator(Device::CPU);
  register_allocator(Device::CPU, limited);
  struct Restore {
    ~Restore() { register_allocator(Device::CPU, host); }
  } restore;
  Executor ex(at8, *cpu);
  REQUIRE_ERROR(ex.run(inputs), "executor: out of cpu memory", "allocating the activations",
                "MiB needed, 0.2 MiB free of 0.5 MiB", "a batch under 8 needs less", "no room");
  // Without sharing: the first value too large.
  ex.set_memory_plan(false);
  REQUIRE_ERROR(ex.run(inputs), "allocating value '");
  // The next, smaller run succeeds.
  const std::map<std::string, Tensor> got =
      Executor(at1, *cpu).run(test::random_inputs(at1.graph, 1));
  for (const auto& [name, t] : want) CHECK(test::bit_equal(got.at(name), t));
}
