// The ONNX importer's handlers of layout (concat, split, slice, pad, reshape, transpose, ...),
// constants and shape arithmetic: one function per ONNX op (the op list, and what each maps to:
// onnx_ops.cpp).
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

// A slice's end that reaches past the front going backwards at any size of the axis (also the
// batch's, rebound later): the most negative end an attribute holds.
constexpr int64_t kBeforeFront = -kMaxDim;

// The exclusive end of a slice whose last index is `last`, stepping by `step`.
int64_t slice_end(int64_t last, int64_t step) {
  return step > 0 ? last + 1 : (last == 0 ? kBeforeFront : last - 1);
}

// -- handlers: layout --

void op_concat(Importer& im) {
  im.allow({"axis"});
  im.arity(1, INT_MAX);
  int64_t axis = im.attr_int_req("axis");
  if (im.all_const()) {
    std::vector<const Const*> xs;
    for (int k = 0; k < im.n_in(); ++k)
      if (im.has_in(k)) xs.push_back(im.const_in(k));
    return im.set_const(0, fold_concat(xs, axis));
  }
  std::vector<std::string> ins;
  for (int k = 0; k < im.n_in(); ++k) {
    if (!im.has_in(k)) continue;
    // An empty constant adds nothing (PyTorch's exports concat them in shape arithmetic).
    if (const Const* c = im.const_in(k); c && c->numel() == 0) continue;
    ins.push_back(im.dyn(k));
  }
  if (ins.size() == 1) {
    axis_of(axis, im.value_shape(ins[0]).size());
    return im.set_alias(0, ins[0]);
  }
  im.emit(OpKind::Concat, ins, im.attrs({{"axis", axis}}), {im.out(0)});
}

void op_split(Importer& im) {
  // The sizes: an attribute before opset 13, an input from then on; or, from opset 18, a
  // number of outputs of ceil(dim / n) each, the last one smaller.
  if (im.opset() < 13)
    im.allow({"axis", "split"});
  else if (im.opset() < 18)
    im.allow({"axis"});
  else
    im.allow({"axis", "num_outputs"});
  im.arity(1, im.opset() < 13 ? 1 : 2, INT_MAX);
  const Shape s = im.shape_in(0);
  const int64_t axis = axis_of(im.attr_int("axis", 0), s.size());
  const int64_t dim = s[size_t(axis)];
  std::vector<int64_t> sizes;
  if (im.opset() < 13) {
    if (auto v = im.attr_ints("split")) sizes = *v;
  } else if (im.has_in(1)) {
    if (im.has_attr("num_outputs"))
      im.bad("has both the 'split' input and 'num_outputs'; give one");
    sizes = im.ints_in(1, "split");
  }
  if (im.has_attr("num_outputs") && !im.has_in(1)) {
    const int64_t n = im.attr_int("num_outputs", 0);
    if (n < 1 || n != im.n_out()) im.bad_attr("num_outputs", "is {} for {} outputs", n, im.n_out());
    const int64_t chunk = dim / n + (dim % n != 0);
    if (chunk * (n - 1) >= dim && dim > 0)
      im.bad_attr("num_outputs", "{} parts of {} elements leave the last one empty", n, dim);
    sizes.assign(size_t(n), chunk);
    sizes.back() = dim - chunk * (n - 1);
  }
  if (sizes.empty()) {
    int64_t parts = im.n_out();
    if (dim % parts != 0) im.bad("cannot split {} elements into {} equal parts", dim, parts);
    sizes.assign(size_t(parts), dim / parts);
  }
  if (int64_t(sizes.size()) != im.n_out())
    im.bad("split has {} sizes for {} outputs", sizes.size(), im.n_out());
  int64_t total = 0;
  for (int64_t v : sizes) {
    if (v < 0 || v > dim) im.bad("split sizes {} do not fit dim {}", shape_str(sizes), dim);
    total += v;
  }
  if (total != dim) im.bad("split sizes {} add up to {}, not {}", shape_str(sizes), total, dim);
  if (const Const* c = im.const_in(0)) {
    int64_t start = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      im.set_const(int(k), fold_slice(*c, {{axis, start, sizes[k], 1}}));
      start += sizes[k];
    }
    return;
  }
  if (std::any_of(sizes.begin(), sizes.end(), [](int64_t v) { return v == 0; }))
    im.unsupported("split sizes {} make an empty output", shape_str(sizes));
  std::string x = im.dyn(0);
  if (sizes.size() == 1) return im.set_alias(0, x);
  std::vector<std::string> outs;
  for (int k = 0; k < im.n_out(); ++k) outs.push_back(im.out(k));
  im.emit(OpKind::Split, {x}, im.attrs({{"axis", axis}, {"sizes", sizes}}), outs);
}

