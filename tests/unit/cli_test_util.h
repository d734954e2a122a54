#pragma once
// Runs the `sparrow` binary as a user would and captures what it printed and how it exited.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "runtime/resources.h"
#include "scratch_dir.h"

namespace sparrow::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// args is appended to the binary path as shell words (quote them yourself).
inline CommandResult run_sparrow(const std::string& args, const std::string& stdin_text = "") {
  const std::filesystem::path& dir = scratch_dir();
  const auto in = dir / "stdin", out = dir / "stdout", err = dir / "stderr";
  std::ofstream(in) << stdin_text;
  const std::string cmd = std::string(SPARROW_CLI_PATH) + " " + args + " <" + in.string() + " >" + out.string() +
                          " 2>" + err.string();
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_text(out);
  r.err = read_text(err);
  return r;
}

// The model `sparrow mkmodel ARGS -o FILE` writes (a random-weight GGUF), made once per process and ARGS in the
// process's scratch folder; a failure to make it fails the calling test.
inline const std::filesystem::path& mkmodel_once(const std::string& args) {
  static std::map<std::string, std::filesystem::path> made;
  auto it = made.find(args);
  if (it != made.end()) return it->second;
  const std::filesystem::path p = scratch_dir() / ("model-" + std::to_string(made.size()) + ".gguf");
  const CommandResult r = run_sparrow("mkmodel " + args + " -o " + p.string());
  EXPECT_EQ(r.exit_code, 0) << "mkmodel " << args << ": " << r.err;
  return made.emplace(args, p).first->second;
}

// The default model as the tools find it (runtime/resources.h), or "" when it is not installed.
inline std::string default_model_path() {
  const std::filesystem::path p = resources::default_model().path;
  return !p.empty() && std::filesystem::exists(p) ? p.string() : "";
}

}  // namespace sparrow::testing
