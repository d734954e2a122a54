#pragma once
// A loaded model: the mapped GGUF file, its resolved config, its weights placed on a device, and its tokenizer.
#include <functional>
#include <memory>
#include <string>

#include "gguf/gguf.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/backends.h"
#include "tokenizer/tokenizer.h"

namespace sparrow {

struct ModelLoadOptions {
  Device device = Device::Cpu;
  int32_t n_gpu_layers = 0;  // layers whose weights go to device memory (llama.cpp's -ngl); 99: all
  std::function<void(float)> progress;  // fraction of the weights bound; may be empty
  // Where the weights are placed; empty: the device's own store (runtime/backends.h). `sparrow lockstep`
  // places them on two devices at once.
  std::function<std::unique_ptr<WeightStore>()> make_store;
  // Calibrated key transforms (model/key_transform.h, `sparrow calibrate-keys`): a file's path; "auto" the file
  // beside the model (key_transform_path_beside) when there is one; "off" or "" none.
  std::string key_transforms = "auto";
};

struct Model {
  std::unique_ptr<gguf::File> file;
  ModelConfig config;
  Device device = Device::Cpu;
  std::unique_ptr<WeightStore> store;  // owns the placed weights; declared before them, destroyed after
  ModelWeights weights;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<gguf::File> key_transform_file;  // null without key transforms

  // Throws sparrow::Error naming the file and field, or why the device cannot be used.
  static std::unique_ptr<Model> load(const std::string& path, const ModelLoadOptions& options);
  std::string describe() const;
  // A hash of the file's tensors (names, types, shapes and the first bytes of each one's data): two files that
  // agree on it hold the same weights for every purpose a saved KV cache cares about.
  uint64_t fingerprint() const;
  // The fingerprint with the key transforms' tensors mixed in: what a saved KV cache's keys depend on.
  uint64_t state_fingerprint() const;
  // One line on the key transforms ("key transforms: PATH (N layers, calibrated on ...)"), empty without them.
  std::string describe_key_transforms() const;
};

}  // namespace sparrow
