#include "openai.h"

#include <cmath>

namespace sparrow::server {
namespace {

using nlohmann::json;

constexpr int32_t kMaxTokensLimit = 1 << 20;  // a max_tokens beyond any context is a mistake, not a wish
constexpr size_t kMaxStops = 4;               // OpenAI's limit

HttpError bad(const std::string& param, const std::string& message) { return HttpError(400, message, "invalid_request_error", param); }

// A number field in [lo, hi], or the default when absent or null.
double number(const json& body, const char* key, double fallback, double lo, double hi) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  if (!body[key].is_number()) throw bad(key, std::string(key) + " must be a number");
  const double v = body[key].get<double>();
  if (!std::isfinite(v) || v < lo || v > hi)
    throw bad(key, std::string(key) + " must be between " + json(lo).dump() + " and " + json(hi).dump());
  return v;
}

int64_t integer(const json& body, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  if (!body[key].is_number_integer()) throw bad(key, std::string(key) + " must be an integer");
  const int64_t v = body[key].get<int64_t>();
  if (v < lo || v > hi)
    throw bad(key, std::string(key) + " must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  return v;
}

std::string text(const json& value, const std::string& param) {
  if (!value.is_string()) throw bad(param, param + " must be a string");
  return value.get<std::string>();
}

// A message's content: a string, or OpenAI's array of parts of which only text parts are taken.
std::string content_of(const json& message, size_t i) {
  const std::string param = "messages[" + std::to_string(i) + "].content";
  if (!message.contains("content") || message["content"].is_null()) throw bad(param, param + " is missing");
  const json& c = message["content"];
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) throw bad(param, param + " must be a string or an array of text parts");
  std::string out;
  for (const json& part : c) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text"))
      throw bad(param, param + ": only text parts are supported");
    out += text(part["text"], param);
  }
  return out;
}

std::vector<ChatMessage> messages_of(const json& body) {
  if (!body.contains("messages")) throw bad("messages", "messages is missing");
  const json& m = body["messages"];
  if (!m.is_array() || m.empty()) throw bad("messages", "messages must be a non-empty array");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < m.size(); ++i) {
    if (!m[i].is_object()) throw bad("messages", "messages[" + std::to_string(i) + "] must be an object");
    const std::string role = m[i].contains("role") ? text(m[i]["role"], "messages[" + std::to_string(i) + "].role") : "";
    if (role != "system" && role != "user" && role != "assistant" && role != "developer")
      throw bad("messages", "messages[" + std::to_string(i) + "].role must be system, user or assistant, not '" +
                                role + "'");
    out.push_back({role == "developer" ? "system" : role, content_of(m[i], i)});
  }
  return out;
}

std::vector<std::string> stops_of(const json& body) {
  if (!body.contains("stop") || body["stop"].is_null()) return {};
  const json& s = body["stop"];
  std::vector<std::string> out;
  if (s.is_string()) out.push_back(s.get<std::string>());
  else if (s.is_array())
    for (const json& item : s) out.push_back(text(item, "stop"));
  else
    throw bad("stop", "stop must be a string or an array of strings");
  if (out.size() > kMaxStops) throw bad("stop", "at most 4 stop strings");
  for (const std::string& stop : out)
    if (stop.empty()) throw bad("stop", "a stop string must not be empty");
  return out;
}

}  // namespace

json error_body(const HttpError& e) {
  return {{"error",
           {{"message", e.what()}, {"type", e.type}, {"param", e.param.empty() ? json() : json(e.param)},
            {"code", nullptr}}}};
}

CompletionRequest parse_completion_request(const std::string& body_text, bool chat, const std::string& served_model) {
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::parse_error& e) {
    throw HttpError(400, std::string("the body is not valid JSON: ") + e.what());
  }
  if (!body.is_object()) throw HttpError(400, "the body must be a JSON object");
  CompletionRequest r;
  r.chat = chat;
  if (body.contains("model") && !body["model"].is_null()) {
    r.model = text(body["model"], "model");
    if (r.model != served_model)
      throw HttpError(404, "the model '" + r.model + "' does not exist; this server has '" + served_model + "'",
                      "invalid_request_error", "model");
  }
  if (chat) {
    r.messages = messages_of(body);
  } else {
    if (!body.contains("prompt")) throw bad("prompt", "prompt is missing");
    r.prompt = text(body["prompt"], "prompt");
  }
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) throw bad("stream", "stream must be true or false");
    r.stream = body["stream"].get<bool>();
  }
  if (body.contains("stream_options") && body["stream_options"].is_object() &&
      body["stream_options"].contains("include_usage") && body["stream_options"]["include_usage"].is_boolean())
    r.include_usage = body["stream_options"]["include_usage"].get<bool>();
  GenerationParams& p = r.params;
  const char* max_key = body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  p.max_tokens = int32_t(integer(body, max_key, -1, 1, kMaxTokensLimit));
  p.temperature = float(number(body, "temperature", 1.0, 0.0, 2.0));
  p.top_p = float(number(body, "top_p", 1.0, 0.0, 1.0));
  p.min_p = float(number(body, "min_p", 0.0, 0.0, 1.0));
  p.top_k = int32_t(integer(body, "top_k", 0, 0, 1 << 20));
  if (body.contains("seed") && !body["seed"].is_null()) {
    p.seed = uint64_t(integer(body, "seed", 0, INT64_MIN, INT64_MAX));
    p.has_seed = true;
  }
  p.stop = stops_of(body);
  if (body.contains("n") && !body["n"].is_null() && integer(body, "n", 1, 1, 1) != 1)
    throw bad("n", "only n = 1 is supported");
  return r;
}

}  // namespace sparrow::server
