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
//   1. Its input is staged by cp.async while the square before it computes (two buffers): C
//      channels x 35 rows x 40 floats from the 16-byte boundary at or before the first column
//      (16-byte copies where x's rows are 16-byte aligned, else 4-byte), zeros outside the image.
//   2. A on the tensor cores (TF32 mma.sync m16n8k8): M = the 289 positions of B's 17x17 input
//      patch in the slot order of the halo kernel's stride-2 patch (HaloTile<64, 32, 2>: even
//      columns, then odd), 19 m16 tiles, warp w taking tiles w, w + 4, ...; K = 9C in the
//      weight's order, padded to 32; N = 16. Each lane's A fragment rows sit at fixed offsets of
//      the staged input (decoded once a block), its k columns at fixed offsets too; the weights'
//      B fragments stay in registers. Its epilogue writes z, rounded to TF32, into the patch
//      P[16 channels][kCS] (zero outside A's plane).
//   3. B as the wgmma halo kernel's register-A path (conv_gemm_wgmma.cuh): two stages of 8
//      channels, each nine m64n32k8 wgmmas, B's weights in OpB's layout in shared memory, packed
//      and rounded there once a block.
//   4. B's epilogue (halo_epilogue) from the accumulators.
// A and B sum their products in the order the stem kernel and the halo kernel do, so the pair
// gives the bits of those two kernels in a row where lowering would run B on the wgmma halo
// kernel's register-A tiles.
// Restrictions: conv_pair_fits; sm_90a; x and y each span under 2^31 floats. The caller
// precomputes nothing.
#include <atomic>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

#include "conv_common.cuh"
#include "conv_gemm_wgmma.cuh"
#include "epilog/kernels/cuda.h"

namespace epilog::cuda {
namespace {

using namespace conv_gemm_detail;

constexpr int kThreads = 128;
using Tb = HaloTile<64, 32, 2>;                   // B's input patch under a square
constexpr int kTilesA = (Tb::kPos + 15) / 16;     // A's m16 tiles: 19
constexpr int kTilesPerWarp = (kTilesA + 3) / 4;  // 5
constexpr int kKsA = 4;                           // A's k steps: 9C <= 27 padded to 32
constexpr int kXRows = 2 * (Tb::kPH - 1) + 3;     // 35 input rows under the patch
constexpr int kXRow = 40;                         // 35 columns from any phase, in float4s
constexpr int kXPlane = kXRows * kXRow;           // a staged channel
constexpr int kXBuf = kPairMaxCin * kXPlane;      // a staging buffer
constexpr int kStagesB = kPairMaxMid / kHaloC;    // B's stages of 8 channels: 2
constexpr int kOpB = kHaloK * kPairMaxCout;       // B's weights a stage, OpB's layout
constexpr int kSmemFloats = 2 * kXBuf + kPairMaxMid * Tb::kCS + kStagesB * kOpB;
static_assert(kKsA * 8 >= 9 * kPairMaxCin && kStagesB * kHaloC == kPairMaxMid, "A's reduction");
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
  Activation act_a;
};

// A 4-byte shared load of a value already rounded to TF32.
__device__ __forceinline__ uint32_t lds_u32(const float* p) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(smem_addr(p)));
  return v;
}

__global__ void __launch_bounds__(kThreads, 3) conv_pair_kernel(const PairArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) float smem[];
  float* const xbuf = smem;
  float* const patch = smem + 2 * kXBuf;
  float* const opb = patch + kPairMaxMid * Tb::kCS;
  const HaloArgs& b = a.b;
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;

  // B's weights in OpB's layout (stage s, tap, chunk, row n, channel e of the chunk) and A's in
  // B-fragment registers, both rounded to TF32, zero past the real channels: no output of the
  // kernel before this one, so read before waiting for it.
  uint32_t* const opb_u = reinterpret_cast<uint32_t*>(opb);
  for (int e = tid; e < kStagesB * kOpB; e += kThreads) {
    const int ch = e % 4, n = e / 4 % kPairMaxCout, q = e / (4 * kPairMaxCout) % 18;
    const int c = 8 * (e / (4 * kPairMaxCout * 18)) + 4 * (q & 1) + ch;
    opb_u[e] = to_tf32(n < b.k && c < b.c ? __ldg(a.wb + (n * b.c + c) * 9 + (q >> 1)) : 0.0f);
  }
  const int ka = 9 * a.c;
  uint32_t wa[kKsA][2][2];  // k = 8 ks + t + 4h, A's channel 8 nt + g
  int koff[kKsA][2];        // where k's input lies from a position's first, in a staging buffer
