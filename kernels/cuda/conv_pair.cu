// gemm's conv pair kernel: two fused convs in a row as one kernel - a stem conv A (3x3 at stride
// 2 over at most 3 input channels into at most 16) and the 3x3 stride-2 conv B that alone reads
// A's output (into at most 32 channels): conv_pair_fits, shapes.h. A's outputs are made in shared
// memory, where B's halo kernel would stage them, and never reach global memory.
//
// Why: at the head of an image network A's output is the largest tensor of the model, and both
// convs are bound by their instructions and their bytes, not by their arithmetic. The YOLO-like
// model's first two layers at batch 16 (3 -> 16 -> 32 channels, 640x640 -> 320x320 -> 160x160)
// took 60.8 and 66.1 us apart (Nsight Compute, 2026-12-04): A writes 105 MB, B reads it back.
// Here the input is read once and only B's output is written, at the cost of A's outputs on the
// column and row B's neighbouring squares share (289 positions a square against 256).
//
// Math: y = act_b(conv_b(z) * scale_b + shift_b), z = act_a(conv_a(x) * scale_a + shift_a), each
// conv as conv_gemm.cu states it, z read as 0 outside A's output plane (B's padding).
// Layout: float32 NCHW; images of x and y xs and ys floats apart; the weights as stored.
// Block: 128 threads, one warpgroup; persistent, block b taking B's 8x8 output squares b, b +
// grid, ... in (image, row of squares, column of squares) order. For each square:
//   1. Its input is staged by cp.async while the square before it runs B (one buffer, free once
//      A has read it): C channels x 35 rows x 40 floats from the 16-byte boundary at or before
//      the first column (16-byte copies where x's rows are 16-byte aligned, else 4-byte), zeros
//      outside the image.
//   2. A on the tensor cores (TF32 mma.sync m16n8k8): M = the 289 positions of B's 17x17 input
//      patch in the slot order of the halo kernel's stride-2 patch (HaloTile<64, 32, 2>: even
//      columns, then odd), 19 m16 tiles, warp w taking tiles w, w + 4, ...; K = 5 steps of 8
//      over (tap column, (channel, tap row) pair), kKsA says how; N = 16. A lane's fragment rows
//      come from a table of the patch's positions (built once a block), its k columns at constant
//      offsets from them; the weights' B fragments stay in registers. Its epilogue writes z,
//      rounded to TF32, into the patch P[16 channels][kCS] (zero outside A's plane).
//   3. B as the wgmma halo kernel's register-A path (conv_gemm_wgmma.cuh): two stages of 8
//      channels, each nine m64n32k8 wgmmas, B's weights in OpB's layout in shared memory, packed
//      and rounded there once a block.
//   4. B's epilogue (halo_epilogue's, B's factors staged in shared memory) from the accumulators.
// Restrictions: conv_pair_fits; sm_90a; x and y each span under 2^31 floats. The caller
// precomputes nothing.
#include <atomic>
#include <climits>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

#include "conv_common.cuh"
#include "conv_gemm_wgmma.cuh"
#include "epilog/kernels/cuda.h"
#include "epilog/kernels/launch.h"
#include "epilog/runtime/launch_log.h"

