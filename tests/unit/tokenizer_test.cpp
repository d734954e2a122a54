// Tokenizer tests. Three kinds of reference:
//   - llama.cpp's own test cases for the Gemma 4 vocabulary (shared/fixtures/ggml-vocab-gemma-4.gguf.inp/.out);
//   - ids from llama.cpp's llama-tokenize for varied strings and a whole corpus, for the Gemma 3 model and the
//     Gemma 4 vocabulary, committed in tests/fixtures/tokenizer/*.json by scripts/make-tokenizer-fixtures;
//   - slow, obviously-correct re-statements of the algorithms (below, written from the descriptions, not from
//     the optimized code) run against the real tokenizers on small random vocabularies.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "runtime/resources.h"
#include "scratch_dir.h"
#include "strict_utf8.h"
#include "util/error.h"

namespace sparrow {
namespace {

using testing::is_valid_utf8;

using Ids = std::vector<int32_t>;
const std::string kSpace = "\xE2\x96\x81";  // U+2581, how these vocabularies spell ' '

// ---------------------------------------------------------------------------------------------------------------
// Files

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string gemma3_model_path() { return resources::default_model().path.string(); }
std::string gemma4_vocab_path() { return resources::gemma4_vocab_path().string(); }
std::string corpus_path() { return resources::corpus_path().string(); }

std::string fixture_path(const std::string& name) {
  return std::string(SPARROW_SOURCE_DIR) + "/tests/fixtures/tokenizer/" + name;
}

// Tokenizers of real files, loaded once for the whole run (262144 tokens each); nullptr if the file is absent.
const Tokenizer* real_tokenizer(const std::string& path) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  auto it = loaded.find(path);
  if (it == loaded.end()) {
    std::unique_ptr<Tokenizer> tokenizer;
    if (std::filesystem::exists(path)) tokenizer = Tokenizer::from_gguf(*gguf::File::open(path));
    it = loaded.emplace(path, std::move(tokenizer)).first;
  }
  return it->second.get();
}

#define REQUIRE_TOKENIZER(var, path, what)     \
  const Tokenizer* var = real_tokenizer(path); \
  if (var == nullptr)                          \
  GTEST_SKIP() << what << " not found at " << (path) << " (set SPARROW_MODEL / SPARROW_SHARED to point at it)"

std::string show(const Ids& ids) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < ids.size(); ++i) out << (i ? ", " : "") << ids[i];
  return out.str() + "]";
}

std::string escaped(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// decode(encode(s)) == s holds for UTF-8 text without a literal "▁" (which decodes as ' '). Broken UTF-8 need
// not survive: Gemma 4 replaces it by U+FFFD before merging, and Gemma 3's character cut can split a "▁" that
// stands for a space into byte tokens (both as llama.cpp).
bool should_round_trip(const std::string& text) {
  return text.find(kSpace) == std::string::npos && is_valid_utf8(text);
}

void expect_round_trip(const Tokenizer& tokenizer, const std::string& text, bool parse_special) {
  if (!should_round_trip(text)) return;
  const Ids ids = tokenizer.encode(text, false, parse_special);
  EXPECT_EQ(tokenizer.decode(ids, /*render_special=*/true), text) << "text " << escaped(text);
}

// ---------------------------------------------------------------------------------------------------------------
// Gemma 4: llama.cpp's own test cases (tests/test-tokenizer-0.cpp: add_special false, parse_special false)

struct LlamaCase {
  std::string text;
  Ids ids;
};

std::vector<LlamaCase> read_llama_cases(const std::string& inp_path, const std::string& out_path) {
  const std::string inputs = read_file(inp_path);
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < inputs.size();) {
    const size_t next = inputs.find(separator, pos);
    if (next == std::string::npos) {
      texts.push_back(inputs.substr(pos));
      break;
    }
    texts.push_back(inputs.substr(pos, next - pos));
    pos = next + separator.size();
  }
  std::ifstream out(out_path);
  std::vector<LlamaCase> cases;
  std::string line;
  for (size_t i = 0; std::getline(out, line); ++i) {
    if (i >= texts.size()) break;
    LlamaCase c{texts[i], {}};
    std::istringstream numbers(line);
    for (int32_t id; numbers >> id;) c.ids.push_back(id);
    cases.push_back(std::move(c));
  }
  EXPECT_EQ(cases.size(), texts.size()) << out_path << " and " << inp_path << " hold different numbers of cases";
  return cases;
}

