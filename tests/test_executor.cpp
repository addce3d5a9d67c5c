// The executor's copy avoidance: splits as views, concats whose inputs are produced in
// place. Each case runs with it on and off; the outputs must be bit-equal (the same kernels on
// the same numbers), and the nodes it claims are checked by name.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>

#include "epilog/epilog.h"
#include "epilog/io/builder.h"
#include "epilog/kernels/cpu.h"
#include "epilog/runtime/params.h"
#include "error_matcher.h"
#include "test_graphs.h"
#include "test_util.h"
#include "yolo_like.h"

using namespace epilog;

namespace {

struct Runs {
  std::vector<std::string> in_place;
  std::map<std::string, Tensor> on, off;
};

Runs run_both(const Graph& g, bool fuse = true) {
  CompileOptions o;
  o.fuse = fuse;
  Compiled c = compile(g, o);
  const std::map<std::string, Tensor> inputs = test::random_inputs(c.plan.graph, 7);
  auto backend = make_cpu_backend();
  Runs r;
  Executor on(c.plan, *backend);
  r.in_place = on.in_place_nodes();
  r.on = on.run(inputs);
  Executor off(c.plan, *backend);
  off.set_in_place(false);
  r.off = off.run(inputs);
  return r;
}

void check_equal(const Runs& r) {
  REQUIRE(r.on.size() == r.off.size());
  for (const auto& [name, t] : r.off) {
    INFO("output " << name);
    CHECK(test::bit_equal(r.on.at(name), t));
  }
}

}  // namespace

TEST_CASE("executor: the YOLO-like model at batch 1 runs its concats and chunks in place",
          "[executor]") {
  Builder b(3);
  const Graph g = yolo::yolo_like(b, /*batch=*/1, /*size=*/64);
  Runs r = run_both(g);
  check_equal(r);
  // 13 concats (C2f, SPPF, neck) and the 8 C2f chunks.
  CHECK(r.in_place.size() == 21);
  CHECK(std::count(r.in_place.begin(), r.in_place.end(), "b2.cat") == 1);
  CHECK(std::count(r.in_place.begin(), r.in_place.end(), "b2.chunk") == 1);
  CHECK(std::count(r.in_place.begin(), r.in_place.end(), "b9.cat") == 1);  // SPPF

  // Unfused too: the concat inputs are then silu outputs.
  Runs u = run_both(g, /*fuse=*/false);
  check_equal(u);
  CHECK(u.in_place.size() == 21);
}

TEST_CASE("executor: at batch 2 the same nodes run in place on strided channel slabs",
          "[executor]") {
  // Every producer and reader of the model's concat inputs and chunks takes strided tensors
  // (fused convs, adds of equal shapes, max-pools, upsampling), so all 21 nodes still qualify.
  Builder b(3);
  const Graph g = yolo::yolo_like(b, /*batch=*/2, /*size=*/64);
  Runs r = run_both(g);
  check_equal(r);
  CHECK(r.in_place.size() == 21);
  CHECK(std::count(r.in_place.begin(), r.in_place.end(), "b4.cat") == 1);
  CHECK(std::count(r.in_place.begin(), r.in_place.end(), "cat") == 1);  // upsample + skip

  // Unfused, the concat inputs are silu outputs, and silu takes no strides: only the 8 chunks,
  // strided views of a contiguous tensor read by convs and adds, avoid their copies.
  Runs u = run_both(g, /*fuse=*/false);
  check_equal(u);
  CHECK(u.in_place.size() == 8);
  CHECK(std::count(u.in_place.begin(), u.in_place.end(), "b2.chunk") == 1);
}

TEST_CASE("executor: a strided value never reaches a kernel that cannot take it", "[executor]") {
  Builder b(9);
  Val x = b.input("x", {2, 4, 6, 6});
  Val c1 = b.conv2d(x, "c1", ConvOpts(4, 3).padding(1));
  Val c2 = b.conv2d(x, "c2", ConvOpts(4, 1));
  Val c3 = b.conv2d(x, "c3", ConvOpts(4, 1));
  b.output(b.relu(c1, "r1"));                 // relu takes no strides: c1 stays whole
  b.output(b.concat({c1, c2}, 1, "copied"));  // so this concat copies
  b.output(b.concat({c3, b.conv2d(x, "c4", ConvOpts(2, 1))}, 1, "placed"));
  std::vector<Val> parts = b.split(b.conv2d(x, "c5", ConvOpts(6, 1)), 1, {2, 4}, "parts");
  b.output(b.relu(parts[0], "r5"));  // a part read by relu: the split copies
  b.output(b.add(parts[1], parts[1], "twice"));
  Runs r = run_both(b.build(), /*fuse=*/false);
  check_equal(r);
  CHECK(r.in_place == std::vector<std::string>{"placed"});
}

