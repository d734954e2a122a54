// `sparrow mkmodel`: every tiny preset is written through the CLI, reopened with gguf::File and checked against
// shapes worked out here from the published geometries (docs/mkmodel.md), independently of tools/mkmodel_presets.cpp;
// the big presets are checked through --dry-run (gemma3 270m against the real 270M file's tensor list); every
// preset's ModelConfig must read back from what mkmodel writes; and when llama.cpp's peer program is built,
// llama.cpp must load each tiny file and produce finite, spread-out logits.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "formats/weight_formats.h"
#include "gguf/gguf.h"
#include "mkmodel_plan.h"
#include "mkmodel_presets.h"
#include "model/config.h"
#include "reference_test_util.h"
#include "runtime/resources.h"
#include "scratch_dir.h"
#include "util/error.h"

namespace sparrow {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 262144;

std::string gemma4_vocab() { return resources::gemma4_vocab_path().string(); }

std::string gemma3_model() { return resources::default_model().path.string(); }

std::string peer_program() { return (resources::llama_cpp_prefix() / "bin/sparrow-peer-llama_logits").string(); }

struct CommandResult {
  int status = -1;
  std::string output;  // stdout and stderr together
};

CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  const int raw = ::pclose(pipe);
  result.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return result;
}

// Writes a model once per (arguments) and reuses it across tests: the tiny files take about a second each.
std::string make_model(const std::string& args, const std::string& file_name) {
  static std::map<std::string, std::string> made;
  auto it = made.find(args);
  if (it != made.end()) return it->second;
  const std::string path = (testing::scratch_dir() / file_name).string();
  const CommandResult r = run_command(std::string(SPARROW_CLI_PATH) + " mkmodel " + args + " -o " + path);
  if (r.status != 0) {
    ADD_FAILURE() << "mkmodel " << args << " failed (" << r.status << "): " << r.output;
    return "";
  }
  made[args] = path;
  return path;
}

std::string tiny_gemma4(const std::string& preset, const std::string& type) {
  return make_model("--arch gemma4 --preset " + preset + " --type " + type + " --vocab " + gemma4_vocab(),
                    "gemma4-" + preset + "-" + type + ".gguf");
}

std::string tiny_gemma3(const std::string& type) {
  return make_model("--arch gemma3 --preset tiny --type " + type + " --vocab " + gemma3_model(),
                    "gemma3-tiny-" + type + ".gguf");
}

std::vector<float> read_floats(const gguf::File& f, const std::string& name) {
  const gguf::TensorInfo& t = f.tensor(name);
  std::vector<float> out(static_cast<size_t>(t.n_elements()));
  formats::dequantize_row(t.type, t.data, out.data(), t.n_elements());
  return out;
}

std::string blk(int il, const std::string& name) { return "blk." + std::to_string(il) + "." + name + ".weight"; }

void expect_tensor(const gguf::File& f, const std::string& name, std::initializer_list<int64_t> ne, TensorType type) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  ASSERT_NE(t, nullptr) << name << " missing";
  EXPECT_NO_THROW(f.expect_shape(*t, ne));
  EXPECT_EQ(t->type, type) << name << " is " << tensor_type_name(t->type);
}

void expect_vocabulary_copied(const gguf::File& f, const std::string& source_path) {
  const std::unique_ptr<gguf::File> source = gguf::File::open(source_path);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens"), source->get_string_array("tokenizer.ggml.tokens"));
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), source->get_string("tokenizer.ggml.model"));
  EXPECT_EQ(f.get_uint("tokenizer.ggml.bos_token_id"), source->get_uint("tokenizer.ggml.bos_token_id"));
}

// The Gemma 4 layer types the tiny presets use: sliding S S G S S G (global every third layer).
bool tiny_gemma4_sliding(int il) { return il % 3 != 2; }

// ---------------------------------------------------------------------------------------------------------
// Gemma 3 tiny

