// Elementwise CUDA kernels: inference batchnorm, activations, the binary ops with broadcasting,
// and chains of them (fused_elementwise).
//
// Math
//   batchnorm   y[o, c, i] = (x[o, c, i] - mean[c]) * (gamma[c] / sqrt(var[c] + eps)) + beta[c]
//   activation  y[i] = act(x[i]), act as in shapes.h (silu, relu, sigmoid, none)
//   binary      y[p] = binary_apply(op, a[p mod a's shape], b[p mod b's shape]) (shapes.h:
//               add, mul, sub, div, max, min), NumPy broadcasting
//   chain       y[p] = the program's steps (shapes.h ChainProgram, chain_step) from x0[p] on, each
//               input read at p NumPy-broadcast: one read of each input, one write, the steps in
//               registers
// Layout: float32, contiguous, device pointers; batchnorm sees x as [outer, channels, inner].
//   Outputs must not alias inputs (inputs are read through the non-coherent cache).
// Grid: 1-D, kThreads per block, enough blocks for every item (grid_cover: the block scheduler
//   balances the waves, where a grid capped at one wave of 8 blocks an SM ran a second, partial
//   wave for kernels of more than 32 registers), grid-stride past 2^31 - 1 blocks. A work item
//   is a float4 when every pointer is 16-byte aligned and no run of 4 crosses a channel
//   (batchnorm: inner % 4 == 0) or a broadcast row (binary: last merged dim % 4 == 0), else
//   one float. Flat kernels take kUnroll items per step, kThreads apart so that each warp's
//   accesses stay coalesced, and issue all kUnroll loads before the first use.
// Binary: the host merges the broadcast shape first: size-1 dims are dropped and neighbours
//   that both operands walk as one dim are merged, so [N,C,H,W] + [1,C,1,1] runs as [N, C, H*W]
//   with b strides (0, 1, 0) and equal shapes as one flat run (the flat kernel). Otherwise
//   item w is row w / chunks of the outer merged dims (decoded with one division per dim)
//   and column (w % chunks) * V of the last one, whose stride is 1 or 0 in each operand.
//   binary_items runs the same kernel as one outer dim whose strides may differ per operand,
//   the output's included (y's rows y_row apart; contiguous everywhere else).
// Chain: the host hands its merged dims (runtime/params.h chain_shape: size-1 dims dropped,
//   neighbours every tensor walks as one merged) with every tensor's element strides, any of
//   them a part's item stride. An item is V floats of the innermost dim, decoded as binary's
//   broadcast items (one division per outer dim, a multiply-shift FastDiv in 32 bits); float4
//   where y and every input step by 1 or 0 along that dim, its size and every outer stride of a
//   stepping tensor are multiples of 4 and their pointers 16-byte aligned. The steps are unrolled
//   to kMaxChainSteps and a step's operand picked from the inputs' registers by a bit of its own
//   (ChainWalk::pick), so that nothing is indexed at run time (which would move those registers to
//   local memory).
// Activation (the op alone): one kernel per activation kind with its math inlined (InlineAct),
//   where the conv epilogues and chains call the rare kinds out of line (shapes.h activate);
//   mish there as v * n(n + 2) / (n(n + 2) + 2) with n = e^v (= v tanh(log1p(e^v))).
// Index math is 32-bit when every index is below 2^31, else 64-bit.
// Restrictions: binary up to kMaxRank dims (checked), shapes that broadcast (the caller's); a
//   chain up to kMaxChainRank merged dims, kMaxChainInputs inputs and kMaxChainSteps steps whose
//   operands are among them (checked).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "epilog/kernels/cuda.h"
#include "launch.cuh"

namespace epilog::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
using namespace detail;

template <int V>
struct Vec {
  float v[V];
};

template <int V>
__device__ __forceinline__ Vec<V> load(const float* __restrict__ p) {
  Vec<V> r;
  if constexpr (V == 4) {
    const float4 t = __ldg(reinterpret_cast<const float4*>(p));
    r.v[0] = t.x, r.v[1] = t.y, r.v[2] = t.z, r.v[3] = t.w;
  } else {
    r.v[0] = __ldg(p);
  }
  return r;
}

