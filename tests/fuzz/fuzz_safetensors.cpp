// libFuzzer target for the safetensors reader: any bytes must parse or throw epilog::Error, and
// what parses must survive write_safetensors -> read_safetensors unchanged.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "epilog/io/safetensors.h"

namespace {
std::string g_file;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_file =
      (std::filesystem::temp_directory_path() / fmt::format("epilog-fuzz-{}.safetensors", getpid()))
          .string();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, epilog::Tensor> tensors;
  try {
    tensors = epilog::parse_safetensors(data, size, "fuzz.safetensors");
  } catch (const epilog::Error&) {
    return 0;
  }
  try {
    epilog::write_safetensors(g_file, tensors);
    auto back = epilog::read_safetensors(g_file);
    bool same = back.size() == tensors.size();
    for (const auto& [name, t] : tensors) {
      auto it = back.find(name);
      same = same && it != back.end() && it->second.shape() == t.shape() &&
             std::memcmp(it->second.raw(), t.raw(), t.nbytes()) == 0;
    }
    if (!same) {
      std::fprintf(stderr, "round trip changed the tensors\n");
      std::abort();
    }
  } catch (const epilog::Error& e) {
    std::fprintf(stderr, "parsed tensors do not round trip: %s\n", e.what());
    std::abort();
  }
  return 0;
}
