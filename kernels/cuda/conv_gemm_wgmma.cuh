// The 3x3 halo kernel of conv_gemm.cu on Hopper's warpgroup MMA (wgmma, sm_90a builds only):
// the same tiles, staging and epilogue as conv_halo_kernel (conv_gemm_halo.cuh), its MMAs issued
// by a warpgroup (wgmma.mma_async) instead of by each warp (mma.sync), and n = 16 besides (the
// mma.sync kernel's warps are 32 channels wide). A residual is loaded before the mainloop, not
// after it, at n <= 32 and, in a kernel of its own, at n = 64 and stride 1.
//
// Why: the mma.sync kernel's warps spend most of their issue slots loading and rounding
// fragments (Nsight Compute); a wgmma m64nNk8 reads B straight from shared memory, and A from
// registers loaded once per stage or from shared memory too (below).
// The weights come packed ahead of the run because rewriting them per stage in the kernel cost
// a third of its time (b16_c128_128_3x3_40: 62 us, 42 with that rewrite left out).
//
// Block: m / 64 warpgroups, warpgroup s owning square s of the block (64 output pixels, 8 x 8)
// and all n channels: per tap, one wgmma.m64nNk8 with N = n. Row r of its M = 64 is the square's
// pixel (r / 8, r % 8), so warp w of the warpgroup holds rows 16w + g and 16w + g + 8, pixels
// (2w, g) and (2w + 1, g), channels 8ni + 2t + e in acc[0][ni][2h + e] (h = 0, 1).
// Operands in shared memory: TF32 wgmma takes both K-major, in 8-row x 16-byte "core matrices"
// (no swizzle):
//   A of square s, tap (i, j): OpA[2 chunks][kPos][4 channels], chunk = channel / 4, so the
//     8 pixels of one output row, patch slots (oy*S + i)*kPW + slot(j + S*ox), lie on 8
//     consecutive slots (16 bytes apart); output rows are S*kPW slots apart (the stride-dimension
//     offset), the two channel chunks kPos slots apart (the leading-dimension offset);
//   B of tap (i, j): OpB[9 taps][2 chunks][n][4 channels]: 8 channel rows a core matrix, rows of
//     one chunk 16 bytes apart, the chunks n * 16 bytes apart.
// Pipeline: `stages` stage buffers, each the input patches as the loader's cp.async copies
// stage them (HaloTile's layout, or on one-square tiles over 16-byte aligned rows wide rows of
// 16-byte copies: HaloWideLoader) and the stage's weights, one bulk copy (cp.async.bulk, issued by
// thread 0, completing on the stage's mbarrier) from the weights packed ahead of the run
// (pack_wgmma_weights: already in OpB's layout and rounded to TF32; the first stages' before the
// wait for the previous kernel, which does not write them). The tensor cores read the weights
// through the async proxy that wrote them: 16-byte cp.async copies of them needed a
// fence.proxy.async before every stage's wgmmas, which orders all of the thread's copies still
// in flight, the next stages' too (perf-history: "bulk-copied weights").
// A, two ways (halo_wgmma_reg_a in shapes.h picks one):
//   From registers: all tiles but n = 32 with a residual (n = 16 fetches one ahead here;
//     perf-history: "16-wide halo tiles"). Each lane loads its pixels'
//     values straight from the staged patch (as mma's A fragment: rows g and g + 8, channels t and
//     t + 4; the S + 3 patch rows under a warp's two output rows serve all three taps of a
//     column), rounded to TF32. The wgmmas reading them are waited for before their registers
//     are reused: at n <= 64 all nine of a stage at its end; at n = 128, whose accumulators
//     leave no room for every column's fragments, each column's three, the next column's loads
//     running under them. Copies then run stages - 1 ahead. This reads a third fewer bytes of
//     shared memory than the rewrite below (Nsight Compute had the shared-memory pipe the
//     busiest, 62% on b16_c128_128_3x3_40; perf-history: "register A"). But 128x128 tiles,
//     two warpgroups a block alone on their SM, wait out each column and lose on small grids
//     (lowering takes 64x64 there). An earlier form at n = 128, every column's fragments at
//     once, spilled.
//   From shared memory: n = 32 with a residual, whose tiles fetch the residual ahead and are
//     held to 80 registers for 3 blocks an SM (register A there: the C2f bottleneck's second
//     conv 72 -> 89 us in a per-node profile). Each warpgroup rewrites its square's patch into
//     one of two operand buffers in OpA's layout, rounding it to TF32 on the way (wgmma, like
//     mma, would truncate), and issues its nine wgmmas after a barrier of its own (only it reads
//     its OpA); one wgmma group stays in flight across iterations, so copies run stages - 2
//     stages ahead (a stage's weights are read by its wgmmas until the next iteration).
// Split-K (splits > 1): a tile's splits are one cluster, each summing its share of the 8-channel
// stages; rank 0 adds the others' accumulators (cluster_sum) and alone runs the epilogue. For
// small grids over deep reductions, whose blocks would each walk a long chain of stages.
#pragma once