template <int V>
__device__ __forceinline__ void store(float* p, const Vec<V>& r) {
  if constexpr (V == 4)
    *reinterpret_cast<float4*>(p) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
  else
    *p = r.v[0];
}

template <int V>
__device__ __forceinline__ Vec<V> splat(float s) {
  Vec<V> r;
#pragma unroll
  for (int j = 0; j < V; ++j) r.v[j] = s;
  return r;
}

// -- flat kernels: y[i] = f(i, x[i]) or f(i, a[i], b[i]) over `items` items of V floats --

template <class F, int V, class I>
__global__ void __launch_bounds__(kThreads)
    map_kernel(F f, I items, const float* __restrict__ x, float* __restrict__ y) {
  const I step = I(gridDim.x) * kThreads * kUnroll;
  for (I base = I(blockIdx.x) * kThreads * kUnroll + threadIdx.x; base < items; base += step) {
    Vec<V> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const I i = base + I(u) * kThreads;
      if (i < items) v[u] = load<V>(x + i * V);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const I i = base + I(u) * kThreads;
      if (i < items) {
        f(i * V, v[u]);
        store<V>(y + i * V, v[u]);
      }
    }
  }
}

template <class F, int V, class I>
__global__ void __launch_bounds__(kThreads)
    zip_kernel(F f, I items, const float* __restrict__ a, const float* __restrict__ b,
               float* __restrict__ y) {
  const I step = I(gridDim.x) * kThreads * kUnroll;
  for (I base = I(blockIdx.x) * kThreads * kUnroll + threadIdx.x; base < items; base += step) {
    Vec<V> va[kUnroll], vb[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const I i = base + I(u) * kThreads;
      if (i < items) va[u] = load<V>(a + i * V), vb[u] = load<V>(b + i * V);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const I i = base + I(u) * kThreads;
      if (i < items) {
#pragma unroll
        for (int j = 0; j < V; ++j) va[u].v[j] = f(va[u].v[j], vb[u].v[j]);
        store<V>(y + i * V, va[u]);
      }
    }
  }
}

// Launches map_kernel over n floats in index type I, as float4 items when `vec` allows.
template <class I, class F>
void launch_map_as(const char* name, F f, int64_t n, bool vec, const float* x, float* y,
                   Stream stream) {
  if (n == 0) return;
  vec = vec && n % 4 == 0 && aligned16(x) && aligned16(y);
  const int64_t items = vec ? n / 4 : n;
  const int grid = grid_cover(items, kThreads * kUnroll);
  if (vec)
    map_kernel<F, 4, I><<<grid, kThreads, 0, stream>>>(f, I(items), x, y);
  else
    map_kernel<F, 1, I><<<grid, kThreads, 0, stream>>>(f, I(items), x, y);
  check_launch(name);
}

template <class F>
void launch_map(const char* name, F f, int64_t n, bool vec, const float* x, float* y,
                Stream stream) {
  if (fits32(n))
    launch_map_as<uint32_t>(name, f, n, vec, x, y, stream);
  else
    launch_map_as<int64_t>(name, f, n, vec, x, y, stream);
}

// -- batchnorm --

struct BatchnormOp {
  int64_t channels, inner;
  const float *gamma, *beta, *mean, *var;
  float eps;

  // All V elements share a channel: the vector path needs inner % 4 == 0.
  template <class I, int V>
  __device__ void operator()(I first, Vec<V>& v) const {
    const I c = (first / I(inner)) % I(channels);
    // sqrtf and the division round correctly (no fast math), within an ulp or two of the CPU
    // reference's double-precision factor.
    const float a = __ldg(gamma + c) / sqrtf(__ldg(var + c) + eps);
    const float m = __ldg(mean + c), b = __ldg(beta + c);
#pragma unroll
    for (int j = 0; j < V; ++j) v.v[j] = (v.v[j] - m) * a + b;
  }
};

// -- activation --

template <class ActFn>
struct ActivationOp {
  ActFn act;
  template <class I, int V>
  __device__ void operator()(I, Vec<V>& v) const {
#pragma unroll
    for (int j = 0; j < V; ++j) v.v[j] = act(v.v[j]);
  }
};