void op_slice(Importer& im) {
  if (im.opset() < 10) {
    im.allow({"starts", "ends", "axes"});
    im.arity(1, 1);
  } else {
    im.allow({});
    im.arity(3, 5);
  }
  const Shape s = im.shape_in(0);
  std::vector<int64_t> starts, ends, axes, steps;
  if (im.opset() < 10) {
    auto a = im.attr_ints("starts"), b = im.attr_ints("ends");
    if (!a || !b) im.bad("attributes 'starts' and 'ends' are required");
    starts = *a;
    ends = *b;
    if (auto c = im.attr_ints("axes")) axes = *c;
  } else {
    starts = im.ints_in(1, "starts");
    ends = im.ints_in(2, "ends");
    if (im.has_in(3)) axes = im.ints_in(3, "axes");
    if (im.has_in(4)) steps = im.ints_in(4, "steps");
  }
  if (axes.empty())
    for (size_t k = 0; k < starts.size(); ++k) axes.push_back(int64_t(k));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    im.bad("starts, ends, axes and steps have {}, {}, {} and {} values", starts.size(), ends.size(),
           axes.size(), steps.size());
  std::vector<SliceAxis> cut;
  std::set<int64_t> seen;
  for (size_t k = 0; k < starts.size(); ++k) {
    const int64_t axis = axis_of(axes[k], s.size());
    if (!seen.insert(axis).second) im.bad("axis {} is sliced twice", axis);
    const int64_t dim = s[size_t(axis)], step = steps[k];
    if (step == 0) im.bad("step 0 on axis {}", axis);
    // ONNX's rules: negative positions count from the end, then clamp to the axis
    // ([0, dim] going forward, [-1, dim-1] going backward).
    auto place = [&](int64_t v, int64_t lo, int64_t hi) {
      v = std::clamp(v, -dim - 1, dim + 1);
      if (v < 0) v += dim;
      return std::clamp(v, lo, hi);
    };
    // An empty axis (of a constant) has nothing to take, going either way.
    if (dim == 0) continue;
    int64_t b = step > 0 ? place(starts[k], 0, dim) : place(starts[k], 0, dim - 1);
    int64_t e = step > 0 ? place(ends[k], 0, dim) : place(ends[k], -1, dim - 1);
    // Unsigned magnitudes: a step of INT64_MIN or INT64_MAX must not overflow.
    const int64_t dist = step > 0 ? e - b : b - e;
    const uint64_t mag = step > 0 ? uint64_t(step) : uint64_t(0) - uint64_t(step);
    const int64_t count = dist <= 0 ? 0 : 1 + int64_t(uint64_t(dist - 1) / mag);
    if (count == dim && step == 1) continue;  // the whole axis
    cut.push_back({axis, b, count, step});
  }
  if (const Const* c = im.const_in(0)) return im.set_const(0, fold_slice(*c, cut));
  std::string x = im.dyn(0);
  for (const SliceAxis& c : cut)
    if (c.count == 0) im.unsupported("the slice of axis {} is empty", c.axis);
  // Steps other than 1: one slice node (start and end as clamped above, the end one step past
  // the last element taken, or the clamp's -1 going backwards past the front).
  if (std::any_of(cut.begin(), cut.end(), [](const SliceAxis& c) { return c.step != 1; })) {
    std::vector<int64_t> b, e, a, st;
    for (const SliceAxis& c : cut) {
      const int64_t last = c.start + (c.count - 1) * c.step;
      b.push_back(c.start);
      e.push_back(slice_end(last, c.step));
      a.push_back(c.axis);
      st.push_back(c.step);
    }
    return im.emit(OpKind::Slice, {x},
                   im.attrs({{"starts", b}, {"ends", e}, {"axes", a}, {"steps", st}}), {im.out(0)});
  }
  for (size_t k = 0; k < cut.size(); ++k) {
    const SliceAxis& c = cut[k];
    // A split into [before, wanted, after]; the unused parts are left to dead-code removal.
    const int64_t dim = im.value_shape(x)[size_t(c.axis)];
    std::vector<int64_t> sizes;
    std::vector<std::string> outs;
    if (c.start > 0) {
      sizes.push_back(c.start);
      outs.push_back(im.fresh_value(fmt::format("{}.before{}", im.name(), c.axis)));
    }
    size_t keep = sizes.size();
    sizes.push_back(c.count);
    outs.push_back(k + 1 == cut.size()
                       ? im.out(0)
                       : im.fresh_value(fmt::format("{}.axis{}", im.name(), c.axis)));
    if (c.start + c.count < dim) {
      sizes.push_back(dim - c.start - c.count);
      outs.push_back(im.fresh_value(fmt::format("{}.after{}", im.name(), c.axis)));
    }
    im.emit(OpKind::Split, {x}, im.attrs({{"axis", c.axis}, {"sizes", sizes}}), outs,
            k == 0 ? "" : fmt::format("axis{}", c.axis));
    x = outs[keep];
  }
  if (cut.empty()) im.set_alias(0, x);
}