TEST_CASE("executor: an elementwise chain of equal shapes reads and writes strided slabs",
          "[executor]") {
  // At batch 2 a concat input and a split's parts are strided channel slabs: the chains that
  // make and read them (equal shapes) take the strides, so the concat and split run in place.
  Builder b(10);
  Val x = b.input("x", {2, 4, 6, 6});
  Val c1 = b.conv2d(x, "c1", ConvOpts(4, 3).padding(1));
  Val c2 = b.conv2d(x, "c2", ConvOpts(4, 1));
  Val c3 = b.conv2d(x, "c3", ConvOpts(2, 1));
  Val sum = b.relu(b.add(c1, c2, "sum"), "chain");
  b.output(b.concat({sum, c3}, 1, "cat"));
  std::vector<Val> parts = b.split(b.conv2d(x, "c4", ConvOpts(6, 1)), 1, {3, 3}, "parts");
  b.output(b.sigmoid(b.mul(parts[0], parts[1], "prod"), "gate"));
  Runs r = run_both(b.build());
  check_equal(r);
  CHECK(r.in_place == std::vector<std::string>{"cat", "parts"});
}

TEST_CASE("executor: concats that begin a longer one (DenseNet's) are views of its buffer",
          "[executor]") {
  // The last concat's buffer holds every feature once; the earlier concats are its first
  // channels. At batch 2 those are strided slabs, made by convs and an average pool and read by
  // elementwise chains and convs, all of which take strides.
  for (const int64_t batch : {1, 2}) {
    INFO("batch " << batch);
    Runs r = run_both(test::dense_block(batch, 4, 2, 3, 6));
    check_equal(r);
    CHECK(r.in_place == std::vector<std::string>{"cat1", "cat2", "cat_all"});
  }
  // Where the longer concat cannot run in place (here it holds a graph input), the shorter one
  // is planned on its own.
  Builder b(12);
  Val x = b.input("x", {1, 4, 6, 6});
  Val c1 = b.conv2d(x, "c1", ConvOpts(4, 1));
  Val c2 = b.conv2d(x, "c2", ConvOpts(4, 1));
  b.output(b.relu(b.concat({c1, c2}, 1, "short"), "r1"));
  b.output(b.relu(b.concat({c1, c2, x}, 1, "long"), "r2"));
  Runs r = run_both(b.build());
  check_equal(r);
  CHECK(r.in_place == std::vector<std::string>{"short"});
}

TEST_CASE("executor: what cannot be produced in place is copied", "[executor]") {
  Builder b(5);
  Val x = b.input("x", {1, 4, 6, 6});
  Val c1 = b.relu(b.conv2d(x, "c1", ConvOpts(4, 3).padding(1)), "r1");
  Val c2 = b.relu(b.conv2d(x, "c2", ConvOpts(4, 1)), "r2");
  Val c3 = b.relu(b.conv2d(x, "c3", ConvOpts(4, 1)), "r3");
  b.output(b.concat({c1, x}, 1, "with_input"));    // x is a graph input
  b.output(b.concat({c1, c2}, 1, "first"));        // in place
  b.output(b.concat({c1, c3}, 1, "second"));       // c1 already lives in "first"
  b.output(c3);                                    // c3 is a graph output ...
  b.output(b.concat({c3, c2}, 1, "with_output"));  // ... so this one copies
  Val whole = b.relu(b.conv2d(x, "c4", ConvOpts(6, 1)), "r4");
  std::vector<Val> parts = b.split(whole, 1, {2, 4}, "parts");
  b.output(b.concat({parts[1], parts[0]}, 1, "swapped"));  // the runs in the wrong order
  b.output(b.concat({b.concat({c2, c2}, 1, "inner"), c3}, 1, "of_concat"));
  // A part of a split's input beside another value: the whole input (6 channels) would overlap
  // that value's place, though the two places end where the concat's 6 channels do.
  std::vector<Val> halves =
      b.split(b.relu(b.conv2d(x, "c5", ConvOpts(6, 1)), "r5"), 1, {2, 4}, "halves");
  b.output(b.relu(halves[1], "rest"));
  b.output(b.concat({halves[0], b.relu(b.conv2d(x, "c6", ConvOpts(4, 1)), "r6")}, 1, "overlap"));
  Runs r = run_both(b.build(), /*fuse=*/false);
  check_equal(r);
  CHECK(r.in_place == std::vector<std::string>{"first", "parts", "halves"});
}