#include <cstdint>

#include "conv_gemm_halo.cuh"

namespace epilog::cuda::conv_gemm_detail {

template <int BM, int BN, int S, bool RegA, bool Wide = false>
struct HaloWgTile {
  // HaloTile's patch geometry, which does not depend on n (n = 16 exists on this kernel only:
  // the mma.sync one's warps are 32 channels wide).
  static constexpr int kPatchN = BN < 32 ? 32 : BN;
  using T = HaloTile<BM, kPatchN, S>;
  static constexpr int kSquares = T::kSquares, kThreads = 128 * kSquares, kNI = BN / 8;
  // n = 32 tiles keep 768 threads an SM (85 registers a thread): their layers wait on memory,
  // and the residual they fetch ahead (conv_halo_wgmma_kernel) would otherwise cost a block.
  // n = 16 at stride 1 keeps 896 (7 blocks of 64x16, 72 registers): the 16-channel C2f layers'
  // short blocks hide each other's fill (perf-history: "seven 64x16 blocks an SM"). 1024
  // threads (64 registers) spilled and lost, at n = 16 and n = 32 alike.
  static constexpr int kMinBlocks = kNI <= 2 && S == 1           ? 896 / kThreads
                                    : kNI <= 4 && kThreads < 768 ? 768 / kThreads
                                                                 : 1;
  // A from registers (see the header comment), else from the OpA buffers.
  static constexpr bool kRegA = RegA;
  static constexpr int kOpA = 8 * T::kPos;  // one square's patch: 2 chunks x kPos slots x 4
  static constexpr int kOpB = kHaloK * BN;  // 9 taps x 2 chunks x BN rows x 4
  // The patches: HaloTile's (rows kPW slots apart), or wide rows (halo_wgmma_wide in shapes.h,
  // HaloWideLoader): rows kHaloWideRow apart, a row's first column `off` slots in (the kernel's
  // fragment offset).
  static_assert(!Wide || halo_wgmma_wide(BM, BN, S, RegA), "wide rows: see halo_wgmma_wide");
  static constexpr int kRow = Wide ? kHaloWideRow : T::kPW;
  static constexpr int kCS = Wide ? 10 * kHaloWideRow : T::kCS;
  static constexpr int kPatch = Wide ? 8 * kCS : T::kPatch;
  static constexpr __device__ int col_slot(int px) { return Wide ? px : T::col_slot(px); }
  // A stage: the staged patches, then the packed weights.
  static constexpr int kStageFloats = kSquares * kPatch + kOpB;
  // Sized for the tile's largest layout (shared-memory A where n = 32 takes it); wide rows, on
  // one-square tiles only, fit the same stages (asserted below).
  static constexpr int kMaxStages = halo_wgmma_max_stages(BM, BN, S);
  // Then one mbarrier a stage (up to 4) for its weights.
  static constexpr size_t smem_bytes(int stages) {
    return sizeof(float) * (size_t(stages) * kStageFloats + (kRegA ? 0 : 2 * kSquares * kOpA)) +
           kWgmmaBarrierBytes;
  }
  static_assert(smem_bytes(kMaxStages) ==
                    size_t(halo_wgmma_smem_bytes(BM, BN, S, kMaxStages, kRegA, Wide)),
                "shapes.h sizes the same buffers");
  static_assert(smem_bytes(3) <= 227 * 1024 && smem_bytes(kMaxStages) <= 227 * 1024,
                "three stages, and kMaxStages, fit in shared memory");
  static_assert(kOpA % 4 == 0 && kStageFloats % 4 == 0, "16-byte aligned buffers");
  static_assert(kNI * 4 * kThreads <= 3 * kStageFloats,
                "split-K parks the accumulators in the pipeline's space (at least 3 stages)");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// A shared-memory matrix descriptor, no swizzle: start address, leading-dimension (K) and
// stride-dimension (M or N) byte offsets between core matrices, each in 16-byte units.
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3ffff) >> 4) | uint64_t((lbo & 0x3ffff) >> 4) << 16 |
         uint64_t((sbo & 0x3ffff) >> 4) << 32;
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Orders this thread's ordinary shared-memory stores before the tensor cores' reads.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// -- bulk copies completing on an mbarrier (the tensor memory accelerator's 1-D form) --
// Written by the async proxy, as the tensor cores read: no proxy fence between the two, where a
// fence.proxy.async after cp.async would order all of the thread's copies still in flight.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
}
// The arrival on `bar` of the one thread that issues a stage's copies: the barrier then also
// expects `bytes`, which the copies below count down as they land.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory,
// counted on `bar`.
__device__ __forceinline__ void bulk_copy(uint32_t bar, uint32_t dst, const void* src,
                                          uint32_t bytes) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
