// Constant folding for the ONNX importer: the import-time arithmetic on constants (shape
// arithmetic as exporters write it, weights transposed or sliced). Each function throws
// FoldError for a malformed node; the driver names the node. See onnx_import.h.
#ifdef EPILOG_HAVE_ONNX

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "onnx_import.h"

namespace epilog::onnx_import {

using onnx::TensorProto;

namespace {

template <typename... Args>
[[noreturn]] void bad(fmt::format_string<Args...> format, Args&&... args) {
  throw FoldError(fmt::format(format, std::forward<Args>(args)...));
}

// Flat positions in `in` of every element of the broadcast shape `out`.
std::vector<int64_t> broadcast_index(const Shape& in, const Shape& out) {
  std::vector<int64_t> s = strides_of(in), step(out.size(), 0);
  for (size_t k = 0; k < in.size(); ++k)
    if (in[k] != 1) step[out.size() - in.size() + k] = s[k];
  std::vector<int64_t> at;
  for_each_index(out, [&](const std::vector<int64_t>& idx) {
    int64_t p = 0;
    for (size_t k = 0; k < idx.size(); ++k) p += idx[k] * step[k];
    at.push_back(p);
  });
  return at;
}

}  // namespace

void check_folded(const Shape& dims, int64_t inputs_numel) {
  if (dims.size() > kMaxRank) bad("folds to a constant of {} dims", dims.size());
  if (checked_numel(dims, std::max(kMaxFolded, inputs_numel)) < 0)
    bad("folds to a constant of shape {}, larger than epilog folds at import", shape_str(dims));
}

int64_t axis_of(int64_t axis, size_t rank, const char* what) {
  int64_t r = int64_t(rank);
  if (axis < -r || axis >= r) bad("{} {} is out of range for rank {}", what, axis, rank);
  return axis < 0 ? axis + r : axis;
}

Shape broadcast(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()));
  for (size_t k = 0; k < out.size(); ++k) {
    int64_t da = k < a.size() ? a[a.size() - 1 - k] : 1;
    int64_t db = k < b.size() ? b[b.size() - 1 - k] : 1;
    if (da != db && da != 1 && db != 1)
      bad("shapes {} and {} do not broadcast", shape_str(a), shape_str(b));
    out[out.size() - 1 - k] = da == 1 ? db : da;
  }
  return out;
}

