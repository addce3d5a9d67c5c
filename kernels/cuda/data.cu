// Data-movement CUDA kernels: the slab copies behind concat and split, the channel shuffle,
// nearest upsampling.
//
// copy_slabs  for each slab k: dst_k[o * dst_row_k + dst_start_k + j] =
//             src_k[o * src_row_k + src_start_k + j] for o < outer, j < len_k: each o one
//             contiguous run of len_k floats in both tensors. concat and split are one launch
//             for all their parts (up to kMaxSlabs a launch): a launch each cost the four
//             4 x [16,256,20,20] parts of YOLOv5's SPPF concat more than their copies.
// channel_shuffle  y[img, o, :] = x[img, (o % groups) * (C / groups) + o / groups, :], x the
//             parts concatenated on dim 1: each output row (img, o) one contiguous run of inner
//             floats copied from its part.
// upsample    y[p, oh, ow] = x[p, oh / scale_h, ow / scale_w] over planes p < n * c, with
//             y's planes (h * scale_h) x (w * scale_w).
// Layout: float32, device pointers; src and dst must not overlap. Slab rows may lie apart
//   (src_row, dst_row); channel_shuffle's parts' and y's images part.item and y_item floats
//   apart, upsample's x_image and y_image (channel slabs of a larger batch); everything else is
//   contiguous.
// Grid: copy_slabs: blocks of kThreads x kUnroll items, each in one slab: slab k owns blocks
//   [first_block[k], first_block[k + 1]), every block of every slab launched at once, and a
//   thread's kUnroll items kThreads apart, all loaded before the first store. upsample and
//   channel_shuffle: 1-D and grid-stride, kThreads per block, at most one full wave (grid_for).
//   A work item is V = 4 consecutive floats of one row (float4 loads and stores) when the row
//   length and every row start are multiples of 4 and the pointers are 16-byte aligned, else one
//   float (copy_slabs launches the slabs that allow float4 apart from those that do not). Slab
//   item w is row w / chunks, column (w % chunks) * V; channel_shuffle's the same over y's rows
//   (image, channel). upsample: item w is output row w / chunks (plane
//   row / ho, oh = row % ho), columns (w % chunks) * V .. + V, each read from
//   x[iw = ow / scale_w]: neighbouring outputs share inputs, so a warp's reads hit 1 / scale_w
//   as many addresses as it writes.
// Index math is 32-bit when every index is below 2^31 (its divisions by launch constants then
// multiply-shifts, see Divisor), else 64-bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "epilog/kernels/cuda.h"
#include "launch.cuh"

namespace epilog::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
using namespace detail;

// -- copy_slabs --

// One launch's slabs: pointers, rows and starts in the index type, chunks (V-float items) a
// row, and each slab's first block (first_block[n]: the grid).
template <class I>
struct SlabSet {
  int n;
  const float* src[kMaxSlabs];
  float* dst[kMaxSlabs];
  I src_row[kMaxSlabs], src_start[kMaxSlabs], dst_row[kMaxSlabs], dst_start[kMaxSlabs];
  I chunks[kMaxSlabs], items[kMaxSlabs];
  FastDiv div[kMaxSlabs];
  int64_t first_block[kMaxSlabs + 1];
};

