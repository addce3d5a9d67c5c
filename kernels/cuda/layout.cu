// Layout CUDA kernels: strided gathers (transpose, slice), padding and resizing.
//
// gather   y[i] = x[offset + sum_d i_d * stride[d]] over y's multi-index i (StridedView). The
//          host first drops size-1 dims and merges neighbours that x walks as one dim.
//          Generic kernel: kUnroll outputs a thread, kThreads apart (all their loads issued
//          before the first store), each index decoded dim by dim; writes coalesced, reads too
//          where the innermost dim has stride 1 (slices).
//          Transposed kernel, where the innermost dim l has another stride and some dim p has
//          stride 1 (transposes that move x's innermost dim, NCHW <-> NHWC): tiles of kTileP
//          (along p) x kTileL (along l) staged through shared memory (padded a column), read
//          along p and written along l, so both sides are coalesced. Block: 32 x 8 threads,
//          8 elements each; block b is tile (b % tiles_l) along l, (b / tiles_l % tiles_p) along
//          p, and the rest of b the other dims.
// pad      y[i] = x[src(i)] or value; src per dim as cpu::pad (constant, reflect, edge). The host
//          merges dims first: an unpadded dim into the one before it when that one is unpadded
//          too or the mode is constant (a constant pad of [.., a, b] with b unpadded is one of
//          [.., a * b] scaled by b). kUnroll outputs a thread as gather's, the mode a template
//          parameter.
// resize   y[p, oh, ow] from x[p, ., .] by resize_source / resize_nearest / resize_linear
//          (shapes.h, which the CPU reference shares). Nearest with integer scales whose
//          coordinate mode reads input o / scale for every output o (resize_nearest_factor
//          checks each index) runs as upsample_nearest (data.cu). Otherwise an item is V outputs of
//          one row (V = 4, one float4 store, where wo % 4 == 0 and y is 16-byte aligned; else 1):
//          the row's source coordinate once, each column's own.
// Layout: float32, contiguous, device pointers; x and y must not overlap.
// Grid: enough blocks for every item (grid_cover: the block scheduler balances the waves, and a
//   kernel whose registers allow fewer than 8 blocks an SM keeps no second, partial wave), with
//   a grid-stride loop past 2^31 - 1 blocks.
// Index math is 32-bit when every index is below 2^31, its divisions by launch constants then
// multiply-shifts (FastDiv); else 64-bit.
// Restrictions: up to kMaxRank dims (the caller checks).
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "epilog/kernels/cuda.h"
#include "launch.cuh"

namespace epilog::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr int kTileP = 64, kTileL = 32, kTileRows = 8;
using namespace detail;

// Dims innermost first, each with its size (and divisor) and a stride.
template <class I>
struct Dims {
  int rank;
  I size[kMaxRank], stride[kMaxRank];
  FastDiv div[kMaxRank];
};

template <class I>
Dims<I> dims_of(int rank, const int64_t* size, const int64_t* stride) {
  Dims<I> d{};
  d.rank = rank;
  for (int k = 0; k < rank; ++k) {
    d.size[k] = I(size[k]);
    d.stride[k] = I(stride[k]);  // a negative stride wraps in uint32_t; so do the sums, exactly
    if constexpr (std::is_same_v<I, uint32_t>) d.div[k] = make_fastdiv(uint32_t(size[k]));
  }
  return d;
}

// y[i] = source(i) for every i < total: kUnroll outputs a thread, kThreads apart, every load
// issued before the first store.
template <class I, class Source>
__device__ __forceinline__ void unrolled_outputs(I total, Source source, float* __restrict__ y) {
  const I step = I(gridDim.x) * kThreads * kUnroll;
  for (I base = I(blockIdx.x) * kThreads * kUnroll + threadIdx.x; base < total; base += step) {
    float r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const I i = base + I(u) * kThreads;
      if (i < total) r[u] = source(i);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const I i = base + I(u) * kThreads;
      if (i < total) y[i] = r[u];
    }
  }
}

// -- gather --

