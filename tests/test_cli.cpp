// The epilog command line, run as a user would: exit codes, stdout, stderr and files written.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "epilog/io/npy.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

struct Result {
  int status;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

fs::path scratch() {
  return epilog::test::scratch_dir();
}

// Runs `epilog ARGS` with optional environment assignments in front (e.g. "X=1").
Result cli(const std::string& args, const std::string& env = "") {
  std::string out = (scratch() / "stdout").string(), err = (scratch() / "stderr").string();
  std::string cmd = fmt::format("cd '{}' && {} '{}' {} >'{}' 2>'{}'", epilog::test::source_dir(),
                                env, epilog::test::cli_path(), args, out, err);
  int raw = std::system(cmd.c_str());
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, slurp(out), slurp(err)};
}

const char* kDemo = "models/demo_conv_bn_silu.json";

}  // namespace

TEST_CASE("cli: --help, --version and every subcommand's --help", "[cli]") {
  Result r = cli("--help");
  CHECK(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("run") && Catch::Contains("dump") &&
                        Catch::Contains("explain") && Catch::Contains("bench"));
  r = cli("--version");
  CHECK(r.status == 0);
  CHECK_THAT(r.out, Catch::StartsWith("epilog " EPILOG_VERSION));
  for (const char* cmd : {"run", "dump", "explain", "bench"}) {
    r = cli(std::string(cmd) + " --help");
    CHECK(r.status == 0);
    CHECK_THAT(r.out, Catch::StartsWith(std::string("usage: epilog ") + cmd));
  }
  r = cli("");
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Catch::Contains("usage"));
  r = cli("frobnicate x.json");
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Catch::Contains("unknown command 'frobnicate'"));
}

TEST_CASE("cli: run prints fusion, kernels, output statistics and time", "[cli]") {
  Result r = cli(std::string("run ") + kDemo + " --device cpu");
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("fused 1 conv2d->batchnorm->silu"));
  CHECK_THAT(r.out, Catch::Contains("block.conv") && Catch::Contains("act=silu"));
  // On the CPU it also says what a GPU would run.
  CHECK_THAT(r.out, Catch::Contains("kernels on a CUDA GPU") &&
                        Catch::Contains("kernel gemm    (reduction 144 >= 16: gemm)"));
  CHECK_THAT(r.out, Catch::Contains("block.act") && Catch::Contains("[1,16,160,160]") &&
                        Catch::Contains("checksum") && Catch::Contains("time:"));
  // The seed decides the inputs: same seed, same checksum; another seed, another one.
  auto checksum = [](const std::string& out) { return out.substr(out.find("checksum"), 25); };
  Result again = cli(std::string("run ") + kDemo + " --device cpu");
  Result other = cli(std::string("run ") + kDemo + " --device cpu --seed 5");
  CHECK(checksum(again.out) == checksum(r.out));
  CHECK(checksum(other.out) != checksum(r.out));
}

TEST_CASE("cli: run reads .npy inputs and writes .npy outputs", "[cli]") {
  fs::path dir = scratch() / "io";
  fs::create_directories(dir);
  epilog::Tensor x = epilog::Tensor::randn({1, 16, 160, 160}, 77);
  epilog::write_npy((dir / "x.npy").string(), x);
  Result r = cli(fmt::format("run {} --device cpu --input x={} --output {}", kDemo,
                             (dir / "x.npy").string(), (dir / "out").string()));
  REQUIRE(r.status == 0);
  epilog::Tensor y = epilog::read_npy((dir / "out" / "block.act.npy").string());
  CHECK(y.shape() == epilog::Shape{1, 16, 160, 160});
  // The same input through --no-fuse gives the same numbers within float32 rounding.
  Result u = cli(fmt::format("run {} --device cpu --no-fuse --input x={} --output {}", kDemo,
                             (dir / "x.npy").string(), (dir / "unfused").string()));
  REQUIRE(u.status == 0);
  CHECK_THAT(u.out, Catch::Contains("removed 0 dead nodes") && !Catch::Contains("fused 1"));
  epilog::Tensor z = epilog::read_npy((dir / "unfused" / "block.act.npy").string());
  CHECK(epilog::test::max_rel_err(y, z) <= 1e-5);
  // An input at another batch names the fix; with it the model runs at that batch. Another
  // shape is refused naming both.
  epilog::write_npy((dir / "x2.npy").string(), epilog::Tensor::randn({2, 16, 160, 160}, 78));
  epilog::write_npy((dir / "c8.npy").string(), epilog::Tensor::randn({1, 8, 160, 160}, 79));
  const std::string x2 =
      fmt::format("run {} --device cpu --input x={}", kDemo, (dir / "x2.npy").string());
  Result batch = cli(x2);
  CHECK(batch.status == 1);
  CHECK_THAT(batch.err, Catch::Contains("a batch of 2, the model is loaded at batch 1: add "
                                        "--batch 2"));
  Result rebound = cli(x2 + " --batch 2");
  CHECK(rebound.status == 0);
  CHECK_THAT(rebound.out, Catch::Contains("[2,16,160,160]"));
  Result other =
      cli(fmt::format("run {} --device cpu --input x={}", kDemo, (dir / "c8.npy").string()));
  CHECK(other.status == 1);
  CHECK_THAT(other.err,
             Catch::Contains("shape [1,8,160,160], the model's input 'x' is [1,16,160,160]"));
}