// Pad: 'pads' (and 'value') attributes before opset 11, inputs from then on (pads,
// constant_value, and from opset 18 the axes the pads are for); mode constant, reflect, edge
// or (from 19) wrap. Zero pads are the input itself; other pads need a pad op.
void op_pad(Importer& im) {
  if (im.opset() < 11)
    im.allow({"mode", "pads", "value"});
  else
    im.allow({"mode"});
  im.arity(im.opset() < 11 ? 1 : 2, im.opset() < 11 ? 1 : (im.opset() < 18 ? 3 : 4));
  const std::string mode = im.attr_string("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge" &&
      !(mode == "wrap" && im.opset() >= 19))
    im.bad_attr("mode", "is '{}', expected constant, reflect, edge{}", mode,
                im.opset() >= 19 ? " or wrap" : "");
  std::vector<int64_t> pads;
  if (im.opset() < 11) {
    auto p = im.attr_ints("pads");
    if (!p) im.bad("attribute 'pads' is required");
    pads = *p;
  } else {
    pads = im.ints_in(1, "pads");
  }
  const size_t rank = im.shape_in(0).size();
  size_t axes = rank;
  if (im.has_in(3)) axes = im.ints_in(3, "axes").size();
  if (pads.size() != 2 * axes)
    im.bad("has {} pads for {} axes, expected two per axis", pads.size(), axes);
  if (std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; }))
    return pass_through(im);
  if (mode == "wrap") im.unsupported_attr("mode", "'wrap' is not supported");
  if (std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p < 0; }))
    im.unsupported("padding by {}: negative pads (cropping) are not supported", shape_str(pads));
  // Pads of every dim: begins, then ends (those of the listed axes only from opset 18).
  std::vector<int64_t> full(2 * rank, 0);
  std::vector<int64_t> listed;
  if (im.has_in(3))
    for (int64_t a : im.ints_in(3, "axes")) listed.push_back(axis_of(a, rank, "axes value"));
  else
    for (size_t d = 0; d < rank; ++d) listed.push_back(int64_t(d));
  for (size_t k = 0; k < axes; ++k) {
    full[size_t(listed[k])] = pads[k];
    full[rank + size_t(listed[k])] = pads[axes + k];
  }
  double value = im.attr_float("value", 0);
  if (im.opset() >= 11 && im.has_in(2)) value = scalar_in(im, 2, "constant_value");
  im.emit(OpKind::Pad, {im.dyn(0)}, im.attrs({{"pads", full}, {"mode", mode}, {"value", value}}),
          {im.out(0)});
}

void op_flatten(Importer& im) {
  im.allow({"axis"});
  im.arity(1, 1);
  const Shape s = im.shape_in(0);
  int64_t axis = im.attr_int("axis", 1);
  if (axis < -int64_t(s.size()) || axis > int64_t(s.size()))
    im.bad_attr("axis", "{} is out of range for rank {}", axis, s.size());
  if (axis < 0) axis += int64_t(s.size());
  if (const Const* c = im.const_in(0)) {
    Const r = *c;
    r.dims = {1, 1};
    for (size_t d = 0; d < s.size(); ++d) r.dims[int64_t(d) < axis ? 0 : 1] *= s[d];
    return im.set_const(0, r);
  }
  im.emit(OpKind::Flatten, {im.dyn(0)}, im.attrs({{"axis", axis}}), {im.out(0)});
}

