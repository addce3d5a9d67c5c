// The op table built from ops.def, attribute checking and shape inference for every op.
#include <algorithm>

#include "epilog/graph/activation.h"
#include "epilog/graph/op.h"

namespace epilog {
namespace {

// A negative axis counts from the back (axis + rank), also when `inclusive` allows axis == rank.
int64_t normalize_axis(const InferContext& ctx, int64_t axis, int rank, bool inclusive = false) {
  int64_t limit = inclusive ? rank + 1 : rank;
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= limit) ctx.fail("axis {} is out of range for rank {}", axis, rank);
  return a;
}

void expect_rank(const InferContext& ctx, size_t input, size_t rank) {
  const Shape& s = ctx.inputs[input];
  if (s.size() != rank)
    ctx.fail("input '{}' has shape {} ({} dims), expected {} dims",
             op_info(ctx.op).input_name(input), shape_str(s), s.size(), rank);
}

void expect_positive(const InferContext& ctx, const char* attr, int64_t min = 1) {
  for (int64_t v : ctx.attrs.ints(attr))
    if (v < min) ctx.fail("{} must be >= {}, got {}", attr, min, v);
}

// Output extent of a sliding window. Ceil mode follows PyTorch: the last window must start
// inside the input or its leading padding.
int64_t window_out(int64_t in, int64_t pad_begin, int64_t pad_end, int64_t extent, int64_t stride,
                   bool ceil_mode) {
  int64_t span = in + pad_begin + pad_end - extent;
  if (span < 0) return 0;
  int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad_begin) --out;
  return out;
}

std::vector<Shape> infer_conv2d(const InferContext& ctx) {
  expect_rank(ctx, 0, 4);
  expect_rank(ctx, 1, 4);
  const Shape& x = ctx.inputs[0];
  const Shape& w = ctx.inputs[1];
  int64_t groups = ctx.attrs.i("groups");
  expect_positive(ctx, "stride");
  expect_positive(ctx, "dilation");
  expect_positive(ctx, "padding", 0);
  if (groups < 1) ctx.fail("groups must be >= 1, got {}", groups);
  if (x[1] % groups != 0 || w[0] % groups != 0)
    ctx.fail("groups={} does not divide input channels {} and output channels {}", groups, x[1],
             w[0]);
  if (w[1] * groups != x[1])
    ctx.fail("input has {} channels but weight {} expects {} (groups={})", x[1], shape_str(w),
             w[1] * groups, groups);
  // fused_conv2d's fifth input is the residual, shaped as the output (checked below).
  const size_t per_channel = ctx.op == OpKind::FusedConv2d ? 4 : ctx.inputs.size();
  for (size_t i = 2; i < std::min(per_channel, ctx.inputs.size()); ++i)
    if (ctx.inputs[i] != Shape{w[0]})
      ctx.fail("input '{}' has shape {}, expected [{}] (one per output channel)",
               op_info(ctx.op).input_name(i), shape_str(ctx.inputs[i]), w[0]);
  const auto& s = ctx.attrs.ints("stride");
  const auto& p = ctx.attrs.ints("padding");
  const auto& d = ctx.attrs.ints("dilation");
  int64_t ho = window_out(x[2], p[0], p[2], d[0] * (w[2] - 1) + 1, s[0], false);
  int64_t wo = window_out(x[3], p[1], p[3], d[1] * (w[3] - 1) + 1, s[1], false);
  if (ho < 1 || wo < 1)
    ctx.fail("kernel {}x{} (dilation {}x{}) does not fit input {} with padding {},{},{},{}", w[2],
             w[3], d[0], d[1], shape_str(x), p[0], p[1], p[2], p[3]);
  const Shape y{x[0], w[0], ho, wo};
  if (ctx.inputs.size() > per_channel && ctx.inputs[per_channel] != y)
    ctx.fail("input 'residual' has shape {}, expected the output's {}",
             shape_str(ctx.inputs[per_channel]), shape_str(y));
  return {y};
}

std::vector<Shape> infer_batchnorm(const InferContext& ctx) {
  const Shape& x = ctx.inputs[0];
  if (x.size() < 2) ctx.fail("input 'x' has shape {}, expected at least 2 dims", shape_str(x));
  for (size_t i = 1; i < ctx.inputs.size(); ++i)
    if (ctx.inputs[i] != Shape{x[1]})
      ctx.fail("input '{}' has shape {}, expected [{}] (one per channel)",
               op_info(ctx.op).input_name(i), shape_str(ctx.inputs[i]), x[1]);
  if (ctx.attrs.f("eps") < 0) ctx.fail("eps must be >= 0, got {}", ctx.attrs.f("eps"));
  return {x};
}