TEST_CASE("cli: --batch rebinds the batch dimension", "[cli]") {
  Result r = cli(std::string("dump ") + kDemo + " --stage source --batch 3");
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("input %x : [3,16,160,160]"));
}

TEST_CASE("cli: dump at every stage and format", "[cli]") {
  Result r = cli(std::string("dump ") + kDemo + " --stage source");
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("= batchnorm(%block.conv"));
  r = cli(std::string("dump ") + kDemo);  // default: fused, text
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("= fused_conv2d(%x, @block.conv.weight, @block.conv.scale"));
  CHECK_THAT(r.err, Catch::Contains("fused 1 conv2d->batchnorm->silu"));
  r = cli(std::string("dump ") + kDemo + " --format dot");
  CHECK_THAT(r.out, Catch::StartsWith("digraph") && Catch::Contains("fillcolor"));
  r = cli(std::string("dump ") + kDemo + " --stage lowered --device cpu");
  CHECK_THAT(r.out, Catch::Contains("CPU reference"));
  fs::path out = scratch() / "fused.json";
  r = cli(std::string("dump ") + kDemo + " --format json -o " + out.string());
  REQUIRE(r.status == 0);
  CHECK_THAT(slurp(out.string()), Catch::Contains("\"op\": \"fused_conv2d\""));
  r = cli(std::string("dump ") + kDemo + " --format yaml");
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("unknown dump format 'yaml'"));
}

TEST_CASE("cli: --dump-passes and EPILOG_DUMP_DIR write every stage", "[cli]") {
  fs::path dir = scratch() / "passes";
  Result r = cli(std::string("dump ") + kDemo + " --dump-passes " + dir.string());
  REQUIRE(r.status == 0);
  for (const char* f : {"00-source", "01-canonicalize", "02-reparameterize", "03-fuse", "04-dce"})
    for (const char* ext : {".txt", ".dot", ".json"})
      CHECK(fs::exists(dir / (std::string(f) + ext)));
  CHECK_THAT(slurp((dir / "03-fuse.txt").string()), Catch::Contains("fused_conv2d"));
  fs::path env_dir = scratch() / "env_passes";
  r = cli(std::string("dump ") + kDemo, "EPILOG_DUMP_DIR=" + env_dir.string());
  REQUIRE(r.status == 0);
  CHECK(fs::exists(env_dir / "00-source.json"));
  CHECK(fs::exists(env_dir / "lowered.txt"));
}

TEST_CASE("cli: EPILOG_DISABLE_FUSION=1 switches fusion off", "[cli]") {
  Result r = cli(std::string("dump ") + kDemo, "EPILOG_DISABLE_FUSION=1");
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, !Catch::Contains("fused_conv2d") && Catch::Contains("batchnorm"));
}

TEST_CASE("cli: explain shows kernel, rule and tiles without a GPU", "[cli]") {
  Result r = cli("explain models/yolo_like.json");
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("132 SMs") && Catch::Contains("fused 45"));
  CHECK_THAT(r.out, Catch::Contains("memory: weights ") && Catch::Contains(" MiB at peak"));
  CHECK_THAT(r.out, Catch::Contains("gemm") && Catch::Contains("reduction 144 >= 16") &&
                        Catch::Contains("stages="));
  // The 8 splits and 13 concats that the executor runs in place, and none with that off.
  CHECK(epilog::test::count_of(r.out, " in place ") == 21);
  Result copies = cli("explain models/yolo_like.json", "EPILOG_DISABLE_IN_PLACE=1");
  CHECK_THAT(copies.out, !Catch::Contains(" in place ") && Catch::Contains("one kernel"));
  Result small = cli("explain models/yolo_like.json --sm-count 8");
  REQUIRE(small.status == 0);
  CHECK_THAT(small.out, Catch::Contains("8 SMs"));
  CHECK(small.out != r.out);  // fewer SMs, larger tiles
  Result forced = cli("explain models/yolo_like.json", "EPILOG_FORCE_CONV_KERNEL=tiled");
  CHECK_THAT(forced.out, Catch::Contains("forced") && !Catch::Contains(" gemm "));
  Result bad = cli("explain models/yolo_like.json", "EPILOG_FORCE_CONV_KERNEL=fast");
  CHECK(bad.status == 1);
  CHECK_THAT(bad.err, Catch::Contains("EPILOG_FORCE_CONV_KERNEL='fast'"));
}