void op_reshape(Importer& im) {
  im.allow({"allowzero"});
  im.arity(2, 2);
  std::vector<int64_t> want = im.ints_in(1, "shape");
  const Shape& x = im.shape_in(0);
  // A shape the exporter wrote with the batch it traced (shufflenet's channel shuffle at
  // batch 1, ResNeSt's reshape(batch, -1)), on a run-time tensor whose batch was rebound: its
  // first dim is the batch, else the batch would fold into the other dims.
  if (im.batch() > 0 && im.file_batch() > 0 && im.batch() != im.file_batch() && !want.empty() &&
      want[0] == im.file_batch() && !x.empty() && x[0] == im.batch() && !im.const_in(0)) {
    int64_t known = 1, total = 1;
    for (int64_t d : want) known *= d > 0 ? d : 1;
    for (int64_t d : x) total *= d;
    if (std::find(want.begin(), want.end(), -1) != want.end())
      want[0] = x[0];
    else if (known != total)
      want[0] = -1;
  }
  Shape target = reshaped(x, want, im.attr_int("allowzero", 0) != 0);
  reshape_to(im, target);
}

void op_unsqueeze(Importer& im) {
  auto axes = axes_arg(im);
  if (!axes) im.bad("axes are required");
  Shape s = im.shape_in(0);
  const size_t rank = s.size() + axes->size();
  if (rank > kMaxRank) im.bad("makes {} dims", rank);
  std::vector<bool> added(rank, false);
  for (int64_t a : *axes) {
    int64_t k = axis_of(a, rank, "axes value");
    if (added[size_t(k)]) im.bad("axis {} is given twice", a);
    added[size_t(k)] = true;
  }
  Shape target;
  for (size_t k = 0, from = 0; k < rank; ++k) target.push_back(added[k] ? 1 : s[from++]);
  reshape_to(im, target);
}

void op_squeeze(Importer& im) {
  auto axes = axes_arg(im);
  Shape s = im.shape_in(0);
  std::vector<bool> drop(s.size(), false);
  if (axes) {
    for (int64_t a : *axes) {
      int64_t k = axis_of(a, s.size(), "axes value");
      if (s[size_t(k)] != 1) im.bad("cannot squeeze axis {} of size {}", a, s[size_t(k)]);
      drop[size_t(k)] = true;
    }
  } else {
    for (size_t k = 0; k < s.size(); ++k) drop[k] = s[k] == 1;
  }
  Shape target;
  for (size_t k = 0; k < s.size(); ++k)
    if (!drop[k]) target.push_back(s[k]);
  reshape_to(im, target);
}

void op_transpose(Importer& im) {
  im.allow({"perm"});
  im.arity(1, 1);
  const Shape s = im.shape_in(0);
  std::vector<int64_t> perm;
  if (auto p = im.attr_ints("perm")) {
    perm = *p;
  } else {
    for (size_t k = s.size(); k-- > 0;) perm.push_back(int64_t(k));
  }
  std::vector<bool> used(s.size(), false);
  if (perm.size() != s.size())
    im.bad_attr("perm", "has {} values for rank {}", perm.size(), s.size());
  for (int64_t p : perm) {
    if (p < 0 || p >= int64_t(s.size()) || used[size_t(p)])
      im.bad_attr("perm", "{} is not a permutation of 0..{}", shape_str(perm), s.size() - 1);
    used[size_t(p)] = true;
  }
  if (const Const* c = im.const_in(0)) return im.set_const(0, fold_transpose(*c, perm));
  for (size_t k = 0; k < perm.size(); ++k)
    if (perm[k] != int64_t(k))
      return im.emit(OpKind::Transpose, {im.dyn(0)}, im.attrs({{"perm", perm}}), {im.out(0)});
  im.set_alias(0, im.dyn(0));
}

