// `sparrow serve` (server/): the routes, OpenAI's reply shapes, streaming, continuous batching, and every kind of
// bad request answered with a 4xx in OpenAI's error shape. Each test runs a server on a free localhost port over
// a tiny random-weight model and talks to it with cpp-httplib's client.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_test_util.h"
#include "server.h"

namespace sparrow::server {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

sparrow_model* tiny_model() {
  static sparrow_model* model = [] {
    const fs::path& p = testing::mkmodel_once("--arch gemma4 --preset tiny-ple --type q8_0 --seed 2");
    sparrow_model* m = sparrow_model_load(p.string().c_str(), nullptr, nullptr);
    EXPECT_NE(m, nullptr) << sparrow_last_error();
    return m;
  }();
  return model;
}

// A server on a free port for the test's lifetime, and a client for it.
struct Running {
  explicit Running(ServerOptions options = {}, int32_t n_ctx = 128) {
    if (options.model_name.empty()) options.model_name = "tiny";
    options.port = 0;
    sparrow_context_params params = sparrow_context_default_params();
    params.n_ctx = n_ctx;
    server = std::make_unique<Server>(tiny_model(), params, options);
    port = server->start();
    client = std::make_unique<httplib::Client>("127.0.0.1", port);
    client->set_read_timeout(60, 0);
  }
  httplib::Result post(const std::string& path, const std::string& body) {
    return client->Post(path.c_str(), body, "application/json");
  }
  std::unique_ptr<Server> server;
  int port = 0;
  std::unique_ptr<httplib::Client> client;
};

json chat_body(const std::string& user, int max_tokens, bool stream = false) {
  return {{"messages", {{{"role", "user"}, {"content", user}}}},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"stream", stream}};
}

// The text of a streamed reply (and its last chunk), from its server-sent events.
struct Streamed {
  std::string text;
  json last;
  bool done = false;
};
Streamed read_stream(const std::string& body) {
  Streamed s;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    const std::string data = body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") {
      s.done = true;
      break;
    }
    const json chunk = json::parse(data);
    const json& choice = chunk["choices"][0];
    if (choice.contains("delta") && choice["delta"].contains("content")) s.text += choice["delta"]["content"];
    if (choice.contains("text")) s.text += choice["text"].get<std::string>();
    s.last = chunk;
  }
  return s;
}

TEST(Serve, HealthModelsTokenizeAndDetokenize) {
  Running r;
  auto health = r.client->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto models = r.client->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny");
  auto tokens = r.post("/tokenize", R"({"content":"Hello world"})");
  ASSERT_TRUE(tokens);
  ASSERT_EQ(tokens->status, 200) << tokens->body;
  const json ids = json::parse(tokens->body)["tokens"];
  EXPECT_FALSE(ids.empty());
  auto text = r.post("/detokenize", json{{"tokens", ids}}.dump());
  ASSERT_TRUE(text);
  EXPECT_EQ(json::parse(text->body)["content"], "Hello world");
}

TEST(Serve, StreamedAndWholeRepliesAgreeAndCountTokens) {
  Running r;
  auto whole = r.post("/v1/chat/completions", chat_body("Tell me a story", 12).dump());
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json reply = json::parse(whole->body);
  EXPECT_EQ(reply["object"], "chat.completion");
  EXPECT_EQ(reply["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(reply["usage"]["completion_tokens"].get<int>() + reply["usage"]["prompt_tokens"].get<int>(),
            reply["usage"]["total_tokens"].get<int>());
  const std::string text = reply["choices"][0]["message"]["content"];

  auto stream = r.post("/v1/chat/completions", chat_body("Tell me a story", 12, true).dump());
  ASSERT_TRUE(stream);
  ASSERT_EQ(stream->status, 200);
  const Streamed s = read_stream(stream->body);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.text, text);  // greedy: the same tokens either way
  EXPECT_EQ(s.last["choices"][0]["finish_reason"], reply["choices"][0]["finish_reason"]);
  EXPECT_EQ(s.last["usage"], reply["usage"]);

  auto completion = r.post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":5,"temperature":0})");
  ASSERT_TRUE(completion);
  ASSERT_EQ(completion->status, 200) << completion->body;
  const json c = json::parse(completion->body);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(c["usage"]["completion_tokens"], 5);
}

