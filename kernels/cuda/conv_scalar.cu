// fused_conv2d on the SIMT cores, one of four paths chosen per shape by conv_scalar_path
// (launch.h, which explain prints): the kernel that runs every shape, a depthwise path, a stem
// path, and the stem path's kernel on grouped convs (the only kernels for groups > 1).
//
// Math: y[n, k, oh, ow] = act(acc * scale[k] + shift[k]) (+ residual[n, k, oh, ow]) with
//   acc = sum_{c < cg, i < r, j < s} x[n, g*cg + c, oh*sh - pad_t + i*dh, ow*sw - pad_l + j*dw]
//                                     * w[k, c, i, j]
// where cg = C / groups, g = k / (K / groups), and x outside the input reads 0.
// scale == nullptr means 1, shift == nullptr means 0.
// Layout: float32, NCHW x [n, C, h, w], weight [K, cg, r, s], y [n, K, ho, wo].
// Images of x and y lie ConvShape::x_image() / y_image() floats apart (more than an image when
// x or y is a channel slab of a larger batch); within an image everything is contiguous.
//
// General path, one output element per thread.
// Grid: (K, ceil(ho*wo / 256), n) blocks of kThreads = 256 threads, channel fastest:
//   k = blockIdx.x, img = blockIdx.z, p = blockIdx.y * 256 + threadIdx.x,
//   (oh, ow) = (p / wo, p % wo)
// (y and z stride by the grid past 65535). A block is one 256-pixel run of one output plane, so
// consecutive threads step along ow (the loads and the store coalesce), the block's weights are
// one row of w (staged in shared memory and read as broadcasts), and consecutive blocks are the
// K channels over the same input pixels (they share them in L2). r = s in {1, 3, 5, 7} get
// unrolled instantiations, any other window the generic loop.
//
// Depthwise path (cg == 1, i.e. groups == C; channel multiplier m = K / C, output channel k
// reads input channel k / m). An output reads r*s inputs and r*s weights, so the layer is
// memory-bound: the path reads every input element about once from DRAM (halo rows shared by
// neighbouring tiles come from L2) and writes every output once, and the r*s overlapping reads
// of an output come from shared memory.
// Tile: th output rows x tw output columns (tw = 4 * ncg <= 4 * kDwMaxGroups) of one input
// plane (img, c), for mb of the m output channels of that plane (mb = m unless the grid needs
// more blocks). The block stages the input window of the tile in shared memory, halo and
// padding included (padding is zero-filled by the copy): input rows ih0 = oh0*sh - pad_t and
// the (th-1)*sh + (r-1)*dh that follow, columns from iw0 = ow0*sw - pad_l on, row-major with
// row stride wp floats; smem column sh4 holds input column iw0. All the tile's copies are
// cp.async, issued before the first wait (one DRAM round trip a tile), 16 bytes when w % 4 == 0
// and x is 16-byte aligned (then sh4 = iw0 mod 4 = -pad_l mod 4, so the copies are aligned),
// else 4 bytes (sh4 = 0); consecutive threads take consecutive vectors of a row, so the global
// reads coalesce and the shared stores are conflict-free.
// Per thread: items of 4 consecutive outputs along ow; item = (row, column group) of the tile,
// row-major, and a thread's items stride by the block size. For the unrolled windows an item's
// window row starts 16-byte aligned (+ sh4), so it is read as float4s (wp / 4 = ncg*sw mod 8
// puts consecutive items on consecutive 16-byte bank groups, across row ends too: no
// conflicts); the window slides in registers, the r*s weights of the channel are in registers,
// the epilogue is applied in registers, and the 4 outputs go out as one float4 store (their
// residual comes in as one float4 load) when wo % 4 == 0 and y (and the residual) are 16-byte
// aligned, else as 4 predicated scalar stores (loads).
// Grid: one-dimensional, grid-stride over blocks = n * C * mgroups * ctiles * rtiles:
//   rt = b % rtiles, ct = b / rtiles % ctiles, mg = .. % mgroups, c = .. % C, img = the rest
// (row tile fastest, so the blocks that share halo rows run together and share them in L2),
// decoded with 32-bit multiply-shift divisions: 64-bit ones cost a thread more than its outputs.
// Sizes (launch_depthwise): th aims at kDwTargetItems items a block, about kDwItemsPerThread
// items a thread (32 to 256 threads); when the grid has fewer than kDwMinBlocksPerSm blocks
// per SM (batch 1, small planes), mb and then th shrink until it does; th also shrinks until
// the window fits kDwMaxSmem.
// Instantiations: r = s in {3, 5, 7} with dil_w == 1 and stride_w in {1, 2} are unrolled, per
// sh4 (stride_h, dil_h and all padding are run-time: they only pick shared-memory rows). Any
// other window, horizontal stride or horizontal dilation takes the generic instantiation: the
// same tiles and staging, run-time loops over scalar shared-memory reads, weights read as
// broadcasts. A shape whose window for a single output row exceeds kDwMaxSmem (huge
// dilations or strides) takes the general path (conv_scalar_depthwise_fits, launch.h: explain
// says so). Planes narrower than about 16 leave lanes idle
// (a block is one plane): a multi-plane block would fill them.
//
// Stem path (conv_scalar_stem_fits: groups == 1, a dense 3x3 window, dilation 1, stride 1 or 2
// across, Cin <= 4, Cout <= 16 - an image network's first layer). An output pixel reads only
// Cin * 9 <= 36 inputs, so the general path's one output per thread would read each input once
// per output channel; here a thread item is 4 consecutive outputs along ow of one output row, all
// output channels: it reads the (4 - 1) * sw + 3 input columns under them once per window row
// and channel into registers (as two or three float4s from the 16-byte aligned column below them
// when w % 4 == 0 and x is aligned; that column's phase, (-pad_l) mod 4, is a template argument),
// the next window row's before this one's FMAs, the weights (staged in shared memory as
// [c][i][j][16], zero past Cout) as float4 broadcasts, 16 FMAs for each, and stores each
// channel's 4 outputs as one float4 (when wo % 4 == 0 and y is aligned). Grid: grid-stride along
// x over items = n * ho * ceil(wo / 4), item = (img, oh, column group), column group fastest
// (neighbour threads read neighbour columns), decoded with multiply-shift divisions; one row.
//
// Grouped path (conv_scalar_grouped_channels: 1 < groups < C, that window, at most
// kGroupedMaxCin channels a group - RegNet's and ResNeXt's 3x3s - on grids large enough). A
// group is a small dense conv, so the stem's kernel runs it: grid row blockIdx.y = (group,
// chunk) takes output channels chunk * kc of that group, kc = 16, 8 or 4 (fewer in its last
// chunk; a thread's FMAs stop at the block's last channel, in fours), reading only the group's
// input planes, its weights staged as above (dynamic shared memory, cg * 9 taps x 16). The
// general path gave one thread one output: a 7x7 plane left 207 of a block's 256 threads idle,
// and every output re-read its window.
//
// Restrictions: none on stride, padding (bottom/right padding only shows in ho/wo), dilation or
// groups. One input plane (h*w) and one output plane (ho*wo) must fit in int32. No ConvTiles
// are taken; conv_tiles describes the block for `epilog explain`: m output pixels a block (256,
// or 1024 on the stem and grouped paths), n output channels a thread (1, or up to 16 on those).
// The caller precomputes nothing: no workspace, no setup.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <cuda_runtime.h>