// DepthToSpace (mode DCR or CRD) and SpaceToDepth (DCR) of a 4-D tensor.
template <OpKind Op>
void op_depth_space(Importer& im) {
  im.allow(Op == OpKind::DepthToSpace ? std::initializer_list<const char*>{"blocksize", "mode"}
                                      : std::initializer_list<const char*>{"blocksize"});
  im.arity(1, 1);
  const Shape s = im.shape_in(0);
  if (s.size() != 4)
    im.unsupported("input '{}' has shape {}: epilog rearranges 4-D (NCHW) tensors only",
                   im.in_name(0), shape_str(s));
  const int64_t block = im.attr_int_req("blocksize");
  if (block < 1 || block > kMaxDim) im.bad_attr("blocksize", "{} is out of range", block);
  const std::string mode = im.attr_string("mode", "DCR");
  if (mode != "DCR" && mode != "CRD") im.bad_attr("mode", "is '{}', expected DCR or CRD", mode);
  im.emit(Op, {im.dyn(0)},
          im.attrs({{"blocksize", std::vector<int64_t>{block, block}}, {"mode", mode}}),
          {im.out(0)});
}

// -- handlers: constants and shape arithmetic --

void op_identity(Importer& im) {
  im.allow({});
  im.arity(1, 1);
  pass_through(im);
}

// Dropout at inference is its input; so is training with ratio 0. The mask output is refused.
void op_dropout(Importer& im) {
  if (im.opset() < 7)
    im.allow({"consumed_inputs", "is_test", "ratio"});
  else if (im.opset() < 12)
    im.allow({"ratio"});
  else
    im.allow({"seed"});
  // From opset 12 the ratio and training_mode are inputs.
  im.arity(1, im.opset() < 12 ? 1 : 3, 2);
  bool training = im.opset() < 7 && im.attr_int("is_test", 0) == 0;
  float ratio = im.attr_float("ratio", 0.5f);
  if (im.has_in(1)) ratio = float(scalar_in(im, 1, "ratio"));
  if (im.has_in(2)) training = scalar_in(im, 2, "training_mode") != 0;
  if (training && ratio != 0)
    im.unsupported("is in training mode with ratio {}; epilog imports inference-mode Dropout",
                   ratio);
  if (im.used_out(1))
    im.unsupported("output 1 ('{}', the mask) is not supported", im.node().output(1));
  pass_through(im);
}

void op_constant(Importer& im) {
  im.allow({"value", "value_float", "value_floats", "value_int", "value_ints", "value_string",
            "value_strings", "sparse_value"});
  im.arity(0, 0);
  if (im.attributes().size() != 1)
    im.bad("needs exactly one value attribute, has {}", im.attributes().size());
  const std::string& kind = im.attributes().begin()->first;
  Const c;
  if (kind == "value") {
    c = im.reader().read(im.attr("value", AttributeProto::TENSOR)->t(),
                         fmt::format("{}: attribute 'value'", im.where()));
  } else if (kind == "value_float") {
    c.f = {im.attr_float("value_float", 0)};
  } else if (kind == "value_floats") {
    c.f = *im.attr_floats("value_floats");
    c.dims = {int64_t(c.f.size())};
  } else if (kind == "value_int") {
    c = int_const({}, {im.attr_int("value_int", 0)});
  } else if (kind == "value_ints") {
    std::vector<int64_t> v = *im.attr_ints("value_ints");
    c = int_const({int64_t(v.size())}, v);
  } else {
    im.unsupported_attr(kind, "string and sparse constants are not supported");
  }
  im.set_const(0, std::move(c));
}