std::vector<Shape> infer_same(const InferContext& ctx) {
  return {ctx.inputs[0]};
}

// NumPy broadcasting: shapes align at the back; each pair of dims is equal or one is 1. Every
// input in turn, against the broadcast of those before it.
std::vector<Shape> infer_broadcast(const InferContext& ctx) {
  Shape out = ctx.inputs[0];
  for (size_t k = 1; k < ctx.inputs.size(); ++k) {
    const Shape a = out, &b = ctx.inputs[k];
    out.assign(std::max(a.size(), b.size()), 1);
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
      int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
      if (da != db && da != 1 && db != 1)
        ctx.fail("shapes {} and {} do not broadcast", shape_str(a), shape_str(b));
      out[out.size() - 1 - i] = da == 1 ? db : da;
    }
  }
  return {out};
}

std::vector<Shape> infer_fused_elementwise(const InferContext& ctx) {
  if (ctx.inputs.size() > size_t(kMaxChainInputs))
    ctx.fail("{} inputs, more than the {} a kernel reads", ctx.inputs.size(), kMaxChainInputs);
  const Node node{ctx.node, ctx.op, ctx.attrs, {}, {}};
  const ChainProgram p = node_chain(node);
  std::vector<bool> read(ctx.inputs.size(), false);
  read[0] = true;
  for (int i = 0; i < p.steps; ++i) {
    const int k = p.step[i].operand;
    if (k >= int(ctx.inputs.size()))
      ctx.fail("step {} reads x{}, but there are {} inputs", i + 1, k, ctx.inputs.size());
    if (k >= 0) read[size_t(k)] = true;
  }
  for (size_t k = 0; k < read.size(); ++k)
    if (!read[k]) ctx.fail("no step reads input x{}", k);
  return infer_broadcast(ctx);
}

// The inputs concatenated on `axis` (normalized): concat's output, channel_shuffle's.
Shape concat_shape(const InferContext& ctx, int64_t axis) {
  Shape out = ctx.inputs[0];
  for (size_t i = 1; i < ctx.inputs.size(); ++i) {
    const Shape& s = ctx.inputs[i];
    bool ok = s.size() == out.size();
    for (size_t d = 0; ok && d < s.size(); ++d) ok = d == size_t(axis) || s[d] == out[d];
    if (!ok)
      ctx.fail("input {} has shape {}, which does not match {} outside axis {}", i, shape_str(s),
               shape_str(ctx.inputs[0]), axis);
    out[axis] += s[axis];
  }
  return out;
}

std::vector<Shape> infer_concat(const InferContext& ctx) {
  return {concat_shape(
      ctx, normalize_axis(ctx, ctx.attrs.i("axis"), static_cast<int>(ctx.inputs[0].size())))};
}

std::vector<Shape> infer_split(const InferContext& ctx) {
  const Shape& x = ctx.inputs[0];
  int64_t axis = normalize_axis(ctx, ctx.attrs.i("axis"), static_cast<int>(x.size()));
  const auto& sizes = ctx.attrs.ints("sizes");
  if (sizes.empty()) ctx.fail("sizes is empty");
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 1) ctx.fail("sizes must be >= 1, got {}", s);
    total += s;
  }
  if (total != x[axis])
    ctx.fail("sizes add up to {} but axis {} of {} has {}", total, axis, shape_str(x), x[axis]);
  std::vector<Shape> outs;
  for (int64_t s : sizes) {
    outs.push_back(x);
    outs.back()[axis] = s;
  }
  return outs;
}

