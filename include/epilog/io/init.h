// Deterministic weight initialization from a seed, shared by the builder and the model loaders.
#pragma once

#include "epilog/graph/op.h"
#include "epilog/tensor.h"

namespace epilog {

// Values for weight `name` used as input `role` of an `op` node: the same numbers for the same
// (seed, name) on every platform. Convolution and linear weights keep activations at unit scale
// (He-uniform); batchnorm statistics are deliberately non-trivial (mean != 0, var != 1,
// gamma != 1) so that a wrong fold shows in the numbers.
Tensor init_weight(const std::string& name, const Shape& shape, OpKind op, const std::string& role,
                   uint64_t seed);

}  // namespace epilog
