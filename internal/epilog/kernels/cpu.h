// The CPU reference backend: every op, naive enough to be obviously right (the ground truth
// for every test) and fast enough to run the YOLO-like model in seconds. Tensors are float32,
// contiguous, on the host; outputs are allocated by the caller with the inferred shape.
#pragma once

#include <vector>

#include "epilog/kernels/shapes.h"
#include "epilog/tensor.h"

namespace epilog::cpu {

// C[m, n] = sum_k A[m, k] * B[k, n] (+ C when accumulate), row-major with leading dims.
void sgemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
           int64_t ldb, float* c, int64_t ldc, bool accumulate);

// y = act(conv(x, w) * scale[k] + shift[k]) (+ residual, of y's shape, when given); scale ==
// nullptr means 1, shift == nullptr means 0. conv2d with bias is (scale = nullptr, shift = bias,
// None); fused_conv2d passes all three, and its residual.
void conv2d(const ConvShape& cs, const float* x, const float* w, const float* scale,
            const float* shift, Act act, float* y, const float* residual = nullptr,
            bool residual_first = false);

// Inference batchnorm over axis 1: y = (x - mean) / sqrt(var + eps) * gamma + beta.
void batchnorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& mean,
               const Tensor& var, double eps, Tensor& y);

void activation(Act act, const Tensor& x, Tensor& y);

using epilog::Binary;
// NumPy broadcasting; y has the broadcast shape.
void binary(Binary op, const Tensor& a, const Tensor& b, Tensor& y);

// fused_elementwise: y = the program on every element, input k read at x[k] through s's strides
// (runtime/params.h chain_shape): one program run an output element, each step in turn.
void fused_elementwise(const ChainProgram& p, const ChainShape& s, const float* const* x, float* y);

void concat(const std::vector<const Tensor*>& xs, int64_t axis, Tensor& y);
void split(const Tensor& x, int64_t axis, std::vector<Tensor>& ys);

// Padding never wins the max; windows are clipped to the input.
void maxpool2d(const PoolShape& ps, const float* x, float* y);
// Divisor as in PyTorch/ONNX: the window clipped to the padded input (count_include_pad) or
// to the input itself.
void avgpool2d(const PoolShape& ps, const float* x, float* y);

// Mean over every axis after the first two.
void global_avgpool(const Tensor& x, Tensor& y);
void upsample_nearest(const Tensor& x, int64_t scale_h, int64_t scale_w, Tensor& y);
// y[m, n] = sum_k x[m, k] * w[n, k] + b[n]; b may be undefined.
void linear(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y);

// Transposed convolution: x [n, c, h, w], w [c, k / groups, r, s], y [n, k, ho, wo] (s as
// conv_shape gives it); y[k, oh, ow] = bias[k] + sum of x[c, ih, iw] * w[c, k, i, j] over
// oh = ih * stride_h - pad_t + i * dil_h (and ow alike). bias may be null.
void conv_transpose2d(const ConvShape& s, const float* x, const float* w, const float* bias,
                      float* y);

// -- layout: x and y contiguous, y shaped as the op's shape inference says --
// y = x viewed as y's shape with element strides `strides` from element `offset`:
// y[i_0, ..., i_r] = x[offset + sum_d i_d * strides[d]]. Transpose and slice are such views.
void gather(const Tensor& x, int64_t offset, const std::vector<int64_t>& strides, Tensor& y);
// x [N, C, ...], the parts concatenated on dim 1, with its channels in `groups` groups of
// C / groups, each channel j of group i moved to j * groups + i:
// y[n, j * groups + i, ...] = x[n, i * (C / groups) + j, ...] (ShuffleNet's channel shuffle).
// Parts and y may be strided along dim 0.
void channel_shuffle(const std::vector<const Tensor*>& parts, int64_t groups, Tensor& y);
// depth_to_space (to_space: x deep [N, C * bh * bw, H, W], y wide [N, C, H * bh, W * bw]) and
// space_to_depth (x wide, y deep): wide[n, ch, h * bh + i, w * bw + j] is deep[n, dc, h, w] with
// dc = ch * bh * bw + i * bw + j (crd) or (i * bw + j) * C + ch (DCR). The wide tensor may be a
// window of that at rows crop_t.., columns crop_l.. (depth_to_space's crop).
void depth_space(const Tensor& x, int64_t bh, int64_t bw, bool crd, bool to_space, Tensor& y,
                 int64_t crop_t = 0, int64_t crop_l = 0);
using epilog::PadMode;
// `begins`: the padding before each dim of x (y's shape gives the rest).
void pad(const Tensor& x, const std::vector<int64_t>& begins, PadMode mode, float value, Tensor& y);
// x's last two dims resized to y's (the dims before equal).
void resize(const Tensor& x, const ResizeMode& mode, Tensor& y);

// -- reductions and normalization, accumulated in double --
using epilog::Reduce;
// Over the dims where `reduced` is set; y holds the kept dims in order (any 1s, keepdims's, too).
void reduce(Reduce op, const Tensor& x, const std::vector<bool>& reduced, Tensor& y);
// log: log_softmax, x - max - log(sum e^(x - max)).
void softmax(const Tensor& x, int64_t axis, Tensor& y, bool log = false);
// x's values over the dims from `axis` to `last_axis` (both included) normalized at each index
// of the other dims, * scale + bias (bias may be undefined).
void layer_norm(const Tensor& x, int64_t axis, int64_t last_axis, const Tensor& scale,
                const Tensor& bias, double eps, Tensor& y);
// x [N, C, ...]: each group of C / groups channels normalized, * scale[c] + bias[c].
void group_norm(const Tensor& x, int64_t groups, const Tensor& scale, const Tensor& bias,
                double eps, Tensor& y);

// y[..., m, n] = sum_k a[..., m, k] * b[..., k, n], batch dims broadcast (NumPy matmul, 2-D+).
void matmul(const Tensor& a, const Tensor& b, Tensor& y);

}  // namespace epilog::cpu
