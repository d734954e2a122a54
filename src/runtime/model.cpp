#include "runtime/model.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>

#include "model/key_transform.h"
#include "util/error.h"

namespace sparrow {
namespace {

// FNV-1a over the files' tensors: names, types, shapes and the first bytes of each one's data.
uint64_t hash_tensors(const gguf::File& file, uint64_t hash) {
  auto mix = [&](const void* data, size_t n) {
    for (size_t i = 0; i < n; ++i) hash = (hash ^ static_cast<const uint8_t*>(data)[i]) * 0x100000001b3ull;
  };
  for (const gguf::TensorInfo& t : file.tensors()) {
    mix(t.name.data(), t.name.size());
    mix(&t.type, sizeof t.type);
    mix(t.ne, sizeof t.ne);
    mix(t.data, std::min<size_t>(t.nbytes, 256));
  }
  return hash;
}

// The key-transform file options name for the model at model_path, or "" for none.
std::string key_transform_path(const std::string& option, const std::string& model_path) {
  if (option.empty() || option == "off") return "";
  if (option != "auto") return option;
  const std::string beside = key_transform_path_beside(model_path);
  return std::filesystem::exists(beside) ? beside : "";
}

void load_key_transforms(Model& model, const std::string& path) {
  model.key_transform_file = gguf::File::open(path);
  const gguf::File& f = *model.key_transform_file;
  const std::optional<uint64_t> fingerprint = f.get_uint_opt(kKeyTransformFingerprintKey);
  if (!fingerprint) throw Error(path + ": not a key-transform file (no " + kKeyTransformFingerprintKey + ")");
  if (*fingerprint != model.fingerprint())
    throw Error(path + ": key transforms calibrated on another model file (fingerprint " +
                std::to_string(*fingerprint) + ", this model's " + std::to_string(model.fingerprint()) +
                "); run `sparrow calibrate-keys` for it, or load with --key-transforms off");
  model.weights.bind_key_transforms(f, model.config, *model.store);
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path, const ModelLoadOptions& options) {
  if (options.n_gpu_layers < 0)
    throw Error("n_gpu_layers is " + std::to_string(options.n_gpu_layers) + "; it must be 0 or more");
  auto model = std::make_unique<Model>();
  model->file = gguf::File::open(path);
  model->config = ModelConfig::from_gguf(*model->file);
  model->device = options.device;
  model->store = options.make_store ? options.make_store() : make_weight_store(options.device);
  model->weights = ModelWeights::bind(*model->file, model->config, *model->store, options.n_gpu_layers,
                                      options.progress);
  model->tokenizer = Tokenizer::from_gguf(*model->file);
  if (model->tokenizer->n_vocab() != model->config.n_vocab)
    throw Error(path + ": tokenizer.ggml.tokens: " + std::to_string(model->tokenizer->n_vocab()) +
                " tokens, but token_embd.weight has " + std::to_string(model->config.n_vocab) + " rows");
  if (const std::string transforms = key_transform_path(options.key_transforms, path); !transforms.empty())
    load_key_transforms(*model, transforms);
  return model;
}

uint64_t Model::fingerprint() const { return hash_tensors(*file, 0xcbf29ce484222325ull); }

uint64_t Model::state_fingerprint() const {
  return key_transform_file ? hash_tensors(*key_transform_file, fingerprint()) : fingerprint();
}

std::string Model::describe_key_transforms() const {
  if (!key_transform_file) return "";
  const gguf::File& f = *key_transform_file;
  int n_layers = 0;
  for (const LayerWeights& l : weights.layers) n_layers += l.key_transform.data != nullptr;
  return "key transforms: " + f.path() + " (" + std::to_string(n_layers) + " layers, calibrated on " +
         std::to_string(f.get_uint_opt(kKeyTransformTokensKey).value_or(0)) + " tokens of " +
         f.get_string_opt(kKeyTransformSourceKey).value_or("?") + ", context " +
         std::to_string(f.get_uint_opt(kKeyTransformContextKey).value_or(0)) + ")";
}

std::string Model::describe() const {
  std::map<std::string, int> type_counts;
  size_t bytes = 0;
  for (const gguf::TensorInfo& t : file->tensors()) {
    type_counts[std::string(tensor_type_info(static_cast<uint32_t>(t.type))->name)]++;
    bytes += t.nbytes;
  }
  int n_sliding = 0, n_shared = 0;
  for (const LayerConfig& l : config.layers) {
    n_sliding += l.sliding;
    n_shared += !l.owns_kv;
  }
  std::ostringstream s;
  s << config.arch_name << ", " << config.n_layer << " layers (" << n_sliding << " sliding, " << n_shared
    << " KV-shared), n_embd " << config.n_embd << ", " << config.n_heads << " heads, vocab " << config.n_vocab
    << ", " << (bytes >> 20) << " MiB of tensors (";
  bool first = true;
  for (const auto& [name, count] : type_counts) {
    s << (first ? "" : " ") << name << "x" << count;
    first = false;
  }
  s << ")";
  return s.str();
}

}  // namespace sparrow