// The activation of kind K with its math inlined: activate_rare's switch folds to K's case.
template <Activation K>
struct InlineAct {
  float a, b;
  __device__ __forceinline__ float operator()(float v) const {
    const Act act(K, a, b);
    if constexpr (K == Activation::Mish) {
      // tanh(log1p(n)) = ((1 + n)^2 - 1) / ((1 + n)^2 + 1) = n(n + 2) / (n(n + 2) + 2), n = e^v
      // by ex2.approx (2 + 1.2|v| ulp): a few instructions where expf, log1pf and tanhf took
      // about 60. Off mish by at most 7% of the tests' bound 1e-5 + 1e-5 |mish| over
      // [-30, 20] with e^v 3e-6 off (a host sweep in float against double); below -30 both are
      // under 3e-12 (e^v flushes to 0 below -87). Past 20 the CPU's is v, as here, so the
      // divisor stays below 2^126, where __fdividef is within 2 ulp.
      if (v > 20.0f) return v;
      float n;
      asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(n) : "f"(v * 1.44269504f));
      const float t = n * (n + 2.0f);
      return v * __fdividef(t, t + 2.0f);
    } else if constexpr (K == Activation::None || K == Activation::Silu || K == Activation::Relu ||
                         K == Activation::Sigmoid) {
      return activate(act, v);
    } else {
      return activate_rare(act, v);
    }
  }
};

// Calls f(InlineAct<K>{a, b}) for the activation's kind K.
template <class F, int... K>
void with_inline_act(const Act& act, F&& f, std::integer_sequence<int, K...>) {
  const bool found =
      ((int(act.kind) == K ? (f(InlineAct<Activation(K)>{act.a, act.b}), true) : false) || ...);
  EPILOG_CUDA_REQUIRE(found);
}

// -- binary --

template <Binary Op>
struct BinaryOp {
  __device__ float operator()(float a, float b) const { return binary_apply(Op, a, b); }
};

// The outer merged dims, innermost first, with each operand's element strides (0: broadcast).
struct Outer {
  int rank;
  int64_t size[kMaxRank], sa[kMaxRank], sb[kMaxRank];
};

template <Binary Op, int V, class I>
__global__ void __launch_bounds__(kThreads)
    broadcast_kernel(Outer o, I inner, I chunks, I items, bool a_steps, bool b_steps,
                     const float* __restrict__ a, const float* __restrict__ b,
                     float* __restrict__ y, I y_row) {
  const BinaryOp<Op> f;
  const I step = I(gridDim.x) * kThreads;
  for (I w = I(blockIdx.x) * kThreads + threadIdx.x; w < items; w += step) {
    const I row = w / chunks, col = (w - row * chunks) * V;
    I oa = 0, ob = 0, rest = row;
#pragma unroll
    for (int d = 0; d < kMaxRank; ++d) {
      if (d >= o.rank) break;
      const I size = I(o.size[d]), idx = rest % size;
      rest /= size;
      oa += idx * I(o.sa[d]);
      ob += idx * I(o.sb[d]);
    }
    const Vec<V> va = a_steps ? load<V>(a + oa + col) : splat<V>(__ldg(a + oa));
    Vec<V> vb = b_steps ? load<V>(b + ob + col) : splat<V>(__ldg(b + ob));
#pragma unroll
    for (int j = 0; j < V; ++j) vb.v[j] = f(va.v[j], vb.v[j]);
    store<V>(y + row * y_row + col, vb);
  }
}