std::vector<Shape> infer_pool2d(const InferContext& ctx) {
  expect_rank(ctx, 0, 4);
  const Shape& x = ctx.inputs[0];
  expect_positive(ctx, "kernel");
  expect_positive(ctx, "stride");
  expect_positive(ctx, "padding", 0);
  const auto& k = ctx.attrs.ints("kernel");
  const auto& s = ctx.attrs.ints("stride");
  const auto& p = ctx.attrs.ints("padding");
  for (int i = 0; i < 4; ++i)
    if (p[i] >= k[i % 2])
      ctx.fail("padding {} must be smaller than the kernel {}x{}", p[i], k[0], k[1]);
  bool ceil_mode = ctx.attrs.i("ceil_mode") != 0;
  int64_t ho = window_out(x[2], p[0], p[2], k[0], s[0], ceil_mode);
  int64_t wo = window_out(x[3], p[1], p[3], k[1], s[1], ceil_mode);
  if (ho < 1 || wo < 1) ctx.fail("kernel {}x{} does not fit input {}", k[0], k[1], shape_str(x));
  return {{x[0], x[1], ho, wo}};
}

std::vector<Shape> infer_global_avgpool(const InferContext& ctx) {
  Shape out = ctx.inputs[0];
  if (out.size() < 3) ctx.fail("input 'x' has shape {}, expected at least 3 dims", shape_str(out));
  std::fill(out.begin() + 2, out.end(), 1);
  return {out};
}

std::vector<Shape> infer_upsample(const InferContext& ctx) {
  expect_rank(ctx, 0, 4);
  expect_positive(ctx, "scale");
  Shape out = ctx.inputs[0];
  out[2] *= ctx.attrs.ints("scale")[0];
  out[3] *= ctx.attrs.ints("scale")[1];
  return {out};
}

std::vector<Shape> infer_flatten(const InferContext& ctx) {
  const Shape& x = ctx.inputs[0];
  int64_t axis = normalize_axis(ctx, ctx.attrs.i("axis"), static_cast<int>(x.size()), true);
  Shape out{1, 1};
  for (size_t d = 0; d < x.size(); ++d) out[int64_t(d) < axis ? 0 : 1] *= x[d];
  return {out};
}

std::vector<Shape> infer_linear(const InferContext& ctx) {
  expect_rank(ctx, 1, 2);
  const Shape& x = ctx.inputs[0];
  const Shape& w = ctx.inputs[1];
  if (x.size() < 2) ctx.fail("input 'x' has shape {}, expected at least 2 dims", shape_str(x));
  if (w[1] != x.back())
    ctx.fail("input has {} features but weight {} expects {}", x.back(), shape_str(w), w[1]);
  if (ctx.inputs.size() == 3 && ctx.inputs[2] != Shape{w[0]})
    ctx.fail("input 'bias' has shape {}, expected [{}]", shape_str(ctx.inputs[2]), w[0]);
  Shape y = x;
  y.back() = w[0];
  return {y};
}

std::vector<Shape> infer_transpose(const InferContext& ctx) {
  const Shape& x = ctx.inputs[0];
  Shape out;
  for (int64_t p : transpose_perm(ctx)) out.push_back(x[size_t(p)]);
  return {out};
}

// x [N, C, ...] whose C the `groups` attribute divides.
void expect_channel_groups(const InferContext& ctx, const Shape& x) {
  const int64_t groups = ctx.attrs.i("groups");
  if (groups < 1 || x[1] % groups != 0)
    ctx.fail("groups={} does not divide the {} channels of {}", groups, x[1], shape_str(x));
}

// channel_shuffle's inputs, concatenated on dim 1, are its output's shape.
std::vector<Shape> infer_channel_shuffle(const InferContext& ctx) {
  if (ctx.inputs.size() > size_t(kMaxShuffleInputs))
    ctx.fail("{} inputs, at most {}", ctx.inputs.size(), kMaxShuffleInputs);
  if (ctx.inputs[0].size() < 2)
    ctx.fail("input 'x' has shape {}, expected at least 2 dims", shape_str(ctx.inputs[0]));
  const Shape y = concat_shape(ctx, 1);
  expect_channel_groups(ctx, y);
  return {y};
}