TEST_CASE("executor: explain marks the nodes the executor runs in place, and only those",
          "[executor]") {
  Builder b(3);
  // The YOLO-like model's 13 concats and 8 chunks; a dense block's two concats that begin the
  // third and that one.
  const std::pair<Graph, size_t> cases[] = {
      {yolo::yolo_like(b, /*batch=*/2, /*size=*/64), 21}, {test::dense_block(2, 4, 2, 3, 6), 3}};
  for (const auto& [g, count] : cases) {
    Compiled c = compile(g, CompileOptions{});
    auto backend = make_cpu_backend();
    Executor ex(c.plan, *backend);
    const std::vector<bool> mask = in_place_mask(c.plan);
    REQUIRE(mask.size() == c.plan.graph.nodes.size());
    std::vector<std::string> marked;
    for (size_t i = 0; i < mask.size(); ++i)
      if (mask[i]) marked.push_back(c.plan.graph.nodes[i].name);
    CHECK(marked == ex.in_place_nodes());
    REQUIRE(marked.size() == count);
    // Every marked node's line of the table, and no other, says "in place".
    const std::string text = explain(c.plan, mask);
    size_t lines = 0;
    for (size_t at = 0, end; (end = text.find('\n', at)) != std::string::npos; at = end + 1) {
      const std::string line = text.substr(at, end - at);
      if (line.find(" in place ") == std::string::npos) continue;
      ++lines;
      CHECK(std::find(marked.begin(), marked.end(), line.substr(0, line.find(' '))) !=
            marked.end());
    }
    CHECK(lines == marked.size());
    CHECK(explain(c.plan).find(" in place ") == std::string::npos);
    c.plan.in_place = false;
    CHECK(in_place_mask(c.plan).empty());
  }
}

TEST_CASE("executor: copy avoidance can be switched off by option and environment", "[executor]") {
  Builder b(3);
  const Graph g = yolo::yolo_like(b, /*batch=*/2, /*size=*/64);
  CompileOptions o;
  o.in_place = false;
  Compiled c = compile(g, o);
  CHECK_FALSE(c.plan.in_place);
  auto backend = make_cpu_backend();
  Executor off(c.plan, *backend);
  CHECK(off.in_place_nodes().empty());
  off.set_in_place(true);
  CHECK(off.in_place_nodes().size() == 21);

  ::setenv("EPILOG_DISABLE_IN_PLACE", "1", 1);
  const CompileOptions from_env = CompileOptions{}.with_env();
  ::unsetenv("EPILOG_DISABLE_IN_PLACE");
  CHECK_FALSE(from_env.in_place);
  CHECK(CompileOptions{}.with_env().in_place);
}

