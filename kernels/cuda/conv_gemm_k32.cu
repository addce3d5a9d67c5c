// conv_gemm's k = 32 kernels on mma.sync: the gather kernel (any shape, split-K on Hopper) and
// the persistent direct kernel (1x1, stride 1, unpadded). conv_gemm_k32.cuh describes both.
#include <atomic>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "conv_gemm_k32.cuh"
#include "epilog/runtime/launch_log.h"

namespace epilog::cuda::conv_gemm_detail {
namespace {

template <int BM, int BN>
__global__ void __launch_bounds__(Tile<BM, BN>::kThreads, Tile<BM, BN>::kMinBlocks)
    conv_gemm_kernel(const GemmArgs a) {
  using T = Tile<BM, BN>;
  extern __shared__ __align__(16) float smem[];
  detail::pdl_begin();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // A tile's splits are consecutive blocks, one cluster: split = the block's rank in it.
  const unsigned tile = blockIdx.x / unsigned(a.splits);
  const int split = int(blockIdx.x - tile * unsigned(a.splits));
  const int n_tile = int(tile % unsigned(a.n_tiles));
  const int m0 = int(tile / unsigned(a.n_tiles)) * BM, n0 = n_tile * BN;
  const int kt0 = split * a.ktiles / a.splits;
  const int ktiles = (split + 1) * a.ktiles / a.splits - kt0;  // this split's k tiles, >= 1
  const uint32_t smem0 = smem_addr(smem);
  constexpr uint32_t kStageBytes = 4 * T::kStageFloats, kBOffset = 4 * kBK * T::kLdA;

  const GatherA<T> loader_a(a, m0, tid);
  auto load_tile = [&](int stage, int kt) {
    const uint32_t as = smem0 + stage * kStageBytes;
    loader_a.load(a, as, (kt0 + kt) * kBK);
    load_b<T>(a, as + kBOffset, n0, (kt0 + kt) * kBK, tid);
  };

  // Warp position and this lane's fragment offsets (conv_gemm_k32.cuh's comment says why the relabeling).
  const int wm = warp / T::kWarpsN, wn = warp % T::kWarpsN;
  const int g = lane / 4, t = lane % 4;
  const int a_frag = 2 * t * T::kLdA + wm * T::kWM + 2 * g;
  const int b_frag = (wn * T::kWN + g) * T::kLdB + 2 * t;

  float acc[T::kMI][T::kNI][4];
#pragma unroll
  for (int mi = 0; mi < T::kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < T::kNI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

  // -- mainloop --
  const int stages = a.stages;
  for (int st = 0; st < stages - 1; ++st) {
    if (st < ktiles) load_tile(st, st);
    cp_async_commit();  // empty groups keep the count that wait_group relies on
  }
  int read_stage = 0, write_stage = stages - 1;
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait_stage(stages);
    // Tile kt is visible to all, and every warp is done with the stage the next copy overwrites.
    __syncthreads();
    if (kt + stages - 1 < ktiles) load_tile(write_stage, kt + stages - 1);
    cp_async_commit();
    write_stage = write_stage + 1 == stages ? 0 : write_stage + 1;

    mma_ktile<T>(acc, smem + read_stage * T::kStageFloats, a_frag, b_frag);
    read_stage = read_stage + 1 == stages ? 0 : read_stage + 1;
  }

  cp_async_wait<0>();
  __syncthreads();  // the pipeline's space is free

  // -- split-K: the cluster's other blocks hand their sums to rank 0 --
  if (!cluster_sum<T::kMI * T::kNI * 4, T::kThreads>(&acc[0][0][0], smem, split, a.splits)) return;

  // -- batchnorm + activation epilogue --
  float* cs = smem;  // the pipeline's space
  // One copy per activation, so that each element's activation is straight-line code.
  auto finish = [&](auto act) {
#pragma unroll
    for (int ni = 0; ni < T::kNI; ++ni) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int nr = wn * T::kWN + 8 * ni + 2 * t + e;
        const int n = n0 + nr;
        const float sc = a.scale && n < a.k ? __ldg(a.scale + n) : 1.0f;
        const float sf = a.shift && n < a.k ? __ldg(a.shift + n) : 0.0f;
#pragma unroll
        for (int mi = 0; mi < T::kMI; ++mi) {
          // Rows g and g + 8 of MMA tile mi are pixels 2g and 2g + 1 of its 16.
          float2 v;
          v.x = act(fmaf(acc[mi][ni][e], sc, sf));
          v.y = act(fmaf(acc[mi][ni][2 + e], sc, sf));
          *reinterpret_cast<float2*>(cs + nr * T::kLdC + wm * T::kWM + 16 * mi + 2 * g) = v;
        }
      }
    }
  };
  with_activation_lean(a.act, finish);
  __syncthreads();

