// The CPU allocator of the loader fuzzers. Weights of a fuzzed model are allocated (and
// generated) for real; a budget per input keeps a huge shape from tripping libFuzzer's malloc
// limit (which would report a loader that works as designed) and keeps big models from slowing
// every run down. Set g_budget before each call into the loader.
#pragma once

#include <cstdlib>
#include <memory>

#include "epilog/common.h"
#include "epilog/tensor.h"

namespace {

size_t g_budget = 0;

std::shared_ptr<epilog::Storage> capped_alloc(size_t bytes) {
  if (bytes > g_budget) epilog::fail("fuzz: over the allocation budget with {} bytes", bytes);
  g_budget -= bytes;
  auto s = std::make_shared<epilog::Storage>();
  s->ptr = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  s->bytes = bytes;
  s->release = [](void* p) { std::free(p); };
  return s;
}

}  // namespace
