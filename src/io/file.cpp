#include "file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "epilog/common.h"

namespace epilog {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open ({})", path, std::strerror(errno));
  std::error_code ec;
  // A directory opens as a stream too; reading it would fail without saying why.
  if (!std::filesystem::is_regular_file(path, ec)) fail("{}: not a regular file", path);
  std::stringstream bytes;
  bytes << f.rdbuf();
  if (f.bad()) fail("{}: read error", path);
  return bytes.str();
}

}  // namespace epilog
