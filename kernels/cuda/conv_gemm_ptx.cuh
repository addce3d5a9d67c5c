// The inline-PTX wrappers of conv_gemm.cu (cp.async, mma.sync TF32, TF32 rounding) and the
// split-K exchange of its kernels, kept apart so that the kernels that use them read as plain C++.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cooperative_groups.h>

#include "launch.cuh"

namespace epilog::cuda::conv_gemm_detail {

using detail::aligned16;
using detail::with_activation;
using detail::with_activation_lean;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// -- cp.async --
// src_bytes == 0 reads nothing and fills the destination with zeros (padding, tails); callers
// still pass an in-bounds src for masked copies. 16-byte copies go through L2 only (.cg: the
// data is read once per block); 4-byte copies may only use .ca, which also lets L1 serve the
// neighbouring reads of a gather.
__device__ __forceinline__ void cp_async16(uint32_t dst, const float* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const float* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0));
}
// The byte count given directly (0 or 4), for callers that keep it in a register.
__device__ __forceinline__ void cp_async4_n(uint32_t dst, const float* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
// Guarded forms: nothing at all happens when !guard (lanes that own no copy); src_bytes is 0 or
// the full size as above.
__device__ __forceinline__ void cp_async16_if(bool guard, uint32_t dst, const float* src,
                                              int src_bytes) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n"
      " @p cp.async.cg.shared.global [%0], [%1], 16, %2;\n}\n" ::"r"(dst),
      "l"(src), "r"(src_bytes), "r"(int(guard)));
}
__device__ __forceinline__ void cp_async4_if(bool guard, uint32_t dst, const float* src,
                                             int src_bytes) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n"
      " @p cp.async.ca.shared.global [%0], [%1], 4, %2;\n}\n" ::"r"(dst),
      "l"(src), "r"(src_bytes), "r"(int(guard)));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
// With `stages` buffers the oldest tile is complete once at most stages - 2 younger groups are
// pending (one group is committed per tile, empty or not).
__device__ __forceinline__ void cp_async_wait_stage(int stages) {
  if (stages >= 4)
    cp_async_wait<2>();
  else if (stages == 3)
    cp_async_wait<1>();
  else
    cp_async_wait<0>();
}

// -- TF32 --
// Round to nearest (ties away from zero) as one integer add: the tensor core reads only the top
// 19 bits of a .tf32 operand (sign, exponent, 10 mantissa bits) and ignores the low 13, so adding
// half a TF32 ulp (0x1000) first turns its truncation into rounding. The carry runs into the
// exponent exactly when rounding should (up to infinity past the largest TF32); infinities and
// NaNs with a payload in the kept bits stay what they are. This is cvt.rna.tf32.f32 for every
// finite input, in one instruction instead of the two that cvt takes on sm_90.
__device__ __forceinline__ uint32_t to_tf32(float v) {
  return __float_as_uint(v) + 0x1000u;
}