TEST(Mkmodel, Gemma3TinyHasLlamaCppGemma3Layout) {
  if (!fs::exists(gemma3_model())) GTEST_SKIP() << "no Gemma 3 vocabulary source at " << gemma3_model();
  const std::string path = tiny_gemma3("q8_0");
  ASSERT_FALSE(path.empty());
  const auto f = gguf::File::open(path);
  EXPECT_EQ(f->get_string("general.architecture"), "gemma3");
  EXPECT_EQ(f->get_uint("gemma3.block_count"), 6u);  // llama.cpp's hard-coded pattern: layer 5 is global
  EXPECT_EQ(f->get_uint("gemma3.embedding_length"), 128u);
  EXPECT_EQ(f->get_uint("gemma3.attention.head_count"), 4u);
  EXPECT_EQ(f->get_uint("gemma3.attention.head_count_kv"), 2u);
  EXPECT_EQ(f->get_uint("gemma3.attention.key_length"), 256u);
  EXPECT_EQ(f->get_uint("gemma3.attention.sliding_window"), 16u);
  EXPECT_FLOAT_EQ(float(f->get_float("gemma3.rope.freq_base")), 1e6f);
  EXPECT_FALSE(f->has("gemma3.final_logit_softcapping"));
  EXPECT_FALSE(f->has("gemma3.attention.sliding_window_pattern"));
  EXPECT_EQ(f->get_uint("general.file_type"), 7u);
  expect_vocabulary_copied(*f, gemma3_model());

  const TensorType q = TensorType::Q8_0, f32 = TensorType::F32;
  expect_tensor(*f, "token_embd.weight", {128, kVocab}, q);
  expect_tensor(*f, "output_norm.weight", {128}, f32);
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);  // tied
  EXPECT_EQ(f->find_tensor("rope_freqs.weight"), nullptr);
  for (int il = 0; il < 6; ++il) {
    SCOPED_TRACE("layer " + std::to_string(il));
    expect_tensor(*f, blk(il, "attn_q"), {128, 4 * 256}, q);
    expect_tensor(*f, blk(il, "attn_k"), {128, 2 * 256}, q);
    expect_tensor(*f, blk(il, "attn_v"), {128, 2 * 256}, q);
    expect_tensor(*f, blk(il, "attn_output"), {4 * 256, 128}, q);
    expect_tensor(*f, blk(il, "attn_q_norm"), {256}, f32);
    expect_tensor(*f, blk(il, "attn_k_norm"), {256}, f32);
    expect_tensor(*f, blk(il, "ffn_gate"), {128, 512}, q);
    expect_tensor(*f, blk(il, "ffn_down"), {512, 128}, q);
    for (const char* norm : {"attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"}) {
      expect_tensor(*f, blk(il, norm), {128}, f32);
    }
    EXPECT_EQ(f->find_tensor(blk(il, "layer_output_scale")), nullptr);
  }
  EXPECT_EQ(f->tensors().size(), 2u + 6u * 13u);
}

// ---------------------------------------------------------------------------------------------------------
// Gemma 4 tiny presets