namespace {

// The CPU backend, also taking what the CUDA backend takes for a folded node: a conv pair's
// inputs (the second conv's, the first conv's input in place of its output, then the first
// conv's weight, scale and shift) and a conv chain's (the conv's, then the folded 1x1's weight,
// scale and shift; its output the 1x1's), each run as the two convs; and a conv reading through
// a folded upsampling (its inputs, then the upsampling's source: the channels the upsampling
// would have written into the concat's buffer are not there), run on its input with those
// channels filled in; and the first pool of a max-pool chain (SPPF's), handed the chain's
// outputs, each pooling the one before. So the executor's side of the folds (what it hands, what
// it makes, what it frees) runs without a GPU.
class FoldingCpuBackend : public Backend {
 public:
  Device device() const override { return Device::CPU; }
  void run(const Node& node, const NodePlan& plan, const std::vector<Tensor>& in,
           std::vector<Tensor>& out) override {
    ++runs[node.name];
    if (!plan.chain.empty()) {  // each pool of the chain pools the one before
      REQUIRE(out.size() == plan.chain.size() + 1);
      for (size_t q = 0; q < out.size(); ++q) {
        const Tensor& x = q ? out[q - 1] : in[0];
        cpu::maxpool2d(pool_shape(node, x, out[q]), x.f32(), out[q].f32());
      }
      return;
    }
    if (in.size() <= node.inputs.size()) return cpu_->run(node, plan, in, out);
    REQUIRE(node.op == OpKind::FusedConv2d);
    const auto conv = [](ConvShape s, const Tensor& x, const Tensor& w, const Tensor& scale,
                         const Tensor& shift, const Act& act, Tensor& y) {
      s.x_stride = x.item_stride(), s.y_stride = y.item_stride();
      cpu::conv2d(s, x.f32(), w.f32(), scale.f32(), shift.f32(), act, y.f32(), nullptr);
    };
    if (plan.up) {
      REQUIRE(in.size() == 5);
      const FoldedUpsample& u = *plan.up;
      Tensor x = in[0].clone();
      const Tensor& src = in[4];
      const int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
      const int64_t sh = src.shape()[2], sw = src.shape()[3];
      for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < u.channels; ++k)
          for (int64_t y = 0; y < h; ++y)
            for (int64_t z = 0; z < w; ++z)
              x.f32()[((i * c + u.c0 + k) * h + y) * w + z] =
                  src.f32()[i * src.item_stride() + (k * sh + y / u.scale_h) * sw + z / u.scale_w];
      return conv(conv_shape(node, in, out[0]), x, in[1], in[2], in[3], conv_activation(node),
                  out[0]);
    }
    REQUIRE(in.size() == 7);
    if (plan.post) {
      const FoldedConv& f = *plan.post;
      Tensor mid = Tensor::empty({f.shape.n, f.shape.c, f.shape.h, f.shape.w});
      conv(conv_shape(node, in, mid), in[0], in[1], in[2], in[3], conv_activation(node), mid);
      return conv(f.shape, mid, in[4], in[5], in[6], f.act, out[0]);
    }
    REQUIRE(plan.pre);
    const FoldedConv& f = *plan.pre;
    Tensor mid = Tensor::empty({f.shape.n, f.shape.k, f.shape.ho, f.shape.wo});
    conv(f.shape, in[0], in[4], in[5], in[6], f.act, mid);
    std::vector<Tensor> second{mid, in[1], in[2], in[3]};
    conv(conv_shape(node, second, out[0]), mid, in[1], in[2], in[3], conv_activation(node), out[0]);
  }
  std::map<std::string, int> runs;

 private:
  std::unique_ptr<Backend> cpu_ = make_cpu_backend();
};

// g's plans for the CPU and, lowered as for an H200 (whatever GPU this machine has, if any) but
// run on FoldingCpuBackend, with the folds the CUDA backend would run.
struct FoldPlans {
  Plan cpu, folds;
  explicit FoldPlans(const Graph& g) : cpu(compile(g, {}).plan) {
    LowerOptions o;
    o.device = Device::CUDA;
    folds = lower(cpu.graph, o);
    folds.device = Device::CPU;
  }
  const NodePlan& at(const std::string& name) const {
    return folds.nodes[size_t(folds.graph.find_node(name) - folds.graph.nodes.data())];
  }
};

// The folded plan with copy avoidance on and off against the CPU plan, on random inputs: every
// output bit-equal; the nodes `no_kernel` as the executor lists them with it on; the folded
// nodes `folded` running nothing with it on and their own kernels with it off.
void check_fold_runs(const Graph& g, const FoldPlans& p, uint64_t seed,
                     const std::vector<std::string>& no_kernel,
                     const std::vector<std::string>& folded) {
  const std::map<std::string, Tensor> inputs = test::random_inputs(g, seed);
  auto cpu = make_cpu_backend();
  const std::map<std::string, Tensor> want = Executor(p.cpu, *cpu).run(inputs);
  FoldingCpuBackend backend;
  Executor on(p.folds, backend), off(p.folds, backend);
  off.set_in_place(false);
  CHECK(on.in_place_nodes() == no_kernel);
  for (Executor* ex : {&on, &off}) {
    backend.runs.clear();
    const std::map<std::string, Tensor> got = ex->run(inputs);
    INFO((ex == &on ? "folded" : "unfolded"));
    for (const std::string& name : folded) CHECK(backend.runs.count(name) == (ex == &off));
    REQUIRE(got.size() == want.size());
    for (const auto& [name, t] : want) {
      INFO("output " << name);
      CHECK(test::bit_equal(got.at(name), t));
    }
  }
}

}  // namespace

