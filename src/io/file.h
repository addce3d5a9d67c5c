// Whole-file reads for the loaders, with errors that name the file.
#pragma once

#include <string>

namespace epilog {

// The bytes of the regular file at `path`; fails with "<path>: cannot open (<reason>)", "<path>:
// not a regular file" or "<path>: read error".
std::string read_file(const std::string& path);

}  // namespace epilog
