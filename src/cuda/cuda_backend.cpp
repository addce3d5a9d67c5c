// The CUDA backend: device discovery, the caching device allocator, host/device copies and the
// op kinds mapped to the launchers of kernels/cuda.
#include <cuda_runtime.h>

#include <array>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "epilog/kernels/cuda.h"
#include "epilog/runtime/executor.h"
#include "epilog/runtime/launch_log.h"
#include "epilog/runtime/params.h"

namespace epilog {
namespace cuda {

void check(int status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  const auto err = static_cast<cudaError_t>(status);
  cudaGetLastError();  // clear it, so that a later unrelated check does not report it again
  fail("CUDA error: {} failed: {} at {}:{}", call, cudaGetErrorString(err), file, line);
}

void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    fail("CUDA error: launch of {} failed: {}", kernel, cudaGetErrorString(err));
}

}  // namespace cuda

namespace {

// A stream capture (Backend::record) must not see another thread synchronize the device, or free
// device memory (an implicit synchronization): CUDA fails both while any stream captures. Copies,
// allocations and frees hold this lock shared, a capture holds it alone; the capturing thread's
// own allocations (its first run keeps its buffers) take no lock.
std::shared_mutex& capture_mutex() {
  static std::shared_mutex mu;
  return mu;
}
thread_local bool capturing_here = false;

std::shared_lock<std::shared_mutex> device_api_lock() {
  if (capturing_here) return {};
  return std::shared_lock<std::shared_mutex>(capture_mutex());
}

// -- the caching allocator --
// cudaMalloc and cudaFree synchronize the device and cost tens of microseconds, and the
// executor frees every intermediate right after its last reader, so freed blocks are kept in
// free lists per rounded size and handed out again. A block is reused in host order; that is
// safe because every kernel runs on a backend's stream in the same order the executor frees and
// allocates (work on two backends' streams at once must synchronize between them).
class DeviceCache {
 public:
  // Leaked on purpose: tensors held by static objects may be released after any static cache
  // would have been destroyed, and the driver reclaims device memory at exit anyway.
  static DeviceCache& get() {
    static DeviceCache* cache = new DeviceCache;
    return *cache;
  }

  // 512-byte steps up to 1 MiB keep small tensors tight; powers of two above that bound the
  // number of distinct sizes (and so the memory parked in free lists) for large activations.
  // Above 64 MiB (an executor's activation arena, made once) 2 MiB steps: a power of two would
  // waste up to half of it.
  static size_t bucket(size_t bytes) {
    constexpr size_t kSmall = 512, kLarge = size_t(1) << 20, kHuge = size_t(64) << 20;
    if (bytes <= kLarge) return bytes == 0 ? kSmall : (bytes + kSmall - 1) / kSmall * kSmall;
    if (bytes > kHuge) return (bytes + 2 * kLarge - 1) / (2 * kLarge) * (2 * kLarge);
    size_t b = kLarge;
    while (b < bytes) b <<= 1;
    return b;
  }

  std::shared_ptr<Storage> alloc(size_t bytes) {
    const size_t size = bucket(bytes);
    void* p = take(size);
    if (!p) p = fresh(size);
    auto s = std::make_shared<Storage>();
    s->ptr = p;
    s->bytes = bytes;
    s->device = Device::CUDA;
    s->release = [size](void* ptr) {
      const auto lock = device_api_lock();
      DeviceCache::get().give_back(ptr, size);
    };
    return s;
  }

 private:
  void* take(size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(size);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();  // the most recently freed block is the likeliest in L2
    it->second.pop_back();
    cached_ -= size;
    return p;
  }

  void give_back(void* p, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[size].push_back(p);
    cached_ += size;
  }

  void* fresh(size_t size) {
    void* p = nullptr;
    if (cudaMalloc(&p, size) == cudaSuccess) return p;
    cudaGetLastError();
    // Out of memory, perhaps only because blocks of other sizes sit in the free lists.
    const size_t released = trim();
    const cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free = 0, total = 0;
      if (cudaMemGetInfo(&free, &total) != cudaSuccess) cudaGetLastError();
      throw OutOfMemory(fmt::format("CUDA error: cudaMalloc of {} bytes failed: {} ({} bytes free "
                                    "of {}, after releasing {} cached bytes)",
                                    size, cudaGetErrorString(err), free, total, released),
                        size, free, total);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      fail("CUDA error: cudaMalloc of {} bytes failed: {} (after releasing {} cached bytes)", size,
           cudaGetErrorString(err), released);
    }
    return p;
  }