#include "conv_common.cuh"
#include "epilog/common.h"
#include "epilog/kernels/cuda.h"
#include "epilog/kernels/launch.h"
#include "epilog/runtime/launch_log.h"

namespace epilog::cuda {
namespace {

constexpr int kThreads = kScalarThreads;

// By value, so the kernel reads it from the parameter bank. int fields: within-plane offsets
// are int32 (checked by the launcher); plane bases are formed in int64.
struct ScalarArgs {
  const float* x;
  const float* wt;
  const float* scale;
  const float* shift;
  float* y;
  int c, h, w;    // input channels and plane
  int k, ho, wo;  // output channels and plane
  int cg, kg;     // channels per group, in and out
  int r, s;       // the window (read by the generic instantiation only)
  int sh, sw, pt, pl, dh, dw;
  int n;
  int pix_blocks;    // ceil(ho * wo / kThreads)
  int64_t xs, ys;    // elements between images of x and of y
  const float* res;  // residual (y's shape) or null
  int64_t rs;        // elements between its images
  Act act, res_act;  // res_act: after adding the residual (cuda::ConvResidual)
};

// Weights of the block's output channel staged per chunk of input channels (templated windows).
constexpr int kWeightChunk = 2048;

// Blocks an SM must hold, i.e. a register cap of 65536 / (256 * blocks), per instantiation: the
// highest occupancy at which ptxas (nvcc 13.0, sm_90) spills nothing (0: no target, the PTX gets
// no .minnctapersm). Dilated windows keep every tap's address live, so only the dilated 3x3 is
// unrolled; larger dilated windows take the generic loop.
template <int R, int S, bool kUnitDil>
constexpr int scalar_min_blocks() {
  if (R == 0) return 0;       // generic: 40 registers
  if (R * S == 1) return 8;   // 32
  if (!kUnitDil) return 4;    // 3x3 dilated: 64
  if (R * S <= 9) return 5;   // 48 (6 blocks: 40 and a spill)
  if (R * S <= 25) return 8;  // 32
  return 5;                   // 7x7: 48 (6 blocks: 40 and a spill)
}

// The block's 256 outputs at pixel block pb of plane (img, k). R = S = 0 is the generic
// window; otherwise the R x S window is unrolled, and kUnitDil says dil_w == 1 so that a window
// row is one base address plus immediate offsets. ws: the block's weight staging (templated).
template <int R, int S, bool kUnitDil>
__device__ __forceinline__ void conv_scalar_block(const ScalarArgs& a, int k, int img, int pb,
                                                  float* ws) {
  const int p = pb * kThreads + static_cast<int>(threadIdx.x);
  const int npix = a.ho * a.wo;
  const bool active = p < npix;
  const int oh = p / a.wo, ow = p - oh * a.wo;
  const int ih0 = oh * a.sh - a.pt, iw0 = ow * a.sw - a.pl;
  const int hw = a.h * a.w;
  const int g = k / a.kg;

  const float* __restrict__ xp = a.x + int64_t(img) * a.xs + int64_t(g) * a.cg * hw;
  float acc = 0.0f;

  // -- mainloop: input channels of the group, window taps unrolled --
  if constexpr (R > 0) {
    // The block shares one weight row w[k]: staged in shared memory a chunk of channels at a
    // time, so the taps read it as broadcasts at immediate offsets, with no address registers.
    constexpr int kRS = R * S;
    constexpr int kChunk = kWeightChunk / kRS;  // input channels per chunk
    static_assert(kChunk >= 1, "window larger than the weight chunk");

    // The window's rows and columns, and which of them lie inside the input: fixed for the
    // thread, so the channel loop does no bounds arithmetic, only predicated loads.
    int roff[R];
    unsigned rmask = 0, cmask = 0;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int ih = ih0 + i * a.dh;
      roff[i] = ih * a.w + iw0;
      if (active && unsigned(ih) < unsigned(a.h)) rmask |= 1u << i;
    }
#pragma unroll
    for (int j = 0; j < S; ++j) {
      const int iw = iw0 + j * (kUnitDil ? 1 : a.dw);
      if (unsigned(iw) < unsigned(a.w)) cmask |= 1u << j;
    }
    const float* __restrict__ wk = a.wt + int64_t(k) * a.cg * kRS;
    // Small windows unroll over channels too, for enough independent loads in flight.
    constexpr int kUnroll = kRS == 1 ? 8 : (kRS <= 9 ? 2 : 1);
    for (int c0 = 0; c0 < a.cg; c0 += kChunk) {
      const int nc = min(kChunk, a.cg - c0);
      __syncthreads();  // the previous chunk is consumed
      for (int e = threadIdx.x; e < nc * kRS; e += kThreads) ws[e] = __ldg(wk + c0 * kRS + e);
      __syncthreads();
#pragma unroll kUnroll
      for (int c = 0; c < nc; ++c) {
#pragma unroll
        for (int i = 0; i < R; ++i) {
#pragma unroll
          for (int j = 0; j < S; ++j) {
            const int col = j * (kUnitDil ? 1 : a.dw);
            const float v =
                (rmask >> i & 1u) && (cmask >> j & 1u) ? __ldg(xp + roff[i] + col) : 0.0f;
            acc = fmaf(v, ws[c * kRS + i * S + j], acc);
          }
        }
        xp += hw;
      }
    }
    if (!active) return;
  } else {
    if (!active) return;
    // Clip the window to the input once: taps i in [i0, i1) and j in [j0, j1) are inside.
    const int i0 = ih0 >= 0 ? 0 : (-ih0 + a.dh - 1) / a.dh;
    const int i1 = a.h - ih0 <= 0 ? 0 : min(a.r, (a.h - 1 - ih0) / a.dh + 1);
    const int j0 = iw0 >= 0 ? 0 : (-iw0 + a.dw - 1) / a.dw;
    const int j1 = a.w - iw0 <= 0 ? 0 : min(a.s, (a.w - 1 - iw0) / a.dw + 1);
    const int rs = a.r * a.s;
    const float* __restrict__ wp = a.wt + int64_t(k) * a.cg * rs;
    for (int c = 0; c < a.cg; ++c, xp += hw, wp += rs) {
      for (int i = i0; i < i1; ++i) {
        const float* __restrict__ row = xp + (ih0 + i * a.dh) * a.w + iw0;
        const float* __restrict__ wrow = wp + i * a.s;
#pragma unroll 4
        for (int j = j0; j < j1; ++j) acc = fmaf(__ldg(row + j * a.dw), __ldg(wrow + j), acc);
      }
    }
  }