// Expand: x broadcast to `shape` (both ways, as NumPy). A constant folds; a run-time tensor is
// x + 0, the zeros only as large as the dims x lacks, which canonicalization drops where the
// reader broadcasts x anyway (an SE gate's x * y.expand_as(x)).
void op_expand(Importer& im) {
  im.allow({});
  im.arity(2, 2);
  const Shape target = im.ints_in(1, "shape"), xs = im.shape_in(0);
  for (int64_t d : target)
    if (d < 0) im.bad("shape {} has a negative dim", shape_str(target));
  const Shape out = broadcast(xs, target);
  if (std::count(out.begin(), out.end(), 0) != 0)
    im.unsupported("expanding {} to {} leaves no elements", shape_str(xs), shape_str(out));
  Const zeros;
  zeros.dims = Shape(out.size(), 1);
  const size_t lead = out.size() - xs.size();
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t x = i < lead ? 1 : xs[i - lead];
    if (x == 1) zeros.dims[i] = out[i];
  }
  if (const Const* c = im.const_in(0)) {
    check_folded(out, c->numel());
    if (!c->is_float()) zeros.dtype = c->dtype;
    zeros.f.assign(c->is_float() ? size_t(checked_numel(zeros.dims, kMaxFolded)) : 0, 0.0f);
    zeros.i.assign(c->is_float() ? 0 : size_t(checked_numel(zeros.dims, kMaxFolded)), 0);
    return im.set_const(0, fold_binary(*c, zeros, '+'));
  }
  if (out == xs) return pass_through(im);
  const int64_t n = checked_numel(zeros.dims, kMaxFolded);
  if (n < 0)
    im.unsupported("expanding {} to {} takes zeros of {}, more than epilog makes at import",
                   shape_str(xs), shape_str(out), shape_str(zeros.dims));
  zeros.f.assign(size_t(n), 0.0f);
  const std::string z = im.fresh_value(im.out(0) + ".zeros");
  im.add_weight(z, zeros);
  im.emit(OpKind::Add, {im.dyn(0), z}, {}, {im.out(0)});
}

// Tile: x repeated reps[i] times along each dim i. A constant folds; a run-time tensor is tiled
// one dim at a time: x seen as [.., 1, d, rest] plus zeros of [.., r, 1, 1] (a broadcasting add,
// as Expand), reshaped to [.., r * d, ..]: r copies of the dim one after another. A view is one
// dim deeper than x at most.
void op_tile(Importer& im) {
  im.allow({});
  im.arity(2, 2);
  const Shape xs = im.shape_in(0);
  const std::vector<int64_t> reps = im.ints_in(1, "repeats");
  if (reps.size() != xs.size())
    im.bad("repeats has {} values for an input of {} dims", reps.size(), xs.size());
  Shape out = xs;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (reps[i] < 0) im.bad("repeats {} has a negative value", shape_str(reps));
    if (__builtin_mul_overflow(out[i], reps[i], &out[i]) || out[i] > kMaxDim)
      im.unsupported("tiling {} by {}: dim {} is larger than epilog's dims", shape_str(xs),
                     shape_str(reps), i);
  }
  const int64_t n = checked_numel(out, kMaxNumel);
  if (n < 0)
    im.unsupported("tiling {} by {} makes too many elements", shape_str(xs), shape_str(reps));
  if (const Const* c = im.const_in(0)) {
    check_folded(out, c->numel());
    const std::vector<int64_t> from = strides_of(xs);
    std::vector<int64_t> at;
    for_each_index(out, [&](const std::vector<int64_t>& idx) {
      int64_t p = 0;
      for (size_t i = 0; i < idx.size(); ++i) p += idx[i] % xs[i] * from[i];
      at.push_back(p);
    });
    return im.set_const(0, take(*c, out, at));
  }
  if (out == xs) return pass_through(im);
  if (n == 0) im.unsupported("tiling {} by {} leaves no elements", shape_str(xs), shape_str(reps));
  const std::string name = im.node().output(0);
  std::string cur = im.dyn(0);
  Shape now = xs;
  size_t last = 0;
  for (size_t i = 0; i < xs.size(); ++i)
    if (reps[i] > 1) last = i;
  for (size_t i = 0; i <= last; ++i) {
    if (reps[i] <= 1) continue;
    int64_t rest = 1;
    for (size_t d = i + 1; d < now.size(); ++d) rest *= now[d];
    Shape view(now.begin(), now.begin() + long(i)), zeros(i, 1);
    view.insert(view.end(), {1, now[i]});
    zeros.insert(zeros.end(), {reps[i], 1});
    if (i + 1 < now.size()) view.push_back(rest), zeros.push_back(1);
    now[i] *= reps[i];
    Shape merged = now;
    if (i > 0) view[0] = merged[0] = 0;  // the batch, copied: it may be rebound (--batch)
    const std::string tag = fmt::format("{}", i);
    const std::string seen = im.fresh_value(name + ".view" + tag);
    const std::string sum = im.fresh_value(name + ".tiled" + tag);
    const std::string next = i == last ? im.out(0) : im.fresh_value(name + ".dim" + tag);
    im.emit(OpKind::Reshape, {cur}, im.attrs({{"shape", std::vector<int64_t>(view)}}), {seen},
            "view" + tag);
    Const z;
    z.dims = zeros;
    z.f.assign(size_t(reps[i]), 0.0f);
    const std::string zv = im.fresh_value(name + ".zeros" + tag);
    im.add_weight(zv, z);
    im.emit(OpKind::Add, {seen, zv}, {}, {sum}, "repeat" + tag);
    im.emit(OpKind::Reshape, {sum}, im.attrs({{"shape", std::vector<int64_t>(merged)}}), {next},
            "merge" + tag);
    cur = next;
  }
}