  size_t trim() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) cudaFree(p);
    free_.clear();
    size_t released = cached_;
    cached_ = 0;
    return released;
  }

  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
};

std::shared_ptr<Storage> device_alloc(size_t bytes) {
  const auto lock = device_api_lock();
  return DeviceCache::get().alloc(bytes);
}

// The backend's stream is non-blocking, so it does not order with the legacy default stream
// cudaMemcpy runs on. Each copy that touches the device therefore waits for all queued work
// first and for itself after (a pageable host-to-device cudaMemcpy may return before its DMA
// lands): a tensor copy is a full barrier. Copies happen at the edges of a run, where that
// costs nothing that the run's own final synchronize does not already cost.
void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::CPU && src_device == Device::CPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const cudaMemcpyKind kind = src_device == Device::CPU   ? cudaMemcpyHostToDevice
                              : dst_device == Device::CPU ? cudaMemcpyDeviceToHost
                                                          : cudaMemcpyDeviceToDevice;
  const auto lock = device_api_lock();
  EPILOG_CUDA_CHECK(cudaDeviceSynchronize());
  EPILOG_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
  EPILOG_CUDA_CHECK(cudaDeviceSynchronize());
}

// Registration touches no CUDA API, so doing it during static initialization is safe; the
// call_once in the entry points covers a program that reaches them before this file's
// initializers run.
void register_cuda() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_allocator(Device::CUDA, device_alloc);
    register_copy(device_copy);
  });
}
[[maybe_unused]] const bool g_registered = (register_cuda(), true);

// -- the kernels, keyed by op kind --

struct Ctx {
  const Node& node;
  const NodePlan& plan;
  cuda::Stream stream;
};
using In = const std::vector<Tensor>&;
using Out = std::vector<Tensor>&;
using CudaKernel = void (*)(const Ctx&, In, Out);

const float* dev(const Tensor& t) {
  return static_cast<const float*>(t.raw());
}
float* dev(Tensor& t) {
  return static_cast<float*>(t.raw());
}
const float* opt(In in, size_t i) {
  return i < in.size() ? dev(in[i]) : nullptr;
}

std::string conv_str(const ConvShape& s) {
  return fmt::format(
      "x [{},{},{},{}] w [{},{},{},{}] -> [{},{},{},{}], stride {}x{}, pad {},{}, dilation "
      "{}x{}, groups {}",
      s.n, s.c, s.h, s.w, s.k, s.groups ? s.c / s.groups : 0, s.r, s.s, s.n, s.k, s.ho, s.wo,
      s.stride_h, s.stride_w, s.pad_t, s.pad_l, s.dil_h, s.dil_w, s.groups);
}

// A conv with the one before it folded into its loads (FoldedConv): `in` is its inputs with the
// first conv's input in place of that conv's output, then the first conv's weight, scale and
// shift.
void conv_pair(const Ctx& c, In in, Out out) {
  const FoldedConv& pre = *c.plan.pre;
  if (c.node.op != OpKind::FusedConv2d || c.node.inputs.size() != 4 || in.size() != 7)
    fail(
        "[{}] node '{}': a conv pair takes a fused conv without a residual and the folded conv's "
        "input, weight, scale and shift; handed {} tensors",
        op_name(c.node.op), c.node.name, in.size());
  ConvShape a = pre.shape;
  const Shape want{a.n, a.c, a.h, a.w};
  if (in[0].shape() != want)
    fail("[{}] node '{}': the folded conv '{}' expects input {}, handed {}", op_name(c.node.op),
         c.node.name, pre.node, shape_str(want), shape_str(in[0].shape()));
  a.x_stride = in[0].item_stride();
  ConvShape b = conv_shape(c.node, {a.n, a.k, a.ho, a.wo}, in[1].shape(), out[0].shape());
  b.y_stride = out[0].item_stride();
  cuda::conv_pair(a, b, dev(in[0]), dev(in[4]), dev(in[5]), dev(in[6]), pre.act, dev(in[1]),
                  dev(in[2]), dev(in[3]), conv_activation(c.node), dev(out[0]), c.stream);
}