// One stage's weights: `bytes` from global to shared memory, the one arrival on the stage's
// mbarrier `bar`. One thread issues it.
__device__ __forceinline__ void copy_stage(uint32_t bar, uint32_t dst, const void* src,
                                           uint32_t bytes) {
  mbar_expect_tx(bar, bytes);
  bulk_copy(bar, dst, src, bytes);
}
// One box of a rank-3 tensor map (a __grid_constant__ kernel parameter) at coordinates
// (c0, c1, c2), innermost first, counted on `bar`; out-of-bounds elements land as zeros.
__device__ __forceinline__ void tensor_copy_3d(uint32_t bar, uint32_t dst, const void* map, int c0,
                                               int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// Thread 0 initialises the `stages` mbarriers from `bars` on (one arrival each: copy_stage's)
// and makes them visible to the async proxy that completes them; the block's threads first
// wait on them after a barrier.
__device__ __forceinline__ void init_stage_barriers(uint32_t bars, int stages, int tid) {
  if (tid != 0) return;
  for (int st = 0; st < stages; ++st)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bars + 8 * st) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

#define EPILOG_D4(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])

// D[64 x 8NI] += A[64 x 8] * B[8 x 8NI], TF32 operands from shared memory, fp32 accumulators.
template <int NI>
__device__ __forceinline__ void wgmma_tf32(float (&d)[NI][4], uint64_t a, uint64_t b);

template <>
__device__ __forceinline__ void wgmma_tf32<2>(float (&d)[2][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, 1, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
      : EPILOG_D4(0), EPILOG_D4(1)
      : "l"(a), "l"(b));
}

template <>
__device__ __forceinline__ void wgmma_tf32<4>(float (&d)[4][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, 1, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, "
      "1;\n}\n"
      : EPILOG_D4(0), EPILOG_D4(1), EPILOG_D4(2), EPILOG_D4(3)
      : "l"(a), "l"(b));
}

template <>
__device__ __forceinline__ void wgmma_tf32<8>(float (&d)[8][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, 1, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
      : EPILOG_D4(0), EPILOG_D4(1), EPILOG_D4(2), EPILOG_D4(3), EPILOG_D4(4), EPILOG_D4(5),
        EPILOG_D4(6), EPILOG_D4(7)
      : "l"(a), "l"(b));
}

template <>
__device__ __forceinline__ void wgmma_tf32<16>(float (&d)[16][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, 1, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, "
      "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
      "%55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
      : EPILOG_D4(0), EPILOG_D4(1), EPILOG_D4(2), EPILOG_D4(3), EPILOG_D4(4), EPILOG_D4(5),
        EPILOG_D4(6), EPILOG_D4(7), EPILOG_D4(8), EPILOG_D4(9), EPILOG_D4(10), EPILOG_D4(11),
        EPILOG_D4(12), EPILOG_D4(13), EPILOG_D4(14), EPILOG_D4(15)
      : "l"(a), "l"(b));
}

// The same with A from registers, already TF32: a warp's 16 rows of the 64 as mma.m16n8k8's A
// fragment (a0 row g, column t; a1 row g + 8; a2, a3 the same at column t + 4). Its registers
// must hold still until the wgmma is waited for.
template <int NI>
__device__ __forceinline__ void wgmma_tf32_rs(float (&d)[NI][4], const uint32_t (&a)[4],
                                              uint64_t b);

#define EPILOG_A4 "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])

template <>
__device__ __forceinline__ void wgmma_tf32_rs<2>(float (&d)[2][4], const uint32_t (&a)[4],
                                                 uint64_t b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, 1, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
      : EPILOG_D4(0), EPILOG_D4(1)
      : EPILOG_A4, "l"(b));
}

template <>
__device__ __forceinline__ void wgmma_tf32_rs<4>(float (&d)[4][4], const uint32_t (&a)[4],
                                                 uint64_t b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, 1, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
      : EPILOG_D4(0), EPILOG_D4(1), EPILOG_D4(2), EPILOG_D4(3)
      : EPILOG_A4, "l"(b));
}

