// Reading and writing NumPy .npy files: test inputs and reference outputs from PyTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "epilog/tensor.h"

namespace epilog {

// A C-order little-endian float32 array ('<f4', format versions 1.0, 2.0 and 3.0). Any other
// dtype, Fortran order, a malformed header or a data size that does not match the shape throws
// an Error that starts with the file name and says what was found.
Tensor read_npy(const std::string& path);

// The same for bytes in memory; `source` names them in messages.
Tensor parse_npy(const uint8_t* data, size_t size, const std::string& source);

// Writes a float32 tensor (from any device) as version 1.0, '<f4', C order.
void write_npy(const std::string& path, const Tensor& tensor);

}  // namespace epilog
