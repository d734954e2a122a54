// Regression tests for what the fuzzers of tests/fuzz/ found. Each input that found a bug is also in the seed
// corpus (tests/fuzz/corpus/<target>/regression_*), so the fuzzers replay it on every run.
#include <gtest/gtest.h>

#include <string>

#include "runtime/chat_format.h"
#include "util/error.h"

namespace sparrow {
namespace {

// chat_format: a Gemma 3 system message with no user message after it (Gemma 3 has no system turn; its text
// opens the next user turn) vanished from the prompt. Found as a lone system message "D".
TEST(FuzzRegression, Gemma3SystemMessageWithoutAUserMessageIsRefused) {
  for (bool add_generation_prompt : {false, true}) {
    EXPECT_THROW(format_chat(ChatFamily::Gemma3, {{"system", "D"}}, add_generation_prompt), Error);
    EXPECT_THROW(format_chat(ChatFamily::Gemma3, {{"user", "U"}, {"assistant", "A"}, {"system", "late"}},
                             add_generation_prompt),
                 Error);
  }
  // Followed by a user message, the system text opens that turn.
  const std::string prompt = format_chat(ChatFamily::Gemma3, {{"user", "U"}, {"system", "S"}, {"user", "V"}}, false);
  EXPECT_EQ(prompt, "<bos><start_of_turn>user\nU<end_of_turn>\n<start_of_turn>user\nS\n\nV<end_of_turn>\n");
  // Gemma 4 has a system turn of its own.
  EXPECT_EQ(format_chat(ChatFamily::Gemma4, {{"system", "D"}}, false), "<bos><|turn>system\nD<turn|>\n");
}

}  // namespace
}  // namespace sparrow