template <>
__device__ __forceinline__ void wgmma_tf32_rs<8>(float (&d)[8][4], const uint32_t (&a)[4],
                                                 uint64_t b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, 1, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : EPILOG_D4(0), EPILOG_D4(1), EPILOG_D4(2), EPILOG_D4(3), EPILOG_D4(4), EPILOG_D4(5),
        EPILOG_D4(6), EPILOG_D4(7)
      : EPILOG_A4, "l"(b));
}

template <>
__device__ __forceinline__ void wgmma_tf32_rs<16>(float (&d)[16][4], const uint32_t (&a)[4],
                                                  uint64_t b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, 1, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, "
      "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
      "%55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
      : EPILOG_D4(0), EPILOG_D4(1), EPILOG_D4(2), EPILOG_D4(3), EPILOG_D4(4), EPILOG_D4(5),
        EPILOG_D4(6), EPILOG_D4(7), EPILOG_D4(8), EPILOG_D4(9), EPILOG_D4(10), EPILOG_D4(11),
        EPILOG_D4(12), EPILOG_D4(13), EPILOG_D4(14), EPILOG_D4(15)
      : EPILOG_A4, "l"(b));
}

#undef EPILOG_A4
#undef EPILOG_D4

// Barrier `id` (1..4; 0 is __syncthreads) over the 128 threads of one warpgroup.
__device__ __forceinline__ void warpgroup_sync(int id) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}

// Four floats of shared memory, each rounded to TF32 (see to_tf32), stored as one 16-byte vector.
__device__ __forceinline__ void store_tf32x4(float* dst, float v0, float v1, float v2, float v3) {
  *reinterpret_cast<uint4*>(dst) = make_uint4(to_tf32(v0), to_tf32(v1), to_tf32(v2), to_tf32(v3));
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// The patch of a one-square block as wide rows (HaloWgTile's Wide layout, halo_wgmma_wide): the
// 10 input rows under the square, each 20 floats from the 16-byte boundary at or before column
// ox0 - pl, in 16-byte copies: channel plane cl holds row r's chunk k (columns x0 + 4k .. + 3,
// x0 = ox0 - pl - ((-pl) mod 4)) at slots 200 cl + 20 r + 4k. The layer's rows are 16-byte
// aligned (w, the image stride and x multiples of 4 floats: conv_gemm takes these kernels only
// then), so a chunk lies wholly inside its row or wholly outside (zero fill, as rows outside the
// image and channels past c).
// Why: HaloPatchLoader's 4-byte copies are a third of a stage at three blocks an SM, these a
// sixth (perf-history: "wide patch rows"). A TMA box of the same rows was faster alone on an SM
// and slower at three, the copy engine being what several blocks wait on; a box from column
// ox0 - pl (not 16-byte aligned) stopped the kernel with "illegal instruction".
struct HaloWideLoader {
  static constexpr int kItems = 4, kChunks = 8 * 10 * 5;  // a square's chunks, 128 threads
  static_assert(kItems * 128 >= kChunks && 10 * kHaloWideRow == 4 * 50, "chunk i at slot 4i");
  const HaloArgs& a;
  // Item i of the thread is chunk wtid + 128 i: plane cl = item / 50, row item % 50 / 5, chunk
  // item % 5, at slot 4 item. goff: its offset in the image, plane cl's included (0 outside).
  // meta: nibble i is cl, or 8 outside the image (copied while c0 + cl < c); bit 16 whether the
  // thread has a fourth item. Packed: the 64x32 tiles are held to 85 registers.
  int goff[kItems];
  uint32_t meta, dst;  // dst: item 0's shared-memory address in stage 0
  const float* x_img;

  // HaloPatchLoader's arguments; wm is 0 (one square).
  __device__ __forceinline__ HaloWideLoader(const HaloArgs& args, uint32_t smem0, int warp, int,
                                            int lane, bool sq_ok, int img, int oy0, int ox0)
      : a(args) {
    const int wtid = (warp % 4) * 32 + lane, hw = a.h * a.w;
    const int iy0 = oy0 - a.pt, x0 = ox0 - a.pl - ((-a.pl) & 3);
    meta = wtid + 128 * (kItems - 1) < kChunks ? 1u << 16 : 0u;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int item = wtid + 128 * i, cl = item / 50, r = item % 50 / 5, k = item % 5;
      const int iy = iy0 + r, ix = x0 + 4 * k;
      const bool ok =
          sq_ok && item < kChunks && unsigned(iy) < unsigned(a.h) && ix >= 0 && ix + 4 <= a.w;
      goff[i] = ok ? cl * hw + iy * a.w + ix : 0;
      meta |= uint32_t(ok ? cl : 8) << (4 * i);
    }
    dst = smem0 + 16 * wtid;
    x_img = a.x + size_t(img) * a.xs;
  }

  // Stage kt's patch (input channels 8kt ..) into the staging buffer sbase bytes past the first.
  __device__ __forceinline__ void load_patch(uint32_t sbase, int kt) const {
    // Channels left, at most 8: meta's mark of a chunk outside the image, which never copies.
    const int c0 = kt * kHaloC, left = a.c - c0 < kHaloC ? a.c - c0 : kHaloC;
    const float* const base = x_img + size_t(c0) * (a.h * a.w);
#pragma unroll
    for (int i = 0; i + 1 < kItems; ++i)
      cp_async16(dst + sbase + 16 * 128 * i, base + goff[i], int(meta >> (4 * i) & 15) < left);
    constexpr int kLast = kItems - 1;
    cp_async16_if(meta >> 16, dst + sbase + 16 * 128 * kLast, base + goff[kLast],
                  int(meta >> (4 * kLast) & 15) < left ? 16 : 0);
  }
};