// depth_to_space: [N, C' * bh * bw, H, W] -> [N, C', H * bh, W * bw]; space_to_depth back.
std::vector<Shape> infer_depth_to_space(const InferContext& ctx) {
  expect_rank(ctx, 0, 4);
  expect_positive(ctx, "blocksize");
  const Shape& x = ctx.inputs[0];
  const int64_t bh = ctx.attrs.ints("blocksize")[0], bw = ctx.attrs.ints("blocksize")[1];
  if (ctx.op == OpKind::DepthToSpace) {
    if (x[1] % (bh * bw) != 0)
      ctx.fail("blocksize {}x{} does not divide the {} channels of {}", bh, bw, x[1], shape_str(x));
    const auto& crop = ctx.attrs.ints("crop");
    const int64_t full[2] = {x[2] * bh, x[3] * bw};
    for (int d = 0; d < 2; ++d)  // each crop within its extent first: the sum cannot wrap
      if (std::min(crop[size_t(d)], crop[size_t(d + 2)]) < 0 ||
          std::max(crop[size_t(d)], crop[size_t(d + 2)]) >= full[d] ||
          full[d] - crop[size_t(d)] - crop[size_t(d + 2)] < 1)
        ctx.fail("crop {} of the {}x{} output of {} leaves no output or is negative",
                 fmt::join(crop, ","), full[0], full[1], shape_str(x));
    return {{x[0], x[1] / (bh * bw), full[0] - crop[0] - crop[2], full[1] - crop[1] - crop[3]}};
  }
  if (x[2] % bh != 0 || x[3] % bw != 0)
    ctx.fail("blocksize {}x{} does not divide the plane of {}", bh, bw, shape_str(x));
  return {{x[0], x[1] * bh * bw, x[2] / bh, x[3] / bw}};
}

std::vector<Shape> infer_reshape(const InferContext& ctx) {
  const Shape& x = ctx.inputs[0];
  const auto& want = ctx.attrs.ints("shape");
  Shape out;
  int64_t known = 1, infer_at = -1;
  for (size_t d = 0; d < want.size(); ++d) {
    int64_t v = want[d];
    if (v == 0) {
      if (d >= x.size())
        ctx.fail("shape {} keeps dim {} (0), but x {} has {} dims", fmt::join(want, ","), d,
                 shape_str(x), x.size());
      v = x[d];
    } else if (v == -1) {
      if (infer_at >= 0) ctx.fail("shape {} has more than one -1", fmt::join(want, ","));
      infer_at = int64_t(d);
      out.push_back(1);
      continue;
    } else if (v < 0) {
      ctx.fail("shape {} has dim {}, expected >= -1", fmt::join(want, ","), v);
    }
    known *= v;
    out.push_back(v);
  }
  const int64_t total = shape_numel(x);
  if (infer_at >= 0) {
    if (total % known != 0)
      ctx.fail("cannot reshape {} ({} elements) into {}", shape_str(x), total,
               fmt::join(want, ","));
    out[size_t(infer_at)] = total / known;
  } else if (known != total) {
    ctx.fail("cannot reshape {} ({} elements) into {} ({} elements)", shape_str(x), total,
             shape_str(out), known);
  }
  return {out};
}

std::vector<Shape> infer_slice(const InferContext& ctx) {
  return {slice_dims(ctx).out};
}

std::vector<Shape> infer_pad(const InferContext& ctx) {
  const Shape& x = ctx.inputs[0];
  const auto& pads = ctx.attrs.ints("pads");
  if (pads.size() != 2 * x.size())
    ctx.fail("pads has {} values, expected {} (begins, then ends, of each of {}'s dims)",
             pads.size(), 2 * x.size(), shape_str(x));
  const bool reflect = ctx.attrs.s("mode") == "reflect";
  Shape out = x;
  for (size_t d = 0; d < x.size(); ++d) {
    const int64_t b = pads[d], e = pads[d + x.size()];
    if (b < 0 || e < 0) ctx.fail("pads must be >= 0, got {}", fmt::join(pads, ","));
    if (reflect && (b >= x[d] || e >= x[d]))
      ctx.fail("reflect pads {} and {} of dim {} must be smaller than its size {}", b, e, d, x[d]);
    out[d] += b + e;
  }
  return {out};
}

std::vector<Shape> infer_reduce(const InferContext& ctx) {
  const Shape& x = ctx.inputs[0];
  const std::vector<bool> reduced = reduce_axes(ctx);
  const bool keep = ctx.attrs.i("keepdims") != 0;
  Shape out;
  for (size_t d = 0; d < x.size(); ++d)
    if (!reduced[d])
      out.push_back(x[d]);
    else if (keep)
      out.push_back(1);
  return {out};
}

std::vector<Shape> infer_softmax(const InferContext& ctx) {
  normalize_axis(ctx, ctx.attrs.i("axis"), static_cast<int>(ctx.inputs[0].size()));
  return {ctx.inputs[0]};
}