TEST(Gemma4Tokenizer, MatchesLlamaCppTestCases) {
  const std::string vocab = gemma4_vocab_path();
  REQUIRE_TOKENIZER(tokenizer, vocab, "Gemma 4 vocabulary");
  const std::vector<LlamaCase> cases = read_llama_cases(vocab + ".inp", vocab + ".out");
  ASSERT_GE(cases.size(), 40u);
  for (const LlamaCase& c : cases) {
    EXPECT_EQ(show(tokenizer->encode(c.text, false, false)), show(c.ids)) << "text " << escaped(c.text);
    expect_round_trip(*tokenizer, c.text, false);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Both models: llama-tokenize's ids for varied strings, and for a whole corpus

struct FixtureString {
  std::string text;
  bool parse_special, add_bos;
  Ids ids;
};

std::string from_hex(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) bytes += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return bytes;
}

nlohmann::json read_fixture(const std::string& name) {
  const std::string path = fixture_path(name);
  const std::string text = read_file(path);
  if (text.empty()) ADD_FAILURE() << path << ": missing or empty (make it with scripts/make-tokenizer-fixtures)";
  return text.empty() ? nlohmann::json::object() : nlohmann::json::parse(text);
}

// Strings that are not UTF-8 are stored as "text_hex" (JSON strings cannot hold them).
std::vector<FixtureString> fixture_strings(const nlohmann::json& fixture) {
  std::vector<FixtureString> strings;
  for (const auto& entry : fixture.value("strings", nlohmann::json::array())) {
    FixtureString s;
    s.text =
        entry.contains("text_hex") ? from_hex(entry["text_hex"].get<std::string>()) : entry["text"].get<std::string>();
    s.parse_special = entry.at("parse_special").get<bool>();
    s.add_bos = entry.at("add_bos").get<bool>();
    s.ids = entry.at("ids").get<Ids>();
    strings.push_back(std::move(s));
  }
  return strings;
}

void expect_fixture_strings(const Tokenizer& tokenizer, const std::string& fixture_name) {
  const std::vector<FixtureString> strings = fixture_strings(read_fixture(fixture_name));
  EXPECT_GE(strings.size(), 50u) << fixture_name;
  for (const FixtureString& s : strings) {
    EXPECT_EQ(show(tokenizer.encode(s.text, s.add_bos, s.parse_special)), show(s.ids))
        << fixture_name << ": text " << escaped(s.text) << " parse_special " << s.parse_special << " add_bos "
        << s.add_bos;
    expect_round_trip(tokenizer, s.text, s.parse_special);
  }
}

// FNV-1a over the ids' decimal text joined by ' ' (what scripts/make-tokenizer-fixtures hashes).
uint64_t hash_ids(const Ids& ids) {
  uint64_t hash = 1469598103934665603ull;
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) text += (i ? " " : "") + std::to_string(ids[i]);
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

// Encodes the corpus as llama-tokenize did (add_bos, parse_special) and compares count and hash.
void expect_corpus(const Tokenizer& tokenizer, const std::string& fixture_name) {
  const nlohmann::json fixture = read_fixture(fixture_name);
  if (!fixture.contains("corpus")) GTEST_SKIP() << fixture_name << " has no corpus entry";
  const std::string path = corpus_path();
  const std::string text = read_file(path);
  if (text.empty()) GTEST_SKIP() << "corpus not found at " << path << " (set SPARROW_SHARED)";
  const nlohmann::json& expected = fixture["corpus"];
  ASSERT_EQ(text.size(), expected.at("bytes").get<size_t>()) << path << " is not the corpus the fixture was made from";

  const Ids ids = tokenizer.encode(text, expected.at("add_bos").get<bool>(), expected.at("parse_special").get<bool>());
  EXPECT_EQ(ids.size(), expected.at("n_tokens").get<size_t>());
  EXPECT_EQ(hash_ids(ids), std::stoull(expected.at("fnv1a64").get<std::string>(), nullptr, 16));
}

TEST(Gemma3Tokenizer, MatchesLlamaTokenizeOnVariedStrings) {
  REQUIRE_TOKENIZER(tokenizer, gemma3_model_path(), "Gemma 3 model");
  expect_fixture_strings(*tokenizer, "gemma3.json");
}

TEST(Gemma4Tokenizer, MatchesLlamaTokenizeOnVariedStrings) {
  REQUIRE_TOKENIZER(tokenizer, gemma4_vocab_path(), "Gemma 4 vocabulary");
  expect_fixture_strings(*tokenizer, "gemma4.json");
}

TEST(Gemma3Tokenizer, MatchesLlamaTokenizeOnCorpus) {
  REQUIRE_TOKENIZER(tokenizer, gemma3_model_path(), "Gemma 3 model");
  expect_corpus(*tokenizer, "gemma3.json");
}

TEST(Gemma4Tokenizer, MatchesLlamaTokenizeOnCorpus) {
  REQUIRE_TOKENIZER(tokenizer, gemma4_vocab_path(), "Gemma 4 vocabulary");
  expect_corpus(*tokenizer, "gemma4.json");
}

// ---------------------------------------------------------------------------------------------------------------
// Both models: metadata

TEST(Gemma3Tokenizer, SpecialIdsAndMetadata) {
  REQUIRE_TOKENIZER(tokenizer, gemma3_model_path(), "Gemma 3 model");
  EXPECT_EQ(tokenizer->n_vocab(), 262144);
  EXPECT_EQ(tokenizer->bos(), 2);
  EXPECT_EQ(tokenizer->eos(), 1);
  EXPECT_TRUE(tokenizer->add_bos_default());
  EXPECT_EQ(tokenizer->find_token("<start_of_turn>"), 105);
  EXPECT_EQ(tokenizer->find_token("<end_of_turn>"), 106);
  EXPECT_EQ(tokenizer->find_token("no such token, surely"), std::nullopt);
  // llama.cpp's end-of-generation set: eos, <end_of_turn>, and "</s>" (a user-defined token here).
  for (int32_t id : {1, 106, 212}) EXPECT_TRUE(tokenizer->is_end_of_generation(id)) << id;
  for (int32_t id : {0, 2, 105, 107}) EXPECT_FALSE(tokenizer->is_end_of_generation(id)) << id;
  EXPECT_EQ(tokenizer->token_to_piece(105), "");
  EXPECT_EQ(tokenizer->token_to_piece(105, true), "<start_of_turn>");
  EXPECT_EQ(tokenizer->token_to_piece(107), "\n");  // user-defined: printed as is
  EXPECT_EQ(tokenizer->token_to_piece(*tokenizer->find_token("<0x41>")), "A");
  EXPECT_EQ(tokenizer->token_to_piece(*tokenizer->find_token(kSpace + "the")), " the");
  EXPECT_THROW(tokenizer->token_to_piece(-1), Error);
  EXPECT_THROW(tokenizer->token_to_piece(tokenizer->n_vocab()), Error);
}

TEST(Gemma4Tokenizer, SpecialIdsAndMetadata) {
  REQUIRE_TOKENIZER(tokenizer, gemma4_vocab_path(), "Gemma 4 vocabulary");
  EXPECT_EQ(tokenizer->n_vocab(), 262144);
  EXPECT_EQ(tokenizer->bos(), 2);
  EXPECT_EQ(tokenizer->eos(), 1);
  EXPECT_TRUE(tokenizer->add_bos_default());
  EXPECT_EQ(tokenizer->find_token("<|turn>"), 105);
  EXPECT_EQ(tokenizer->find_token("<turn|>"), 106);
  EXPECT_EQ(tokenizer->find_token("<|think|>"), 98);
  EXPECT_EQ(tokenizer->find_token("<|channel>"), 100);
  EXPECT_EQ(tokenizer->find_token("<channel|>"), 101);
  // <eos>, <turn|> and <|tool_response>; "</s>" is an ordinary token in Gemma 4 (llama.cpp's special case).
  for (int32_t id : {1, 50, 106}) EXPECT_TRUE(tokenizer->is_end_of_generation(id)) << id;
  for (int32_t id : {0, 2, 105, 212}) EXPECT_FALSE(tokenizer->is_end_of_generation(id)) << id;
  EXPECT_NE(tokenizer->chat_template().find("<|turn>"), std::string::npos);
  EXPECT_EQ(tokenizer->token_to_piece(105), "");
  EXPECT_EQ(tokenizer->token_to_piece(105, true), "<|turn>");
  EXPECT_EQ(tokenizer->token_to_piece(100), "<|channel>");  // user-defined: printed even without render_special
  EXPECT_EQ(tokenizer->token_to_piece(50), "");             // <|tool_response> counts as control (it ends turns)
  EXPECT_EQ(tokenizer->token_to_piece(212), "</s>");
  EXPECT_EQ(tokenizer->encode("", true, true), Ids{2});
  EXPECT_EQ(tokenizer->encode("", false, true), Ids{});
}

TEST(Gemma4Tokenizer, ChatTurnMarkersParseOnlyWhenAsked) {
  REQUIRE_TOKENIZER(tokenizer, gemma4_vocab_path(), "Gemma 4 vocabulary");
  const std::string prompt = "<|turn>user\nHi<turn|>\n<|turn>model\n";
  const Ids parsed = tokenizer->encode(prompt, true, true);
  ASSERT_GE(parsed.size(), 4u);
  EXPECT_EQ(parsed[0], 2);
  EXPECT_EQ(parsed[1], 105);
  EXPECT_EQ(std::count(parsed.begin(), parsed.end(), 105), 2);
  EXPECT_EQ(std::count(parsed.begin(), parsed.end(), 106), 1);
  const Ids plain = tokenizer->encode(prompt, false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 105), 0);
  EXPECT_EQ(tokenizer->decode(plain), prompt);
}

