// `sparrow mkmodel`: writes a Gemma 3 / Gemma 4 GGUF with deterministic random weights in llama.cpp's exact
// layout, with a real 262144-token vocabulary copied from another GGUF. Tests and benchmarks use these files to
// compare Sparrow with llama.cpp on every mechanism of the architectures without downloading gigabytes of real
// weights. Presets: mkmodel_presets.h. What is written: mkmodel_plan.h. User guide: docs/mkmodel.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "formats/weight_formats.h"
#include "gguf/gguf.h"
#include "mkmodel_plan.h"
#include "mkmodel_presets.h"
#include "runtime/resources.h"
#include "util/error.h"

namespace sparrow::tools {
namespace mkmodel {
namespace {

// ---------------------------------------------------------------------------------------------------------
// Deterministic random values: a counter-based generator (splitmix64's mixer over seed, tensor name and element
// index), so every element is reproducible on its own and threads can fill any rows in any order.

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

class RandomStream {
 public:
  RandomStream(uint64_t seed, const std::string& tensor_name) : key_(mix64(mix64(seed) ^ fnv1a(tensor_name))) {}

  float value(const Fill& fill, uint64_t index) const {
    const uint64_t bits = mix64(key_ + (index + 1) * 0x9E3779B97F4A7C15ull);
    if (fill.kind == Fill::Kind::Uniform) {
      const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
      return fill.center + fill.spread * (2.0f * u - 1.0f);
    }
    // Sum of four 16-bit uniforms (Irwin-Hall): bell-shaped, unit variance after scaling, tails cut at 3.5
    // sigma. One 64-bit draw per element, several times cheaper than Box-Muller for billions of weights.
    const double sum = static_cast<double>((bits & 0xFFFF) + ((bits >> 16) & 0xFFFF) + ((bits >> 32) & 0xFFFF) +
                                           (bits >> 48));
    constexpr double kMean = 4 * 65535 / 2.0;
    const double kStddev = std::sqrt((65536.0 * 65536.0 - 1) / 3.0);
    return fill.center + fill.spread * static_cast<float>((sum - kMean) / kStddev);
  }