std::vector<Shape> infer_layer_norm(const InferContext& ctx) {
  const Shape& x = ctx.inputs[0];
  const int64_t axis = normalize_axis(ctx, ctx.attrs.i("axis"), static_cast<int>(x.size()));
  const int64_t last = normalize_axis(ctx, ctx.attrs.i("last_axis"), static_cast<int>(x.size()));
  if (last < axis) ctx.fail("last_axis {} comes before axis {} in {}", last, axis, shape_str(x));
  const Shape dims(x.begin() + axis, x.begin() + last + 1);
  for (size_t i = 1; i < ctx.inputs.size(); ++i)
    if (ctx.inputs[i] != dims)
      ctx.fail("input '{}' has shape {}, expected {} (x's dims from axis {} to {})",
               op_info(ctx.op).input_name(i), shape_str(ctx.inputs[i]), shape_str(dims), axis,
               last);
  if (ctx.attrs.f("eps") < 0) ctx.fail("eps must be >= 0, got {}", ctx.attrs.f("eps"));
  return {x};
}

// x [N, C, ...] with per-channel scale and bias, as batchnorm's parameters.
std::vector<Shape> infer_group_norm(const InferContext& ctx) {
  const Shape& x = ctx.inputs[0];
  if (ctx.op == OpKind::GroupNorm && x.size() >= 2) expect_channel_groups(ctx, x);
  return infer_batchnorm(ctx);
}

std::vector<Shape> infer_resize(const InferContext& ctx) {
  const Shape& x = ctx.inputs[0];
  const auto& sizes = ctx.attrs.ints("sizes");
  if (x.size() < 2) ctx.fail("input 'x' has shape {}, expected at least 2 dims", shape_str(x));
  if (sizes.size() != x.size())
    ctx.fail("sizes has {} values, expected {} (one per dim of {})", sizes.size(), x.size(),
             shape_str(x));
  // Dim 0 is the batch: it follows x's (a plan for another batch re-infers with these sizes).
  for (size_t d = 0; d < x.size(); ++d) {
    if (sizes[d] < 1) ctx.fail("sizes must be >= 1, got {}", fmt::join(sizes, ","));
    if (d > 0 && d + 2 < x.size() && sizes[d] != x[d])
      ctx.fail("sizes {} changes dim {} of {}: only the last two dims may be resized",
               fmt::join(sizes, ","), d, shape_str(x));
  }
  Shape out(sizes.begin(), sizes.end());
  if (x.size() > 2) out[0] = x[0];
  return {out};
}

std::vector<Shape> infer_conv_transpose2d(const InferContext& ctx) {
  expect_rank(ctx, 0, 4);
  expect_rank(ctx, 1, 4);
  const Shape& x = ctx.inputs[0];
  const Shape& w = ctx.inputs[1];
  const int64_t groups = ctx.attrs.i("groups");
  expect_positive(ctx, "stride");
  expect_positive(ctx, "dilation");
  expect_positive(ctx, "padding", 0);
  expect_positive(ctx, "output_padding", 0);
  if (groups < 1 || x[1] % groups != 0)
    ctx.fail("groups={} does not divide the {} input channels", groups, x[1]);
  if (w[0] != x[1])
    ctx.fail("input has {} channels but weight {} expects {}", x[1], shape_str(w), w[0]);
  const int64_t k = w[1] * groups;
  if (ctx.inputs.size() == 3 && ctx.inputs[2] != Shape{k})
    ctx.fail("input 'bias' has shape {}, expected [{}]", shape_str(ctx.inputs[2]), k);
  const auto& s = ctx.attrs.ints("stride");
  const auto& p = ctx.attrs.ints("padding");
  const auto& op = ctx.attrs.ints("output_padding");
  const auto& d = ctx.attrs.ints("dilation");
  Shape y{x[0], k, 0, 0};
  for (int i = 0; i < 2; ++i) {
    if (op[i] >= s[i] && op[i] >= d[i])
      ctx.fail("output_padding {} must be smaller than the stride {} or the dilation {}", op[i],
               s[i], d[i]);
    y[size_t(2 + i)] =
        (x[size_t(2 + i)] - 1) * s[i] - p[i] - p[i + 2] + d[i] * (w[size_t(2 + i)] - 1) + op[i] + 1;
    if (y[size_t(2 + i)] < 1)
      ctx.fail("padding {},{},{},{} leaves no output of {}", p[0], p[1], p[2], p[3], shape_str(x));
  }
  return {y};
}

