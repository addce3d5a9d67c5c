#include "file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "epilog/common.h"

namespace epilog {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open ({})", path, std::strerror(errno));
  std::error_code ec;
  // A directory opens as a stream too; reading it would fail without saying why.
  if (!std::filesystem::is_regular_file(path, ec)) fail("{}: not a regular file", path);
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) fail("{}: cannot read its size ({})", path, ec.message());
  // Read straight into the result: weight files run to hundreds of megabytes.
  std::string bytes(size, '\0');
  f.read(bytes.data(), static_cast<std::streamsize>(size));
  if (static_cast<uintmax_t>(f.gcount()) != size) fail("{}: read error", path);
  return bytes;
}

}  // namespace epilog