// ---------------------------------------------------------------------------------------------------------------
// Slow references on small vocabularies

// A small vocabulary: every byte token, single characters (some deliberately missing, to force byte fallback),
// and longer pieces; spaces are "▁".
struct SmallVocab {
  TokenizerVocab vocab;
  std::vector<std::string> alphabet;  // characters texts are drawn from
};

void add_token(TokenizerVocab& v, const std::string& text, int32_t type, float score = 0) {
  v.tokens.push_back(text);
  v.token_types.push_back(type);
  v.scores.push_back(score);
}

std::vector<std::string> base_alphabet() {
  return {"a",
          "b",
          "c",
          "d",
          kSpace,
          "\n",
          "\xC3\xA9" /* é */,
          "\xE4\xB8\xAD" /* 中 */,
          "\xF0\x9F\x98\x80" /* 😀, kept out of the vocabulary */,
          "x" /* likewise */};
}

void add_common_tokens(TokenizerVocab& v) {
  add_token(v, "<pad>", token_type::kControl);
  add_token(v, "<eos>", token_type::kControl);
  add_token(v, "<bos>", token_type::kControl);
  add_token(v, "<unk>", token_type::kUnknown);
  add_token(v, "<s>", token_type::kControl);     // parsed only with parse_special
  add_token(v, "<ab>", token_type::kControl);    // overlaps "<a" and "b>" below
  add_token(v, "<a", token_type::kUserDefined);  // always split out, shorter so tried after "<ab>"
  add_token(v, "b>", token_type::kUserDefined);
  add_token(v, "dd", token_type::kUserDefined);   // with "ddd": nested, self-overlapping runs like Gemma's
  add_token(v, "ddd", token_type::kUserDefined);  // whitespace-run tokens
  add_token(v, "s>", token_type::kUserDefined);   // inside the control token "<s>"
  for (int byte = 0; byte < 256; ++byte) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", byte);
    add_token(v, hex, token_type::kByte);
  }
  v.bos = 2;
  v.eos = 1;
}