TEST(Mkmodel, Gemma4TinyPleHasPerLayerEmbeddingsAndSharedKv) {
  const std::string path = tiny_gemma4("tiny-ple", "q4_k");
  ASSERT_FALSE(path.empty());
  const auto f = gguf::File::open(path);
  const int L = 6, P = 16, E = 128, first_shared = 3;
  EXPECT_EQ(f->get_uint("gemma4.attention.shared_kv_layers"), uint64_t(L - first_shared));
  EXPECT_EQ(f->get_uint("gemma4.embedding_length_per_layer_input"), uint64_t(P));
  EXPECT_EQ(f->get_uint("gemma4.attention.head_count_kv"), 1u);
  EXPECT_EQ(f->get_int_array("gemma4.feed_forward_length"), (std::vector<int64_t>{256, 256, 256, 512, 512, 512}));
  EXPECT_EQ(f->get_uint("general.file_type"), 15u);
  expect_vocabulary_copied(*f, gemma4_vocab());

  // q4_k: rows of 128 cannot be Q4_K (256-element blocks) and fall back to Q5_0 as in llama-quantize; rows of
  // 16 cannot be Q5_0 either and become F16; per_layer_model_proj is never quantized by llama-quantize.
  const TensorType k4 = TensorType::Q4_K, q5 = TensorType::Q5_0, f16 = TensorType::F16, f32 = TensorType::F32;
  expect_tensor(*f, "token_embd.weight", {E, kVocab}, q5);
  expect_tensor(*f, "per_layer_token_embd.weight", {L * P, kVocab}, q5);
  expect_tensor(*f, "per_layer_model_proj.weight", {E, L * P}, f16);
  expect_tensor(*f, "per_layer_proj_norm.weight", {P}, f32);
  for (int il = 0; il < L; ++il) {
    SCOPED_TRACE("layer " + std::to_string(il));
    const int64_t D = tiny_gemma4_sliding(il) ? 256 : 512, F = il < first_shared ? 256 : 512;
    expect_tensor(*f, blk(il, "attn_q"), {E, 4 * D}, q5);
    expect_tensor(*f, blk(il, "attn_output"), {4 * D, E}, k4);
    expect_tensor(*f, blk(il, "attn_q_norm"), {D}, f32);
    if (il < first_shared) {
      expect_tensor(*f, blk(il, "attn_k"), {E, D}, q5);
      expect_tensor(*f, blk(il, "attn_v"), {E, D}, q5);
      expect_tensor(*f, blk(il, "attn_k_norm"), {D}, f32);
    } else {
      EXPECT_EQ(f->find_tensor(blk(il, "attn_k")), nullptr);
      EXPECT_EQ(f->find_tensor(blk(il, "attn_v")), nullptr);
      EXPECT_EQ(f->find_tensor(blk(il, "attn_k_norm")), nullptr);
    }
    expect_tensor(*f, blk(il, "ffn_up"), {E, F}, q5);
    expect_tensor(*f, blk(il, "ffn_down"), {F, E}, k4);
    expect_tensor(*f, blk(il, "inp_gate"), {E, P}, q5);
    expect_tensor(*f, blk(il, "proj"), {P, E}, f16);
    expect_tensor(*f, blk(il, "post_norm"), {E}, f32);
    expect_tensor(*f, blk(il, "layer_output_scale"), {1}, f32);
  }
}

TEST(Mkmodel, Gemma4TinyKeqvHasNoValueProjectionOnGlobalLayers) {
  const std::string path = tiny_gemma4("tiny-keqv", "q8_0");
  ASSERT_FALSE(path.empty());
  const auto f = gguf::File::open(path);
  EXPECT_EQ(f->get_int_array("gemma4.attention.head_count_kv"), (std::vector<int64_t>{2, 2, 1, 2, 2, 1}));
  EXPECT_EQ(f->get_bool_array("gemma4.attention.sliding_window_pattern"),
            (std::vector<bool>{true, true, false, true, true, false}));
  EXPECT_EQ(f->get_uint("gemma4.attention.shared_kv_layers"), 0u);
  EXPECT_EQ(f->get_uint("gemma4.embedding_length_per_layer_input"), 0u);
  EXPECT_EQ(f->find_tensor("per_layer_token_embd.weight"), nullptr);
  const TensorType q = TensorType::Q8_0;
  for (int il = 0; il < 6; ++il) {
    SCOPED_TRACE("layer " + std::to_string(il));
    const bool sliding = tiny_gemma4_sliding(il);
    const int64_t D = sliding ? 256 : 512, n_kv = sliding ? 2 : 1;
    expect_tensor(*f, blk(il, "attn_q"), {128, 4 * D}, q);
    expect_tensor(*f, blk(il, "attn_k"), {128, n_kv * D}, q);
    expect_tensor(*f, blk(il, "attn_k_norm"), {D}, TensorType::F32);
    if (sliding) {
      expect_tensor(*f, blk(il, "attn_v"), {128, n_kv * D}, q);
    } else {
      EXPECT_EQ(f->find_tensor(blk(il, "attn_v")), nullptr);  // k_eq_v: V is the raw K projection
    }
  }
}

