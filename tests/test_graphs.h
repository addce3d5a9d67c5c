// Graphs that both the CPU and the GPU tests build.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "epilog/io/builder.h"
#include "epilog/kernels/shapes.h"

namespace epilog::test {

// conv (k x k at `stride`, padded k / 2 a side) -> batchnorm -> SiLU, the YOLO block: nodes
// `name`, name.bn and name.act.
inline Val conv_bn_silu(Builder& b, Val x, const std::string& name, int64_t c, int64_t k,
                        int64_t stride = 1) {
  return b.silu(
      b.batchnorm(b.conv2d(x, name, ConvOpts(c, k).stride(stride).padding(k / 2)), name + ".bn"),
      name + ".act");
}

// The YOLO neck's join, conv(concat(upsample(a), s)), each conv 1x1 with batchnorm and SiLU,
// the upsampled part first or second: lowering for CUDA folds the upsampling into the join's
// loads (the wgmma direct kernel; 40 upsampled channels, so a k tile holds both parts).
inline Graph join_graph(bool up_first) {
  Builder b(/*seed=*/4);
  const auto cbs = [&](Val x, const std::string& name, int64_t c) {
    return conv_bn_silu(b, x, name, c, 1);
  };
  Val a = cbs(b.input("lo", {4, 8, 20, 24}), "a", 40);
  Val s = cbs(b.input("hi", {4, 8, 40, 48}), "s", 24);
  Val u = b.upsample_nearest(a, 2, "up");
  b.output(cbs(b.concat(up_first ? std::vector<Val>{u, s} : std::vector<Val>{s, u}, 1, "cat"),
               "join", 128));
  return b.build();
}

// A DenseNet block: each layer reads the concat of every feature before it ("cat<l>") through
// batchnorm -> relu (an elementwise chain, fused) and a 3x3 conv that adds `growth` channels; the
// block's input is an average pool. The executor runs the last concat ("cat_all") in place and
// the others as its first channels; at batch > 1 all of them are strided slabs. `bottleneck`:
// DenseNet-BC's layers, batchnorm -> relu -> a 1x1 conv to that many channels -> batchnorm ->
// relu -> the 3x3.
inline Graph dense_block(int64_t batch, int64_t c0, int64_t growth, int64_t layers, int64_t size,
                         int64_t bottleneck = 0) {
  Builder b(/*seed=*/11);
  Val x = b.input("x", {batch, 3, 2 * size, 2 * size});
  Val f0 = b.avgpool2d(b.conv2d(x, "stem", ConvOpts(c0, 3).padding(1)), PoolOpts(2), "pool");
  std::vector<Val> feats{f0};
  for (int64_t l = 0; l < layers; ++l) {
    const std::string at = std::to_string(l);
    Val in = l == 0 ? f0 : b.concat(feats, 1, "cat" + at);
    Val act = b.relu(b.batchnorm(in, "bn" + at), "relu" + at);
    if (bottleneck > 0) {  // DenseNet-BC's 1x1 first, its batchnorm -> relu fused into it
      act = b.conv2d(act, "conv1x1_" + at, ConvOpts(bottleneck, 1));
      act = b.relu(b.batchnorm(act, "bn1x1_" + at), "relu1x1_" + at);
    }
    feats.push_back(b.conv2d(act, "conv" + at, ConvOpts(growth, 3).padding(1)));
  }
  b.output(b.relu(b.batchnorm(b.concat(feats, 1, "cat_all"), "bn_all"), "out"));
  return b.build();
}

// ResNeSt's radix conv: relu -> a 3x3 conv of two groups of 64 -> 64 channels -> relu, plus a
// residual of 128 channels, at `batch` on planes of `size`. The passes split the conv into one
// a group ("radix.g0", "radix.g1") over the split views of x ("radix.groups") and of the
// residual ("radix.residuals"), their concat ("radix.concat") in place.
inline Graph radix_conv(int64_t batch, int64_t size) {
  Builder b(/*seed=*/23);
  Val x = b.input("x", {batch, 64, size, size});
  Val skip = b.input("skip", {batch, 128, size, size});
  Val y = b.relu(b.conv2d(b.relu(x, "pre"), "radix", ConvOpts(128, 3).padding(1).groups(2)),
                 "act");
  b.output(b.add(y, skip, "res"));
  return b.build();
}

// A random small conv net from `seed`, for the differential tests: conv -> batchnorm ->
// activation chains (SiLU as such or as mul(x, sigmoid(x)), ReLU, sigmoid, none; 1x1, 3x3, 5x5,
// strided, dilated, depthwise, with a bias or not) with residual adds, squeeze-and-excite gates,
// elementwise adds and products, concats, chunks, pools and upsamplings, sometimes a classifier
// head. Values are read by several nodes, some are never read, and an output may come from the
// middle of a chain: what fusion must refuse and the executor's copy avoidance must get right.
// `large`: batches of 4 to 8 on planes of 32 to 48, where lowering for CUDA also folds conv
// chains and upsamplings (the small ones have batches of 1 or 2 on planes of 8 to 22).
inline Graph random_convnet(uint64_t seed, bool large = false) {
  std::mt19937_64 rng(seed);
  const auto pick = [&](size_t n) { return size_t(rng() % n); };
  Builder b(seed);
  const int64_t batch = large ? 4 + pick(5) : 1 + pick(2), channels = pick(2) ? 3 : 4 + pick(13);
  const int64_t height = large ? 32 + 4 * pick(5) : 8 + 2 * pick(8);
  const int64_t width = large ? 32 + 4 * pick(5) : 8 + 2 * pick(8);
  std::vector<Val> pool{b.input("x", {batch, channels, height, width})};
  // Mostly one of the last three values, so that chains grow long.
  const auto any = [&] {
    return pick(4) ? pool[pool.size() - 1 - pick(std::min<size_t>(3, pool.size()))]
                   : pool[pick(pool.size())];
  };
  const auto same_shape = [&](const Shape& s, const std::string& not_this) -> const Val* {
    std::vector<const Val*> found;
    for (const Val& v : pool)
      if (v.name != not_this && b.shape(v) == s) found.push_back(&v);
    return found.empty() ? nullptr : found[pick(found.size())];
  };
  const auto act = [&](Val v, const std::string& name) {
    switch (pick(5)) {
      case 0:
        return b.silu(v, name);
      case 1:
        return b.relu(v, name);
      case 2:
        return b.sigmoid(v, name);
      case 3:
        return b.mul(v, b.sigmoid(v, name + ".sig"), name);
      default:
        return v;
    }
  };
  const int steps = 5 + int(pick(10));
  for (int i = 0; i < steps; ++i) {
    const std::string id = "n" + std::to_string(i);
    const Val x = any();
    const Shape s = b.shape(x);
    const int64_t c = s[1], h = s[2], w = s[3];
    switch (pick(11)) {
      case 0:
      case 1:
      case 2:
      case 3: {  // conv -> batchnorm -> activation, perhaps + residual
        const int64_t k = pick(5) == 0 ? 5 : pick(2) ? 3 : 1;
        ConvOpts o(int64_t(2 + pick(31)), k);
        const int64_t dil = k == 3 && h >= 8 && w >= 8 && pick(6) == 0 ? 2 : 1;
        o.padding(dil * (k / 2)).dilation(dil).bias(pick(3) == 0);
        if (h >= 8 && w >= 8 && pick(4) == 0) o.stride(2);
        if (pick(6) == 0) o = ConvOpts(c, 3).padding(1).groups(c);  // depthwise
        Val y = b.conv2d(x, id + ".conv", o);
        if (pick(5)) y = b.batchnorm(y, id + ".bn");
        y = act(y, id + ".act");
        if (pick(3) == 0)
          if (const Val* r = same_shape(b.shape(y), y.name))
            y = pick(2) ? b.add(y, *r, id + ".add") : b.add(*r, y, id + ".add");
        pool.push_back(y);
        break;
      }
      case 4: {  // squeeze-and-excite
        Val g = b.global_avgpool(x, id + ".gap");
        g = b.silu(b.conv2d(g, id + ".fc1", ConvOpts(int64_t(2 + pick(8)), 1).bias()), id + ".a1");
        g = b.sigmoid(b.conv2d(g, id + ".fc2", ConvOpts(c, 1).bias()), id + ".gate");
        pool.push_back(b.mul(x, g, id + ".se"));
        break;
      }
      case 5: {  // an elementwise pair
        if (const Val* o = same_shape(s, x.name))
          pool.push_back(pick(2) ? b.add(x, *o, id + ".add") : b.mul(*o, x, id + ".mul"));
        else
          pool.push_back(act(x, id + ".act"));
        break;
      }
      case 6: {  // a concat along channels, or a chunk of one
        std::vector<Val> parts{x};
        for (const Val& v : pool)
          if (v.name != x.name && b.shape(v)[0] == s[0] && b.shape(v)[2] == h &&
              b.shape(v)[3] == w && parts.size() < 3 && pick(2))
            parts.push_back(v);
        if (parts.size() > 1) {
          pool.push_back(b.concat(parts, 1, id + ".cat"));
        } else if (c >= 2) {
          for (const Val& part : b.chunk(x, 2, 1, id + ".chunk")) pool.push_back(part);
        }
        break;
      }
      case 7:  // pools: SPPF's (same size) or halving
        if (pick(2)) {
          const int64_t k = pick(2) ? 3 : 5;
          pool.push_back(b.maxpool2d(x, PoolOpts(k).stride(1).padding(k / 2), id + ".max"));
        } else if (h >= 4 && w >= 4) {
          pool.push_back(pick(2) ? b.maxpool2d(x, PoolOpts(2), id + ".max")
                                 : b.avgpool2d(x, PoolOpts(2), id + ".avg"));
        }
        break;
      case 8:
        if (h * w <= (large ? 48 * 48 : 16 * 16))
          pool.push_back(b.upsample_nearest(x, 2, id + ".up"));
        break;
      case 9: {  // what lowering for CUDA folds: a stem pair (at these sizes too), a conv
                 // chain and the neck's join (which fold on larger grids, and fuse here)
        const auto cbs = [&](Val v, const std::string& name, int64_t cout, int64_t k,
                             int64_t stride = 1) {
          return conv_bn_silu(b, v, name, cout, k, stride);
        };
        const size_t kind = pick(3);
        const Val& in = pool.front();
        if (kind == 0 && b.shape(in)[1] <= kPairMaxCin) {  // a stem pair on the input
          const Val mid = cbs(in, id + ".stem", int64_t(4 + pick(kPairMaxMid - 3)), 3, 2);
          pool.push_back(cbs(mid, id + ".down", int64_t(8 + pick(kPairMaxCout - 7)), 3, 2));
        } else if (kind == 1) {  // a conv chain: 3x3 into 64 channels, then a 1x1
          pool.push_back(cbs(cbs(x, id + ".cv", kChainC, 3), id + ".pw", kChainC, 1));
        } else if (h % 2 == 0 && w % 2 == 0) {  // the neck's join through an upsampling
          const Val up = b.upsample_nearest(
              cbs(b.maxpool2d(x, PoolOpts(2), id + ".down"), id + ".lat", int64_t(8 + pick(33)), 1),
              2, id + ".up");
          const Val cat =
              b.concat(pick(2) ? std::vector<Val>{up, x} : std::vector<Val>{x, up}, 1, id + ".cat");
          pool.push_back(cbs(cat, id + ".join", int64_t(32 + pick(33)), 1));
        }
        break;
      }
      default:
        pool.push_back(act(x, id + ".act"));
        break;
    }
  }
  // The last value, and sometimes one from the middle (its producer must not be fused away).
  const Val last = pool.back();
  if (pick(4) == 0) {
    b.output(b.linear(b.flatten(b.global_avgpool(last, "head.gap"), 1, "head.flat"), "head.fc",
                      int64_t(3 + pick(8))));
  } else {
    b.output(last);
  }
  if (pool.size() > 2 && pick(2)) {
    const Val mid = pool[pick(pool.size() - 1)];
    if (mid.name != last.name && mid.name != "x") b.output(mid);
  }
  return b.build();
}

}  // namespace epilog::test
