// The executor's memory on the GPU: the memory plan's arena under CUDA-graph replay, and running
// out of device memory as an error that leaves the process usable.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <iostream>
#include <thread>

#include "epilog/epilog.h"
#include "gpu_util.h"
#include "test_util.h"
#include "yolo_like.h"

using namespace epilog;

namespace {

std::map<std::string, Tensor> on_host(const std::map<std::string, Tensor>& outs) {
  std::map<std::string, Tensor> host;
  for (const auto& [name, t] : outs) host[name] = t.to(Device::CPU, /*force_copy=*/true);
  return host;
}

// A net whose activations grow with the batch far faster than its input: an 8-channel 64x64
// input upsampled 16 times and widened to 64 channels (256 MiB an image), then brought
// back down by a strided conv.
Graph wide_net(int64_t batch) {
  Builder b(7);
  Val x = b.upsample_nearest(b.input("x", {batch, 8, 64, 64}), 16, "up");
  Val y = b.relu(b.conv2d(x, "widen", ConvOpts(64, 1)), "widen.act");
  b.output(b.conv2d(y, "down", ConvOpts(8, 16).stride(16)));
  return b.build();
}

}  // namespace

TEST_CASE("gpu memory: the arena's outputs equal unshared ones over replays", "[gpu][memory]") {
  // The YOLO-like model at batch 4 recorded as a CUDA graph, with the memory plan on and off:
  // the same bits on the first run and on replays with other inputs and then the first again.
  Builder b(3);
  const Graph g = yolo::yolo_like(b, /*batch=*/4, /*size=*/128);
  CompileOptions o;
  o.device = Device::CUDA;
  const Plan plan = compile(g, o).plan;
  auto cuda = make_backend(Device::CUDA);
  Executor shared(plan, *cuda), own(plan, *cuda);
  own.set_memory_plan(false);
  const auto a = test::random_inputs(plan.graph, 1), c = test::random_inputs(plan.graph, 2);
  for (const auto* in : {&a, &c, &a}) {
    const auto x = on_host(shared.run(*in)), y = on_host(own.run(*in));
    CHECK(shared.replaying());
    for (const auto& [name, t] : y) CHECK(test::bit_equal(x.at(name), t));
  }
  REQUIRE(shared.memory_plan() != nullptr);
  const MemoryUse use = memory_use(plan);
  std::cout << "yolo_like batch 4 at 128: " << use.summary() << "\n";
  CHECK(use.activations < use.unshared);
}

TEST_CASE("gpu memory: a batch that cannot fit is an error, and a smaller one then runs",
          "[gpu][memory]") {
  size_t free = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  const int64_t per_image = int64_t(256) << 20;  // widen's output alone, an image
  const int64_t too_many = int64_t(total) / per_image + 2;
  CompileOptions o;
  o.device = Device::CUDA;
  auto cuda = make_backend(Device::CUDA);
  const Graph big = wide_net(too_many);
  const std::map<std::string, Tensor> big_inputs = test::random_inputs(big, 1);
  for (const bool share : {true, false}) {
    INFO((share ? "memory plan" : "a buffer each"));
    Executor ex(compile(big, o).plan, *cuda);
    ex.set_memory_plan(share);
    try {
      ex.run(big_inputs);
      FAIL("batch " << too_many << " ran on a card of " << total << " bytes");
    } catch (const OutOfMemory& e) {
      std::cout << e.what() << "\n";
      CHECK_THAT(e.what(), Catch::Contains("executor: out of cuda memory allocating ") &&
                               Catch::Contains(share ? "the activations" : "value 'widen") &&
                               Catch::Contains("MiB free of") &&
                               Catch::Contains(fmt::format("a batch under {}", too_many)));
      CHECK(e.bytes > e.free);
    }
  }
  // The process stays usable: batch 2 runs and gives the CPU's numbers.
  const Graph small = wide_net(2);
  const auto inputs = test::random_inputs(small, 2);
  const auto got = on_host(Executor(compile(small, o).plan, *cuda).run(inputs));
  const auto want = test::run_cpu(small, inputs);
  for (const auto& [name, t] : want) CHECK(test::max_rel_err(got.at(name), t) <= 5e-3);
}

TEST_CASE("gpu model: 4 threads at mixed batch sizes get the outputs of serial runs",
          "[gpu][model]") {
  // One Model, each thread's runs on executors (CUDA streams, arenas, recordings) of their own.
  Builder b(3);
  const Graph g = yolo::yolo_like(b, /*batch=*/1, /*size=*/128);
  CompileOptions o;
  o.device = Device::CUDA;
  Model model(g, o);
  const int64_t batches[] = {1, 4, 2, 4};
  std::map<int64_t, std::map<std::string, Tensor>> inputs, want;
  for (const int64_t batch : batches) {
    Shape shape = g.value(g.inputs[0]).shape;
    shape[0] = batch;
    inputs[batch] = {{g.inputs[0], Tensor::randn(shape, uint64_t(batch))}};
    want[batch] = on_host(model.run(inputs[batch]));  // serial
  }
  std::vector<std::vector<std::map<std::string, Tensor>>> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < 6; ++i)
        got[t].push_back(on_host(model.run(inputs[batches[(t + i) % 4]])));
    });
  for (std::thread& t : threads) t.join();
  for (size_t t = 0; t < 4; ++t)
    for (size_t i = 0; i < got[t].size(); ++i) {
      INFO("thread " << t << ", run " << i);
      for (const auto& [name, x] : want[batches[(t + i) % 4]])
        CHECK(test::bit_equal(got[t][i].at(name), x));
    }
}

TEST_CASE("gpu model: outputs own their memory, later runs leave them as they were",
          "[gpu][model]") {
  // Model::run copies the recording's outputs on the executor's stream (Outputs::Owned): the
  // outputs of a run on device inputs keep their values through later runs on other inputs.
  Builder b(3);
  const Graph g = yolo::yolo_like(b, /*batch=*/2, /*size=*/128);
  CompileOptions o;
  o.device = Device::CUDA;
  Model model(g, o);
  std::vector<std::map<std::string, Tensor>> inputs;
  for (uint64_t seed : {1, 2, 3})
    inputs.push_back({{g.inputs[0], Tensor::randn(g.value(g.inputs[0]).shape, seed)
                                        .to(Device::CUDA)}});
  const auto first = model.run(inputs[0]);
  const auto want = on_host(first);
  for (size_t i = 1; i < inputs.size(); ++i) model.run(inputs[i]);
  REQUIRE(first.size() == g.outputs.size());
  for (const auto& [name, t] : first) {
    INFO(name);
    CHECK(t.device() == Device::CUDA);
    CHECK(test::bit_equal(t.to(Device::CPU, true), want.at(name)));
    // and they are the first input's outputs, not the last's
    CHECK(test::bit_equal(t.to(Device::CPU, true), on_host(model.run(inputs[0])).at(name)));
    CHECK_FALSE(test::bit_equal(want.at(name), on_host(model.run(inputs[2])).at(name)));
  }
}