  const int hwo = a.ho * a.wo;
  // Row nr's offset in y and the residual, or 0 past the tile or the channels: the residual's
  // loads go four rows at a time, issued before any is used (as in direct_store, the
  // activation's branches between them would send them one at a time).
  const auto row_at = [&](int nr) { return nr < BN && n0 + nr < a.k ? (n0 + nr) * hwo : 0; };
  if (a.vec_y) {
    // Four pixels of one image per store: hwo % 4 == 0, so M % 4 == 0 and chunks never straddle.
    constexpr int kChunks = BM / 4, kRowStep = T::kThreads / kChunks;
    const int col = 4 * (tid % kChunks), nr0 = tid / kChunks;
    const int m = m0 + col;
    if (m < a.m) {
      const int img = m / hwo;
      float* __restrict__ yb = a.y + (img * a.ys + (m - img * hwo));
      const float* __restrict__ rb = a.res ? a.res + (img * a.r_img + (m - img * hwo)) : nullptr;
      for (int nr4 = nr0; nr4 < BN; nr4 += 4 * kRowStep) {
        float4 u[4];
        if (rb && a.vec_r) {
#pragma unroll
          for (int j = 0; j < 4; ++j)
            u[j] = __ldg(reinterpret_cast<const float4*>(rb + row_at(nr4 + j * kRowStep)));
        } else if (rb) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float* r = rb + row_at(nr4 + j * kRowStep);
            u[j] = make_float4(__ldg(r), __ldg(r + 1), __ldg(r + 2), __ldg(r + 3));
          }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int nr = nr4 + j * kRowStep;
          if (nr >= BN || n0 + nr >= a.k) break;
          float4 v = *reinterpret_cast<const float4*>(cs + nr * T::kLdC + col);
          if (rb) {
            v.x = activate(a.res_act, v.x + u[j].x);
            v.y = activate(a.res_act, v.y + u[j].y);
            v.z = activate(a.res_act, v.z + u[j].z);
            v.w = activate(a.res_act, v.w + u[j].w);
          }
          *reinterpret_cast<float4*>(yb + (n0 + nr) * hwo) = v;
        }
      }
    }
  } else {
    constexpr int kRowStep = T::kThreads / BM;
    const int col = tid % BM, nr0 = tid / BM;
    const int m = m0 + col;
    if (m < a.m) {
      const int img = m / hwo;
      float* __restrict__ yb = a.y + (img * a.ys + (m - img * hwo));
      const float* __restrict__ rb = a.res ? a.res + (img * a.r_img + (m - img * hwo)) : nullptr;
      for (int nr4 = nr0; nr4 < BN; nr4 += 4 * kRowStep) {
        float u[4];
        if (rb) {
#pragma unroll
          for (int j = 0; j < 4; ++j) u[j] = __ldg(rb + row_at(nr4 + j * kRowStep));
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int nr = nr4 + j * kRowStep;
          if (nr >= BN || n0 + nr >= a.k) break;
          const float v = cs[nr * T::kLdC + col];
          yb[(n0 + nr) * hwo] = rb ? activate(a.res_act, v + u[j]) : v;
        }
      }
    }
  }
}

// -- the persistent direct kernel (1x1, stride 1, unpadded: A is x itself) --
// Block b takes tiles b, b + gridDim.x, ... (n tiles fastest, so that the blocks resident
// together share their A tiles in L2) and runs one pipeline through all of their k tiles: the
// copies for the next tile are in flight while this one finishes and stores. The epilogue
// stores straight from the accumulators (pixel pairs 2g, 2g + 1 are one float2), so it needs
// neither shared memory nor a barrier.
template <int BM, int BN>
using DirectTile = Tile<BM, BN, BM == 128 && BN == 128>;

