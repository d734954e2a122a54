// sparrow-peer-llama_logits: makes llama.cpp print the logits Sparrow's parity tests compare against.
//
//   sparrow-peer-llama_logits -m MODEL (--tokens 1,2,3 | -p PROMPT) -o OUT.bin [-n N_GREEDY] [--threads T]
//                             [--fa auto|on|off] [--cache-type f16|f32|bf16|q8_0] [--ubatch N] [--verbose]
//
// The prompt is decoded in ONE batch (one ubatch; --ubatch N: batches of N tokens, e.g. 1 to measure how far
// llama.cpp's own batched and token-by-token paths differ) with logits requested for every position, and the logits are
// written as raw little-endian float32 [n_positions][n_vocab], the format `sparrow logits` writes. The token ids
// used are printed as "tokens: id id ...". With -n, N greedy steps follow (argmax, lowest id on ties, no stop at
// end-of-generation tokens, so both engines always produce N ids) and print "greedy: id id ...".
// A prompt given with -p is tokenized by llama.cpp with its special-token parsing on and BOS added as the model's
// metadata says (what llama-cli does).
//
// Our own code against llama.cpp's public C API (llama.h); scripts/build-llama-cpp compiles it (C++17).
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "llama.h"

namespace {

struct Options {
  std::string model_path;
  std::string prompt;
  bool have_prompt = false;
  std::vector<llama_token> tokens;
  std::string out_path;
  int n_greedy = 0;
  int n_threads = 0;  // 0: every hardware thread
  llama_flash_attn_type flash_attn = LLAMA_FLASH_ATTN_TYPE_AUTO;
  ggml_type cache_type = GGML_TYPE_F16;
  int ubatch = 0;  // 0: the whole prompt in one batch
  bool verbose = false;
};

[[noreturn]] void fail(const std::string& message) { throw std::runtime_error(message); }

void print_usage() {
  std::fprintf(stderr,
               "usage: sparrow-peer-llama_logits -m MODEL (--tokens 1,2,3 | -p PROMPT) -o OUT.bin [-n N_GREEDY]\n"
               "       [--threads T] [--fa auto|on|off] [--cache-type f16|f32|bf16|q8_0] [--ubatch N] [--verbose]\n");
}

long parse_integer(const std::string& text, const char* what) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0) fail(std::string(what) + ": '" + text + "' is not an integer");
  return value;
}

std::vector<llama_token> parse_token_list(const std::string& text) {
  std::vector<llama_token> tokens;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const long id = parse_integer(text.substr(start, comma - start), "--tokens");
    if (id < 0 || id > INT32_MAX) fail("--tokens: id " + std::to_string(id) + " is out of range");
    tokens.push_back(static_cast<llama_token>(id));
    start = comma + 1;
  }
  return tokens;
}

llama_flash_attn_type parse_flash_attn(const std::string& text) {
  if (text == "auto") return LLAMA_FLASH_ATTN_TYPE_AUTO;
  if (text == "on") return LLAMA_FLASH_ATTN_TYPE_ENABLED;
  if (text == "off") return LLAMA_FLASH_ATTN_TYPE_DISABLED;
  fail("--fa: expected auto, on or off, got '" + text + "'");
}