TEST(Mkmodel, Gemma4TinyDenseIsPlainGemma4) {
  const std::string path = tiny_gemma4("tiny-dense", "f16");
  ASSERT_FALSE(path.empty());
  const auto f = gguf::File::open(path);
  EXPECT_EQ(f->get_uint("gemma4.attention.head_count_kv"), 2u);
  EXPECT_EQ(f->get_uint("gemma4.feed_forward_length"), 512u);
  EXPECT_EQ(f->get_uint("gemma4.attention.key_length"), 512u);
  EXPECT_EQ(f->get_uint("gemma4.attention.key_length_swa"), 256u);
  EXPECT_EQ(f->get_uint("gemma4.rope.dimension_count"), 512u);
  EXPECT_EQ(f->get_uint("gemma4.rope.dimension_count_swa"), 256u);
  EXPECT_FLOAT_EQ(float(f->get_float("gemma4.rope.freq_base_swa")), 1e4f);
  EXPECT_FLOAT_EQ(float(f->get_float("gemma4.final_logit_softcapping")), 30.0f);
  expect_tensor(*f, "token_embd.weight", {256, kVocab}, TensorType::F16);
  for (int il = 0; il < 4; ++il) {
    const int64_t D = tiny_gemma4_sliding(il) ? 256 : 512;
    expect_tensor(*f, blk(il, "attn_v"), {256, 2 * D}, TensorType::F16);
  }

  // Proportional RoPE on global layers: 64 of the 256 frequency pairs rotate, the rest are frozen by 1e30.
  const std::vector<float> factors = read_floats(*f, "rope_freqs.weight");
  ASSERT_EQ(factors.size(), 256u);
  for (size_t i = 0; i < factors.size(); ++i) EXPECT_EQ(factors[i], i < 64 ? 1.0f : 1e30f) << "pair " << i;
}

// ---------------------------------------------------------------------------------------------------------
// Values

double standard_deviation(const std::vector<float>& v) {
  double sum = 0, sum_sq = 0;
  for (float x : v) sum += x, sum_sq += double(x) * x;
  const double mean = sum / double(v.size());
  return std::sqrt(sum_sq / double(v.size()) - mean * mean);
}

TEST(Mkmodel, WeightsAreScaledForSaneActivations) {
  const std::string path = tiny_gemma4("tiny-keqv", "q8_0");
  ASSERT_FALSE(path.empty());
  const auto f = gguf::File::open(path);
  // Matrices: standard deviation 1/sqrt(n_in).
  EXPECT_NEAR(standard_deviation(read_floats(*f, blk(0, "attn_q"))), 1 / std::sqrt(128.0), 0.005);
  EXPECT_NEAR(standard_deviation(read_floats(*f, blk(0, "ffn_down"))), 1 / std::sqrt(512.0), 0.005);
  // Norms near one.
  for (float w : read_floats(*f, blk(1, "ffn_norm"))) {
    EXPECT_GE(w, 0.7f);
    EXPECT_LE(w, 1.3f);
  }
}

TEST(Mkmodel, SameSeedSameBytesAnyThreadCountAndOtherSeedDiffers) {
  const std::string first = tiny_gemma4("tiny-keqv", "q8_0");
  ASSERT_FALSE(first.empty());
  const std::string base = "--arch gemma4 --preset tiny-keqv --type q8_0 --vocab " + gemma4_vocab();
  const std::string again = make_model(base + " --seed 1 --threads 1", "again.gguf");
  const std::string other = make_model(base + " --seed 2", "other-seed.gguf");
  ASSERT_FALSE(again.empty());
  ASSERT_FALSE(other.empty());
  auto bytes = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_TRUE(bytes(first) == bytes(again)) << "same seed, different bytes";
  const auto a = gguf::File::open(first), b = gguf::File::open(other);
  EXPECT_NE(read_floats(*a, blk(0, "attn_q")), read_floats(*b, blk(0, "attn_q")));
}

// ---------------------------------------------------------------------------------------------------------
// Big presets, through --dry-run (writing them takes minutes to hours)

struct DryRunTensor {
  std::string type;
  std::vector<int64_t> ne;
};

std::map<std::string, DryRunTensor> dry_run_tensors(const std::string& args, std::string* output = nullptr) {
  const CommandResult r = run_command(std::string(SPARROW_CLI_PATH) + " mkmodel --dry-run " + args);
  EXPECT_EQ(r.status, 0) << r.output;
  if (output) *output = r.output;
  std::map<std::string, DryRunTensor> tensors;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("tensor ", 0) != 0) continue;
    std::istringstream fields(line.substr(7));
    std::string name, type, shape;
    fields >> name >> type;
    std::getline(fields, shape, '}');
    DryRunTensor t{.type = type};
    for (char& c : shape) if (c == '{' || c == ',') c = ' ';
    std::istringstream dims(shape);
    for (int64_t d; dims >> d;) t.ne.push_back(d);
    tensors[name] = t;
  }
  return tensors;
}

