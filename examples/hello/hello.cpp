// Loads a model, runs it on seeded random inputs and prints each output's shape and first values.
//   hello MODEL [cpu|cuda|auto]
#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <string>

#include "epilog/epilog.h"
#include "epilog/io/model.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: hello MODEL [cpu|cuda|auto]\n");
    return 2;
  }
  try {
    epilog::Graph graph = epilog::load_model(argv[1]);
    epilog::CompileOptions options;
    options.device = epilog::resolve_device(argc > 2 ? argv[2] : "auto");
    epilog::Compiled compiled = epilog::compile(std::move(graph), options.with_env());

    std::map<std::string, epilog::Tensor> inputs;
    for (const std::string& name : compiled.plan.graph.inputs)
      inputs[name] = epilog::Tensor::randn(compiled.plan.graph.value(name).shape, /*seed=*/1);

    auto backend = epilog::make_backend(options.device);
    epilog::Executor executor(compiled.plan, *backend);
    for (const auto& [name, output] : executor.run(inputs)) {
      const epilog::Tensor host = output.to(epilog::Device::CPU);
      std::printf("%s %s:", name.c_str(), epilog::shape_str(host.shape()).c_str());
      for (int64_t i = 0; i < std::min<int64_t>(host.numel(), 4); ++i)
        std::printf(" %.5f", host.f32()[i]);
      std::printf("%s\n", host.numel() > 4 ? " ..." : "");
    }
    std::printf("%s on %s: %s\n", argv[1], epilog::device_name(options.device),
                epilog::memory_use(compiled.plan).summary().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hello: %s\n", e.what());
    return 1;
  }
  return 0;
}
