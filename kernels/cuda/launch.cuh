// Host-side launch helpers shared by the CUDA kernel files: grid sizes, alignment and index-width
// tests, and the dispatch of run-time choices (vector width, index type, activation) onto
// template parameters.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "epilog/kernels/cuda.h"
#include "epilog/kernels/shapes.h"

// Preconditions the host side checked already; a failure here is an epilog bug.
#define EPILOG_CUDA_REQUIRE(cond)                                                             \
  do {                                                                                        \
    if (!(cond))                                                                              \
      ::epilog::cuda::check(cudaErrorInvalidValue, "requirement " #cond, __FILE__, __LINE__); \
  } while (0)

namespace epilog::cuda::detail {

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Division by a divisor fixed at launch, in a kernel's index type I (see dispatch): uint32_t
// indices are below 2^31, so they take fast_div; int64_t ones a plain division.
template <class I>
struct Divisor {
  I d;
  explicit Divisor(I v) : d(v) {}
  __device__ __forceinline__ I div(I n) const { return n / d; }
};
template <>
struct Divisor<uint32_t> {
  uint32_t d;
  FastDiv f;
  explicit Divisor(uint32_t v) : d(v), f(make_fastdiv(v)) {}
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return uint32_t(fast_div(int(n), f));
  }
};

// n / d for d fixed at launch, where a kernel keeps its divisors in arrays (Divisor has no
// default): f = make_fastdiv(d) in 32 bits (uint32_t), a division in 64.
template <class I>
__device__ __forceinline__ I quot(I n, I d, FastDiv f) {
  if constexpr (std::is_same_v<I, uint32_t>)
    return I(fast_div(int(n), f));
  else
    return n / d;
}

// One full wave of 256-thread blocks on this device: 8 x 256 = 2048 threads, the most an sm_90
// SM holds.
inline int max_blocks() {
  static const int blocks = [] {
    int device = 0, sms = 0;
    EPILOG_CUDA_CHECK(cudaGetDevice(&device));
    EPILOG_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return std::max(sms, 1) * 8;
  }();
  return blocks;
}

// Enough blocks for `items` at `per_block` items per block, capped at one full wave: past that
// a grid-stride loop does the rest without paying for block launches.
inline int grid_for(int64_t items, int64_t per_block) {
  return static_cast<int>(std::min<int64_t>(ceil_div(items, per_block), max_blocks()));
}

// Enough blocks for every item at `per_block` items a block (at least one, at most 2^31 - 1: a
// grid-stride loop does the rest), for kernels whose blocks stream their items once. The block
// scheduler then balances the waves: a grid capped at grid_for's wave of 8 blocks an SM runs a
// second, partial wave where registers allow fewer (48 registers a thread: 5), and its
// grid-stride loop leaves blocks one step apart where the items are not a multiple of it.
inline int grid_cover(int64_t items, int64_t per_block) {
  return static_cast<int>(std::clamp<int64_t>(ceil_div(items, per_block), 1, 0x7fffffff));
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Programmatic dependent launch (sm_90): a kernel launched through launch_pdl is set up by the
// hardware while the kernel before it on the stream still runs, which hides part of the launch
// gap between the small kernels of a model (one CUDA graph node after another): the YOLO-like
// model 0.410 -> 0.385 ms at batch 1, 1.676 -> 1.650 at batch 16 (H200, docs/perf-history.md). Such
// a kernel starts with pdl_begin(), which waits until the previous kernel has finished and its
// writes are visible (launched the ordinary way, it does nothing). No kernel lets the next one
// in early (griddepcontrol.launch_dependents): at the start of every kernel that made the model
// 0.645 ms at batch 1, the waiting blocks of the next kernel taking the SMs' slots; at the end
// of the gemm kernels' mainloops 0.375 -> 0.395 ms, with no gain on any suite layer.
__device__ __forceinline__ void pdl_begin() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Whether the current device is Hopper or later (compute capability 9): programmatic launches
// and thread-block clusters. Read once, as max_blocks.
inline bool device_sm90() {
  static const bool sm90 = [] {
    int device = 0, major = 0;
    EPILOG_CUDA_CHECK(cudaGetDevice(&device));
    EPILOG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    return major >= 9;
  }();
  return sm90;
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic dependent launch allowed
// (on Hopper and later), and, with cluster > 1, as thread-block clusters of `cluster` blocks
// along x (the caller checked device_sm90()). The kernel must begin with pdl_begin().
template <class... P, class... A>
void launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, Stream stream,
                unsigned cluster, A&&... args) {
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  attrs[1].id = cudaLaunchAttributeClusterDimension;
  attrs[1].val.clusterDim.x = cluster;
  attrs[1].val.clusterDim.y = 1;
  attrs[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  const bool pdl = device_sm90();
  config.attrs = pdl ? attrs : attrs + 1;
  config.numAttrs = (pdl ? 1 : 0) + (cluster > 1 ? 1 : 0);
  EPILOG_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<A>(args)...));
}

// Above 48 KB of dynamic shared memory a block needs the opt-in, which is per device and kernel:
// set once per device (a bit each of `opted_in`) for the most a kernel will ask, so that any
// smaller size fits afterwards.
template <class... Kernel>
void opt_in(std::atomic<uint64_t>& opted_in, size_t bytes, Kernel*... kernels) {
  int device = 0;
  EPILOG_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = uint64_t(1) << (device % 64);
  if (opted_in.load(std::memory_order_relaxed) & bit) return;
  (EPILOG_CUDA_CHECK(
       cudaFuncSetAttribute(kernels, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes))),
   ...);
  opted_in.fetch_or(bit, std::memory_order_relaxed);
}

