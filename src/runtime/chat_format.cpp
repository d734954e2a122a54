#include "runtime/chat_format.h"

#include "util/error.h"

namespace sparrow {

ChatFamily detect_chat_family(const std::string& chat_template, Architecture arch) {
  if (chat_template.find("<|turn>") != std::string::npos) return ChatFamily::Gemma4;
  if (chat_template.find("<start_of_turn>") != std::string::npos) return ChatFamily::Gemma3;
  return arch == Architecture::Gemma4 ? ChatFamily::Gemma4 : ChatFamily::Gemma3;
}

namespace {

void check_role(const ChatMessage& m) {
  if (m.role != "system" && m.role != "user" && m.role != "assistant")
    throw Error("chat: unknown role '" + m.role + "' (expected system, user or assistant)");
}

// Gemma 3's template has no system turn: the system text opens the first user turn.
std::string gemma3(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out = "<bos>", system;
  for (const ChatMessage& m : messages) {
    check_role(m);
    if (m.role == "system") { system += m.content + "\n\n"; continue; }
    out += "<start_of_turn>" + std::string(m.role == "assistant" ? "model" : "user") + "\n";
    if (m.role == "user") { out += system; system.clear(); }
    out += m.content + "<end_of_turn>\n";
  }
  // Text with no user turn left to open would vanish from the prompt without a word.
  if (!system.empty()) throw Error("chat: a system message must be followed by a user message (Gemma 3 has no "
                                   "system turn: the system text opens the next user turn)");
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

std::string gemma4(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out = "<bos>";
  for (const ChatMessage& m : messages) {
    check_role(m);
    out += "<|turn>" + std::string(m.role == "assistant" ? "model" : m.role) + "\n" + m.content + "<turn|>\n";
  }
  if (add_generation_prompt) out += "<|turn>model\n";
  return out;
}

}  // namespace

std::string format_chat(ChatFamily family, const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  return family == ChatFamily::Gemma4 ? gemma4(messages, add_generation_prompt)
                                      : gemma3(messages, add_generation_prompt);
}

}  // namespace sparrow
