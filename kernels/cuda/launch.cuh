// Host-side launch helpers shared by the CUDA kernel files: grid sizes, alignment and index-width
// tests, and the dispatch of run-time choices (vector width, index type, activation) onto
// template parameters.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

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

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
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

// Calls f(std::integral_constant<Activation, A>{}) for the run-time activation `act`, so that
// an epilogue is compiled once per activation with its branch folded away. Host and device: f is
// a host lambda on the host side (the pragma lets nvcc instantiate that without a warning).
#pragma nv_exec_check_disable
template <class F>
__host__ __device__ __forceinline__ void with_activation(Activation act, F&& f) {
  switch (act) {
    case Activation::Silu:
      return f(std::integral_constant<Activation, Activation::Silu>{});
    case Activation::Relu:
      return f(std::integral_constant<Activation, Activation::Relu>{});
    case Activation::Sigmoid:
      return f(std::integral_constant<Activation, Activation::Sigmoid>{});
    case Activation::None:
      return f(std::integral_constant<Activation, Activation::None>{});
  }
}

}  // namespace epilog::cuda::detail
