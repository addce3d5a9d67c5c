// Tensor decoding for the ONNX importer: a TensorProto (typed fields, raw_data or an external
// data file) becomes a Const. See onnx_import.h.
#ifdef EPILOG_HAVE_ONNX

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "onnx_import.h"

namespace epilog::onnx_import {

namespace fs = std::filesystem;
using onnx::TensorProto;

namespace {
float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (man << 13);  // inf, nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while (!(man & 0x400));
    bits = sign | (uint32_t(112 - e) << 23) | ((man & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

size_t dtype_bytes(int dtype) {
  switch (dtype) {
    case TensorProto::FLOAT:
    case TensorProto::INT32:
      return 4;
    case TensorProto::INT64:
      return 8;
    case TensorProto::FLOAT16:
    case TensorProto::BFLOAT16:
    case TensorProto::INT16:
    case TensorProto::UINT16:
      return 2;
    default:
      return 1;  // INT8, UINT8, BOOL
  }
}

void from_bytes(Const& c, int dtype, const char* p, int64_t n) {
  auto get = [&](auto type_tag, int64_t k) {
    decltype(type_tag) v;
    std::memcpy(&v, p + k * int64_t(sizeof v), sizeof v);
    return v;
  };
  for (int64_t k = 0; k < n; ++k) {
    switch (dtype) {
      case TensorProto::FLOAT:
        c.f.push_back(get(float{}, k));
        break;
      case TensorProto::FLOAT16:
        c.f.push_back(f16_to_f32(get(uint16_t{}, k)));
        break;
      case TensorProto::BFLOAT16:
        c.f.push_back(bf16_to_f32(get(uint16_t{}, k)));
        break;
      case TensorProto::INT64:
        c.i.push_back(get(int64_t{}, k));
        break;
      case TensorProto::INT32:
        c.i.push_back(get(int32_t{}, k));
        break;
      case TensorProto::INT16:
        c.i.push_back(get(int16_t{}, k));
        break;
      case TensorProto::UINT16:
        c.i.push_back(get(uint16_t{}, k));
        break;
      case TensorProto::INT8:
        c.i.push_back(get(int8_t{}, k));
        break;
      default:  // UINT8, BOOL
        c.i.push_back(get(uint8_t{}, k));
        break;
    }
  }
}

}  // namespace

std::string dtype_str(int dtype) {
  if (onnx::TensorProto_DataType_IsValid(dtype)) return onnx::TensorProto_DataType_Name(dtype);
  return fmt::format("dtype {}", dtype);
}

std::string attr_type_str(int type) {
  if (onnx::AttributeProto_AttributeType_IsValid(type))
    return onnx::AttributeProto_AttributeType_Name(type);
  return fmt::format("type {}", type);
}

int64_t checked_numel(const Shape& dims, int64_t limit) {
  int64_t n = 1;
  bool zero = false;
  for (int64_t d : dims) {
    if (d < 0 || d > limit) return -1;
    zero = zero || d == 0;
  }
  if (zero) return 0;
  for (int64_t d : dims)
    if (__builtin_mul_overflow(n, d, &n) || n > limit) return -1;
  return n;
}

std::vector<int64_t> strides_of(const Shape& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t d = dims.size(); d-- > 1;) s[d - 1] = s[d] * dims[d];
  return s;
}

bool is_int_dtype(int dtype) {
  switch (dtype) {
    case TensorProto::INT64:
    case TensorProto::INT32:
    case TensorProto::INT16:
    case TensorProto::INT8:
    case TensorProto::UINT16:
    case TensorProto::UINT8:
    case TensorProto::BOOL:
      return true;
    default:
      return false;
  }
}

Const int_const(Shape dims, std::vector<int64_t> values) {
  Const c;
  c.dtype = TensorProto::INT64;
  c.dims = std::move(dims);
  c.i = std::move(values);
  return c;
}

Const take(const Const& src, Shape dims, const std::vector<int64_t>& at) {
  Const out;
  out.dtype = src.dtype;
  out.dims = std::move(dims);
  if (src.is_float()) {
    out.f.reserve(at.size());
    for (int64_t k : at) out.f.push_back(src.f[size_t(k)]);
  } else {
    out.i.reserve(at.size());
    for (int64_t k : at) out.i.push_back(src.i[size_t(k)]);
  }
  return out;
}

Const TensorReader::read(const TensorProto& t, const std::string& what) const {
  Const c;
  const int dtype = t.data_type();
  if (dtype != TensorProto::FLOAT && dtype != TensorProto::FLOAT16 &&
      dtype != TensorProto::BFLOAT16 && !is_int_dtype(dtype))
    throw OnnxUnsupported(fmt::format(
        "{}: {}: dtype {} is not supported (epilog reads float32, float16 and bfloat16 tensors, "
        "and integer constants for shape arithmetic)",
        source_, what, dtype_str(dtype)));
  if (t.has_segment())
    throw OnnxUnsupported(
        fmt::format("{}: {}: segmented tensors are not supported", source_, what));
  if (size_t(t.dims_size()) > kMaxRank)
    fail("{}: {}: has {} dims, more than epilog's limit of {}", source_, what, t.dims_size(),
         kMaxRank);
  for (int64_t d : t.dims()) c.dims.push_back(d);
  const int64_t n = checked_numel(c.dims, kMaxNumel);
  if (n < 0) fail("{}: {}: dims {} are negative or too large", source_, what, shape_str(c.dims));
  // Integer types compute as int64 but keep their name for messages.
  c.dtype = is_int_dtype(dtype) ? dtype : int32_t(TensorProto::FLOAT);
  const size_t size = dtype_bytes(dtype);

  std::string external;
  const std::string* raw = nullptr;
  if (t.data_location() == TensorProto::EXTERNAL) {
    external = read_external(t, what, size_t(n) * size);
    raw = &external;
  } else if (t.has_raw_data()) {
    raw = &t.raw_data();
  }
  if (raw) {
    if (raw->size() != size_t(n) * size)
      fail("{}: {}: holds {} bytes of data, expected {} for {} {}", source_, what, raw->size(),
           size_t(n) * size, dtype_str(dtype), shape_str(c.dims));
    from_bytes(c, dtype, raw->data(), n);
    return c;
  }
  auto count = [&](int got) {
    if (int64_t(got) != n)
      fail("{}: {}: holds {} values, expected {} for shape {}", source_, what, got, n,
           shape_str(c.dims));
  };
  switch (dtype) {
    case TensorProto::FLOAT:
      count(t.float_data_size());
      c.f.assign(t.float_data().begin(), t.float_data().end());
      break;
    case TensorProto::INT64:
      count(t.int64_data_size());
      c.i.assign(t.int64_data().begin(), t.int64_data().end());
      break;
    case TensorProto::FLOAT16:
    case TensorProto::BFLOAT16:
      // The 16 bits of each value sit in the low half of an int32_data entry.
      count(t.int32_data_size());
      for (int32_t v : t.int32_data())
        c.f.push_back(dtype == TensorProto::FLOAT16 ? f16_to_f32(uint16_t(v))
                                                    : bf16_to_f32(uint16_t(v)));
      break;
    default:  // the narrow integer types and BOOL live in int32_data
      count(t.int32_data_size());
      c.i.assign(t.int32_data().begin(), t.int32_data().end());
      break;
  }
  return c;
}

// The bytes of an external tensor: "location" relative to the model's folder, "offset" and
// "length" in bytes.
std::string TensorReader::read_external(const TensorProto& t, const std::string& what,
                                        size_t bytes) const {
  std::string location, offset_text, length_text;
  for (const auto& e : t.external_data()) {
    if (e.key() == "location") location = e.value();
    if (e.key() == "offset") offset_text = e.value();
    if (e.key() == "length") length_text = e.value();
  }
  auto where = [&] { return fmt::format("{}: {}: external data", source_, what); };
  if (location.empty()) fail("{} has no 'location'", where());
  fs::path rel(location);
  // As the ONNX checker demands: the data stays in the model's folder.
  bool escapes = rel.is_absolute() || rel.has_root_name();
  for (const auto& part : rel) escapes = escapes || part == "..";
  if (escapes)
    fail("{}: location '{}' must be a relative path inside the model's folder", where(), location);
  auto number = [&](const std::string& text, const char* key) -> uint64_t {
    if (text.empty()) return 0;
    uint64_t v = 0;
    for (char ch : text) {
      if (ch < '0' || ch > '9' || v > (std::numeric_limits<uint64_t>::max() - 9) / 10)
        fail("{}: '{}' is '{}', expected a byte count", where(), key, text);
      v = v * 10 + uint64_t(ch - '0');
    }
    return v;
  };
  const uint64_t offset = number(offset_text, "offset");
  if (!length_text.empty() && number(length_text, "length") != bytes)
    fail("{}: 'length' is {} but the tensor needs {} bytes", where(), length_text, bytes);
  const std::string path = (fs::path(base_dir_) / rel).string();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    fail("{}: file '{}' does not exist or is not a regular file", where(), path);
  // Nor through a link: the file itself must lie under the model's folder.
  std::error_code file_ec, folder_ec;
  const fs::path real = fs::canonical(path, file_ec);
  const fs::path folder = fs::canonical(base_dir_.empty() ? "." : base_dir_, folder_ec);
  if (file_ec || folder_ec ||
      std::mismatch(folder.begin(), folder.end(), real.begin(), real.end()).first != folder.end())
    fail("{}: file '{}' lies outside the model's folder (through a link)", where(), path);
  const uint64_t file_size = fs::file_size(path, ec);
  if (ec) fail("{}: cannot read the size of '{}' ({})", where(), path, ec.message());
  if (offset > file_size || bytes > file_size - offset)
    fail("{}: '{}' has {} bytes; the tensor needs bytes {} to {}", where(), path, file_size, offset,
         offset + bytes);
  std::ifstream f(path, std::ios::binary);
  std::string data(bytes, '\0');
  f.seekg(std::streamoff(offset));
  f.read(data.data(), std::streamsize(bytes));
  if (!f) fail("{}: cannot read '{}' ({})", where(), path, std::strerror(errno));
  return data;
}

}  // namespace epilog::onnx_import

#endif  // EPILOG_HAVE_ONNX