template <class I>
__global__ void __launch_bounds__(kThreads)
    gather_kernel(Dims<I> v, I offset, I total, const float* __restrict__ x,
                  float* __restrict__ y) {
  pdl_begin();
  unrolled_outputs(
      total,
      [&](I i) {
        I rest = i, src = offset;
#pragma unroll
        for (int d = 0; d < kMaxRank; ++d) {
          if (d >= v.rank) break;
          if (d + 1 == v.rank) {  // the outermost dim: what is left is its index
            src += rest * v.stride[d];
            break;
          }
          const I q = quot(rest, v.size[d], v.div[d]);
          src += (rest - q * v.size[d]) * v.stride[d];
          rest = q;
        }
        return __ldg(x + src);
      },
      y);
}

// The transposed kernel's view: p and l (sizes, x's stride of l, y's of p), the tiles, and the
// other dims (the batch), innermost first, with their strides in x and in y.
struct TransposeWalk {
  int batch_rank;
  int64_t size[kMaxRank], xs[kMaxRank], ys[kMaxRank];
  int64_t offset, np, nl, sl, yp, tiles_p, tiles_l, blocks;
};

template <class I>
__global__ void __launch_bounds__(kTileL* kTileRows)
    gather_transposed_kernel(TransposeWalk t, const float* __restrict__ x, float* __restrict__ y) {
  pdl_begin();
  __shared__ float tile[kTileL][kTileP + 1];
  const I np = I(t.np), nl = I(t.nl), sl = I(t.sl), yp = I(t.yp);
  for (int64_t b = blockIdx.x; b < t.blocks; b += gridDim.x) {
    const int64_t tl = b % t.tiles_l, tp = b / t.tiles_l % t.tiles_p;
    int64_t rest = b / t.tiles_l / t.tiles_p, xo = t.offset, yo = 0;
#pragma unroll
    for (int d = 0; d < kMaxRank; ++d) {
      if (d >= t.batch_rank) break;
      const int64_t idx = rest % t.size[d];
      rest /= t.size[d];
      xo += idx * t.xs[d];
      yo += idx * t.ys[d];
    }
    const I p0 = I(tp * kTileP), l0 = I(tl * kTileL);
    const float* xt = x + xo;
    float* yt = y + yo;
    // -- read along p (x's stride-1 dim): every load of the tile before the first smem store --
    float r[kTileP / 32][kTileL / kTileRows];
#pragma unroll
    for (int c = 0; c < kTileP / 32; ++c)
#pragma unroll
      for (int k = 0; k < kTileL / kTileRows; ++k) {
        const I gp = p0 + I(c * 32 + threadIdx.x), gl = l0 + I(k * kTileRows + threadIdx.y);
        r[c][k] = gp < np && gl < nl ? __ldg(xt + gp + gl * sl) : 0.0f;
      }
#pragma unroll
    for (int c = 0; c < kTileP / 32; ++c)
#pragma unroll
      for (int k = 0; k < kTileL / kTileRows; ++k)
        tile[k * kTileRows + threadIdx.y][c * 32 + threadIdx.x] = r[c][k];
    __syncthreads();
    // -- write along l (y's stride-1 dim) --
#pragma unroll
    for (int k = 0; k < kTileP / kTileRows; ++k) {
      const I gp = p0 + I(k * kTileRows + threadIdx.y), gl = l0 + I(threadIdx.x);
      if (gp < np && gl < nl) yt[gp * yp + gl] = tile[threadIdx.x][k * kTileRows + threadIdx.y];
    }
    __syncthreads();
  }
}

// -- pad --

// The merged dims, innermost first: output sizes (and divisors), input sizes, begins and the
// input's strides.
template <class I>
struct PadWalk {
  int rank;
  I out[kMaxRank], in[kMaxRank], begin[kMaxRank], stride[kMaxRank];
  FastDiv div[kMaxRank];
};

template <PadMode M, class I>
__global__ void __launch_bounds__(kThreads)
    pad_kernel(PadWalk<I> w, float value, I total, const float* __restrict__ x,
               float* __restrict__ y) {
  pdl_begin();
  using S = std::make_signed_t<I>;
  unrolled_outputs(
      total,
      [&](I i) {
        I rest = i, src = 0;
#pragma unroll
        for (int d = 0; d < kMaxRank; ++d) {
          if (d >= w.rank) break;
          I o = rest;  // the outermost dim: what is left is its index
          if (d + 1 < w.rank) {
            const I q = quot(rest, w.out[d], w.div[d]);
            o = rest - q * w.out[d];
            rest = q;
          }
          const S n = S(w.in[d]);
          S k = S(o) - S(w.begin[d]);
          if (k < 0 || k >= n) {  // as cpu::pad's pad_source
            if constexpr (M == PadMode::Constant)
              return value;
            else if constexpr (M == PadMode::Edge)
              k = k < 0 ? 0 : n - 1;
            else
              k = k < 0 ? -k : 2 * (n - 1) - k;
          }
          src += I(k) * w.stride[d];
        }
        return __ldg(x + src);
      },
      y);
}

