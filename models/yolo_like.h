// A YOLOv8n-style backbone + neck built with the graph-builder API: the same layers, in the
// same order and with the same parameter names as YoloLike in bench/torch_yolo_like.py, so
// that its state_dict loads as is. 45 conv -> batchnorm -> silu blocks, C2f blocks with
// chunk/concat/residual add, SPPF with three 5x5 max-pools, nearest upsampling.
#pragma once

#include <string>

#include "epilog/io/builder.h"

namespace yolo {

using epilog::Builder;
using epilog::ConvOpts;
using epilog::Val;

// Conv: conv (no bias, padding k/2) -> batchnorm (eps 1e-3) -> silu.
inline Val conv(Builder& b, Val x, const std::string& p, int64_t c2, int64_t k = 1, int64_t s = 1) {
  Val y = b.conv2d(x, p + ".conv", ConvOpts(c2, k).stride(s).padding(k / 2));
  return b.silu(b.batchnorm(y, p + ".bn", 1e-3), p + ".act");
}

inline Val bottleneck(Builder& b, Val x, const std::string& p, int64_t c, bool shortcut) {
  Val y = conv(b, conv(b, x, p + ".cv1", c, 3), p + ".cv2", c, 3);
  return shortcut ? b.add(x, y, p + ".add") : y;
}

// C2f: split cv1's output in two, chain n bottlenecks on the last part, concat all parts.
inline Val c2f(Builder& b, Val x, const std::string& p, int64_t c2, int n, bool shortcut) {
  int64_t c = c2 / 2;
  std::vector<Val> ys = b.chunk(conv(b, x, p + ".cv1", 2 * c), 2, 1, p + ".chunk");
  for (int i = 0; i < n; ++i)
    ys.push_back(bottleneck(b, ys.back(), p + ".m." + std::to_string(i), c, shortcut));
  return conv(b, b.concat(ys, 1, p + ".cat"), p + ".cv2", c2);
}

// SPPF: three chained 5x5 stride-1 max-pools, concatenated with their input.
inline Val sppf(Builder& b, Val x, const std::string& p, int64_t c2) {
  int64_t c = b.shape(x)[1] / 2;
  Val x1 = conv(b, x, p + ".cv1", c);
  auto pool = epilog::PoolOpts(5).stride(1).padding(2);
  Val y1 = b.maxpool2d(x1, pool, p + ".m");
  Val y2 = b.maxpool2d(y1, pool, p + ".m_1");
  Val y3 = b.maxpool2d(y2, pool, p + ".m_2");
  return conv(b, b.concat({x1, y1, y2, y3}, 1, p + ".cat"), p + ".cv2", c2);
}

// Outputs o3, o4, o5 at strides 8, 16 and 32.
inline epilog::Graph yolo_like(Builder& b, int64_t batch = 1, int64_t size = 640) {
  Val x = b.input("images", {batch, 3, size, size});
  x = conv(b, x, "b0", 16, 3, 2);
  x = conv(b, x, "b1", 32, 3, 2);
  x = c2f(b, x, "b2", 32, 1, true);
  Val p3 = c2f(b, conv(b, x, "b3", 64, 3, 2), "b4", 64, 2, true);
  Val p4 = c2f(b, conv(b, p3, "b5", 128, 3, 2), "b6", 128, 2, true);
  Val p5 = sppf(b, c2f(b, conv(b, p4, "b7", 256, 3, 2), "b8", 256, 1, true), "b9", 256);
  Val n12 = c2f(b, b.concat({b.upsample_nearest(p5, 2, "up"), p4}, 1, "cat"), "n12", 128, 1, false);
  Val o3 =
      c2f(b, b.concat({b.upsample_nearest(n12, 2, "up_1"), p3}, 1, "cat_1"), "n15", 64, 1, false);
  Val o4 = c2f(b, b.concat({conv(b, o3, "n16", 64, 3, 2), n12}, 1, "cat_2"), "n18", 128, 1, false);
  Val o5 = c2f(b, b.concat({conv(b, o4, "n19", 128, 3, 2), p5}, 1, "cat_3"), "n21", 256, 1, false);
  b.output(o3);
  b.output(o4);
  b.output(o5);
  return b.build();
}

}  // namespace yolo
