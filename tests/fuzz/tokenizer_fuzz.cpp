// Fuzzes both tokenizers on arbitrary text: Gemma 4's BPE and a SentencePiece tokenizer over the same vocabulary
// (tests/fuzz/fuzz_util.h). Input: one flags byte (bit 0: SentencePiece, bit 1: add BOS, bit 2: parse special
// tokens), then the text. Properties checked beyond "no crash, leak or UB":
//   - every id is inside the vocabulary, and BOS comes first exactly when asked for;
//   - decode(encode(text)) == text for valid UTF-8 without a literal "▁" (which decodes as ' '), as
//     tests/unit/tokenizer_test.cpp states for real text.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "util/error.h"

namespace {

using sparrow::Tokenizer;
using sparrow::fuzz::property_failed;

void check_ids(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, bool add_bos) {
  for (int32_t id : ids) {
    if (id < 0 || id >= tokenizer.n_vocab()) property_failed("an id outside the vocabulary");
  }
  if (add_bos && (ids.empty() || ids[0] != tokenizer.bos())) property_failed("BOS asked for but not first");
}

void check_round_trip(const Tokenizer& tokenizer, std::string_view text, const std::vector<int32_t>& ids,
                      bool add_bos) {
  const std::string decoded = tokenizer.decode(ids, /*render_special=*/true);
  const std::string expected = (add_bos ? tokenizer.token_text(tokenizer.bos()) : std::string()) + std::string(text);
  const bool round_trips = text.find("\xE2\x96\x81") == std::string_view::npos && sparrow::fuzz::is_valid_utf8(text);
  if (round_trips && decoded != expected) property_failed("decode(encode(text)) != text");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  sparrow::fuzz::gemma4_tokenizer();
  sparrow::fuzz::sentencepiece_tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const Tokenizer& tokenizer =
      (flags & 1) ? sparrow::fuzz::sentencepiece_tokenizer() : sparrow::fuzz::gemma4_tokenizer();
  const bool add_bos = (flags & 2) != 0, parse_special = (flags & 4) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  const std::vector<int32_t> ids = tokenizer.encode(text, add_bos, parse_special);
  check_ids(tokenizer, ids, add_bos);
  check_round_trip(tokenizer, text, ids, add_bos);
  for (int32_t id : ids) tokenizer.token_to_piece(id, /*render_special=*/false);
  return 0;
}
