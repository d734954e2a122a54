// `sparrow calibrate-keys`: fits each KV-owning layer's key transform (model/key_transform.h) to the model's own
// queries and keys on calibration text and writes them to a file beside the model, which every tool then loads
// (`--key-transforms`, default auto). Keep the text apart from any text the transforms are judged on. An internal
// pass like `sparrow lockstep`: it watches the forward pass through its observer, so it includes Sparrow's
// internal headers rather than going through the C API.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "common.h"
#include "model/key_transform.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "util/error.h"

namespace sparrow::tools {
namespace {

struct CalibrateOptions {
  std::string model_path;
  std::string text_path;
  std::string out_path;
  std::string device = "cpu";
  double from = 0.0;  // fraction of the text's bytes skipped
  int32_t n_ctx = 4096;
  int32_t chunks = 4;
  int32_t threads = 0;
  int32_t query_stride = 4;
  double ridge = 1e-2;
};

// Gathers every KV-owning layer's statistics from the forward pass, one chunk (sequence) at a time.
class Calibrator : public QueryKeyObserver {
 public:
  Calibrator(const Model& model, int32_t query_stride) : model_(model), query_stride_(query_stride) {
    const ModelConfig& c = model.config;
    stats_.resize(size_t(c.n_layer));
    for (int il = 0; il < c.n_layer; ++il) {
      const LayerConfig& l = c.layers[size_t(il)];
      if (l.owns_kv && l.n_rot != l.head_dim)
        throw Error("layer " + std::to_string(il) + " rotates " + std::to_string(l.n_rot) + " of " +
                    std::to_string(l.head_dim) + " elements; key transforms need RoPE over the whole head");
    }
  }

  void observe(Backend& backend, int32_t il, const float* q, const float* k, int32_t n_tokens,
               int32_t first_position) override {
    const ModelConfig& c = model_.config;
    const LayerConfig& l = c.layers[size_t(il)];
    KeyStatistics& s = statistics(backend, l.kv_source);
    const int d = l.head_dim;
    if (k) {
      host_.resize(size_t(n_tokens) * l.n_kv_heads * d);
      backend.read(k, host_.data(), host_.size());
      if (first_position == 0) s.begin_sequence();
      s.add_keys(host_, n_tokens, l.n_kv_heads, first_position);
    }
    host_.resize(size_t(n_tokens) * c.n_heads * d);
    backend.read(q, host_.data(), host_.size());
    s.add_queries(host_, n_tokens, c.n_heads, first_position, c.attention_scale, l.sliding ? c.sliding_window : 0,
                  query_stride_);
  }

  void end_sequence() {
    for (std::optional<KeyStatistics>& s : stats_)
      if (s) s->end_sequence();
  }

  KeyTransformFile solve(int32_t n_ctx, double ridge) const {
    KeyTransformFile f;
    f.layers.resize(stats_.size());
    for (size_t il = 0; il < stats_.size(); ++il) {
      if (!stats_[il]) continue;
      const KeyStatistics& s = *stats_[il];
      f.layers[il] = solve_key_transform(s, n_ctx, ridge);
      std::printf("layer %2zu: head dim %d, %lld query rows, predicted score-error variance / %.2f\n", il,
                  s.head_dim(), static_cast<long long>(s.n_queries()), f.layers[il].predicted_gain);
    }
    return f;
  }

 private:
  // The statistics of KV-owning layer il, made at its first batch (the RoPE divisors read from the backend).
  KeyStatistics& statistics(Backend& backend, int32_t il) {
    std::optional<KeyStatistics>& s = stats_[size_t(il)];
    if (!s) {
      const LayerConfig& l = model_.config.layers[size_t(il)];
      std::vector<float> divisors;
      if (l.proportional_rope) {
        divisors.resize(size_t(l.n_rot / 2));
        backend.read(model_.weights.rope_freq_divisors, divisors.data(), divisors.size());
      }
      s.emplace(l.head_dim, rope_pair_frequencies(l.n_rot, l.rope_base, l.rope_scale, divisors));
    }
    return *s;
  }

