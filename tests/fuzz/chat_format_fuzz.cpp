// Fuzzes chat formatting and the tokenization of its output. Input: one flags byte (bit 0: add the generation
// prompt), then messages separated by '\0', each a role byte (0: system, 1: user, 2: assistant, 3: an invalid
// role) and its content. The whole input also serves as a chat template for detect_chat_family. Properties:
//   - an invalid role, or (Gemma 3, which has no system turn) a system message no user message follows, is
//     refused with sparrow::Error, and only these;
//   - the prompt starts with "<bos>", holds every message's content, and ends with the generation prompt when
//     asked for;
//   - parsed with special tokens by the Gemma 4 tokenizer, the prompt starts with the BOS token.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "runtime/chat_format.h"
#include "util/error.h"

namespace {

using sparrow::ChatMessage;
using sparrow::fuzz::property_failed;

constexpr const char* kRoles[] = {"system", "user", "assistant", "tool"};

std::vector<ChatMessage> parse_messages(std::string_view input) {
  std::vector<ChatMessage> messages;
  while (!input.empty()) {
    const size_t end = std::min(input.find('\0'), input.size());
    const std::string_view record = input.substr(0, end);
    if (!record.empty()) messages.push_back({kRoles[static_cast<uint8_t>(record[0]) % 4], std::string(record.substr(1))});
    input.remove_prefix(std::min(end + 1, input.size()));
  }
  return messages;
}

bool ends_with(const std::string& text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void check_prompt(sparrow::ChatFamily family, const std::string& prompt, const std::vector<ChatMessage>& messages,
                  bool add_generation_prompt) {
  if (prompt.rfind("<bos>", 0) != 0) property_failed("the prompt does not start with <bos>");
  for (const ChatMessage& m : messages) {
    if (prompt.find(m.content) == std::string::npos) property_failed("a message's content is missing");
  }
  const std::string_view generation =
      family == sparrow::ChatFamily::Gemma4 ? "<|turn>model\n" : "<start_of_turn>model\n";
  if (add_generation_prompt && !ends_with(prompt, generation)) property_failed("no generation prompt at the end");

  const sparrow::Tokenizer& tokenizer = sparrow::fuzz::gemma4_tokenizer();
  const std::vector<int32_t> ids = tokenizer.encode(prompt, /*add_bos=*/false, /*parse_special=*/true);
  if (ids.empty() || ids[0] != tokenizer.bos()) property_failed("the prompt does not tokenize to BOS first");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  sparrow::fuzz::gemma4_tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool add_generation_prompt = (data[0] & 1) != 0;
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::vector<ChatMessage> messages = parse_messages(input);
  bool invalid_role = false, system_awaits_user = false;
  for (const ChatMessage& m : messages) {
    invalid_role = invalid_role || m.role == kRoles[3];
    if (m.role == "system") system_awaits_user = true;
    if (m.role == "user") system_awaits_user = false;
  }

  for (sparrow::Architecture arch : {sparrow::Architecture::Gemma3, sparrow::Architecture::Gemma4}) {
    const sparrow::ChatFamily family = sparrow::detect_chat_family(std::string(input), arch);
    const bool refuse = invalid_role || (family == sparrow::ChatFamily::Gemma3 && system_awaits_user);
    try {
      const std::string prompt = sparrow::format_chat(family, messages, add_generation_prompt);
      if (refuse) property_failed("messages that must be refused were formatted");
      check_prompt(family, prompt, messages, add_generation_prompt);
    } catch (const sparrow::Error&) {
      if (!refuse) property_failed("valid messages were refused");
    }
  }
  return 0;
}
