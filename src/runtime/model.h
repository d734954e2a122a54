#pragma once
// A loaded model: the mapped GGUF file, its resolved config, bound weights and tokenizer.
#include <functional>
#include <memory>
#include <string>

#include "gguf/gguf.h"
#include "model/config.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace sparrow {

struct Model {
  std::unique_ptr<gguf::File> file;
  ModelConfig config;
  ModelWeights weights;
  std::unique_ptr<Tokenizer> tokenizer;

  // progress(fraction) while weights are bound. Throws sparrow::Error naming the file and field.
  static std::unique_ptr<Model> load(const std::string& path, const std::function<void(float)>& progress);
  std::string describe() const;
};

}  // namespace sparrow
