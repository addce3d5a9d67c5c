// epilog::Model: one model run at many batch sizes, from several threads at once.
#include <catch2/catch.hpp>

#include <thread>

#include "epilog/epilog.h"
#include "test_graphs.h"
#include "test_util.h"
#include "yolo_like.h"

using namespace epilog;

namespace {

// Inputs for `g` at batch `batch`.
std::map<std::string, Tensor> inputs_at(const Graph& g, int64_t batch, uint64_t seed) {
  std::map<std::string, Tensor> in;
  for (const std::string& name : g.inputs) {
    Shape shape = g.value(name).shape;
    shape[0] = batch;
    in[name] = Tensor::randn(shape, hash_string(name, seed));
  }
  return in;
}

}  // namespace

TEST_CASE("model: each batch size gets a plan once, and the outputs of a fresh compile",
          "[model]") {
  Builder b(3);
  const Graph g = yolo::yolo_like(b, /*batch=*/1, /*size=*/64);
  Model model(g, {});
  auto cpu = make_cpu_backend();
  for (const int64_t batch : {3, 1, 3}) {
    INFO("batch " << batch);
    const auto inputs = inputs_at(g, batch, uint64_t(batch));
    Builder fresh(3);
    const auto want =
        Executor(compile(yolo::yolo_like(fresh, batch, 64), {}).plan, *cpu).run(inputs);
    const auto got = model.run(inputs);
    for (const auto& [name, t] : want) CHECK(test::bit_equal(got.at(name), t));
  }
  CHECK(model.plan(3) == model.plan(3));  // cached
  CHECK(model.plan(3)->graph.value(g.inputs[0]).shape[0] == 3);
  CHECK_THROWS(model.plan(0));
}

TEST_CASE("model: 4 threads at mixed batch sizes get the outputs of serial runs",
          "[model][threads]") {
  const Graph g = test::random_convnet(21);
  Model model(g, {});
  const int64_t batches[] = {1, 2, 3, 2};
  std::map<int64_t, std::map<std::string, Tensor>> inputs, want;
  for (const int64_t batch : batches) {
    inputs[batch] = inputs_at(g, batch, uint64_t(batch));
    want[batch] = model.run(inputs[batch]);  // serial
  }
  std::vector<std::vector<std::map<std::string, Tensor>>> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) got[t].push_back(model.run(inputs[batches[(t + size_t(i)) % 4]]));
    });
  for (std::thread& t : threads) t.join();
  for (size_t t = 0; t < 4; ++t)
    for (size_t i = 0; i < got[t].size(); ++i) {
      const int64_t batch = batches[(t + i) % 4];
      INFO("thread " << t << ", run " << i << ", batch " << batch);
      for (const auto& [name, x] : want[batch]) CHECK(test::bit_equal(got[t][i].at(name), x));
    }
}
