// epilog::Model: one model run at many batch sizes, from several threads at once.
#include <catch2/catch.hpp>

#include <algorithm>
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

TEST_CASE("model: a resize to sizes runs at another batch, its batch the input's", "[model]") {
  // Resize's sizes name every dim, the batch too (as imported from ONNX, at the file's batch).
  Builder b(3);
  const Val x = b.input("x", {1, 2, 4, 4});
  b.output(b.resize(x, {1, 2, 8, 8}, "linear", "half_pixel"));
  const Graph g = b.build();
  Model model(g, {});
  const auto inputs = inputs_at(g, 3, 7);
  const auto got = model.run(inputs);
  REQUIRE(got.size() == 1);
  const Tensor& y = got.begin()->second;
  CHECK(y.shape() == Shape{3, 2, 8, 8});
  // Each image as the batch-1 model resizes it alone.
  for (int64_t img = 0; img < 3; ++img) {
    const float* xi = inputs.at("x").f32() + img * 32;
    const Tensor one = Tensor::from_vector({1, 2, 4, 4}, std::vector<float>(xi, xi + 32));
    const Tensor want = model.run({{"x", one}}).begin()->second;
    CHECK(std::equal(want.f32(), want.f32() + 128, y.f32() + img * 128));
  }
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

TEST_CASE("model: a cached CUDA plan is the plan a fresh compile at that batch makes",
          "[model]") {
  // What the passes decide must not depend on the batch the model was loaded at: the plan a
  // Model lowers at batch 16 from a batch-1 graph is the one `compile` makes at batch 16, kernel
  // for kernel (explain), so a cached plan runs as fast as a fresh executor's.
  for (const int64_t size : {640, 128}) {
    INFO("yolo_like at " << size);
    Builder b(3), fresh(3);
    CompileOptions o;
    o.device = Device::CUDA;
    o.sm_count = 132;  // an H100's, with or without a GPU here
    Model model(yolo::yolo_like(b, /*batch=*/1, size), o);
    const Compiled want = compile(yolo::yolo_like(fresh, /*batch=*/16, size), o);
    const Plan& got = *model.plan(16);
    CHECK(explain(got, in_place_mask(got)) == explain(want.plan, in_place_mask(want.plan)));
  }
}

TEST_CASE("model: a session runs its batch with views, and hands its executor back",
          "[model]") {
  Builder b(3);
  const Graph g = yolo::yolo_like(b, /*batch=*/1, /*size=*/64);
  Model model(g, {});
  const auto in2 = inputs_at(g, 2, 7), other = inputs_at(g, 2, 8);
  const auto want = model.run(in2);
  {
    Model::Session s = model.session(2);
    CHECK(s.batch() == 2);
    const auto got = s.run(in2);
    for (const auto& [name, t] : want) CHECK(test::bit_equal(got.at(name), t));
    Model::Session moved = std::move(s);
    CHECK_THROWS_WITH(s.run(in2), Catch::Contains("none held"));
    CHECK_THROWS_WITH(moved.run(inputs_at(g, 3, 7)),
                      Catch::Contains("inputs at batch 3, the session runs batch 2"));
    const auto again = moved.run(other);  // a wrong batch leaves the session usable
    CHECK_FALSE(test::bit_equal(again.begin()->second, want.begin()->second));
  }
  // The session's executor went back to the model: its next run at batch 2 takes it.
  const auto after = model.run(in2);
  for (const auto& [name, t] : want) CHECK(test::bit_equal(after.at(name), t));
}
