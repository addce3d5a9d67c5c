// gemm's stem kernel: the first layer of an image network - a dense 3x3 window over at most 4
// input channels into at most 16 output channels, the same stride 1 or 2 both ways, dilation 1
// (conv_gemm_stem_fits, shapes.h) - as an implicit GEMM on the tensor cores (TF32 mma.sync,
// float32 accumulation). conv_gemm runs it for tiles {m, 16, kGemmStemK}: m / 64 output rows a
// tile, m in {128, 256, 512}.
//
// Why: its whole reduction (27 for RGB) is one k tile. gemm's gather kernel spends that tile on
// 4-byte copies (117 us for 3 -> 16 channels at 640x640, stride 2, batch 16), and scalar's stem
// path on FMAs (Nsight Compute: 54% of its instructions, issue slots 58% busy; 77 us against a
// floor of 43). Here the input under a tile is copied once, 16 bytes at a time, and an output's
// 27 MACs are a fraction of an MMA: 62 us at batch 16, 7.1 at batch 1 against scalar's 9.3
// (conv_bench, 2026-12-04). Nsight Compute (256-pixel tiles, batch 16): DRAM at half its peak,
// issue slots 69% busy; a first form that rewrote the input into conflict-free column planes,
// one tile a block, took 112 us.
//
// Math: conv_gemm.cu's, with K = 9C in the weight's own order k = (c*3 + i)*3 + j, padded with
// zeros to KS = ceil(9C / 8) k steps of 8, and N = Cout padded to 16 (two n8 tiles).
// Layout: float32 NCHW; images of x, y and the residual xs, ys, rs floats apart.
// Block: 256 threads (8 warps); tile (img, row tile, column tile) = R = m / 64 output rows by 64
// output columns of one image, every channel. Persistent: as many blocks as fit at once, block b
// taking tiles b, b + grid, ... (column tiles fastest), the next tile's input copied while this
// one computes (two buffers).
// Staging: the input under a tile, C channels x RPC = (R - 1) S + 3 rows of row_floats(S), each row
// from the float4 that holds its first column on (16-byte cp.async where w % 4 == 0 and x and its
// images are 16-byte aligned, else 4-byte), zeros outside the image (zero-fill). Output column p
// of the tile reads tap column j at phase + S p + j, phase = the first column's place in its
// float4.
// MMA: warp w takes the m16 tiles of pixels 16 (w % 4) to + 16 of rows w / 4, w / 4 + 2, ...;
// fragment rows g and g + 8 are pixels, the weights' B fragments stay in
// registers (staged in shared memory past the input before the wait for the previous kernel).
// At stride 2 a fragment's lanes g read every other float: two-way bank conflicts, which cost
// less than rewriting the input into conflict-free planes did (an instruction-bound first form).
// Epilogue: acc * scale + shift, the activation, the residual, from the accumulators: each
// store instruction writes 8 consecutive pixels of 4 channels, four whole 32-byte sectors.
// The caller (conv_gemm) checked that x, y and the residual each span under 2^31 floats.
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

#include "conv_common.cuh"
#include "conv_gemm_ptx.cuh"
#include "epilog/kernels/cuda.h"
#include "epilog/kernels/launch.h"
#include "epilog/runtime/launch_log.h"

