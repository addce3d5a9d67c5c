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

enum class Binary : uint8_t { Add, Mul };
// NumPy broadcasting; y has the broadcast shape.
void binary(Binary op, const Tensor& a, const Tensor& b, Tensor& y);

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

}  // namespace epilog::cpu
