// The ONNX importer's handlers of convolution, normalization, softmax, pooling and resizing:
// one function per ONNX op (the op list, and what each maps to: onnx_ops.cpp).
#ifdef EPILOG_HAVE_ONNX

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <set>

#include "epilog/graph/activation.h"
#include "onnx_ops.h"

namespace epilog::onnx_import {
namespace {

// -- handlers: convolution and normalization --

// A 1-D node's run-time tensor [N, C, L] as [N, C, 1, L] (a view), for the 2-D op; the batch
// stays free (0) for the plans of other batch sizes.
std::string as_rows(Importer& im, const std::string& x, const char* label) {
  const Shape& s = im.value_shape(x);
  const std::string y = im.fresh_value(x + ".rows");
  im.emit(OpKind::Reshape, {x}, im.attrs({{"shape", std::vector<int64_t>{0, s[1], 1, s[2]}}}),
          {y}, label);
  return y;
}

// The 2-D op's output [N, K, 1, L'] as the 1-D node's output [N, K, L'] (a view).
void from_rows(Importer& im, const std::string& y) {
  const Shape& s = im.value_shape(y);
  im.emit(OpKind::Reshape, {y}, im.attrs({{"shape", std::vector<int64_t>{0, s[1], s[3]}}}),
          {im.out(0)}, "line");
}

// Conv's and ConvTranspose's x and weight, both 4-D, and the weight's kernel_shape checked. A
// 1-D Conv (x [N, C, L], `line`) runs as 2-D on rows of one: x and its weight [K, C, k] as
// [N, C, 1, L] and [K, C, 1, k].
struct ConvOperands {
  std::string x, w;
  Shape xs, ws;
  bool line = false;
};
ConvOperands conv_operands(Importer& im) {
  im.arity(2, 3);
  ConvOperands c{im.dyn(0), "", {}, {}};
  c.xs = im.value_shape(c.x);
  c.line = c.xs.size() == 3;
  if (c.xs.size() != 4 && !c.line)
    im.unsupported("input '{}' has shape {}: epilog imports 1-D and 2-D convolutions (NCL and "
                   "NCHW inputs) only",
                   im.in_name(0), shape_str(c.xs));
  if (c.line && im.shape_in(1).size() != 3)
    im.bad("weight '{}' has shape {}, expected 3 dims", im.in_name(1), shape_str(im.shape_in(1)));
  const Const* wc = im.const_in(1);
  if (c.line && wc && wc->is_float()) {  // a constant weight stays one (fusion needs that)
    Const w = *wc;
    w.dims = {w.dims[0], w.dims[1], 1, w.dims[2]};
    c.w = im.fresh_value(im.in_name(1) + ".rows");
    im.add_weight(c.w, w);
  } else {
    c.w = im.dyn(1);
    const Shape& s = im.value_shape(c.w);
    if (c.line) {  // a weight known at run time: a view
      const std::string v = im.fresh_value(c.w + ".rows");
      const std::vector<int64_t> rows{s[0], s[1], 1, s[2]};
      im.emit(OpKind::Reshape, {c.w}, im.attrs({{"shape", rows}}), {v}, "weight_rows");
      c.w = v;
    }
  }
  c.ws = im.value_shape(c.w);
  if (c.ws.size() != 4)
    im.bad("weight '{}' has shape {}, expected 4 dims", im.in_name(1), shape_str(c.ws));
  if (auto k = im.attr_ints("kernel_shape")) {
    const std::vector<int64_t> want =
        c.line ? std::vector<int64_t>{c.ws[3]} : std::vector<int64_t>{c.ws[2], c.ws[3]};
    if (*k != want)
      im.bad_attr("kernel_shape", "is {} but the weight is {}", shape_str(*k),
                  shape_str(im.shape_in(1)));
  }
  if (c.line) {
    c.x = as_rows(im, c.x, "rows");
    c.xs = im.value_shape(c.x);
  }
  return c;
}

void op_conv(Importer& im) {
  im.allow({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"});
  const auto [x, w, xs, ws, line] = conv_operands(im);
  std::vector<int64_t> stride = spatial(im, "strides", 1, line),
                       dilation = spatial(im, "dilations", 1, line);
  int64_t group = im.attr_int("group", 1);
  if (group < 1 || group > kMaxDim) im.bad_attr("group", "{} is out of range", group);
  std::vector<int64_t> extent = {(ws[2] - 1) * dilation[0] + 1, (ws[3] - 1) * dilation[1] + 1};
  std::vector<int64_t> pad = padding(im, xs, extent, stride, line);
  std::vector<std::string> ins = {x, w};
  if (im.has_in(2)) ins.push_back(im.dyn(2));
  const std::string y = line ? im.fresh_value(im.out(0) + ".rows") : im.out(0);
  im.emit(
      OpKind::Conv2d, ins,
      im.attrs({{"stride", stride}, {"padding", pad}, {"dilation", dilation}, {"groups", group}}),
      {y});
  if (line) from_rows(im, y);
}

// ConvTranspose: padding from 'pads', 'auto_pad' or 'output_shape' (the padding that gives it,
// ONNX's rule for where the odd one goes).
void op_conv_transpose(Importer& im) {
  im.allow({"auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape",
            "pads", "strides"});
  const ConvOperands c = conv_operands(im);
  const std::string &x = c.x, &w = c.w;
  const Shape &xs = c.xs, &ws = c.ws;
  const bool line = c.line;
  const size_t dims = line ? 1 : 2;  // the spatial dims the node lists
  const std::vector<int64_t> stride = spatial(im, "strides", 1, line),
                             dilation = spatial(im, "dilations", 1, line);
  std::vector<int64_t> out_pad{0, 0};
  if (auto p = im.attr_ints("output_padding")) {
    if (p->size() != dims)
      im.bad_attr("output_padding", "has {} values, expected {}", p->size(), dims);
    std::copy(p->begin(), p->end(), out_pad.end() - std::ptrdiff_t(dims));
  }
  const int64_t group = im.attr_int("group", 1);
  if (group < 1 || group > kMaxDim) im.bad_attr("group", "{} is out of range", group);
  const std::string mode = im.attr_string("auto_pad", "NOTSET");
  auto out_shape = im.attr_ints("output_shape");
  std::vector<int64_t> pad{0, 0, 0, 0};
  if (out_shape || mode == "SAME_UPPER" || mode == "SAME_LOWER") {
    if (out_shape && out_shape->size() != dims && out_shape->size() != dims + 2)
      im.bad_attr("output_shape", "has {} values, expected {}", out_shape->size(), dims);
    for (size_t d = 2 - dims; d < 2; ++d) {
      const int64_t in = xs[2 + d];
      const int64_t want = out_shape ? (*out_shape)[out_shape->size() - 2 + d] : in * stride[d];
      int64_t total = stride[d] * (in - 1) + out_pad[d] + (ws[2 + d] - 1) * dilation[d] + 1 - want;
      // An output_shape past the natural size: the rows at the end, as output_padding.
      if (total < 0 && out_shape && out_pad[d] - total < stride[d]) {
        out_pad[d] -= total;
        total = 0;
      }
      if (total < 0)
        im.unsupported("an output of {} along axis {} needs negative padding", want,
                       line ? 2 : 2 + d);
      const bool upper = mode == "SAME_UPPER";
      pad[d] = upper ? total / 2 : total - total / 2;
      pad[d + 2] = total - pad[d];
    }
  } else if (mode == "NOTSET") {
    if (auto p = im.attr_ints("pads")) {
      if (p->size() != 2 * dims)
        im.bad_attr("pads", "has {} values, expected {}", p->size(), 2 * dims);
      for (int64_t v : *p)
        if (v < 0) im.unsupported_attr("pads", "negative padding {} is not supported", v);
      pad = line ? std::vector<int64_t>{0, (*p)[0], 0, (*p)[1]} : *p;
    }
  } else if (mode != "VALID") {
    im.bad_attr("auto_pad", "is '{}', expected NOTSET, SAME_UPPER, SAME_LOWER or VALID", mode);
  }
  std::vector<std::string> ins = {x, w};
  if (im.has_in(2)) ins.push_back(im.dyn(2));
  const std::string y = line ? im.fresh_value(im.out(0) + ".rows") : im.out(0);
  im.emit(OpKind::ConvTranspose2d, ins,
          im.attrs({{"stride", stride},
                    {"padding", pad},
                    {"output_padding", out_pad},
                    {"dilation", dilation},
                    {"groups", group}}),
          {y});
  if (line) from_rows(im, y);
}

// BatchNormalization in training mode on constants: y = (x - mean) / sqrt(var + eps) * scale + b
// with each channel's mean and (biased) variance over x's other dims, in float64. NF-Nets' and
// BiT's weight standardization spells the conv's weights so (timm's StdConv2d); the running
// statistics it would update are not outputs epilog reads.
Const batchnorm_training(const Const& x, const Const& scale, const Const& b, double eps) {
  const int64_t n = x.dims.empty() ? 1 : x.dims[0], c = x.dims.size() < 2 ? 1 : x.dims[1];
  const int64_t inner = c == 0 || n == 0 ? 0 : x.numel() / (n * c);
  Const y = x;
  for (int64_t ch = 0; ch < c; ++ch) {
    const auto each = [&](auto f) {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < inner; ++j) f(y.f[size_t((i * c + ch) * inner + j)]);
    };
    double sum = 0.0, sq = 0.0;
    each([&](float v) { sum += v; });
    const double mean = sum / double(n * inner);
    each([&](float v) { sq += (v - mean) * (v - mean); });
    const double k = double(scale.f[size_t(ch)]) / std::sqrt(sq / double(n * inner) + eps);
    each([&](float& v) { v = float((v - mean) * k + double(b.f[size_t(ch)])); });
  }
  return y;
}

void op_batchnorm(Importer& im) {
  im.allow({"epsilon", "momentum", "training_mode", "spatial", "is_test", "consumed_inputs"});
  im.arity(5, 5, 5);
  const bool training = im.attr_int("training_mode", 0) != 0;
  if (training && !im.all_const())
    im.unsupported_attr("training_mode",
                        "is 1 on a run-time input; epilog folds training-mode "
                        "BatchNormalization of constants only (weight standardization)");
  if (im.opset() < 7 && im.attr_int("is_test", 0) == 0)
    im.unsupported_attr("is_test",
                        "is 0 (training); epilog imports inference-mode "
                        "BatchNormalization");
  if (im.attr_int("spatial", 1) != 1)
    im.unsupported_attr("spatial", "is 0 (statistics per element); epilog normalizes per channel");
  for (int k = 1; k < im.n_out(); ++k)
    if (im.used_out(k))
      im.unsupported(
          "output {} ('{}') is a training statistic; epilog imports the inference "
          "form with one output",
          k, im.node().output(k));
  // ONNX stores eps as float32; its shortest decimal (1e-05, not 9.99999974738e-06) is the
  // value the exporter was given, and what dumps should show.
  const float epsilon = im.attr_float("epsilon", 1e-5f);
  if (!(epsilon >= 0 && std::isfinite(epsilon)))
    im.bad_attr("epsilon", "is {}, expected a finite number >= 0", epsilon);
  double eps = std::stod(fmt::format("{}", epsilon));
  if (training) {
    const Const &x = im.cst(0, "X"), &scale = im.cst(1, "scale"), &b = im.cst(2, "B");
    const int64_t c = x.dims.size() < 2 ? -1 : x.dims[1];
    if (!x.is_float() || !scale.is_float() || !b.is_float() || c < 0 || scale.numel() != c ||
        b.numel() != c)
      im.bad("X {}, scale {} and B {}: expected float tensors, X of rank 2 or more and the others "
             "of its {} channels",
             x.describe(), scale.describe(), b.describe(), c);
    return im.set_const(0, batchnorm_training(x, scale, b, eps));
  }
  std::vector<std::string> ins;
  for (int k = 0; k < 5; ++k) ins.push_back(im.dyn(k));
  im.emit(OpKind::BatchNorm, ins, im.attrs({{"eps", eps}}), {im.out(0)});
}

// epsilon as batchnorm reads it: the float32 attribute's shortest decimal.
double epsilon_attr(Importer& im) {
  const float epsilon = im.attr_float("epsilon", 1e-5f);
  if (!(epsilon >= 0 && std::isfinite(epsilon)))
    im.bad_attr("epsilon", "is {}, expected a finite number >= 0", epsilon);
  return std::stod(fmt::format("{}", epsilon));
}

// LayerNormalization's optional outputs, Mean and InvStdDev over the normalized dims (kept as 1s):
// reduce_mean(x), and 1 / sqrt(reduce_mean((x - mean)^2) + eps), as the op computes them.
void layer_norm_statistics(Importer& im, const std::string& x, int64_t axis) {
  std::vector<int64_t> axes;
  for (int64_t d = axis; d < int64_t(im.value_shape(x).size()); ++d) axes.push_back(d);
  const Attrs mean_attrs = im.attrs({{"axes", axes}, {"keepdims", int64_t(1)}});
  const std::string base = im.node().output(0);
  const auto value = [&](int k, const char* what) {
    return im.used_out(k) ? im.out(k) : im.fresh_value(base + "." + what);
  };
  const std::string mean = value(1, "mean");
  im.emit(OpKind::ReduceMean, {x}, mean_attrs, {mean}, "mean");
  if (!im.used_out(2)) return;
  const std::string d = im.fresh_value(base + ".centered"), sq = im.fresh_value(base + ".sq");
  const std::string var = im.fresh_value(base + ".var"), std = im.fresh_value(base + ".std");
  const std::string shifted = im.fresh_value(base + ".var_eps");
  im.emit(OpKind::Sub, {x, mean}, {}, {d}, "centered");
  im.emit(OpKind::Pow, {d}, im.attrs({{"exponent", 2.0}}), {sq}, "sq");
  im.emit(OpKind::ReduceMean, {sq}, mean_attrs, {var}, "var");
  const std::string eps = scalar_weight(im, base + ".eps", float(epsilon_attr(im)));
  im.emit(OpKind::Add, {var, eps}, {}, {shifted}, "var_eps");
  im.emit(OpKind::Sqrt, {shifted}, {}, {std}, "std");
  im.emit(OpKind::Reciprocal, {std}, {}, {im.out(2)}, "inv_std");
}

void op_layer_norm(Importer& im) {
  im.allow({"axis", "epsilon", "stash_type"});
  im.arity(2, 3, 3);
  const std::string x = im.dyn(0);
  const Shape& s = im.value_shape(x);
  const int64_t axis = axis_of(im.attr_int("axis", -1), s.size());
  const Shape tail(s.begin() + axis, s.end());
  std::vector<std::string> ins{x};
  for (int k = 1; k < 3 && im.has_in(k); ++k) {
    // Scale and bias broadcast to the normalized dims: constants are spread out at import.
    const Const* c = im.const_in(k);
    if (c && c->dims != tail && c->is_float()) {
      if (c->numel() != 1 && c->numel() != shape_numel(tail))
        im.unsupported("input '{}' {} does not broadcast to the normalized dims {}", im.in_name(k),
                       shape_str(c->dims), shape_str(tail));
      Const full = take(*c, tail, std::vector<int64_t>(size_t(shape_numel(tail)), 0));
      if (c->numel() != 1) full.f = c->f;
      const std::string w = im.fresh_value(im.in_name(k) + ".full");
      im.add_weight(w, full);
      ins.push_back(w);
    } else {
      ins.push_back(im.dyn(k));
    }
  }
  im.emit(OpKind::LayerNorm, ins, im.attrs({{"axis", axis}, {"eps", epsilon_attr(im)}}),
          {im.out(0)});
  if (im.used_out(1) || im.used_out(2)) layer_norm_statistics(im, x, axis);
}

// GroupNormalization: scale and bias per channel (opset 21) or, in opset 18, per group (each
// group's value then spread over its channels at import).
void op_group_norm(Importer& im) {
  im.allow({"epsilon", "num_groups", "stash_type"});
  im.arity(3, 3);
  const std::string x = im.dyn(0);
  const Shape& s = im.value_shape(x);
  const int64_t groups = im.attr_int_req("num_groups");
  if (s.size() < 2 || groups < 1 || s[1] % groups != 0)
    im.bad_attr("num_groups", "{} does not divide the channels of {}", groups, shape_str(s));
  std::vector<std::string> ins{x};
  for (int k = 1; k < 3; ++k) {
    const Shape ps = im.shape_in(k);
    if (ps == Shape{s[1]}) {
      ins.push_back(im.dyn(k));
      continue;
    }
    const Const* c = im.const_in(k);
    if (ps != Shape{groups} || !c || !c->is_float())
      im.unsupported(
          "input '{}' has shape {}, expected [{}] per channel or a constant [{}] per "
          "group",
          im.in_name(k), shape_str(ps), s[1], groups);
    std::vector<int64_t> at;
    for (int64_t ch = 0; ch < s[1]; ++ch) at.push_back(ch / (s[1] / groups));
    const std::string w = im.fresh_value(im.in_name(k) + ".per_channel");
    im.add_weight(w, take(*c, {s[1]}, at));
    ins.push_back(w);
  }
  im.emit(OpKind::GroupNorm, ins, im.attrs({{"groups", groups}, {"eps", epsilon_attr(im)}}),
          {im.out(0)});
}

void op_instance_norm(Importer& im) {
  im.allow({"epsilon"});
  im.arity(3, 3);
  im.emit(OpKind::InstanceNorm, {im.dyn(0), im.dyn(1), im.dyn(2)},
          im.attrs({{"eps", epsilon_attr(im)}}), {im.out(0)});
}

// LRN (AlexNet-era local response normalization): x / (bias + alpha / size * s)^beta, s the sum
// of x^2 over the `size` channels around each (zeros past the ends). The sum is an average pool
// (zeros counted) of x^2 viewed as [N, 1, C, rest]: a window of size x 1, padded floor((size -
// 1) / 2) before and ceil after; its mean is s / size.
void op_lrn(Importer& im) {
  im.allow({"alpha", "beta", "bias", "size"});
  im.arity(1, 1);
  const std::string x = im.dyn(0), y = im.out(0);
  const Shape xs = im.value_shape(x);
  if (xs.size() < 3) im.bad("input '{}' has shape {}, expected 3 dims or more", x, shape_str(xs));
  const int64_t size = im.attr_int_req("size");
  if (size < 1 || size > kMaxDim) im.bad_attr("size", "{} is out of range", size);
  const double alpha = im.attr_float("alpha", 1e-4f), beta = im.attr_float("beta", 0.75f),
               bias = im.attr_float("bias", 1.0f);
  int64_t rest = 1;
  for (size_t d = 2; d < xs.size(); ++d) rest *= xs[d];
  const auto value = [&](const char* what) { return im.fresh_value(y + "." + what); };
  const std::string sq = value("square"), rows = value("rows"), mean = value("mean");
  const std::string back = value("sum"), scaled = value("scaled"), shifted = value("shifted");
  const std::string denom = value("denominator");
  im.emit(OpKind::Pow, {x}, im.attrs({{"exponent", 2.0}}), {sq}, "square");
  im.emit(OpKind::Reshape, {sq}, im.attrs({{"shape", std::vector<int64_t>{0, 1, xs[1], rest}}}),
          {rows}, "rows");
  im.emit(OpKind::AvgPool2d, {rows},
          im.attrs({{"kernel", std::vector<int64_t>{size, 1}},
                    {"stride", std::vector<int64_t>{1, 1}},
                    {"padding", std::vector<int64_t>{(size - 1) / 2, 0, size / 2, 0}},
                    {"count_include_pad", int64_t(1)}}),
          {mean}, "window");
  std::vector<int64_t> shape(xs.begin(), xs.end());
  shape[0] = 0;
  im.emit(OpKind::Reshape, {mean}, im.attrs({{"shape", shape}}), {back}, "back");
  const std::string a = scalar_weight(im, y + ".alpha", float(alpha));
  const std::string k = scalar_weight(im, y + ".bias", float(bias));
  im.emit(OpKind::Mul, {back, a}, {}, {scaled}, "alpha");
  im.emit(OpKind::Add, {scaled, k}, {}, {shifted}, "bias");
  im.emit(OpKind::Pow, {shifted}, im.attrs({{"exponent", -beta}}), {denom}, "beta");
  im.emit(OpKind::Mul, {x, denom}, {}, {y});
}

// Softmax and LogSoftmax: over one axis from opset 13 (default -1); before, over the dims from
// `axis` on (default 1) as one, which is a reshape around a softmax over the last dim.
template <OpKind Kind>
void op_softmax(Importer& im) {
  im.allow({"axis"});
  im.arity(1, 1);
  const std::string x = im.dyn(0);
  const Shape& s = im.value_shape(x);
  const int64_t axis = axis_of(im.attr_int("axis", im.opset() < 13 ? 1 : -1), s.size());
  if (im.opset() >= 13 || axis == int64_t(s.size()) - 1)
    return im.emit(Kind, {x}, im.attrs({{"axis", axis}}), {im.out(0)});
  Shape flat{1, 1};
  for (size_t d = 0; d < s.size(); ++d) flat[int64_t(d) < axis ? 0 : 1] *= s[d];
  const std::string f = im.fresh_value(im.node().output(0) + ".flat");
  const std::string y = im.fresh_value(im.node().output(0) + "." + op_name(Kind));
  im.emit(OpKind::Reshape, {x}, im.attrs({{"shape", std::vector<int64_t>(flat)}}), {f}, "flat");
  im.emit(Kind, {f}, im.attrs({{"axis", int64_t(-1)}}), {y});
  im.emit(OpKind::Reshape, {y}, im.attrs({{"shape", std::vector<int64_t>(s)}}), {im.out(0)},
          "unflat");
}

// -- handlers: pooling and resizing --

void pool(Importer& im, bool max) {
  if (max)
    im.allow(
        {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides"});
  else
    im.allow({"auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads",
              "strides"});
  im.arity(1, 1, max ? 2 : 1);
  if (im.used_out(1))
    im.unsupported("output 1 ('{}', the indices of the maxima) is not supported",
                   im.node().output(1));
  if (im.attr_int("storage_order", 0) != 0)
    im.unsupported_attr("storage_order", "is {}; only the default row-major order (0) is supported",
                        im.attr_int("storage_order", 0));
  if (auto d = im.attr_ints("dilations"))
    if (std::any_of(d->begin(), d->end(), [](int64_t v) { return v != 1; }))
      im.unsupported_attr("dilations", "{} is not supported (only 1)", shape_str(*d));
  std::string x = im.dyn(0);
  const bool line = im.value_shape(x).size() == 3;  // 1-D: as 2-D on rows of one
  if (line) x = as_rows(im, x, "rows");
  const Shape xs = im.value_shape(x);
  if (xs.size() != 4)
    im.unsupported("input '{}' has shape {}: epilog pools 1-D and 2-D (NCL and NCHW inputs) only",
                   im.in_name(0), shape_str(xs));
  std::vector<int64_t> kernel = spatial(im, "kernel_shape", std::nullopt, line);
  std::vector<int64_t> stride = spatial(im, "strides", 1, line);
  std::vector<int64_t> pad = padding(im, xs, kernel, stride, line);
  int64_t ceil_mode = im.attr_int("ceil_mode", 0) != 0;
  // ONNX sizes a ceil_mode output as ceil((in + pads - k) / s) + 1; epilog (and PyTorch) drop
  // a last window that would start in the end padding. Where the two differ the results
  // would too.
  for (int d = 0; ceil_mode && d < 2; ++d) {
    int64_t in = xs[size_t(2 + d)], s = stride[size_t(d)];
    int64_t span = in + pad[size_t(d)] + pad[size_t(d + 2)] - kernel[size_t(d)];
    if (span < 0) break;
    int64_t onnx_out = (span + s - 1) / s + 1;
    if ((onnx_out - 1) * s >= in + pad[size_t(d)])
      im.unsupported_attr("ceil_mode",
                          "the last window would start in the end padding, where "
                          "ONNX and epilog size the output differently");
  }
  const std::string y = line ? im.fresh_value(im.out(0) + ".rows") : im.out(0);
  if (max)
    im.emit(
        OpKind::MaxPool2d, {x},
        im.attrs(
            {{"kernel", kernel}, {"stride", stride}, {"padding", pad}, {"ceil_mode", ceil_mode}}),
        {y});
  else
    im.emit(OpKind::AvgPool2d, {x},
            im.attrs({{"kernel", kernel},
                      {"stride", stride},
                      {"padding", pad},
                      {"ceil_mode", ceil_mode},
                      {"count_include_pad", int64_t(im.attr_int("count_include_pad", 0) != 0)}}),
            {y});
  if (line) from_rows(im, y);
}

void op_maxpool(Importer& im) {
  pool(im, true);
}
void op_avgpool(Importer& im) {
  pool(im, false);
}

void op_global_avgpool(Importer& im) {
  im.allow({});
  im.arity(1, 1);
  im.emit(OpKind::GlobalAvgPool, {im.dyn(0)}, {}, {im.out(0)});
}

void upsample(Importer& im, const std::string& x, const std::vector<double>& scales,
              const char* what) {
  const Shape& s = im.value_shape(x);
  if (s.size() != 4)
    im.unsupported("input '{}' has shape {}: epilog upsamples 4-D (NCHW) tensors only", x,
                   shape_str(s));
  if (scales.size() != 4) im.bad("{} has {} values, expected 4", what, scales.size());
  if (scales[0] != 1 || scales[1] != 1)
    im.unsupported("{} [{}] scale the batch or channel dim; epilog scales H and W only", what,
                   fmt::join(scales, ", "));
  std::vector<int64_t> factor;
  for (int d = 2; d < 4; ++d) {
    double v = scales[size_t(d)];
    if (!(v >= 1 && v <= kMaxDim && v == std::floor(v)))
      im.unsupported(
          "{} [{}] are not integer up-scales (epilog's nearest upsampling takes integer "
          "factors >= 1)",
          what, fmt::join(scales, ", "));
    factor.push_back(int64_t(v));
  }
  if (factor[0] == 1 && factor[1] == 1) return im.set_alias(0, x);
  im.emit(OpKind::UpsampleNearest, {x}, im.attrs({{"scale", factor}}), {im.out(0)});
}

// Resize: nearest with integer up-scales whose coordinate mode reads input floor(x / scale)
// becomes upsample_nearest (which convs take in); everything else the resize op, nearest or
// linear, in the coordinate modes PyTorch exports, to static sizes.
void op_resize(Importer& im) {
  // Opset 18 adds 'axes' (scales or sizes for these axes only), 'keep_aspect_ratio_policy' (with
  // sizes) and 'antialias' (for linear and cubic downscaling only).
  if (im.opset() < 18)
    im.allow({"coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
              "extrapolation_value", "mode", "nearest_mode"});
  else
    im.allow({"antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a",
              "exclude_outside", "extrapolation_value", "keep_aspect_ratio_policy", "mode",
              "nearest_mode"});
  im.arity(im.opset() < 11 ? 2 : 1, im.opset() < 11 ? 2 : 4);
  const std::string mode = im.attr_string("mode", "nearest");
  if (mode != "nearest" && mode != "linear")
    im.unsupported_attr("mode", "is '{}'; epilog imports nearest and linear resizing", mode);
  // Resize-10 maps coordinates like Upsample: x / scale (nearest rounded down).
  const std::string ctm = im.opset() < 11
                              ? "asymmetric"
                              : im.attr_string("coordinate_transformation_mode", "half_pixel");
  const std::string nearest =
      im.opset() < 11 ? "floor" : im.attr_string("nearest_mode", "round_prefer_floor");
  std::string x = im.dyn(0);
  const Shape& s = im.value_shape(x);
  // The axes that scales or sizes list, in their order.
  std::vector<int64_t> axes;
  if (auto a = im.attr_ints("axes")) {
    std::vector<bool> seen(s.size(), false);
    for (int64_t v : *a) {
      int64_t k = axis_of(v, s.size(), "axes value");
      if (seen[size_t(k)]) im.bad_attr("axes", "lists axis {} twice", v);
      seen[size_t(k)] = true;
      axes.push_back(k);
    }
  } else {
    for (size_t d = 0; d < s.size(); ++d) axes.push_back(int64_t(d));
  }
  // -- the scale and output size of every dim --
  std::vector<double> factors(s.size(), 1.0);
  std::vector<int64_t> sizes(s.begin(), s.end());
  bool from_scales = false;
  const int scales_at = im.opset() < 11 ? 1 : 2;
  const Const* scales = im.has_in(scales_at) ? &im.cst(scales_at, "scales") : nullptr;
  if (scales && scales->numel() == 0) scales = nullptr;
  if (im.has_in(3)) {
    if (scales) im.bad("has both scales and sizes; give one");
    std::vector<int64_t> given = im.ints_in(3, "sizes");
    if (given.size() != axes.size())
      im.bad("sizes has {} values for {} axes of the {}-D input", given.size(), axes.size(),
             s.size());
    // Sizes the exporter wrote with the batch it traced (the dynamo exporter's, on a run-time
    // tensor whose batch was rebound): the batch stays.
    if (im.batch() > 0 && im.file_batch() > 0 && !axes.empty() && axes[0] == 0 &&
        given[0] == im.file_batch() && !s.empty() && s[0] == im.batch())
      given[0] = s[0];
    // keep_aspect_ratio_policy scales every listed axis alike, by the smallest (not_larger)
    // or largest (not_smaller) ratio of sizes to the input; sizes are then rounded.
    const std::string policy = im.attr_string("keep_aspect_ratio_policy", "stretch");
    if (policy != "stretch" && policy != "not_larger" && policy != "not_smaller")
      im.bad_attr("keep_aspect_ratio_policy",
                  "is '{}', expected stretch, not_larger or not_smaller", policy);
    double f = policy == "not_larger" ? std::numeric_limits<double>::infinity() : 0.0;
    for (size_t k = 0; k < axes.size(); ++k) {
      const double ratio = double(given[k]) / double(s[size_t(axes[k])]);
      f = policy == "not_larger" ? std::min(f, ratio) : std::max(f, ratio);
    }
    for (size_t k = 0; k < axes.size(); ++k) {
      const size_t d = size_t(axes[k]);
      factors[d] = policy == "stretch" ? double(given[k]) / double(s[d]) : f;
      sizes[d] = policy == "stretch" ? given[k] : int64_t(std::round(f * double(s[d])));
    }
  } else {
    if (!scales) im.bad("has neither scales nor sizes");
    if (!scales->is_float()) im.bad("scales are {}, expected float", dtype_str(scales->dtype));
    if (scales->f.size() != axes.size())
      im.bad("scales has {} values for {} axes of the {}-D input", scales->f.size(), axes.size(),
             s.size());
    from_scales = true;
    for (size_t k = 0; k < axes.size(); ++k) {
      const size_t d = size_t(axes[k]);
      factors[d] = scales->f[k];
      if (!(factors[d] > 0 && factors[d] * double(s[d]) <= double(kMaxDim)))
        im.bad("scale {} of axis {} is out of range", factors[d], d);
      sizes[d] = int64_t(std::floor(factors[d] * double(s[d])));
    }
  }
  // -- nearest by integer factors, reading input floor(x / scale): upsample_nearest --
  // With an integer scale s, output x = q*s + r (0 <= r < s) must read input q:
  //   asymmetric: x/s = q + r/s, floored -> q.
  //   half_pixel: (x + 0.5)/s - 0.5 = q + (r + 0.5)/s - 0.5 lies strictly within q +- 0.5, so
  //   either rounding gives q (pytorch_half_pixel is the same for outputs longer than 1, and
  //   half_pixel_symmetric where the output is exactly s times the input, as here).
  //   tf_half_pixel_for_nn: (x + 0.5)/s = q + (r + 0.5)/s < q + 1, floored -> q.
  const bool rounds = nearest == "round_prefer_floor" || nearest == "round_prefer_ceil";
  const bool floors = nearest == "floor";
  const bool half_pixel =
      ctm == "half_pixel" || ctm == "pytorch_half_pixel" || ctm == "half_pixel_symmetric";
  const bool reads_floor = (ctm == "asymmetric" && floors) || (half_pixel && rounds) ||
                           (ctm == "tf_half_pixel_for_nn" && floors);
  bool integer = s.size() == 4 && factors[0] == 1 && factors[1] == 1;
  for (size_t d = 2; integer && d < 4; ++d)
    integer = factors[d] >= 1 && factors[d] == std::floor(factors[d]) &&
              sizes[d] == int64_t(factors[d]) * s[d];
  if (mode == "nearest" && reads_floor && integer) return upsample(im, x, factors, "scales");
  // -- the resize op --
  if (ctm != "half_pixel" && ctm != "pytorch_half_pixel" && ctm != "align_corners" &&
      ctm != "asymmetric")
    im.unsupported_attr("coordinate_transformation_mode",
                        "'{}' is not supported (half_pixel, pytorch_half_pixel, align_corners "
                        "and asymmetric are)",
                        ctm);
  if (mode == "nearest" && !rounds && !floors && nearest != "ceil")
    im.bad_attr("nearest_mode", "is '{}'", nearest);
  if (im.attr_int("exclude_outside", 0) != 0)
    im.unsupported_attr("exclude_outside", "is 1; only 0 is supported");
  for (size_t d = 0; d < s.size(); ++d) {
    if (sizes[d] < 1) im.unsupported("resizes axis {} of {} to nothing", d, shape_str(s));
    if (d + 2 < s.size() && sizes[d] != s[d])
      im.unsupported("resizes axis {} of {}: epilog resizes the last two axes only", d,
                     shape_str(s));
    // Given scales, every coordinate mode maps by the scale (align_corners by the scaled
    // length), which only equals sizes / input where that is whole.
    if (from_scales && sizes[d] != s[d] && double(sizes[d]) != factors[d] * double(s[d]))
      im.unsupported(
          "scale {} of axis {} (size {}) gives no whole output size; epilog resizes "
          "by sizes / input",
          factors[d], d, s[d]);
    if (mode == "linear" && im.attr_int("antialias", 0) != 0 && sizes[d] < s[d])
      im.unsupported_attr("antialias", "linear downscaling with antialias is not supported");
  }
  im.emit(
      OpKind::Resize, {x},
      im.attrs(
          {{"sizes", sizes}, {"mode", mode}, {"coordinate_mode", ctm}, {"nearest_mode", nearest}}),
      {im.out(0)});
}

void op_upsample(Importer& im) {
  if (im.opset() < 7)
    im.unsupported("Upsample before opset 7 (experimental form) is not supported");
  im.allow(im.opset() < 9 ? std::initializer_list<const char*>{"mode", "scales"}
                          : std::initializer_list<const char*>{"mode"});
  im.arity(im.opset() < 9 ? 1 : 2, im.opset() < 9 ? 1 : 2);
  const std::string mode = im.attr_string("mode", "nearest");
  if (mode != "nearest")
    im.unsupported_attr("mode", "is '{}'; epilog imports nearest-neighbour upsampling only", mode);
  std::vector<double> scales;
  if (im.opset() < 9) {
    auto s = im.attr_floats("scales");
    if (!s) im.bad("attribute 'scales' is required");
    scales.assign(s->begin(), s->end());
  } else {
    const Const& c = im.cst(1, "scales");
    if (!c.is_float()) im.bad("scales are {}, expected float", dtype_str(c.dtype));
    scales.assign(c.f.begin(), c.f.end());
  }
  upsample(im, im.dyn(0), scales, "scales");
}

}  // namespace

void add_nn_handlers(std::map<std::string, OpHandler>& table) {
  table.insert({
      {"AveragePool", op_avgpool},
      {"BatchNormalization", op_batchnorm},
      {"Conv", op_conv},
      {"ConvTranspose", op_conv_transpose},
      {"LogSoftmax", op_softmax<OpKind::LogSoftmax>},
      {"GlobalAveragePool", op_global_avgpool},
      {"GroupNormalization", op_group_norm},
      {"InstanceNormalization", op_instance_norm},
      {"LayerNormalization", op_layer_norm},
      {"LRN", op_lrn},
      {"MaxPool", op_maxpool},
      {"Resize", op_resize},
      {"Softmax", op_softmax<OpKind::Softmax>},
      {"Upsample", op_upsample},
  });
}

}  // namespace epilog::onnx_import

#endif  // EPILOG_HAVE_ONNX