TEST_CASE("executor: folded convs get the inputs and make the outputs their kernels need",
          "[executor]") {
  // A stem pair (3 -> 16 -> 32 channels, both 3x3 at stride 2) and a chain (32 -> 64 at stride
  // 2, then a 1x1 64 -> 64), each conv with batchnorm and SiLU, the chain's 1x1 read by a split
  // as views: lowered for CUDA (which folds both), run on the CPU, they must give the bits of
  // the graph lowered for the CPU, the folded convs running nothing; and with copy avoidance off,
  // each conv its own.
  Builder b(21);
  Val x = test::conv_bn_silu(b, b.input("images", {1, 3, 640, 640}), "stem", 16, 3, 2);
  x = test::conv_bn_silu(b, x, "down1", 32, 3, 2);
  Val y = test::conv_bn_silu(b, test::conv_bn_silu(b, x, "down2", 64, 3, 2), "cv1", 64, 1, 1);
  std::vector<Val> parts = b.split(y, 1, {32, 32}, "chunk");
  b.output(test::conv_bn_silu(b, parts[1], "head", 16, 3, 1));
  b.output(parts[0]);
  const Graph g = b.build();

  const FoldPlans p(g);
  REQUIRE(p.at("down1").pre);
  REQUIRE(p.at("down2").post);
  check_fold_runs(g, p, 5, {"stem", "cv1", "chunk"}, {"stem", "cv1"});
}

TEST_CASE("executor: a folded upsampling's conv gets its source and the concat its slots",
          "[executor]") {
  // The YOLO neck's join (test::join_graph), the upsampled part first and second, lowered for
  // CUDA (which folds the upsampling into the join's loads) and run on the CPU: the bits of the
  // graph lowered for the CPU, the upsampling running nothing; and with copy avoidance off, the
  // upsampling and the concat as kernels.
  for (const bool up_first : {true, false}) {
    const Graph g = test::join_graph(up_first);
    INFO((up_first ? "upsampled first" : "upsampled second"));
    const FoldPlans p(g);
    REQUIRE(p.at("join").up);
    check_fold_runs(g, p, 300, {"up", "cat"}, {"up"});
  }
}

TEST_CASE("executor: the CPU backend refuses a fold's extra inputs and outputs", "[executor]") {
  // A max-pool chain's first pool, handed the outputs of the pools after it (as the executor
  // hands them to the CUDA backend), would make its own and leave those unmade.
  Builder b(2);
  b.output(b.maxpool2d(b.input("x", {1, 2, 6, 6}), PoolOpts(5).stride(1).padding(2), "pool"));
  const Graph g = b.build();
  auto cpu = make_cpu_backend();
  const Tensor x = Tensor::randn({1, 2, 6, 6}, 3);
  std::vector<Tensor> one{Tensor::empty({1, 2, 6, 6})}, two{one[0], Tensor::empty({1, 2, 6, 6})};
  cpu->run(g.nodes[0], NodePlan{}, {x}, one);
  CHECK_FALSE(test::bit_equal(one[0], x));  // pooled
  REQUIRE_ERROR(cpu->run(g.nodes[0], NodePlan{}, {x}, two), "[maxpool2d] node 'pool'",
                "handed 1 inputs and 2 outputs for its 1 and 1", "only the CUDA backend runs");
  REQUIRE_ERROR(cpu->run(g.nodes[0], NodePlan{}, {x, x}, one), "handed 2 inputs and 1 outputs");
}

