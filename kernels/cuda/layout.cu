// Layout CUDA kernels: strided gathers (transpose, slice), padding and resizing.
//
// gather   y[i] = x[offset + sum_d i_d * stride[d]] over y's multi-index i (StridedView). The
//          host first drops size-1 dims and merges neighbours that x walks as one dim.
//          Generic kernel: one output per thread, grid-stride, its index decoded dim by dim;
//          writes coalesced, reads too where the innermost dim has stride 1 (slices).
//          Transposed kernel, where the innermost dim has another stride and some dim p has
//          stride 1 (transposes that move x's innermost dim, NCHW <-> NHWC): 32 x 32 tiles of
//          (p, innermost) staged through shared memory (padded a column), read along p and
//          written along the innermost dim, so both sides are coalesced. Block: 32 x 8 threads,
//          4 elements each; grid.x walks (tiles of p) x (tiles of innermost) x (the other dims).
// pad      y[i] = x[src(i)] or value; src per dim as cpu::pad (constant, reflect, edge).
// resize   y[p, oh, ow] from x[p, ., .] by resize_source / resize_nearest / resize_linear
//          (shapes.h, which the CPU reference shares): one output per thread, ow fastest.
// Layout: float32, contiguous, device pointers; x and y must not overlap.
// Index math is 64-bit (gather's generic kernel 32-bit when every index fits), plain divisions:
// these are copies whose cost is their memory traffic.
// Restrictions: up to kMaxRank dims (the caller checks).
#include <cuda_runtime.h>

#include <cstdint>

#include "epilog/kernels/cuda.h"
#include "launch.cuh"

namespace epilog::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 32, kTileRows = 8;
using namespace detail;

// -- gather --

template <class I>
__global__ void __launch_bounds__(kThreads)
    gather_kernel(StridedView v, I total, const float* __restrict__ x, float* __restrict__ y) {
  pdl_begin();
  const I step = I(gridDim.x) * kThreads;
  for (I i = I(blockIdx.x) * kThreads + threadIdx.x; i < total; i += step) {
    I rest = i, src = I(v.offset);
#pragma unroll
    for (int d = kMaxRank - 1; d >= 0; --d) {
      if (d >= v.rank) continue;
      const I size = I(v.size[d]), idx = rest % size;
      rest /= size;
      src += idx * I(v.stride[d]);
    }
    y[i] = __ldg(x + src);
  }
}

// v's dims other than p and the innermost: the tile's batch, decoded per block.
__global__ void __launch_bounds__(kTile* kTileRows)
    gather_transposed_kernel(StridedView v, int p, int64_t tiles_p, int64_t tiles_l, int64_t blocks,
                             const float* __restrict__ x, float* __restrict__ y) {
  pdl_begin();
  __shared__ float tile[kTile][kTile + 1];
  const int last = v.rank - 1;
  const int64_t np = v.size[p], nl = v.size[last], sl = v.stride[last];
  // y's strides over v's dims (contiguous).
  int64_t ystride[kMaxRank];
  int64_t acc = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    ystride[d] = acc;
    acc *= v.size[d];
  }
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int64_t tl = b % tiles_l, tp = b / tiles_l % tiles_p;
    int64_t rest = b / tiles_l / tiles_p, xo = v.offset, yo = 0;
    for (int d = v.rank - 2; d >= 0; --d) {
      if (d == p) continue;
      const int64_t idx = rest % v.size[d];
      rest /= v.size[d];
      xo += idx * v.stride[d];
      yo += idx * ystride[d];
    }
    const int64_t p0 = tp * kTile, l0 = tl * kTile;
    // -- read along p (x's stride-1 dim) --
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
      const int64_t gp = p0 + threadIdx.x, gl = l0 + r;
      if (gp < np && gl < nl) tile[r][threadIdx.x] = __ldg(x + xo + gp + gl * sl);
    }
    __syncthreads();
    // -- write along the innermost dim (y's stride-1 dim) --
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
      const int64_t gp = p0 + r, gl = l0 + threadIdx.x;
      if (gp < np && gl < nl) y[yo + gp * ystride[p] + gl] = tile[threadIdx.x][r];
    }
    __syncthreads();
  }
}

// -- pad --

__global__ void __launch_bounds__(kThreads)
    pad_kernel(PadShape s, PadMode mode, float value, int64_t total, const float* __restrict__ x,
               float* __restrict__ y) {
  pdl_begin();
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * kThreads) {
    int64_t rest = i, src = 0, stride = 1;
    bool inside = true;
    for (int d = s.rank - 1; d >= 0; --d) {
      const int64_t o = rest % s.out[d] - s.begin[d], n = s.in[d];
      rest /= s.out[d];
      int64_t k = o;
      if (o < 0 || o >= n) {
        if (mode == PadMode::Constant)
          inside = false;
        else if (mode == PadMode::Edge)
          k = o < 0 ? 0 : n - 1;
        else
          k = o < 0 ? -o : 2 * (n - 1) - o;
      }
      src += k * stride;
      stride *= n;
    }
    y[i] = inside ? __ldg(x + src) : value;
  }
}