// A conv with the 1x1 conv after it run on its accumulators (NodePlan::post): `in` is its inputs,
// then the 1x1's weight, scale and shift (their shapes checked here; the kernel reads the copies
// lowering packed after this conv's weights), `out` the 1x1's output.
void conv_chain(const Ctx& c, In in, Out out) {
  const FoldedConv& post = *c.plan.post;
  if (c.node.op != OpKind::FusedConv2d || c.node.inputs.size() != 4 || in.size() != 7 ||
      !c.plan.packed.defined())
    fail(
        "[{}] node '{}': a conv chain takes a fused conv without a residual, its packed weights, "
        "and the 1x1 conv's weight, scale and shift; handed {} tensors",
        op_name(c.node.op), c.node.name, in.size());
  const ConvShape& b = post.shape;
  const Shape w{b.k, b.c, 1, 1}, y{b.n, b.k, b.ho, b.wo};
  if (in[4].shape() != w || in[5].shape() != Shape{b.k} || in[6].shape() != Shape{b.k} ||
      out[0].shape() != y)
    fail("[{}] node '{}': the folded 1x1 conv '{}' takes weight {} and makes {}; handed {} and {}",
         op_name(c.node.op), c.node.name, post.node, shape_str(w), shape_str(y),
         shape_str(in[4].shape()), shape_str(out[0].shape()));
  const ConvShape a = conv_shape(c.node, in, out[0]);  // out[0] has A's output shape too
  ConvShape bs = b;
  bs.y_stride = out[0].item_stride();
  cuda::conv_chain(a, c.plan.tiles, bs, dev(in[0]), dev(in[2]), dev(in[3]), conv_activation(c.node),
                   dev(c.plan.packed), post.act, dev(out[0]), c.stream);
}

void conv(const Ctx& c, In in, Out out) {
  if (c.plan.pre && in.size() > c.node.inputs.size()) return conv_pair(c, in, out);
  if (c.plan.post && in.size() > c.node.inputs.size()) return conv_chain(c, in, out);
  const ConvShape cs = conv_shape(c.node, in, out[0]);
  const Tensor* residual = conv_residual(c.node, in);
  const bool residual_first = fused_residual_first(c.node);
  const ResidualActs acts =
      split_residual_act(conv_activation(c.node), residual != nullptr, residual_first);
  const cuda::ConvResidual res(residual ? dev(*residual) : nullptr, acts.post);
  const ConvKernel k = c.plan.conv;
  if (!conv_supports(k, cs))
    fail("[{}] node '{}': the {} kernel cannot run {}", op_name(c.node.op), c.node.name,
         conv_kernel_name(k), conv_str(cs));
  const bool fused = c.node.op == OpKind::FusedConv2d;
  const float* scale = fused ? dev(in[2]) : nullptr;
  const float* shift = fused ? dev(in[3]) : opt(in, 2);
  const Act act = acts.pre;
  const float *x = dev(in[0]), *w = dev(in[1]);
  float* y = dev(out[0]);
  if (k != ConvKernel::Scalar && (c.plan.tiles.m <= 0 || c.plan.tiles.n <= 0))
    fail("[{}] node '{}': the plan picks the {} kernel but gives no tile sizes", op_name(c.node.op),
         c.node.name, conv_kernel_name(k));
  if (in.size() > c.node.inputs.size() && (k != ConvKernel::Gemm || (!c.plan.up && !c.plan.pro)))
    fail(
        "[{}] node '{}': handed the operands of a folded node, but the plan has the {} kernel "
        "read none",
        op_name(c.node.op), c.node.name, conv_kernel_name(k));
  switch (k) {
    case ConvKernel::Scalar:
      return cuda::conv_scalar(cs, x, w, scale, shift, act, y, c.stream, res);
    case ConvKernel::Tiled:
      return cuda::conv_tiled(cs, c.plan.tiles, x, w, scale, shift, act, y, c.stream, res);
    case ConvKernel::Gemv:
      return cuda::conv_gemv(cs, x, w, scale, shift, act, y, c.stream, res);
    case ConvKernel::Gemm: {
      cuda::ConvUpsampledInput up;
      const bool folded = c.plan.up && in.size() > c.node.inputs.size();
      if (folded) {
        const Tensor& source = in[c.node.inputs.size()];
        up = {dev(source),        c.plan.up->c0,      c.plan.up->channels,
              c.plan.up->scale_h, c.plan.up->scale_w, source.item_stride()};
      }
      // A prologue: x is the elementwise's input, its scale and shift follow the conv's inputs.
      cuda::ConvPrologue pro;
      const bool transformed = c.plan.pro && in.size() > c.node.inputs.size();
      if (transformed) {
        const FoldedPrologue& p = *c.plan.pro;
        const size_t want = c.node.inputs.size() + (p.scale >= 0) + (p.shift >= 0);
        if (in.size() != want)
          fail("[{}] node '{}': its prologue '{}' takes {} operands, handed {}",
               op_name(c.node.op), c.node.name, p.node, want - c.node.inputs.size(),
               in.size() - c.node.inputs.size());
        size_t at = c.node.inputs.size();
        const auto operand = [&](int k) -> const float* {
          if (k < 0) return nullptr;
          const Tensor& t = in[at++];
          if (t.numel() != cs.c)
            fail("[{}] node '{}': its prologue's operand has {} values for {} channels",
                 op_name(c.node.op), c.node.name, t.numel(), cs.c);
          return dev(t);
        };
        pro.scale = operand(p.scale);
        pro.shift = operand(p.shift);
        pro.act = p.act;
      }
      return cuda::conv_gemm(cs, c.plan.tiles, x, w, scale, shift, act, y, c.stream, res,
                             c.plan.packed.defined() ? dev(c.plan.packed) : nullptr,
                             folded ? &up : nullptr, transformed ? &pro : nullptr);
    }
  }
}