Const fold_binary(const Const& a, const Const& b, char op) {
  if (a.is_float() != b.is_float())
    bad("inputs are {} and {}; both must have one type", dtype_str(a.dtype), dtype_str(b.dtype));
  Shape dims = broadcast(a.dims, b.dims);
  check_folded(dims, a.numel() + b.numel());
  std::vector<int64_t> ia = broadcast_index(a.dims, dims), ib = broadcast_index(b.dims, dims);
  Const c;
  c.dtype = a.dtype;
  c.dims = dims;
  for (size_t k = 0; k < ia.size(); ++k) {
    if (a.is_float()) {
      if (op == 'm') bad("Mod of floats needs fmod 1");
      float x = a.f[size_t(ia[k])], y = b.f[size_t(ib[k])];
      c.f.push_back(op == '+'   ? x + y
                    : op == '-' ? x - y
                    : op == '*' ? x * y
                    : op == '^' ? std::pow(x, y)
                    : op == '%' ? std::fmod(x, y)
                                : x / y);
      continue;
    }
    int64_t x = a.i[size_t(ia[k])], y = b.i[size_t(ib[k])], r = 0;
    bool overflow = false;
    if (op == '^') {  // by squaring: x^y of an exponent e = y, its bits from the lowest
      if (y < 0) bad("integer Pow with a negative exponent ({} ^ {})", x, y);
      int64_t base = x;
      r = 1;
      for (int64_t e = y; e > 0 && !overflow; e >>= 1) {
        if (e & 1) overflow = __builtin_mul_overflow(r, base, &r);
        if (e > 1 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
      }
    }
    if (op == '+') overflow = __builtin_add_overflow(x, y, &r);
    if (op == '-') overflow = __builtin_sub_overflow(x, y, &r);
    if (op == '*') overflow = __builtin_mul_overflow(x, y, &r);
    if (op == '%' || op == 'm') {  // C's remainder (the dividend's sign), or the divisor's
      if (y == 0) bad("integer division by zero while folding constants");
      r = y == -1 ? 0 : x % y;
      if (op == 'm' && r != 0 && (r < 0) != (y < 0)) r += y;
    }
    if (op == '/') {
      if (y == 0) bad("integer division by zero while folding constants");
      overflow = x == std::numeric_limits<int64_t>::min() && y == -1;
      if (!overflow) r = x / y;  // truncates toward zero, as ONNX Runtime does
    }
    if (overflow) bad("integer overflow while folding constants ({} {} {})", x, op, y);
    c.i.push_back(r);
  }
  return c;
}

Const fold_compare(const Const& a, const Const& b, const std::string& op) {
  if (a.is_float() != b.is_float())
    bad("inputs are {} and {}; both must have one type", dtype_str(a.dtype), dtype_str(b.dtype));
  Const c;
  c.dtype = TensorProto::BOOL;
  c.dims = broadcast(a.dims, b.dims);
  check_folded(c.dims, a.numel() + b.numel());
  const std::vector<int64_t> ia = broadcast_index(a.dims, c.dims);
  const std::vector<int64_t> ib = broadcast_index(b.dims, c.dims);
  for (size_t k = 0; k < ia.size(); ++k) {
    const auto test = [&](auto x, auto y) -> bool {
      if (op == "Equal") return x == y;
      if (op == "Less") return x < y;
      if (op == "LessOrEqual") return x <= y;
      if (op == "Greater") return x > y;
      if (op == "GreaterOrEqual") return x >= y;
      if (op == "And") return x != 0 && y != 0;
      if (op == "Or") return x != 0 || y != 0;
      return (x != 0) != (y != 0);  // Xor
    };
    c.i.push_back(a.is_float() ? test(a.f[size_t(ia[k])], b.f[size_t(ib[k])])
                               : test(a.i[size_t(ia[k])], b.i[size_t(ib[k])]));
  }
  return c;
}

Const fold_where(const Const& cond, const Const& x, const Const& y) {
  if (x.is_float() != y.is_float())
    bad("inputs are {} and {}; both must have one type", dtype_str(x.dtype), dtype_str(y.dtype));
  Const c;
  c.dtype = x.dtype;
  c.dims = broadcast(cond.dims, broadcast(x.dims, y.dims));
  check_folded(c.dims, cond.numel() + x.numel() + y.numel());
  const std::vector<int64_t> ic = broadcast_index(cond.dims, c.dims);
  const std::vector<int64_t> ix = broadcast_index(x.dims, c.dims);
  const std::vector<int64_t> iy = broadcast_index(y.dims, c.dims);
  for (size_t k = 0; k < ic.size(); ++k) {
    const bool pick = cond.is_float() ? cond.f[size_t(ic[k])] != 0 : cond.i[size_t(ic[k])] != 0;
    if (x.is_float())
      c.f.push_back(pick ? x.f[size_t(ix[k])] : y.f[size_t(iy[k])]);
    else
      c.i.push_back(pick ? x.i[size_t(ix[k])] : y.i[size_t(iy[k])]);
  }
  return c;
}

Const fold_range(const Const& start, const Const& limit, const Const& delta) {
  if (start.numel() != 1 || limit.numel() != 1 || delta.numel() != 1)
    bad("start, limit and delta must be scalars, got {}, {} and {}", start.describe(),
        limit.describe(), delta.describe());
  if (start.is_float() != limit.is_float() || start.is_float() != delta.is_float())
    bad("start, limit and delta must have one type");
  Const c;
  c.dtype = start.dtype;
  if (start.is_float()) {
    const double s = start.f[0], d = delta.f[0];
    const double n = std::ceil((double(limit.f[0]) - s) / d);
    if (!(d != 0) || !std::isfinite(n)) bad("range from {} to {} by {}", s, limit.f[0], d);
    if (n > double(kMaxFolded)) bad("range from {} to {} by {} has {} values", s, limit.f[0], d, n);
    c.dims = {int64_t(std::max(n, 0.0))};
    for (int64_t k = 0; k < c.dims[0]; ++k) c.f.push_back(float(s + double(k) * d));
    return c;
  }
  const int64_t s = start.i[0], l = limit.i[0], d = delta.i[0];
  if (d == 0) bad("range from {} to {} by 0", s, l);
  // The count ceil((l - s) / d), exactly: the span in 128 bits.
  const __int128 span = __int128(l) - __int128(s);
  __int128 n = span / d;
  if (n * d != span && (span < 0) == (d < 0)) ++n;
  if (n > kMaxFolded) bad("range from {} to {} by {} has more values than epilog folds", s, l, d);
  c.dims = {int64_t(std::max<__int128>(n, 0))};
  for (int64_t k = 0; k < c.dims[0]; ++k) c.i.push_back(int64_t(__int128(s) + __int128(k) * d));
  return c;
}

Const fold_cumsum(const Const& x, int64_t axis, bool exclusive, bool reverse) {
  axis = axis_of(axis, x.dims.size(), "axis");
  int64_t inner = 1;
  for (size_t d = size_t(axis) + 1; d < x.dims.size(); ++d) inner *= x.dims[d];
  const int64_t len = x.dims[size_t(axis)];
  const int64_t outer = len * inner == 0 ? 0 : x.numel() / (len * inner);
  Const c = x;
  // Floats summed in double, integers in int64 (overflow throws), each written back in its type.
  const auto scan = [&](auto& v, auto acc0) {
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        auto acc = acc0;
        for (int64_t k = 0; k < len; ++k) {
          const int64_t j = reverse ? len - 1 - k : k;
          auto& at = v[size_t((o * len + j) * inner + i)];
          const auto here = decltype(acc0)(at);
          const auto add = [&] {
            if constexpr (std::is_integral_v<decltype(acc0)>) {
              if (__builtin_add_overflow(acc, here, &acc)) bad("integer overflow in CumSum");
            } else {
              acc += here;
            }
          };
          if (!exclusive) add();
          at = static_cast<std::remove_reference_t<decltype(at)>>(acc);
          if (exclusive) add();
        }
      }
  };
  if (x.is_float())
    scan(c.f, 0.0);
  else
    scan(c.i, int64_t(0));
  return c;
}