TEST_CASE("executor: random conv nets give the unfused graph's outputs, folded or not",
          "[executor][random]") {
  // test::random_convnet graphs, 400 small and 40 large: fused (CPU plan) against unfused, in place
  // against copied, and lowered for CUDA with its folds (run on FoldingCpuBackend) against the CPU
  // plan. Fusion moves the batchnorm into the conv's scale and shift (folded in float64, rounded
  // once), so fused and unfused differ by float32 roundings; the rest run the same kernels on the
  // same numbers.
  int64_t fused = 0, in_place = 0, folds = 0, large_folds = 0;
  auto cpu = make_cpu_backend();
  for (uint64_t seed = 1; seed <= 440; ++seed) {
    const bool large = seed > 400;
    const Graph g = test::random_convnet(seed, large);
    INFO("test::random_convnet(" << seed << (large ? ", large" : "") << "): " << g.nodes.size()
                                 << " nodes");
    const std::map<std::string, Tensor> inputs = test::random_inputs(g, seed);
    CompileOptions plain;
    plain.fuse = false;
    plain.in_place = false;
    plain.share_memory = false;  // so that every run below shares memory against one that does not
    const std::map<std::string, Tensor> want = Executor(compile(g, plain).plan, *cpu).run(inputs);

    const FoldPlans p(g);
    for (const Node& n : p.cpu.graph.nodes) fused += n.op == OpKind::FusedConv2d;
    for (const NodePlan& np : p.folds.nodes) {
      folds += bool(np.pre) + bool(np.post) + bool(np.up) + !np.chain.empty();
      if (large) large_folds += bool(np.post) + bool(np.up);
    }
    Executor on(p.cpu, *cpu), off(p.cpu, *cpu);
    off.set_in_place(false);
    in_place += int64_t(on.in_place_nodes().size());
    const std::map<std::string, Tensor> got = on.run(inputs), copied = off.run(inputs);
    FoldingCpuBackend backend;
    const std::map<std::string, Tensor> folded = Executor(p.folds, backend).run(inputs);
    REQUIRE(got.size() == want.size());
    for (const auto& [name, t] : want) {
      INFO("output " << name);
      CHECK(test::max_rel_err(got.at(name), t) <= 1e-5);
      CHECK(test::bit_equal(copied.at(name), got.at(name)));
      CHECK(test::bit_equal(folded.at(name), got.at(name)));
    }
  }
  // The graphs exercise what the test is for.
  INFO(fused << " fused convs, " << in_place << " nodes run in place, " << folds
             << " folds in the CUDA plans, " << large_folds
             << " of them conv chains and upsamplings in the large graphs");
  CHECK(fused >= 1000);
  CHECK(in_place >= 100);
  CHECK(folds >= 20);
  CHECK(large_folds >= 4);
}

TEST_CASE("executor: a moved executor runs its own plan", "[executor]") {
  // Executors kept in a growing vector are moved as it reallocates: each must still read the
  // graph it holds, not the one left behind in the moved-from object.
  const Graph g = test::random_convnet(11);
  const Compiled c = compile(g, {});
  const std::map<std::string, Tensor> inputs = test::random_inputs(c.plan.graph, 11);
  auto backend = make_cpu_backend();
  const std::map<std::string, Tensor> want = Executor(c.plan, *backend).run(inputs);
  Executor first(c.plan, *backend);
  Executor moved(std::move(first));
  std::vector<Executor> many;
  for (int i = 0; i < 5; ++i) many.emplace_back(c.plan, *backend);
  for (Executor* ex : {&moved, &many.front(), &many.back()}) {
    const std::map<std::string, Tensor> got = ex->run(inputs);
    REQUIRE(got.size() == want.size());
    for (const auto& [name, t] : want) CHECK(test::bit_equal(got.at(name), t));
  }
}

TEST_CASE("executor: compiling and running on the CPU asks nothing of CUDA", "[executor]") {
  const Graph g = test::random_convnet(12);
  const int before = cuda_probes();
  const Compiled c = compile(g, {});
  auto backend = make_cpu_backend();
  Executor(c.plan, *backend).run(test::random_inputs(c.plan.graph, 12));
  CHECK(cuda_probes() == before);
  // A CUDA target does ask, for the local GPU's profile (none in a CPU-only build).
  CompileOptions cuda;
  cuda.device = Device::CUDA;
  compile(g, cuda);
  CHECK(cuda_probes() > before);
}