// A 4-byte shared load already rounded to TF32, through ld.volatile so that ptxas neither merges
// nor deduplicates it: where one value belongs to two MMA fragments (the halo kernel's patch rows
// shared by vertically adjacent taps), a deduplicated load leaves ptxas regrouping fragment and
// accumulator registers, about 90 moves per 288 MMAs; two loads cost two instructions.
__device__ __forceinline__ uint32_t lds_tf32(const float* p) {
  uint32_t v;
  asm volatile("ld.volatile.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(smem_addr(p)));
  return v + 0x1000u;
}

// D += A * B for one m16n8k8 tile, TF32 operands, float32 accumulators. Fragments (g = lane / 4,
// t = lane % 4): a0 (row g, k t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4);
// b0 (k t, col g), b1 (t + 4, g); d0 (g, 2t), d1 (g, 2t + 1), d2 (g + 8, 2t), d3 (g + 8, 2t + 1).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Batchnorm and activation in place over a warp's accumulators, acc[mi][ni] one m16n8 tile:
// elements e and 2 + e are channel n0 + 8 ni + 2t + e (d0..d3 above), whatever pixels the
// kernel maps their rows to (n0 even). Channels past k read scale 1 and shift 0 (never stored).
// Where both vectors exist, are 8-byte aligned and cover the warp's channels, a thread's two
// channels of an ni are one 8-byte load each, at immediate offsets from one address: the
// per-channel tests and 64-bit address arithmetic of the general path were two fifths of the
// 1x1 direct kernel's epilogue instructions (Nsight Compute source view, b16_c256_256_1x1_40).
// The loads of up to 8 ni go out together, then their math: loaded next to their math instead,
// one at a time, each waited for, the layers took up to 40% longer (A/B of 2026-12-03); all 16
// ni of n = 128 at once spilled the 256x128 wgmma halo tiles (held to 128 registers).
template <int MI, int NI, class ActFn>
__device__ __forceinline__ void scale_shift_act(float (&acc)[MI][NI][4],
                                                const float* __restrict__ scale,
                                                const float* __restrict__ shift, int k, int n0,
                                                int t, ActFn act) {
  const bool pairs =
      scale && shift &&
      ((reinterpret_cast<uintptr_t>(scale) | reinterpret_cast<uintptr_t>(shift)) & 7) == 0 &&
      n0 + 8 * NI <= k;
  const float2* __restrict__ s2 = reinterpret_cast<const float2*>(scale + n0 + 2 * t);
  const float2* __restrict__ f2 = reinterpret_cast<const float2*>(shift + n0 + 2 * t);
  constexpr int kGroup = NI < 8 ? NI : 8;
#pragma unroll
  for (int n1 = 0; n1 < NI; n1 += kGroup) {
    float2 sc[kGroup], sf[kGroup];
    if (pairs) {
#pragma unroll
      for (int i = 0; i < kGroup; ++i) {
        sc[i] = __ldg(s2 + 4 * (n1 + i));
        sf[i] = __ldg(f2 + 4 * (n1 + i));
      }
    } else {
#pragma unroll
      for (int i = 0; i < kGroup; ++i) {
        const int n = n0 + 8 * (n1 + i) + 2 * t;
        sc[i].x = scale && n < k ? __ldg(scale + n) : 1.0f;
        sc[i].y = scale && n + 1 < k ? __ldg(scale + n + 1) : 1.0f;
        sf[i].x = shift && n < k ? __ldg(shift + n) : 0.0f;
        sf[i].y = shift && n + 1 < k ? __ldg(shift + n + 1) : 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < kGroup; ++i)
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        float(&d)[4] = acc[mi][n1 + i];
        d[0] = act(fmaf(d[0], sc[i].x, sf[i].x));
        d[1] = act(fmaf(d[1], sc[i].y, sf[i].y));
        d[2] = act(fmaf(d[2], sc[i].x, sf[i].x));
        d[3] = act(fmaf(d[3], sc[i].y, sf[i].y));
      }
  }
}

// -- split-K --
// The `splits` blocks of one thread-block cluster (rank = this block's) each summed a part of a
// tile's reduction into acc, kAcc floats laid out alike in every block. Rank 0 gets the total:
// the others park theirs in their own shared memory (element i of thread tid at i * kThreads +
// tid, so that a warp's accesses are consecutive) and rank 0 adds them through distributed
// shared memory between two cluster barriers, the second keeping the others' shared memory alive
// until it has read. No workspace, no second kernel, no atomics. Returns whether this block holds
// the total (and runs the epilogue). Every thread of the cluster calls it, with smem (kAcc *
// kThreads floats) no longer in use; with splits == 1 it does nothing.
template <int kAcc, int kThreads>
__device__ __forceinline__ bool cluster_sum(float* acc, float* smem, int rank, int splits) {
#if __CUDA_ARCH__ >= 900  // clusters; the launchers run splits > 1 on Hopper only
  if (splits == 1) return true;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int tid = int(threadIdx.x);
  if (rank != 0) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) smem[i * kThreads + tid] = acc[i];
  }
  cluster.sync();
  if (rank == 0) {
    for (int r = 1; r < splits; ++r) {
      const float* peer = cluster.map_shared_rank(smem, r);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] += peer[i * kThreads + tid];
    }
  }
  cluster.sync();
  return rank == 0;
#else
  return true;
#endif
}

}  // namespace epilog::cuda::conv_gemm_detail
