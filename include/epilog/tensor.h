// Tensors: a dtype, a contiguous (NCHW for images) shape and shared storage on one device.
#pragma once

#include <functional>
#include <memory>

#include "epilog/common.h"

namespace epilog {

enum class Device : uint8_t { CPU, CUDA };

const char* device_name(Device device);

// Raw bytes on one device. The releasing function belongs to whichever allocator made it.
struct Storage {
  void* ptr = nullptr;
  size_t bytes = 0;
  Device device = Device::CPU;
  std::function<void(void*)> release;

  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (release) release(ptr);
  }
};

// What a device allocator throws when the device has not the bytes asked for (after releasing
// what it caches): how many were asked for, how many were free and how many the device has (0
// where unknown). The executor rethrows it naming what the bytes were for.
class OutOfMemory : public Error {
 public:
  OutOfMemory(const std::string& message, size_t bytes, size_t free, size_t total)
      : Error(message), bytes(bytes), free(free), total(total) {}
  size_t bytes, free, total;
};

// Device allocators register here; the CPU one is built in. Allocating on a device nobody
// registered (a CPU-only build asked for CUDA) is an error naming the device.
using AllocFn = std::shared_ptr<Storage> (*)(size_t bytes);
void register_allocator(Device device, AllocFn alloc);
// The one registered for `device` (null where none): tests wrap it.
AllocFn registered_allocator(Device device);

class Tensor {
 public:
  Tensor() = default;

  // Uninitialized storage. Host allocations are 64-byte aligned.
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape);
  static Tensor full(const Shape& shape, float value);
  static Tensor from_vector(const Shape& shape, const std::vector<float>& values);
  // Normally distributed float32 values: reproducible test and benchmark inputs.
  static Tensor randn(const Shape& shape, uint64_t seed, float stddev = 1.0f);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the back
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::CPU; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  // Raw pointer to the first element on whatever device holds it.
  void* raw() { return static_cast<char*>(storage_->ptr) + offset_; }
  const void* raw() const { return static_cast<const char*>(storage_->ptr) + offset_; }

  // Typed host access; checks dtype and device.
  float* f32();
  const float* f32() const;

  // Views share storage: a new shape with the same element count, or rows [begin, end) of
  // the leading dimension.
  Tensor reshape(const Shape& shape) const;
  Tensor slice(int64_t begin, int64_t end) const;

  // The items of dim 0 lie item_stride() elements apart: numel() / dim(0) for a contiguous
  // tensor, more for a part of a larger tensor's items (a channel slab of an NCHW batch).
  // Such a tensor goes only to the kernels that take a stride (convolutions, add, elementwise
  // chains, max-pooling, upsampling, concat, split, channel shuffle); copies and to() handle
  // it, reshape() refuses it.
  bool contiguous() const { return item_stride_ == 0; }
  int64_t item_stride() const;
  // Elements [offset, offset + numel(shape) / shape[0]) of every item along dim 0, as a
  // tensor of `shape` (shape[0] == dim(0)) sharing storage; contiguous when dim(0) == 1 or the
  // part is the whole item.
  Tensor part(int64_t offset, const Shape& shape) const;

  Tensor clone() const;
  // Copies the bytes of `src` (same shape and dtype, any device) into this tensor.
  void copy_from(const Tensor& src);
  // Copies to another device; returns *this when already there unless a copy is forced.
  Tensor to(Device device, bool force_copy = false) const;

  // Whether two tensors share bytes (used to keep views from being freed early).
  bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;        // bytes
  int64_t item_stride_ = 0;  // elements between items of dim 0; 0: contiguous
  Shape shape_;
  DType dtype_ = DType::F32;
};

// Copies bytes between any two devices; registered by the CUDA backend for device copies.
using CopyFn = void (*)(void* dst, Device dst_device, const void* src, Device src_device,
                        size_t bytes);
void register_copy(CopyFn copy);

}  // namespace epilog