// -- resize --

template <bool Linear, int V, class I>
__global__ void __launch_bounds__(kThreads)
    resize_kernel(I items, Divisor<I> chunks, Divisor<I> rows_per_plane, I h, I w, I wo,
                  ResizeMode m, const float* __restrict__ x, float* __restrict__ y) {
  pdl_begin();
  const I ho = rows_per_plane.d, step = I(gridDim.x) * kThreads;
  for (I item = I(blockIdx.x) * kThreads + threadIdx.x; item < items; item += step) {
    const I row = chunks.div(item), ow = (item - row * chunks.d) * V;
    const I plane = rows_per_plane.div(row), oh = row - plane * ho;
    const float* src = x + plane * h * w;
    const float sy = resize_source(m.coord, oh, h, ho);
    float v[V];
    if constexpr (!Linear) {
      const float* in = src + resize_nearest(m.nearest, sy, h) * w;
#pragma unroll
      for (int j = 0; j < V; ++j)
        v[j] = __ldg(in + resize_nearest(m.nearest, resize_source(m.coord, ow + I(j), w, wo), w));
    } else {
      const LinearTap<I> ty = resize_linear(sy, h);
      const float *r0 = src + ty.i0 * w, *r1 = src + ty.i1 * w;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const LinearTap<I> tx = resize_linear(resize_source(m.coord, ow + I(j), w, wo), w);
        const float top = __ldg(r0 + tx.i0) * (1 - tx.w1) + __ldg(r0 + tx.i1) * tx.w1;
        const float bot = __ldg(r1 + tx.i0) * (1 - tx.w1) + __ldg(r1 + tx.i1) * tx.w1;
        v[j] = top * (1 - ty.w1) + bot * ty.w1;
      }
    }
    float* out = y + row * wo + ow;
    if constexpr (V == 4)
      *reinterpret_cast<float4*>(out) = make_float4(v[0], v[1], v[2], v[3]);
    else
      *out = v[0];
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
  const bool small = fits32(total) && fits32(extent);
  int p = -1;  // a dim of stride 1 other than the innermost
  for (int d = 0; d + 1 < v.rank; ++d)
    if (v.stride[d] == 1) p = d;
  if (v.stride[v.rank - 1] != 1 && p >= 0) {
    const int last = v.rank - 1;
    TransposeWalk t{};
    int64_t ystride = 1;  // y's stride of dim d (contiguous over v's dims)
    for (int d = last; d >= 0; --d) {
      if (d == p) t.yp = ystride;
      if (d != p && d != last) {
        t.size[t.batch_rank] = v.size[d], t.xs[t.batch_rank] = v.stride[d];
        t.ys[t.batch_rank++] = ystride;
      }
      ystride *= v.size[d];
    }
    t.offset = v.offset, t.np = v.size[p], t.nl = v.size[last], t.sl = v.stride[last];
    t.tiles_p = ceil_div(t.np, kTileP), t.tiles_l = ceil_div(t.nl, kTileL);
    t.blocks = total / (t.np * t.nl) * t.tiles_p * t.tiles_l;
    const dim3 block(kTileL, kTileRows);
    if (small)  // signed: the innermost dim's stride in x may be negative
      gather_transposed_kernel<int32_t><<<grid_cover(t.blocks, 1), block, 0, stream>>>(t, x, y);
    else
      gather_transposed_kernel<int64_t><<<grid_cover(t.blocks, 1), block, 0, stream>>>(t, x, y);
    check_launch("gather (transposed)");
    return;
  }
  int64_t size[kMaxRank], stride[kMaxRank];  // innermost first
  for (int d = 0; d < v.rank; ++d)
    size[d] = v.size[v.rank - 1 - d], stride[d] = v.stride[v.rank - 1 - d];
  const int grid = grid_cover(total, kThreads * kUnroll);
  if (small)
    gather_kernel<uint32_t><<<grid, kThreads, 0, stream>>>(
        dims_of<uint32_t>(v.rank, size, stride), uint32_t(v.offset), uint32_t(total), x, y);
  else
    gather_kernel<int64_t><<<grid, kThreads, 0, stream>>>(dims_of<int64_t>(v.rank, size, stride),
                                                          v.offset, total, x, y);
  check_launch("gather");
}

