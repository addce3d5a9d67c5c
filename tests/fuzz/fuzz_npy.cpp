// libFuzzer target for the .npy reader: any bytes must parse or throw epilog::Error, and what
// parses must survive write_npy -> read_npy unchanged.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "epilog/io/npy.h"

namespace {
std::string g_file;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_file = (std::filesystem::temp_directory_path() / fmt::format("epilog-fuzz-{}.npy", getpid()))
               .string();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  epilog::Tensor t;
  try {
    t = epilog::parse_npy(data, size, "fuzz.npy");
  } catch (const epilog::Error&) {
    return 0;
  }
  try {
    epilog::write_npy(g_file, t);
    epilog::Tensor back = epilog::read_npy(g_file);
    if (back.shape() != t.shape() || std::memcmp(back.raw(), t.raw(), t.nbytes()) != 0) {
      std::fprintf(stderr, "round trip changed the tensor\n");
      std::abort();
    }
  } catch (const epilog::Error& e) {
    std::fprintf(stderr, "a parsed tensor does not round trip: %s\n", e.what());
    std::abort();
  }
  return 0;
}