Shape reshaped(const Shape& in, const std::vector<int64_t>& spec, bool allowzero) {
  if (spec.size() > kMaxRank) bad("target shape has {} dims", spec.size());
  Shape out;
  int infer = -1;
  for (size_t k = 0; k < spec.size(); ++k) {
    int64_t v = spec[k];
    if (v == -1) {
      if (infer >= 0) bad("target shape {} has more than one -1", shape_str(spec));
      infer = int(k);
    } else if (v == 0 && !allowzero) {
      if (k >= in.size())
        bad("target shape {} copies dim {} (0) of the {}-D input", shape_str(spec), k, in.size());
      v = in[k];
    } else if (v < -1) {
      bad("target shape {} has a negative dim", shape_str(spec));
    }
    out.push_back(v);
  }
  const int64_t n = checked_numel(in, kMaxNumel);
  Shape known = out;
  if (infer >= 0) known[size_t(infer)] = 1;
  const int64_t k = checked_numel(known, kMaxNumel);
  if (n < 0 || k < 0) bad("target shape {} is too large", shape_str(spec));
  if (infer >= 0) {
    if (k == 0 || n % k != 0)
      bad("cannot reshape {} ({} elements) to {}", shape_str(in), n, shape_str(spec));
    out[size_t(infer)] = n / k;
  } else if (k != n) {
    bad("cannot reshape {} ({} elements) to {}", shape_str(in), n, shape_str(spec));
  }
  return out;
}