void op_constant_of_shape(Importer& im) {
  im.allow({"value"});
  im.arity(1, 1);
  std::vector<int64_t> dims = im.ints_in(0, "shape");
  Const fill;
  fill.f = {0.0f};
  if (im.has_attr("value")) {
    fill = im.reader().read(im.attr("value", AttributeProto::TENSOR)->t(),
                            fmt::format("{}: attribute 'value'", im.where()));
    if (fill.numel() != 1) im.bad_attr("value", "has {} elements, expected 1", fill.numel());
  }
  check_folded(dims, 0);
  Const c = take(fill, dims, std::vector<int64_t>(size_t(checked_numel(dims, kMaxFolded)), 0));
  im.set_const(0, std::move(c));
}

void op_shape(Importer& im) {
  im.allow({"start", "end"});
  im.arity(1, 1);
  const Shape s = im.shape_in(0);
  const int64_t r = int64_t(s.size());
  auto place = [&](int64_t v) {
    return std::clamp(v < 0 ? std::max(v, -r) + r : v, int64_t(0), r);
  };
  int64_t b = place(im.attr_int("start", 0)), e = place(im.attr_int("end", r));
  std::vector<int64_t> dims(s.begin() + b, s.begin() + std::max(b, e));
  im.set_const(0, int_const({int64_t(dims.size())}, dims));
}

// Size: the element count of a shape known at import, an int64 scalar.
void op_size(Importer& im) {
  im.allow({});
  im.arity(1, 1);
  const Shape s = im.shape_in(0);
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  im.set_const(0, int_const({}, {n}));
}

// Gather: a constant folds. From a run-time tensor, indices that step evenly along the axis are
// a strided slice, reshaped to the indices' dims. PyTorch's dynamo exporter writes as_strided
// (ConvNeXt's pooled features viewed as [1, C, 1, 1]) as a Reshape to 1-D and a Gather of every
// index in order: that is the Reshape's input.
void op_gather(Importer& im) {
  im.allow({"axis"});
  im.arity(2, 2);
  const Const& idx = im.cst(1, "indices");
  if (idx.is_float()) im.bad("indices '{}' are float, expected integers", im.in_name(1));
  if (const Const* data = im.const_in(0))
    return im.set_const(0, fold_gather(*data, idx, im.attr_int("axis", 0)));
  const std::string x = im.dyn(0);
  const Shape s = im.value_shape(x);
  const int64_t axis = axis_of(im.attr_int("axis", 0), s.size());
  const int64_t dim = s[size_t(axis)];
  // as_strided as an identity view: x is src flattened by a Reshape, the indices 0, 1, .. shaped
  // as src at the file's batch. The result is src, at any batch.
  if (s.size() == 1 && !idx.dims.empty() && im.file_batch() > 0 && idx.dims[0] == im.file_batch()) {
    const Graph& g = im.graph();
    for (auto n = g.nodes.rbegin(); n != g.nodes.rend(); ++n) {
      if (std::find(n->outputs.begin(), n->outputs.end(), x) == n->outputs.end()) continue;
      if (n->op != OpKind::Reshape) break;
      const Shape& src = im.value_shape(n->inputs[0]);
      bool identity = src.size() == idx.dims.size() && !src.empty() &&
                      std::equal(src.begin() + 1, src.end(), idx.dims.begin() + 1);
      for (size_t k = 0; identity && k < idx.i.size(); ++k) identity = idx.i[k] == int64_t(k);
      if (identity) return im.set_alias(0, n->inputs[0]);
      break;
    }
  }
  // Indices traced at the file's batch say nothing of another's: as_strided's Reshape to 1-D
  // holds the batch in that one axis.
  if (axis == 0 && im.batch() > 0 && im.file_batch() > 0 && im.batch() != im.file_batch())
    im.unsupported(
        "gathers along axis 0 of the run-time tensor '{}', which holds the batch: supported at "
        "the file's batch ({}) only, not at {}",
        x, im.file_batch(), im.batch());
  std::vector<int64_t> at(idx.i);
  for (int64_t& i : at) {
    if (i < -dim || i >= dim)
      im.bad("index {} is out of range for axis {} of size {}", i, axis, dim);
    if (i < 0) i += dim;
  }
  if (at.empty()) im.unsupported("gathers no index from the run-time tensor '{}'", x);
  const int64_t step = at.size() > 1 ? at[1] - at[0] : 1;
  for (size_t k = 1; k < at.size(); ++k)
    if (step == 0 || at[k] - at[k - 1] != step)
      im.unsupported(
          "gathers indices {}, {}, {}.. from the run-time tensor '{}': only indices that step "
          "evenly (a strided slice) are supported",
          at[0], at[1], at.size() > 2 ? at[2] : at[1], x);
  Shape out(s.begin(), s.begin() + axis);
  out.insert(out.end(), idx.dims.begin(), idx.dims.end());
  out.insert(out.end(), s.begin() + axis + 1, s.end());
  const int64_t n = int64_t(at.size()), last = at.back();
  Shape cut = s;
  cut[size_t(axis)] = n;
  std::string y = x;
  if (n != dim || step != 1) {
    y = cut == out ? im.out(0) : im.fresh_value(im.node().output(0) + ".slice");
    im.emit(OpKind::Slice, {x},
            im.attrs({{"starts", std::vector<int64_t>{at[0]}},
                      {"ends", std::vector<int64_t>{slice_end(last, step)}},
                      {"axes", std::vector<int64_t>{axis}},
                      {"steps", std::vector<int64_t>{step}}}),
            {y});
  }
  if (cut == out) return y == x ? im.set_alias(0, x) : void();
  emit_reshape(im, y, out, y == x ? "" : "reshape", axis > 0);
}

