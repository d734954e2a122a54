#pragma once
// Conversation formatting with Gemma's turn markers. A GGUF's tokenizer.chat_template is a Jinja program; rather
// than run Jinja, Sparrow recognises the Gemma 3 and Gemma 4 template families by their markers (and falls back to
// the architecture's own family when a file carries no template) and formats turns the way those templates do.
#include <string>
#include <vector>

#include "model/config.h"

namespace sparrow {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

enum class ChatFamily { Gemma3, Gemma4 };

ChatFamily detect_chat_family(const std::string& chat_template, Architecture arch);
// The prompt text, starting with "<bos>" (parse it with special tokens on and without adding another BOS).
std::string format_chat(ChatFamily family, const std::vector<ChatMessage>& messages, bool add_generation_prompt);

}  // namespace sparrow