namespace epilog::cuda {
namespace {

using namespace conv_gemm_detail;

constexpr int kThreads = 128;
using Tb = HaloTile<64, 32, 2>;                // B's input patch under a square
constexpr int kTilesA = (Tb::kPos + 15) / 16;  // A's m16 tiles: 19
constexpr int kXRows = 2 * (Tb::kPH - 1) + 3;  // 35 input rows under the patch
constexpr int kXRow = 40;                      // 35 columns from any phase, in float4s
constexpr int kXPlane = kXRows * kXRow;        // a staged channel
constexpr int kXBuf = kPairMaxCin * kXPlane;   // the staging buffer
// A's reduction as 5 k steps of 8: column t of a step (and t + 4) is tap column j = t of the
// window (t = 3: none, its weights 0), step ks's two halves are (channel, tap row) pairs 2 ks and
// 2 ks + 1 of the 9 (the tenth: none). So a lane's loads differ by constants from one base a row
// (no address arithmetic), and the 4 lanes t of a fragment row read 4 adjacent floats: with the
// rows 8 lanes g hit 4 floats apart, no bank conflicts. The 8 slots of none read finite values
// (weights 0): column 3 and channels past c, zeroed once a block.
constexpr int kKsA = 5;
// Where (channel, tap row) pair q = 3c + i starts from a row's base, in bytes.
__host__ __device__ constexpr int pair_offset(int q) {
  return q < 9 ? 4 * (q / 3 * kXPlane + q % 3 * kXRow) : 0;
}
static_assert(2 * kKsA >= 3 * kPairMaxCin, "(channel, tap row) pairs");
constexpr int kStagesB = kPairMaxMid / kHaloC;  // B's stages of 8 channels: 2
constexpr int kOpB = kHaloK * kPairMaxCout;     // B's weights a stage, OpB's layout
constexpr int kTable = 16 * kTilesA;            // A's fragment rows: where their input lies
constexpr int kAffB = 2 * kPairMaxCout;         // B's scales, then shifts
constexpr int kSmemFloats = kXBuf + kPairMaxMid * Tb::kCS + kStagesB * kOpB + kTable + kAffB;
static_assert(kXBuf % 4 == 0 && (kPairMaxMid * Tb::kCS) % 4 == 0, "16-byte aligned buffers");

struct PairArgs {
  HaloArgs b;  // B: its factors, y, planes (c, h, w: A's output) and squares; its x, wt, wp unused
  const float* x;  // A's input
  const float* wa;
  const float* scale_a;
  const float* shift_a;
  const float* wb;  // B's weights as stored
  int c, h, w;      // A's input channels and plane
  int pt, pl;       // A's padding
  int xs;           // floats between images of x
  int phase;        // a staged row's first column's place in its float4
  bool vec;         // 16-byte copies: w % 4 == 0, xs % 4 == 0, x 16-byte aligned
  Act act_a;
};

// A 4-byte shared load at a shared-space address, raw.
__device__ __forceinline__ uint32_t lds_at(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}

// Four blocks an SM (55 KB of shared memory, 128 registers each).
__global__ void __launch_bounds__(kThreads, 4) conv_pair_kernel(const PairArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) float smem[];
  float* const xbuf = smem;
  float* const patch = smem + kXBuf;
  float* const opb = patch + kPairMaxMid * Tb::kCS;
  int* const table = reinterpret_cast<int*>(opb + kStagesB * kOpB);
  float* const aff_b = reinterpret_cast<float*>(table + kTable);
  const HaloArgs& b = a.b;
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;