void activation(const Ctx& c, In in, Out out) {
  cuda::activation(*node_activation(c.node), in[0].numel(), dev(in[0]), dev(out[0]), c.stream);
}

void binary(const Ctx& c, In in, Out out) {
  const Binary op = *binary_kind(c.node.op);
  const Shape &a = in[0].shape(), &b = in[1].shape(), &y = out[0].shape();
  if (!in[0].contiguous() || !in[1].contiguous() || !out[0].contiguous()) {
    // Channel slabs of a batch (Tensor::part): the executor only makes them for equal shapes.
    if (a != y || b != y)
      fail("[{}] node '{}': strided operands need equal shapes, got {} and {} into {}",
           op_name(c.node.op), c.node.name, shape_str(a), shape_str(b), shape_str(y));
    const int64_t items = y[0], len = items == 0 ? 0 : out[0].numel() / items;
    return cuda::binary_items(op, items, len, dev(in[0]), in[0].item_stride(), dev(in[1]),
                              in[1].item_stride(), dev(out[0]), out[0].item_stride(), c.stream);
  }
  if (y.size() > size_t(cuda::kMaxRank))
    fail("[{}] node '{}': output {} has more than {} dims", op_name(c.node.op), c.node.name,
         shape_str(y), cuda::kMaxRank);
  cuda::BroadcastShape s{};
  s.rank = static_cast<int>(y.size());
  for (size_t i = 0; i < y.size(); ++i) {  // right-aligned: a's last dim meets y's last dim
    const size_t d = y.size() - 1 - i;
    s.a[d] = i < a.size() ? a[a.size() - 1 - i] : 1;
    s.b[d] = i < b.size() ? b[b.size() - 1 - i] : 1;
    s.out[d] = y[d];
  }
  cuda::binary(op, s, dev(in[0]), dev(in[1]), dev(out[0]), c.stream);
}

void fused_elementwise(const Ctx& c, In in, Out out) {
  const ChainShape s = chain_shape(c.node, in, out[0]);
  const float* xs[kMaxChainInputs] = {};
  for (size_t k = 0; k < in.size(); ++k) xs[k] = dev(in[k]);
  cuda::fused_elementwise(node_chain(c.node), s, xs, dev(out[0]), c.stream);
}

int64_t norm_axis(const Node& n, int rank) {
  const int64_t axis = n.attrs.i("axis");
  return axis < 0 ? axis + rank : axis;
}
// The extent t's rows step by along the axis (a Slab's rows are it times inner apart): its own, or
// for a strided part of a larger batch (its items item_stride() apart, one row per item) that
// stride / inner.
int64_t row_extent(const Tensor& t, int64_t axis, const AxisView& v) {
  if (t.contiguous()) return t.shape()[axis];
  EPILOG_ASSERT(v.outer == t.dim(0) && v.inner > 0 && t.item_stride() % v.inner == 0,
                "strided {} on axis {}", shape_str(t.shape()), axis);
  return t.item_stride() / v.inner;
}