// Texts mixing the alphabet with spaces, special token texts and broken UTF-8.
std::string random_text(std::mt19937& rng, const std::vector<std::string>& alphabet) {
  static const std::vector<std::string> extras = {" ",  " ",  "  ",    "<s>",  "<ab>", "<a",   "b>",
                                                  "dd", "dd", "ddddd", "<s>>", "\xC3", "\xA9", "\xFF"};
  std::uniform_int_distribution<int> length(0, 24), pick(0, 99);
  std::string text;
  for (int n = length(rng); n > 0; --n) {
    const int p = pick(rng);
    text += p < 80 ? alphabet[p % alphabet.size()] : extras[p % extras.size()];
  }
  return text;
}

SmallVocab random_sentencepiece_vocab(std::mt19937& rng) {
  SmallVocab s;
  TokenizerVocab& v = s.vocab;
  v.model = "llama";
  v.add_space_prefix = false;
  add_common_tokens(v);
  s.alphabet = base_alphabet();
  for (size_t i = 0; i + 2 < s.alphabet.size(); ++i) add_token(v, s.alphabet[i], token_type::kNormal, -100);
  std::uniform_int_distribution<int> pick(0, static_cast<int>(s.alphabet.size()) - 1), pieces(2, 4);
  std::uniform_int_distribution<int> score(-50, 0);  // few distinct scores: ties must break leftmost
  for (int n = 0; n < 60; ++n) {
    std::string text;
    for (int k = pieces(rng); k > 0; --k) text += s.alphabet[pick(rng)];
    if (std::find(v.tokens.begin(), v.tokens.end(), text) == v.tokens.end()) {
      add_token(v, text, token_type::kNormal, static_cast<float>(score(rng)));
    }
  }
  return s;
}