TEST(Mkmodel, Gemma3_270mMatchesTheRealModelsTensorList) {
  if (!fs::exists(gemma3_model())) GTEST_SKIP() << "no real Gemma 3 270M at " << gemma3_model();
  const auto ours = dry_run_tensors("--arch gemma3 --preset 270m --type q4_k --vocab " + gemma3_model());
  const auto real = gguf::File::open(gemma3_model());
  EXPECT_EQ(ours.size(), real->tensors().size());
  for (const gguf::TensorInfo& t : real->tensors()) {
    auto it = ours.find(t.name);
    ASSERT_NE(it, ours.end()) << t.name << " missing from mkmodel's 270m";
    EXPECT_EQ(it->second.ne, std::vector<int64_t>(t.ne, t.ne + t.n_dims)) << t.name;
  }
}

TEST(Mkmodel, Gemma4E2BDryRunHasSharedKvAndDoubleWideMlp) {
  std::string output;
  const auto t = dry_run_tensors("--arch gemma4 --preset e2b --type q4_k --vocab " + gemma4_vocab(), &output);
  EXPECT_NE(output.find("gemma4.attention.shared_kv_layers = 20"), std::string::npos);
  EXPECT_EQ(t.at("per_layer_token_embd.weight").ne, (std::vector<int64_t>{35 * 256, kVocab}));
  EXPECT_EQ(t.at("token_embd.weight").type, "q4_K");  // 1536 = 6 x 256
  for (int il = 0; il < 35; ++il) {
    SCOPED_TRACE("layer " + std::to_string(il));
    const bool sliding = il % 5 != 4;
    const int64_t D = sliding ? 256 : 512, F = il < 15 ? 6144 : 12288;
    EXPECT_EQ(t.at(blk(il, "attn_q")).ne, (std::vector<int64_t>{1536, 8 * D}));
    EXPECT_EQ(t.at(blk(il, "ffn_down")).ne, (std::vector<int64_t>{F, 1536}));
    EXPECT_EQ(t.count(blk(il, "attn_k")), il < 15 ? 1u : 0u);
  }
}

TEST(Mkmodel, Gemma4_31BDryRunHasKEqVAndPerLayerKvHeads) {
  std::string output;
  const auto t = dry_run_tensors("--arch gemma4 --preset 31b --type q4_k --vocab " + gemma4_vocab(), &output);
  EXPECT_EQ(t.count("per_layer_token_embd.weight"), 0u);
  EXPECT_EQ(t.at("token_embd.weight").ne, (std::vector<int64_t>{5376, kVocab}));
  for (int il = 0; il < 60; ++il) {
    SCOPED_TRACE("layer " + std::to_string(il));
    const bool sliding = il % 6 != 5;
    const int64_t D = sliding ? 256 : 512, n_kv = sliding ? 16 : 4;
    EXPECT_EQ(t.at(blk(il, "attn_q")).ne, (std::vector<int64_t>{5376, 32 * D}));
    EXPECT_EQ(t.at(blk(il, "attn_k")).ne, (std::vector<int64_t>{5376, n_kv * D}));
    EXPECT_EQ(t.count(blk(il, "attn_v")), sliding ? 1u : 0u);
    EXPECT_EQ(t.at(blk(il, "ffn_gate")).ne, (std::vector<int64_t>{5376, 21504}));
  }
}

// ---------------------------------------------------------------------------------------------------------
// Every preset's ModelConfig reads back, field by field, from what mkmodel writes

void expect_same_layer(const LayerConfig& expected, const LayerConfig& actual) {
  EXPECT_EQ(actual.sliding, expected.sliding);
  EXPECT_EQ(actual.head_dim, expected.head_dim);
  EXPECT_EQ(actual.n_kv_heads, expected.n_kv_heads);
  EXPECT_EQ(actual.n_ff, expected.n_ff);
  EXPECT_EQ(actual.owns_kv, expected.owns_kv);
  EXPECT_EQ(actual.kv_source, expected.kv_source);
  EXPECT_EQ(actual.n_rot, expected.n_rot);
  EXPECT_EQ(actual.rope_base, expected.rope_base);
  EXPECT_EQ(actual.rope_scale, expected.rope_scale);
  EXPECT_EQ(actual.proportional_rope, expected.proportional_rope);
}