// concat and split: one slab per part, all of them copied by one launch (copy_slabs).
void concat(const Ctx& c, In in, Out out) {
  Tensor& y = out[0];
  const int64_t axis = norm_axis(c.node, y.rank());
  const AxisView v = axis_view(y.shape(), axis);
  const int64_t extent = row_extent(y, axis, v);
  std::vector<cuda::Slab> slabs;
  int64_t offset = 0;
  for (const Tensor& x : in) {
    const int64_t count = x.shape()[axis];
    slabs.push_back({dev(x), dev(y), count * v.inner, row_extent(x, axis, v) * v.inner, 0,
                     extent * v.inner, offset * v.inner});
    offset += count;
  }
  cuda::copy_slabs(v.outer, slabs.data(), int(slabs.size()), c.stream);
}

// channel_shuffle: its inputs (the concat it reads through) in one launch.
void channel_shuffle(const Ctx& c, In in, Out out) {
  static_assert(kMaxShuffleInputs <= cuda::kMaxSlabs, "a shuffle's parts fit one launch");
  Tensor& y = out[0];
  if (y.numel() == 0) return;
  std::vector<cuda::ShufflePart> parts;
  for (const Tensor& x : in) parts.push_back({dev(x), x.dim(1), x.item_stride()});
  cuda::channel_shuffle(y.dim(0), y.numel() / (y.dim(0) * y.dim(1)), c.node.attrs.i("groups"),
                        parts.data(), int(parts.size()), dev(y), y.item_stride(), c.stream);
}

void split(const Ctx& c, In in, Out out) {
  const Tensor& x = in[0];
  const int64_t axis = norm_axis(c.node, x.rank());
  const AxisView v = axis_view(x.shape(), axis);
  const int64_t extent = row_extent(x, axis, v);
  std::vector<cuda::Slab> slabs;
  int64_t offset = 0;
  for (Tensor& y : out) {
    const int64_t count = y.shape()[axis];
    slabs.push_back({dev(x), dev(y), count * v.inner, extent * v.inner, offset * v.inner,
                     row_extent(y, axis, v) * v.inner, 0});
    offset += count;
  }
  cuda::copy_slabs(v.outer, slabs.data(), int(slabs.size()), c.stream);
}

void check_rank(const Ctx& c, const Shape& s) {
  if (s.size() > size_t(cuda::kMaxRank))
    fail("[{}] node '{}': {} has more than {} dims", op_name(c.node.op), c.node.name, shape_str(s),
         cuda::kMaxRank);
}

// transpose and slice: a strided view of x (GatherView) copied out.
void gather(const Ctx& c, In in, Out out) {
  const GatherView g = gather_view(c.node, in[0].shape());
  check_rank(c, g.sizes);
  cuda::StridedView v{};
  v.rank = static_cast<int>(g.sizes.size());
  v.offset = g.offset;
  for (size_t d = 0; d < g.sizes.size(); ++d) v.size[d] = g.sizes[d], v.stride[d] = g.strides[d];
  cuda::gather(v, dev(in[0]), dev(out[0]), c.stream);
}

void pad(const Ctx& c, In in, Out out) {
  const Shape &x = in[0].shape(), &y = out[0].shape();
  check_rank(c, x);
  const std::string& mode = c.node.attrs.s("mode");
  cuda::PadShape s{};
  s.rank = static_cast<int>(x.size());
  for (size_t d = 0; d < x.size(); ++d)
    s.in[d] = x[d], s.out[d] = y[d], s.begin[d] = c.node.attrs.ints("pads")[d];
  cuda::pad(s,
            mode == "constant"  ? PadMode::Constant
            : mode == "reflect" ? PadMode::Reflect
                                : PadMode::Edge,
            float(c.node.attrs.f("value")), dev(in[0]), dev(out[0]), c.stream);
}

void reduce(const Ctx& c, In in, Out out) {
  const Shape& x = in[0].shape();
  check_rank(c, x);
  const std::vector<bool> reduced = reduced_dims(c.node, x);
  cuda::ReduceShape s{};
  int64_t stride = 1;
  std::vector<std::pair<int64_t, int64_t>> kept, red;  // (size, stride), outermost first
  for (size_t d = x.size(); d-- > 0;) {
    (reduced[d] ? red : kept).insert((reduced[d] ? red : kept).begin(), {x[d], stride});
    stride *= x[d];
  }
  s.kept_rank = static_cast<int>(kept.size());
  s.reduced_rank = static_cast<int>(red.size());
  for (size_t i = 0; i < kept.size(); ++i)
    s.kept[i] = kept[i].first, s.kept_stride[i] = kept[i].second;
  for (size_t i = 0; i < red.size(); ++i)
    s.reduced[i] = red[i].first, s.reduced_stride[i] = red[i].second;
  cuda::reduce(*reduce_kind(c.node.op), s, dev(in[0]), dev(out[0]), c.stream);
}