// BPE vocabularies are built merge by merge, so every merge joins two tokens into a token.
SmallVocab random_bpe_vocab(std::mt19937& rng) {
  SmallVocab s;
  TokenizerVocab& v = s.vocab;
  v.model = "gemma4";
  add_common_tokens(v);
  s.alphabet = base_alphabet();
  std::vector<std::string> mergeable;
  for (size_t i = 0; i + 2 < s.alphabet.size(); ++i) {
    add_token(v, s.alphabet[i], token_type::kNormal);
    mergeable.push_back(s.alphabet[i]);
  }
  add_token(v, "\n\n\n", token_type::kNormal);  // a whole run of newlines, never built by merges
  for (int n = 0; n < 60; ++n) {
    std::uniform_int_distribution<size_t> pick(0, mergeable.size() - 1);
    const std::string& left = mergeable[pick(rng)];
    const std::string& right = mergeable[pick(rng)];
    const std::string merge = left + " " + right;
    if (std::find(v.merges.begin(), v.merges.end(), merge) != v.merges.end()) continue;
    v.merges.push_back(merge);
    const std::string joined = left + right;
    if (std::find(v.tokens.begin(), v.tokens.end(), joined) == v.tokens.end()) {
      add_token(v, joined, token_type::kNormal);
      mergeable.push_back(joined);
    }
  }
  return s;
}

int32_t id_of(const TokenizerVocab& v, const std::string& text) {
  auto it = std::find(v.tokens.begin(), v.tokens.end(), text);
  return it == v.tokens.end() ? -1 : static_cast<int32_t>(it - v.tokens.begin());
}

std::string spaces_as_markers(const std::string& text) {
  std::string out;
  for (char c : text) out += c == ' ' ? kSpace : std::string(1, c);
  return out;
}

// UTF-8 characters as llama.cpp cuts them: by the lead byte's high bits, clipped at the end.
std::vector<std::string> characters(const std::string& text) {
  std::vector<std::string> chars;
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    size_t n = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    n = std::min(n, text.size() - i);
    chars.push_back(text.substr(i, n));
    i += n;
  }
  return chars;
}

void append_symbol_ids(const TokenizerVocab& v, const std::string& symbol, Ids& out) {
  if (const int32_t id = id_of(v, symbol); id >= 0) {
    out.push_back(id);
    return;
  }
  for (unsigned char byte : symbol) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", byte);
    out.push_back(id_of(v, hex));
  }
}

// SentencePiece, literally: merge the adjacent pair making the best-scoring token, leftmost on ties.
Ids reference_sentencepiece(const TokenizerVocab& v, const std::string& plain) {
  std::vector<std::string> symbols = characters(spaces_as_markers(plain));
  for (;;) {
    int best = -1;
    float best_score = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const int32_t id = id_of(v, symbols[i] + symbols[i + 1]);
      if (id >= 0 && (best < 0 || v.scores[id] > best_score)) {
        best = static_cast<int>(i);
        best_score = v.scores[id];
      }
    }
    if (best < 0) break;
    symbols[best] += symbols[best + 1];
    symbols.erase(symbols.begin() + best + 1);
  }
  Ids ids;
  for (const std::string& symbol : symbols) append_symbol_ids(v, symbol, ids);
  return ids;
}

// The code points of text re-encoded, undecodable bytes as U+FFFD (what llama.cpp feeds Gemma 4's BPE).
std::string sanitized_utf8(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    size_t n = lead < 0x80 ? 1 : lead < 0xC0 ? 0 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : lead < 0xF8 ? 4 : 0;
    bool ok = n > 0 && i + n <= text.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
    if (ok) {
      out += text.substr(i, n);  // (the random texts hold no overlong forms, which would be re-encoded)
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += 1;
    }
  }
  return out;
}

