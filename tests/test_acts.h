// The activations the tests run every conv epilogue with (CPU and GPU suites).
#pragma once

#include <vector>

#include "epilog/kernels/shapes.h"

namespace epilog::test {

// The activations a conv epilogue applies, each with parameters where it takes some; every one
// has a slope of at most 1.5, so an error in its input grows by no more than that.
inline const std::vector<Act>& epilogue_acts() {
  static const std::vector<Act> acts = {Activation::None,
                                        Activation::Silu,
                                        Activation::Relu,
                                        Activation::Sigmoid,
                                        Act(Activation::Clip, 0.0f, 6.0f),
                                        Act(Activation::LeakyRelu, 0.1f),
                                        Act(Activation::HardSigmoid, 0.2f, 0.5f),
                                        Activation::HardSwish,
                                        Activation::Tanh,
                                        Activation::Gelu,
                                        Activation::GeluTanh,
                                        Activation::Mish,
                                        Activation::Softplus,
                                        Act(Activation::Elu, 0.5f),
                                        Activation::Neg,
                                        Activation::Abs};
  return acts;
}

}  // namespace epilog::test