TEST_CASE("cli: bench reports median, min, max and a per-node breakdown", "[cli]") {
  Result r = cli(std::string("bench ") + kDemo + " --device cpu --iters 2 --warmup 1");
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("median") && Catch::Contains("min") && Catch::Contains("max") &&
                        Catch::Contains("per node"));
  CHECK_THAT(r.out, Catch::Contains("block.conv") && Catch::Contains("%"));
  CHECK_THAT(r.out, Catch::Contains("memory: weights ") && Catch::Contains("workspace"));
  CHECK_THAT(r.out, Catch::Contains("over 2 iterations") &&
                        Catch::Contains("per node (median of 2 profiled runs"));
  // Nodes that run without a kernel say so, as in explain.
  Result yolo = cli("bench models/yolo_like.json --device cpu --iters 1 --warmup 0");
  REQUIRE(yolo.status == 0);
  const size_t cat = yolo.out.find("b2.cat ");
  REQUIRE(cat != std::string::npos);
  CHECK_THAT(yolo.out.substr(cat, yolo.out.find('\n', cat) - cat), Catch::Contains("in place"));
}

TEST_CASE("cli: bench --batch N,M sweeps one model over batch sizes", "[cli]") {
  Result r = cli(std::string("bench ") + kDemo + " --device cpu --batch 1,2 --iters 1 --warmup 0");
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("batch 1 ") && Catch::Contains("batch 2 ") &&
                        Catch::Contains("images/s"));
  // A warm-up of at least so long, on top of --warmup's runs; a time below 0 is refused.
  const auto t0 = std::chrono::steady_clock::now();
  Result timed = cli(std::string("bench ") + kDemo + " --device cpu --iters 1 --warmup-ms 400");
  CHECK(timed.status == 0);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(400));
  Result negative = cli(std::string("bench ") + kDemo + " --device cpu --warmup-ms -5");
  CHECK(negative.status == 1);
  CHECK_THAT(negative.err, Catch::Contains("--warmup-ms: expected an integer >= 0, got '-5'"));
  Result one = cli(std::string("run ") + kDemo + " --device cpu --batch 1,2");
  CHECK(one.status == 1);
  CHECK_THAT(one.err, Catch::Contains("one batch size here"));
}

TEST_CASE("cli: bad input is one clear error and exit status 1, never a crash", "[cli]") {
  struct Case {
    std::string args, message;
  };
  fs::path bad = scratch() / "bad.json";
  std::ofstream(bad) << "{\"format\": \"epilog\", \"version\": 1, \"inputs\": [";
  for (const Case& c : std::vector<Case>{
           {"run models/missing.json", "models/missing.json"},
           {"run " + bad.string(), "invalid JSON"},
           {"run " + std::string(kDemo) + " --batch 0", "--batch: expected an integer >= 1"},
           {"run " + std::string(kDemo) + " --iters 3", "unknown option '--iters'"},
           {"run " + std::string(kDemo) + " --device tpu", "unknown device 'tpu'"},
           {"run " + std::string(kDemo) + " --input y=a.npy", "the model has no input 'y'"},
           {"run " + std::string(kDemo) + " --input x=missing.npy", "missing.npy"},
           {"run " + std::string(kDemo) + " --weights missing.safetensors", "missing.safetensors"},
           {"dump " + std::string(kDemo) + " --stage middle", "--stage 'middle'"},
           {"run", "no MODEL given"},
       }) {
    INFO(c.args);
    Result r = cli(c.args);
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::Contains(c.message));
    // One line that says which command failed, once: "epilog run: ...".
    const std::string prefix = "epilog " + c.args.substr(0, c.args.find(' ')) + ": ";
    CHECK_THAT(r.err, Catch::StartsWith(prefix));
    CHECK(r.err.find(prefix, prefix.size()) == std::string::npos);
  }
}