// Gemma 4's BPE, literally: runs of newlines / of anything else; merge the lowest-ranked adjacent pair,
// leftmost on ties; a newline run that is a token stays whole.
Ids reference_bpe(const TokenizerVocab& v, const std::string& plain) {
  const std::string text = sanitized_utf8(spaces_as_markers(plain));
  Ids ids;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = begin;
    while (end < text.size() && (text[end] == '\n') == (text[begin] == '\n')) ++end;
    const std::string word = text.substr(begin, end - begin);
    begin = end;
    if (word[0] == '\n' && id_of(v, word) >= 0) {
      ids.push_back(id_of(v, word));
      continue;
    }
    std::vector<std::string> symbols = characters(word);
    for (;;) {
      int best = -1;
      size_t best_rank = 0;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        auto it = std::find(v.merges.begin(), v.merges.end(), symbols[i] + " " + symbols[i + 1]);
        const size_t rank = static_cast<size_t>(it - v.merges.begin());
        if (it != v.merges.end() && (best < 0 || rank < best_rank)) {
          best = static_cast<int>(i);
          best_rank = rank;
        }
      }
      if (best < 0) break;
      symbols[best] += symbols[best + 1];
      symbols.erase(symbols.begin() + best + 1);
    }
    for (const std::string& symbol : symbols) append_symbol_ids(v, symbol, ids);
  }
  return ids;
}

// llama.cpp's special-token split, literally: special tokens longest first (stable among equals, as
// std::sort leaves a short list), each splitting every plain fragment at its leftmost occurrences.
struct Fragment {
  std::string text;
  int32_t token;  // -1: plain text
};

std::vector<Fragment> reference_split(const TokenizerVocab& v, const std::string& text, bool parse_special) {
  std::vector<int32_t> specials;
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const int32_t type = v.token_types[id];
    if (type == token_type::kUserDefined ||
        (parse_special && (type == token_type::kControl || type == token_type::kUnknown)))
      specials.push_back(static_cast<int32_t>(id));
  }
  std::stable_sort(specials.begin(), specials.end(),
                   [&](int32_t a, int32_t b) { return v.tokens[a].size() > v.tokens[b].size(); });
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({text, -1});
  for (int32_t special : specials) {
    const std::string& needle = v.tokens[special];
    std::vector<Fragment> next;
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t from = 0;
      for (size_t at; (at = f.text.find(needle, from)) != std::string::npos; from = at + needle.size()) {
        if (at > from) next.push_back({f.text.substr(from, at - from), -1});
        next.push_back({"", special});
      }
      if (from < f.text.size()) next.push_back({f.text.substr(from), -1});
    }
    fragments = std::move(next);
  }
  return fragments;
}

Ids reference_encode(const TokenizerVocab& v, const std::string& text, bool add_bos, bool parse_special) {
  Ids ids;
  if (add_bos) ids.push_back(*v.bos);
  for (const Fragment& f : reference_split(v, text, parse_special)) {
    if (f.token >= 0) {
      ids.push_back(f.token);
    } else {
      const Ids piece = v.model == "llama" ? reference_sentencepiece(v, f.text) : reference_bpe(v, f.text);
      ids.insert(ids.end(), piece.begin(), piece.end());
    }
  }
  return ids;
}

void expect_matches_reference(SmallVocab (*make_vocab)(std::mt19937&), unsigned seed) {
  std::mt19937 rng(seed);
  for (int round = 0; round < 20; ++round) {
    const SmallVocab small = make_vocab(rng);
    const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_vocab(small.vocab);
    for (int n = 0; n < 100; ++n) {
      const std::string text = random_text(rng, small.alphabet);
      for (bool parse_special : {false, true}) {
        const bool add_bos = n % 2 == 0;
        ASSERT_EQ(show(tokenizer->encode(text, add_bos, parse_special)),
                  show(reference_encode(small.vocab, text, add_bos, parse_special)))
            << small.vocab.model << " round " << round << " text " << escaped(text) << " parse_special "
            << parse_special;
      }
    }
  }
}

TEST(SentencePieceTokenizer, MatchesSlowReferenceOnRandomVocabularies) {
  expect_matches_reference(random_sentencepiece_vocab, 1234);
}

