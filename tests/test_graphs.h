// Graphs that both the CPU and the GPU tests build.
#pragma once

#include <string>
#include <vector>

#include "epilog/io/builder.h"

namespace epilog::test {

// The YOLO neck's join, conv(concat(upsample(a), s)), each conv 1x1 with batchnorm and SiLU,
// the upsampled part first or second: lowering for CUDA folds the upsampling into the join's
// loads (the wgmma direct kernel; 40 upsampled channels, so a k tile holds both parts).
inline Graph join_graph(bool up_first) {
  Builder b(/*seed=*/4);
  const auto cbs = [&](Val x, const std::string& name, int64_t c) {
    return b.silu(b.batchnorm(b.conv2d(x, name, ConvOpts(c, 1)), name + ".bn"), name + ".act");
  };
  Val a = cbs(b.input("lo", {4, 8, 20, 24}), "a", 40);
  Val s = cbs(b.input("hi", {4, 8, 40, 48}), "s", 24);
  Val u = b.upsample_nearest(a, 2, "up");
  b.output(cbs(b.concat(up_first ? std::vector<Val>{u, s} : std::vector<Val>{s, u}, 1, "cat"),
               "join", 128));
  return b.build();
}

}  // namespace epilog::test
