// safetensors: an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
// shape and byte range, then the data (https://github.com/huggingface/safetensors).
#include "epilog/io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <vector>

#include <nlohmann/json.hpp>

#include "file.h"

namespace epilog {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the readers memcpy little-endian data");

// The reference implementation refuses headers above 100 MB; so do we, before parsing them.
constexpr uint64_t kMaxHeader = 100'000'000;

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  float f;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24 is exact in float32
    f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  // Rebias the exponent (15 -> 127); all-ones stays all-ones for inf and NaN.
  uint32_t bits = sign | (exp == 0x1f ? 0x7f800000u : (exp + 112) << 23) | (mant << 13);
  std::memcpy(&f, &bits, 4);
  return f;
}

float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A JSON value in a message, short enough to read. Nested values are only described: dump()
// recurses, and a hostile file can nest deeper than the stack.
std::string brief(const nlohmann::json& j) {
  if (j.is_structured() &&
      std::any_of(j.begin(), j.end(), [](const nlohmann::json& e) { return e.is_structured(); }))
    return j.is_array() ? "a nested list" : "an object";
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

uint64_t json_uint(const nlohmann::json& j, const std::string& source, const std::string& name,
                   const char* field) {
  if (!j.is_number_unsigned() && !(j.is_number_integer() && j.get<int64_t>() >= 0))
    fail("{}: tensor '{}': {} holds {}, expected a non-negative integer", source, name, field,
         brief(j));
  return j.get<uint64_t>();
}

Entry parse_entry(const std::string& name, const nlohmann::json& e, const std::string& source,
                  uint64_t buffer_size) {
  if (!e.is_object()) fail("{}: tensor '{}': header entry is not an object", source, name);
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!e.contains(key)) fail("{}: tensor '{}': header entry has no \"{}\"", source, name, key);
  Entry out{name, DType::F32, {}, 0, 0};
  const auto& dtype = e.at("dtype");
  std::string dt = dtype.is_string() ? dtype.get<std::string>().substr(0, 40) : brief(dtype);
  if (dt == "F32")
    out.dtype = DType::F32;
  else if (dt == "F16")
    out.dtype = DType::F16;
  else if (dt == "BF16")
    out.dtype = DType::BF16;
  else
    fail("{}: tensor '{}' has dtype {}, which epilog does not read (it reads F32, F16 and BF16)",
         source, name, dt);

  const auto& shape = e.at("shape");
  if (!shape.is_array()) fail("{}: tensor '{}': shape is not a list", source, name);
  // Left to right, as shape_numel multiplies, so that nothing later can overflow either.
  uint64_t numel = 1;
  for (const auto& d : shape) {
    uint64_t v = json_uint(d, source, name, "shape");
    if (v > uint64_t(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(numel, v, &numel) ||
        numel > uint64_t(std::numeric_limits<int64_t>::max()))
      fail("{}: tensor '{}': shape {} is too large", source, name, brief(shape));
    out.shape.push_back(static_cast<int64_t>(v));
  }

  const auto& offsets = e.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2)
    fail("{}: tensor '{}': data_offsets is {}, expected [begin, end]", source, name,
         brief(offsets));
  out.begin = json_uint(offsets[0], source, name, "data_offsets");
  out.end = json_uint(offsets[1], source, name, "data_offsets");
  if (out.begin > out.end)
    fail("{}: tensor '{}': data_offsets [{}, {}] end before they begin", source, name, out.begin,
         out.end);
  if (out.end > buffer_size)
    fail("{}: tensor '{}': data_offsets [{}, {}] are outside the {}-byte data buffer", source, name,
         out.begin, out.end, buffer_size);
  uint64_t bytes;
  bool overflow = __builtin_mul_overflow(numel, uint64_t(dtype_size(out.dtype)), &bytes);
  if (overflow || bytes != out.end - out.begin)
    fail("{}: tensor '{}': shape {} of {} needs {} bytes but data_offsets [{}, {}] hold {}", source,
         name, shape_str(out.shape), dt, overflow ? "over 2^64" : std::to_string(bytes), out.begin,
         out.end, out.end - out.begin);
  return out;
}

Tensor decode(const Entry& e, const uint8_t* buffer) {
  Tensor t = Tensor::empty(e.shape);
  const uint8_t* src = buffer + e.begin;
  float* dst = t.f32();
  const int64_t n = t.numel();
  if (e.dtype == DType::F32) {
    if (n) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
    return t;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = e.dtype == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
  return t;
}

}  // namespace

std::map<std::string, Tensor> parse_safetensors(const uint8_t* data, size_t size,
                                                const std::string& source) {
  if (size < 8) fail("{}: {} bytes is too short for a safetensors file", source, size);
  uint64_t header_len;
  std::memcpy(&header_len, data, 8);
  if (header_len > size - 8)
    fail("{}: header length {} goes past the end of the file ({} bytes)", source, header_len, size);
  if (header_len > kMaxHeader)
    fail("{}: header length {} is above the 100 MB limit", source, header_len);
  const char* text = reinterpret_cast<const char*>(data + 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, text + header_len);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: header is not valid JSON: {}", source, e.what());
  }
  if (!header.is_object()) fail("{}: header is not a JSON object", source);

  const uint8_t* buffer = data + 8 + header_len;
  const uint64_t buffer_size = size - 8 - header_len;
  std::vector<Entry> entries;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") {
      if (!e.is_object()) fail("{}: __metadata__ is not an object", source);
      continue;
    }
    entries.push_back(parse_entry(name, e, source, buffer_size));
  }

  // The format does not require the ranges to cover the buffer, only that they are disjoint.
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries)
    if (e.end > e.begin) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      fail("{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", source, by_offset[i - 1]->name,
           by_offset[i - 1]->begin, by_offset[i - 1]->end, by_offset[i]->name, by_offset[i]->begin,
           by_offset[i]->end);

  std::map<std::string, Tensor> out;
  for (const Entry& e : entries) out[e.name] = decode(e, buffer);
  return out;
}

std::map<std::string, Tensor> read_safetensors(const std::string& path) {
  const std::string bytes = read_file(path);
  return parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::vector<Tensor> host;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) fail("{}: tensor '{}' has no data", path, name);
    if (t.dtype() != DType::F32)
      fail("{}: tensor '{}' is {}; only f32 tensors are written", path, name,
           dtype_name(t.dtype()));
    host.push_back(t.to(Device::CPU));
    header[name] = {
        {"dtype", "F32"}, {"shape", t.shape()}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    fail("{}: cannot write the header: {}", path, e.what());
  }
  // Padding the header with spaces keeps the data 8-byte aligned, as the format recommends.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("{}: cannot open for writing ({})", path, std::strerror(errno));
  uint64_t len = text.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const Tensor& t : host)
    f.write(static_cast<const char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
  f.close();
  if (!f) fail("{}: write error", path);
}

}  // namespace epilog
