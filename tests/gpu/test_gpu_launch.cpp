// What runs is what explain says (issue 49): graphs that together make the selectors pick every
// kernel the CUDA launchers choose among (test::launch_cases; test_launch.cpp checks on the CPU
// that explain names them all) and every models/*.json run once with a LaunchLog installed. Each
// conv, max-pool and linear layer that runs a kernel of its own must log exactly one launch,
// equal to explain's kernel and tiles columns for it (node_choices), no other node may log one,
// and the launches must cover every family (test::launch_families): a graph set that silently
// covered nothing would fail.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "epilog/epilog.h"
#include "epilog/io/model.h"
#include "epilog/runtime/launch_log.h"
#include "gpu_util.h"
#include "launch_graphs.h"
#include "test_util.h"
#include "yolo_like.h"

using namespace epilog;

namespace {

// Runs `plan` once on the GPU (no CUDA graph: its capture would log every launch again) with a
// log installed, and checks every node's launches against node_choices. Adds the launches'
// families to `covered`.
void check_launches(const std::string& what, const Plan& plan, std::set<std::string>& covered) {
  const std::vector<NodeChoice> want = node_choices(plan, in_place_mask(plan));
  std::unique_ptr<Backend> backend = make_backend(Device::CUDA);
  Executor ex(plan, *backend);
  ex.set_recording(false);
  std::vector<LaunchRecord> records;
  {
    LaunchLog log;
    ex.run(test::random_inputs(plan.graph, 7));
    records = log.records();
  }
  std::map<std::string, std::vector<const LaunchRecord*>> by_node;
  for (const LaunchRecord& r : records) by_node[r.node].push_back(&r);
  for (const auto& [node, launches] : by_node) {
    INFO(what << ": launches logged for '" << node << "'");
    CHECK(plan.graph.find_node(node) != nullptr);
  }
  for (size_t i = 0; i < want.size(); ++i) {
    const Node& n = plan.graph.nodes[i];
    const NodeChoice& c = want[i];
    const std::vector<const LaunchRecord*>& got = by_node[n.name];
    INFO(what << ", node '" << n.name << "' (" << op_name(n.op) << "): explain says '" << c.kernel
              << "' '" << c.tiles << "' (" << c.rule << ")");
    CHECK(test::has_launch_choice(plan, c, i) == !c.tiles.empty());
    if (c.tiles.empty()) {
      CHECK(got.empty());
      continue;
    }
    REQUIRE(got.size() == 1);
    CHECK(got[0]->kernel == c.kernel);
    CHECK(got[0]->tiles == c.tiles);
    covered.insert(test::launch_family(got[0]->kernel, got[0]->tiles));
  }
}

// Every case on `profile` (the SM count fixed, so that the choices do not depend on the card),
// then checks that the launches covered every family.
void check_cases(const DeviceProfile& profile) {
  std::set<std::string> covered;
  for (const test::LaunchCase& c : test::launch_cases()) {
    check_launches(c.name, test::launch_plan(c, profile), covered);
  }
  std::string all;
  for (const std::string& f : covered) all += "\n  " + f;
  INFO("covered:" << all);
  for (const std::string& f : test::launch_families(profile.wgmma, profile.cc_major >= 9)) {
    INFO("family " << f);
    CHECK(covered.count(f) == 1);
  }
}

// This device's profile on the SM count of the default one (the cases are sized for it).
DeviceProfile profile_here(bool wgmma) {
  DeviceProfile p = cuda_device_profile().value_or(h200_profile());
  p.sm_count = h200_profile().sm_count;
  p.wgmma = wgmma;
  return p;
}

}  // namespace

TEST_CASE("gpu launch: every kernel that runs is the one explain names, on the mma.sync kernels",
          "[gpu][launch]") {
  check_cases(profile_here(false));
}

TEST_CASE("gpu launch: every kernel that runs is the one explain names, with the wgmma kernels",
          "[gpu][launch][sm90a]") {
  check_cases(profile_here(true));
}

TEST_CASE("gpu launch: models/*.json and the YOLO-like model at batch 2 launch what explain names",
          "[gpu][launch]") {
  std::vector<std::pair<std::string, Graph>> models;
  for (const std::filesystem::path& file : test::model_files())
    models.push_back({file.filename().string(), load_model(file.string())});
  Builder b(/*seed=*/1);
  models.push_back({"yolo_like at batch 2", yolo::yolo_like(b, /*batch=*/2, /*size=*/128)});
  // As the selector picks on this device, with copy avoidance on (at batch 2 the in-place
  // values are strided slabs of their concat's buffer) and off.
  std::set<std::string> covered;
  for (const auto& [name, graph] : models) {
    for (const bool in_place : {true, false}) {
      CompileOptions o;
      o.device = Device::CUDA;
      o.in_place = in_place;
      Compiled c = compile(graph, o);
      check_launches(name + (in_place ? "" : ", copied"), c.plan, covered);
    }
  }
  // A DenseNet-BC block with its batchnorm -> relu folded into the 1x1s' loads (prologues).
  CompileOptions pro;
  pro.device = Device::CUDA;
  check_launches("DenseNet-BC block, prologues",
                 compile(test::dense_block(8, 32, 32, 3, 32, 128), pro).plan, covered);
  std::string all;
  for (const std::string& f : covered) all += "\n  " + f;
  INFO("covered:" << all);
  CHECK(std::any_of(covered.begin(), covered.end(),
                    [](const std::string& f) { return f.rfind("gemm ", 0) == 0; }));
  CHECK(covered.count("scalar depthwise") == 1);  // effnet_like's depthwise convs
  if (cuda_device_profile() && cuda_device_profile()->wgmma) {
    CHECK(covered.count("gemm direct wgmma pro") == 1);
    CHECK(covered.count("gemm direct wgmma tma pro") == 1);
  }
}
