// REQUIRE_ERROR: the expression throws an epilog::Error whose message names every part given
// (the file, the node, the problem...), so that a test pins what the user reads.
#pragma once

#include <catch2/catch.hpp>

#include <exception>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "epilog/common.h"

namespace epilog::test {

class Says : public Catch::MatcherBase<std::exception> {
 public:
  explicit Says(std::vector<std::string> parts) : parts_(std::move(parts)) {}
  bool match(const std::exception& e) const override {
    const std::string msg = e.what();
    for (const std::string& p : parts_)
      if (msg.find(p) == std::string::npos) return false;
    return true;
  }
  std::string describe() const override {
    std::string d = "message contains all of:";
    for (const std::string& p : parts_) d += " \"" + p + "\"";
    return d;
  }

 private:
  std::vector<std::string> parts_;
};

// The same for a callable, checking each part on its own (every missing one is reported) and,
// when given, `also` on the error.
template <typename F>
void check_error(F&& f, std::initializer_list<std::string> parts,
                 const std::function<void(const Error&)>& also = {}) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO("message: " << msg);
    for (const std::string& p : parts) CHECK_THAT(msg, Catch::Contains(p));
    if (also) also(e);
    return;
  }
  FAIL("no error was thrown");
}

}  // namespace epilog::test

#define REQUIRE_ERROR(expr, ...) \
  REQUIRE_THROWS_MATCHES(expr, epilog::Error, epilog::test::Says({__VA_ARGS__}))
