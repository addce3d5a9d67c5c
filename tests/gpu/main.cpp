// The GPU tests' main: Catch as usual on a machine with a CUDA device; without one, the
// selected test cases are reported as skipped with exit code 77 (ctest's SKIP_RETURN_CODE).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <iostream>

#include "epilog/runtime/executor.h"

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
    const Catch::Config& config = session.config();
    const std::vector<Catch::TestCase> tests =
        Catch::filterTests(Catch::getAllTestCasesSorted(config), config.testSpec(), config);
    std::cout << "SKIPPED: no CUDA device; GPU tests not run:";
    for (size_t i = 0; i < tests.size(); ++i)
      std::cout << (i ? "; " : " ") << tests[i].getTestCaseInfo().name;
    std::cout << std::endl;
    return 77;
  }
  return session.run();
}