// A reshape's output is a view of its input (its kernels replace the output the executor made),
// so a concat must not plan to have it written into its buffer, as for flatten.
TEST_CASE("executor: a reshape's view read by a concat", "[executor]") {
  Builder b(3);
  Val x = b.input("x", {1, 4, 8, 8});
  Val c = b.conv2d(x, "c", ConvOpts(4, 3).padding(1));
  Val r = b.reshape(c, {1, 4, 64}, "r");
  Val d = b.reshape(b.conv2d(x, "d", ConvOpts(4, 1)), {1, 4, 64}, "r2");
  b.output(b.relu(b.concat({r, d}, 1, "cat"), "out"));
  const Runs runs = run_both(b.build(), false);
  INFO(fmt::format("{}", fmt::join(runs.in_place, ",")));
  check_equal(runs);
}

TEST_CASE("executor: a flatten or reshape output lives in its input's storage in the memory plan",
          "[executor][memory]") {
  // The backends return such an output as a view of the input, so the input's bytes must stay
  // unshared until the view's last reader has run, here the linear after it.
  for (bool reshape : {false, true}) {
    Builder b(4);
    Val x = b.input("x", {2, 4, 6, 6});
    Val r = b.relu(b.conv2d(x, "c", ConvOpts(4, 3).padding(1)), "r");
    Val f = reshape ? b.reshape(r, {2, 144}, "flat") : b.flatten(r, 1, "flat");
    b.output(b.linear(b.relu(b.linear(f, "fc1", 144), "r2"), "fc2", 5));
    const Compiled c = compile(b.build(), {});
    const MemoryPlan mp = plan_memory(c.plan, plan_in_place(c.plan), true);
    CHECK(mp.blocks.count("flat") == 0);
    size_t fc1 = 0;
    for (size_t i = 0; i < c.plan.graph.nodes.size(); ++i)
      if (c.plan.graph.nodes[i].name == "fc1") fc1 = i;
    REQUIRE(mp.blocks.count("r") == 1);
    CHECK(mp.blocks.at("r").last >= fc1);
    const auto in = test::random_inputs(c.plan.graph, 4);
    auto backend = make_cpu_backend();
    Executor shared(c.plan, *backend), own(c.plan, *backend);
    own.set_memory_plan(false);
    const auto a = shared.run(in), want = own.run(in);
    for (const auto& [name, t] : want) CHECK(test::bit_equal(a.at(name), t));
  }
}

// Nor does the run copy one: the backend hands the output back as a view of the input (on the
// GPU too: tests/gpu "reshape is a view on the device too").
TEST_CASE("executor: a flatten or reshape runs no copy, its output a view of its input",
          "[executor][memory]") {
  class Witness : public Backend {
   public:
    Device device() const override { return Device::CPU; }
    void run(const Node& node, const NodePlan& plan, const std::vector<Tensor>& in,
             std::vector<Tensor>& out) override {
      cpu_->run(node, plan, in, out);
      if (node.op == OpKind::Flatten || node.op == OpKind::Reshape)
        viewed[node.name] = out[0].shares_storage(in[0]);
    }
    std::map<std::string, bool> viewed;

   private:
    std::unique_ptr<Backend> cpu_ = make_cpu_backend();
  };
  Builder b(4);
  Val r = b.relu(b.input("x", {2, 4, 6, 6}), "r");
  b.output(b.linear(b.flatten(r, 1, "flat"), "fc", 5));
  b.output(b.softmax(b.reshape(r, {0, 4, -1}, "rs"), -1, "sm"));
  const Compiled c = compile(b.build(), {});
  Witness witness;
  Executor(c.plan, witness).run(test::random_inputs(c.plan.graph, 4));
  // The linear layer's 1x1 conv adds two reshapes around it, views too.
  CHECK(witness.viewed == std::map<std::string, bool>{
                              {"fc.to_4d", true}, {"fc.to_nd", true}, {"flat", true}, {"rs", true}});
}

TEST_CASE("executor: a conv split by groups reads split views and writes its concat in place",
          "[executor]") {
  Runs r = run_both(test::radix_conv(2, 6));
  check_equal(r);
  for (const char* node : {"radix.groups", "radix.residuals", "radix.concat"}) {
    INFO(node);
    CHECK(std::count(r.in_place.begin(), r.in_place.end(), node) == 1);
  }
}