void norm(const Ctx& c, In in, Out out) {
  const Tensor& x = in[0];
  cuda::RowNorm s;
  s.eps = float(c.node.attrs.f("eps"));
  if (c.node.op == OpKind::LayerNorm) {
    s.inner = axis_view(x.shape(), axis_attr(c.node, x.rank(), "last_axis")).inner;
    s.rows = axis_view(x.shape(), axis_attr(c.node, x.rank())).outer * s.inner;
    s.len = s.rows == 0 ? 0 : x.numel() / s.rows;
  } else {
    const int64_t channels = x.dim(1);
    s.groups = c.node.op == OpKind::GroupNorm ? c.node.attrs.i("groups") : channels;
    s.inner = x.numel() / (x.dim(0) * channels);
    s.rows = x.dim(0) * s.groups;
    s.len = channels / s.groups * s.inner;
  }
  cuda::row_norm(s, dev(x), dev(in[1]), opt(in, 2), dev(out[0]), c.stream);
}

void matmul(const Ctx& c, In in, Out out) {
  const Shape &a = in[0].shape(), &b = in[1].shape(), &y = out[0].shape();
  check_rank(c, y);
  cuda::MatmulShape s{};
  s.m = a[a.size() - 2], s.k = a.back(), s.n = b.back();
  s.batch_rank = static_cast<int>(y.size()) - 2;
  int64_t step_a = s.m * s.k, step_b = s.k * s.n;
  for (int i = 0; i < s.batch_rank; ++i) {  // from the back, where batch dims align
    const int d = s.batch_rank - 1 - i;
    const int64_t da = size_t(i) + 2 < a.size() ? a[a.size() - 3 - size_t(i)] : 1;
    const int64_t db = size_t(i) + 2 < b.size() ? b[b.size() - 3 - size_t(i)] : 1;
    s.batch[d] = y[size_t(d)];
    s.a_stride[d] = da == 1 ? 0 : step_a;
    s.b_stride[d] = db == 1 ? 0 : step_b;
    step_a *= da;
    step_b *= db;
  }
  cuda::matmul(s, dev(in[0]), dev(in[1]), dev(out[0]), c.stream);
}

