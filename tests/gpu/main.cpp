// The GPU tests' main: Catch as usual on a machine with a CUDA device. Test cases that cannot run
// here are skipped, never passed: without a device the selected ones are reported as skipped
// with exit code 77 (ctest's SKIP_RETURN_CODE); without warpgroup MMA (compute capability 9.0
// and an sm_90a build) so are those tagged [sm90a], and the others run.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <iostream>

#include "gpu_util.h"

namespace {

constexpr int kSkipped = 77;

std::vector<Catch::TestCase> selected(Catch::Session& session) {
  const Catch::Config& config = session.config();
  return Catch::filterTests(Catch::getAllTestCasesSorted(config), config.testSpec(), config);
}

bool needs_wgmma(const Catch::TestCase& t) {
  const std::vector<std::string>& tags = t.getTestCaseInfo().lcaseTags;
  return std::find(tags.begin(), tags.end(), "sm90a") != tags.end();
}

// Prints "SKIPPED: <why>: <test names>".
void report_skipped(const std::string& why, const std::vector<Catch::TestCase>& tests) {
  std::cout << "SKIPPED: " << why << ":";
  for (size_t i = 0; i < tests.size(); ++i)
    std::cout << (i ? "; " : " ") << tests[i].getTestCaseInfo().name;
  std::cout << std::endl;
}

// `spec` (a test spec argument) with each of its alternatives, the parts between unescaped
// commas, also excluding [sm90a].
std::string without_wgmma(const std::string& spec) {
  std::string out = "~[sm90a] ";
  for (size_t i = 0; i < spec.size(); ++i) {
    out += spec[i];
    if (spec[i] == '\\' && i + 1 < spec.size())
      out += spec[++i];
    else if (spec[i] == ',')
      out += "~[sm90a] ";
  }
  return out;
}

}  // namespace

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  const Catch::ConfigData& data = session.configData();
  // Listing needs no device: catch_discover_tests lists the tests at build time on machines
  // that may have none.
  if (data.showHelp || data.libIdentify || data.listTests || data.listTestNamesOnly ||
      data.listTags || data.listReporters)
    return session.run();
  if (!epilog::cuda_available()) {
    report_skipped("no CUDA device; GPU tests not run", selected(session));
    return kSkipped;
  }
  if (!epilog::test::wgmma_here()) {
    std::vector<Catch::TestCase> skip, run;
    for (const Catch::TestCase& t : selected(session)) (needs_wgmma(t) ? skip : run).push_back(t);
    if (!skip.empty()) {
      report_skipped("no warpgroup MMA here (needs compute capability 9.0 and an sm_90a build)",
                     skip);
      if (run.empty()) return kSkipped;
      Catch::ConfigData rest = data;
      if (rest.testsOrTags.empty()) rest.testsOrTags.push_back("");
      for (std::string& spec : rest.testsOrTags) spec = without_wgmma(spec);
      session.useConfigData(rest);
    }
  }
  return session.run();
}