namespace epilog::cuda::conv_gemm_detail {

namespace {

constexpr int kThreads = 256;
constexpr int kCols = kGemmStemCols;  // output columns a tile
constexpr int kMaxRows = 512 / kCols;
// k steps of 8 over C channels' 9 taps.
constexpr __host__ __device__ int k_steps(int c) {
  return (9 * c + 7) / 8;
}

// Staged floats a row: the float4s that cover a tile's input columns from any phase, padded so
// that rows start 16-byte aligned.
constexpr __host__ __device__ int row_floats(int stride) {
  return ((kCols - 1) * stride + 3 + 3 + 3) / 4 * 4;
}
// A staging buffer: C channels of (R - 1) S + 3 rows.
constexpr int buffer_floats(int c, int rows, int stride) {
  return c * ((rows - 1) * stride + 3) * row_floats(stride);
}
// Past the two buffers: the weights, 16 rows of 8 KS + 4, and 16 scales and shifts.
constexpr int extra_floats(int c) {
  return 16 * (8 * k_steps(c) + 4) + 32;
}

struct StemMmaArgs {
  const float* x;
  const float* wt;
  const float* scale;
  const float* shift;
  float* y;
  const float* res;  // residual (y's shape) or null
  int h, w, k, ho, wo;
  int pt, pl;
  int rows;                  // output rows a tile: m / 64
  int col_tiles, row_tiles;  // ceil(wo / 64), ceil(ho / rows)
  int tiles;                 // n * row_tiles * col_tiles
  FastDiv div_cols, div_rows;
  int xs, ys, rs;  // elements between images of x, y and the residual
  bool vec_in;     // 16-byte copies
  Act act, res_act;  // res_act: after adding the residual (cuda::ConvResidual)
};

// A 4-byte shared load at a shared-space address, rounded to TF32 (to_tf32).
__device__ __forceinline__ uint32_t lds_tf32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v + 0x1000u;
}

template <int S, int C>
__global__ void __launch_bounds__(kThreads, kGemmStemBlocksPerSm)
    conv_stem_mma_kernel(const StemMmaArgs a) {
  constexpr int KS = k_steps(C);
  constexpr int kRow = row_floats(S);
  extern __shared__ __align__(16) float smem[];
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const int rpc = (a.rows - 1) * S + 3, rows = C * rpc, buf = rows * kRow;

  // The weights (B, rounded to TF32, [channel][k], rows kLdB apart: conflict-free fragment loads)
  // and the factors are no output of the kernel before this one: staged before waiting for it
  // (programmatic dependent launch), past the two buffers.
  constexpr int kLdB = 8 * KS + 4;
  uint32_t* const wsm = reinterpret_cast<uint32_t*>(smem + 2 * buf);
  float* const aff = smem + 2 * buf + 16 * kLdB;  // scale[16], shift[16]; 1 and 0 past Cout
  for (int e = tid; e < 16 * 8 * KS; e += kThreads) {
    const int n = e / (8 * KS), k = e % (8 * KS);
    wsm[n * kLdB + k] = to_tf32(n < a.k && k < 9 * C ? __ldg(a.wt + n * 9 * C + k) : 0.0f);
  }
  if (tid < 16) {
    aff[tid] = a.scale && tid < a.k ? __ldg(a.scale + tid) : 1.0f;
    aff[16 + tid] = a.shift && tid < a.k ? __ldg(a.shift + tid) : 0.0f;
  }

  struct Origin {
    int img, oy0, ox0;
  };
  const auto origin = [&](int tile) {
    const int q = fast_div(tile, a.div_cols), ct = tile - q * a.col_tiles;
    const int img = fast_div(q, a.div_rows);
    return Origin{img, (q - img * a.row_tiles) * a.rows, ct * kCols};
  };
  // Column ix0 & ~3 of the input is column 0 of a staged row; phase = ix0 - (ix0 & ~3) is the
  // same for every tile (64 S is a multiple of 4).
  const int phase = (-a.pl) & 3;
  // Staged row cr = c * rpc + r of tile `tile` <- input row oy0 S - pt + r of channel c, a row a
  // warp at a time.
  const auto stage = [&](int tile, int b) {
    const Origin o = origin(tile);
    const int iy0 = o.oy0 * S - a.pt, a0 = o.ox0 * S - a.pl - phase;
    const float* __restrict__ xi = a.x + int64_t(o.img) * a.xs;
    const uint32_t dst = smem_addr(smem + b * buf);
#pragma unroll 1
    for (int cr = warp; cr < rows; cr += kThreads / 32) {
      const int c = (cr >= rpc) + (cr >= 2 * rpc) + (cr >= 3 * rpc), iy = iy0 + cr - c * rpc;
      const bool in_rows = unsigned(iy) < unsigned(a.h);
      const float* const src = xi + (in_rows ? (c * a.h + iy) * a.w + a0 : 0);
      const uint32_t d = dst + 4 * cr * kRow;
      if (a.vec_in) {
        // w % 4 == 0: a float4 lies wholly inside the row or wholly outside it.
#pragma unroll
        for (int v = lane; v < kRow / 4; v += 32) {
          const bool ok = in_rows && unsigned(a0 + 4 * v) < unsigned(a.w);
          cp_async16(d + 16 * v, ok ? src + 4 * v : xi, ok);
        }
      } else {
#pragma unroll
        for (int u = lane; u < kRow; u += 32) {
          const bool ok = in_rows && unsigned(a0 + u) < unsigned(a.w);
          cp_async4(d + 4 * u, ok ? src + u : xi, ok);
        }
      }
    }
    cp_async_commit();
  };

  int tile = int(blockIdx.x);
  detail::pdl_begin();
  if (tile < a.tiles) stage(tile, 0);
  __syncthreads();  // the weights and factors

  // b[ks][nt][h]: k = 8 ks + t + 4h, channel 8 nt + g. koff: where k's input lies in a buffer
  // for pixel g of the warp's m16 tiles' first row (their columns are the same: 16 (warp % 4)),
  // in bytes (k < 9C). ch: channel 8 nt + 2t + e's offset in an image of y, sc and sh its factors.
  uint32_t b[KS][2][2];
  uint32_t koff[KS][2];
  const int p0 = warp % 4 * 16;
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int k = 8 * ks + t + 4 * h;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) b[ks][nt][h] = wsm[(8 * nt + g) * kLdB + k];
      const int c = k / 9, i = k % 9 / 3, j = k % 3;
      koff[ks][h] = 4 * ((c * rpc + i) * kRow + j + phase + S * (p0 + g));
    }
  const int plane = a.ho * a.wo;
  float sc[2][2], sh[2][2];
  int ch[2][2];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int n = 8 * nt + 2 * t + e;
      sc[nt][e] = aff[n];
      sh[nt][e] = aff[16 + n];
      ch[nt][e] = n < a.k ? n * plane : -1;
    }

  detail::with_activation(a.act, [&](auto act) {
    for (int it = 0; tile < a.tiles; tile += int(gridDim.x), ++it) {
      // The next tile's copies, into the buffer the last iteration read (its closing barrier).
      const int next = tile + int(gridDim.x);
      if (next < a.tiles)
        stage(next, (it + 1) & 1);
      else
        cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();
      const Origin o = origin(tile);
      const uint32_t in = smem_addr(smem + (it & 1) * buf);
      float* const yi = a.y + int64_t(o.img) * a.ys;
      const float* const ri = a.res ? a.res + int64_t(o.img) * a.rs : nullptr;
      const int px0 = o.ox0 + p0 + g;
#pragma unroll 1
      for (int r = warp / 4; r < a.rows; r += kThreads / 32 / 4) {
        const int oy = o.oy0 + r;
        if (oy >= a.ho) break;  // the rest of this warp's rows are past the plane too
        const uint32_t at = in + 4 * r * S * kRow;
        float acc[2][4] = {};
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
          uint32_t af[4];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            // k = 8 ks + 4h + t past 9C reads 0: for none, some or all of t, known at compile
            // time but for the some.
            const int k0 = 8 * ks + 4 * h;
            const bool all = k0 + 3 < 9 * C, none = k0 >= 9 * C;
            const bool ok = all || (!none && k0 + t < 9 * C);
            af[2 * h] = ok ? lds_tf32(at + koff[ks][h]) : 0u;
            af[2 * h + 1] = ok ? lds_tf32(at + koff[ks][h] + 32 * S) : 0u;
          }
          mma_tf32(acc[0], af, b[ks][0]);
          mma_tf32(acc[1], af, b[ks][1]);
        }
        // acc[nt][e + 2 hh]: pixel p0 + g + 8 hh, channel 8 nt + 2t + e.
        const int pix = oy * a.wo + px0;
        const bool ok[2] = {px0 < a.wo, px0 + 8 < a.wo};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (ch[nt][e] < 0) continue;
            const int off = ch[nt][e] + pix;
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              if (!ok[hh]) continue;
              float v = act(fmaf(acc[nt][e + 2 * hh], sc[nt][e], sh[nt][e]));
              if (ri) v = activate(a.res_act, v + __ldg(ri + off + 8 * hh));
              yi[off + 8 * hh] = v;
            }
          }
      }
      __syncthreads();  // this buffer is read: the next iteration's copies may overwrite it
    }
  });
  cp_async_wait<0>();
}

}  // namespace