ggml_type parse_cache_type(const std::string& text) {
  if (text == "f16") return GGML_TYPE_F16;
  if (text == "f32") return GGML_TYPE_F32;
  if (text == "bf16") return GGML_TYPE_BF16;
  if (text == "q8_0") return GGML_TYPE_Q8_0;
  fail("--cache-type: expected f16, f32, bf16 or q8_0, got '" + text + "'");
}

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      print_usage();
      std::exit(0);
    }
    if (flag == "--verbose") {
      options.verbose = true;
      continue;
    }
    if (i + 1 >= argc) fail(flag + ": missing value");
    const std::string value = argv[++i];
    if (flag == "-m" || flag == "--model") {
      options.model_path = value;
    } else if (flag == "-p" || flag == "--prompt") {
      options.prompt = value;
      options.have_prompt = true;
    } else if (flag == "--tokens") {
      options.tokens = parse_token_list(value);
    } else if (flag == "-o" || flag == "--output") {
      options.out_path = value;
    } else if (flag == "-n") {
      options.n_greedy = static_cast<int>(parse_integer(value, "-n"));
      if (options.n_greedy < 0) fail("-n: must not be negative");
    } else if (flag == "-t" || flag == "--threads") {
      options.n_threads = static_cast<int>(parse_integer(value, "--threads"));
      if (options.n_threads < 1) fail("--threads: must be at least 1");
    } else if (flag == "--ubatch") {
      options.ubatch = static_cast<int>(parse_integer(value, "--ubatch"));
      if (options.ubatch < 1) fail("--ubatch: must be at least 1");
    } else if (flag == "--fa") {
      options.flash_attn = parse_flash_attn(value);
    } else if (flag == "--cache-type") {
      options.cache_type = parse_cache_type(value);
    } else {
      fail("unknown option " + flag);
    }
  }
  if (options.model_path.empty()) fail("-m MODEL is required");
  if (options.out_path.empty()) fail("-o OUT.bin is required");
  if (options.have_prompt == !options.tokens.empty()) fail("give exactly one of --tokens and -p");
  if (options.n_threads == 0) options.n_threads = std::max(1u, std::thread::hardware_concurrency());
  return options;
}