  // No output of the kernel before this one, so set up before waiting for it: B's weights in
  // OpB's layout (stage s, tap, chunk, row n, channel e of the chunk) and A's in B-fragment
  // registers, both rounded to TF32, zero past the real channels; B's factors; A's fragment rows
  // (slot m: its input's offset | py << 11 | px << 16, INT_MIN past the patch); the staging
  // buffer's channels past c, which its slots of none read, zeroed.
  // Thread tid packs row n = tid / 4, channel tid % 4 of every chunk: its loads lie at constant
  // offsets from one base (the packing ran once a block, but with its indices decoded per element
  // it was 6% of the kernel's instructions).
  static_assert(kThreads == 4 * kPairMaxCout && kOpB == 18 * kThreads,
                "a thread a row and channel");
  {
    const int n = tid / 4, ch = tid % 4;
    const float* const wn = a.wb + (n * b.c + ch) * 9;
    uint32_t* const opb_u = reinterpret_cast<uint32_t*>(opb) + tid;
#pragma unroll
    for (int i = 0; i < kStagesB * 18; ++i) {
      const int q = i % 18, c0 = 8 * (i / 18) + 4 * (q & 1);  // c = c0 + ch, tap q / 2
      const bool ok = n < b.k && c0 + ch < b.c;
      opb_u[i * kThreads] = to_tf32(ok ? __ldg(wn + c0 * 9 + q / 2) : 0.0f);
    }
  }
  if (tid < kPairMaxCout) {
    aff_b[tid] = tid < b.k && b.scale ? __ldg(b.scale + tid) : 1.0f;
    aff_b[kPairMaxCout + tid] = tid < b.k && b.shift ? __ldg(b.shift + tid) : 0.0f;
  }
  for (int m = tid; m < kTable; m += kThreads) {
    const int py = m / Tb::kPW, px = Tb::slot_col(m - py * Tb::kPW);
    table[m] = m < Tb::kPos ? (2 * py * kXRow + 2 * px + a.phase) | py << 11 | px << 16 : INT_MIN;
  }
  for (int e = a.c * kXPlane + tid; e < kXBuf; e += kThreads) xbuf[e] = 0.0f;
  uint32_t wa[kKsA][2][2];  // step ks, A's channel 8 nt + g, half h: tap (q / 3, q % 3, t)
#pragma unroll
  for (int ks = 0; ks < kKsA; ++ks)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int q = 2 * ks + h, c = q / 3;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int n = 8 * nt + g;
        const bool ok = n < b.c && c < a.c && q < 9 && t < 3;
        wa[ks][nt][h] = to_tf32(ok ? __ldg(a.wa + (n * a.c + c) * 9 + q % 3 * 3 + t) : 0.0f);
      }
    }
  float sc[2][2], sh[2][2];  // A's channel 8 nt + 2t + e
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int n = 8 * nt + 2 * t + e;
      sc[nt][e] = n < b.c && a.scale_a ? __ldg(a.scale_a + n) : 1.0f;
      sh[nt][e] = n < b.c && a.shift_a ? __ldg(a.shift_a + n) : 0.0f;
    }

  // Square s's input into the staging buffer: float4 slot e of a staged channel (row e / 10,
  // float4 e % 10) is thread tid's for e = tid, tid + 128, tid + 256 (e < 350), in every channel,
  // so a thread's copies share one bounds test and one source per slot.
  constexpr int kSlots = kXRows * kXRow / 4;
  const uint32_t x_dst = smem_addr(xbuf) + 16 * tid;
  const int hw = a.h * a.w;
  const auto stage = [&](const HaloSquare& s) {
    const int iy0 = 2 * (2 * s.oy0 - b.pt) - a.pt;
    const int ix0 = 2 * (2 * s.ox0 - b.pl) - a.pl - a.phase;
    const float* const img = a.x + size_t(s.img) * a.xs;
#pragma unroll
    for (int j = 0; j < (kSlots + kThreads - 1) / kThreads; ++j) {
      const int e = tid + j * kThreads;
      if (e >= kSlots) break;
      const int iy = iy0 + e / (kXRow / 4), ix = ix0 + 4 * (e % (kXRow / 4));
      const uint32_t dst = x_dst + 16 * j * kThreads;
      const bool row_ok = unsigned(iy) < unsigned(a.h);
      if (a.vec) {
        // w % 4 == 0 and ix % 4 == 0: a float4 lies wholly inside the row or wholly outside.
        const bool ok = row_ok && unsigned(ix) < unsigned(a.w);
        const float* src = ok ? img + (iy * a.w + ix) : a.x;
        const int step = ok ? hw : 0;
#pragma unroll
        for (int c = 0; c < kPairMaxCin; ++c, src += step)
          if (c < a.c) cp_async16(dst + 4 * c * kXPlane, src, ok);
      } else {
#pragma unroll
        for (int f = 0; f < 4; ++f) {
          const bool ok = row_ok && unsigned(ix + f) < unsigned(a.w);
          const float* src = ok ? img + (iy * a.w + ix + f) : a.x;
          const int step = ok ? hw : 0;
#pragma unroll
          for (int c = 0; c < kPairMaxCin; ++c, src += step)
            if (c < a.c) cp_async4(dst + 4 * (c * kXPlane + f), src, ok);
        }
      }
    }
    cp_async_commit();
  };

  // B's register-A fragments (conv_gemm_wgmma.cuh): lane (g, t) of warp w holds pixels (2w, g)
  // and (2w + 1, g), channels t and t + 4 of a stage; tap (i, j) reads patch rows 4w + i and
  // 4w + 2 + i, column 2g + j.
  const int a_frag = 4 * warp * Tb::kPW + t * Tb::kCS;
  // B's weight descriptors: one built, the rest by constant offsets (in 16-byte units) from it.
  const uint64_t opb_desc = wgmma_desc(smem_addr(opb), 16 * kPairMaxCout, 128);
  const uint32_t x_lane = smem_addr(xbuf) + 4 * t;  // lane t's tap column

  // A square is decoded once: as the next one while its input is staged.
  HaloSquare s(b, int(blockIdx.x));
  detail::pdl_begin();
  if (s.ok) stage(s);
  fence_proxy_async();  // the packed weights, stored by threads, before the tensor cores read them

  with_activation(a.act_a, [&](auto act) {
    for (int sq = int(blockIdx.x); sq < b.squares; sq += int(gridDim.x)) {
      // The square's input has landed, and every warp is past the last square's B, which read
      // the patch.
      cp_async_wait<0>();
      __syncthreads();

      // -- A: z on the patch positions, into the patch --
      uint32_t* const pu = reinterpret_cast<uint32_t*>(patch);
      const int ay0 = 2 * s.oy0 - b.pt, ax0 = 2 * s.ox0 - b.pl;
#pragma unroll 1
      for (int tile = warp; tile < kTilesA; tile += 4) {
        // Rows g and g + 8: patch slot 16 tile + g + 8h.
        const int row[2] = {table[16 * tile + g], table[16 * tile + g + 8]};
        uint32_t at[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) at[h] = x_lane + 4 * (row[h] & 0x7ff);
        float acc[2][4] = {};
#pragma unroll
        for (int ks = 0; ks < kKsA; ++ks) {
          const int o0 = pair_offset(2 * ks), o1 = pair_offset(2 * ks + 1);
          // + 0x1000u: to_tf32 on the raw bits.
          const uint32_t af[4] = {lds_at(at[0] + o0) + 0x1000u, lds_at(at[1] + o0) + 0x1000u,
                                  lds_at(at[0] + o1) + 0x1000u, lds_at(at[1] + o1) + 0x1000u};
          mma_tf32(acc[0], af, wa[ks][0]);
          mma_tf32(acc[1], af, wa[ks][1]);
        }
        // acc[nt][e + 2h]: slot 16 tile + g + 8h, channel 8 nt + 2t + e.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (row[h] < 0) continue;
          const int m = 16 * tile + g + 8 * h;
          const bool in = unsigned(ay0 + (row[h] >> 11 & 31)) < unsigned(b.h) &&
                          unsigned(ax0 + (row[h] >> 16)) < unsigned(b.w);
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float v = act(fmaf(acc[nt][e + 2 * h], sc[nt][e], sh[nt][e]));
              pu[(8 * nt + 2 * t + e) * Tb::kCS + m] = to_tf32(in ? v : 0.0f);
            }
        }
      }
      // The patch is written and the input read: the next square's copies run under B.
      __syncthreads();
      const HaloSquare next(b, sq + int(gridDim.x));
      if (next.ok) stage(next);

      // -- B: two stages of nine wgmmas, A from registers --
      float acc[1][kPairMaxCout / 8][4] = {};
#pragma unroll
      for (int st = 0; st < kStagesB; ++st) {
        const float* const p = patch + st * kHaloC * Tb::kCS + a_frag;
        uint32_t rows[3][5][2];
#pragma unroll
        for (int j = 0; j < 3; ++j)
#pragma unroll
          for (int r = 0; r < 5; ++r) {
            const float* const f = p + r * Tb::kPW + Tb::col_slot(2 * g + j);
            rows[j][r][0] = lds_at(smem_addr(f));
            rows[j][r][1] = lds_at(smem_addr(f + 4 * Tb::kCS));
          }
        wgmma_fence();
#pragma unroll
        for (int tap = 0; tap < 9; ++tap) {
          const int i = tap / 3, j = tap % 3;
          const uint32_t af[4] = {rows[j][i][0], rows[j][2 + i][0], rows[j][i][1],
                                  rows[j][2 + i][1]};
          wgmma_tf32_rs<kPairMaxCout / 8>(
              acc[0], af, opb_desc + (4 * st * kOpB + 16 * 2 * kPairMaxCout * tap) / 16);
        }
        wgmma_commit();
        wgmma_wait<0>();
      }
      // -- B's epilogue: its factors from shared memory, then the stores as halo_epilogue's --
      int pix[1][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) pix[0][h] = s.pixel(b, 2 * warp + h, g);
      with_activation(b.act, [&](auto act_b) {
#pragma unroll
        for (int ni = 0; ni < kPairMaxCout / 8; ++ni) {
          const float2 f = *reinterpret_cast<const float2*>(aff_b + 8 * ni + 2 * t);
          const float2 d = *reinterpret_cast<const float2*>(aff_b + kPairMaxCout + 8 * ni + 2 * t);
          float(&v)[4] = acc[0][ni];
          v[0] = act_b(fmaf(v[0], f.x, d.x));
          v[1] = act_b(fmaf(v[1], f.y, d.y));
          v[2] = act_b(fmaf(v[2], f.x, d.x));
          v[3] = act_b(fmaf(v[3], f.y, d.y));
        }
      });
      // for_outputs' stores, from one pointer a pixel.
      const int hwo = b.ho * b.wo;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (pix[0][h] < 0) continue;
        float* const yp = b.y + pix[0][h];
#pragma unroll
        for (int ni = 0; ni < kPairMaxCout / 8; ++ni)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int n = 8 * ni + 2 * t + e;
            if (n < b.k) yp[n * hwo] = acc[0][ni][2 * h + e];
          }
      }
      s = next;
    }
  });
  cp_async_wait<0>();