TEST(Gemma4BpeTokenizer, MatchesSlowReferenceOnRandomVocabularies) { expect_matches_reference(random_bpe_vocab, 5678); }

// ---------------------------------------------------------------------------------------------------------------
// Hand-checked behaviour on tiny vocabularies

TokenizerVocab tiny_vocab(const std::string& model) {
  TokenizerVocab v;
  v.model = model;
  v.add_space_prefix = false;
  add_common_tokens(v);
  return v;
}

TEST(SpecialTokenSplit, LongerSpecialTokensWinAndControlNeedsParseSpecial) {
  TokenizerVocab v = tiny_vocab("llama");
  add_token(v, "q", token_type::kNormal);
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_vocab(v);
  const int32_t ab = id_of(v, "<ab>"), a = id_of(v, "<a"), b = id_of(v, "b>"), q = id_of(v, "q");
  // "<ab>" (control, longest) is tried first; without parse_special the user-defined "<a" and "b>" take over.
  EXPECT_EQ(tokenizer->encode("q<ab>q", false, true), (Ids{q, ab, q}));
  EXPECT_EQ(tokenizer->encode("q<ab>q", false, false), (Ids{q, a, b, q}));
  // Priority beats position: "b>" would come first in "<ab>", but the longer "<ab>" is tried before it.
  EXPECT_EQ(tokenizer->encode("<ab>", true, true), (Ids{2, ab}));
  // Without parse_special the user-defined pieces split it; the stray '>' (no token here) falls back to its byte.
  EXPECT_EQ(tokenizer->encode("<ab>>", false, false), (Ids{a, b, id_of(v, "<0x3E>")}));
  EXPECT_EQ(tokenizer->decode({2, ab, q}), "q");
  EXPECT_EQ(tokenizer->decode({2, ab, q}, true), "<bos><ab>q");
}

TEST(SentencePieceTokenizer, AddSpacePrefixAfterSpecialTokensOnly) {
  TokenizerVocab v = tiny_vocab("llama");
  v.add_space_prefix = true;
  add_token(v, kSpace, token_type::kNormal);
  add_token(v, "q", token_type::kNormal);
  add_token(v, kSpace + "q", token_type::kNormal, 1.0f);
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_vocab(v);
  const int32_t sq = id_of(v, kSpace + "q"), q = id_of(v, "q"), s = id_of(v, "<s>");
  EXPECT_EQ(tokenizer->encode("q", false, false), Ids{sq});
  EXPECT_EQ(tokenizer->encode("q<s>q", false, true), (Ids{sq, s, sq}));
  EXPECT_EQ(tokenizer->encode("qq", false, false), (Ids{sq, q}));
}

TEST(Gemma4BpeTokenizer, UnknownCharactersFallBackToBytes) {
  TokenizerVocab v = tiny_vocab("gemma4");
  add_token(v, "a", token_type::kNormal);
  add_token(v, "b", token_type::kNormal);
  add_token(v, "ab", token_type::kNormal);
  v.merges = {"a b"};
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_vocab(v);
  const int32_t ab = id_of(v, "ab"), x = id_of(v, "<0x78>"), a9 = id_of(v, "<0xA9>"), c3 = id_of(v, "<0xC3>");
  EXPECT_EQ(tokenizer->encode("abx", false, false), (Ids{ab, x}));
  EXPECT_EQ(tokenizer->encode("\xC3\xA9", false, false), (Ids{c3, a9}));
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("ab\xC3\xA9x", false, false)), "ab\xC3\xA9x");
  // A byte that is not UTF-8 becomes U+FFFD (EF BF BD) before merging, as in llama.cpp.
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("a\xFF", false, false)), "a\xEF\xBF\xBD");
}

// ---------------------------------------------------------------------------------------------------------------
// Errors