void expect_same_config(const ModelConfig& expected, const ModelConfig& actual) {
  EXPECT_EQ(actual.arch, expected.arch);
  EXPECT_EQ(actual.arch_name, expected.arch_name);
  EXPECT_EQ(actual.n_layer, expected.n_layer);
  EXPECT_EQ(actual.n_embd, expected.n_embd);
  EXPECT_EQ(actual.n_heads, expected.n_heads);
  EXPECT_EQ(actual.n_vocab, expected.n_vocab);
  EXPECT_EQ(actual.n_ctx_train, expected.n_ctx_train);
  EXPECT_EQ(actual.sliding_window, expected.sliding_window);
  EXPECT_EQ(actual.n_embd_per_layer, expected.n_embd_per_layer);
  EXPECT_EQ(actual.rms_eps, expected.rms_eps);
  EXPECT_EQ(actual.attention_scale, expected.attention_scale);
  EXPECT_EQ(actual.final_softcap, expected.final_softcap);
  EXPECT_EQ(actual.normalize_v, expected.normalize_v);
  ASSERT_EQ(actual.layers.size(), expected.layers.size());
  for (size_t il = 0; il < expected.layers.size(); ++il) {
    SCOPED_TRACE("layer " + std::to_string(il));
    expect_same_layer(expected.layers[il], actual.layers[il]);
  }
}

// A file with mkmodel's metadata for `config` and the one tensor ModelConfig::from_gguf reads (token_embd, whose
// rows are the vocabulary): the big presets' full files are gigabytes, and no other tensor changes the config.
std::string write_config_metadata(const ModelConfig& config, const std::string& file_name) {
  gguf::Writer writer;
  writer.set_string("general.architecture", config.arch_name);
  tools::mkmodel::add_architecture_metadata(config, writer);
  const std::vector<float> embeddings(size_t(config.n_embd) * size_t(config.n_vocab));
  writer.add_tensor("token_embd.weight", TensorType::F32, {config.n_embd, config.n_vocab}, embeddings.data(),
                    embeddings.size() * sizeof(float));
  const std::string path = (testing::scratch_dir() / file_name).string();
  writer.write(path);
  return path;
}

TEST(MkmodelPresets, EveryPresetsMetadataReadsBackAsItsConfig) {
  for (const tools::mkmodel::Preset& preset : tools::mkmodel::all_presets()) {
    SCOPED_TRACE(preset.config.arch_name + " " + preset.name);
    ModelConfig expected = preset.config;
    expected.n_vocab = 3;
    const std::string path = write_config_metadata(expected, "config-" + preset.name + ".gguf");
    expect_same_config(expected, ModelConfig::from_gguf(*gguf::File::open(path)));
  }
}

TEST(MkmodelPresets, TinyFilesReadBackAsTheirPresetsConfig) {
  struct Written {
    std::string arch;
    std::string preset;
    std::string path;
  };
  std::vector<Written> files = {
      {.arch = "gemma4", .preset = "tiny-ple", .path = tiny_gemma4("tiny-ple", "q4_k")},
      {.arch = "gemma4", .preset = "tiny-keqv", .path = tiny_gemma4("tiny-keqv", "q8_0")},
      {.arch = "gemma4", .preset = "tiny-dense", .path = tiny_gemma4("tiny-dense", "f16")},
  };
  if (fs::exists(gemma3_model())) files.push_back({.arch = "gemma3", .preset = "tiny", .path = tiny_gemma3("q8_0")});
  for (const Written& file : files) {
    SCOPED_TRACE(file.arch + " " + file.preset);
    ASSERT_FALSE(file.path.empty());
    ModelConfig expected = tools::mkmodel::find_preset(file.arch, file.preset).config;
    expected.n_vocab = kVocab;
    expect_same_config(expected, ModelConfig::from_gguf(*gguf::File::open(file.path)));
  }
}