void pad(const PadShape& s, PadMode mode, float value, const float* x, float* y, Stream stream) {
  EPILOG_CUDA_REQUIRE(s.rank >= 1 && s.rank <= kMaxRank);
  // -- merge, outermost first: an unpadded dim joins the one before it where that one is
  // unpadded too, or the mode is constant --
  struct Dim {
    int64_t in, out, begin;
  };
  Dim dims[kMaxRank];
  int rank = 0;
  int64_t total = 1, numel = 1;
  for (int d = 0; d < s.rank; ++d) {
    total *= s.out[d];
    numel *= s.in[d];
    const Dim cur{s.in[d], s.out[d], s.begin[d]};
    const bool unpadded = cur.in == cur.out && cur.begin == 0;
    if (rank > 0 && unpadded) {
      Dim& prev = dims[rank - 1];
      if (mode == PadMode::Constant || (prev.in == prev.out && prev.begin == 0)) {
        prev = {prev.in * cur.in, prev.out * cur.in, prev.begin * cur.in};
        continue;
      }
    }
    dims[rank++] = cur;
  }
  if (total == 0) return;
  const auto launch = [&](auto i, auto m) {
    using I = decltype(i);
    PadWalk<I> w{};
    w.rank = rank;
    I stride = 1;
    for (int q = 0; q < rank; ++q) {  // innermost first
      const Dim& d = dims[rank - 1 - q];
      w.out[q] = I(d.out), w.in[q] = I(d.in), w.begin[q] = I(d.begin), w.stride[q] = stride;
      if constexpr (std::is_same_v<I, uint32_t>) w.div[q] = make_fastdiv(uint32_t(d.out));
      stride *= I(d.in);
    }
    pad_kernel<decltype(m)::value, I>
        <<<grid_cover(total, kThreads * kUnroll), kThreads, 0, stream>>>(w, value, I(total), x, y);
  };
  const auto with_mode = [&](auto i) {
    using P = PadMode;
    switch (mode) {
      case P::Constant:
        return launch(i, std::integral_constant<P, P::Constant>{});
      case P::Reflect:
        return launch(i, std::integral_constant<P, P::Reflect>{});
      case P::Edge:
        return launch(i, std::integral_constant<P, P::Edge>{});
    }
  };
  if (fits32(total) && fits32(numel))
    with_mode(uint32_t{});
  else
    with_mode(int64_t{});
  check_launch("pad");
}

void resize(int64_t planes, int64_t h, int64_t w, int64_t ho, int64_t wo, const ResizeMode& mode,
            const float* x, float* y, Stream stream) {
  const int64_t total = planes * ho * wo;
  if (total == 0) return;
  const int64_t fh = resize_nearest_factor(mode, h, ho), fw = resize_nearest_factor(mode, w, wo);
  if (fh > 0 && fw > 0)
    return upsample_nearest(planes, 1, h, w, fh, fw, x, h * w, y, ho * wo, stream);
  const bool vec = wo % 4 == 0 && aligned16(y);
  const int64_t chunks = vec ? wo / 4 : wo, items = planes * ho * chunks;
  dispatch(vec, fits32(total) && fits32(planes * h * w), [&](auto v, auto i) {
    using I = decltype(i);
    constexpr int V = decltype(v)::value;
    const int grid = grid_cover(items, kThreads);
    const auto args = [&](auto kernel) {
      kernel<<<grid, kThreads, 0, stream>>>(I(items), Divisor<I>(I(chunks)), Divisor<I>(I(ho)),
                                            I(h), I(w), I(wo), mode, x, y);
    };
    if (mode.linear)
      args(resize_kernel<true, V, I>);
    else
      args(resize_kernel<false, V, I>);
  });
  check_launch("resize");
}

}  // namespace epilog::cuda