template <int V, class I>
__global__ void __launch_bounds__(kThreads) copy_slabs_kernel(SlabSet<I> s) {
  pdl_begin();
  using T = std::conditional_t<V == 4, float4, float>;
  // -- this block's slab: chosen by unrolled selects, so that s stays in the parameter bank --
  const int64_t b = blockIdx.x;
  int k = 0;
#pragma unroll
  for (int j = 1; j < kMaxSlabs; ++j)
    if (j < s.n && b >= s.first_block[j]) k = j;
  const float* src = s.src[0];
  float* dst = s.dst[0];
  I src_row = s.src_row[0], src_start = s.src_start[0], dst_row = s.dst_row[0];
  I dst_start = s.dst_start[0], chunks = s.chunks[0], items = s.items[0];
  FastDiv div = s.div[0];
  int64_t first = s.first_block[0];
#pragma unroll
  for (int j = 1; j < kMaxSlabs; ++j)
    if (j == k) {
      src = s.src[j], dst = s.dst[j], src_row = s.src_row[j], src_start = s.src_start[j];
      dst_row = s.dst_row[j], dst_start = s.dst_start[j], chunks = s.chunks[j];
      items = s.items[j], div = s.div[j], first = s.first_block[j];
    }
  // -- kUnroll items a thread, all loads first --
  const I base = I(b - first) * (kThreads * kUnroll) + threadIdx.x;
  T v[kUnroll];
  I at[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const I w = base + I(u) * kThreads;
    if (w >= items) continue;
    I o;
    if constexpr (std::is_same_v<I, uint32_t>)
      o = I(fast_div(int(w), div));
    else
      o = w / chunks;
    const I col = (w - o * chunks) * V;
    v[u] = __ldg(reinterpret_cast<const T*>(src + o * src_row + src_start + col));
    at[u] = o * dst_row + dst_start + col;
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (base + I(u) * kThreads < items) *reinterpret_cast<T*>(dst + at[u]) = v[u];
}

// -- channel_shuffle --

// One launch's parts: pointers, each one's first channel of x and item stride.
template <class I>
struct ShuffleSet {
  int n;
  const float* x[kMaxSlabs];
  I first[kMaxSlabs], item[kMaxSlabs];
};

template <int V, class I>
__global__ void __launch_bounds__(kThreads)
    shuffle_kernel(ShuffleSet<I> s, I items, Divisor<I> chunks, Divisor<I> c, Divisor<I> groups,
                   I per, I inner, float* __restrict__ y, I y_item) {
  pdl_begin();
  using T = std::conditional_t<V == 4, float4, float>;
  const I step = I(gridDim.x) * kThreads;
  for (I w = I(blockIdx.x) * kThreads + threadIdx.x; w < items; w += step) {
    const I row = chunks.div(w), col = (w - row * chunks.d) * V;
    const I img = c.div(row), o = row - img * c.d;
    const I j = groups.div(o), q = (o - j * groups.d) * per + j;
    // -- q's part, by unrolled selects (s stays in the parameter bank) --
    const float* x = s.x[0];
    I first = s.first[0], item = s.item[0];
#pragma unroll
    for (int k = 1; k < kMaxSlabs; ++k)
      if (k < s.n && q >= s.first[k]) x = s.x[k], first = s.first[k], item = s.item[k];
    const T v = __ldg(reinterpret_cast<const T*>(x + img * item + (q - first) * inner + col));
    *reinterpret_cast<T*>(y + img * y_item + o * inner + col) = v;
  }
}

// -- upsample_nearest --

template <int V, class I>
__global__ void __launch_bounds__(kThreads)
    upsample_kernel(Divisor<I> chunks, I items, Divisor<I> c, I h, I w, Divisor<I> ho, I wo,
                    Divisor<I> scale_h, Divisor<I> scale_w, const float* __restrict__ x, I xs,
                    float* __restrict__ y, I ys) {
  pdl_begin();
  const I step = I(gridDim.x) * kThreads;
  for (I item = I(blockIdx.x) * kThreads + threadIdx.x; item < items; item += step) {
    const I row = chunks.div(item), ow = (item - row * chunks.d) * V;
    const I plane = ho.div(row), oh = row - plane * ho.d;
    const I img = c.div(plane), ch = plane - img * c.d;
    const float* in = x + img * xs + (ch * h + scale_h.div(oh)) * w;
    float v[V];
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = __ldg(in + scale_w.div(ow + I(j)));
    float* out = y + img * ys + (ch * ho.d + oh) * wo + ow;
    if constexpr (V == 4)
      *reinterpret_cast<float4*>(out) = make_float4(v[0], v[1], v[2], v[3]);
    else
      *out = v[0];
  }
}

}  // namespace

