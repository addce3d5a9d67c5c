#include "epilog/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace epilog {
namespace {

std::shared_ptr<Storage> host_alloc(size_t bytes) {
  auto s = std::make_shared<Storage>();
  // aligned_alloc wants a size that is a multiple of the alignment.
  size_t padded = (bytes + 63) / 64 * 64;
  s->ptr = std::aligned_alloc(64, padded ? padded : 64);
  if (!s->ptr) fail("out of host memory allocating {} bytes", bytes);
  s->bytes = bytes;
  s->device = Device::CPU;
  s->release = [](void* p) { std::free(p); };
  return s;
}

AllocFn g_alloc[2] = {host_alloc, nullptr};

void host_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (dst_device != Device::CPU || src_device != Device::CPU)
    fail("copying between {} and {} needs the CUDA backend, which this build does not have",
         device_name(src_device), device_name(dst_device));
  if (bytes) std::memcpy(dst, src, bytes);
}

CopyFn g_copy = host_copy;

}  // namespace

const char* device_name(Device device) {
  return device == Device::CPU ? "cpu" : "cuda";
}

void register_allocator(Device device, AllocFn alloc) {
  g_alloc[static_cast<int>(device)] = alloc;
}
AllocFn registered_allocator(Device device) {
  return g_alloc[static_cast<int>(device)];
}
void register_copy(CopyFn copy) {
  g_copy = copy;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    if (d < 0) fail("tensor: negative dimension in shape {}", shape_str(shape));
  AllocFn alloc = g_alloc[static_cast<int>(device)];
  if (!alloc) fail("tensor: no allocator for device '{}' in this build", device_name(device));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = alloc(t.nbytes());
  return t;
}

Tensor Tensor::zeros(const Shape& shape) {
  return full(shape, 0.0f);
}

Tensor Tensor::full(const Shape& shape, float value) {
  Tensor t = empty(shape);
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = value;
  return t;
}

Tensor Tensor::from_vector(const Shape& shape, const std::vector<float>& values) {
  if (shape_numel(shape) != static_cast<int64_t>(values.size()))
    fail("tensor: {} values do not fill shape {}", values.size(), shape_str(shape));
  Tensor t = empty(shape);
  std::copy(values.begin(), values.end(), t.f32());
  return t;
}

Tensor Tensor::randn(const Shape& shape, uint64_t seed, float stddev) {
  Tensor t = empty(shape);
  Rng rng(seed);
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = rng.normal(0.0f, stddev);
  return t;
}

int64_t Tensor::dim(int i) const {
  int r = rank();
  int j = i < 0 ? i + r : i;
  EPILOG_ASSERT(j >= 0 && j < r, "dim {} of a rank-{} tensor", i, r);
  return shape_[j];
}

float* Tensor::f32() {
  EPILOG_ASSERT(defined() && dtype_ == DType::F32 && device() == Device::CPU,
                "f32() on a {} {} tensor", dtype_name(dtype_), device_name(device()));
  return static_cast<float*>(raw());
}

const float* Tensor::f32() const {
  return const_cast<Tensor*>(this)->f32();
}

Tensor Tensor::reshape(const Shape& shape) const {
  if (!contiguous())
    fail("tensor: cannot view a strided {} tensor (a part of a batch) as {}; clone() it first",
         shape_str(shape_), shape_str(shape));
  if (shape_numel(shape) != numel())
    fail("tensor: cannot view {} as {}", shape_str(shape_), shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  EPILOG_ASSERT(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0]);
  Tensor t = *this;
  t.shape_[0] = end - begin;
  if (shape_[0] > 0) t.offset_ += static_cast<size_t>(begin * item_stride()) * dtype_size(dtype_);
  if (t.shape_[0] <= 1) t.item_stride_ = 0;
  return t;
}

int64_t Tensor::item_stride() const {
  if (item_stride_ != 0) return item_stride_;
  return rank() == 0 || shape_[0] == 0 ? 0 : numel() / shape_[0];
}

Tensor Tensor::part(int64_t offset, const Shape& shape) const {
  const int64_t items = rank() == 0 ? 1 : shape_[0];
  const int64_t stride = item_stride(), count = items == 0 ? 0 : shape_numel(shape) / items;
  if (rank() < 1 || shape.empty() || shape[0] != items || offset < 0 ||
      offset + count > numel() / std::max<int64_t>(items, 1))
    fail("tensor: no part {} at offset {} in each item of a {} tensor", shape_str(shape), offset,
         shape_str(shape_));
  Tensor t = *this;
  t.shape_ = shape;
  t.offset_ += static_cast<size_t>(offset) * dtype_size(dtype_);
  t.item_stride_ = items > 1 && count != stride ? stride : 0;
  return t;
}

namespace {
// Copies src into dst item by item along dim 0 when either is strided, else in one piece.
void copy_items(Tensor& dst, const Tensor& src) {
  if (dst.contiguous() && src.contiguous()) {
    g_copy(dst.raw(), dst.device(), src.raw(), src.device(), dst.nbytes());
    return;
  }
  const int64_t items = dst.dim(0);
  const size_t item_bytes = dst.nbytes() / static_cast<size_t>(items), es = dtype_size(dst.dtype());
  for (int64_t i = 0; i < items; ++i)
    g_copy(static_cast<char*>(dst.raw()) + i * dst.item_stride() * es, dst.device(),
           static_cast<const char*>(src.raw()) + i * src.item_stride() * es, src.device(),
           item_bytes);
}
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  if (src.shape() != shape_ || src.dtype() != dtype_)
    fail("tensor: cannot copy a {} {} tensor into a {} {} one", dtype_name(src.dtype()),
         shape_str(src.shape()), dtype_name(dtype_), shape_str(shape_));
  copy_items(*this, src);
}

Tensor Tensor::clone() const {
  return to(device(), true);
}

Tensor Tensor::to(Device device, bool force_copy) const {
  if (!force_copy && device == this->device()) return *this;
  Tensor t = empty(shape_, dtype_, device);
  copy_items(t, *this);
  return t;
}

}  // namespace epilog
