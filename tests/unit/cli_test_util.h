#pragma once
// Runs the `sparrow` binary as a user would and captures what it printed and how it exited.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "runtime/resources.h"

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
  const auto dir = std::filesystem::temp_directory_path() / ("sparrow-cli-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
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

// The default model as the tools find it (runtime/resources.h), or "" when it is not installed.
inline std::string default_model_path() {
  const std::filesystem::path p = resources::default_model().path;
  return !p.empty() && std::filesystem::exists(p) ? p.string() : "";
}

}  // namespace sparrow::testing