TEST(Serve, AStopStringEndsTheReplyBeforeIt) {
  Running r;
  auto full = r.post("/v1/completions", R"({"prompt":"The sea","max_tokens":16,"temperature":0})");
  ASSERT_TRUE(full);
  const std::string text = json::parse(full->body)["choices"][0]["text"];
  ASSERT_GT(text.size(), 6u);
  const std::string stop = text.substr(text.size() / 2, 3);
  const size_t cut = text.find(stop);
  auto stopped = r.post("/v1/completions", json{{"prompt", "The sea"}, {"max_tokens", 16}, {"temperature", 0},
                                                {"stop", json::array({stop})}}.dump());
  ASSERT_TRUE(stopped);
  const json c = json::parse(stopped->body);
  EXPECT_EQ(c["choices"][0]["text"], text.substr(0, cut));
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
}

TEST(Serve, BadRequestsAreFourHundredsInOpenAIsShape) {
  ServerOptions options;
  options.max_body_bytes = 1 << 16;
  Running r(options, 64);
  const std::string too_long_prompt = json{{"prompt", std::string(2000, 'a') + " b c d e f g h"}}.dump();
  struct Case {
    const char* what;
    std::string path, body;
    int status;
  };
  const Case cases[] = {
      {"malformed JSON", "/v1/chat/completions", "{\"messages\": [", 400},
      {"not an object", "/v1/chat/completions", "[1, 2]", 400},
      {"missing messages", "/v1/chat/completions", R"({"max_tokens":4})", 400},
      {"empty messages", "/v1/chat/completions", R"({"messages":[]})", 400},
      {"unknown role", "/v1/chat/completions", R"({"messages":[{"role":"robot","content":"x"}]})", 400},
      {"content not a string", "/v1/chat/completions", R"({"messages":[{"role":"user","content":7}]})", 400},
      {"max_tokens a string", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":"4"})",
       400},
      {"negative max_tokens", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-1})",
       400},
      {"huge max_tokens", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"max_tokens":99999999999})", 400},
      {"temperature out of range", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"temperature":7})", 400},
      {"five stop strings", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]})", 400},
      {"n of 2", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"n":2})", 400},
      {"unknown model", "/v1/chat/completions", R"({"model":"gpt-5","messages":[{"role":"user","content":"x"}]})",
       404},
      {"invalid UTF-8", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", 400},
      {"prompt past the context", "/v1/completions", too_long_prompt, 400},
      {"missing prompt", "/v1/completions", R"({"max_tokens":2})", 400},
      {"body too large", "/v1/chat/completions", std::string(1 << 17, ' '), 413},
      {"tokens not ids", "/detokenize", R"({"tokens":[-5]})", 400},
      {"unknown route", "/v1/embeddings", "{}", 404},
  };
  for (const Case& c : cases) {
    auto res = r.post(c.path, c.body);
    ASSERT_TRUE(res) << c.what;
    EXPECT_EQ(res->status, c.status) << c.what << ": " << res->body;
    const json error = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(error.is_object() && error.contains("error")) << c.what << ": " << res->body;
    EXPECT_FALSE(error["error"]["message"].get<std::string>().empty()) << c.what;
    EXPECT_TRUE(error["error"].contains("type")) << c.what;
  }
  // The server still answers after all of that.
  auto ok = r.post("/v1/chat/completions", chat_body("x", 2).dump());
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST(Serve, AnApiKeyGuardsEveryRouteButHealth) {
  ServerOptions options;
  options.api_key = "secret";
  Running r(options);
  EXPECT_EQ(r.client->Get("/health")->status, 200);
  EXPECT_EQ(r.client->Get("/v1/models")->status, 401);
  EXPECT_EQ(r.post("/v1/chat/completions", chat_body("x", 2).dump())->status, 401);
  r.client->set_bearer_token_auth("wrong");
  EXPECT_EQ(r.client->Get("/v1/models")->status, 401);
  r.client->set_bearer_token_auth("secret");
  EXPECT_EQ(r.client->Get("/v1/models")->status, 200);
  EXPECT_EQ(r.post("/v1/chat/completions", chat_body("x", 2).dump())->status, 200);
}