// Blocks of a kernel resident at once on the device at a given dynamic shared memory (at least
// one an SM): a persistent kernel's grid. Asked once per device and `slot` (the caller's index,
// 0..2, of the shared-memory sizes it launches with) and cached in `cache`, one per kernel
// instantiation (they differ in threads, registers and shared memory).
using ResidentCache = std::atomic<int>[64][3];
template <class Kernel>
int resident_blocks(ResidentCache& cache, int slot, Kernel* kernel, int threads, size_t smem) {
  int device = 0;
  EPILOG_CUDA_CHECK(cudaGetDevice(&device));
  std::atomic<int>& cached = cache[device % 64][slot];
  int blocks = cached.load(std::memory_order_relaxed);
  if (blocks == 0) {
    int per_sm = 0, sms = 0;
    EPILOG_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    EPILOG_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    blocks = (per_sm > 0 ? per_sm : 1) * sms;
    cached.store(blocks, std::memory_order_relaxed);
  }
  return blocks;
}

inline bool fits32(int64_t n) {
  return n < (int64_t(1) << 31);
}

// Calls f(V, I{}) with V an integral_constant of 4 (float4 items) or 1 and I the index type:
// uint32_t when every index fits, else int64_t.
template <class F>
void dispatch(bool vec, bool small, F&& f) {
  using Four = std::integral_constant<int, 4>;
  using One = std::integral_constant<int, 1>;
  if (vec && small)
    f(Four{}, uint32_t{});
  else if (vec)
    f(Four{}, int64_t{});
  else if (small)
    f(One{}, uint32_t{});
  else
    f(One{}, int64_t{});
}

// An activation whose kind is known at compile time (K), or, for K == kAnyActivation, only at run
// time (value.kind); kOtherActivation: at run time, and none of the three with_activation
// compiles for apart. Applied as act(v): for a fixed K, activate()'s switch folds away.
constexpr Activation kAnyActivation = Activation(255);
constexpr Activation kOtherActivation = Activation(254);
template <Activation K>
struct ActOf {
  Act value;
  __host__ __device__ explicit ActOf(const Act& act) : value(act) {}
  __device__ __forceinline__ float operator()(float v) const {
    if constexpr (K == kAnyActivation)
      return activate(value, v);
    else if constexpr (K == kOtherActivation)
      return activate_other(value, v);
    else
      return activate(Act(K, value.a, value.b), v);
  }
};

// Calls f(ActOf<K>) for the run-time activation `act`: the common ones (none, relu, silu) get an
// epilogue compiled for them alone, every other activation shares one with activate()'s switch
// inside (a uniform branch, but with an out-of-line call for the rare ones in the same code),
// so that the number of kernels does not grow with the number of activations. Host and device:
// f is a host lambda on the host side (the pragma lets nvcc instantiate that without a warning).
#pragma nv_exec_check_disable
template <class F>
__host__ __device__ __forceinline__ void with_activation(const Act& act, F&& f) {
  switch (act.kind) {
    case Activation::None:
      return f(ActOf<Activation::None>(act));
    case Activation::Silu:
      return f(ActOf<Activation::Silu>(act));
    case Activation::Relu:
      return f(ActOf<Activation::Relu>(act));
    default:
      return f(ActOf<kOtherActivation>(act));
  }
}

// The same with two copies, none and any: for the kernels off Hopper's fast path (the mma.sync
// gemm kernels), whose four copies made conv_gemm.cu's compile 1.7x longer. The shared copy
// costs silu layers 4% to 7% (YOLO-like model, H100), so the fast path keeps four.
#pragma nv_exec_check_disable
template <class F>
__host__ __device__ __forceinline__ void with_activation_lean(const Act& act, F&& f) {
  if (act.kind == Activation::None) return f(ActOf<Activation::None>(act));
  return f(ActOf<kAnyActivation>(act));
}

// A kernel template's built tile sizes as a type list: dispatch_tile(TileList<Tile<64, 32>, ...>{},
// m, n, f) calls f(Tile<M, N>{}) for the listed tile equal to m x n, and says whether one was.
template <int M, int N>
struct Tile {
  static constexpr int m = M, n = N;
};
template <class... T>
struct TileList {};
template <class F, class... T>
bool dispatch_tile(TileList<T...>, int m, int n, F&& f) {
  return ((m == T::m && n == T::n && (f(T{}), true)) || ...);
}

}  // namespace epilog::cuda::detail