std::vector<Shape> infer_matmul(const InferContext& ctx) {
  const Shape& a = ctx.inputs[0];
  const Shape& b = ctx.inputs[1];
  if (a.size() < 2 || b.size() < 2)
    ctx.fail("inputs have shapes {} and {}, expected at least 2 dims each", shape_str(a),
             shape_str(b));
  if (a.back() != b[b.size() - 2])
    ctx.fail("a {} has {} columns but b {} has {} rows", shape_str(a), a.back(), shape_str(b),
             b[b.size() - 2]);
  const Shape ba(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  Shape out(std::max(ba.size(), bb.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t da = i < ba.size() ? ba[ba.size() - 1 - i] : 1;
    const int64_t db = i < bb.size() ? bb[bb.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1)
      ctx.fail("batch dims of {} and {} do not broadcast", shape_str(a), shape_str(b));
    out[out.size() - 1 - i] = da == 1 ? db : da;
  }
  out.push_back(a[a.size() - 2]);
  out.push_back(b.back());
  return {out};
}

// -- building the table from ops.def --

AttrSpec attr_req(const char* name, AttrType type, int length = 0) {
  return {name, type, std::nullopt, length, {}};
}
AttrSpec attr_int(const char* name, int64_t fallback) {
  return {name, AttrType::Int, AttrValue{fallback}, 0, {}};
}
AttrSpec attr_float(const char* name, double fallback) {
  return {name, AttrType::Float, AttrValue{fallback}, 0, {}};
}
AttrSpec attr_ints(const char* name, int length, int64_t fill) {
  return {name, AttrType::Ints, AttrValue{std::vector<int64_t>(length, fill)}, length, {}};
}
template <typename... Choices>
AttrSpec attr_string(const char* name, const char* fallback, Choices... choices) {
  return {name, AttrType::String, AttrValue{std::string(fallback)}, 0, {choices...}};
}

OpInfo make_info(OpKind kind, const char* name, std::vector<std::string> inputs,
                 std::vector<AttrSpec> attrs, InferFn infer) {
  OpInfo info{kind, name, {}, 0, 0, std::move(attrs), infer};
  for (std::string in : inputs) {
    if (in.size() > 3 && in.compare(in.size() - 3, 3, "...") == 0) {
      info.inputs.push_back(in.substr(0, in.size() - 3));
      info.min_inputs += 1;
      info.max_inputs = -1;
    } else if (in.back() == '?') {
      info.inputs.push_back(in.substr(0, in.size() - 1));
      info.max_inputs += 1;
    } else {
      info.inputs.push_back(in);
      info.min_inputs += 1;
      info.max_inputs += 1;
    }
  }
  return info;
}

const std::vector<OpInfo>& table() {
#define INPUTS(...)          \
  std::vector<std::string> { \
    __VA_ARGS__              \
  }
#define ATTRS(...)        \
  std::vector<AttrSpec> { \
    __VA_ARGS__           \
  }
#define INT(name, fallback) attr_int(name, fallback)
#define FLOAT(name, fallback) attr_float(name, fallback)
#define INTS(name, length, fill) attr_ints(name, length, fill)
#define STRING(name, ...) attr_string(name, __VA_ARGS__)
#define INT_REQ(name) attr_req(name, AttrType::Int)
#define FLOAT_REQ(name) attr_req(name, AttrType::Float)
#define INTS_REQ(name, length) attr_req(name, AttrType::Ints, length)
#define STRING_REQ(name) attr_req(name, AttrType::String)
#define EPILOG_OP(kind, name, inputs, attrs, infer) \
  make_info(OpKind::kind, name, inputs, attrs, infer),
  static const std::vector<OpInfo> ops = {
#include "epilog/graph/ops.def"
  };
#undef EPILOG_OP
#undef INPUTS
#undef ATTRS
#undef INT
#undef FLOAT
#undef INTS
#undef STRING
#undef INT_REQ
#undef FLOAT_REQ
#undef INTS_REQ
#undef STRING_REQ
  return ops;
}

}  // namespace

// -- attributes read by shape inference and the backends alike --

std::vector<int64_t> transpose_perm(const InferContext& ctx) {
  const int rank = static_cast<int>(ctx.inputs[0].size());
  std::vector<int64_t> perm = ctx.attrs.ints("perm");
  if (perm.empty())
    for (int d = rank - 1; d >= 0; --d) perm.push_back(d);
  if (perm.size() != size_t(rank))
    ctx.fail("perm {} has {} values, expected {} (x {})", fmt::join(perm, ","), perm.size(), rank,
             shape_str(ctx.inputs[0]));
  std::vector<bool> seen(size_t(rank), false);
  for (int64_t& p : perm) {
    p = normalize_axis(ctx, p, rank);
    if (seen[size_t(p)])
      ctx.fail("perm {} is not a permutation", fmt::join(ctx.attrs.ints("perm"), ","));
    seen[size_t(p)] = true;
  }
  return perm;
}

SliceDims slice_dims(const InferContext& ctx) {
  const Shape& x = ctx.inputs[0];
  const auto& starts = ctx.attrs.ints("starts");
  const auto& ends = ctx.attrs.ints("ends");
  std::vector<int64_t> axes = ctx.attrs.ints("axes");
  const auto& steps = ctx.attrs.ints("steps");
  if (axes.empty())
    for (size_t d = 0; d < starts.size(); ++d) axes.push_back(int64_t(d));
  if (ends.size() != starts.size() || axes.size() != starts.size() ||
      (!steps.empty() && steps.size() != starts.size()))
    ctx.fail("starts, ends, axes and steps have {}, {}, {} and {} values, expected as many each",
             starts.size(), ends.size(), axes.size(), steps.size());
  SliceDims s{std::vector<int64_t>(x.size(), 0), std::vector<int64_t>(x.size(), 1), x};
  std::vector<bool> seen(x.size(), false);
  for (size_t i = 0; i < starts.size(); ++i) {
    const size_t d = size_t(normalize_axis(ctx, axes[i], static_cast<int>(x.size())));
    if (seen[d]) ctx.fail("axis {} is sliced twice", d);
    seen[d] = true;
    const int64_t n = x[d], step = steps.empty() ? 1 : steps[i];
    if (step == 0) ctx.fail("steps must not be 0");
    // Negative starts and ends count from the back (before clamping, as ONNX).
    int64_t b = starts[i] < 0 ? starts[i] + n : starts[i];
    int64_t e = ends[i] < 0 ? ends[i] + n : ends[i];
    int64_t count;
    if (step > 0) {
      b = std::clamp<int64_t>(b, 0, n);
      e = std::clamp<int64_t>(e, 0, n);
      count = e > b ? (e - b + step - 1) / step : 0;
    } else {
      b = std::clamp<int64_t>(b, 0, n - 1);
      e = std::clamp<int64_t>(e, -1, n - 1);
      count = b > e ? (b - e - step - 1) / -step : 0;
    }
    if (count < 1)
      ctx.fail("starts {}, ends {}, step {} leave nothing of axis {} (size {})", starts[i], ends[i],
               step, d, n);
    s.start[d] = b;
    s.step[d] = step;
    s.out[d] = count;
  }
  return s;
}

std::vector<bool> reduce_axes(const InferContext& ctx) {
  const int rank = static_cast<int>(ctx.inputs[0].size());
  const auto& axes = ctx.attrs.ints("axes");
  std::vector<bool> reduced(size_t(rank), axes.empty());
  for (int64_t a : axes) {
    const size_t d = size_t(normalize_axis(ctx, a, rank));
    if (reduced[d]) ctx.fail("axis {} is listed twice in axes {}", d, fmt::join(axes, ","));
    reduced[d] = true;
  }
  return reduced;
}

// -- Attrs --

const char* attr_type_name(AttrType type) {
  switch (type) {
    case AttrType::Int:
      return "int";
    case AttrType::Float:
      return "float";
    case AttrType::Ints:
      return "int list";
    case AttrType::String:
      return "string";
  }
  return "?";
}

const AttrValue& Attrs::get(const std::string& name) const {
  auto it = values_.find(name);
  EPILOG_ASSERT(it != values_.end(), "attribute '{}' missing", name);
  return it->second;
}
int64_t Attrs::i(const std::string& name) const {
  return std::get<int64_t>(get(name));
}
double Attrs::f(const std::string& name) const {
  return std::get<double>(get(name));
}
const std::vector<int64_t>& Attrs::ints(const std::string& name) const {
  return std::get<std::vector<int64_t>>(get(name));
}
const std::string& Attrs::s(const std::string& name) const {
  return std::get<std::string>(get(name));
}

// -- OpInfo --

const AttrSpec* OpInfo::attr(const std::string& attr_name) const {
  for (const AttrSpec& spec : attrs)
    if (spec.name == attr_name) return &spec;
  return nullptr;
}

const std::string& OpInfo::input_name(size_t i) const {
  return inputs[std::min(i, inputs.size() - 1)];
}

const OpInfo& op_info(OpKind kind) {
  static_assert(kNumOps == 58, "a new op needs a CPU kernel, a CUDA kernel and a test");
  const auto& ops = table();
  EPILOG_ASSERT(ops.size() == size_t(kNumOps));
  return ops[static_cast<size_t>(kind)];
}

const char* op_name(OpKind kind) {
  return op_info(kind).name.c_str();
}

std::optional<OpKind> parse_op(const std::string& name) {
  for (const OpInfo& info : table())
    if (info.name == name) return info.kind;
  return std::nullopt;
}

Attrs normalize_attrs(OpKind op, const std::string& node, const Attrs& given) {
  const OpInfo& info = op_info(op);
  auto bad = [&](const std::string& what) -> Error {
    return Error(fmt::format("[{}] node '{}': {}", info.name, node, what));
  };
  for (const auto& [name, value] : given.all())
    if (!info.attr(name)) {
      std::string known;
      for (const AttrSpec& spec : info.attrs) known += (known.empty() ? "" : ", ") + spec.name;
      throw bad(
          fmt::format("unknown attribute '{}' (known: {})", name, known.empty() ? "none" : known));
    }
  Attrs out;
  for (const AttrSpec& spec : info.attrs) {
    if (!given.has(spec.name)) {
      if (!spec.fallback) throw bad(fmt::format("missing required attribute '{}'", spec.name));
      out.set(spec.name, *spec.fallback);
      continue;
    }
    AttrValue v = given.all().at(spec.name);
    if (spec.type == AttrType::Float && std::holds_alternative<int64_t>(v))
      v = static_cast<double>(std::get<int64_t>(v));
    if (spec.type == AttrType::Ints && std::holds_alternative<int64_t>(v))
      v = std::vector<int64_t>(spec.length ? spec.length : 1, std::get<int64_t>(v));
    if (v.index() != static_cast<size_t>(spec.type))
      throw bad(fmt::format("attribute '{}' must be {}", spec.name, attr_type_name(spec.type)));
    if (spec.length && std::get<std::vector<int64_t>>(v).size() != size_t(spec.length))
      throw bad(fmt::format("attribute '{}' must have {} values, got {}", spec.name, spec.length,
                            std::get<std::vector<int64_t>>(v).size()));
    if (!spec.choices.empty() && std::find(spec.choices.begin(), spec.choices.end(),
                                           std::get<std::string>(v)) == spec.choices.end())
      throw bad(fmt::format("attribute '{}' is '{}', expected one of: {}", spec.name,
                            std::get<std::string>(v), fmt::join(spec.choices, ", ")));
    out.set(spec.name, std::move(v));
  }
  return out;
}

std::vector<Shape> infer_shapes(OpKind op, const std::string& node, const Attrs& attrs,
                                const std::vector<Shape>& inputs) {
  const OpInfo& info = op_info(op);
  int n = static_cast<int>(inputs.size());
  if (n < info.min_inputs || (info.max_inputs >= 0 && n > info.max_inputs)) {
    std::string expected = info.max_inputs < 0 ? fmt::format("at least {}", info.min_inputs)
                           : info.min_inputs == info.max_inputs
                               ? fmt::format("{}", info.min_inputs)
                               : fmt::format("{} to {}", info.min_inputs, info.max_inputs);
    fail("[{}] node '{}': has {} inputs, expected {} ({})", info.name, node, n, expected,
         fmt::join(info.inputs, ", "));
  }
  InferContext ctx{op, node, attrs, inputs};
  for (size_t i = 0; i < inputs.size(); ++i)
    for (int64_t d : inputs[i])
      if (d < 1)
        ctx.fail("input '{}' has shape {}: every dim must be >= 1", info.input_name(i),
                 shape_str(inputs[i]));
  return info.infer(ctx);
}

}  // namespace epilog