#else
  __trap();  // built without sm_90a code: conv_pair refuses to launch then
#endif
}

[[noreturn]] void reject(const std::string& why) {
  throw std::invalid_argument("[conv_pair] " + why);
}

}  // namespace

void conv_pair(const ConvShape& sa, const ConvShape& sb, const float* x, const float* wa,
               const float* scale_a, const float* shift_a, Act act_a, const float* wb,
               const float* scale_b, const float* shift_b, Act act_b, float* y,
               Stream stream) {
  if (!conv_pair_fits(sa, sb))
    reject(
        "takes a 3x3 conv at stride 2 over at most 3 channels into at most 16, then a 3x3 conv at "
        "stride 2 of its output into at most 32 channels, dilation 1, groups 1, non-negative "
        "padding");
  if (!wgmma_available())
    reject(
        "needs a compute capability 9.0 GPU and a build with sm_90a code (EPILOG_CUDA_ARCH=90a)");
  if (sb.n * sb.ho * sb.wo == 0 || sb.k == 0) return;
  if (sa.n * sa.x_image() >= INT32_MAX || sb.n * sb.y_image() >= INT32_MAX)
    reject("x and y must each span fewer than 2^31 elements");
  PairArgs a{};
  HaloArgs& b = a.b;
  b.scale = scale_b;
  b.shift = shift_b;
  b.y = y;
  if (!set_halo_geometry(b, sb, kPairMaxCout)) reject("too many output squares");
  b.act = act_b;
  a.x = x;
  a.wa = wa;
  a.scale_a = scale_a;
  a.shift_a = shift_a;
  a.wb = wb;
  a.c = int(sa.c), a.h = int(sa.h), a.w = int(sa.w);
  a.pt = int(sa.pad_t), a.pl = int(sa.pad_l);
  a.xs = int(sa.x_image());
  a.phase = int((-2 * sb.pad_l - sa.pad_l) & 3);
  a.vec = sa.w % 4 == 0 && sa.x_image() % 4 == 0 && detail::aligned16(x);
  a.act_a = act_a;

  constexpr size_t kSmem = sizeof(float) * kSmemFloats;
  static std::atomic<uint64_t> opted_in{0};
  static detail::ResidentCache resident{};
  detail::opt_in(opted_in, kSmem, conv_pair_kernel);
  const int fit = detail::resident_blocks(resident, 0, conv_pair_kernel, kThreads, kSmem);
  detail::launch_pdl(conv_pair_kernel, unsigned(b.squares < fit ? b.squares : fit), kThreads, kSmem,
                     stream, 1, a);
  check_launch("conv_pair");
  log_launch("gemm pair", [] { return conv_pair_tiles_str(); });
}

}  // namespace epilog::cuda
