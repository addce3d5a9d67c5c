// The pass pipeline: canonicalize (then identity views and adds of broadcast zeros dropped) ->
// reparameterize -> fuse (conv rules, batchnorm folds, elementwise chains, wide groups split,
// shuffles read through by convs) -> dead-code elimination, the verifier after every pass,
// per-rule hit counts, and a hook to dump the graph before and after each pass.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "epilog/graph/pattern.h"

namespace epilog {

// The forms exporters spell ops in, each rewritten to the op (graph/canonicalize.cpp lists them):
// SiLU, GELU, HardSwish, LayerNorm, the mean over H and W, and the channel shuffle. A form whose
// constants are not the op's is left as it is, with the reason among the refusals.
std::vector<Rule> canonicalize_rules();

// A linear layer as a 1x1 conv (fusion's linear->conv2d, canonicalization's NHWC rule): the
// reason its weight or bias is not a constant, or ""; and the conv's inputs reading x, the
// weight as [n, k, 1, 1] (added to r's weights) and the bias.
std::string linear_constants(const Graph& g, const Node& linear);
std::vector<std::string> linear_conv_inputs(const Graph& g, const Node& linear,
                                            const std::string& x, Replacement& r);

// An activation (bound "act") of a layout op (a view or transpose, bound "layout", reading "x")
// moved before it: act(layout(x)) == layout(act(x)), the activation next to what made its input.
Replacement activation_first(const Match& m);

// Structural reparameterization (RepVGG, ACNet, RepGhost; graph/reparam.cpp): where an add tree
// sums two or more convs of one value x, conv2d(x) or batchnorm(conv2d(x)), with x or
// batchnorm(x) as identity branches, or one conv and batchnorm(x), they become one conv2d(x)
// whose kernel and bias are the branches' sum
// (float64, rounded once), each kernel zero-padded into the largest; other operands stay in the
// add. Exact up to rounding: a branch whose taps do not line up in the largest kernel's window,
// or whose stride, dilation or groups differ, is refused. Runs before fusion, which would take a
// branch in as a residual.
RewriteStats reparameterize(Graph& graph, const KernelQuery& has_kernel);

// Every conv becomes one fused_conv2d: conv2d [-> batchnorm] [-> activation], the batchnorm
// folded into a per-channel scale and shift (float64, rounded once; the conv weights stay
// untouched); then, on a fused conv, a residual add of equal shape (after its activation, or
// before the next one where it has none yet), an activation, and per-channel constant muls and
// adds folded into the scale and shift. A conv nothing follows is fused alone (its bias the
// shift), so that every conv runs on the same kernels.
std::vector<Rule> fusion_rules();

// Then, on what those leave: a batchnorm read only by a fused conv that does not pad, folded
// into that conv's weights and shift (float64, each rounded once); where the conv pads it is
// refused, and said why (its padded zeros would not be shifted).
std::vector<Rule> input_fold_rules();

// Last, chains of elementwise ops (activations, binary ops with broadcasting, batchnorms as a
// per-channel scale and shift) whose links each feed the next alone, as one fused_elementwise:
// at most kMaxChainSteps steps over kMaxChainInputs inputs (graph/pointwise.h), grown a link at
// a time; the running value may be the smaller side of a broadcast.
std::vector<Rule> elementwise_rules();

// After fusion: a fused conv of 2 to kMaxSplitGroups groups, each wide enough for the gemm
// kernels (ResNeSt's radix convs), as one fused conv a group over a split of its input (and
// residual) into a concat: split views and an in-place concat on CUDA, so the groups run on the
// fast kernels at no copy. Narrow groups (ResNeXt's 4 channels) stay one grouped conv.
RewriteStats split_wide_groups(Graph& graph, const KernelQuery& has_kernel);

// After fusion: a channel_shuffle that only groups-1 fused convs read (as x) becomes a concat of
// its parts (none for one part), each conv's weights permuted over the input channels to match.
int read_shuffles_through_convs(Graph& graph);

// Removes nodes whose outputs nobody reads and weights no node uses. Returns what it removed.
int eliminate_dead_code(Graph& graph);

struct PassOptions {
  bool fuse = true;        // reparameterize and fuse
  KernelQuery has_kernel;  // empty: float32 kernels only
  // Called with the graph before the first pass ("source") and after each pass.
  std::function<void(int index, const std::string& stage, const Graph& graph)> on_stage;
};

struct PassReport {
  struct Hit {
    std::string verb;  // "canonicalized", "reparameterized", "fused", "split", ...
    std::string rule;
    int count;
  };
  std::vector<Hit> hits;
  std::vector<std::string> refusals;  // rule, node and reason, for explanations
  int dead_nodes = 0;
  // "fused 45 conv2d->batchnorm->silu, removed 0 dead nodes"
  std::string summary() const;
};

// Runs the pipeline in place; the graph is verified after every pass.
PassReport optimize(Graph& graph, const PassOptions& options = {});

}  // namespace epilog