TEST(TokenizerErrors, BadVocabulariesNameTheKey) {
  auto message_of = [](TokenizerVocab v) {
    try {
      Tokenizer::from_vocab(std::move(v));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  TokenizerVocab unknown_model = tiny_vocab("gpt2");
  EXPECT_NE(message_of(unknown_model).find("tokenizer.ggml.model"), std::string::npos);

  TokenizerVocab bad_eos = tiny_vocab("llama");
  bad_eos.eos = 1000000;
  EXPECT_NE(message_of(bad_eos).find("tokenizer.ggml.eos_token_id"), std::string::npos);

  TokenizerVocab repeated = tiny_vocab("llama");
  add_token(repeated, "<s>", token_type::kNormal);
  EXPECT_NE(message_of(repeated).find("appears more than once"), std::string::npos);

  TokenizerVocab no_merges = tiny_vocab("gemma4");
  EXPECT_NE(message_of(no_merges).find("tokenizer.ggml.merges"), std::string::npos);

  TokenizerVocab short_types = tiny_vocab("llama");
  short_types.token_types.pop_back();
  EXPECT_NE(message_of(short_types).find("tokenizer.ggml.token_type"), std::string::npos);

  TokenizerVocab empty = tiny_vocab("llama");
  empty.tokens.clear();
  empty.token_types.clear();
  empty.scores.clear();
  EXPECT_NE(message_of(empty).find("tokenizer.ggml.tokens"), std::string::npos);
}

TEST(TokenizerErrors, MissingBosIsAnErrorOnlyWhenAskedFor) {
  TokenizerVocab v = tiny_vocab("gemma4");
  add_token(v, "a", token_type::kNormal);
  add_token(v, "b", token_type::kNormal);
  v.merges = {"a b"};
  v.bos.reset();
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_vocab(v);
  EXPECT_EQ(tokenizer->encode("a", false, false), Ids{id_of(v, "a")});
  EXPECT_THROW(tokenizer->encode("a", true, false), Error);
}

// ---------------------------------------------------------------------------------------------------------------
// Reading the keys of a GGUF file (a tiny one written here, so this runs without the real files)

std::string temp_gguf_path(const std::string& name) {
  return (testing::scratch_dir() / (name + ".gguf")).string();
}

gguf::Writer tiny_gemma4_writer() {
  gguf::Writer w;
  w.set_string("tokenizer.ggml.model", "gemma4");
  std::vector<std::string> tokens = {"<pad>", "<eos>", "<bos>", "a", "b", kSpace, "ab", kSpace + "ab"};
  std::vector<int32_t> types(tokens.size(), token_type::kNormal);
  types[0] = types[1] = types[2] = token_type::kControl;
  w.set_array_string("tokenizer.ggml.tokens", tokens);
  w.set_array_i32("tokenizer.ggml.token_type", types);
  w.set_array_f32("tokenizer.ggml.scores", std::vector<float>(tokens.size(), 0.0f));
  w.set_array_string("tokenizer.ggml.merges", {"a b", kSpace + " ab"});
  w.set_u32("tokenizer.ggml.bos_token_id", 2);
  w.set_u32("tokenizer.ggml.eos_token_id", 1);
  w.set_i32("tokenizer.ggml.eot_token_id", -1);      // "none", as some converters write it
  w.set_bool("tokenizer.ggml.add_bos_token", false);  // llama.cpp forces it on for Gemma 4
  w.set_string("tokenizer.chat_template", "{{ messages }}");
  return w;
}

TEST(TokenizerFromGguf, ReadsTheTokenizerKeys) {
  const std::string path = temp_gguf_path("tiny");
  tiny_gemma4_writer().write(path);
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_gguf(*gguf::File::open(path));
  std::filesystem::remove(path);
  EXPECT_EQ(tokenizer->n_vocab(), 8);
  EXPECT_EQ(tokenizer->bos(), 2);
  EXPECT_EQ(tokenizer->eos(), 1);
  EXPECT_TRUE(tokenizer->add_bos_default());
  EXPECT_TRUE(tokenizer->is_end_of_generation(1));
  EXPECT_EQ(tokenizer->chat_template(), "{{ messages }}");
  EXPECT_EQ(tokenizer->encode("ab ab", true, false), (Ids{2, 6, 7}));
  EXPECT_EQ(tokenizer->decode({2, 6, 7}), "ab ab");
}

TEST(TokenizerFromGguf, MissingKeysNameFileAndKey) {
  const std::string path = temp_gguf_path("no_tokens");
  gguf::Writer w;
  w.set_string("tokenizer.ggml.model", "gemma4");
  w.write(path);
  try {
    Tokenizer::from_gguf(*gguf::File::open(path));
    ADD_FAILURE() << "a file without tokenizer.ggml.tokens was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.tokens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace sparrow