// Configs whose values the metadata keys cannot hold are refused, not written as something else.
TEST(MkmodelPresets, MetadataRefusesWhatTheKeysCannotSay) {
  gguf::Writer writer;
  ModelConfig global_dims_differ = tools::mkmodel::find_preset("gemma4", "tiny-keqv").config;
  global_dims_differ.layers[5].head_dim = 128;  // the global layers 2 and 5 now differ
  EXPECT_THROW(tools::mkmodel::add_architecture_metadata(global_dims_differ, writer), Error);
  ModelConfig gemma3_pattern = tools::mkmodel::find_preset("gemma3", "tiny").config;
  gemma3_pattern.layers[0].sliding = false;  // llama.cpp makes only every 6th Gemma 3 layer global
  EXPECT_THROW(tools::mkmodel::add_architecture_metadata(gemma3_pattern, writer), Error);
  ModelConfig layers_missing = tools::mkmodel::find_preset("gemma4", "tiny-keqv").config;
  layers_missing.layers.pop_back();
  EXPECT_THROW(tools::mkmodel::add_architecture_metadata(layers_missing, writer), Error);
}

// ---------------------------------------------------------------------------------------------------------
// Errors

TEST(Mkmodel, BadArgumentsFailWithAMessageNamingTheProblem) {
  const std::string cli = SPARROW_CLI_PATH;
  const CommandResult preset = run_command(cli + " mkmodel --arch gemma4 --preset huge --dry-run");
  EXPECT_NE(preset.status, 0);
  EXPECT_NE(preset.output.find("--preset"), std::string::npos) << preset.output;
  const CommandResult type = run_command(cli + " mkmodel --arch gemma4 --preset tiny-dense --type q3_k --dry-run");
  EXPECT_NE(type.status, 0);
  EXPECT_NE(type.output.find("--type"), std::string::npos) << type.output;
  const std::string missing = (testing::scratch_dir() / "no-such-vocab.gguf").string();
  const CommandResult vocab = run_command(cli + " mkmodel --arch gemma4 --preset tiny-dense --vocab " + missing +
                                          " -o " + (testing::scratch_dir() / "x.gguf").string());
  EXPECT_NE(vocab.status, 0);
  EXPECT_NE(vocab.output.find(missing), std::string::npos) << vocab.output;
  EXPECT_FALSE(fs::exists(testing::scratch_dir() / "x.gguf"));
}

// ---------------------------------------------------------------------------------------------------------
// llama.cpp loads every tiny preset

void expect_llama_cpp_logits(const std::string& model) {
  ASSERT_FALSE(model.empty());
  // 24 tokens: more than the 16-token sliding window of the tiny presets.
  const std::string tokens = "2,818,5279,529,7001,563,10779,236764,532,1041,1719,531,1386,496,1401,236761,107,"
                             "2094,1006,659,611,1161,236881,108";
  const std::string out = model + ".logits";
  const CommandResult r = run_command(peer_program() + " -m " + model + " --tokens " + tokens + " -n 4 -o " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("greedy:"), std::string::npos) << r.output;
  std::ifstream in(out, std::ios::binary);
  std::vector<float> logits(24 * size_t(kVocab));
  in.read(reinterpret_cast<char*>(logits.data()), std::streamsize(logits.size() * sizeof(float)));
  ASSERT_EQ(size_t(in.gcount()), logits.size() * sizeof(float)) << "logits file too short";
  for (size_t i = 0; i < logits.size(); ++i) ASSERT_TRUE(std::isfinite(logits[i])) << "logit " << i;
  const std::vector<float> last(logits.end() - kVocab, logits.end());
  EXPECT_GT(standard_deviation(last), 1.0) << "logits are nearly tied";
}

class MkmodelLlamaCpp : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_LLAMA_CPP_REFERENCE(fs::exists(peer_program()), "llama.cpp peer program not built (" +
                                                                 peer_program() + "): run scripts/build-llama-cpp");
  }
};

TEST_F(MkmodelLlamaCpp, LoadsGemma3Tiny) {
  if (!fs::exists(gemma3_model())) GTEST_SKIP() << "no Gemma 3 vocabulary source at " << gemma3_model();
  expect_llama_cpp_logits(tiny_gemma3("q8_0"));
}
TEST_F(MkmodelLlamaCpp, LoadsGemma4TinyPle) { expect_llama_cpp_logits(tiny_gemma4("tiny-ple", "q4_k")); }
TEST_F(MkmodelLlamaCpp, LoadsGemma4TinyKeqv) { expect_llama_cpp_logits(tiny_gemma4("tiny-keqv", "q8_0")); }
TEST_F(MkmodelLlamaCpp, LoadsGemma4TinyDense) { expect_llama_cpp_logits(tiny_gemma4("tiny-dense", "f16")); }

}  // namespace
}  // namespace sparrow
