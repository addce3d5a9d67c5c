// gemm's persistent halo kernel: a 3x3 conv at stride 1 over at most 32 input channels into at
// most 32 output channels (ConvTiles::persistent, halo_persistent_fits in shapes.h), on Hopper's
// warpgroup MMA, one 8x8 output square after another a block.
//
// Why: the C2f blocks' 3x3 convs with few channels are bound by their blocks' set-up, not by
// their arithmetic. At batch 16 the wgmma halo kernel took 36.3 and 40.7 us on the 16-channel
// layers at 160x160 (6400 blocks of 64x16, two 8-channel stages each; floors 12.4 and 18.6) and
// 23.1 to 29.9 on the 32-channel ones at 80x80 (floors 6.2 and 9.3; Nsight Compute,
// 2026-12-04); an earlier profile of the first had 62% of its instructions running once a block
// (set-up, the first stages' copies, the epilogue). Here a block packs nothing and loads its
// weights once, and the copies of the stages ahead run under the wgmmas, across squares. That
// paid on the 32-channel layers (2 to 2.7 us each) but not on the 16-channel ones, so lowering
// takes it from 17 output channels (kPersistentMinCout, graph/lowering.cpp).
//
// Math: conv_gemm.cu's. Layout: float32 NCHW, images of x, y and the residual xs, ys and r_img
// floats apart (HaloArgs).
// Block: 128 threads (one warpgroup); persistent, block b taking squares b, b + grid, ... in
// (image, row of squares, column of squares) order. Shared memory: every stage's weights, packed
// ahead of the run (pack_wgmma_weights: one n tile of BN channels) and bulk-copied once; then a
// ring of kRing stage buffers, each a square's input patch for 8 channels as HaloWideLoader
// stages it (10 rows of 20 floats from the 16-byte boundary at or before the first column).
// The block's stages (square, 8 channels) are one sequence, each copied two steps before it is
// read, the next square's first ones under this square's last. For each square:
//   1. Its residual fetched into registers, if any (read in the epilogue, under the MMAs here).
//   2. Per stage: wait for its copies; a barrier (every warp is past the stage before, whose
//      buffer the next copies take); the copies two stages on; the A fragments from the patch
//      (the wgmma halo kernel's register-A path, conv_gemm_wgmma.cuh), nine m64nBNk8 wgmmas,
//      waited for.
//   3. halo_epilogue.
// Restrictions: halo_persistent_fits; x's rows 16-byte aligned (w, xs and x multiples of 4
// floats: conv_gemm runs the wgmma halo kernel otherwise); sm_90a.
#include <atomic>
#include <cstdint>
#include <stdexcept>

#include <cuda_runtime.h>

#include "conv_common.cuh"
#include "conv_gemm_wgmma.cuh"
#include "epilog/kernels/cuda.h"
#include "epilog/kernels/launch.h"
#include "epilog/runtime/launch_log.h"

