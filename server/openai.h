#pragma once
// OpenAI's request and reply shapes for `sparrow serve`: requests are parsed and checked here, before anything
// reaches the engine, and every refusal is an HttpError that the server sends as a 4xx in OpenAI's error shape.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sparrow::server {

// A refusal: HTTP status, OpenAI error type ("invalid_request_error", ...) and the offending parameter.
struct HttpError : std::runtime_error {
  HttpError(int status, std::string message, std::string type = "invalid_request_error", std::string param = "")
      : std::runtime_error(std::move(message)), status(status), type(std::move(type)), param(std::move(param)) {}
  int status;
  std::string type;
  std::string param;
};

// {"error": {"message", "type", "param", "code"}}
nlohmann::json error_body(const HttpError& e);

struct ChatMessage {
  std::string role;  // system, user, assistant
  std::string content;
};

struct GenerationParams {
  int32_t max_tokens = -1;  // -1: until the end of the turn or the context
  float temperature = 1.0f;
  int32_t top_k = 0;  // 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  bool has_seed = false;
  std::vector<std::string> stop;  // at most 4, non-empty
};

struct CompletionRequest {
  bool chat = true;                   // /v1/chat/completions (messages) or /v1/completions (prompt)
  std::vector<ChatMessage> messages;  // chat
  std::string prompt;                 // completions
  std::string model;                  // "" when not given
  bool stream = false;
  bool include_usage = true;  // usage in the last streamed chunk (stream_options.include_usage, default on)
  GenerationParams params;
};

// Parse and check a request body; `served_model` is the only model name accepted (404 otherwise). Throws HttpError.
// (JSON text that is not UTF-8 is refused by the parser.)
CompletionRequest parse_completion_request(const std::string& body, bool chat, const std::string& served_model);

}  // namespace sparrow::server
