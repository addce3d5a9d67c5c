// Helpers shared by the GPU tests.
#pragma once

#include <catch2/catch.hpp>

#include "epilog/graph/lowering.h"
#include "epilog/runtime/executor.h"

namespace epilog::test {

// Whether this GPU and build run the wgmma kernels (compute capability 9.0 and sm_90a code).
// Where not, the calling test case is told so visibly; it then skips its wgmma checks.
inline bool wgmma_here() {
  if (cuda_device_profile().value_or(h200_profile()).wgmma) return true;
  WARN("no warpgroup MMA here (needs compute capability 9.0 and an sm_90a build): skipped");
  return false;
}

}  // namespace epilog::test
