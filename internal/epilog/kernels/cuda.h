// The CUDA kernels: one launcher per op (float32, contiguous NCHW, device pointers), each
// enqueued on `stream` and checked for launch errors. This header is plain C++ so that host
// code needs no CUDA headers; the kernels live in kernels/cuda/*.cu.
#pragma once

#include <cstdint>

#include "epilog/kernels/shapes.h"

struct CUstream_st;

namespace epilog::cuda {

using Stream = CUstream_st*;

// Throws epilog::Error with the call, file and line when a CUDA call fails.
void check(int status, const char* call, const char* file, int line);
#define EPILOG_CUDA_CHECK(call) \
  ::epilog::cuda::check(static_cast<int>(call), #call, __FILE__, __LINE__)
// After a launch: reports configuration errors at once.
void check_launch(const char* kernel);

// -- fused_conv2d: y = post(act(conv(x, w) * scale[k] + shift[k]) + residual) --
// scale == nullptr means 1 and shift == nullptr means 0, so conv2d with a bias is
// (nullptr, bias, None). Each kernel's restrictions are in its file's header comment;
// conv_supports (shapes.h) says whether a kernel can run a shape at all.

// The residual (y's shape, images s.r_image() apart; null: none) and the activation applied
// after adding it (split_residual_act: the conv's own where the residual comes first, else None).
struct ConvResidual {
  const float* x;
  Act post;
  ConvResidual(const float* r = nullptr, Act after = {}) : x(r), post(after) {}  // NOLINT
};
void conv_scalar(const ConvShape& s, const float* x, const float* w, const float* scale,
                 const float* shift, Act act, float* y, Stream stream, ConvResidual residual = {});
void conv_tiled(const ConvShape& s, const ConvTiles& t, const float* x, const float* w,
                const float* scale, const float* shift, Act act, float* y, Stream stream,
                ConvResidual residual = {});
// A linear layer as a 1x1 conv over a 1x1 plane (conv_supports(Gemv)): a weight stream.
void conv_gemv(const ConvShape& s, const float* x, const float* w, const float* scale,
               const float* shift, Act act, float* y, Stream stream, ConvResidual residual = {});
// A run of x's channels read from another tensor, upsampled (nearest) as they load:
// x[img, c0 + c, i, j] = x[img, c, i / scale_h, j / scale_w] of `x` here, c < channels, its
// plane [ho / scale_h, wo / scale_w], its images `image` floats apart. The rest of x is never read
// there, so an upsampling into a concat that only the conv reads need not run.
struct ConvUpsampledInput {
  const float* x = nullptr;
  int64_t c0 = 0, channels = 0;
  int64_t scale_h = 1, scale_w = 1;
  int64_t image = 0;
};
// x[c] -> act(x[c] * scale[c] + shift[c]) on each input channel c as the conv loads it (a null
// scale is 1, a null shift 0; act relu or none): a fused_elementwise folded into its conv
// (FoldedPrologue).
struct ConvPrologue {
  const float* scale = nullptr;
  const float* shift = nullptr;
  Act act;
};
// t.wgmma (the 3x3 halo and 1x1 direct kernels on warpgroup MMA) also needs `packed`: w packed
// on the device as pack_wgmma_weights (shapes.h) lays it out for tiles t. `up`, where given,
// needs tiles and scales that take it (conv_gemm_upsample_fits: 2 across), `pro` tiles that run
// the wgmma direct kernel unsplit on a 16-byte aligned x; else it throws.
void conv_gemm(const ConvShape& s, const ConvTiles& t, const float* x, const float* w,
               const float* scale, const float* shift, Act act, float* y, Stream stream,
               ConvResidual residual = {}, const float* packed = nullptr,
               const ConvUpsampledInput* up = nullptr, const ConvPrologue* pro = nullptr);
// Two fused convs in a row as one kernel (conv_pair_fits): y = B(A(x)), A's output never
// stored. a and b are their shapes (b's input is A's output), the weights as stored. Needs what
// the wgmma kernels need (wgmma_available); else, or on other shapes, it throws.
void conv_pair(const ConvShape& a, const ConvShape& b, const float* x, const float* wa,
               const float* scale_a, const float* shift_a, Act act_a, const float* wb,
               const float* scale_b, const float* shift_b, Act act_b, float* y, Stream stream);
// A 3x3 conv and the 1x1 conv that alone reads its output as one kernel (conv_chain_fits): y =
// B(A(x)), A's output never stored; A on tiles t, b's input is A's output. `packed`: A's weights
// packed for t (pack_wgmma_weights), then B's weights, scale and shift (pack_conv_chain). Needs
// what the wgmma kernels need (wgmma_available); else, or on other shapes, it throws.
void conv_chain(const ConvShape& a, const ConvTiles& t, const ConvShape& b, const float* x,
                const float* scale_a, const float* shift_a, Act act_a, const float* packed,
                Act act_b, float* y, Stream stream);
// Whether conv_gemm can run ConvTiles::wgmma on the current device: a compute capability 9.0
// GPU, and this build has sm_90a code (EPILOG_CUDA_ARCH=90a, the default).
bool wgmma_available();

// The epilogue alone, as an elementwise pass over [outer, channels, inner]:
// y = act(x * scale[c] + shift[c]). Another library's convolution followed by this is the
// anchor of the conv bench.
void scale_shift_act(int64_t outer, int64_t channels, int64_t inner, const float* x,
                     const float* scale, const float* shift, Act act, float* y, Stream stream);

// -- elementwise --
// Inference batchnorm over axis 1 of [outer, channels, inner].
void batchnorm(int64_t outer, int64_t channels, int64_t inner, const float* x, const float* gamma,
               const float* beta, const float* mean, const float* var, float eps, float* y,
               Stream stream);
void activation(Act act, int64_t n, const float* x, float* y, Stream stream);

// NumPy broadcasting, up to kMaxRank dims; shapes are right-aligned and padded with 1s by the
// caller to `rank` dims.
constexpr int kMaxRank = 6;
struct BroadcastShape {
  int rank;
  int64_t a[kMaxRank], b[kMaxRank], out[kMaxRank];
};
using epilog::Binary;
void binary(Binary op, const BroadcastShape& s, const float* a, const float* b, float* y,
            Stream stream);
// Equal shapes seen as [items, len], each operand's items its own stride apart (channel slabs of
// a larger batch): y[i, j] = binary_apply(op, a[i, j], b[i, j]).
void binary_items(Binary op, int64_t items, int64_t len, const float* a, int64_t a_stride,
                  const float* b, int64_t b_stride, float* y, int64_t y_stride, Stream stream);

// fused_elementwise: y = the program on every element of y, input k read at x[k] through s's
// strides (runtime/params.h chain_shape): each input read once an element, y written once.
void fused_elementwise(const ChainProgram& p, const ChainShape& s, const float* const* x, float* y,
                       Stream stream);

// -- data movement --
// One contiguous run of len floats a row, for rows o < outer: src[o * src_row + src_start + j]
// copied to dst[o * dst_row + dst_start + j], j < len. A part of concat or split along an axis
// is one: outer = the product of the dims before the axis, len = its count times inner (the
// product of the dims after it), the rows its tensors' extents along the axis times inner apart.
struct Slab {
  const float* src;
  float* dst;
  int64_t len, src_row, src_start, dst_row, dst_start;
};
constexpr int kMaxSlabs = 8;  // a launch's; copy_slabs launches again for more
// All the slabs (any number) of one outer count, in one launch where up to kMaxSlabs of them
// allow the same vector width: concat and split.
void copy_slabs(int64_t outer, const Slab* slabs, int n, Stream stream);
// channel_shuffle: x [n, C, inner], the parts concatenated on dim 1 (up to kMaxSlabs), each
// part's items part.item floats apart and y's y_item apart; channel j of group i of `groups` moves
// to j * groups + i: y[img, j * groups + i, :] = x[img, i * (C / groups) + j, :].
struct ShufflePart {
  const float* x;
  int64_t channels, item;
};
void channel_shuffle(int64_t n, int64_t inner, int64_t groups, const ShufflePart* parts, int count,
                     float* y, int64_t y_item, Stream stream);
// x_image, y_image: floats between consecutive images (c*h*w and c*ho*wo when contiguous).
void upsample_nearest(int64_t n, int64_t c, int64_t h, int64_t w, int64_t scale_h, int64_t scale_w,
                      const float* x, int64_t x_image, float* y, int64_t y_image, Stream stream);

// -- layout (transpose, slice, pad, resize); y contiguous, x and y must not overlap --
// A view of x of `rank` dims: element i_0, ..., i_r at x[offset + sum_d i_d * stride[d]].
struct StridedView {
  int rank;
  int64_t size[kMaxRank], stride[kMaxRank];
  int64_t offset;
};
// y[i] = the view's element i (y has the view's shape): transpose and slice.
void gather(const StridedView& v, const float* x, float* y, Stream stream);
// x of `rank` dims in[], y of out[]: begin[d] padded before dim d (PadMode as the CPU's).
struct PadShape {
  int rank;
  int64_t in[kMaxRank], out[kMaxRank], begin[kMaxRank];
};
void pad(const PadShape& s, PadMode mode, float value, const float* x, float* y, Stream stream);
// `planes` planes of h x w resized to ho x wo (shapes.h resize_source and its kin).
void resize(int64_t planes, int64_t h, int64_t w, int64_t ho, int64_t wo, const ResizeMode& mode,
            const float* x, float* y, Stream stream);

// -- reductions and normalization --
// y[o] = op over the reduced dims of x, o running over the kept dims (both as sizes and x's
// element strides, outermost first; y contiguous over the kept dims).
struct ReduceShape {
  int kept_rank, reduced_rank;
  int64_t kept[kMaxRank], kept_stride[kMaxRank];
  int64_t reduced[kMaxRank], reduced_stride[kMaxRank];
};
void reduce(Reduce op, const ReduceShape& s, const float* x, float* y, Stream stream);
// Softmax over the middle dim of x viewed as [outer, n, inner]; log: log_softmax.
void softmax(int64_t outer, int64_t n, int64_t inner, const float* x, float* y, Stream stream,
             bool log = false);
// Rows of x [rows, len] normalized (mean 0, biased variance + eps to 1), then * scale + bias:
// per element of a row (layer_norm: groups == 0), or per channel c = (row % groups) *
// (len / inner) + j / inner for element j of a row (group_norm, instance_norm: rows are
// (image, group), inner the positions of a channel). bias may be null. For layer_norm, inner > 1
// makes the rows the columns of x as [rows / inner, len, inner] instead (dims after the
// normalized ones: ConvNeXt's LayerNorm over the channels of NCHW).
struct RowNorm {
  int64_t rows, len;
  int64_t groups = 0, inner = 1;
  float eps;
};
void row_norm(const RowNorm& s, const float* x, const float* scale, const float* bias, float* y,
              Stream stream);

// -- conv_transpose2d, as cpu::conv_transpose2d: a thread gathers 8 output channels (of
// one group) of one output pixel from the taps its stride phase reaches, the block's weights
// staged in shared memory (contiguous tensors, bias may be null; kernels/cuda/conv_transpose.cu
// states the grid and its limits) --
void conv_transpose2d(const ConvShape& s, const float* x, const float* w, const float* bias,
                      float* y, Stream stream);

// -- depth_to_space and space_to_depth: between deep [n, c * bh * bw, h, w] and wide
// [n, c, h * bh, w * bw] (both contiguous, not overlapping), wide element (ch, h * bh + i,
// w * bw + j) being deep channel ch * bh * bw + i * bw + j (crd) or (i * bw + j) * c + ch (DCR)
// at (h, w). to_space: x deep, y wide (depth_to_space); else x wide, y deep. The wide tensor is
// [n, c, ho, wo] at rows crop_t.. and columns crop_l.. of that (0, h * bh, w * bw: all of it;
// depth_to_space's crop) --
struct DepthSpace {
  int64_t n, c, h, w, bh, bw;
  bool crd;
  int64_t ho, wo, crop_t = 0, crop_l = 0;
};
void depth_space(const DepthSpace& s, bool to_space, const float* x, float* y, Stream stream);

// -- matmul: y[b, m, n] = sum_k a[b, m, k] * b[b, k, n] over `batches` of y's batch dims (sizes
// batch[], outermost first), a's and b's matrices at element offsets sum_d i_d * a_stride[d]
// (b_stride[d]); 0 where one broadcasts. All row-major, contiguous matrices, y contiguous.
struct MatmulShape {
  int64_t m, n, k;
  int batch_rank;
  int64_t batch[kMaxRank], a_stride[kMaxRank], b_stride[kMaxRank];
};
void matmul(const MatmulShape& s, const float* a, const float* b, float* y, Stream stream);

// -- pooling --
void maxpool2d(const PoolShape& p, const float* x, float* y, Stream stream);
// `count` (1..kMaxPoolChain) max-pools of p's window in a row, each pooling the one before
// (SPPF's cascade): y[q] the q-th's output, its images y_image[q] apart. p must take the "same"
// kernel (maxpool_kernel), which then stages each plane once for all of them.
void maxpool2d_chain(const PoolShape& p, const float* x, float* const* y, const int64_t* y_image,
                     int count, Stream stream);
void avgpool2d(const PoolShape& p, const float* x, float* y, Stream stream);
// Mean over `inner` contiguous elements for each of `outer` rows.
void global_avgpool(int64_t outer, int64_t inner, const float* x, float* y, Stream stream);

// -- linear: y[m, n] = sum_k x[m, k] * w[n, k] + b[n]; b may be nullptr --
void linear(int64_t m, int64_t n, int64_t k, const float* x, const float* w, const float* b,
            float* y, Stream stream);

}  // namespace epilog::cuda