// -- resize --

__global__ void __launch_bounds__(kThreads)
    resize_kernel(int64_t total, int64_t h, int64_t w, int64_t ho, int64_t wo, ResizeMode m,
                  const float* __restrict__ x, float* __restrict__ y) {
  pdl_begin();
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * kThreads) {
    const int64_t ow = i % wo, oh = i / wo % ho, plane = i / (wo * ho);
    const float* src = x + plane * h * w;
    const float sy = resize_source(m.coord, oh, h, ho), sx = resize_source(m.coord, ow, w, wo);
    float v;
    if (!m.linear) {
      v = __ldg(src + resize_nearest(m.nearest, sy, h) * w + resize_nearest(m.nearest, sx, w));
    } else {
      const LinearTap ty = resize_linear(sy, h), tx = resize_linear(sx, w);
      const float top =
          __ldg(src + ty.i0 * w + tx.i0) * (1 - tx.w1) + __ldg(src + ty.i0 * w + tx.i1) * tx.w1;
      const float bot =
          __ldg(src + ty.i1 * w + tx.i0) * (1 - tx.w1) + __ldg(src + ty.i1 * w + tx.i1) * tx.w1;
      v = top * (1 - ty.w1) + bot * ty.w1;
    }
    y[i] = v;
  }
}

}  // namespace

void gather(const StridedView& view, const float* x, float* y, Stream stream) {
  EPILOG_CUDA_REQUIRE(view.rank >= 0 && view.rank <= kMaxRank);
  // -- merge: drop size-1 dims, join d with d + 1 where x walks them as one --
  StridedView v{};
  v.offset = view.offset;
  int64_t total = 1, extent = view.offset + 1;
  for (int d = 0; d < view.rank; ++d) {
    total *= view.size[d];
    extent += (view.size[d] - 1) * (view.stride[d] < 0 ? -view.stride[d] : view.stride[d]);
    if (view.size[d] == 1) continue;
    if (v.rank > 0 && v.stride[v.rank - 1] == view.stride[d] * view.size[d]) {
      v.size[v.rank - 1] *= view.size[d];
      v.stride[v.rank - 1] = view.stride[d];
      continue;
    }
    v.size[v.rank] = view.size[d];
    v.stride[v.rank] = view.stride[d];
    ++v.rank;
  }
  if (total == 0) return;
  if (v.rank == 0) v = {1, {1}, {1}, view.offset};
  int p = -1;  // a dim of stride 1 other than the innermost
  for (int d = 0; d + 1 < v.rank; ++d)
    if (v.stride[d] == 1) p = d;
  if (v.stride[v.rank - 1] != 1 && p >= 0) {
    const int64_t tiles_p = ceil_div(v.size[p], kTile),
                  tiles_l = ceil_div(v.size[v.rank - 1], kTile);
    const int64_t blocks = total / (v.size[p] * v.size[v.rank - 1]) * tiles_p * tiles_l;
    gather_transposed_kernel<<<grid_for(blocks, 1), dim3(kTile, kTileRows), 0, stream>>>(
        v, p, tiles_p, tiles_l, blocks, x, y);
    check_launch("gather (transposed)");
    return;
  }
  if (fits32(total) && fits32(extent))
    gather_kernel<uint32_t>
        <<<grid_for(total, kThreads), kThreads, 0, stream>>>(v, uint32_t(total), x, y);
  else
    gather_kernel<int64_t><<<grid_for(total, kThreads), kThreads, 0, stream>>>(v, total, x, y);
  check_launch("gather");
}

void pad(const PadShape& s, PadMode mode, float value, const float* x, float* y, Stream stream) {
  EPILOG_CUDA_REQUIRE(s.rank >= 1 && s.rank <= kMaxRank);
  int64_t total = 1;
  for (int d = 0; d < s.rank; ++d) total *= s.out[d];
  if (total == 0) return;
  pad_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(s, mode, value, total, x, y);
  check_launch("pad");
}

void resize(int64_t planes, int64_t h, int64_t w, int64_t ho, int64_t wo, const ResizeMode& mode,
            const float* x, float* y, Stream stream) {
  const int64_t total = planes * ho * wo;
  if (total == 0) return;
  resize_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(total, h, w, ho, wo, mode, x,
                                                                    y);
  check_launch("resize");
}

}  // namespace epilog::cuda