#pragma unroll
  for (int ks = 0; ks < kKsA; ++ks)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int k = 8 * ks + t + 4 * h;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int n = 8 * nt + g;
        wa[ks][nt][h] = to_tf32(n < b.c && k < ka ? __ldg(a.wa + n * ka + k) : 0.0f);
      }
      koff[ks][h] = k < ka ? k / 9 * kXPlane + k % 9 / 3 * kXRow + k % 3 : 0;
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
  // Rows g and g + 8 of the warp's m16 tiles w + 4q: patch slot m = 16 (w + 4q) + g + 8h, at
  // position (py, px) of the patch (yx = py << 8 | px; -1 past the patch), whose input starts
  // xoff floats into a staging buffer.
  int xoff[kTilesPerWarp][2], yx[kTilesPerWarp][2];
#pragma unroll
  for (int q = 0; q < kTilesPerWarp; ++q)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = 16 * (warp + 4 * q) + g + 8 * h;
      const int py = m / Tb::kPW, px = Tb::slot_col(m - py * Tb::kPW);
      const bool ok = m < Tb::kPos;
      xoff[q][h] = ok ? 2 * py * kXRow + 2 * px + a.phase : 0;
      yx[q][h] = ok ? py << 8 | px : -1;
    }

  // Square sq's input into staging buffer buf: item i = (channel, row, float4) at float 4i.
  const auto stage = [&](int sq, int buf) {
    const HaloSquare s(b, sq);
    const int iy0 = 2 * (2 * s.oy0 - b.pt) - a.pt;
    const int ix0 = 2 * (2 * s.ox0 - b.pl) - a.pl - a.phase;
    const float* const xi = a.x + size_t(s.img) * a.xs;
    const uint32_t dst = smem_addr(xbuf + buf * kXBuf);
    const int items = a.c * kXRows * (kXRow / 4);
    for (int i = tid; i < items; i += kThreads) {
      const int c = i / (kXRows * kXRow / 4), rest = i - c * (kXRows * kXRow / 4);
      const int r = rest / (kXRow / 4), ix = ix0 + 4 * (rest - r * (kXRow / 4)), iy = iy0 + r;
      const bool row_ok = unsigned(iy) < unsigned(a.h);
      const float* const src = xi + (row_ok ? (c * a.h + iy) * a.w : 0);
      if (a.vec) {
        // w % 4 == 0 and ix % 4 == 0: a float4 lies wholly inside the row or wholly outside.
        const bool ok = row_ok && ix >= 0 && ix < a.w;
        cp_async16(dst + 16 * i, ok ? src + ix : a.x, ok);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool ok = row_ok && unsigned(ix + e) < unsigned(a.w);
          cp_async4(dst + 16 * i + 4 * e, ok ? src + ix + e : a.x, ok);
        }
      }
    }
    cp_async_commit();
  };

  // B's register-A fragments (conv_gemm_wgmma.cuh): lane (g, t) of warp w holds pixels (2w, g)
  // and (2w + 1, g), channels t and t + 4 of a stage; tap (i, j) reads patch rows 4w + i and
  // 4w + 2 + i, column 2g + j.
  const int a_frag = 4 * warp * Tb::kPW + t * Tb::kCS;
  const uint32_t opb_addr = smem_addr(opb);

  int sq = int(blockIdx.x);
  detail::pdl_begin();
  if (sq < b.squares) stage(sq, 0);
  fence_proxy_async();  // the packed weights, stored by threads, before the tensor cores read them
  __syncthreads();

  with_activation(a.act_a, [&](auto act) {
    for (int it = 0; sq < b.squares; sq += int(gridDim.x), ++it) {
      // The next square's copies, into the buffer the last one read (its barrier below).
      const int next = sq + int(gridDim.x);
      if (next < b.squares)
        stage(next, (it + 1) & 1);
      else
        cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();
      const HaloSquare s(b, sq);

      // -- A: z on the patch positions, into the patch --
      const float* const xb = xbuf + (it & 1) * kXBuf;
      uint32_t* const pu = reinterpret_cast<uint32_t*>(patch);
      const int ay0 = 2 * s.oy0 - b.pt, ax0 = 2 * s.ox0 - b.pl;
#pragma unroll
      for (int q = 0; q < kTilesPerWarp; ++q) {
        if (warp + 4 * q >= kTilesA) break;
        float acc[2][4] = {};
#pragma unroll
        for (int ks = 0; ks < kKsA; ++ks) {
          const uint32_t af[4] = {
              lds_tf32(xb + xoff[q][0] + koff[ks][0]), lds_tf32(xb + xoff[q][1] + koff[ks][0]),
              lds_tf32(xb + xoff[q][0] + koff[ks][1]), lds_tf32(xb + xoff[q][1] + koff[ks][1])};
          mma_tf32(acc[0], af, wa[ks][0]);
          mma_tf32(acc[1], af, wa[ks][1]);
        }
        // acc[nt][e + 2h]: slot 16 (w + 4q) + g + 8h, channel 8 nt + 2t + e.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (yx[q][h] < 0) continue;
          const int m = 16 * (warp + 4 * q) + g + 8 * h;
          const bool in = unsigned(ay0 + (yx[q][h] >> 8)) < unsigned(b.h) &&
                          unsigned(ax0 + (yx[q][h] & 255)) < unsigned(b.w);
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float v = activate(act.value, fmaf(acc[nt][e + 2 * h], sc[nt][e], sh[nt][e]));
              pu[(8 * nt + 2 * t + e) * Tb::kCS + m] = to_tf32(in ? v : 0.0f);
            }
        }
      }
      __syncthreads();

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
            rows[j][r][0] = lds_u32(f);
            rows[j][r][1] = lds_u32(f + 4 * Tb::kCS);
          }
        const uint32_t b_addr = opb_addr + 4 * st * kOpB;
        wgmma_fence();
