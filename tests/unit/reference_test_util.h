#pragma once
// Tests that compare with the llama.cpp reference build (scripts/build-llama-cpp). On a developer's machine a
// missing reference skips them with the reason; under CI (CI=true, as CI services set it) it fails them, so a
// green CI run always includes the comparison.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace sparrow::testing {

inline bool running_under_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

}  // namespace sparrow::testing

// Returns from the test when `available` is false: a failure under CI, a skip elsewhere; `why` says what is
// missing and how to get it.
#define REQUIRE_LLAMA_CPP_REFERENCE(available, why)                                        \
  if (!(available)) {                                                                      \
    if (::sparrow::testing::running_under_ci()) FAIL() << (why) << " (required under CI)"; \
    GTEST_SKIP() << (why);                                                                 \
  }
