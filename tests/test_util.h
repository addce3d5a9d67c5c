// Helpers shared by the tests: seeded inputs, CPU runs, error measures.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>

#include <unistd.h>

#include "epilog/graph/lowering.h"
#include "test_acts.h"
#include "epilog/runtime/executor.h"

namespace epilog::test {

// Where the repository and the CLI are: the environment wins over the build's paths, so that
// binaries built on one machine can run on another.
inline std::string source_dir() {
  const char* dir = std::getenv("EPILOG_SOURCE_DIR");
  return dir && *dir ? dir : EPILOG_SOURCE_DIR;
}

inline std::string cli_path() {
  const char* cli = std::getenv("EPILOG_CLI");
  return cli && *cli ? cli : EPILOG_CLI;
}

// A directory of the test process's own, removed with what is in it when the process exits.
inline const std::filesystem::path& scratch_dir() {
  struct Dir {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() /
        ("epilog-test-" + std::to_string(getpid()) + "-" + std::to_string(std::random_device{}()));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static Dir dir;
  return dir.path;
}

inline std::map<std::string, Tensor> random_inputs(const Graph& g, uint64_t seed) {
  std::map<std::string, Tensor> in;
  for (const std::string& name : g.inputs)
    in[name] = Tensor::randn(g.value(name).shape, hash_string(name, seed));
  return in;
}

// Runs the graph as it is (no passes) on the CPU reference backend.
inline std::map<std::string, Tensor> run_cpu(const Graph& g,
                                             const std::map<std::string, Tensor>& inputs) {
  auto backend = make_cpu_backend();
  Executor ex(lower(g, LowerOptions{}), *backend);
  return ex.run(inputs);
}

// max |a - b| / max |b|: the error relative to the scale of the reference. NaN anywhere
// gives infinity so that it never passes.
inline double max_rel_err(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::CPU), hb = b.to(Device::CPU);
  if (ha.shape() != hb.shape()) return INFINITY;
  const float *pa = ha.f32(), *pb = hb.f32();
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < ha.numel(); ++i) {
    if (std::isnan(pa[i]) || std::isnan(pb[i])) return INFINITY;
    diff = std::max(diff, std::fabs(double(pa[i]) - double(pb[i])));
    scale = std::max(scale, std::fabs(double(pb[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

inline bool bit_equal(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::CPU), hb = b.to(Device::CPU);
  return ha.shape() == hb.shape() &&
         std::equal(ha.f32(), ha.f32() + ha.numel(), hb.f32(),
                    [](float x, float y) { return std::memcmp(&x, &y, sizeof x) == 0; });
}

// How many times `what` occurs in `text` (overlaps counted).
inline size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace epilog::test