TEST(Serve, ConcurrentStreamsAllFinishThroughSlotsAndTheQueue) {
  ServerOptions options;
  options.scheduler.parallel = 4;
  options.scheduler.queue_limit = 16;
  Running r(options);
  std::vector<std::future<Streamed>> replies;
  for (int i = 0; i < 12; ++i) {
    replies.push_back(std::async(std::launch::async, [&r, i] {
      httplib::Client c("127.0.0.1", r.port);
      c.set_read_timeout(120, 0);
      auto res = c.Post("/v1/chat/completions", chat_body("Request " + std::to_string(i), 6 + i % 3, true).dump(),
                        "application/json");
      return res && res->status == 200 ? read_stream(res->body) : Streamed{};
    }));
  }
  for (auto& f : replies) {
    const Streamed s = f.get();
    EXPECT_TRUE(s.done);
    EXPECT_EQ(s.last["choices"][0]["finish_reason"], "length");
  }
  const std::string metrics = r.client->Get("/metrics")->body;
  EXPECT_NE(metrics.find("sparrow_requests_total 12"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("sparrow_requests_running 0"), std::string::npos) << metrics;
}

TEST(Serve, AStreamWhoseClientLeavesIsDropped) {
  Running r(ServerOptions{}, 4096);
  int chunks = 0;
  {
    httplib::Client c("127.0.0.1", r.port);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = R"({"prompt":"a","max_tokens":4000,"temperature":0,"stream":true})";
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };  // then hang up
    c.send(req);
  }  // the connection closes with the client
  ASSERT_GE(chunks, 3);
  // 4000 tokens would take far longer than this: the request must leave its slot soon after the client did.
  bool dropped = false;
  for (int i = 0; i < 300 && !dropped; ++i) {
    dropped = r.client->Get("/metrics")->body.find("sparrow_requests_running 0") != std::string::npos;
    if (!dropped) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(dropped);
  const std::string metrics = r.client->Get("/metrics")->body;
  EXPECT_EQ(metrics.find("sparrow_completion_tokens_total 4000"), std::string::npos);
}

TEST(Serve, AFullQueueIsA503) {
  ServerOptions options;
  options.scheduler.parallel = 1;
  options.scheduler.queue_limit = 0;
  Running r(options, 4096);
  // Long enough to still run on a loaded machine when the second request comes; the stop below ends it.
  auto long_request = std::async(std::launch::async, [&r] {
    httplib::Client c("127.0.0.1", r.port);
    c.set_read_timeout(120, 0);
    return c.Post("/v1/completions", R"({"prompt":"a","max_tokens":4000,"temperature":0})", "application/json");
  });
  // Wait until it runs, then ask again: the one slot is taken and nothing may wait.
  for (int i = 0; i < 200; ++i) {
    if (r.client->Get("/metrics")->body.find("sparrow_requests_running 1") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto refused = r.post("/v1/completions", R"({"prompt":"b","max_tokens":2})");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503) << refused->body;
  r.server->stop();  // a graceful stop finishes the running request with what it has
  auto finished = long_request.get();
  ASSERT_TRUE(finished);
  EXPECT_EQ(finished->status, 200) << finished->body;
  EXPECT_EQ(json::parse(finished->body)["object"], "text_completion");
}

}  // namespace
}  // namespace sparrow::server