namespace epilog::cuda::conv_gemm_detail {

namespace {

constexpr int kThreads = 128;
constexpr int kRow = kHaloWideRow;    // floats between a patch's rows
constexpr int kCS = 10 * kRow;        // between its channel planes
constexpr int kPatch = kHaloC * kCS;  // a stage's patch
constexpr int kMaxStages = kPersistentMaxCin / kHaloC;

// Stage buffers of the input patches, a ring: stages are read in order across squares, each
// copied two steps before it is read (one where a square has one stage).
constexpr int kRing = 3;

// Shared memory for `ctiles` stages of BN channels' weights, the ring, an mbarrier.
template <int BN>
constexpr size_t smem_bytes(int ctiles) {
  return sizeof(float) * (size_t(ctiles) * kHaloK * BN + kRing * kPatch) + kWgmmaBarrierBytes;
}

template <int BN, bool Res>
__global__ void __launch_bounds__(kThreads, BN == 16 ? 6 : 4)
    conv_halo_persistent_kernel(const HaloArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kNI = BN / 8, kOpB = kHaloK * BN;
  extern __shared__ __align__(16) float smem[];
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32, t = lane % 4;
  const int ctiles = a.ctiles;
  const uint32_t w_addr = smem_addr(smem);
  const uint32_t patches = w_addr + 4 * ctiles * kOpB;
  const uint32_t bar = patches + 4 * kRing * kPatch;
  const float* const patch0 = smem + ctiles * kOpB;

  // The weights are no output of the kernel before this one: copied before waiting for it.
  init_stage_barriers(bar, 1, tid);
  __syncthreads();
  if (tid == 0) copy_stage(bar, w_addr, a.wp, 4 * ctiles * kOpB);
  // B's descriptors: one built, the rest by constant offsets (16-byte units) from it.
  const uint64_t w_desc = wgmma_desc(w_addr, 16 * BN, 128);

  const int ahead = ctiles < kRing - 1 ? ctiles : kRing - 1;
  const auto loader = [&](const HaloSquare& s) {
    return HaloWideLoader(a, patches, warp, 0, lane, s.ok, s.img, s.oy0, s.ox0);
  };
  HaloSquare s(a, int(blockIdx.x));
  detail::pdl_begin();
  {
    const HaloWideLoader first = loader(s);
    for (int kt = 0; kt < ahead; ++kt) {
      first.load_patch(4 * kt * kPatch, kt);
      cp_async_commit();
    }
  }
  mbar_wait(bar, 0);

  // Register A (conv_gemm_wgmma.cuh): lane (g, t) of warp w holds pixels (2w, g) and (2w + 1, g),
  // channels t and t + 4 of a stage; tap (i, j) reads patch rows 2w + i and 2w + 1 + i, column
  // g + j, a row's first column (-pl) mod 4 slots in.
  const int a_frag = 2 * warp * kRow + t * kCS + ((-a.pl) & 3) + lane / 4;
  int rb = 0;  // the ring buffer read next
  for (int sq = int(blockIdx.x); sq < a.squares; sq += int(gridDim.x)) {
    const HaloSquare next(a, sq + int(gridDim.x));
    int pix[1][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) pix[0][h] = s.pixel(a, 2 * warp + h, lane / 4);
    float res[1][Res ? kNI : 1][4] = {};
    if constexpr (Res)
      for_residual<1, kNI>(a, pix, s.img, 0, t,
                           [&](int, int ni, int q, float v) { res[0][ni][q] = v; });

    float acc[1][kNI][4] = {};
    // Stage kt from buffer rb, once its copies landed (at most ahead - 1 younger groups pending)
    // and every warp is past the stage before (whose buffer the copies `ahead` steps on take):
    // first `ld`'s stage ckt into that buffer, if `copy`, then the stage's nine wgmmas.
    const auto step = [&](int kt, const HaloWideLoader& ld, bool copy, int ckt) {
      if (ahead == 2)
        cp_async_wait<1>();
      else
        cp_async_wait<0>();
      __syncthreads();
      const int wb = rb + ahead < kRing ? rb + ahead : rb + ahead - kRing;
      if (copy) ld.load_patch(4 * wb * kPatch, ckt);
      cp_async_commit();
      const float* p = patch0 + rb * kPatch + a_frag;
      uint32_t rows[3][4][2];
#pragma unroll
      for (int j = 0; j < 3; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          rows[j][r][0] = lds_tf32(p + r * kRow + j);
          rows[j][r][1] = lds_tf32(p + r * kRow + j + 4 * kCS);
        }
      wgmma_fence();
#pragma unroll
      for (int tap = 0; tap < 9; ++tap) {
        const int i = tap / 3, j = tap % 3;
        const uint32_t af[4] = {rows[j][i][0], rows[j][1 + i][0], rows[j][i][1], rows[j][1 + i][1]};
        wgmma_tf32_rs<kNI>(acc[0], af, w_desc + uint64_t(kt * kOpB / 4 + 2 * BN * tap));
      }
      wgmma_commit();
      wgmma_wait<0>();
      rb = rb + 1 == kRing ? 0 : rb + 1;
    };
    // The stages whose copies ahead are this square's, then those whose copies are the next's.
    const int own = ctiles - ahead;
    if (own > 0) {
      const HaloWideLoader cur = loader(s);
#pragma unroll 1
      for (int kt = 0; kt < own; ++kt) step(kt, cur, true, kt + ahead);
    }
    {
      const HaloWideLoader nxt = loader(next);
#pragma unroll 1
      for (int kt = own; kt < ctiles; ++kt) step(kt, nxt, next.ok, kt - own);
    }
    if constexpr (Res)
      halo_epilogue(a, acc, pix, s.img, 0, t, res);
    else
      halo_epilogue(a, acc, pix, s.img, 0, t);
    s = next;
  }
#else
  __trap();  // built without sm_90a code: conv_gemm never launches it then
#endif
}

template <int BN, bool Res>
void launch(const HaloArgs& a, Stream stream) {
  auto kernel = conv_halo_persistent_kernel<BN, Res>;
  static std::atomic<uint64_t> opted_in{0};
  static detail::ResidentCache resident{};
  detail::opt_in(opted_in, smem_bytes<BN>(kMaxStages), kernel);
  // Shared memory for 1, 2 or 4 stages (3 take 4's): one resident-blocks slot each.
  const int cap = a.ctiles <= 2 ? a.ctiles : kMaxStages;
  const size_t smem = smem_bytes<BN>(cap);
  const int fit = detail::resident_blocks(resident, cap <= 2 ? cap - 1 : 2, kernel, kThreads, smem);
  detail::launch_pdl(kernel, unsigned(a.squares < fit ? a.squares : fit), kThreads, smem, stream, 1,
                     a);
}

}  // namespace

void launch_halo_persistent(const HaloArgs& a, int n, Stream stream) {
  if (n != 16 && n != 32)
    throw std::invalid_argument("[conv_gemm] persistent halo tiles of n = 16 or 32");
  if (n == 16)
    a.res ? launch<16, true>(a, stream) : launch<16, false>(a, stream);
  else
    a.res ? launch<32, true>(a, stream) : launch<32, false>(a, stream);
  check_launch("conv_gemm (persistent halo)");
  log_launch("gemm", [&] {
    return "halo " + conv_tiles_str({64, n, kHaloK, a.stages, 1, true, true});
  });
}

}  // namespace epilog::cuda::conv_gemm_detail