// llama.cpp logs every load step on stderr; keep only warnings and errors unless --verbose.
// A CONT message continues the previous one and inherits its level.
void log_filter(ggml_log_level level, const char* text, void* user_data) {
  static ggml_log_level last_level = GGML_LOG_LEVEL_INFO;
  if (level != GGML_LOG_LEVEL_CONT) last_level = level;
  const bool verbose = *static_cast<bool*>(user_data);
  if (verbose || last_level == GGML_LOG_LEVEL_WARN || last_level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

std::vector<llama_token> tokenize(const llama_vocab* vocab, const std::string& text) {
  // Upper bound: one token per byte, plus BOS/EOS.
  std::vector<llama_token> tokens(text.size() + 2);
  const int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                                   static_cast<int32_t>(tokens.size()), /*add_special=*/true,
                                   /*parse_special=*/true);
  if (n < 0) fail("tokenize: the prompt needs " + std::to_string(-n) + " tokens, more than expected");
  tokens.resize(static_cast<size_t>(n));
  if (tokens.empty()) fail("tokenize: the prompt gave no tokens");
  return tokens;
}

void check_token_ids(const std::vector<llama_token>& tokens, int32_t n_vocab) {
  for (const llama_token id : tokens) {
    if (id < 0 || id >= n_vocab) {
      fail("--tokens: id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
    }
  }
}

void print_ids(const char* label, const std::vector<llama_token>& ids) {
  std::printf("%s:", label);
  for (const llama_token id : ids) std::printf(" %d", id);
  std::printf("\n");
  std::fflush(stdout);
}

// Decodes `tokens` at positions start.. as one batch of sequence 0; logits for every position when all_logits,
// else for the last one only.
void decode(llama_context* ctx, const std::vector<llama_token>& tokens, int32_t start, bool all_logits) {
  const int32_t n = static_cast<int32_t>(tokens.size());
  llama_batch batch = llama_batch_init(n, 0, 1);
  for (int32_t i = 0; i < n; ++i) {
    batch.token[i] = tokens[static_cast<size_t>(i)];
    batch.pos[i] = start + i;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = all_logits || i == n - 1;
  }
  batch.n_tokens = n;
  const int32_t status = llama_decode(ctx, batch);
  llama_batch_free(batch);
  if (status != 0) {
    fail("llama_decode failed with status " + std::to_string(status) + " for " + std::to_string(n) +
         " tokens at position " + std::to_string(start));
  }
}

const float* logits_at(llama_context* ctx, int32_t batch_index) {
  const float* logits = llama_get_logits_ith(ctx, batch_index);
  if (logits == nullptr) fail("llama_get_logits_ith returned no logits for batch row " + std::to_string(batch_index));
  return logits;
}

void write_logits(llama_context* ctx, int32_t n_positions, int32_t n_vocab, const std::string& path, bool append) {
  static_assert(sizeof(float) == 4, "float32 output");
  const uint16_t probe = 1;
  if (*reinterpret_cast<const uint8_t*>(&probe) != 1) fail("this program writes little-endian floats only");
  FILE* out = std::fopen(path.c_str(), append ? "ab" : "wb");
  if (out == nullptr) fail(path + ": cannot open for writing: " + std::strerror(errno));
  for (int32_t i = 0; i < n_positions; ++i) {
    if (std::fwrite(logits_at(ctx, i), sizeof(float), static_cast<size_t>(n_vocab), out) != size_t(n_vocab)) {
      std::fclose(out);
      fail(path + ": write failed: " + std::strerror(errno));
    }
  }
  if (std::fclose(out) != 0) fail(path + ": close failed: " + std::strerror(errno));
}

llama_token argmax(const float* logits, int32_t n_vocab) {
  llama_token best = 0;
  for (int32_t id = 1; id < n_vocab; ++id) {
    if (logits[id] > logits[best]) best = id;
  }
  return best;
}

int run(const Options& options) {
  llama_model_params model_params = llama_model_default_params();
  model_params.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(options.model_path.c_str(), model_params);
  if (model == nullptr) fail(options.model_path + ": llama.cpp could not load the model");
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int32_t n_vocab = llama_vocab_n_tokens(vocab);

  const std::vector<llama_token> prompt = options.have_prompt ? tokenize(vocab, options.prompt) : options.tokens;
  check_token_ids(prompt, n_vocab);
  print_ids("tokens", prompt);

  const int32_t n_prompt = static_cast<int32_t>(prompt.size());
  llama_context_params context_params = llama_context_default_params();
  context_params.n_ctx = static_cast<uint32_t>(n_prompt + options.n_greedy + 1);
  const int32_t batch = options.ubatch > 0 ? std::min(options.ubatch, n_prompt) : n_prompt;
  context_params.n_batch = static_cast<uint32_t>(batch);
  context_params.n_ubatch = static_cast<uint32_t>(batch);
  context_params.n_seq_max = 1;
  context_params.n_threads = options.n_threads;
  context_params.n_threads_batch = options.n_threads;
  context_params.flash_attn_type = options.flash_attn;
  context_params.type_k = options.cache_type;
  context_params.type_v = options.cache_type;
  context_params.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, context_params);
  if (ctx == nullptr) {
    llama_model_free(model);
    fail(options.model_path + ": llama.cpp could not create a context");
  }

  try {
    int32_t n = 0;
    for (int32_t start = 0; start < n_prompt; start += batch) {
      n = std::min(batch, n_prompt - start);
      decode(ctx, std::vector<llama_token>(prompt.begin() + start, prompt.begin() + start + n), start,
             /*all_logits=*/true);
      write_logits(ctx, n, n_vocab, options.out_path, /*append=*/start > 0);
    }
    if (options.n_greedy > 0) {
      std::vector<llama_token> generated;
      llama_token next = argmax(logits_at(ctx, n - 1), n_vocab);  // the last row of the last batch
      generated.push_back(next);
      for (int step = 1; step < options.n_greedy; ++step) {
        decode(ctx, {next}, n_prompt + step - 1, /*all_logits=*/false);
        next = argmax(logits_at(ctx, 0), n_vocab);
        generated.push_back(next);
      }
      print_ids("greedy", generated);
    }
  } catch (...) {
    llama_free(ctx);
    llama_model_free(model);
    throw;
  }
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options options = parse_options(argc, argv);
    llama_log_set(log_filter, &options.verbose);
    llama_backend_init();
    const int status = run(options);
    llama_backend_free();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sparrow-peer-llama_logits: %s\n", e.what());
    return 1;
  }
}