  // -- batchnorm + activation epilogue --
  a.y[int64_t(img) * a.ys + int64_t(k) * npix + p] =
      detail::add_residual(detail::apply(acc, a.scale, a.shift, a.act, k), a.res,
                           int64_t(img) * a.rs + int64_t(k) * npix + p, a.res_act);
}

// Grid (K, pixel blocks, n), channel fastest. y and z stride by the grid when the launcher had
// to clip them to 65535 (planes over 16.7M pixels, batches over 65535); otherwise once each.
template <int R, int S, bool kUnitDil>
__global__ void __launch_bounds__(kThreads, (scalar_min_blocks<R, S, kUnitDil>()))
    conv_scalar_kernel(const ScalarArgs a) {
  detail::pdl_begin();
  __shared__ float ws[R > 0 ? kWeightChunk : 1];
  const int k = static_cast<int>(blockIdx.x);
  for (int img = blockIdx.z; img < a.n; img += gridDim.z)
    for (int pb = blockIdx.y; pb < a.pix_blocks; pb += gridDim.y)
      conv_scalar_block<R, S, kUnitDil>(a, k, img, pb, ws);
}

// -- depthwise path (see the header comment) --

// kDwV, kDwMaxGroups, kDwMaxSmem and the columns' geometry (dw_columns) are in launch.h: whether
// the path takes a shape (conv_scalar_depthwise_fits) depends on them.
constexpr int kDwMaxThreads = 256;
constexpr int kDwTargetItems = 256;  // items a block aims at (th = kDwTargetItems / ncg)
constexpr int kDwItemsPerThread = 4;
// Blocks per SM below which th (and mb) shrink: fewer leaves SMs with too few bytes in flight.
constexpr int kDwMinBlocksPerSm = 4;

struct DwArgs {
  const float* x;
  const float* wt;
  const float* scale;
  const float* shift;
  float* y;
  int c, h, w;  // channels (== groups) and input plane
  int m, mb;    // output channels per input channel, and per block
  int ho, wo;
  int r, s;  // the window (read by the generic instantiation only)
  int sh, sw, pt, pl, dh, dw;
  int th, tw;  // tile: output rows, output columns (tw % 4 == 0)
  int rtiles, ctiles, mgroups;
  int cols, wp;  // staged columns of a row (% 4 == 0), and the shared-memory row stride
  int sh4;       // shared-memory column of a tile's first tap iw0 (see dw_stage)
  int blocks;    // n * c * mgroups * ctiles * rtiles (< 2^31)
  FastDiv div_rt, div_ct, div_mg, div_c;  // the grid decode's divisors
  int64_t xs, ys;                         // elements between images of x and of y
  const float* res;                       // residual (y's shape) or null
  int64_t rs;                             // elements between its images
  bool vec_in;                            // 16-byte copies: w % 4 == 0, x aligned
  bool vec_out;  // float4 stores and residual loads: wo % 4 == 0, y and res aligned
  Act act, res_act;
};

// Asynchronous global -> shared copies; !valid writes zeros and reads nothing, though src must
// still be a mapped address.
__device__ __forceinline__ void dw_copy4(float* dst, const float* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void dw_copy16(float* dst, const float* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void dw_copy_wait() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// Stages rows x a.cols input elements of plane xp into sm (row stride wp): row 0 is input row
// ih0, column a.sh4 is input column iw0; outside the input writes 0. kUnit = 4 copies 16 bytes:
// then w % 4 == 0 and sh4 = iw0 mod 4, so the first staged column iw0 - sh4 and every vector
// are aligned, and a vector is wholly inside or outside the row. Element e of the flattened
// rows x units tile goes to thread e % nt, and (row, col) steps incrementally, so there is no
// division per copy.
template <int kUnit>
__device__ __forceinline__ void dw_stage(const DwArgs& a, const float* __restrict__ xp, int ih0,
                                         int iw0, int rows, float* sm) {
  const int units = a.cols / kUnit;
  const int n = rows * units;
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  int row = tid / units, col = tid - row * units;
  const int dr = nt / units, dc = nt - dr * units;
  iw0 -= a.sh4;
  for (int e = tid; e < n; e += nt) {
    const int ih = ih0 + row, iw = iw0 + col * kUnit;
    const bool in = unsigned(ih) < unsigned(a.h) && unsigned(iw) < unsigned(a.w);
    const float* src = in ? xp + ih * a.w + iw : xp;
    if constexpr (kUnit == 4)
      dw_copy16(sm + row * a.wp + col * 4, src, in);
    else
      dw_copy4(sm + row * a.wp + col, src, in);
    col += dc;
    row += dr;
    if (col >= units) col -= units, ++row;
  }
}

// Blocks of kDwMaxThreads an SM must hold, i.e. a register cap of 65536 / (256 * blocks): the
// highest occupancy at which ptxas (nvcc 13.0, sm_90) spills nothing. Blocks are usually
// smaller, so more of them fit; what counts is the bytes in flight, i.e. resident threads.
template <int R>
constexpr int dw_min_blocks() {
  if (R == 3) return 6;  // 40 registers
  if (R == 5) return 4;  // 64 (5 blocks: 48 and a spill)
  if (R == 7) return 3;  // 80
  return 5;              // generic: 48
}

// R = S = 0: generic window, horizontal stride and dilation (SW, SH4 not read). Otherwise R x S,
// stride_w == SW, dil_w == 1, a.sh4 == SH4, unrolled.
template <int R, int S, int SW, int SH4>
__global__ void __launch_bounds__(kDwMaxThreads, (dw_min_blocks<R>()))
    conv_dw_kernel(const DwArgs a) {
  detail::pdl_begin();
  extern __shared__ float4 dw_smem[];
  float* sm = reinterpret_cast<float*>(dw_smem);
  const int r = R > 0 ? R : a.r;
  const int sw = R > 0 ? SW : a.sw;
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);

  for (int b = blockIdx.x; b < a.blocks; b += gridDim.x) {
    // -- grid decode: row tile fastest, then column tile, channel group, channel, image --
    int t = fast_div(b, a.div_rt);
    const int rt = b - t * a.rtiles;
    int u = fast_div(t, a.div_ct);
    const int ct = t - u * a.ctiles;
    t = fast_div(u, a.div_mg);
    const int mg = u - t * a.mgroups;
    const int img = fast_div(t, a.div_c);
    const int ch = t - img * a.c;

    const int oh0 = rt * a.th, ow0 = ct * a.tw;
    const int th = min(a.th, a.ho - oh0), tw = min(a.tw, a.wo - ow0);
    const int ncg = (tw + kDwV - 1) / kDwV;  // item columns of this tile
    const int items = th * ncg;
    const int rows = (th - 1) * a.sh + (r - 1) * a.dh + 1;
    const int ih0 = oh0 * a.sh - a.pt, iw0 = ow0 * sw - a.pl;

    // -- stage the tile's input window, one round of copies --
    const float* __restrict__ xp = a.x + int64_t(img) * a.xs + ch * int64_t(a.h) * a.w;
    if (a.vec_in)
      dw_stage<4>(a, xp, ih0, iw0, rows, sm);
    else
      dw_stage<1>(a, xp, ih0, iw0, rows, sm);
    dw_copy_wait();
    __syncthreads();

    // -- the block's output channels of this input channel, all from the staged window --
    const int k1 = min(a.m, (mg + 1) * a.mb);
    for (int kk = mg * a.mb; kk < k1; ++kk) {
      const int k = ch * a.m + kk;
      const detail::ChannelAffine f = detail::channel_affine(a.scale, a.shift, k);
      const int64_t tile0 = (int64_t(k) * a.ho + oh0) * a.wo + ow0;
      float* __restrict__ yp = a.y + int64_t(img) * a.ys + tile0;
      const float* __restrict__ rk = a.res ? a.res + int64_t(img) * a.rs + tile0 : nullptr;

      if constexpr (R > 0) {
        constexpr int kQ = dw_row_vecs(S, SW, SH4);
        float wr[R * S];
        const float* __restrict__ wk = a.wt + int64_t(k) * (R * S);
#pragma unroll
        for (int i = 0; i < R * S; ++i) wr[i] = __ldg(wk + i);

        int ohl = tid / ncg, cg = tid - ohl * ncg;
        const int dr = nt / ncg, dc = nt - dr * ncg;
        for (int it = tid; it < items; it += nt) {
          float acc[kDwV];
#pragma unroll
          for (int o = 0; o < kDwV; ++o) acc[o] = 0.0f;
          const float* sp = sm + ohl * a.sh * a.wp + cg * (kDwV * SW);
#pragma unroll
          for (int i = 0; i < R; ++i) {
            const float4* rp = reinterpret_cast<const float4*>(sp + i * a.dh * a.wp);
            float v[kQ * 4];
#pragma unroll
            for (int q = 0; q < kQ; ++q) {
              const float4 u = rp[q];
              v[4 * q] = u.x, v[4 * q + 1] = u.y, v[4 * q + 2] = u.z, v[4 * q + 3] = u.w;
            }
#pragma unroll
            for (int o = 0; o < kDwV; ++o)
#pragma unroll
              for (int j = 0; j < S; ++j) acc[o] = fmaf(v[SH4 + o * SW + j], wr[i * S + j], acc[o]);
          }
          // -- batchnorm + activation (+ residual) epilogue, 4 outputs --
          const int64_t off = ohl * int64_t(a.wo) + cg * kDwV;
          float* out = yp + off;
          const int nv = tw - cg * kDwV;  // outputs of the item inside the tile
#pragma unroll
          for (int o = 0; o < kDwV; ++o) acc[o] = detail::apply(acc[o], f, a.act);
          if (rk) {  // one uniform branch for the item, not one per output
            float r[kDwV] = {};
            if (a.vec_out && nv >= kDwV) {
              const float4 r4 = __ldg(reinterpret_cast<const float4*>(rk + off));
              r[0] = r4.x, r[1] = r4.y, r[2] = r4.z, r[3] = r4.w;
            } else {
#pragma unroll
              for (int o = 0; o < kDwV; ++o)
                if (o < nv) r[o] = __ldg(rk + off + o);
            }
            detail::add_residuals(acc, r, a.res_act);
          }
          if (a.vec_out && nv >= kDwV) {
            *reinterpret_cast<float4*>(out) = make_float4(acc[0], acc[1], acc[2], acc[3]);
          } else {
#pragma unroll
            for (int o = 0; o < kDwV; ++o)
              if (o < nv) out[o] = acc[o];
          }
          cg += dc;
          ohl += dr;
          if (cg >= ncg) cg -= ncg, ++ohl;
        }
      } else {
        const int s = a.s, dw = a.dw;
        const float* __restrict__ wk = a.wt + int64_t(k) * r * s;
        int ohl = tid / ncg, cg = tid - ohl * ncg;
        const int dr = nt / ncg, dc = nt - dr * ncg;
        for (int it = tid; it < items; it += nt) {
          float acc[kDwV];
#pragma unroll
          for (int o = 0; o < kDwV; ++o) acc[o] = 0.0f;
          const float* sp = sm + ohl * a.sh * a.wp + cg * kDwV * sw + a.sh4;
          for (int i = 0; i < r; ++i) {
            const float* rp = sp + i * a.dh * a.wp;
            for (int j = 0; j < s; ++j) {
              const float wv = __ldg(wk + i * s + j);
#pragma unroll
              for (int o = 0; o < kDwV; ++o) acc[o] = fmaf(rp[o * sw + j * dw], wv, acc[o]);
            }
          }
          const int64_t off = ohl * int64_t(a.wo) + cg * kDwV;
          float* out = yp + off;
          const int nv = tw - cg * kDwV;
#pragma unroll
          for (int o = 0; o < kDwV; ++o)
            if (o < nv)
              out[o] = detail::add_residual(detail::apply(acc[o], f, a.act), rk, off + o, a.res_act);
          cg += dc;
          ohl += dr;
          if (cg >= ncg) cg -= ncg, ++ohl;
        }
      }
    }
    __syncthreads();  // the window is consumed before the next tile overwrites it
  }
}

// Multiprocessors of the current device, read once (as data.cu does).
int device_sms() {
  static const int sms = [] {
    int device = 0, n = 0;
    EPILOG_CUDA_CHECK(cudaGetDevice(&device));
    EPILOG_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return std::max(n, 1);
  }();
  return sms;
}

int64_t round_up(int64_t a, int64_t b) {
  return detail::ceil_div(a, b) * b;
}

// Tiles, staging geometry and launch of the depthwise path, on a shape
// conv_scalar_depthwise_fits takes (one tile row's staging fits kDwMaxSmem); a grid of 2^31
// blocks throws.
void launch_depthwise(const ConvShape& s, const float* x, const float* w, const float* scale,
                      const float* shift, Act act, float* y, const ConvResidual& res,
                      Stream stream) {
  DwArgs a;
  a.x = x;
  a.wt = w;
  a.scale = scale;
  a.shift = shift;
  a.y = y;
  a.c = int(s.c), a.h = int(s.h), a.w = int(s.w);
  a.m = int(s.k / s.c);
  a.ho = int(s.ho), a.wo = int(s.wo);
  a.r = int(s.r), a.s = int(s.s);
  a.sh = int(s.stride_h), a.sw = int(s.stride_w);
  a.pt = int(s.pad_t), a.pl = int(s.pad_l);
  a.dh = int(s.dil_h), a.dw = int(s.dil_w);
  a.xs = s.x_image(), a.ys = s.y_image();
  a.res = res.x, a.rs = s.r_image();
  a.act = act, a.res_act = res.post;

  a.vec_in = s.w % 4 == 0 && detail::aligned16(x);
  // float4 stores, and residual loads: the residual's image stride is a multiple of the plane.
  a.vec_out = s.wo % 4 == 0 && detail::aligned16(y) && (!res.x || detail::aligned16(res.x));

  // Columns: ncg items of 4 outputs across a tile row, column tiles balanced; the staged columns
  // (every tap of the tile's outputs, every float4 the unrolled reads touch), rows wp apart.
  const DwColumns d = dw_columns(s, a.vec_in);
  const bool unit = d.unit;  // an unrolled instantiation
  const int64_t ncg = d.ncg, wp = d.wp;
  a.sh4 = d.sh4;
  a.ctiles = int(d.ctiles);
  a.tw = int(d.tw);
  a.cols = int(d.cols), a.wp = int(d.wp);

  // Rows: about kDwTargetItems items a block; then fill the GPU (channel groups first, since
  // splitting them adds no halo), then fit the shared memory.
  const auto staged_rows = [&](int64_t th) { return dw_staged_rows(s, th); };
  int64_t th = std::clamp<int64_t>(detail::ceil_div(kDwTargetItems, ncg), 1, s.ho);
  int64_t rtiles = 0, mb = a.m, mgroups = 0;
  const auto balance = [&] {
    rtiles = detail::ceil_div(s.ho, th);
    th = detail::ceil_div(s.ho, rtiles);
    mgroups = detail::ceil_div(a.m, mb);
    mb = detail::ceil_div(a.m, mgroups);
  };
  balance();
  const int64_t min_blocks = int64_t(kDwMinBlocksPerSm) * device_sms();
  const auto blocks = [&] { return s.n * s.c * mgroups * a.ctiles * rtiles; };
  while (blocks() < min_blocks && mb > 1) mb = detail::ceil_div(mb, 2), balance();
  while (blocks() < min_blocks && th > 1) th = detail::ceil_div(th, 2), balance();
  while (staged_rows(th) * wp * 4 > kDwMaxSmem && th > 1) th = detail::ceil_div(th, 2), balance();
  const int64_t smem = staged_rows(th) * wp * 4;
  if (smem > kDwMaxSmem || blocks() > INT_MAX)
    throw std::invalid_argument("[conv_scalar] the depthwise path cannot stage " +
                                std::to_string(smem) + " bytes in " + std::to_string(blocks()) +
                                " blocks");
  a.th = int(th), a.rtiles = int(rtiles), a.mb = int(mb), a.mgroups = int(mgroups);
  a.blocks = int(blocks());
  a.div_rt = make_fastdiv(uint32_t(rtiles));
  a.div_ct = make_fastdiv(uint32_t(a.ctiles));
  a.div_mg = make_fastdiv(uint32_t(mgroups));
  a.div_c = make_fastdiv(uint32_t(a.c));

  const int64_t items = th * ncg;
  const int threads = int(std::clamp<int64_t>(
      round_up(detail::ceil_div(items, kDwItemsPerThread), 32), 32, kDwMaxThreads));
  const unsigned grid = static_cast<unsigned>(a.blocks);
  const auto launch = [&](auto kernel) {
    detail::launch_pdl(kernel, grid, threads, static_cast<size_t>(smem), stream, 1, a);
  };
  // The unrolled window, its horizontal stride, then sh4.
  const auto launch_sh4 = [&](auto rr, auto ss) {
    constexpr int R = decltype(rr)::value, SW = decltype(ss)::value;
    switch (a.sh4) {
      case 0:
        return launch(conv_dw_kernel<R, R, SW, 0>);
      case 1:
        return launch(conv_dw_kernel<R, R, SW, 1>);
      case 2:
        return launch(conv_dw_kernel<R, R, SW, 2>);
      default:
        return launch(conv_dw_kernel<R, R, SW, 3>);
    }
  };
  const auto launch_sw = [&](auto rr) {
    if (s.stride_w == 1)
      launch_sh4(rr, std::integral_constant<int, 1>{});
    else
      launch_sh4(rr, std::integral_constant<int, 2>{});
  };
  if (unit && s.r == 3)
    launch_sw(std::integral_constant<int, 3>{});
  else if (unit && s.r == 5)
    launch_sw(std::integral_constant<int, 5>{});
  else if (unit && s.r == 7)
    launch_sw(std::integral_constant<int, 7>{});
  else
    launch(conv_dw_kernel<0, 0, 0, 0>);
  check_launch("conv_scalar (depthwise)");
  log_launch("scalar", [&] { return scalar_launch_str(ScalarPath::Depthwise, s); });
}

// -- stem path (see the header comment) --

constexpr int kStemK = kStemMaxCout;      // output channels a thread item holds
constexpr int kStemV = kStemItemOutputs;  // consecutive outputs along ow a thread item computes

struct StemArgs {
  const float* x;
  const float* wt;
  const float* scale;
  const float* shift;
  float* y;
  const float* res;  // residual (y's shape) or null
  int cg, kg;        // input and output channels a group (the stem: C and K)
  int kc;            // output channels a block, a multiple of 4 up to kStemK
  int kchunks;       // ceil(kg / kc): blockIdx.y = group * kchunks + chunk
  int h, w, ho, wo;
  int sh, pt, pl;
  int cgroups;  // ceil(wo / 4)
  int items;    // n * ho * cgroups (< 2^31), one group's
  FastDiv div_cg, div_ho;
  int64_t xs, ys, rs;  // elements between images of x, y and the residual
  bool vec_out;        // float4 stores and residual loads: wo % 4 == 0, y and res aligned
  Act act, res_act;
};

// The block's output channels k0 + [0, nk) of group g: blockIdx.y = g * kchunks + chunk. Its
// weights, [cg * 9 taps][kStemK], zero past nk, are the dynamic shared memory.
template <int SW, bool VecIn, int SH4>
__global__ void __launch_bounds__(kThreads, 2) conv_stem_kernel(const StemArgs a) {
  extern __shared__ __align__(16) float ws[];
  __shared__ float affine[2 * kStemK];
  const int g = blockIdx.y / a.kchunks, chunk = blockIdx.y - g * a.kchunks;
  const int k0 = g * a.kg + chunk * a.kc, nk = min(a.kc, a.kg - chunk * a.kc);
  const int taps = a.cg * 9;
  // The weights and factors are no output of the kernel before this one: staged before
  // waiting for it (programmatic dependent launch).
  for (int e = threadIdx.x; e < taps * kStemK; e += kThreads) {
    const int k = e % kStemK, tap = e / kStemK;  // tap = (c * 3 + i) * 3 + j
    ws[e] = k < nk ? __ldg(a.wt + (k0 + k) * taps + tap) : 0.0f;
  }
  if (threadIdx.x < kStemK) {
    const int k = threadIdx.x;
    const detail::ChannelAffine f = k < nk ? detail::channel_affine(a.scale, a.shift, k0 + k)
                                           : detail::ChannelAffine{1.0f, 0.0f};
    affine[k] = f.scale;
    affine[kStemK + k] = f.shift;
  }
  detail::pdl_begin();
  __syncthreads();

  // Input columns under an item per window row: from iw0 on, or (VecIn) from the aligned
  // column SH4 below iw0, whole float4s.
  constexpr int kIn = (kStemV - 1) * SW + 3;
  constexpr int kVecs = (SH4 + kIn + 3) / 4;
  const int hw = a.h * a.w, npix = a.ho * a.wo, rows = a.cg * 3;
  for (int item = blockIdx.x * kThreads + threadIdx.x; item < a.items;
       item += gridDim.x * kThreads) {
    const int q = fast_div(item, a.div_cg), cgp = item - q * a.cgroups;
    const int img = fast_div(q, a.div_ho), oh = q - img * a.ho;
    const int ow0 = cgp * kStemV, ih0 = oh * a.sh - a.pt, iw0 = ow0 * SW - a.pl - SH4;
    const float* __restrict__ xp = a.x + int64_t(img) * a.xs + int64_t(g) * a.cg * hw;
    // Window row r = c * 3 + i; rows past the last or outside the image read as zeros.
    const auto load_row = [&](int r, float(&in)[kIn]) {
      const int c = r / 3, ih = ih0 + r - 3 * c;
      const bool ok = r < rows && unsigned(ih) < unsigned(a.h);
      const float* __restrict__ row = xp + (c * hw + ih * a.w);
      if constexpr (VecIn) {
        // w % 4 == 0: a float4 lies wholly inside the row or wholly outside it.
        float raw[4 * kVecs];
#pragma unroll
        for (int u = 0; u < kVecs; ++u) {
          const int iw = iw0 + 4 * u;
          const float4 v = ok && unsigned(iw) < unsigned(a.w)
                               ? __ldg(reinterpret_cast<const float4*>(row + iw))
                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          raw[4 * u] = v.x, raw[4 * u + 1] = v.y, raw[4 * u + 2] = v.z, raw[4 * u + 3] = v.w;
        }
#pragma unroll
        for (int u = 0; u < kIn; ++u) in[u] = raw[u + SH4];
      } else {
#pragma unroll
        for (int u = 0; u < kIn; ++u)
          in[u] = ok && unsigned(iw0 + u) < unsigned(a.w) ? __ldg(row + iw0 + u) : 0.0f;
      }
    };
    // A row's loads are issued before the previous row's FMAs: Nsight Compute put a third of
    // the stall samples on the first use of each row's loads when they were issued together.
    // A/B (us, 3 -> 16 channels at 640x640, stride 2): batch 16 85.5 -> 77.2, batch 4 26.6 ->
    // 23.9; the YOLO-like model 1.250 -> 1.239 ms at batch 16.
    // The 4-byte loads of the unaligned path spill with a row ahead (8 and 48 bytes at stride 1
    // and 2), so they take a row at a time.
    float acc[kStemK][kStemV] = {};
    float in[kIn], next[VecIn ? kIn : 1];
    if constexpr (VecIn) load_row(0, in);
#pragma unroll 1
    for (int r = 0; r < rows; ++r) {
      if constexpr (VecIn) {
        load_row(r + 1, next);
      } else {
        load_row(r, in);
      }
      const float4* wv = reinterpret_cast<const float4*>(ws + r * 3 * kStemK);
#pragma unroll
      for (int j = 0; j < 3; ++j)
#pragma unroll
        for (int k4 = 0; k4 < kStemK / 4; ++k4) {
          if (4 * k4 >= nk) break;  // fewer channels a block: fewer FMAs a thread
          const float4 w4 = wv[j * kStemK / 4 + k4];
#pragma unroll
          for (int v = 0; v < kStemV; ++v) {
            const float xv = in[v * SW + j];
            acc[4 * k4][v] = fmaf(xv, w4.x, acc[4 * k4][v]);
            acc[4 * k4 + 1][v] = fmaf(xv, w4.y, acc[4 * k4 + 1][v]);
            acc[4 * k4 + 2][v] = fmaf(xv, w4.z, acc[4 * k4 + 2][v]);
            acc[4 * k4 + 3][v] = fmaf(xv, w4.w, acc[4 * k4 + 3][v]);
          }
        }
      if constexpr (VecIn) {
#pragma unroll
        for (int u = 0; u < kIn; ++u) in[u] = next[u];
      }
    }
    const int64_t yo = int64_t(img) * a.ys + int64_t(k0) * npix + int64_t(oh) * a.wo + ow0;
    const int64_t ro = int64_t(img) * a.rs + int64_t(k0) * npix + int64_t(oh) * a.wo + ow0;
    // Two epilogue copies, not four (with_activation_lean): the stem kernel's 64 outputs a thread
    // made its ten instantiations half of this file's compile. Image stems of equal strides
    // run on gemm's stem kernel, and grouped convs' relu costs a uniform switch an output.
    detail::with_activation_lean(a.act, [&](auto act) {
#pragma unroll
      for (int k = 0; k < kStemK; ++k) {
        if (k >= nk) break;
        float o[kStemV];
#pragma unroll
        for (int v = 0; v < kStemV; ++v)
          o[v] = act(fmaf(acc[k][v], affine[k], affine[kStemK + k]));
        if (a.vec_out) {
          if (a.res) {
            const float4 r4 = __ldg(reinterpret_cast<const float4*>(a.res + ro + int64_t(k) * npix));
            const float r[kStemV] = {r4.x, r4.y, r4.z, r4.w};
            detail::add_residuals(o, r, a.res_act);
          }
          *reinterpret_cast<float4*>(a.y + yo + int64_t(k) * npix) =
              make_float4(o[0], o[1], o[2], o[3]);
        } else {
#pragma unroll
          for (int v = 0; v < kStemV; ++v) {
            if (ow0 + v >= a.wo) break;
            o[v] = detail::add_residual(o[v], a.res, ro + int64_t(k) * npix + v, a.res_act);
            a.y[yo + int64_t(k) * npix + v] = o[v];
          }
        }
      }
    });
  }
}

// The stem or the grouped path (`path`), on a shape conv_scalar_stem_fits or
// conv_scalar_grouped_channels takes; past its int32 item count it throws.
void launch_stem(ScalarPath path, const ConvShape& s, const float* x, const float* w,
                 const float* scale, const float* shift, Act act, float* y,
                 const ConvResidual& residual, Stream stream) {
  const int64_t cgroups = detail::ceil_div(s.wo, kStemV), items = conv_scalar_stem_items(s);
  if (items > INT_MAX - int64_t(kThreads) * detail::max_blocks())
    throw std::invalid_argument("[conv_scalar] the stem path's " + std::to_string(items) +
                                " items exceed its 32-bit indices");
  const int64_t kg = s.k / s.groups;
  const int kc = path == ScalarPath::Stem ? kStemK : conv_scalar_grouped_channels(s);
  const int64_t kchunks = detail::ceil_div(kg, kc);
  const int64_t chunks = s.groups * kchunks;
  EPILOG_ASSERT(chunks <= 65535 && s.c / s.groups <= kGroupedMaxCin,
                "conv_scalar's stem kernel: {} groups of {} channels", s.groups, s.c / s.groups);
  StemArgs a;
  a.x = x;
  a.wt = w;
  a.scale = scale;
  a.shift = shift;
  a.y = y;
  a.res = residual.x;
  a.cg = int(s.c / s.groups), a.kg = int(kg), a.kc = kc, a.kchunks = int(kchunks);
  a.h = int(s.h), a.w = int(s.w), a.ho = int(s.ho), a.wo = int(s.wo);
  a.sh = int(s.stride_h), a.pt = int(s.pad_t), a.pl = int(s.pad_l);
  a.cgroups = int(cgroups);
  a.items = int(items);
  a.div_cg = make_fastdiv(uint32_t(cgroups));
  a.div_ho = make_fastdiv(uint32_t(s.ho));
  a.xs = s.x_image(), a.ys = s.y_image(), a.rs = s.r_image();
  // Images and planes of x, y and the residual start 16-byte aligned when their rows do.
  const bool vec_in = s.w % 4 == 0 && s.x_image() % 4 == 0 && detail::aligned16(x);
  a.vec_out = s.wo % 4 == 0 && s.y_image() % 4 == 0 && s.r_image() % 4 == 0 &&
              detail::aligned16(y) && (!residual.x || detail::aligned16(residual.x));
  a.act = act, a.res_act = residual.post;
  // One grid row per group's channel chunk, the rows together about one grid_for wave.
  const int64_t per_chunk = std::max<int64_t>(1, detail::max_blocks() / chunks);
  const dim3 grid(unsigned(std::min(detail::ceil_div(items, kThreads), per_chunk)),
                  unsigned(chunks));
  const size_t smem = sizeof(float) * size_t(a.cg) * 9 * kStemK;
  const auto launch = [&](auto kernel) {
    detail::launch_pdl(kernel, grid, kThreads, smem, stream, 1, a);
  };
  // The first tap's phase in its 16-byte group is a template argument: it sets how many float4s
  // a row takes and which of their lanes feed the taps.
  const auto pick = [&](auto sw) {
    constexpr int SW = decltype(sw)::value;
    if (!vec_in) return launch(conv_stem_kernel<SW, false, 0>);
    switch (first_tap_phase(s)) {
      case 0:
        return launch(conv_stem_kernel<SW, true, 0>);
      case 1:
        return launch(conv_stem_kernel<SW, true, 1>);
      case 2:
        return launch(conv_stem_kernel<SW, true, 2>);
      default:
        return launch(conv_stem_kernel<SW, true, 3>);
    }
  };
  if (s.stride_w == 1)
    pick(std::integral_constant<int, 1>{});
  else
    pick(std::integral_constant<int, 2>{});
  check_launch(path == ScalarPath::Stem ? "conv_scalar (stem)" : "conv_scalar (grouped)");
  log_launch("scalar", [&] { return scalar_launch_str(path, s); });
}

}  // namespace

void conv_scalar(const ConvShape& s, const float* x, const float* w, const float* scale,
                 const float* shift, Act act, float* y, Stream stream,
                 ConvResidual residual) {
  EPILOG_ASSERT(s.n > 0 && s.c > 0 && s.k > 0 && s.ho > 0 && s.wo > 0 && s.r > 0 && s.s > 0);
  EPILOG_ASSERT(s.groups > 0 && s.c % s.groups == 0 && s.k % s.groups == 0,
                "conv_scalar groups {} for {} -> {} channels", s.groups, s.c, s.k);
  EPILOG_ASSERT(s.stride_h > 0 && s.stride_w > 0 && s.dil_h > 0 && s.dil_w > 0 && s.pad_t >= 0 &&
                s.pad_l >= 0);
  EPILOG_ASSERT(s.h * s.w <= INT_MAX && s.ho * s.wo <= INT_MAX - kThreads,
                "conv_scalar planes {}x{} -> {}x{} exceed int32", s.h, s.w, s.ho, s.wo);
  EPILOG_ASSERT(x && w && y);
  EPILOG_ASSERT(s.n <= INT_MAX && s.k <= INT_MAX, "conv_scalar n {} k {}", s.n, s.k);
  // The path conv_scalar_path picks (explain prints it).
  switch (const ScalarPath path = conv_scalar_path(s, detail::aligned16(x))) {
    case ScalarPath::Stem:
    case ScalarPath::Grouped:
      return launch_stem(path, s, x, w, scale, shift, act, y, residual, stream);
    case ScalarPath::Depthwise:
      return launch_depthwise(s, x, w, scale, shift, act, y, residual, stream);
    case ScalarPath::General:
      break;
  }
  const int64_t pix_blocks = detail::ceil_div(s.ho * s.wo, kThreads);

  ScalarArgs a;
  a.x = x;
  a.wt = w;
  a.scale = scale;
  a.shift = shift;
  a.y = y;
  a.c = int(s.c), a.h = int(s.h), a.w = int(s.w);
  a.k = int(s.k), a.ho = int(s.ho), a.wo = int(s.wo);
  a.cg = int(s.c / s.groups), a.kg = int(s.k / s.groups);
  a.r = int(s.r), a.s = int(s.s);
  a.sh = int(s.stride_h), a.sw = int(s.stride_w);
  a.pt = int(s.pad_t), a.pl = int(s.pad_l);
  a.dh = int(s.dil_h), a.dw = int(s.dil_w);
  a.n = int(s.n);
  a.pix_blocks = int(pix_blocks);
  a.xs = s.x_image(), a.ys = s.y_image();
  a.res = residual.x, a.rs = s.r_image();
  a.act = act, a.res_act = residual.post;

  constexpr int64_t kMaxGridYZ = 65535;
  const dim3 grid(static_cast<unsigned>(s.k),
                  static_cast<unsigned>(std::min(pix_blocks, kMaxGridYZ)),
                  static_cast<unsigned>(std::min(s.n, kMaxGridYZ)));
  const bool unit = s.dil_w == 1;
  const auto launch = [&](auto kernel) {
    detail::launch_pdl(kernel, grid, kThreads, 0, stream, 1, a);
  };
  if (s.r == 1 && s.s == 1)
    launch(conv_scalar_kernel<1, 1, true>);
  else if (s.r == 3 && s.s == 3)
    launch(unit ? conv_scalar_kernel<3, 3, true> : conv_scalar_kernel<3, 3, false>);
  else if (s.r == 5 && s.s == 5 && unit)
    launch(conv_scalar_kernel<5, 5, true>);
  else if (s.r == 7 && s.s == 7 && unit)
    launch(conv_scalar_kernel<7, 7, true>);
  else
    launch(conv_scalar_kernel<0, 0, false>);
  check_launch("conv_scalar");
  log_launch("scalar", [&] { return scalar_launch_str(ScalarPath::General, s); });
}

}  // namespace epilog::cuda