 private:
  uint64_t key_;
};

// ---------------------------------------------------------------------------------------------------------
// The vocabulary

Vocabulary read_vocabulary(const std::string& path) {
  const std::unique_ptr<gguf::File> file = gguf::File::open(path);
  Vocabulary vocab;
  vocab.n_tokens = file->get_string_array("tokenizer.ggml.tokens").size();
  if (vocab.n_tokens == 0) throw Error(path + ": tokenizer.ggml.tokens: empty, --vocab needs a tokenizer");
  for (const auto& [key, value] : file->metadata()) {
    if (key.rfind("tokenizer.", 0) == 0) vocab.keys.push_back({key, value});
  }
  return vocab;
}

std::string default_vocab_path(Architecture arch) {
  const std::filesystem::path path =
      arch == Architecture::Gemma4 ? resources::gemma4_vocab_path() : resources::default_model().path;
  if (path.empty())
    throw Error(std::string("no --vocab given and the default (") +
                (arch == Architecture::Gemma4 ? "shared/fixtures/ggml-vocab-gemma-4.gguf; set SPARROW_SHARED"
                                              : "the Gemma 3 270M model; set SPARROW_MODEL") +
                ") was not found");
  return path.string();
}

// ---------------------------------------------------------------------------------------------------------
// Producing tensor bytes

// Fills rows [first, first + n) of a tensor into `out` (row_bytes each), one row of floats at a time.
void produce_rows(const PlannedTensor& t, const RandomStream& rng, int64_t first, int64_t n, uint8_t* out) {
  const int64_t row_length = t.ne[0];
  const size_t row_bytes = tensor_row_bytes(t.type, row_length);
  std::vector<float> row(static_cast<size_t>(row_length));
  for (int64_t r = first; r < first + n; ++r) {
    const uint64_t base = static_cast<uint64_t>(r) * static_cast<uint64_t>(row_length);
    for (int64_t i = 0; i < row_length; ++i) row[size_t(i)] = rng.value(t.fill, base + uint64_t(i));
    formats::quantize_row(t.type, row.data(), out + size_t(r - first) * row_bytes, row_length);
  }
}

// Fills rows [first, first + n) into `out` on up to n_threads threads; each thread takes a contiguous run.
void produce_rows_in_parallel(const PlannedTensor& t, const RandomStream& rng, int64_t first, int64_t n,
                              unsigned n_threads, uint8_t* out) {
  const int64_t workers = std::min<int64_t>(n_threads, std::max<int64_t>(1, n * t.ne[0] / 65536));
  if (workers <= 1) return produce_rows(t, rng, first, n, out);
  const size_t row_bytes = tensor_row_bytes(t.type, t.ne[0]);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(workers));
  const int64_t per_worker = (n + workers - 1) / workers;
  for (int64_t w = 0; w < workers; ++w) {
    const int64_t begin = w * per_worker, count = std::min(per_worker, n - begin);
    if (count <= 0) break;
    threads.emplace_back([&, w, begin, count] {
      try {
        produce_rows(t, rng, first + begin, count, out + size_t(begin) * row_bytes);
      } catch (...) {
        errors[size_t(w)] = std::current_exception();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

void produce_tensor(const PlannedTensor& t, uint64_t seed, unsigned n_threads, gguf::TensorSink& sink) {
  if (t.fill.kind == Fill::Kind::Values) {
    if (t.type != TensorType::F32) throw Error("tensor " + t.name + ": exact values must be f32");
    return sink.write(t.fill.values.data(), t.fill.values.size() * sizeof(float));
  }
  // Chunks of about 16M elements bound memory (a 31B token_embd is 1.4G elements); threads split each chunk.
  constexpr int64_t kChunkElements = int64_t(1) << 24;
  const RandomStream rng(seed, t.name);
  const int64_t row_length = t.ne[0];
  int64_t n_rows = 1;
  for (size_t d = 1; d < t.ne.size(); ++d) n_rows *= t.ne[d];
  const size_t row_bytes = tensor_row_bytes(t.type, row_length);
  const int64_t rows_per_chunk = std::max<int64_t>(1, kChunkElements / row_length);
  std::vector<uint8_t> chunk(size_t(std::min(rows_per_chunk, n_rows)) * row_bytes);
  for (int64_t first = 0; first < n_rows; first += rows_per_chunk) {
    const int64_t rows = std::min(rows_per_chunk, n_rows - first);
    produce_rows_in_parallel(t, rng, first, rows, n_threads, chunk.data());
    sink.write(chunk.data(), size_t(rows) * row_bytes);
  }
}

// ---------------------------------------------------------------------------------------------------------
// The command

struct Options {
  std::string arch;
  std::string preset;
  std::string type = "f16";
  uint64_t seed = 1;
  std::string vocab;
  std::string output;
  unsigned threads = 0;
  bool dry_run = false;
  bool verbose = false;
};

std::string shape_text(const std::vector<int64_t>& ne) {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}

std::string value_text(const gguf::Value& v) {
  using VT = gguf::ValueType;
  switch (v.type) {
    case VT::STRING: return "\"" + v.s + "\"";
    case VT::FLOAT32: case VT::FLOAT64: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", v.f);
      return buf;
    }
    case VT::BOOL: return v.u ? "true" : "false";
    case VT::INT8: case VT::INT16: case VT::INT32: case VT::INT64: return std::to_string(v.i);
    case VT::ARRAY: {
      const size_t n = v.array_size();
      if (n > 64) return "[" + std::to_string(n) + " elements]";
      std::string s = "[";
      for (size_t i = 0; i < n; ++i) {
        s += i ? ", " : "";
        if (!v.array_i.empty()) s += std::to_string(v.array_i[i]);
        else if (!v.array_u.empty()) s += v.element_type == VT::BOOL ? (v.array_u[i] ? "true" : "false")
                                                                      : std::to_string(v.array_u[i]);
        else if (!v.array_f.empty()) s += std::to_string(v.array_f[i]);
        else s += "\"" + v.array_s[i] + "\"";
      }
      return s + "]";
    }
    default: return std::to_string(v.u);
  }
}

// --dry-run: the header as it would be written, one line per key and per tensor, for checking big presets.
void print_plan(const ModelPlan& plan) {
  for (const auto& [key, value] : plan.writer.metadata()) {
    if (key.rfind("tokenizer.", 0) == 0 && value.type == gguf::ValueType::ARRAY) {
      std::printf("kv %s = [%zu elements]\n", key.c_str(), value.array_size());
    } else if (key.rfind("tokenizer.", 0) == 0 && value.type == gguf::ValueType::STRING && value.s.size() > 64) {
      std::printf("kv %s = [%zu bytes]\n", key.c_str(), value.s.size());
    } else {
      std::printf("kv %s = %s\n", key.c_str(), value_text(value).c_str());
    }
  }
  const gguf::Writer::DataLayout layout = plan.writer.data_layout();
  for (const gguf::TensorInfo& t : layout.tensors) {
    std::printf("tensor %s %s %s %llu\n", t.name.c_str(), tensor_type_name(t.type).c_str(),
                shape_text(std::vector<int64_t>(t.ne, t.ne + t.n_dims)).c_str(),
                static_cast<unsigned long long>(t.nbytes));
  }
  std::printf("data bytes %llu\n", static_cast<unsigned long long>(layout.nbytes));
}

void run(const Options& options) {
  const Preset& preset = find_preset(options.arch, options.preset);
  const WeightType& weight_type = find_weight_type(options.type);
  const std::string vocab_path = options.vocab.empty() ? default_vocab_path(preset.config.arch) : options.vocab;
  const Vocabulary vocab = read_vocabulary(vocab_path);
  const ModelPlan plan = plan_model(preset, weight_type, options.seed, vocab);
  if (options.dry_run) return print_plan(plan);
  if (options.output.empty()) throw Error("-o/--output is required (or --dry-run)");

  const unsigned n_threads = options.threads > 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  const auto start = std::chrono::steady_clock::now();
  size_t index = 0;  // the writer asks for the declared tensors in order
  plan.writer.write(options.output, [&](const gguf::TensorInfo&, gguf::TensorSink& sink) {
    const PlannedTensor& t = plan.tensors[index++];
    if (options.verbose) {
      std::fprintf(stderr, "mkmodel: %s %s %s\n", t.name.c_str(), tensor_type_name(t.type).c_str(),
                   shape_text(t.ne).c_str());
    }
    produce_tensor(t, options.seed, n_threads, sink);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %s: %s %s %s, %zu tensors, %.1f MiB, vocab %llu from %s, %.1f s\n", options.output.c_str(),
              preset.config.arch_name.c_str(), preset.name.c_str(), weight_type.name.c_str(), plan.tensors.size(),
              double(plan.writer.data_layout().nbytes) / (1 << 20), static_cast<unsigned long long>(vocab.n_tokens),
              vocab_path.c_str(), seconds);
}

}  // namespace
}  // namespace mkmodel

void add_mkmodel_command(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<mkmodel::Options>();
  CLI::App* cmd = app.add_subcommand(
      "mkmodel", "Write a Gemma 3/4 GGUF with deterministic random weights in llama.cpp's layout (docs/mkmodel.md)");
  cmd->add_option("--arch", options->arch, "gemma3 or gemma4")->required()->check(CLI::IsMember({"gemma3", "gemma4"}));
  cmd->add_option("--preset", options->preset,
                  "gemma3: " + mkmodel::preset_names("gemma3") + "; gemma4: " + mkmodel::preset_names("gemma4"))
      ->required();
  cmd->add_option("--type", options->type,
                  "weight type of 2-D tensors: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k (default f16)");
  cmd->add_option("--seed", options->seed, "random seed (default 1)");
  cmd->add_option("--vocab", options->vocab, "GGUF whose tokenizer.* keys are copied (default: per architecture)");
  cmd->add_option("-o,--output", options->output, "output GGUF path");
  cmd->add_option("--threads", options->threads, "worker threads (default: all cores)");
  cmd->add_flag("--dry-run", options->dry_run, "print the metadata and tensor list instead of writing");
  cmd->add_flag("-v,--verbose", options->verbose, "print each tensor as it is written");
  cmd->callback([options, &exit_code] {
    try {
      mkmodel::run(*options);
      exit_code = 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "sparrow mkmodel: %s\n", e.what());
      exit_code = 1;
    }
  });
}

}  // namespace sparrow::tools
