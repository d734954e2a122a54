#include "runtime/model.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "util/error.h"

namespace sparrow {

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
  return model;
}

uint64_t Model::fingerprint() const {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a
  auto mix = [&](const void* data, size_t n) {
    for (size_t i = 0; i < n; ++i) hash = (hash ^ static_cast<const uint8_t*>(data)[i]) * 0x100000001b3ull;
  };
  for (const gguf::TensorInfo& t : file->tensors()) {
    mix(t.name.data(), t.name.size());
    mix(&t.type, sizeof t.type);
    mix(t.ne, sizeof t.ne);
    mix(t.data, std::min<size_t>(t.nbytes, 256));
  }
  return hash;
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
