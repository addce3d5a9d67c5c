// ONNX models built in C++ with the ONNX protobuf classes, for the importer's tests, and what
// those tests check them with.
#pragma once

#ifdef EPILOG_HAVE_ONNX

#include <onnx/onnx_pb.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "epilog/io/onnx.h"
#include "error_matcher.h"
#include "test_util.h"

namespace epilog::onnx_test {

namespace fs = std::filesystem;
using onnx::TensorProto;

inline fs::path scratch() {
  return test::scratch_dir();
}

// check_error, and the error is OnnxUnsupported exactly when `unsupported`.
template <typename F>
void check_import_error(F&& f, std::initializer_list<std::string> parts, bool unsupported = false) {
  test::check_error(std::forward<F>(f), parts, [&](const Error& e) {
    CHECK((dynamic_cast<const OnnxUnsupported*>(&e) != nullptr) == unsupported);
  });
}

enum class Store { Raw, Typed, F16Raw, F16Typed };

inline uint16_t f32_to_f16(float f) {  // exact for the small values used here
  uint32_t b;
  std::memcpy(&b, &f, 4);
  uint32_t sign = (b >> 16) & 0x8000, exp = (b >> 23) & 0xff, man = b & 0x7fffff;
  if (exp == 0) return uint16_t(sign);
  return uint16_t(sign | ((exp - 112) << 10) | (man >> 13));
}

// A model under construction: the graph, its inputs, outputs, initializers and nodes.
struct Model {
  onnx::ModelProto m;

  explicit Model(int64_t opset = 17) {
    m.set_ir_version(8);
    m.set_producer_name("epilog-test");
    auto* o = m.add_opset_import();
    o->set_domain("");
    o->set_version(opset);
    m.mutable_graph()->set_name("test");
  }
  onnx::GraphProto& g() { return *m.mutable_graph(); }

  // dims < 0 are symbolic ("batch").
  void input(const std::string& name, const Shape& dims, int dtype = TensorProto::FLOAT) {
    auto* t = g().add_input();
    t->set_name(name);
    auto* tt = t->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(dtype);
    for (int64_t d : dims) {
      auto* dim = tt->mutable_shape()->add_dim();
      if (d < 0)
        dim->set_dim_param("batch");
      else
        dim->set_dim_value(d);
    }
  }
  void output(const std::string& name) {
    auto* t = g().add_output();
    t->set_name(name);
    t->mutable_type()->mutable_tensor_type()->set_elem_type(TensorProto::FLOAT);
  }
  onnx::NodeProto& node(const std::string& op, const std::vector<std::string>& ins,
                        const std::vector<std::string>& outs, const std::string& name = "") {
    auto* n = g().add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (const auto& i : ins) n->add_input(i);
    for (const auto& o : outs) n->add_output(o);
    return *n;
  }
  TensorProto& init(const std::string& name, const Shape& dims, const std::vector<float>& v,
                    Store store = Store::Raw) {
    TensorProto* t = g().add_initializer();
    fill(*t, name, dims, v, store);
    return *t;
  }
  static void fill(TensorProto& t, const std::string& name, const Shape& dims,
                   const std::vector<float>& v, Store store = Store::Raw) {
    t.set_name(name);
    for (int64_t d : dims) t.add_dims(d);
    bool half = store == Store::F16Raw || store == Store::F16Typed;
    t.set_data_type(half ? TensorProto::FLOAT16 : TensorProto::FLOAT);
    std::vector<uint16_t> h;
    for (float x : v) h.push_back(f32_to_f16(x));
    switch (store) {
      case Store::Raw:
        t.set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4));
        break;
      case Store::Typed:
        for (float x : v) t.add_float_data(x);
        break;
      case Store::F16Raw:
        t.set_raw_data(std::string(reinterpret_cast<const char*>(h.data()), h.size() * 2));
        break;
      case Store::F16Typed:
        for (uint16_t x : h) t.add_int32_data(x);
        break;
    }
  }
  TensorProto& ints(const std::string& name, const std::vector<int64_t>& v) {
    TensorProto* t = g().add_initializer();
    t->set_name(name);
    t->add_dims(int64_t(v.size()));
    t->set_data_type(TensorProto::INT64);
    for (int64_t x : v) t->add_int64_data(x);
    return *t;
  }
  TensorProto& int_scalar(const std::string& name, int64_t v) {
    TensorProto& t = ints(name, {v});
    t.clear_dims();
    return t;
  }
  // An initializer of random values (seeded) of `dims`.
  Tensor random(const std::string& name, const Shape& dims, uint64_t seed) {
    Tensor t = Tensor::randn(dims, seed);
    init(name, dims, std::vector<float>(t.f32(), t.f32() + t.numel()));
    return t;
  }

  std::string bytes() const { return m.SerializeAsString(); }
  std::string save(const std::string& file) const {
    std::string path = (scratch() / file).string();
    std::ofstream(path, std::ios::binary) << bytes();
    return path;
  }
  Graph load(const LoadOptions& options = {}) const {
    std::string b = bytes();
    return parse_onnx(b.data(), b.size(), "m.onnx", scratch().string(), options);
  }
};

inline onnx::AttributeProto& attr(onnx::NodeProto& n, const std::string& name,
                                  onnx::AttributeProto::AttributeType type) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(type);
  return *a;
}
inline void set_i(onnx::NodeProto& n, const std::string& name, int64_t v) {
  attr(n, name, onnx::AttributeProto::INT).set_i(v);
}
inline void set_f(onnx::NodeProto& n, const std::string& name, float v) {
  attr(n, name, onnx::AttributeProto::FLOAT).set_f(v);
}
inline void set_s(onnx::NodeProto& n, const std::string& name, const std::string& v) {
  attr(n, name, onnx::AttributeProto::STRING).set_s(v);
}
inline void set_ints(onnx::NodeProto& n, const std::string& name, const std::vector<int64_t>& v) {
  auto& a = attr(n, name, onnx::AttributeProto::INTS);
  for (int64_t x : v) a.add_ints(x);
}

inline std::vector<float> values(const Tensor& t) {
  return std::vector<float>(t.f32(), t.f32() + t.numel());
}

inline Tensor run1(const Graph& g, const Tensor& x, const std::string& in = "x",
                   const std::string& out = "y") {
  return test::run_cpu(g, {{in, x}}).at(out);
}

inline int count(const Graph& g, OpKind op) {
  auto c = g.op_counts();
  return c.count(op) ? c.at(op) : 0;
}

}  // namespace epilog::onnx_test

#endif  // EPILOG_HAVE_ONNX