template <Binary Op>
void binary_impl(const BroadcastShape& s, const float* a, const float* b, float* y, Stream stream) {
  // Merge as the CPU reference does (kernels/cpu/elementwise.cpp): walk from the back, where
  // shapes align, computing each operand's strides, then fuse neighbours whose strides chain.
  struct Dim {
    int64_t size, sa, sb;
  };
  Dim dims[kMaxRank];
  int rank = 0;  // merged dims, outermost first
  {
    Dim all[kMaxRank];
    int64_t stride_a = 1, stride_b = 1;
    for (int d = s.rank - 1; d >= 0; --d) {
      all[d] = {s.out[d], s.a[d] == 1 ? 0 : stride_a, s.b[d] == 1 ? 0 : stride_b};
      stride_a *= s.a[d];
      stride_b *= s.b[d];
    }
    for (int d = 0; d < s.rank; ++d) {
      const Dim& cur = all[d];
      if (cur.size == 1) continue;
      if (rank > 0) {
        Dim& prev = dims[rank - 1];
        if (prev.sa == cur.sa * cur.size && prev.sb == cur.sb * cur.size) {
          prev = {prev.size * cur.size, cur.sa, cur.sb};
          continue;
        }
      }
      dims[rank++] = cur;
    }
    if (rank == 0) dims[rank++] = {1, 0, 0};
  }
  const Dim inner = dims[rank - 1];
  int64_t total = inner.size;
  for (int d = 0; d < rank - 1; ++d) total *= dims[d].size;
  if (total == 0) return;

  if (rank == 1 && inner.sa == 1 && inner.sb == 1) {  // equal shapes: one flat run
    const bool vec = total % 4 == 0 && aligned16(a) && aligned16(b) && aligned16(y);
    const int64_t items = vec ? total / 4 : total;
    dispatch(vec, fits32(total), [&](auto v, auto i) {
      using I = decltype(i);
      zip_kernel<BinaryOp<Op>, decltype(v)::value, I>
          <<<grid_cover(items, kThreads * kUnroll), kThreads, 0, stream>>>(BinaryOp<Op>{}, I(items),
                                                                           a, b, y);
    });
    check_launch("binary (flat)");
    return;
  }

  Outer o{};
  o.rank = rank - 1;
  for (int d = 0; d < o.rank; ++d) {  // innermost first
    const Dim& src = dims[rank - 2 - d];
    o.size[d] = src.size, o.sa[d] = src.sa, o.sb[d] = src.sb;
  }
  const bool a_steps = inner.sa == 1, b_steps = inner.sb == 1;
  // Outer strides of a stepping operand are multiples of the inner size, so with inner % 4 == 0
  // every float4 it reads is aligned when its base is.
  const bool vec = inner.size % 4 == 0 && aligned16(y) && (!a_steps || aligned16(a)) &&
                   (!b_steps || aligned16(b));
  const int64_t chunks = vec ? inner.size / 4 : inner.size;
  const int64_t items = total / inner.size * chunks;
  dispatch(vec, fits32(total), [&](auto v, auto i) {
    using I = decltype(i);
    broadcast_kernel<Op, decltype(v)::value, I>
        <<<grid_cover(items, kThreads), kThreads, 0, stream>>>(
            o, I(inner.size), I(chunks), I(items), a_steps, b_steps, a, b, y, I(inner.size));
  });
  check_launch("binary (broadcast)");
}

template <Binary Op>
void binary_items_impl(int64_t items, int64_t len, const float* a, int64_t a_stride, const float* b,
                       int64_t b_stride, float* y, int64_t y_stride, Stream stream) {
  if (items == 0 || len == 0) return;
  Outer o{};
  o.rank = 1;
  o.size[0] = items, o.sa[0] = a_stride, o.sb[0] = b_stride;
  const bool vec = len % 4 == 0 && a_stride % 4 == 0 && b_stride % 4 == 0 && y_stride % 4 == 0 &&
                   aligned16(a) && aligned16(b) && aligned16(y);
  const int64_t chunks = vec ? len / 4 : len;
  const int64_t span = items * std::max({a_stride, b_stride, y_stride, len});
  dispatch(vec, fits32(span), [&](auto v, auto i) {
    using I = decltype(i);
    broadcast_kernel<Op, decltype(v)::value, I>
        <<<grid_cover(items * chunks, kThreads), kThreads, 0, stream>>>(
            o, I(len), I(chunks), I(items * chunks), true, true, a, b, y, I(y_stride));
  });
  check_launch("binary (items)");
}

// -- fused_elementwise --

// The chain's dims as the kernel decodes them: the outer ones innermost first, the inner one's
// strides apart (it is split into items of V floats), and the inputs. pick[t]: the input a
// binary step t reads past x0, as the bit 1 << k (0: x0). A bit the compiler cannot trace back
// to the step's operand index: compared with the index, it turned the pick into an indexed load
// and the inputs' registers into local memory (80 bytes of stack, ptxas -v).
struct ChainWalk {
  int outer, inputs;
  int64_t size[kMaxChainRank - 1];
  int64_t stride[kMaxChainInputs][kMaxChainRank - 1], y_stride[kMaxChainRank - 1];
  int64_t inner_stride[kMaxChainInputs], y_inner;
  const float* x[kMaxChainInputs];
  uint8_t pick[kMaxChainSteps];
  FastDiv div[kMaxChainRank - 1], chunk_div;  // by size[d] and by chunks (32-bit indices)
};

