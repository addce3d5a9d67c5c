// conv_gemm's k = 32 kernel on Hopper's warpgroup MMA (sm_90a builds only): the persistent
// direct kernel, its gathered (Gather), split-K (Split), upsampled-input (Up), tensor-copy (Tma)
// and prologue (Pro) forms. conv_gemm_k32.cuh describes the tiles, loaders and epilogue it
// shares with the mma.sync kernels.
#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "conv_gemm_k32.cuh"
#include "conv_gemm_wgmma.cuh"
#include "epilog/runtime/launch_log.h"

namespace epilog::cuda::conv_gemm_detail {
namespace {

// -- the persistent direct kernel on warpgroup MMA (k = 32 with wgmma; sm_90a builds only) --
// The same tiles, copies of A, pipeline over the block's tiles and epilogue as
// conv_direct_kernel; the MMAs are wgmma.m64nNk8 with A from registers and B from shared memory.
// Why: the mma.sync kernel loads and rounds a fragment of A and of B for every m16n8k8; here a
// thread loads A once per k step for all n channels, and the tensor cores read B themselves.
// Block: BM / 64 warpgroups; warpgroup v owns pixels [64v, +64) of the tile and all BN channels.
// A, As[k][pixel] as staged (pixels contiguous), relabeled as the mma.sync kernels do (file
// comment): row g (g + 8) of warp w's 16 is pixel 16w + 2g (+ 1), column t (t + 4) of k step s
// is k row 8s + 2t (+ 1), so (a0, a1) and (a2, a3) are one 8-byte load each and the accumulators
// hold the pixel pairs direct_store stores. B, the weights packed ahead in that column order
// (pack_wgmma_weights, rounded to TF32): a stage is 8 runs q of BN rows x 4 channels, runs 2s and
// 2s + 1 the two halves of k step s, i.e. wgmma's K-major core matrices of 8 rows x 16 bytes,
// the halves BN * 16 bytes apart; a stage's are one bulk copy completing on the stage's mbarrier,
// as in the halo kernel on wgmma (conv_gemm_wgmma.cuh says why; b16_c256_256_1x1_40 35.2 ->
// 33.7 us). Each k tile's wgmmas are waited for before the next one's fragments are loaded
// (they take the same registers), so copies run stages - 1 ahead, as in conv_direct_kernel.
// Tma (conv_gemm_direct_tma): A by tensor copies. Thread 0 issues a k tile's BM / 32 boxes of
// x's tensor map (x_tensor_map: 32 pixels of one image by 32 channels) along with the weights,
// all on the stage's mbarrier, so no other thread issues a copy. Tiles lie within one image: on a
// plane that is not a multiple of BM pixels the last tile of each image has rows past it, which
// the copies zero-fill (their boxes reach past the tensor map's plane) and the epilogue skips.
// A box lands as 32 rows of 128 bytes whose 16-byte chunks the copy swizzles (chunk c of row k
// at c ^ k % 8): a warp's fragment loads then meet no bank conflict, as with the padded rows.
// Why: cp.async's copies reach shared memory through L1, and the layers waited on them (shapes.h
// has the A/B).
// Gather: the same kernel on any other shape, its A tiles gathered
// 4 bytes at a time by GatherA (as the mma.sync gather kernel stages them) and the weights packed
// over the whole reduction (c, i, j). Why: the mma.sync gather kernel's deep 3x3 stride-2 layers
// onto small planes (where the halo kernel's 8x8 squares waste a third or more) ran at a fifth
// of the tensor cores' rate.
// Split (splits > 1, either loader): not persistent; a tile's splits are consecutive blocks, one
// cluster, each summing k tiles [split * ktiles / splits, (split + 1) * ktiles / splits); rank 0
// adds the others' accumulators (cluster_sum) and alone runs the epilogue. For grids of under a
// wave over deep reductions, whose blocks would each walk a long chain of k tiles.
template <int BM_, int BN_, bool Tma = false>
struct WgDirectTile {
  static constexpr int BM = BM_, BN = BN_, kThreads = 2 * BM, kNI = BN / 8;
  // Tma: A as the tensor copies leave it, boxes of 32 k rows x 32 pixels (128 bytes, swizzled).
  static constexpr int kLdA = Tma ? BM : BM + kPadA, kBFloats = kBK * BN;
  static constexpr int kStageFloats = kBK * kLdA + kBFloats;
  // Blocks of up to 64 channels are held to the registers of two an SM.
  static constexpr int kMinBlocks = BN <= 64 ? 2 : 1;
  // Tma's swizzle repeats every 1024 bytes, from a base the kernel aligns so.
  static constexpr size_t kAlign = Tma ? 1024 : 0;
  // The stages, then one mbarrier a stage (up to 4) for its weights.
  static constexpr size_t smem_bytes(int stages) {
    return 4 * size_t(stages) * kStageFloats + kWgmmaBarrierBytes + kAlign;
  }
  static_assert(!Tma || (4 * kStageFloats) % 1024 == 0, "stages keep the swizzle's alignment");
  static_assert(kNI * 4 * kThreads <= 2 * kStageFloats,
                "split-K parks the accumulators in the pipeline's space (at least 2 stages)");
};

// Tma: thread 0 copies a tile's A as BM / 32 boxes of x's tensor map (x_tensor_map), each 32
// pixels of one image by 32 channels; a.plane pixels an image in tile space (direct_tma_plane).
template <class T>
struct TmaA {
  int img, p0;
  __device__ __forceinline__ TmaA(const GemmArgs& a, int m0, int) {
    img = m0 / a.plane;
    p0 = m0 - img * a.plane;
  }
};

// Pro (GemmArgs::pro_*): channel c's values of x scaled, shifted and activated as the fragments
// are loaded, before their rounding to TF32; the rows past x's channels, zero, stay so.
__device__ __forceinline__ void apply_prologue(const GemmArgs& a, int c, float2& v) {
  if (c >= a.c) return;
  const float sc = a.pro_scale ? __ldg(a.pro_scale + c) : 1.0f;
  const float sh = a.pro_shift ? __ldg(a.pro_shift + c) : 0.0f;
  v.x = fmaf(v.x, sc, sh);
  v.y = fmaf(v.y, sc, sh);
  if (a.pro_relu) {
    v.x = activate(Act(Activation::Relu), v.x);
    v.y = activate(Act(Activation::Relu), v.y);
  }
}

template <int BM, int BN, bool Gather, bool Split, bool Up = false, bool Tma = false,
          bool Pro = false>
__global__ void __launch_bounds__(WgDirectTile<BM, BN, Tma>::kThreads,
                                  WgDirectTile<BM, BN, Tma>::kMinBlocks)
    conv_direct_wgmma_kernel(const GemmArgs a, const __grid_constant__ CUtensorMap xmap) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = WgDirectTile<BM, BN, Tma>;
  using Loader = std::conditional_t<
      Tma, TmaA<T>,
      std::conditional_t<Gather, GatherA<T>, std::conditional_t<Up, DirectUpA<T>, DirectA<T>>>>;
  extern __shared__ __align__(16) float smem_raw[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int ktiles = a.ktiles, step = int(gridDim.x);
  // Split: this block's tile and share of its k tiles (never empty: splits <= ktiles).
  const int tile0 = Split ? int(blockIdx.x / unsigned(a.splits)) : int(blockIdx.x);
  const int split = Split ? int(blockIdx.x) - tile0 * a.splits : 0;
  const int kt0 = Split ? split * ktiles / a.splits : 0;
  const int total =
      Split ? (split + 1) * ktiles / a.splits - kt0 : DirectCursor<T, Loader>::block_ktiles(a);
  const uint32_t raw0 = smem_addr(smem_raw);
  const uint32_t smem0 = Tma ? (raw0 + 1023) & ~1023u : raw0;
  float* smem = smem_raw + (smem0 - raw0) / 4;
  constexpr uint32_t kStageBytes = 4 * T::kStageFloats, kBOffset = 4 * kBK * T::kLdA;

  // The packed weights hold each n tile's k tiles one after another, kBFloats each: a stage's
  // are one bulk copy, issued by thread 0 and counted on the stage's mbarrier.
  const uint32_t bars = smem0 + uint32_t(a.stages) * kStageBytes;
  DirectCursor<T, Loader> ld(a, tid, tile0, kt0);
  auto load_next = [&](int stage) {
    const uint32_t as = smem0 + stage * kStageBytes, bar = bars + 8 * stage;
    const float* wsrc = a.wp + (size_t(ld.n_tile) * ktiles + ld.kt) * T::kBFloats;
    if constexpr (Tma) {
      if (tid == 0) {
        mbar_expect_tx(bar, kStageBytes);
#pragma unroll
        for (int j = 0; j < BM / 32; ++j)
          tensor_copy_3d(bar, as + 4096 * j, &xmap, ld.a_loader.p0 + 32 * j, ld.kt * kBK,
                         ld.a_loader.img);
        bulk_copy(bar, as + kBOffset, wsrc, 4 * T::kBFloats);
      }
    } else {
      ld.a_loader.load(a, as, ld.kt * kBK);
      if (tid == 0) copy_stage(bar, as + kBOffset, wsrc, 4 * T::kBFloats);
    }
    ld.advance(a, tid);
  };

  const int wg = warp / 4, w4 = warp % 4, g = lane / 4, t = lane % 4;
  // A's k rows 8ks + 2t (lo) and 8ks + 2t + 1 (hi) at pixels p, p + 1. Tma: the box of p, its
  // 128-byte row k holding 16-byte chunk c at c ^ (k % 8), the same for every ks.
  const int p = 64 * wg + 16 * w4 + 2 * g, q = p % 32;
  const int a_lo =
      Tma ? 1024 * (p / 32) + 64 * t + 4 * ((q / 4) ^ (2 * t)) + q % 4 : 2 * t * T::kLdA + p;
  const int a_hi =
      Tma ? 1024 * (p / 32) + 64 * t + 32 + 4 * ((q / 4) ^ (2 * t + 1)) + q % 4 : a_lo + T::kLdA;
  constexpr int kStepA = 8 * (Tma ? 32 : T::kLdA);  // floats between k steps
  float acc[1][T::kNI][4];
  auto clear = [&] {
#pragma unroll
    for (int ni = 0; ni < T::kNI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[0][ni][e] = 0.0f;
  };

  // -- mainloop over this block's tiles --
  const int stages = a.stages;
  init_stage_barriers(bars, stages, tid);
  __syncthreads();
  detail::pdl_begin();
  if (Tma && tid == 0) asm volatile("prefetch.tensormap [%0];\n" ::"l"(&xmap) : "memory");
  for (int st = 0; st < stages - 1; ++st) {
    if (st < total) load_next(st);
    if (!Tma) cp_async_commit();
  }
  clear();
  int read_stage = 0, write_stage = stages - 1, tile = tile0, kt = 0;
  uint32_t phase = 0;  // of read_stage's mbarrier: flips each time the stages come round
  const auto epilogue = [&] {
    const int n = tile % a.n_tiles * BN;
    with_activation(a.act,
                    [&](auto act) { scale_shift_act(acc, a.scale, a.shift, a.k, n, t, act); });
    direct_store<Tma, Gather>(a, acc, tile / a.n_tiles * BM + 64 * wg + 16 * w4 + 2 * g, n, t,
                              Gather ? a.ho * a.wo : a.h * a.w, a.plane);
  };
  for (int it = 0; it < total; ++it) {
    if (!Tma) cp_async_wait_stage(stages);
    mbar_wait(bars + 8 * read_stage, phase);
    // Stage it is visible to all, and every warpgroup's wgmmas are done with the stage the next
    // copy overwrites (each waits for its own below).
    __syncthreads();

    const float* as = smem + read_stage * T::kStageFloats;
    uint32_t af[kBK / 8][4];
#pragma unroll
    for (int ks = 0; ks < kBK / 8; ++ks) {
      float2 lo = *reinterpret_cast<const float2*>(as + a_lo + kStepA * ks);
      float2 hi = *reinterpret_cast<const float2*>(as + a_hi + kStepA * ks);
      if constexpr (Pro) {  // rows lo and hi: input channels c and c + 1 (unsplit: kt counts)
        const int c = kt * kBK + 8 * ks + 2 * t;
        apply_prologue(a, c, lo);
        apply_prologue(a, c + 1, hi);
      }
      af[ks][0] = to_tf32(lo.x);
      af[ks][1] = to_tf32(lo.y);
      af[ks][2] = to_tf32(hi.x);
      af[ks][3] = to_tf32(hi.y);
    }
    const uint32_t b_addr = smem0 + read_stage * kStageBytes + kBOffset;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kBK / 8; ++ks)
      wgmma_tf32_rs<T::kNI>(acc[0], af[ks], wgmma_desc(b_addr + 16 * 2 * BN * ks, 16 * BN, 128));
    wgmma_commit();
    // The next copies (into a stage whose wgmmas are done) issue while the tensor cores work,
    // not before the fragments' loads (perf-history: "copies under the wgmmas").
    if (it + stages - 1 < total) load_next(write_stage);
    if (!Tma) cp_async_commit();
    write_stage = write_stage + 1 == stages ? 0 : write_stage + 1;
    // The next k tile's fragments go to the same registers, which the wgmmas read until they
    // are done: waiting here is what ptxas would otherwise insert (two register sets in turn
    // made it wait after every wgmma instead).
    wgmma_wait<0>();
    if (++read_stage == stages) read_stage = 0, phase ^= 1;
    if (!Split && ++kt == ktiles) {
      epilogue();
      clear();
      kt = 0;
      tile += step;
    }
  }
  cp_async_wait<0>();
  if constexpr (Split) {
    __syncthreads();  // every warpgroup is done with the pipeline's space
    if (cluster_sum<T::kNI * 4, T::kThreads>(&acc[0][0][0], smem, split, a.splits)) epilogue();
  }
#else
  __trap();  // built without sm_90a code: conv_gemm never launches it then
#endif
}

// x as a rank-3 tensor map (pixels, channels, images) of 32 x 32 x 1 boxes, 128-byte swizzled,
// for the direct wgmma kernel's tensor copies (TmaA).
CUtensorMap x_tensor_map(const GemmArgs& a) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    EPILOG_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                       cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !fn)
      reject("the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  const int hw = a.h * a.w;
  const cuuint64_t dims[3] = {cuuint64_t(hw), cuuint64_t(a.kg), cuuint64_t(a.m / a.plane)};
  const cuuint64_t strides[2] = {4 * cuuint64_t(hw), 4 * cuuint64_t(a.xs)};
  const cuuint32_t box[3] = {32, 32, 1}, unit[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, const_cast<float*>(a.x), dims, strides, box,
             unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) reject("cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ")");
  return map;
}

// Up: the direct kernel reading channels through a folded upsampling (DirectUpA; unsplit).
// Pro: the direct kernel with a prologue (unsplit, not gathered), by cp.async or tensor copies.
template <int BM, int BN, bool Gather, bool Up = false, bool Pro = false>
void launch_direct_wgmma(const GemmArgs& a, Stream stream) {
  using T = WgDirectTile<BM, BN>;
  const int64_t tiles = (int64_t(a.m) + BM - 1) / BM * a.n_tiles;
  check_grid(tiles * a.splits);
  const size_t smem = T::smem_bytes(a.stages);
  const CUtensorMap none{};
  if constexpr (Up) {
    launch_persistent<T, conv_direct_wgmma_kernel<BM, BN, false, false, true>>(a, tiles, smem,
                                                                               stream, none);
  } else if constexpr (Pro) {
    using TT = WgDirectTile<BM, BN, true>;
    if (a.tma)
      launch_persistent<TT, conv_direct_wgmma_kernel<BM, BN, false, false, false, true, true>>(
          a, tiles, TT::smem_bytes(a.stages), stream, x_tensor_map(a));
    else
      launch_persistent<T, conv_direct_wgmma_kernel<BM, BN, false, false, false, false, true>>(
          a, tiles, smem, stream, none);
  } else if (a.splits > 1) {
    auto kernel = conv_direct_wgmma_kernel<BM, BN, Gather, true>;
    static std::atomic<uint64_t> opted_in{0};
    detail::opt_in(opted_in, T::smem_bytes(4), kernel);
    detail::launch_pdl(kernel, unsigned(tiles * a.splits), T::kThreads, smem, stream,
                       unsigned(a.splits), a, none);
  } else if (!Gather && a.tma) {
    using TT = WgDirectTile<BM, BN, true>;
    launch_persistent<TT, conv_direct_wgmma_kernel<BM, BN, false, false, false, true>>(
        a, tiles, TT::smem_bytes(a.stages), stream, x_tensor_map(a));
  } else {
    launch_persistent<T, conv_direct_wgmma_kernel<BM, BN, Gather, false>>(a, tiles, smem, stream,
                                                                          none);
  }
  check_launch("conv_gemm");
  log_launch("gemm", [&] {
    const bool split = !Up && !Pro && a.splits > 1, tma = !Up && !split && !Gather && a.tma;
    const ConvTiles t{BM, BN, kBK, a.stages, split ? a.splits : 1, true};
    return std::string(Gather ? "gather " : "direct ") + conv_tiles_str(t, tma, Up, false, Pro);
  });
}

// The wgmma k = 32 tiles (conv_gemm checks them): the direct kernel's, or Gather, or Up, or Pro.
template <bool Gather, bool Up = false, bool Pro = false>
void dispatch_direct_wgmma(const ConvTiles& t, const GemmArgs& a, Stream stream) {
  using detail::Tile;
  using Built = detail::TileList<Tile<64, 32>, Tile<64, 64>, Tile<64, 128>, Tile<128, 32>,
                                 Tile<128, 64>, Tile<128, 128>>;
  const auto run = [&](auto tile) {
    using T = decltype(tile);
    launch_direct_wgmma<T::m, T::n, Gather, Up, Pro>(a, stream);
  };
  if (!detail::dispatch_tile(Built{}, t.m, t.n, run))
    reject("no wgmma k = 32 kernel built for " + std::to_string(t.m) + "x" + std::to_string(t.n));
}

}  // namespace

void launch_k32_wgmma(const GemmArgs& a, const ConvTiles& t, bool gather, bool up, bool pro,
                      Stream stream) {
  if (up) return dispatch_direct_wgmma<false, true>(t, a, stream);
  if (pro) return dispatch_direct_wgmma<false, false, true>(t, a, stream);
  return gather ? dispatch_direct_wgmma<true>(t, a, stream)
                : dispatch_direct_wgmma<false>(t, a, stream);
}

}  // namespace epilog::cuda::conv_gemm_detail