// Cast and CastLike: a constant folds; a run-time tensor stays float32 ('saturate', from
// opset 19, is for float8 only).
void cast_to(Importer& im, int64_t to) {
  const Const* c = im.const_in(0);
  if (!c) {
    if (to != TensorProto::FLOAT)
      im.unsupported("casts a run-time tensor to {}; only float32 tensors flow",
                     dtype_str(int(to)));
    return im.set_alias(0, im.dyn(0));
  }
  if (to != TensorProto::FLOAT && to != TensorProto::INT64 && to != TensorProto::INT32 &&
      to != TensorProto::BOOL)
    im.unsupported("casts to {}: constants fold to FLOAT, INT64, INT32 and BOOL only",
                   dtype_str(int(to)));
  im.set_const(0, fold_cast(*c, to));
}

void op_cast(Importer& im) {
  im.allow({"to", "saturate"});
  im.arity(1, 1);
  cast_to(im, im.attr_int_req("to"));
}

// To the type of input 1: a constant's, or float32 for a run-time tensor.
void op_cast_like(Importer& im) {
  im.allow({"saturate"});
  im.arity(2, 2);
  const Const* like = im.const_in(1);
  cast_to(im, like ? like->dtype : int32_t(TensorProto::FLOAT));
}

}  // namespace

void add_layout_handlers(std::map<std::string, OpHandler>& table) {
  table.insert({
      {"Cast", op_cast},
      {"CastLike", op_cast_like},
      {"Concat", op_concat},
      {"Constant", op_constant},
      {"ConstantOfShape", op_constant_of_shape},
      {"DepthToSpace", op_depth_space<OpKind::DepthToSpace>},
      {"Dropout", op_dropout},
      {"Expand", op_expand},
      {"Flatten", op_flatten},
      {"Gather", op_gather},
      {"Identity", op_identity},
      {"Pad", op_pad},
      {"Reshape", op_reshape},
      {"Shape", op_shape},
      {"Slice", op_slice},
      {"Size", op_size},
      {"SpaceToDepth", op_depth_space<OpKind::SpaceToDepth>},
      {"Split", op_split},
      {"Squeeze", op_squeeze},
      {"Tile", op_tile},
      {"Transpose", op_transpose},
      {"Unsqueeze", op_unsqueeze},
  });
}

}  // namespace epilog::onnx_import

#endif  // EPILOG_HAVE_ONNX
