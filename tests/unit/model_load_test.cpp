// Loading a model whose file is valid GGUF but wrong for its architecture: a one-line error naming the file
// and the key or tensor, never a crash. Each case edits a tiny model made by `sparrow mkmodel`.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <set>

#include "cli_test_util.h"
#include "gguf/gguf.h"
#include "runtime/model.h"
#include "sparrow/sparrow.h"
#include "util/error.h"

namespace sparrow {
namespace {

namespace fs = std::filesystem;

const fs::path& tiny_gemma4() {
  return testing::mkmodel_once("--arch gemma4 --preset tiny-ple --type q8_0 --seed 3");
}

const fs::path& tiny_gemma3() {
  return testing::mkmodel_once("--arch gemma3 --preset tiny --type q8_0 --seed 3");
}

struct Edit {
  std::set<std::string> drop_keys;
  std::set<std::string> drop_tensors;
  std::function<void(gguf::Writer&)> add;
  std::string reshape_tensor;  // written with its last row dropped
  const fs::path* source = nullptr;  // the model edited: tiny_gemma4() unless given
};

// Copies the tiny model with an edit applied and returns the new path.
fs::path edited_copy(const std::string& name, const Edit& edit) {
  auto src = gguf::File::open((edit.source ? *edit.source : tiny_gemma4()).string());
  gguf::Writer w;
  for (const auto& [key, value] : src->metadata())
    if (!edit.drop_keys.count(key)) w.set_value(key, value);
  if (edit.add) edit.add(w);
  for (const gguf::TensorInfo& t : src->tensors()) {
    if (edit.drop_tensors.count(t.name)) continue;
    std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
    if (t.name == edit.reshape_tensor) {
      // One row fewer: still a valid GGUF tensor, but not the shape the architecture needs.
      ne[1] -= 1;
      w.add_tensor(t.name, t.type, ne, t.data, tensor_row_bytes(t.type, ne[0]) * ne[1]);
      continue;
    }
    w.add_tensor(t.name, t.type, ne, t.data, t.nbytes);
  }
  fs::path out = testing::scratch_dir() / name;
  w.write(out.string());
  return out;
}

void expect_load_error(const fs::path& file, const std::string& needle) {
  try {
    Model::load(file.string(), ModelLoadOptions{});
    ADD_FAILURE() << "loading " << file << " should fail";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  fs::remove(file);
}

TEST(ModelLoad, TheUneditedTinyModelLoads) {
  auto m = Model::load(tiny_gemma4().string(), ModelLoadOptions{});
  EXPECT_EQ(m->config.arch, Architecture::Gemma4);
  EXPECT_GT(m->config.n_embd_per_layer, 0);
}

// From the file alone: every matrix is read once per token, except the tables gathered by token id, of which one
// row is read (token_embd is also the output matrix when the file has no output.weight).
TEST(ModelLoad, WeightBytesPerTokenCountEveryMatrixAndOneRowOfEachTable) {
  for (const fs::path* path : {&tiny_gemma4(), &tiny_gemma3()}) {
    auto m = Model::load(path->string(), ModelLoadOptions{});
    size_t expected = 0;
    const bool tied = m->file->find_tensor("output.weight") == nullptr;
    for (const gguf::TensorInfo& t : m->file->tensors()) {
      if (t.n_dims < 2) continue;  // norm vectors: left out
      const size_t row = t.nbytes / size_t(t.ne[1]);
      if (t.name == "per_layer_token_embd.weight") expected += row;
      else if (t.name == "token_embd.weight") expected += row + (tied ? t.nbytes : 0);
      else expected += t.nbytes;
    }
    EXPECT_EQ(m->weights.bytes_read_per_token(), expected) << *path;
  }
}

TEST(ModelLoad, NegativeGpuLayersAreRefused) {
  ModelLoadOptions o;
  o.n_gpu_layers = -1;
  EXPECT_THROW(Model::load(tiny_gemma4().string(), o), Error);
}

// On a machine without a usable GPU (CI), asking for CUDA is a one-line error saying why, not a crash; with a
// GPU the model loads there.
TEST(ModelLoad, CudaWithoutAGpuSaysWhy) {
  const std::string reason = device_unavailable_reason(Device::Cuda);
  if (reason.empty()) GTEST_SKIP() << "a CUDA GPU is present; tests/gpu covers loading on it";
  ModelLoadOptions o;
  o.device = Device::Cuda;
  o.n_gpu_layers = 99;
  try {
    Model::load(tiny_gemma4().string(), o);
    FAIL() << "loaded on a device that is not there";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), reason);
    EXPECT_EQ(reason.find('\n'), std::string::npos);
  }
}

TEST(ModelLoad, UnknownDeviceThroughTheCApi) {
  sparrow_model_params p = sparrow_model_default_params();
  p.device = "tpu";
  EXPECT_EQ(sparrow_model_load_with_params(tiny_gemma4().c_str(), p), nullptr);
  EXPECT_NE(std::string(sparrow_last_error()).find("unknown device 'tpu'"), std::string::npos) << sparrow_last_error();
}

TEST(ModelLoad, MissingBlockCount) {
  expect_load_error(edited_copy("no-block-count.gguf", {{"gemma4.block_count"}, {}, nullptr, ""}),
                    "gemma4.block_count");
}

TEST(ModelLoad, MissingSlidingWindowPattern) {
  expect_load_error(edited_copy("no-pattern.gguf", {{"gemma4.attention.sliding_window_pattern"}, {}, nullptr, ""}),
                    "gemma4.attention.sliding_window_pattern");
}

TEST(ModelLoad, UnknownArchitecture) {
  Edit e{{"general.architecture"}, {}, [](gguf::Writer& w) { w.set_string("general.architecture", "llama"); }, ""};
  expect_load_error(edited_copy("llama.gguf", e), "general.architecture");
}

TEST(ModelLoad, MixtureOfExpertsIsRefusedClearly) {
  Edit e{{}, {}, [](gguf::Writer& w) { w.set_u32("gemma4.expert_count", 128); }, ""};
  expect_load_error(edited_copy("moe.gguf", e), "mixture-of-experts");
}

TEST(ModelLoad, MissingTensor) {
  expect_load_error(edited_copy("no-ffn-up.gguf", {{}, {"blk.1.ffn_up.weight"}, nullptr, ""}),
                    "blk.1.ffn_up.weight");
}

TEST(ModelLoad, WrongTensorShape) {
  expect_load_error(edited_copy("bad-shape.gguf", {{}, {}, nullptr, "blk.0.attn_q.weight"}), "blk.0.attn_q.weight");
}

TEST(ModelLoad, PerLayerArrayOfTheWrongLength) {
  Edit e{{"gemma4.feed_forward_length"}, {}, [](gguf::Writer& w) {
           w.set_array_u32("gemma4.feed_forward_length", {256, 256});
         }, ""};
  expect_load_error(edited_copy("ff-array.gguf", e), "gemma4.feed_forward_length");
}

TEST(ModelLoad, KvHeadsThatDoNotDivideHeads) {
  Edit e{{"gemma4.attention.head_count_kv"}, {}, [](gguf::Writer& w) {
           w.set_u32("gemma4.attention.head_count_kv", 3);
         }, ""};
  expect_load_error(edited_copy("kv-heads.gguf", e), "gemma4.attention.head_count_kv");
}

// Gemma 3's sliding-layer pattern: an array must have one entry per layer, a period must be at least 1 (a short
// array was read past its end; a period of 0 divided by zero).
TEST(ModelLoad, Gemma3SlidingPatternOfTheWrongLength) {
  Edit e{.drop_keys = {"gemma3.attention.sliding_window_pattern"},
         .add = [](gguf::Writer& w) { w.set_array_bool("gemma3.attention.sliding_window_pattern", {true, false}); },
         .source = &tiny_gemma3()};
  expect_load_error(edited_copy("g3-short-pattern.gguf", e), "gemma3.attention.sliding_window_pattern");
}

TEST(ModelLoad, Gemma3SlidingPatternPeriodZero) {
  Edit e{.drop_keys = {"gemma3.attention.sliding_window_pattern"},
         .add = [](gguf::Writer& w) { w.set_u32("gemma3.attention.sliding_window_pattern", 0); },
         .source = &tiny_gemma3()};
  expect_load_error(edited_copy("g3-period-zero.gguf", e), "gemma3.attention.sliding_window_pattern");
}

TEST(ModelLoad, TokenizerMissing) {
  expect_load_error(edited_copy("no-tokens.gguf", {{"tokenizer.ggml.tokens"}, {}, nullptr, ""}), "tokenizer.ggml");
}

}  // namespace
}  // namespace sparrow