#pragma unroll
        for (int tap = 0; tap < 9; ++tap) {
          const int i = tap / 3, j = tap % 3;
          const uint32_t af[4] = {rows[j][i][0], rows[j][2 + i][0], rows[j][i][1],
                                  rows[j][2 + i][1]};
          wgmma_tf32_rs<kPairMaxCout / 8>(
              acc[0], af, wgmma_desc(b_addr + 16 * 2 * kPairMaxCout * tap, 16 * kPairMaxCout, 128));
        }
        wgmma_commit();
        wgmma_wait<0>();
      }
      int pix[1][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) pix[0][h] = s.pixel(b, 2 * warp + h, g);
      halo_epilogue(b, acc, pix, s.img, 0, t);
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
               const float* scale_a, const float* shift_a, Activation act_a, const float* wb,
               const float* scale_b, const float* shift_b, Activation act_b, float* y,
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
  b.c = int(sb.c), b.h = int(sb.h), b.w = int(sb.w);
  b.k = int(sb.k), b.ho = int(sb.ho), b.wo = int(sb.wo);
  b.pt = int(sb.pad_t), b.pl = int(sb.pad_l);
  b.tiles_x = int((sb.wo + kHaloSide - 1) / kHaloSide);
  b.tiles_yx = int((sb.ho + kHaloSide - 1) / kHaloSide) * b.tiles_x;
  const int64_t squares = sb.n * b.tiles_yx;
  if (squares >= INT32_MAX) reject("too many output squares");
  b.squares = int(squares);
  b.n_tiles = 1;
  b.div_n_tiles = make_fastdiv(1);
  b.div_tiles_yx = make_fastdiv(uint32_t(b.tiles_yx));
  b.div_tiles_x = make_fastdiv(uint32_t(b.tiles_x));
  b.ys = int(sb.y_image());
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
}

}  // namespace epilog::cuda