void copy_slabs(int64_t outer, const Slab* slabs, int n, Stream stream) {
  if (outer == 0) return;
  // -- launches of up to kMaxSlabs non-empty slabs each, float4 ones apart from the others --
  for (const bool vec : {true, false}) {
    const Slab* group[kMaxSlabs];
    int count = 0;
    const auto flush = [&] {
      if (count == 0) return;
      int64_t span = 0;  // every index is below the larger tensor's extent
      for (int k = 0; k < count; ++k)
        span = std::max({span, outer * group[k]->src_row, outer * group[k]->dst_row});
      dispatch(vec, fits32(span), [&](auto v, auto i) {
        using I = decltype(i);
        constexpr int V = decltype(v)::value;
        SlabSet<I> s{};
        s.n = count;
        int64_t blocks = 0;
        for (int k = 0; k < count; ++k) {
          const Slab& g = *group[k];
          const int64_t chunks = g.len / V;
          s.src[k] = g.src, s.dst[k] = g.dst;
          s.src_row[k] = I(g.src_row), s.src_start[k] = I(g.src_start);
          s.dst_row[k] = I(g.dst_row), s.dst_start[k] = I(g.dst_start);
          s.chunks[k] = I(chunks), s.items[k] = I(outer * chunks);
          if constexpr (std::is_same_v<I, uint32_t>) s.div[k] = make_fastdiv(uint32_t(chunks));
          s.first_block[k] = blocks;
          blocks += ceil_div(outer * chunks, kThreads * kUnroll);
        }
        s.first_block[count] = blocks;
        EPILOG_CUDA_REQUIRE(blocks <= 0x7fffffff);
        launch_pdl(copy_slabs_kernel<V, I>, int(blocks), kThreads, 0, stream, 1, s);
      });
      check_launch("copy_slabs");
      count = 0;
    };
    for (int k = 0; k < n; ++k) {
      const Slab& g = slabs[k];
      if (g.len == 0) continue;
      const bool four = g.len % 4 == 0 && g.src_row % 4 == 0 && g.dst_row % 4 == 0 &&
                        g.src_start % 4 == 0 && g.dst_start % 4 == 0 && aligned16(g.src) &&
                        aligned16(g.dst);
      if (four != vec) continue;
      group[count++] = &g;
      if (count == kMaxSlabs) flush();
    }
    flush();
  }
}

void channel_shuffle(int64_t n, int64_t inner, int64_t groups, const ShufflePart* parts, int count,
                     float* y, int64_t y_item, Stream stream) {
  EPILOG_CUDA_REQUIRE(count >= 1 && count <= kMaxSlabs && groups >= 1);
  int64_t c = 0, span = n * y_item;  // every index is below the largest tensor's extent
  bool vec = inner % 4 == 0 && y_item % 4 == 0 && aligned16(y);
  for (int k = 0; k < count; ++k) {
    c += parts[k].channels;
    span = std::max(span, n * parts[k].item);
    vec = vec && parts[k].item % 4 == 0 && aligned16(parts[k].x);
  }
  EPILOG_CUDA_REQUIRE(c % groups == 0);
  const int64_t chunks = vec ? inner / 4 : inner, items = n * c * chunks;
  if (items == 0) return;
  dispatch(vec, fits32(std::max(span, items)), [&](auto v, auto i) {
    using I = decltype(i);
    ShuffleSet<I> s{};
    s.n = count;
    int64_t first = 0;
    for (int k = 0; k < count; ++k) {
      s.x[k] = parts[k].x, s.first[k] = I(first), s.item[k] = I(parts[k].item);
      first += parts[k].channels;
    }
    launch_pdl(shuffle_kernel<decltype(v)::value, I>, grid_for(items, kThreads), kThreads, 0,
               stream, 1, s, I(items), Divisor<I>(I(chunks)), Divisor<I>(I(c)),
               Divisor<I>(I(groups)), I(c / groups), I(inner), y, I(y_item));
  });
  check_launch("channel_shuffle");
}

void upsample_nearest(int64_t n, int64_t c, int64_t h, int64_t w, int64_t scale_h, int64_t scale_w,
                      const float* x, int64_t x_image, float* y, int64_t y_image, Stream stream) {
  const int64_t ho = h * scale_h, wo = w * scale_w, rows = n * c * ho;
  if (rows == 0 || wo == 0) return;
  const bool vec = wo % 4 == 0 && y_image % 4 == 0 && aligned16(y);
  const int64_t chunks = vec ? wo / 4 : wo;
  const int64_t items = rows * chunks;
  dispatch(vec, fits32(n * std::max(x_image, y_image)), [&](auto v, auto i) {
    using I = decltype(i);
    launch_pdl(upsample_kernel<decltype(v)::value, I>, grid_for(items, kThreads), kThreads, 0,
               stream, 1, Divisor<I>(I(chunks)), I(items), Divisor<I>(I(c)), I(h), I(w),
               Divisor<I>(I(ho)), I(wo), Divisor<I>(I(scale_h)), Divisor<I>(I(scale_w)), x,
               I(x_image), y, I(y_image));
  });
  check_launch("upsample_nearest");
}

}  // namespace epilog::cuda
