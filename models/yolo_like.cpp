// Builds the YOLO-like model with the graph-builder API and runs it: the example to copy when
// writing a model in C++.
//
//   yolo_like [--batch N] [--size S] [--seed N] [--device cpu|cuda|auto] [--save FILE.json]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "epilog/epilog.h"
#include "epilog/io/model.h"
#include "yolo_like.h"

namespace {

void usage(FILE* to) {
  std::fprintf(to,
               "usage: yolo_like [--batch N] [--size S] [--seed N] [--device cpu|cuda|auto]\n"
               "                 [--save FILE.json]\n"
               "Builds the YOLO-like model through the C++ API (seeded weights) and runs it on\n"
               "a seeded random input, printing each output's shape and statistics. --save\n"
               "writes the model as JSON instead (models/yolo_like.json is made this way).\n");
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 1, size = 640;
  uint64_t seed = 1;
  std::string device = "auto", save;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") return usage(stdout), 0;
    if (i + 1 >= argc) return usage(stderr), 2;
    if (a == "--batch")
      batch = std::atoll(argv[++i]);
    else if (a == "--size")
      size = std::atoll(argv[++i]);
    else if (a == "--seed")
      seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--device")
      device = argv[++i];
    else if (a == "--save")
      save = argv[++i];
    else
      return usage(stderr), 2;
  }
  if (batch < 1 || size < 32 || size % 32 != 0) {
    std::fprintf(stderr, "yolo_like: need --batch >= 1 and --size a multiple of 32\n");
    return 2;
  }
  try {
    epilog::Builder b(seed);
    epilog::Graph g = yolo::yolo_like(b, batch, size);
    std::printf("built %zu nodes, %zu weights\n", g.nodes.size(), g.weights.size());
    if (!save.empty()) {
      epilog::save_model(g, save);
      std::printf("saved %s\n", save.c_str());
      return 0;
    }

    // Fuse conv -> batchnorm -> silu chains and pick a kernel for every node.
    epilog::CompileOptions options;
    options.device = epilog::resolve_device(device);
    epilog::Compiled compiled = epilog::compile(std::move(g), options.with_env());
    std::printf("passes: %s\n", compiled.report.summary().c_str());
    auto backend = epilog::make_backend(options.device);
    epilog::Executor ex(compiled.plan, *backend);
    auto x = epilog::Tensor::randn({batch, 3, size, size}, seed);
    auto t0 = std::chrono::steady_clock::now();
    auto outs = ex.run({{"images", x}});
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    for (const std::string& name : ex.graph().outputs) {
      epilog::Tensor t = outs.at(name).to(epilog::Device::CPU);
      const float* p = t.f32();
      double sum = 0, lo = p[0], hi = p[0];
      for (int64_t i = 0; i < t.numel(); ++i) {
        sum += p[i];
        lo = std::min<double>(lo, p[i]);
        hi = std::max<double>(hi, p[i]);
      }
      std::printf("%-12s %-18s min %9.4f  max %9.4f  mean %9.5f\n", name.c_str(),
                  epilog::shape_str(t.shape()).c_str(), lo, hi, sum / double(t.numel()));
    }
    std::printf("ran on %s in %.1f ms\n", epilog::device_name(options.device), ms);
  } catch (const epilog::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
