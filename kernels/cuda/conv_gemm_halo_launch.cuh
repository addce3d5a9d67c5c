// The launches of conv_gemm's 3x3 halo kernels (mma.sync, conv_gemm_halo.cuh; wgmma,
// conv_gemm_wgmma.cuh) by tile, stride, split and residual. Each stride's instances are built in
// a file of their own (conv_gemm_halo_s1.cu, conv_gemm_halo_s2.cu): the halo kernels are most of
// conv_gemm's compile time, and two files build at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "conv_gemm_halo.cuh"
#include "conv_gemm_k32.cuh"
#include "conv_gemm_wgmma.cuh"
#include "epilog/runtime/launch_log.h"

namespace epilog::cuda::conv_gemm_detail {

// Stages and splits as conv_gemm_launch sized them: a depth the tile cannot hold throws.
[[noreturn]] inline void reject_stages(int stages, int m, int n, int max) {
  reject(std::to_string(stages) + " stages for " + std::to_string(m) + "x" + std::to_string(n) +
         " halo tiles (at most " + std::to_string(max) + ")");
}

template <int BM, int BN, int S>
void launch_halo(const HaloArgs& a, Stream stream) {
  using T = HaloTile<BM, BN, S>;
  static_assert(T::kMaxStages == halo_mma_max_stages(BM, BN, S), "launch.h sizes the same tiles");
  static std::atomic<uint64_t> opted_in{0};
  detail::opt_in(opted_in, T::smem_bytes(T::kMaxStages), conv_halo_kernel<BM, BN, S>);
  if (a.stages < 2 || a.stages > T::kMaxStages) reject_stages(a.stages, BM, BN, T::kMaxStages);
  const int64_t blocks = (int64_t(a.squares) + T::kSquares - 1) / T::kSquares * a.n_tiles;
  check_grid(blocks);
  auto kernel = conv_halo_kernel<BM, BN, S>;
  detail::launch_pdl(kernel, unsigned(blocks), T::kThreads, T::smem_bytes(a.stages), stream, 1, a);
  check_launch("conv_gemm");
  log_launch("gemm", [&] { return "halo " + conv_tiles_str({BM, BN, kHaloK, a.stages}); });
}

// A reduction of fewer stages than 3 unsplit gets as many buffers (conv_gemm_launch), all filled
// at once (the kernel's `ahead`), not idle ones that cost blocks (perf-history: "halo stage
// buffers for the reduction only"). Split-K keeps 3 at least: it parks its sums in the
// pipeline's space.
template <int BM, int BN, int S, bool RegA, bool Split, bool ResAhead, bool Wide, bool Chain>
void launch_halo_wgmma(const HaloArgs& a, Stream stream) {
  using W = HaloWgTile<BM, BN, S, RegA, Wide>;
  auto kernel = conv_halo_wgmma_kernel<BM, BN, S, RegA, Split, ResAhead, Wide, Chain>;
  static std::atomic<uint64_t> opted_in{0};
  detail::opt_in(opted_in, W::smem_bytes(W::kMaxStages), kernel);
  if (a.stages < (Split ? 3 : 1) || a.stages > W::kMaxStages || (!Split && a.stages > a.ctiles))
    reject_stages(a.stages, BM, BN, W::kMaxStages);
  const int64_t blocks =
      (int64_t(a.squares) + W::kSquares - 1) / W::kSquares * a.n_tiles * a.splits;
  check_grid(blocks);
  detail::launch_pdl(kernel, unsigned(blocks), W::kThreads, W::smem_bytes(a.stages), stream,
                     unsigned(a.splits), a);
  check_launch("conv_gemm");
  log_launch(Chain ? "gemm chain" : "gemm", [&] {
    return "halo " + conv_tiles_str({BM, BN, kHaloK, a.stages, a.splits, true}, false, false, Wide);
  });
}

// The kernel for layers with a residual or without (halo_wgmma_reg_a, halo_wgmma_res_ahead):
// where both rules give the same, the same instance. Wide rows where conv_gemm_launch says
// (halo_wgmma_wide, x's rows 16-byte aligned). Chain: the conv chain's kernel (conv_chain).
template <int BM, int BN, int S, bool Split, bool Residual, bool Chain = false>
void launch_halo_wgmma_for(const HaloArgs& a, bool wide, Stream stream) {
  constexpr bool reg_a = halo_wgmma_reg_a(BN, Residual);
  constexpr bool res_ahead = halo_wgmma_res_ahead(BN, S, Split, reg_a, Residual);
  if constexpr (halo_wgmma_wide(BM, BN, S, reg_a)) {
    if (wide) return launch_halo_wgmma<BM, BN, S, reg_a, Split, res_ahead, true, Chain>(a, stream);
  } else {
    if (wide) reject("wide patch rows on tiles that have none (halo_wgmma_wide)");
  }
  launch_halo_wgmma<BM, BN, S, reg_a, Split, res_ahead, false, Chain>(a, stream);
}

template <int BM, int BN, int S, bool Split>
void launch_halo_wgmma_any(const HaloArgs& a, bool wide, Stream stream) {
  if (a.res) return launch_halo_wgmma_for<BM, BN, S, Split, true>(a, wide, stream);
  launch_halo_wgmma_for<BM, BN, S, Split, false>(a, wide, stream);
}

template <int BM, int BN, int S>
void launch_halo_any(const HaloArgs& a, const GemmLaunch& l, Stream stream) {
  // n = 16 is built for the wgmma kernel only (conv_gemm checks the tiles).
  if constexpr (BN != 16)
    if (!l.tiles.wgmma) return launch_halo<BM, BN, S>(a, stream);
  // Split-K is built for the one-square tiles only (conv_built_tiles).
  if constexpr (BM == 64)
    if (a.splits > 1) return launch_halo_wgmma_any<BM, BN, S, true>(a, l.wide, stream);
  if (a.splits > 1) reject("split-K halo tiles of more than one square");
  return launch_halo_wgmma_any<BM, BN, S, false>(a, l.wide, stream);
}

template <int S>
void dispatch_halo(const GemmLaunch& l, const HaloArgs& a, Stream stream) {
  using detail::Tile;
  using Built = detail::TileList<Tile<64, 16>, Tile<128, 16>, Tile<256, 16>, Tile<64, 32>,
                                 Tile<64, 64>, Tile<64, 128>, Tile<128, 32>, Tile<128, 64>,
                                 Tile<128, 128>, Tile<256, 32>, Tile<256, 64>, Tile<256, 128>>;
  const auto run = [&](auto tile) {
    using T = decltype(tile);
    launch_halo_any<T::m, T::n, S>(a, l, stream);
  };
  if (!detail::dispatch_tile(Built{}, l.tiles.m, l.tiles.n, run))
    reject("no halo kernel built for " + std::to_string(l.tiles.m) + "x" +
           std::to_string(l.tiles.n));
}

// conv_chain's launch: the wgmma halo kernel unsplit at m in {64, 128}, n = kChainC, running
// the 1x1 conv after it on its accumulators.
template <int S>
void launch_chain(const HaloArgs& a, int m, bool wide, Stream stream) {
  if (m == 64) return launch_halo_wgmma_for<64, kChainC, S, false, false, true>(a, wide, stream);
  launch_halo_wgmma_for<128, kChainC, S, false, false, true>(a, wide, stream);
}

}  // namespace epilog::cuda::conv_gemm_detail