  const Model& model_;
  int32_t query_stride_;
  std::vector<std::optional<KeyStatistics>> stats_;
  std::vector<float> host_;
};

// The text from the fraction `from` of its bytes on (not inside a UTF-8 character).
std::string text_from(const std::string& path, double from) {
  const std::string text = read_text_file(path);
  size_t start = size_t(double(text.size()) * from);
  while (start < text.size() && (uint8_t(text[start]) & 0xC0) == 0x80) ++start;
  return text.substr(start);
}

int run_calibrate(const CalibrateOptions& o) {
  if (!(o.from >= 0 && o.from < 1)) throw Error("--from must be in [0, 1)");
  const std::optional<Device> device = parse_device(o.device);
  if (!device) throw Error("--device: unknown device '" + o.device + "'");
  if (const std::string reason = device_unavailable_reason(*device); !reason.empty())
    throw Error("--device " + o.device + ": " + reason);
  ModelLoadOptions load;
  load.device = *device;
  load.n_gpu_layers = *device == Device::Cpu ? 0 : 99;
  load.key_transforms = "off";  // the statistics of the plain keys
  const std::string path = resolve_model_path(o.model_path);
  const std::unique_ptr<Model> model = Model::load(path, load);
  std::cerr << "model: " << model->describe() << "\n";

  std::vector<int32_t> tokens = model->tokenizer->encode(text_from(o.text_path, o.from), false, false);
  const int64_t available = int64_t(tokens.size()) / o.n_ctx;
  if (available < 1)
    throw Error(o.text_path + ": " + std::to_string(tokens.size()) + " tokens from --from on, fewer than one chunk of " +
                std::to_string(o.n_ctx));
  const int64_t n_chunks = std::min<int64_t>(o.chunks, available);

  Calibrator calibrator(*model, o.query_stride);
  SessionOptions so;
  so.n_ctx = o.n_ctx;
  so.n_threads = o.threads;
  so.k_codec = so.v_codec = formats::KvCodec::F32;
  so.balance_keys = KeyBalancing::Off;
  so.observer = &calibrator;
  Session session(*model, so);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n_chunks; ++i) {
    std::vector<int32_t> chunk(tokens.begin() + i * o.n_ctx, tokens.begin() + (i + 1) * o.n_ctx);
    chunk[0] = model->tokenizer->bos();
    session.reset();
    session.decode(chunk.data(), int32_t(chunk.size()), false);
    calibrator.end_sequence();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "chunk %lld of %lld (%.0f s)\n", static_cast<long long>(i + 1),
                 static_cast<long long>(n_chunks), seconds);
  }

  KeyTransformFile f = calibrator.solve(o.n_ctx, o.ridge);
  f.model_fingerprint = model->fingerprint();
  f.context = o.n_ctx;
  f.n_tokens = n_chunks * o.n_ctx;
  char from[32];
  std::snprintf(from, sizeof from, "%g", o.from);
  f.source = std::filesystem::path(o.text_path).filename().string() + " from " + from;
  const std::string out = o.out_path.empty() ? key_transform_path_beside(path) : o.out_path;
  write_key_transform_file(out, f);
  std::cout << "wrote " << out << " (" << f.n_tokens << " tokens of calibration text)\n";
  return 0;
}

}  // namespace

void add_calibrate_keys_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("calibrate-keys", "fit each layer's key transform to the model's own queries and "
                                                   "keys on calibration text (docs/kv-cache.md)");
  auto o = std::make_shared<CalibrateOptions>();
  cmd->add_option("-m,--model", o->model_path, "GGUF model (default: the default model)");
  cmd->add_option("-f,--file", o->text_path, "calibration text (UTF-8)")->required();
  cmd->add_option("-o,--output", o->out_path, "where to write the transforms (default: MODEL.key-transforms.gguf "
                                              "beside the model, which the tools load by default)");
  cmd->add_option("--from", o->from, "fraction of the text's bytes to skip first (default 0)");
  cmd->add_option("-c,--ctx-size", o->n_ctx, "tokens per chunk, and the positions the transforms are averaged "
                                             "over (default 4096)")
      ->check(CLI::Range(64, 1 << 20));
  cmd->add_option("--chunks", o->chunks, "chunks of text to gather (default 4)")->check(CLI::PositiveNumber);
  cmd->add_option("-t,--threads", o->threads, "CPU threads (default: all cores)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--device", o->device, "where the model runs (default cpu)")->check(CLI::IsMember(device_names()));
  cmd->add_option("--query-stride", o->query_stride, "every n-th position's queries weigh the keys (default 4)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--ridge", o->ridge, "added to both normalized moments' diagonals (default 0.01)")
      ->check(CLI::PositiveNumber);
  cmd->callback([o, &exit_code] { exit_code = run_calibrate(*o); });
}

}  // namespace sparrow::tools
