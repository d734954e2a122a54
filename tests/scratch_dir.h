#pragma once
// The one place tests write files: a folder of this test process's own, removed with everything in it when the
// process exits. ctest runs every test case as its own process, thousands per suite run, so a file left behind
// by each (a random-weight model is up to 250 MB) fills a CI disk within a few runs.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace sparrow::testing {

// Under $SPARROW_TEST_TMPDIR when set (CMake sets it to a folder of the build tree, so that even a process killed
// by a timeout leaves its files where a clean checkout discards them), else under the system's temporary folder.
inline const std::filesystem::path& scratch_dir() {
  struct Owned {
    std::filesystem::path path;
    Owned() {
      const char* root = std::getenv("SPARROW_TEST_TMPDIR");
      path = (root != nullptr && *root != '\0' ? std::filesystem::path(root) : std::filesystem::temp_directory_path()) /
             ("sparrow-test-" + std::to_string(::getpid()));
      std::filesystem::remove_all(path);  // a folder of an earlier process that had the same id
      std::filesystem::create_directories(path);
    }
    ~Owned() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Owned dir;
  return dir.path;
}

}  // namespace sparrow::testing
