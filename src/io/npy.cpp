// .npy: a magic string, a version, a header that is a Python dict literal
// {'descr': '<f4', 'fortran_order': False, 'shape': (1, 3), } padded with spaces, then the data
// (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html).
#include "epilog/io/npy.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <string_view>
#include <vector>

#include "file.h"

namespace epilog {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the readers memcpy little-endian data");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

// Header text for messages: printable, and short.
std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 120)) {
    if (c >= 0x20 && c < 0x7f)
      out += c;
    else
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
  }
  return s.size() > 120 ? out + "..." : out;
}

// The values a .npy header holds: strings, booleans and tuples of non-negative ints.
struct PyValue {
  enum Kind { Str, Bool, Tuple } kind = Str;
  std::string str;
  bool flag = false;
  Shape tuple;
};

// A recursive-descent parser for the one dict literal of a header. It walks the text once,
// left to right, so that no input can make it slow.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& source) : text_(text), source_(source) {}

  std::map<std::string, PyValue> dict() {
    std::map<std::string, PyValue> out;
    skip_space();
    expect('{');
    while (true) {
      skip_space();
      if (eat('}')) break;
      if (peek() != '\'' && peek() != '"') error("expected a quoted key");
      std::string key = string_literal();
      skip_space();
      expect(':');
      skip_space();
      PyValue v = value(key);
      if (!out.emplace(key, std::move(v)).second) error(fmt::format("key '{}' appears twice", key));
      skip_space();
      if (eat(',')) continue;
      expect('}');
      break;
    }
    skip_space();
    if (pos_ != text_.size()) error("unexpected text after the dict");
    return out;
  }

 private:
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool eat(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) return ++pos_, true;
    return false;
  }
  void expect(char c) {
    if (!eat(c)) error(fmt::format("expected '{}'", c));
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\t' || text_[pos_] == '\r'))
      ++pos_;
  }
  [[noreturn]] void error(const std::string& what) const {
    fail("{}: malformed header at character {}: {} (header: {})", source_, pos_, what,
         printable(text_));
  }

  std::string string_literal() {
    char quote = text_[pos_++];
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) error("unterminated string");
      char c = text_[pos_++];
      if (c == quote) return out;
      if (c == '\\') {
        if (pos_ >= text_.size()) error("unterminated string");
        c = text_[pos_++];
      }
      out += c;
    }
  }

  int64_t integer() {
    if (peek() == '-') error("negative dimension");
    if (peek() < '0' || peek() > '9') error("expected an integer");
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      int digit = text_[pos_++] - '0';
      if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) error("integer is too large");
      v = v * 10 + digit;
    }
    if (peek() == 'L' || peek() == 'l') ++pos_;  // Python 2 longs: (3L, 4L)
    return v;
  }

  PyValue value(const std::string& key) {
    PyValue v;
    char c = peek();
    if (c == '\'' || c == '"') {
      v.str = string_literal();
    } else if (eat('(')) {
      v.kind = PyValue::Tuple;
      skip_space();
      while (!eat(')')) {
        v.tuple.push_back(integer());
        skip_space();
        if (eat(',')) {
          skip_space();
        } else if (peek() != ')') {
          error("expected ',' or ')' in a tuple");
        }
      }
    } else if (text_.substr(pos_, 4) == "True" || text_.substr(pos_, 5) == "False") {
      v.kind = PyValue::Bool;
      v.flag = text_[pos_] == 'T';
      pos_ += v.flag ? 4 : 5;
    } else if (c == '[') {
      error(fmt::format("'{}' is a list (a structured dtype?); epilog reads plain '<f4' arrays",
                        key));
    } else {
      error(fmt::format("unsupported value for '{}'", key));
    }
    return v;
  }

  std::string_view text_;
  const std::string& source_;
  size_t pos_ = 0;
};

}  // namespace