Const fold_concat(const std::vector<const Const*>& xs, int64_t axis) {
  const Const& first = *xs[0];
  const size_t rank = first.dims.size();
  const int64_t a = axis_of(axis, rank);
  Shape dims = first.dims;
  dims[size_t(a)] = 0;
  int64_t total = 0;
  for (const Const* x : xs) {
    bool ok = x->dims.size() == rank && x->is_float() == first.is_float();
    for (size_t d = 0; ok && d < rank; ++d) ok = int64_t(d) == a || x->dims[d] == first.dims[d];
    if (!ok) bad("cannot concatenate {} and {} on axis {}", first.describe(), x->describe(), axis);
    dims[size_t(a)] += x->dims[size_t(a)];
    total += x->numel();
  }
  check_folded(dims, total);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < a; ++d) outer *= dims[size_t(d)];
  for (size_t d = size_t(a) + 1; d < rank; ++d) inner *= dims[d];
  Const c;
  c.dtype = first.dtype;
  c.dims = dims;
  for (int64_t o = 0; o < outer; ++o)
    for (const Const* x : xs) {
      int64_t n = x->dims[size_t(a)] * inner;
      for (int64_t k = o * n; k < (o + 1) * n; ++k) {
        if (first.is_float())
          c.f.push_back(x->f[size_t(k)]);
        else
          c.i.push_back(x->i[size_t(k)]);
      }
    }
  return c;
}

Const fold_slice(const Const& x, const std::vector<SliceAxis>& axes) {
  Shape dims = x.dims;
  std::vector<int64_t> start(dims.size(), 0), step(dims.size(), 1);
  for (const SliceAxis& s : axes) {
    dims[size_t(s.axis)] = s.count;
    start[size_t(s.axis)] = s.start;
    step[size_t(s.axis)] = s.step;
  }
  std::vector<int64_t> strides = strides_of(x.dims), at;
  for_each_index(dims, [&](const std::vector<int64_t>& idx) {
    int64_t p = 0;
    for (size_t d = 0; d < idx.size(); ++d) p += (start[d] + idx[d] * step[d]) * strides[d];
    at.push_back(p);
  });
  return take(x, dims, at);
}

Const fold_transpose(const Const& x, const std::vector<int64_t>& perm) {
  Shape dims;
  for (int64_t p : perm) dims.push_back(x.dims[size_t(p)]);
  std::vector<int64_t> strides = strides_of(x.dims), at;
  for_each_index(dims, [&](const std::vector<int64_t>& idx) {
    int64_t pos = 0;
    for (size_t d = 0; d < idx.size(); ++d) pos += idx[d] * strides[size_t(perm[d])];
    at.push_back(pos);
  });
  return take(x, dims, at);
}

Const fold_gather(const Const& data, const Const& idx, int64_t axis) {
  axis = axis_of(axis, data.dims.size());
  const int64_t dim = data.dims[size_t(axis)];
  Shape dims(data.dims.begin(), data.dims.begin() + axis);
  dims.insert(dims.end(), idx.dims.begin(), idx.dims.end());
  dims.insert(dims.end(), data.dims.begin() + axis + 1, data.dims.end());
  check_folded(dims, data.numel() + idx.numel());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= data.dims[size_t(d)];
  for (size_t d = size_t(axis) + 1; d < data.dims.size(); ++d) inner *= data.dims[d];
  std::vector<int64_t> at;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i : idx.i) {
      if (i < -dim || i >= dim)
        bad("index {} is out of range for axis {} of size {}", i, axis, dim);
      if (i < 0) i += dim;
      for (int64_t k = 0; k < inner; ++k) at.push_back((o * dim + i) * inner + k);
    }
  return take(data, dims, at);
}

// To FLOAT, INT64, INT32 or BOOL (the handler refuses other types).
Const fold_cast(const Const& c, int64_t to) {
  Const r;
  r.dims = c.dims;
  if (to == TensorProto::FLOAT) {
    r.f = c.is_float() ? c.f : std::vector<float>(c.i.begin(), c.i.end());
    return r;
  }
  r.dtype = int32_t(to);
  if (c.is_float()) {
    for (float v : c.f) {
      // Float to integer truncates toward zero; out-of-range values are undefined in ONNX.
      if (!(std::fabs(v) < 9.2e18f)) bad("cannot cast {} to {}", v, dtype_str(int(to)));
      r.i.push_back(int64_t(v));
    }
  } else {
    r.i = c.i;
  }
  for (int64_t& v : r.i) {
    if (to == TensorProto::INT32) v = int64_t(int32_t(uint32_t(uint64_t(v))));
    if (to == TensorProto::BOOL) v = v != 0;
  }
  return r;
}

}  // namespace epilog::onnx_import

#endif  // EPILOG_HAVE_ONNX