const std::array<CudaKernel, kNumOps>& kernels() {
  static const std::array<CudaKernel, kNumOps> table = [] {
    std::array<CudaKernel, kNumOps> t{};
    auto at = [&t](OpKind op) -> CudaKernel& { return t[static_cast<size_t>(op)]; };
    at(OpKind::Conv2d) = conv;
    at(OpKind::FusedConv2d) = conv;
    at(OpKind::BatchNorm) = [](const Ctx& c, In in, Out out) {
      const Tensor& x = in[0];
      const int64_t outer = x.dim(0), channels = x.dim(1);
      const int64_t inner = outer * channels == 0 ? 0 : x.numel() / (outer * channels);
      cuda::batchnorm(outer, channels, inner, dev(x), dev(in[1]), dev(in[2]), dev(in[3]),
                      dev(in[4]), static_cast<float>(c.node.attrs.f("eps")), dev(out[0]), c.stream);
    };
    for (int op = 0; op < kNumOps; ++op)
      if (is_activation_op(OpKind(op))) t[size_t(op)] = activation;
    for (int op = 0; op < kNumOps; ++op)
      if (binary_kind(OpKind(op))) t[size_t(op)] = binary;
    at(OpKind::FusedElementwise) = fused_elementwise;
    at(OpKind::Concat) = concat;
    at(OpKind::Split) = split;
    at(OpKind::MaxPool2d) = [](const Ctx& c, In in, Out out) {
      const PoolShape p = pool_shape(c.node, in[0], out[0]);
      if (out.size() == 1) return cuda::maxpool2d(p, dev(in[0]), dev(out[0]), c.stream);
      // The pools chained after this one (NodePlan::chain), each pooling the one before.
      if (out.size() > size_t(kMaxPoolChain) || out.size() != c.plan.chain.size() + 1)
        fail("[maxpool2d] node '{}': handed {} outputs for a chain of {}", c.node.name, out.size(),
             c.plan.chain.size() + 1);
      float* ys[kMaxPoolChain];
      int64_t images[kMaxPoolChain];
      for (size_t q = 0; q < out.size(); ++q) {
        if (out[q].shape() != out[0].shape())
          fail("[maxpool2d] node '{}': chained output {} has shape {}, not {}", c.node.name, q,
               shape_str(out[q].shape()), shape_str(out[0].shape()));
        ys[q] = dev(out[q]);
        images[q] = out[q].item_stride();
      }
      cuda::maxpool2d_chain(p, dev(in[0]), ys, images, int(out.size()), c.stream);
    };
    at(OpKind::AvgPool2d) = [](const Ctx& c, In in, Out out) {
      cuda::avgpool2d(pool_shape(c.node, in[0], out[0]), dev(in[0]), dev(out[0]),
                      c.stream);
    };
    at(OpKind::GlobalAvgPool) = [](const Ctx& c, In in, Out out) {
      const Tensor& x = in[0];
      const int64_t outer = x.dim(0) * x.dim(1);
      cuda::global_avgpool(outer, outer == 0 ? 0 : x.numel() / outer, dev(x), dev(out[0]),
                           c.stream);
    };
    at(OpKind::UpsampleNearest) = [](const Ctx& c, In in, Out out) {
      const Shape& x = in[0].shape();
      const auto& s = c.node.attrs.ints("scale");
      cuda::upsample_nearest(x[0], x[1], x[2], x[3], s[0], s[1], dev(in[0]), in[0].item_stride(),
                             dev(out[0]), out[0].item_stride(), c.stream);
    };
    at(OpKind::Flatten) = [](const Ctx&, In in, Out out) {
      out[0] = in[0].reshape(out[0].shape());
    };
    at(OpKind::Linear) = [](const Ctx& c, In in, Out out) {
      const Tensor &x = in[0], &w = in[1];
      const int64_t k = w.dim(1), rows = k == 0 ? 0 : x.numel() / k;  // x [..., k]
      cuda::linear(rows, w.dim(0), k, dev(x), dev(w), opt(in, 2), dev(out[0]), c.stream);
    };
    at(OpKind::Transpose) = gather;
    at(OpKind::Slice) = gather;
    at(OpKind::ChannelShuffle) = channel_shuffle;
    for (OpKind op : {OpKind::DepthToSpace, OpKind::SpaceToDepth})
      at(op) = [](const Ctx& c, In in, Out out) {
        const bool to_space = c.node.op == OpKind::DepthToSpace;
        const Shape& deep = (to_space ? in[0] : out[0]).shape();
        const Shape& wide = (to_space ? out[0] : in[0]).shape();
        const auto& b = c.node.attrs.ints("blocksize");
        const int64_t crop_t = to_space ? c.node.attrs.ints("crop")[0] : 0;
        const int64_t crop_l = to_space ? c.node.attrs.ints("crop")[1] : 0;
        const cuda::DepthSpace s{
            wide[0], wide[1], deep[2], deep[3], b[0], b[1], c.node.attrs.s("mode") == "CRD",
            wide[2], wide[3], crop_t,  crop_l};
        cuda::depth_space(s, to_space, dev(in[0]), dev(out[0]), c.stream);
      };
    at(OpKind::Reshape) = at(OpKind::Flatten);
    at(OpKind::Pad) = pad;
    at(OpKind::ReduceMean) = reduce;
    at(OpKind::ReduceSum) = reduce;
    at(OpKind::ReduceMax) = reduce;
    at(OpKind::ReduceMin) = reduce;
    at(OpKind::ReduceProd) = reduce;
    at(OpKind::Softmax) = [](const Ctx& c, In in, Out out) {
      const Tensor& x = in[0];
      const int64_t axis = axis_attr(c.node, x.rank());
      const AxisView v = axis_view(x.shape(), axis);
      cuda::softmax(v.outer, x.dim(int(axis)), v.inner, dev(x), dev(out[0]), c.stream,
                    c.node.op == OpKind::LogSoftmax);
    };
    at(OpKind::LogSoftmax) = at(OpKind::Softmax);
    at(OpKind::LayerNorm) = norm;
    at(OpKind::GroupNorm) = norm;
    at(OpKind::InstanceNorm) = norm;
    at(OpKind::Resize) = [](const Ctx& c, In in, Out out) {
      const Tensor &x = in[0], &y = out[0];
      const int64_t h = x.dim(-2), w = x.dim(-1);
      cuda::resize(x.numel() / (h * w), h, w, y.dim(-2), y.dim(-1), resize_mode(c.node), dev(x),
                   dev(out[0]), c.stream);
    };
    at(OpKind::MatMul) = matmul;
    at(OpKind::ConvTranspose2d) = [](const Ctx& c, In in, Out out) {
      cuda::conv_transpose2d(conv_shape(c.node, in[0].shape(), in[1].shape(), out[0].shape()),
                             dev(in[0]), dev(in[1]), opt(in, 2), dev(out[0]), c.stream);
    };
    return t;
  }();
  return table;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend() { EPILOG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~CudaBackend() override {
    // No throwing from a destructor: errors of queued work were for synchronize() to report.
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    cudaGetLastError();
  }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::CUDA; }

  void run(const Node& node, const NodePlan& plan, const std::vector<Tensor>& inputs,
           std::vector<Tensor>& outputs) override {
    CudaKernel k = kernels()[static_cast<size_t>(node.op)];
    if (!k) fail("[{}] has no CUDA implementation", op_name(node.op));
    // A host pointer handed to a kernel would surface only later as an illegal address.
    auto check = [&](const Tensor& t, const char* what, size_t i) {
      if (t.device() != Device::CUDA || t.dtype() != DType::F32)
        fail("[{}] node '{}': {} {} is a {} tensor on {}, expected f32 on cuda", op_name(node.op),
             node.name, what, i, dtype_name(t.dtype()), device_name(t.device()));
    };
    for (size_t i = 0; i < inputs.size(); ++i) check(inputs[i], "input", i);
    for (size_t i = 0; i < outputs.size(); ++i) check(outputs[i], "output", i);
    // The launches the kernel logs are this node's.
    if (LaunchLog* log = LaunchLog::current()) log->set_node(node.name);
    try {
      k(Ctx{node, plan, stream_}, inputs, outputs);
    } catch (const std::invalid_argument& e) {
      // A launcher that cannot run what the plan and launch.h say refuses: name the node.
      fail("[{}] node '{}': {}", op_name(node.op), node.name, e.what());
    }
  }

  void synchronize() override { EPILOG_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  void copy(const Tensor& src, Tensor& dst) override {
    if (src.device() != Device::CUDA || dst.device() != Device::CUDA || !src.contiguous() ||
        !dst.contiguous())
      return dst.copy_from(src);
    if (src.shape() != dst.shape() || src.dtype() != dst.dtype())
      fail("copy: a {} {} tensor into a {} {} one", dtype_name(src.dtype()),
           shape_str(src.shape()), dtype_name(dst.dtype()), shape_str(dst.shape()));
    EPILOG_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(),
                                      cudaMemcpyDeviceToDevice, stream_));
  }

  // A CUDA graph of everything `body` launches on the stream: one launch replays a model.
  class GraphRecording final : public Recording {
   public:
    GraphRecording(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
    ~GraphRecording() override { cudaGraphExecDestroy(exec_); }
    void replay() override { EPILOG_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

   private:
    cudaGraphExec_t exec_;
    cudaStream_t stream_;
  };

  bool can_record() const override { return true; }
  std::unique_ptr<Recording> record(const std::function<void()>& body) override {
    std::unique_lock<std::shared_mutex> alone(capture_mutex());
    struct Capturing {
      Capturing() { capturing_here = true; }
      ~Capturing() { capturing_here = false; }
    } capturing;
    EPILOG_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
      body();
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      throw;
    }
    EPILOG_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    EPILOG_CUDA_CHECK(err);
    return std::make_unique<GraphRecording>(exec, stream_);
  }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace

namespace detail {
void count_cuda_probe();  // src/runtime/executor.cpp
}  // namespace detail

bool cuda_available() {
  detail::count_cuda_probe();
  static const bool available = [] {
    int count = 0;
    // cudaFree(nullptr) creates the context: a device that is present but unusable (busy,
    // driver too old) fails here rather than in the first allocation.
    const bool ok =
        cudaGetDeviceCount(&count) == cudaSuccess && count > 0 && cudaFree(nullptr) == cudaSuccess;
    cudaGetLastError();
    return ok;
  }();
  register_cuda();
  return available;
}

std::optional<DeviceProfile> cuda_device_profile() {
  if (!cuda_available()) return std::nullopt;
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  DeviceProfile profile{prop.name, prop.multiProcessorCount, true};
  profile.cc_major = prop.major;
  profile.wgmma = cuda::wgmma_available();
  return profile;
}

std::unique_ptr<Backend> make_cuda_backend() {
  if (!cuda_available()) return nullptr;
  return std::make_unique<CudaBackend>();
}

}  // namespace epilog
