// libFuzzer target for the ONNX importer: any bytes must import or throw epilog::Error, and what
// imports must be a graph the rest of epilog takes: it dumps, survives the JSON round trip and
// the pass pipeline.
//
// Byte mutations of a protobuf mostly break its framing and so test protobuf, not the importer.
// A custom mutator therefore edits the parsed model most of the time (op types, attributes,
// input names, dims, dtypes, opset, node order), with values drawn from the model itself and
// from the edge cases of the format.
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "epilog/graph/passes.h"
#include "epilog/io/dump.h"
#include "epilog/io/model.h"
#include "epilog/io/onnx.h"

#include "fuzz_alloc.h"

namespace {

std::string g_dir;

const int64_t kInts[] = {0,
                         1,
                         -1,
                         2,
                         3,
                         4,
                         5,
                         7,
                         -2,
                         2147483647,
                         -2147483648,
                         int64_t(1) << 40,
                         std::numeric_limits<int64_t>::max(),
                         std::numeric_limits<int64_t>::min()};
const char* kOps[] = {"Conv",
                      "BatchNormalization",
                      "Relu",
                      "Sigmoid",
                      "Add",
                      "Mul",
                      "Sub",
                      "Div",
                      "Concat",
                      "Split",
                      "Slice",
                      "MaxPool",
                      "AveragePool",
                      "GlobalAveragePool",
                      "Resize",
                      "Upsample",
                      "Flatten",
                      "Gemm",
                      "MatMul",
                      "Identity",
                      "Constant",
                      "Shape",
                      "Gather",
                      "Unsqueeze",
                      "Squeeze",
                      "Reshape",
                      "Cast",
                      "Transpose",
                      "ConstantOfShape",
                      "ReduceMean",
                      "CastLike",
                      "Dropout",
                      "Clip",
                      "Pad",
                      "Sum",
                      "Mean",
                      "Softmax"};
const char* kAttrs[] = {"axis",
                        "axes",
                        "split",
                        "starts",
                        "ends",
                        "pads",
                        "strides",
                        "dilations",
                        "group",
                        "kernel_shape",
                        "auto_pad",
                        "ceil_mode",
                        "count_include_pad",
                        "storage_order",
                        "epsilon",
                        "training_mode",
                        "mode",
                        "coordinate_transformation_mode",
                        "nearest_mode",
                        "scales",
                        "transA",
                        "transB",
                        "alpha",
                        "beta",
                        "perm",
                        "to",
                        "value",
                        "allowzero",
                        "broadcast",
                        "is_test",
                        "spatial",
                        "start",
                        "end",
                        "num_outputs",
                        "keepdims",
                        "noop_with_empty_axes",
                        "antialias",
                        "keep_aspect_ratio_policy",
                        "saturate",
                        "ratio",
                        "seed",
                        "min",
                        "max"};
const char* kStrings[] = {"NOTSET",
                          "SAME_UPPER",
                          "SAME_LOWER",
                          "VALID",
                          "nearest",
                          "linear",
                          "asymmetric",
                          "half_pixel",
                          "floor",
                          "round_prefer_floor",
                          "tf_half_pixel_for_nn",
                          "half_pixel_symmetric",
                          "stretch",
                          "not_larger",
                          "not_smaller",
                          "constant",
                          "reflect",
                          "edge",
                          "wrap",
                          ""};

template <typename T, size_t N>
const T& pick(const T (&a)[N], std::minstd_rand& rng) {
  return a[rng() % N];
}

// Every value name of the model, to rewire inputs with.
std::vector<std::string> names(const onnx::GraphProto& g) {
  std::vector<std::string> out = {""};
  for (const auto& v : g.input()) out.push_back(v.name());
  for (const auto& t : g.initializer()) out.push_back(t.name());
  for (const auto& n : g.node())
    for (const auto& o : n.output()) out.push_back(o);
  return out;
}

void mutate_attr(onnx::AttributeProto& a, std::minstd_rand& rng) {
  switch (rng() % 5) {
    case 0:
      a.set_i(pick(kInts, rng));
      a.set_type(onnx::AttributeProto::INT);
      break;
    case 1:
      if (a.ints_size() > 0 && rng() % 2)
        a.set_ints(int(rng() % unsigned(a.ints_size())), pick(kInts, rng));
      else if (rng() % 2)
        a.add_ints(pick(kInts, rng));
      else
        a.clear_ints();
      a.set_type(onnx::AttributeProto::INTS);
      break;
    case 2:
      a.set_f(std::vector<float>{0.f, 1.f, 0.5f, 2.f, 1e-5f, -1.f, INFINITY, NAN}[rng() % 8]);
      a.set_type(onnx::AttributeProto::FLOAT);
      break;
    case 3:
      a.set_s(pick(kStrings, rng));
      a.set_type(onnx::AttributeProto::STRING);
      break;
    default:
      a.set_type(onnx::AttributeProto::AttributeType(rng() % 15));
      break;
  }
}

void mutate(onnx::ModelProto& m, std::minstd_rand& rng) {
  onnx::GraphProto& g = *m.mutable_graph();
  const int nodes = g.node_size();
  onnx::NodeProto* n = nodes ? g.mutable_node(int(rng() % unsigned(nodes))) : nullptr;
  switch (rng() % 10) {
    case 0:
      if (n) n->set_op_type(pick(kOps, rng));
      break;
    case 1:  // change or add an attribute
      if (n && n->attribute_size() && rng() % 2) {
        mutate_attr(*n->mutable_attribute(int(rng() % unsigned(n->attribute_size()))), rng);
      } else if (n) {
        auto* a = n->add_attribute();
        a->set_name(pick(kAttrs, rng));
        mutate_attr(*a, rng);
      }
      break;
    case 2:  // rewire an input, or drop one
      if (n && n->input_size()) {
        std::vector<std::string> all = names(g);
        int k = int(rng() % unsigned(n->input_size()));
        if (rng() % 4 == 0)
          n->mutable_input()->DeleteSubrange(k, 1);
        else
          n->set_input(k, all[rng() % all.size()]);
      } else if (n) {
        std::vector<std::string> all = names(g);
        n->add_input(all[rng() % all.size()]);
      }
      break;
    case 3:  // drop, duplicate or swap nodes
      if (nodes > 1 && rng() % 2)
        g.mutable_node()->SwapElements(int(rng() % unsigned(nodes)), int(rng() % unsigned(nodes)));
      else if (n && rng() % 2)
        *g.add_node() = *n;
      else if (n)
        g.mutable_node()->DeleteSubrange(int(rng() % unsigned(nodes)), 1);
      break;
    case 4:  // an initializer's dims, dtype or data
      if (g.initializer_size()) {
        auto& t = *g.mutable_initializer(int(rng() % unsigned(g.initializer_size())));
        int what = int(rng() % 4);
        if (what == 0 && t.dims_size())
          t.set_dims(int(rng() % unsigned(t.dims_size())), pick(kInts, rng));
        if (what == 1) t.set_data_type(int(rng() % 17));
        if (what == 2 && t.has_raw_data()) t.mutable_raw_data()->resize(rng() % 64);
        if (what == 3) t.add_int64_data(pick(kInts, rng));
      }
      break;
    case 5:  // a graph input's dims or dtype
      if (g.input_size()) {
        auto* tt = g.mutable_input(int(rng() % unsigned(g.input_size())))
                       ->mutable_type()
                       ->mutable_tensor_type();
        if (rng() % 3 == 0) {
          tt->set_elem_type(int(rng() % 17));
        } else if (tt->shape().dim_size()) {
          auto* d = tt->mutable_shape()->mutable_dim(int(rng() % unsigned(tt->shape().dim_size())));
          if (rng() % 4 == 0)
            d->set_dim_param("batch");
          else
            d->set_dim_value(pick(kInts, rng));
        }
      }
      break;
    case 6:
      if (m.opset_import_size()) m.mutable_opset_import(0)->set_version(rng() % 23);
      break;
    case 7:  // a graph output names another value
      if (g.output_size()) {
        std::vector<std::string> all = names(g);
        g.mutable_output(int(rng() % unsigned(g.output_size())))->set_name(all[rng() % all.size()]);
      }
      break;
    case 8:  // a node output is renamed or added
      if (n) {
        std::vector<std::string> all = names(g);
        if (rng() % 2 && n->output_size())
          n->set_output(int(rng() % unsigned(n->output_size())), all[rng() % all.size()]);
        else
          n->add_output(fmt::format("o{}", rng() % 8));
      }
      break;
    default:  // external data for an initializer
      if (g.initializer_size()) {
        auto& t = *g.mutable_initializer(int(rng() % unsigned(g.initializer_size())));
        t.clear_raw_data();
        t.set_data_location(onnx::TensorProto::EXTERNAL);
        auto* e = t.add_external_data();
        e->set_key(std::vector<const char*>{"location", "offset", "length"}[rng() % 3]);
        e->set_value(
            std::vector<const char*>{"fuzz.bin", "0", "16", "../fuzz.bin", "x"}[rng() % 5]);
      }
      break;
  }
}

}  // namespace

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  std::minstd_rand rng(seed);
  onnx::ModelProto m;
  if (rng() % 4 == 0 || size > size_t(std::numeric_limits<int>::max()) ||
      !m.ParseFromArray(data, int(size)) || !m.has_graph())
    return LLVMFuzzerMutate(data, size, max_size);
  for (unsigned k = 1 + rng() % 3; k > 0; --k) mutate(m, rng);
  std::string out = m.SerializeAsString();
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // An external data file that fuzzed models can name as "fuzz.bin".
  g_dir = (std::filesystem::temp_directory_path() / fmt::format("epilog-fuzz-onnx-{}", getpid()))
              .string();
  std::filesystem::create_directories(g_dir);
  std::ofstream(g_dir + "/fuzz.bin", std::ios::binary) << std::string(64, '\x3f');
  epilog::register_allocator(epilog::Device::CPU, capped_alloc);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  g_budget = size_t(4) << 20;
  epilog::Graph g;
  try {
    g = epilog::parse_onnx(data, size, "fuzz.onnx", g_dir);
  } catch (const epilog::Error&) {
    return 0;
  }
  (void)epilog::dump_text(g);
  (void)epilog::dump_dot(g);
  // The JSON model format cannot hold non-finite numbers, and names must be UTF-8 for it.
  bool finite = true;
  for (const auto& [name, w] : g.weights)
    for (int64_t i = 0; i < w.data.numel(); ++i) finite = finite && std::isfinite(w.data.f32()[i]);
  std::string text;
  try {
    text = epilog::dump_json(g);
  } catch (const nlohmann::json::exception&) {
    finite = false;
  }
  g_budget = size_t(4) << 20;
  if (finite) {
    try {
      epilog::Graph back = epilog::parse_json_model(text, "dumped.json", g_dir);
      if (!(back.inputs == g.inputs && back.outputs == g.outputs && back.nodes == g.nodes &&
            back.values == g.values)) {
        std::fprintf(stderr, "the JSON round trip changed the imported graph\n");
        std::abort();
      }
    } catch (const epilog::Error& e) {
      std::fprintf(stderr, "an imported graph does not load from its JSON dump: %s\n", e.what());
      std::abort();
    }
  }
  g_budget = size_t(4) << 20;
  try {
    epilog::optimize(g);
  } catch (const epilog::Error& e) {
    std::fprintf(stderr, "the passes failed on an imported graph: %s\n", e.what());
    std::abort();
  }
  g_budget = size_t(4) << 20;
  try {
    epilog::LoadOptions options;
    options.batch = 2;
    (void)epilog::parse_onnx(data, size, "fuzz.onnx", g_dir, options);
  } catch (const epilog::Error&) {
  }
  return 0;
}
