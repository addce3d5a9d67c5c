// The pointwise functions as values: activations, binary ops and fused_elementwise's programs of
// them, as the graph API and a plan carry them. Plain data without dependencies: the kernels take
// these same types, in device code too, and apply them with activate(), binary_apply() and
// chain_step() (internal/epilog/kernels/shapes.h, the library's own and not installed).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define EPILOG_HD __host__ __device__
#else
#define EPILOG_HD
#endif

namespace epilog {

// The pointwise functions an epilogue (and the unary elementwise ops) can apply. An activation
// is a value: a kind and its parameters (Act), applied by one activate() that the CPU kernels and
// every CUDA epilogue share, so that adding one touches this file, activate() and the op table.
enum class Activation : uint8_t {
  None,
  Silu,
  Relu,
  Sigmoid,
  Clip,         // min(max(x, a), b); relu6 is clip(0, 6)
  LeakyRelu,    // x >= 0 ? x : a * x
  HardSigmoid,  // clip(a * x + b, 0, 1)
  HardSwish,    // x * relu6(x + 3) / 6
  Tanh,
  Gelu,      // x * Phi(x), with erf
  GeluTanh,  // GELU's tanh approximation
  Mish,      // x * tanh(softplus(x))
  Softplus,  // log(1 + e^x)
  Elu,       // x > 0 ? x : a * (e^x - 1)
  Exp,
  Erf,
  Sqrt,
  Reciprocal,
  Neg,
  Abs,
  Log,  // natural logarithm
  Pow,  // x^a, a constant exponent
};
constexpr int kNumActivations = int(Activation::Pow) + 1;

struct Act {
  Activation kind;
  float a, b;  // parameters: Clip min, max; LeakyRelu, Elu alpha; HardSigmoid alpha, beta; Pow
               // the exponent
  // Implicit from a kind: an activation without parameters reads as its kind.
  constexpr EPILOG_HD Act(Activation k = Activation::None, float pa = 0.0f, float pb = 0.0f)
      : kind(k), a(pa), b(pb) {}
};
inline bool operator==(const Act& x, const Act& y) {
  return x.kind == y.kind && x.a == y.a && x.b == y.b;
}
inline bool operator!=(const Act& x, const Act& y) {
  return !(x == y);
}

// The elementwise binary ops (NumPy broadcasting), applied by one binary_apply() that the CPU
// kernel and the CUDA kernel share. Max and min propagate NaN, as NumPy's maximum and minimum.
enum class Binary : uint8_t { Add, Mul, Sub, Div, Max, Min };

// -- fused_elementwise: a chain of elementwise ops as one program run on each output element --
// A running value v starts as input 0's element; each step is an activation, v = act(v), or a
// binary op with input `operand`: v = v op x, or x op v where `swap`. Every input is read at the
// output element NumPy-broadcast, so a chain whose first inputs are smaller than its output
// computes their part again for each element it broadcasts to. At most kMaxChainSteps steps over
// kMaxChainInputs inputs, an output of at most kMaxChainRank dims.
constexpr int kMaxChainSteps = 8;
constexpr int kMaxChainInputs = 5;  // the first input and up to four operands
constexpr int kMaxChainRank = 6;
struct ChainStep {
  Act act;                  // a unary step's activation
  Binary op = Binary::Add;  // a binary step's op
  int8_t operand = -1;      // a binary step's other input; -1: a unary step
  bool swap = false;        // a binary step: the running value is the right-hand operand
};
struct ChainProgram {
  int steps = 0;
  ChainStep step[kMaxChainSteps];
};

}  // namespace epilog