Tensor parse_npy(const uint8_t* data, size_t size, const std::string& source) {
  if (size < kMagicLen + 4 || std::memcmp(data, kMagic, kMagicLen) != 0)
    fail("{}: not a .npy file (no \\x93NUMPY magic)", source);
  const int major = data[6], minor = data[7];
  size_t start, header_len;
  if (major == 1) {
    start = 10;
    header_len = data[8] | static_cast<size_t>(data[9]) << 8;
  } else if (major == 2 || major == 3) {
    start = 12;
    if (size < start) fail("{}: truncated: {} bytes end inside the header length", source, size);
    header_len = data[8] | static_cast<size_t>(data[9]) << 8 | static_cast<size_t>(data[10]) << 16 |
                 static_cast<size_t>(data[11]) << 24;
  } else {
    fail("{}: unsupported .npy format version {}.{} (epilog reads 1.0, 2.0 and 3.0)", source, major,
         minor);
  }
  if (header_len > size - start)
    fail("{}: truncated: the header is {} bytes but only {} follow", source, header_len,
         size - start);
  std::string_view text(reinterpret_cast<const char*>(data + start), header_len);
  std::map<std::string, PyValue> header = HeaderParser(text, source).dict();

  for (const auto& [key, v] : header)
    if (key != "descr" && key != "fortran_order" && key != "shape")
      fail("{}: unexpected header key '{}' (header: {})", source, key, printable(text));
  auto field = [&](const char* key, PyValue::Kind kind, const char* kind_name) -> const PyValue& {
    auto it = header.find(key);
    if (it == header.end())
      fail("{}: header has no '{}' (header: {})", source, key, printable(text));
    if (it->second.kind != kind) fail("{}: header '{}' is not {}", source, key, kind_name);
    return it->second;
  };
  const std::string& descr = field("descr", PyValue::Str, "a string").str;
  if (descr != "<f4")
    fail("{}: dtype '{}' is not supported; epilog reads '<f4' (little-endian float32) only", source,
         printable(descr));
  if (field("fortran_order", PyValue::Bool, "True or False").flag)
    fail(
        "{}: fortran_order is True; epilog reads C-order arrays only (save with "
        "np.ascontiguousarray)",
        source);
  const Shape& shape = field("shape", PyValue::Tuple, "a tuple").tuple;

  uint64_t numel = 1, bytes;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) ||
        __builtin_mul_overflow(numel, uint64_t(4), &bytes) ||
        numel > uint64_t(std::numeric_limits<int64_t>::max()))
      fail("{}: shape {} is too large", source, shape_str(shape));
  bytes = numel * 4;
  const size_t have = size - start - header_len;
  if (bytes > have)
    fail("{}: truncated: shape {} of float32 needs {} bytes of data but the file has {}", source,
         shape_str(shape), bytes, have);
  if (bytes < have)
    fail("{}: {} bytes after the data of shape {} (a wrong shape or dtype in the header?)", source,
         have - bytes, shape_str(shape));
  Tensor t = Tensor::empty(shape);
  if (bytes) std::memcpy(t.raw(), data + start + header_len, bytes);
  return t;
}

Tensor read_npy(const std::string& path) {
  const std::string bytes = read_file(path);
  return parse_npy(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
}

void write_npy(const std::string& path, const Tensor& tensor) {
  if (!tensor.defined()) fail("{}: tensor has no data", path);
  if (tensor.dtype() != DType::F32)
    fail("{}: tensor is {}; only f32 tensors are written", path, dtype_name(tensor.dtype()));
  Tensor host = tensor.to(Device::CPU);
  std::string dims = fmt::format("{}", fmt::join(host.shape(), ", "));
  if (host.rank() == 1) dims += ",";
  std::string header =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", dims);
  // NumPy pads the header with spaces so that the data starts 64-byte aligned.
  size_t prefix = header.size() + 1 + 10 > 65535 ? 12 : 10;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header += '\n';

  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("{}: cannot open for writing ({})", path, std::strerror(errno));
  f.write(kMagic, kMagicLen);
  if (prefix == 10) {
    const char v[4] = {1, 0, static_cast<char>(header.size() & 0xff),
                       static_cast<char>(header.size() >> 8)};
    f.write(v, 4);
  } else {
    uint32_t len = static_cast<uint32_t>(header.size());
    const char v[2] = {2, 0};
    f.write(v, 2);
    f.write(reinterpret_cast<const char*>(&len), 4);
  }
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(static_cast<const char*>(host.raw()), static_cast<std::streamsize>(host.nbytes()));
  f.close();
  if (!f) fail("{}: write error", path);
}

}  // namespace epilog