void launch_stem_mma(const ConvShape& s, const ConvTiles& t, const float* x, const float* w,
                     const float* scale, const float* shift, Act act, float* y,
                     const ConvResidual& residual, Stream stream) {
  StemMmaArgs a{};
  a.x = x;
  a.wt = w;
  a.scale = scale;
  a.shift = shift;
  a.y = y;
  a.res = residual.x, a.res_act = residual.post;
  a.h = int(s.h), a.w = int(s.w);
  a.k = int(s.k), a.ho = int(s.ho), a.wo = int(s.wo);
  a.pt = int(s.pad_t), a.pl = int(s.pad_l);
  a.rows = t.m / kCols;
  a.col_tiles = int((s.wo + kCols - 1) / kCols);
  a.row_tiles = int((s.ho + a.rows - 1) / a.rows);
  const int64_t tiles = s.n * a.row_tiles * a.col_tiles;
  if (tiles > INT32_MAX / 2)
    throw std::invalid_argument("[conv_gemm] stem grid of " + std::to_string(tiles) +
                                " tiles is too large");
  a.tiles = int(tiles);
  a.div_cols = make_fastdiv(uint32_t(a.col_tiles));
  a.div_rows = make_fastdiv(uint32_t(a.row_tiles));
  a.xs = int(s.x_image()), a.ys = int(s.y_image()), a.rs = int(s.r_image());
  a.vec_in = s.w % 4 == 0 && s.x_image() % 4 == 0 && aligned16(x);
  a.act = act;
  const int stride = int(s.stride_w), c = int(s.c);
  const size_t smem = sizeof(float) * (2 * buffer_floats(c, a.rows, stride) + extra_floats(c));
  // Per kernel: the opt-in above 48 KB (for the largest tile) and the blocks resident at once,
  // per tile height (rows 2, 4 or 8).
  struct Cache {
    std::atomic<uint64_t> opted_in{0};
    detail::ResidentCache resident{};
  };
  const auto launch = [&](auto kernel, Cache& cache) {
    detail::opt_in(cache.opted_in,
                   sizeof(float) * (2 * buffer_floats(c, kMaxRows, stride) + extra_floats(c)),
                   kernel);
    const int resident = detail::resident_blocks(
        cache.resident, __builtin_ctz(unsigned(a.rows)) - 1, kernel, kThreads, smem);
    const unsigned blocks = unsigned(a.tiles < resident ? a.tiles : resident);
    detail::launch_pdl(kernel, blocks, kThreads, smem, stream, 1, a);
  };
  const auto pick = [&](auto sc) {
    constexpr int S = decltype(sc)::value;
    static Cache cache[4];
    switch (c) {
      case 1:
        return launch(conv_stem_mma_kernel<S, 1>, cache[0]);
      case 2:
        return launch(conv_stem_mma_kernel<S, 2>, cache[1]);
      case 3:
        return launch(conv_stem_mma_kernel<S, 3>, cache[2]);
      default:
        return launch(conv_stem_mma_kernel<S, 4>, cache[3]);
    }
  };
  if (stride == 1)
    pick(std::integral_constant<int, 1>{});
  else
    pick(std::integral_constant<int, 2>{});
  check_launch("conv_gemm (stem)");
  log_launch("gemm", [&] { return "stem " + conv_tiles_str({kCols * a.rows, t.n, kGemmStemK}); });
}

}  // namespace epilog::cuda::conv_gemm_detail