// Whether the kernel for a layer of n channels (with a residual or not) fetches a residual ahead
// (see the kernel): n <= 32 costs 16 registers at most, so even the layers without one run the
// kernel that does; at n = 64 (32 registers) the whole-tile, stride-1 layers with one run a
// kernel of their own (the C2f bottleneck's second conv).
constexpr bool halo_wgmma_res_ahead(int n, int stride, bool split, bool reg_a, bool residual) {
  if (n == 64) return residual && stride == 1 && !split;
  return n <= 32 && (!reg_a || n <= 16);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The conv chain's second conv (cuda::conv_chain, conv_chain_fits), after the mainloop of the
// first: acc holds all kChainC channels of the warpgroup's square, which the 1x1 conv reads.
// A's epilogue (scale, shift, activation) in place, rounded to TF32; then acc is the A operand of
// the 1x1's kChainC / 8 wgmmas as it lies (pack_conv_chain orders the 1x1's weights to match),
// their B the 1x1's weights, copied into the first stage buffer once every warpgroup is past the
// mainloop; then the 1x1's epilogue and the stores. Channel 8ni + 2t + e of the lane's two
// pixels is acc[0][ni][2h + e] (the kernel's header); k step j of a wgmma's register A takes
// column t from a0 (row g) and a1 (row g + 8), column t + 4 from a2 and a3.
template <int NI, int Threads>
__device__ __forceinline__ void chain_epilogue(const HaloArgs& a, float (&acc)[1][NI][4],
                                               const int (&pix)[1][2], int t, int tid,
                                               uint32_t smem0) {
  constexpr int kC = 8 * NI;
  static_assert(kC == kChainC, "the chain's convs have kChainC channels, all in one tile");
  const float* const tail = a.wp + size_t(a.ctiles) * kHaloK * kC;  // one n tile
  __syncthreads();  // every warpgroup is done with the stage buffers
  for (int i = tid; i < kC * kC / 4; i += Threads) cp_async16(smem0 + 16 * i, tail + 4 * i, true);
  cp_async_commit();
  with_activation(a.act, [&](auto act) { scale_shift_act(acc, a.scale, a.shift, a.k, 0, t, act); });
#pragma unroll
  for (int ni = 0; ni < NI; ++ni)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[0][ni][q] = __uint_as_float(to_tf32(acc[0][ni][q]));
  cp_async_wait<0>();
  fence_proxy_async();  // the copies, before the tensor cores read them
  __syncthreads();
  float out[1][NI][4];
#pragma unroll
  for (int ni = 0; ni < NI; ++ni)
#pragma unroll
    for (int q = 0; q < 4; ++q) out[0][ni][q] = 0.0f;
  const uint64_t b_desc = wgmma_desc(smem0, 16 * kC, 128);
  wgmma_fence();
  // ptxas fences each wgmma after the first (warpgroup.arrive, C7519), the fragments' quads not
  // lying in the accumulators' register order; made before the fence, the same.
#pragma unroll
  for (int j = 0; j < NI; ++j) {
    const uint32_t af[4] = {__float_as_uint(acc[0][j][0]), __float_as_uint(acc[0][j][2]),
                            __float_as_uint(acc[0][j][1]), __float_as_uint(acc[0][j][3])};
    wgmma_tf32_rs<NI>(out[0], af, b_desc + uint64_t(2 * kC * j));
  }
  wgmma_commit();
  wgmma_wait<0>();
  const float* const scale = tail + kC * kC;
  with_activation(a.chain_act,
                  [&](auto act) { scale_shift_act(out, scale, scale + kC, a.k, 0, t, act); });
  const int hwo = a.ho * a.wo;
  for_outputs<1, NI>(pix, a.k, 0, t, [&](int mi, int ni, int q, int n, int p) {
    a.y[n * hwo + p] = out[mi][ni][q];
  });
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Split: splits > 1 (an instance of its own, so that the whole-tile kernels keep their code; its
// grids are small, so it is not held to kMinBlocks: at 80 registers it spilled).
// ResAhead: a residual is fetched into registers before the mainloop (see below).
// Wide: the patches staged as wide rows (HaloWideLoader).
// Chain: the conv chain (chain_epilogue): the tile's outputs go to a 1x1 conv, whose are stored.
template <int BM, int BN, int S, bool RegA, bool Split, bool ResAhead, bool Wide, bool Chain>
__global__ void __launch_bounds__(HaloWgTile<BM, BN, S, RegA, Wide>::kThreads,
                                  Split ? 1 : HaloWgTile<BM, BN, S, RegA, Wide>::kMinBlocks)
    conv_halo_wgmma_kernel(const HaloArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using W = HaloWgTile<BM, BN, S, RegA, Wide>;
  static_assert(!Chain || (RegA && !Split && !ResAhead && W::kStageFloats >= BN * BN),
                "the chain: register A, whole tiles, no residual, its 1x1 weights in a stage");
  using T = typename W::T;
  extern __shared__ __align__(16) float smem[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wg = warp / 4, wtid = tid % 128;  // warpgroup = square of the block
  const int t = lane % 4;
  // Split-K: a tile's splits are consecutive blocks, one cluster; split j sums channel stages
  // [j * ctiles / splits, (j + 1) * ctiles / splits), never empty (splits <= ctiles).
  const int tile = Split ? int(blockIdx.x / unsigned(a.splits)) : int(blockIdx.x);
  const int split = Split ? int(blockIdx.x) - tile * a.splits : 0;
  const int m_tile = fast_div(tile, a.div_n_tiles);
  const int n_tile = tile - m_tile * a.n_tiles;
  const int n0 = n_tile * BN;
  const uint32_t smem0 = smem_addr(smem);
  constexpr uint32_t kStageBytes = 4 * W::kStageFloats;
  const int kt0 = Split ? split * a.ctiles / a.splits : 0;
  const int stages = a.stages, ktiles = Split ? (split + 1) * a.ctiles / a.splits - kt0 : a.ctiles;
  float* const op0 = smem + stages * W::kStageFloats;  // operand buffers 0 and 1
  const uint32_t op0_addr = smem_addr(op0);

  const HaloSquare sq(a, m_tile * W::kSquares + wg);
  using Loader = std::conditional_t<Wide, HaloWideLoader, HaloPatchLoader<BM, W::kPatchN, S, 4>>;
  const Loader loader(a, smem0, warp, wg, lane, sq.ok, sq.img, sq.oy0, sq.ox0);
  // Packed weights: this n tile's stages one after another, each kOpB floats as OpB lays them
  // (this split's from stage kt0 on); a stage's are one bulk copy, issued by thread 0 and
  // counted on the stage's mbarrier.
  const float* const wp = a.wp + (size_t(n_tile) * a.ctiles + kt0) * W::kOpB;
  const uint32_t b_dst = smem0 + 4 * W::kSquares * W::kPatch;
  const uint32_t bars = op0_addr + (W::kRegA ? 0 : 4 * 2 * W::kSquares * W::kOpA);
  auto load_weights = [&](int stage, int kt) {
    if (tid == 0)
      copy_stage(bars + 8 * stage, b_dst + stage * kStageBytes, wp + size_t(kt) * W::kOpB,
                 4 * W::kOpB);
  };
  init_stage_barriers(bars, stages, tid);
  __syncthreads();

  float acc[1][W::kNI][4];
#pragma unroll
  for (int ni = 0; ni < W::kNI; ++ni)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][ni][e] = 0.0f;

  // Descriptors: A of this square in operand buffer 0 (buffer 1 lies kOpStep 16-byte units on),
  // B in stage 0 (stage s lies s * kStageBytes on).
  const uint32_t a_addr = op0_addr + 4 * wg * W::kOpA;
  constexpr uint64_t kOpStep = uint64_t(W::kSquares * W::kOpA * 4 / 16);
  // Register A: lane (g, t) of warp w holds pixels (2w, g) and (2w + 1, g) of its square,
  // channels t and t + 4; tap (i, j) reads them at patch rows 2wS + i and 2wS + S + i, column
  // gS + j: the S + 3 rows from 2wS on serve the three taps of a column.
  // Wide rows: a row's first column lies ((-pl) mod 4) slots in (HaloWideLoader).
  const int a_frag = 2 * (warp % 4) * S * W::kRow + t * W::kCS + (Wide ? (-a.pl) & 3 : 0);
  // Stages copied ahead of the one read: stages - 1 where each stage's wgmmas are waited for
  // within it (register A), stages - 2 where one group stays in flight (a stage's weights are
  // read until the next iteration).
  constexpr int kBehind = W::kRegA ? 1 : 2;
  // Stages in flight from the start: all of them where the stage buffers hold the whole
  // reduction (no buffer is rewritten then; the launcher gives such layers no more buffers than
  // their stages), else stages - kBehind.
  const int ahead = ktiles <= stages ? ktiles : stages - kBehind;

  // The weights are no output of the kernel before this one: their first stages' copies start
  // before waiting for it (programmatic dependent launch), the input's after.
  for (int st = 0; st < ahead; ++st) load_weights(st, st);
  detail::pdl_begin();
  // Rows 16w + g and + 8 of the warpgroup's M are pixels (2w, g) and (2w + 1, g).
  const auto pixels = [&](int(&pix)[1][2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) pix[0][h] = sq.pixel(a, 2 * (warp % 4) + h, lane / 4);
  };
  // ResAhead: a residual is fetched now, its loads under the mainloop's. Read in the epilogue,
  // the residual of a one-wave grid is loaded by all blocks at once after their mainloops:
  // Nsight Compute had 37% of the stall samples of a 40x40 bottleneck's second conv on its adds
  // (perf-history: "n = 64 residual ahead"). Costs registers: n = 16, 8 a thread (76 at 64x16,
  // register A: at n = 16 that beat shared-memory A with it ahead); n = 32, 16 (with A in shared memory: the launcher takes register A at n = 32 only
  // without a residual); n = 64, 32 (a kernel of its own, halo_wgmma_res_ahead).
  float res[1][ResAhead ? W::kNI : 1][4] = {};
  if constexpr (ResAhead) {
    if (a.res && split == 0) {
      int pix[1][2];
      pixels(pix);
      for_residual<1, W::kNI>(a, pix, sq.img, n0, t,
                              [&](int, int ni, int q, float v) { res[0][ni][q] = v; });
    }
  }
  for (int st = 0; st < ahead; ++st) {
    loader.load_patch(st * kStageBytes, kt0 + st);
    cp_async_commit();
  }
  int read_stage = 0, write_stage = ahead % stages;
  uint32_t phase = 0;  // of read_stage's mbarrier: flips each time the stages come round
  for (int kt = 0; kt < ktiles; ++kt) {
    // Stage kt's copies are done once at most ahead - 1 younger groups are pending.
    if (ahead >= 3)
      cp_async_wait<2>();
    else if (ahead == 2)
      cp_async_wait<1>();
    else
      cp_async_wait<0>();
    mbar_wait(bars + 8 * read_stage, phase);
    // Stage kt is visible to all; every warpgroup's wgmmas of stage kt - kBehind are done (the
    // waits at the end of the iterations), so its stage and operand buffers may be rewritten.
    __syncthreads();
    // Stage kt + ahead's copies, into the buffers of a stage whose wgmmas are done.
    const auto copy_ahead = [&] {
      if (kt + ahead < ktiles) {
        load_weights(write_stage, kt + ahead);
        loader.load_patch(write_stage * kStageBytes, kt0 + kt + ahead);
      }
      cp_async_commit();
      write_stage = write_stage + 1 == stages ? 0 : write_stage + 1;
    };
    // One-square n = 64 tiles issue them under this stage's wgmmas (below): the 20x20 layers'
    // 64x64 blocks, one warpgroup each, wait on a chain of 16 stages, and there the copies'
    // instructions (a sixth of a warp's) overlapped the tensor cores' work (perf-history: "copies
    // under the wgmmas"). Elsewhere they cost registers and lost: 128x64 tiles 94 -> 106, with a
    // residual fetched ahead 126 -> 138 (a block an SM fewer), n <= 32 spills.
    constexpr bool kCopiesUnder = W::kRegA && W::kSquares == 1 && W::kNI == 8;
    if constexpr (!kCopiesUnder) copy_ahead();
    const float* p = smem + read_stage * W::kStageFloats + wg * W::kPatch;
    const uint32_t b_addr = b_dst + read_stage * kStageBytes;
    auto b_desc = [&](int tap) { return wgmma_desc(b_addr + 16 * 2 * BN * tap, 16 * BN, 128); };

    if constexpr (W::kRegA && W::kNI == 16) {
      // -- a column of taps at a time: its A fragments, then its three wgmmas; the next
      // column's fragments load into the other register set while they run --
      uint32_t rows[2][S + 3][2];
      const auto load_column = [&](int j, uint32_t(&r)[S + 3][2]) {
#pragma unroll
        for (int q = 0; q < S + 3; ++q) {
          const float* f = p + a_frag + q * W::kRow + W::col_slot(lane / 4 * S + j);
          r[q][0] = lds_tf32(f);
          r[q][1] = lds_tf32(f + 4 * W::kCS);
        }
      };
      load_column(0, rows[0]);
#pragma unroll
      for (int j = 0; j < 3; ++j) {
        uint32_t(&r)[S + 3][2] = rows[j % 2];
        wgmma_fence();
#pragma unroll
        for (int i = 0; i < 3; ++i) {
          const uint32_t af[4] = {r[i][0], r[S + i][0], r[i][1], r[S + i][1]};
          wgmma_tf32_rs<W::kNI>(acc[0], af, b_desc(3 * i + j));
        }
        wgmma_commit();
        if (j < 2) load_column(j + 1, rows[(j + 1) % 2]);
        wgmma_wait<0>();
      }
    } else if constexpr (W::kRegA) {
      // -- this warpgroup's A fragments, rounded to TF32, then nine wgmmas, one a tap. The
      // loads are written out, not load_column's: with it (a lambda or a function) ptxas gave
      // these tiles 1 to 7 more registers and 128x32 at stride 2 a spill --
      uint32_t rows[3][S + 3][2];
#pragma unroll
      for (int j = 0; j < 3; ++j)
#pragma unroll
        for (int r = 0; r < S + 3; ++r) {
          const float* q = p + a_frag + r * W::kRow + W::col_slot(lane / 4 * S + j);
          rows[j][r][0] = lds_tf32(q);
          rows[j][r][1] = lds_tf32(q + 4 * W::kCS);
        }
      wgmma_fence();
#pragma unroll
      for (int tap = 0; tap < 9; ++tap) {
        const int i = tap / 3, j = tap % 3;
        const uint32_t af[4] = {rows[j][i][0], rows[j][S + i][0], rows[j][i][1], rows[j][S + i][1]};
        wgmma_tf32_rs<W::kNI>(acc[0], af, b_desc(tap));
      }
      wgmma_commit();
      if constexpr (kCopiesUnder) copy_ahead();
      // The next stage's fragments go to the same registers, which the wgmmas read until done.
      wgmma_wait<0>();
    } else {
      // -- this warpgroup's patch -> OpA, rounded to TF32: item (chunk, slot) gathers 4 planes --
      float* o = op0 + (kt & 1) * (W::kSquares * W::kOpA) + wg * W::kOpA;
#pragma unroll
      for (int it = wtid; it < 2 * T::kPos; it += 128) {
        const int chunk = it >= T::kPos, slot = it - chunk * T::kPos;
        const float* src = p + 4 * chunk * T::kCS + slot;
        store_tf32x4(o + 4 * it, src[0], src[T::kCS], src[2 * T::kCS], src[3 * T::kCS]);
      }
      // This warpgroup's stores, before its tensor cores read them: only it reads its OpA.
      fence_proxy_async();
      warpgroup_sync(1 + wg);
      // -- nine wgmmas, one a tap --
      const uint64_t a_buf = (kt & 1) * kOpStep;
      wgmma_fence();
#pragma unroll
      for (int tap = 0; tap < 9; ++tap) {
        const int i = tap / 3, j = tap % 3;
        const uint32_t a_tap = a_addr + 16 * (i * T::kPW + T::col_slot(j));
        wgmma_tf32<W::kNI>(acc[0], wgmma_desc(a_tap, 16 * T::kPos, 16 * S * T::kPW) + a_buf,
                           b_desc(tap));
      }
      wgmma_commit();
      wgmma_wait<1>();
    }
    if (++read_stage == stages) read_stage = 0, phase ^= 1;
  }
  wgmma_wait<0>();
  cp_async_wait<0>();
  if constexpr (Split) {
    __syncthreads();  // every warpgroup is done with the pipeline's space
    if (!cluster_sum<W::kNI * 4, W::kThreads>(&acc[0][0][0], smem, split, a.splits)) return;
  }

  int pix[1][2];
  pixels(pix);
  if constexpr (Chain)
    chain_epilogue<W::kNI, W::kThreads>(a, acc, pix, t, tid, smem0);
  else if constexpr (ResAhead)
    halo_epilogue(a, acc, pix, sq.img, n0, t, res);
  else
    halo_epilogue(a, acc, pix, sq.img, n0, t);
#else
  __trap();  // built without sm_90a code: conv_gemm never launches it then
#endif
}

}  // namespace epilog::cuda::conv_gemm_detail
