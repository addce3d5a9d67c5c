// libFuzzer target for the JSON model loader: any text must load or throw epilog::Error, and a
// model that loads must survive dump_json -> parse_json_model unchanged.
//
// Byte mutations mostly break the JSON syntax and so test the JSON parser, not the loader. A
// custom mutator therefore edits the parsed document most of the time (replace a value, drop or
// add a key, duplicate, drop or swap list items, graft a subtree), with values drawn from the
// document itself and from the edge cases of the format.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>

#include <nlohmann/json.hpp>

#include "epilog/io/dump.h"
#include "epilog/io/model.h"
#include "epilog/io/safetensors.h"

#include "fuzz_alloc.h"

namespace {

std::string g_dir;

bool same(const epilog::Graph& a, const epilog::Graph& b) {
  if (!(a.inputs == b.inputs && a.outputs == b.outputs && a.nodes == b.nodes &&
        a.values == b.values && a.weights.size() == b.weights.size()))
    return false;
  for (const auto& [name, w] : a.weights) {
    auto it = b.weights.find(name);
    if (it == b.weights.end() || it->second.seed != w.seed ||
        it->second.data.shape() != w.data.shape() ||
        std::memcmp(it->second.data.raw(), w.data.raw(), w.data.nbytes()) != 0)
      return false;
  }
  return true;
}

using json = nlohmann::json;

// Every value of the document, and the strings (keys included) it holds.
void collect(json& doc, std::vector<json*>& values, std::vector<std::string>& strings) {
  std::vector<json*> stack{&doc};
  while (!stack.empty()) {
    json* j = stack.back();
    stack.pop_back();
    values.push_back(j);
    if (j->is_string()) strings.push_back(j->get<std::string>());
    if (j->is_object())
      for (auto it = j->begin(); it != j->end(); ++it) strings.push_back(it.key());
    if (j->is_structured())
      for (auto& child : *j) stack.push_back(&child);
  }
}

json random_value(std::minstd_rand& rng, const std::vector<std::string>& strings) {
  static const int64_t ints[] = {0,
                                 1,
                                 -1,
                                 2,
                                 3,
                                 4,
                                 7,
                                 16,
                                 64,
                                 2147483647,
                                 -2147483648,
                                 int64_t(1) << 40,
                                 std::numeric_limits<int64_t>::max(),
                                 std::numeric_limits<int64_t>::min()};
  const size_t n_ints = sizeof(ints) / sizeof(ints[0]);
  switch (rng() % 9) {
    case 0:
      return ints[rng() % n_ints];
    case 1:
      return std::numeric_limits<uint64_t>::max() - rng() % 2;
    case 2:
      return std::vector<double>{0.5, -0.0, 1e-3, 1e308, 3.0}[rng() % 5];
    case 3: {
      json a = json::array();
      for (size_t k = rng() % 6; k > 0; --k) a.push_back(ints[rng() % 8]);
      return a;
    }
    case 4:
      return rng() % 2 == 0;
    case 5:
      return nullptr;
    case 6:
      return json::object();
    default:
      return strings.empty() ? json("x") : json(strings[rng() % strings.size()]);
  }
}

void mutate(json& doc, std::minstd_rand& rng) {
  std::vector<json*> values;
  std::vector<std::string> strings;
  collect(doc, values, strings);
  json* j = values[rng() % values.size()];
  switch (rng() % 6) {
    case 0:  // replace
      if (j != &doc) *j = random_value(rng, strings);
      break;
    case 1:  // graft a copy of another value
      if (j != &doc) *j = json(*values[rng() % values.size()]);
      break;
    case 2:  // drop a key or an item
      if (j->is_object() && !j->empty()) {
        auto it = j->begin();
        std::advance(it, rng() % j->size());
        j->erase(it);
      } else if (j->is_array() && !j->empty()) {
        j->erase(j->begin() + static_cast<long>(rng() % j->size()));
      }
      break;
    case 3:  // add a key
      if (j->is_object() && !strings.empty())
        (*j)[strings[rng() % strings.size()]] = random_value(rng, strings);
      break;
    case 4:  // duplicate an item
      if (j->is_array() && !j->empty()) j->push_back(json((*j)[rng() % j->size()]));
      break;
    default:  // swap two items
      if (j->is_array() && j->size() > 1)
        std::swap((*j)[rng() % j->size()], (*j)[rng() % j->size()]);
      break;
  }
}

}  // namespace

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  std::minstd_rand rng(seed);
  if (rng() % 4 == 0) return LLVMFuzzerMutate(data, size, max_size);
  // Shallow documents only: dump() recurses.
  int depth = 0;
  json::parser_callback_t deep = [&](int d, json::parse_event_t, json&) {
    depth = std::max(depth, d);
    return true;
  };
  json doc = json::parse(data, data + size, deep, false);
  if (doc.is_discarded() || depth > 32) return LLVMFuzzerMutate(data, size, max_size);
  for (unsigned k = 1 + rng() % 3; k > 0; --k) mutate(doc, rng);
  std::string out = doc.dump();
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // A weights file that fuzzed models can name as "fuzz.safetensors".
  g_dir =
      (std::filesystem::temp_directory_path() / fmt::format("epilog-fuzz-{}", getpid())).string();
  std::filesystem::create_directories(g_dir);
  epilog::write_safetensors(g_dir + "/fuzz.safetensors",
                            {{"w", epilog::Tensor::full({4, 3, 3, 3}, 0.5f)},
                             {"b", epilog::Tensor::full({4}, -1.0f)},
                             {"bn.num_batches_tracked", epilog::Tensor::zeros({})}});
  epilog::register_allocator(epilog::Device::CPU, capped_alloc);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  g_budget = size_t(4) << 20;
  epilog::Graph g;
  try {
    g = epilog::parse_json_model(text, "fuzz.json", g_dir);
  } catch (const epilog::Error&) {
    return 0;
  }
  // The dumps must work on anything the loader accepts.
  (void)epilog::dump_text(g);
  (void)epilog::dump_dot(g);
  g_budget = size_t(4) << 20;
  try {
    epilog::Graph back = epilog::parse_json_model(epilog::dump_json(g), "dumped.json", g_dir);
    if (!same(g, back)) {
      std::fprintf(stderr, "round trip changed the graph\n");
      std::abort();
    }
  } catch (const epilog::Error& e) {
    std::fprintf(stderr, "a loaded model does not load again after dump_json: %s\n", e.what());
    std::abort();
  }
  g_budget = size_t(4) << 20;
  try {
    epilog::LoadOptions options;
    options.batch = 3;
    (void)epilog::parse_json_model(text, "fuzz.json", g_dir, options);
  } catch (const epilog::Error&) {
  }
  return 0;
}