template <int BM, int BN>
__global__ void __launch_bounds__(DirectTile<BM, BN>::kThreads, DirectTile<BM, BN>::kMinBlocks)
    conv_direct_kernel(const GemmArgs a) {
  using T = DirectTile<BM, BN>;
  extern __shared__ __align__(16) float smem[];
  detail::pdl_begin();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int ktiles = a.ktiles, step = int(gridDim.x);
  const int total = DirectCursor<T>::block_ktiles(a);
  const uint32_t smem0 = smem_addr(smem);
  constexpr uint32_t kStageBytes = 4 * T::kStageFloats, kBOffset = 4 * kBK * T::kLdA;

  DirectCursor<T> ld(a, tid);
  auto load_next = [&](int stage) {
    const uint32_t as = smem0 + stage * kStageBytes;
    ld.a_loader.load(a, as, ld.kt * kBK);
    load_b<T>(a, as + kBOffset, ld.n_tile * BN, ld.kt * kBK, tid);
    ld.advance(a, tid);
  };

  const int wm = warp / T::kWarpsN, wn = warp % T::kWarpsN;
  const int g = lane / 4, t = lane % 4;
  const int a_frag = 2 * t * T::kLdA + wm * T::kWM + 2 * g;
  const int b_frag = (wn * T::kWN + g) * T::kLdB + 2 * t;
  float acc[T::kMI][T::kNI][4];
  auto clear = [&] {
#pragma unroll
    for (int mi = 0; mi < T::kMI; ++mi)
#pragma unroll
      for (int ni = 0; ni < T::kNI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
  };

  auto store_tile = [&](int tile) {
    const int n = tile % a.n_tiles * BN + wn * T::kWN;
    with_activation_lean(a.act,
                         [&](auto act) { scale_shift_act(acc, a.scale, a.shift, a.k, n, t, act); });
    direct_store(a, acc, tile / a.n_tiles * BM + wm * T::kWM + 2 * g, n, t, a.h * a.w);
  };

  // -- mainloop over this block's tiles --
  const int stages = a.stages;
  for (int st = 0; st < stages - 1; ++st) {
    if (st < total) load_next(st);
    cp_async_commit();
  }
  clear();
  int read_stage = 0, write_stage = stages - 1, tile = int(blockIdx.x), kt = 0;
  for (int it = 0; it < total; ++it) {
    cp_async_wait_stage(stages);
    __syncthreads();
    if (it + stages - 1 < total) load_next(write_stage);
    cp_async_commit();
    write_stage = write_stage + 1 == stages ? 0 : write_stage + 1;
    mma_ktile<T>(acc, smem + read_stage * T::kStageFloats, a_frag, b_frag);
    read_stage = read_stage + 1 == stages ? 0 : read_stage + 1;
    if (++kt == ktiles) {
      store_tile(tile);
      clear();
      kt = 0;
      tile += step;
    }
  }
  cp_async_wait<0>();
}

template <int BM, int BN>
void launch(const GemmArgs& a, bool direct, Stream stream) {
  const int64_t tiles = (int64_t(a.m) + BM - 1) / BM * a.n_tiles;
  check_grid(tiles);
  if (direct) {
    using T = DirectTile<BM, BN>;
    launch_persistent<T, conv_direct_kernel<BM, BN>>(a, tiles, T::smem_bytes(a.stages), stream);
  } else {
    using T = Tile<BM, BN>;
    auto kernel = conv_gemm_kernel<BM, BN>;
    static std::atomic<uint64_t> opted_in{0};
    detail::opt_in(opted_in, T::smem_bytes(4), kernel);
    check_grid(tiles * a.splits);
    detail::launch_pdl(kernel, unsigned(tiles * a.splits), T::kThreads, T::smem_bytes(a.stages),
                       stream, unsigned(a.splits), a);
  }
  check_launch("conv_gemm");
  log_launch("gemm", [&] {
    return std::string(direct ? "direct " : "gather ") +
           conv_tiles_str({BM, BN, kBK, a.stages, direct ? 1 : a.splits});
  });
}

}  // namespace

void launch_k32(const GemmArgs& a, const ConvTiles& t, bool direct, Stream stream) {
  using detail::Tile;
  using Built = detail::TileList<Tile<32, 32>, Tile<32, 64>, Tile<32, 128>, Tile<64, 32>,
                                 Tile<64, 64>, Tile<64, 128>, Tile<128, 32>, Tile<128, 64>,
                                 Tile<128, 128>>;
  const auto run = [&](auto tile) {
    using T = decltype(tile);
    launch<T::m, T::n>(a, direct, stream);
  };
  if (!detail::dispatch_tile(Built{}, t.m, t.n, run))
    reject("no k = 32 kernel built for " + std::to_string(t.m) + "x" + std::to_string(t.n));
}

}  // namespace epilog::cuda::conv_gemm_detail