// Blocks an SM the chain kernel is held to: unbounded, the 32-bit float4 one took 64 registers
// (4 blocks an SM); at 6 it takes 40 without spilling (ptxas -v). The 64-bit one at 4 (64
// registers, as unbounded before FastDiv; held to 1 it took 106).
template <class I>
constexpr int kChainBlocks = std::is_same_v<I, uint32_t> ? 6 : 4;

template <int V, class I>
__global__ void __launch_bounds__(kThreads, kChainBlocks<I>)
    chain_kernel(ChainProgram p, ChainWalk w, I chunks, I items, float* __restrict__ y) {
  const I step = I(gridDim.x) * kThreads;
  for (I item = I(blockIdx.x) * kThreads + threadIdx.x; item < items; item += step) {
    const I row = quot(item, chunks, w.chunk_div), col = (item - row * chunks) * V;
    I at[kMaxChainInputs] = {}, y_at = 0, rest = row;
#pragma unroll
    for (int d = 0; d < kMaxChainRank - 1; ++d) {
      if (d >= w.outer) break;
      const I size = I(w.size[d]), q = quot(rest, size, w.div[d]), idx = rest - q * size;
      rest = q;
#pragma unroll
      for (int k = 0; k < kMaxChainInputs; ++k) at[k] += idx * I(w.stride[k][d]);
      y_at += idx * I(w.y_stride[d]);
    }
    // -- each input once --
    Vec<V> in[kMaxChainInputs];
#pragma unroll
    for (int k = 0; k < kMaxChainInputs; ++k) {
      if (k >= w.inputs) {
        in[k] = splat<V>(0.0f);
        continue;
      }
      const float* base = w.x[k] + at[k];
      if constexpr (V == 4)
        in[k] = w.inner_stride[k] ? load<V>(base + col) : splat<V>(__ldg(base));
      else
        in[k].v[0] = __ldg(base + col * I(w.inner_stride[k]));
    }
    // -- the steps, in registers --
    Vec<V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float v = in[0].v[j];
#pragma unroll
      for (int t = 0; t < kMaxChainSteps; ++t) {
        if (t >= p.steps) break;
        float x = in[0].v[j];
#pragma unroll
        for (int k = 1; k < kMaxChainInputs; ++k)
          if (w.pick[t] & (1u << k)) x = in[k].v[j];
        v = chain_step(p.step[t], v, x);
      }
      out.v[j] = v;
    }
    if constexpr (V == 4)
      store<V>(y + y_at + col, out);
    else
      y[y_at + col * I(w.y_inner)] = out.v[0];
  }
}

// Calls f(integral_constant<Binary, op>): one instantiation of a kernel per binary op.
template <class F>
void with_binary(Binary op, F&& f) {
  switch (op) {
    case Binary::Add:
      return f(std::integral_constant<Binary, Binary::Add>{});
    case Binary::Mul:
      return f(std::integral_constant<Binary, Binary::Mul>{});
    case Binary::Sub:
      return f(std::integral_constant<Binary, Binary::Sub>{});
    case Binary::Div:
      return f(std::integral_constant<Binary, Binary::Div>{});
    case Binary::Max:
      return f(std::integral_constant<Binary, Binary::Max>{});
    case Binary::Min:
      return f(std::integral_constant<Binary, Binary::Min>{});
  }
}

}  // namespace

void batchnorm(int64_t outer, int64_t channels, int64_t inner, const float* x, const float* gamma,
               const float* beta, const float* mean, const float* var, float eps, float* y,
               Stream stream) {
  const BatchnormOp op{channels, inner, gamma, beta, mean, var, eps};
  launch_map("batchnorm", op, outer * channels * inner, inner % 4 == 0, x, y, stream);
}

void activation(Act act, int64_t n, const float* x, float* y, Stream stream) {
  if (!fits32(n)) {  // 64-bit indices: one kernel with activate()'s switch
    const ActOf<kAnyActivation> a(act);
    return launch_map_as<int64_t>("activation", ActivationOp<decltype(a)>{a}, n, true, x, y,
                                  stream);
  }
  with_inline_act(
      act,
      [&](auto a) {
        launch_map_as<uint32_t>("activation", ActivationOp<decltype(a)>{a}, n, true, x, y, stream);
      },
      std::make_integer_sequence<int, kNumActivations>{});
}

