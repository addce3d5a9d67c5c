// Reading and writing safetensors files, the weights format of PyTorch and Hugging Face.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "epilog/tensor.h"

namespace epilog {

// Tensors by name, as float32 on the host: F16 and BF16 are widened on load, other dtypes are an
// error. "__metadata__" is skipped. Every problem (truncated file, bad header, offsets outside
// the data or overlapping, shape that does not match its byte range) throws an Error that
// starts with the file name and names the tensor.
std::map<std::string, Tensor> read_safetensors(const std::string& path);

// The same for bytes in memory; `source` names them in messages.
std::map<std::string, Tensor> parse_safetensors(const uint8_t* data, size_t size,
                                                const std::string& source);

// Writes float32 tensors (from any device) as F32, in name order, with no gaps.
void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors);

}  // namespace epilog
