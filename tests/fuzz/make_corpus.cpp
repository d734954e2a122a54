// Writes the fuzzers' seed corpus, tests/fuzz/corpus/<target>/, from fixed content and fixed seeds, so that the
// committed files can be made again byte for byte: `scripts/fuzz --make-corpus`.
//   gguf/: small files made with gguf::Writer (every value type, tensors of several types, a non-default
//          alignment, a BPE and a SentencePiece vocabulary), then truncated and byte-flipped copies of them;
//   tokenizer/: texts with a flags byte (see tokenizer_fuzz.cpp);
//   chat_format/: conversations (see chat_format_fuzz.cpp).
// Each target also gets the inputs that once found a bug (named regression_*), which must stay fixed.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;
using sparrow::TensorType;
namespace gguf = sparrow::gguf;

void write_file(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_text(const fs::path& path, uint8_t flags, const std::string& text) {
  Bytes bytes{flags};
  bytes.insert(bytes.end(), text.begin(), text.end());
  write_file(path, bytes);
}

Bytes read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Writes `writer` to dir/name and returns the bytes.
Bytes write_gguf(const gguf::Writer& writer, const fs::path& dir, const std::string& name, uint32_t alignment = 32) {
  const fs::path path = dir / name;
  writer.write(path.string(), alignment);
  return read_file(path);
}

gguf::Value scalar(gguf::ValueType type, uint64_t u, int64_t i, double f) {
  gguf::Value v;
  v.type = type;
  v.u = u;
  v.i = i;
  v.f = f;
  return v;
}

gguf::Writer every_value_type() {
  gguf::Writer w;
  w.set_string("general.architecture", "gemma3");
  w.set_value("u8", scalar(gguf::ValueType::UINT8, 200, 0, 0));
  w.set_value("i8", scalar(gguf::ValueType::INT8, 0, -100, 0));
  w.set_value("u16", scalar(gguf::ValueType::UINT16, 60000, 0, 0));
  w.set_value("i16", scalar(gguf::ValueType::INT16, 0, -30000, 0));
  w.set_u32("u32", 4000000000u);
  w.set_i32("i32", -7);
  w.set_u64("u64", uint64_t{1} << 40);
  w.set_value("i64", scalar(gguf::ValueType::INT64, 0, -(int64_t{1} << 40), 0));
  w.set_f32("f32", 0.1f);
  w.set_value("f64", scalar(gguf::ValueType::FLOAT64, 0, 0, 2.5));
  w.set_bool("bool", true);
  w.set_array_i32("array.i32", {-1, 0, 1});
  w.set_array_u32("array.u32", {4000000000u, 3});
  w.set_array_f32("array.f32", {0.25f, -1.5f});
  w.set_array_bool("array.bool", {true, false, true});
  w.set_array_string("array.string", {"<pad>", "<eos>", ""});
  return w;
}

// Tensor contents do not matter to the reader, only their sizes: a fixed byte pattern fills them.
void add_tensors(gguf::Writer& w) {
  const auto pattern = [](size_t n) {
    Bytes bytes(n);
    for (size_t k = 0; k < n; ++k) bytes[k] = uint8_t(k * 37 + 11);
    return bytes;
  };
  const Bytes f32 = pattern(8 * 2 * 4), q8_0 = pattern(2 * 34), f16 = pattern(2 * 2 * 1 * 2 * 2);
  w.add_tensor("f32.matrix", TensorType::F32, {8, 2}, f32.data(), f32.size());
  w.add_tensor("q8_0.vector", TensorType::Q8_0, {64}, q8_0.data(), q8_0.size());
  w.add_tensor("f16.four.dims", TensorType::F16, {2, 2, 1, 2}, f16.data(), f16.size());
}

// A small vocabulary in Gemma's spelling: specials, every <0xXX> byte token, a few pieces and merges.
void add_vocabulary(gguf::Writer& w, const std::string& model) {
  std::vector<std::string> tokens = {"<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>",
                                     "<|turn>", "<turn|>"};
  std::vector<int32_t> types = {3, 3, 3, 2, 3, 3, 3, 3};
  const std::string space = "\xE2\x96\x81";
  for (const std::string& piece : {std::string("a"), std::string("b"), std::string("ab"), space, space + "a",
                                   space + "ab", std::string("\n"), std::string("\n\n"), std::string("\xC3\xB6")}) {
    tokens.push_back(piece);
    types.push_back(1);
  }
  static const char kHex[] = "0123456789ABCDEF";
  for (int byte = 0; byte < 256; ++byte) {
    tokens.push_back(std::string("<0x") + kHex[byte >> 4] + kHex[byte & 15] + ">");
    types.push_back(6);
  }
  std::vector<float> scores(tokens.size());
  for (size_t id = 0; id < scores.size(); ++id) scores[id] = -float(id);
  w.set_string("tokenizer.ggml.model", model);
  w.set_array_string("tokenizer.ggml.tokens", tokens);
  w.set_array_i32("tokenizer.ggml.token_type", types);
  w.set_array_f32("tokenizer.ggml.scores", scores);
  if (model == "gemma4") w.set_array_string("tokenizer.ggml.merges", {"a b", space + " a", space + "a b"});
  w.set_u32("tokenizer.ggml.bos_token_id", 2);
  w.set_u32("tokenizer.ggml.eos_token_id", 1);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_string("tokenizer.chat_template", "{{ '<start_of_turn>' + role }}");
}

void make_gguf_corpus(const fs::path& dir) {
  write_gguf(gguf::Writer(), dir, "empty.gguf");
  gguf::Writer typed = every_value_type();
  add_tensors(typed);
  const Bytes rich = write_gguf(typed, dir, "every_type_and_tensors.gguf");
  write_gguf(typed, dir, "alignment_64.gguf", 64);
  gguf::Writer bpe, spm;
  add_vocabulary(bpe, "gemma4");
  add_vocabulary(spm, "llama");
  const Bytes bpe_bytes = write_gguf(bpe, dir, "vocab_gemma4_bpe.gguf");
  write_gguf(spm, dir, "vocab_sentencepiece.gguf");

  // Truncations at fixed cuts: inside the header, the metadata, the tensor infos and the data.
  for (size_t cut : {size_t{4}, size_t{20}, size_t{30}, rich.size() / 4, rich.size() / 2, rich.size() * 3 / 4,
                     rich.size() - 33, rich.size() - 1}) {
    write_file(dir / ("truncated_" + std::to_string(cut) + ".gguf"), Bytes(rich.begin(), rich.begin() + cut));
  }
  // Copies with 1 to 4 bytes set to random values, from a fixed seed.
  std::mt19937 rng(20261203);
  for (int variant = 0; variant < 24; ++variant) {
    Bytes bytes = variant % 2 ? bpe_bytes : rich;
    const int n_flips = 1 + int(rng() % 4);
    for (int k = 0; k < n_flips; ++k) bytes[rng() % bytes.size()] = uint8_t(rng());
    char name[32];
    std::snprintf(name, sizeof(name), "flipped_%02d.gguf", variant);
    write_file(dir / name, bytes);
  }
}

void make_tokenizer_corpus(const fs::path& dir) {
  struct Text {
    const char* name;
    std::string text;
  };
  const std::vector<Text> texts = {
      {"english", "The quick brown fox jumps over the lazy dog."},
      {"spaces_and_newlines", "  leading\n\n\ttabs   and  runs of spaces\n\n\n"},
      {"multilingual", "Ünïcödé café, Здравствуй, こんにちは世界, 你好, مرحبا, 😀👍🏽"},
      {"broken_utf8", "bad \xff\xfe bytes \xc3 and \xe4\xb8 truncated \xc0\xaf overlong"},
      {"special_tokens", "<bos><start_of_turn>user\nHi<end_of_turn>\n<|turn>model\n<turn|><eos>"},
      {"byte_token_text", "<0x41> is a byte token's text, [multimodal] a user-defined one"},
      {"literal_space_marker", "\xE2\x96\x81 marker \xE2\x96\x81\xE2\x96\x81 chars"},
      {"control_bytes", std::string("a\0b\x01\x7f", 5)},
      {"code", "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"},
  };
  // Flags: bit 0 SentencePiece, bit 1 add BOS, bit 2 parse special tokens; each text under two settings.
  for (size_t k = 0; k < texts.size(); ++k) {
    write_text(dir / (std::string(texts[k].name) + "_bpe"), uint8_t(k % 2 ? 6 : 0), texts[k].text);
    write_text(dir / (std::string(texts[k].name) + "_sentencepiece"), uint8_t(k % 2 ? 1 : 7), texts[k].text);
  }
}

// One message: its role byte (0 system, 1 user, 2 assistant, 3 invalid) and content.
std::string message(uint8_t role, const std::string& content) { return std::string(1, char(role)) + content; }

void make_chat_format_corpus(const fs::path& dir) {
  const std::string sep(1, '\0');
  write_text(dir / "system_user_assistant", 1,
             message(0, "Be brief.") + sep + message(1, "Hi") + sep + message(2, "Hello!") + sep + message(1, "Bye"));
  write_text(dir / "user_only", 0, message(1, "What is <start_of_turn>?"));
  write_text(dir / "gemma4_template_marker", 1, message(1, "<|turn>user") + sep + message(2, "<turn|>"));
  write_text(dir / "invalid_role", 1, message(1, "x") + sep + message(3, "robot"));
  write_text(dir / "empty_contents", 1, message(0, "") + sep + message(1, "") + sep + message(2, ""));
  // A Gemma 3 system message with no user message after it was dropped from the prompt without a word.
  write_text(dir / "regression_system_without_user", 0x10, message('l', "D"));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (writes CORPUS_DIR/{gguf,tokenizer,chat_format}/)\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  for (const char* target : {"gguf", "tokenizer", "chat_format"}) {
    fs::remove_all(root / target);
    fs::create_directories(root / target);
  }
  make_gguf_corpus(root / "gguf");
  make_tokenizer_corpus(root / "tokenizer");
  make_chat_format_corpus(root / "chat_format");
  return 0;
}