void fused_elementwise(const ChainProgram& p, const ChainShape& s, const float* const* x, float* y,
                       Stream stream) {
  EPILOG_CUDA_REQUIRE(s.rank >= 1 && s.rank <= kMaxChainRank && s.inputs >= 1 &&
                      s.inputs <= kMaxChainInputs && p.steps >= 0 && p.steps <= kMaxChainSteps);
  for (int t = 0; t < p.steps; ++t) EPILOG_CUDA_REQUIRE(p.step[t].operand < s.inputs);
  const int last = s.rank - 1;
  int64_t total = 1, span = 0;  // span: the farthest element any tensor's walk reaches
  for (int d = 0; d < s.rank; ++d) total *= s.size[d];
  if (total == 0) return;
  for (int k = 0; k <= s.inputs; ++k) {
    int64_t reach = 0;
    for (int d = 0; d < s.rank; ++d)
      reach += (s.size[d] - 1) * (k < s.inputs ? s.stride[k][d] : s.y_stride[d]);
    span = std::max(span, reach + 1);
  }
  ChainWalk w{};
  w.outer = last;
  w.inputs = s.inputs;
  for (int q = 0; q < last; ++q) {  // innermost first
    const int d = last - 1 - q;
    w.size[q] = s.size[d];
    for (int k = 0; k < s.inputs; ++k) w.stride[k][q] = s.stride[k][d];
    w.y_stride[q] = s.y_stride[d];
  }
  for (int k = 0; k < s.inputs; ++k) w.inner_stride[k] = s.stride[k][last], w.x[k] = x[k];
  for (int t = 0; t < p.steps; ++t)
    w.pick[t] = p.step[t].operand > 0 ? uint8_t(1u << p.step[t].operand) : uint8_t(0);
  w.y_inner = s.y_stride[last];
  // float4 items: every tensor steps by 1 or 0 along the inner dim, and those that step start
  // each row 16-byte aligned.
  const int64_t inner = s.size[last];
  const auto rows_aligned = [&](const float* base, const int64_t* outer) {
    if (!aligned16(base)) return false;
    for (int q = 0; q < last; ++q)
      if (outer[q] % 4 != 0) return false;
    return true;
  };
  bool vec = inner % 4 == 0 && w.y_inner == 1 && rows_aligned(y, w.y_stride);
  for (int k = 0; k < s.inputs; ++k)
    vec = vec &&
          (w.inner_stride[k] == 0 || (w.inner_stride[k] == 1 && rows_aligned(x[k], w.stride[k])));
  const int64_t chunks = vec ? inner / 4 : inner, items = total / inner * chunks;
  const bool small = fits32(std::max(span, total));
  if (small) {  // every size and chunks below 2^31 too
    for (int q = 0; q < last; ++q) w.div[q] = make_fastdiv(uint32_t(w.size[q]));
    w.chunk_div = make_fastdiv(uint32_t(chunks));
  }
  dispatch(vec, small, [&](auto v, auto i) {
    using I = decltype(i);
    chain_kernel<decltype(v)::value, I>
        <<<grid_cover(items, kThreads), kThreads, 0, stream>>>(p, w, I(chunks), I(items), y);
  });
  check_launch("fused_elementwise");
}

void binary(Binary op, const BroadcastShape& s, const float* a, const float* b, float* y,
            Stream stream) {
  EPILOG_CUDA_REQUIRE(s.rank >= 0 && s.rank <= kMaxRank);
  with_binary(op, [&](auto k) { binary_impl<decltype(k)::value>(s, a, b, y, stream); });
}

void binary_items(Binary op, int64_t items, int64_t len, const float* a, int64_t a_stride,
                  const float* b, int64_t b_stride, float* y, int64_t y_stride, Stream stream) {
  with_binary(op, [&](auto k) {
    binary_items_impl<decltype(k)::value>(items, len, a, a_stride, b, b_stride, y, y_stride,
                                          stream);
  });
}

}  // namespace epilog::cuda
