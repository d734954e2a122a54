#include "server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <ctime>
#include <sstream>

#include "chat_page.h"
#include "openai.h"

namespace sparrow::server {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// Replies never throw on text that is not UTF-8 (a reply cut inside a character): such bytes become U+FFFD.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void reply_error(httplib::Response& res, const HttpError& e) {
  res.status = e.status;
  res.set_content(dump(error_body(e)), "application/json");
}

std::vector<sparrow_token> tokenize(sparrow_model* model, const std::string& text, bool add_bos) {
  std::vector<sparrow_token> ids(text.size() + 8);
  int32_t n = sparrow_tokenize(model, text.data(), int32_t(text.size()), add_bos, 1, ids.data(), int32_t(ids.size()));
  if (n < 0 && n != INT32_MIN) {
    ids.resize(size_t(-n));
    n = sparrow_tokenize(model, text.data(), int32_t(text.size()), add_bos, 1, ids.data(), int32_t(ids.size()));
  }
  if (n == INT32_MIN) throw HttpError(400, std::string("cannot tokenize: ") + sparrow_last_error());
  ids.resize(size_t(n));
  return ids;
}

std::string chat_prompt(sparrow_model* model, const std::vector<ChatMessage>& messages) {
  std::vector<const char*> roles, contents;
  for (const ChatMessage& m : messages) {
    roles.push_back(m.role.c_str());
    contents.push_back(m.content.c_str());
  }
  std::string out(4096, '\0');
  int32_t n = sparrow_chat_format(model, roles.data(), contents.data(), int32_t(messages.size()), 1, out.data(),
                                  int32_t(out.size()));
  if (n < 0 && n != INT32_MIN) {
    out.resize(size_t(-n));
    n = sparrow_chat_format(model, roles.data(), contents.data(), int32_t(messages.size()), 1, out.data(),
                            int32_t(out.size()));
  }
  if (n == INT32_MIN) throw HttpError(400, std::string("cannot format the conversation: ") + sparrow_last_error());
  out.resize(size_t(n));
  return out;
}

// Every reply's identity.
struct ReplyHeader {
  std::string id;
  int64_t created;
  std::string model;
  bool chat;
};

ReplyHeader new_header(const std::string& model, bool chat) {
  static std::atomic<uint64_t> counter = 0;
  return {std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(++counter), int64_t(std::time(nullptr)), model,
          chat};
}

json usage(const StreamEvent& finish) {
  return {{"prompt_tokens", finish.prompt_tokens},
          {"completion_tokens", finish.completion_tokens},
          {"total_tokens", finish.prompt_tokens + finish.completion_tokens}};
}

// One streamed chunk: a text delta, or (finish set) the last one with the finish reason.
json chunk(const ReplyHeader& h, const std::string& text, const StreamEvent* finish, bool first) {
  json choice = {{"index", 0}, {"finish_reason", finish ? json(finish->finish_reason) : json()}};
  if (h.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  return {{"id", h.id},
          {"object", h.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", h.created},
          {"model", h.model},
          {"choices", json::array({choice})}};
}

json whole_reply(const ReplyHeader& h, const std::string& text, const StreamEvent& finish) {
  json choice = {{"index", 0}, {"finish_reason", finish.finish_reason}};
  if (h.chat) choice["message"] = {{"role", "assistant"}, {"content", text}};
  else choice["text"] = text;
  return {{"id", h.id},
          {"object", h.chat ? "chat.completion" : "text_completion"},
          {"created", h.created},
          {"model", h.model},
          {"choices", json::array({choice})},
          {"usage", usage(finish)}};
}

constexpr milliseconds kPoll{200};  // how often a waiting handler checks that its client is still there

}  // namespace

Server::Server(sparrow_model* model, const sparrow_context_params& params, const ServerOptions& options)
    : model_(model), options_(options), http_(std::make_unique<httplib::Server>()) {
  scheduler_ = std::make_unique<Scheduler>(model, params, options.scheduler);
  routes();
}

Server::~Server() { stop(); }

int Server::start() {
  // cpp-httplib listens with a backlog of 5, fixed when the library was compiled: a burst of clients arriving
  // while decoding keeps every core busy (32 streams opening at once) overflowed it, and some saw their
  // connections reset. Listening again on the bound socket raises the backlog (Linux updates it in place).
  int listening = -1;
  http_->set_socket_options([&listening](socket_t sock) {
    httplib::default_socket_options(sock);
    listening = sock;
  });
  const int port = options_.port == 0 ? http_->bind_to_any_port(options_.host)
                                      : (http_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  http_->set_socket_options(httplib::default_socket_options);  // the lambda above refers to this frame
  if (port < 0)
    throw std::runtime_error("cannot listen on " + options_.host + ":" + std::to_string(options_.port));
  if (listening >= 0) ::listen(listening, SOMAXCONN);
  thread_ = std::thread([this] { http_->listen_after_bind(); });
  return port;
}

void Server::stop() {
  if (stopped_.exchange(true)) return;
  scheduler_->stop();  // running requests finish, so their handlers return
  http_->stop();
  if (thread_.joinable()) thread_.join();
}

void Server::routes() {
  httplib::Server& s = *http_;
  // Enough workers for every slot and queued request to hold a connection.
  const size_t workers = size_t(options_.scheduler.parallel + options_.scheduler.queue_limit + 8);
  s.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
  s.set_payload_max_length(options_.max_body_bytes);
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // The chat page holds no secret (the API calls it makes carry the key), so it loads without one, like /health.
    if (options_.api_key.empty() || req.path == "/health" || req.path == "/")
      return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + options_.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    reply_error(res, HttpError(401, "a valid API key is needed (Authorization: Bearer KEY)", "authentication_error"));
    return httplib::Server::HandlerResponse::Handled;
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a route's own error reply
    const std::string what = res.status == 413 ? "the request body is too large"
                             : res.status == 404 ? "no route " + req.method + " " + req.path
                                                 : "the request was refused";
    reply_error(res, HttpError(res.status, what));
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const HttpError& e) {
      reply_error(res, e);
    } catch (const std::exception& e) {
      reply_error(res, HttpError(500, e.what(), "server_error"));
    }
  });

  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kChatPage.data(), kChatPage.size(), "text/html; charset=utf-8");
  });
  s.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const json list = {{"object", "list"},
                       {"data", json::array({{{"id", options_.model_name},
                                              {"object", "model"},
                                              {"created", int64_t(std::time(nullptr))},
                                              {"owned_by", "sparrow"}}})}};
    res.set_content(dump(list), "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics(), "text/plain; version=0.0.4");
  });
  s.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    json body;
    try {
      body = json::parse(req.body);
    } catch (const json::parse_error& e) {
      throw HttpError(400, std::string("the body is not valid JSON: ") + e.what());
    }
    if (!body.is_object() || !body.contains("content") || !body["content"].is_string())
      throw HttpError(400, "content must be a string", "invalid_request_error", "content");
    const bool add_bos = body.value("add_special", false);
    res.set_content(dump({{"tokens", tokenize(model_, body["content"].get<std::string>(), add_bos)}}),
                    "application/json");
  });
  s.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    json body;
    try {
      body = json::parse(req.body);
    } catch (const json::parse_error& e) {
      throw HttpError(400, std::string("the body is not valid JSON: ") + e.what());
    }
    if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array())
      throw HttpError(400, "tokens must be an array of token ids", "invalid_request_error", "tokens");
    std::string text;
    const int32_t n_vocab = sparrow_model_n_vocab(model_);
    for (const json& t : body["tokens"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab)
        throw HttpError(400, "tokens must be ids in [0, " + std::to_string(n_vocab) + ")", "invalid_request_error",
                        "tokens");
      char piece[256];
      const int32_t n = sparrow_token_to_piece(model_, sparrow_token(t.get<int64_t>()), 0, piece, sizeof piece);
      if (n > 0) text.append(piece, size_t(n));
    }
    res.set_content(dump({{"content", text}}), "application/json");
  });

  auto completion = [this](bool chat) {
    return [this, chat](const httplib::Request& req, httplib::Response& res) {
      const CompletionRequest r = parse_completion_request(req.body, chat, options_.model_name);
      std::vector<sparrow_token> prompt =
          chat ? tokenize(model_, chat_prompt(model_, r.messages), false) : tokenize(model_, r.prompt, true);
      std::shared_ptr<Stream> stream = scheduler_->submit(std::move(prompt), r.params);
      const ReplyHeader header = new_header(r.model.empty() ? options_.model_name : r.model, chat);
      if (!r.stream) {
        std::string text;
        for (;;) {
          const std::optional<StreamEvent> e = stream->next(kPoll);
          if (!e) continue;
          if (e->kind == StreamEvent::Kind::Text) text += e->text;
          else if (e->kind == StreamEvent::Kind::Error) throw HttpError(500, e->text, "server_error");
          else return res.set_content(dump(whole_reply(header, text, *e)), "application/json");
        }
      }
      const bool include_usage = r.include_usage;
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream", [stream, header, include_usage, first = true](size_t, httplib::DataSink& sink) mutable {
            auto send = [&](const json& j) {
              const std::string line = "data: " + dump(j) + "\n\n";
              return sink.write(line.data(), line.size());
            };
            for (;;) {
              if (!sink.is_writable()) {
                stream->cancel();  // the client went away
                return false;
              }
              const std::optional<StreamEvent> e = stream->next(kPoll);
              if (!e) continue;
              if (e->kind == StreamEvent::Kind::Text) {
                if (!send(chunk(header, e->text, nullptr, first))) return stream->cancel(), false;
                first = false;
                continue;
              }
              if (e->kind == StreamEvent::Kind::Error) {
                send(error_body(HttpError(500, e->text, "server_error")));
              } else {
                json last = chunk(header, "", &*e, first);
                if (include_usage) last["usage"] = usage(*e);
                send(last);
              }
              const std::string done = "data: [DONE]\n\n";
              sink.write(done.data(), done.size());
              sink.done();
              return true;
            }
          });
    };
  };
  s.Post("/v1/chat/completions", completion(true));
  s.Post("/v1/completions", completion(false));
}

std::string Server::metrics() const {
  const SchedulerStats st = scheduler_->stats();
  std::ostringstream out;
  auto metric = [&](const char* name, const char* type, const char* help, double value) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n" << name << " " << value
        << "\n";
  };
  metric("sparrow_requests_total", "counter", "Requests admitted to a decoding slot.", double(st.requests));
  metric("sparrow_prompt_tokens_total", "counter", "Prompt tokens decoded.", double(st.prompt_tokens));
  metric("sparrow_completion_tokens_total", "counter", "Tokens generated.", double(st.completion_tokens));
  metric("sparrow_decode_steps_total", "counter", "Forward passes over the running batch.", double(st.decode_steps));
  metric("sparrow_tokens_per_second", "gauge", "Generated tokens per second of forward passes.",
         st.busy_seconds > 0 ? double(st.completion_tokens) / st.busy_seconds : 0.0);
  metric("sparrow_time_to_first_token_seconds", "gauge", "Mean time from a request's arrival to its first token.",
         st.first_tokens ? st.first_token_seconds_sum / double(st.first_tokens) : 0.0);
  metric("sparrow_kv_cache_bytes", "gauge", "KV cache held by running requests.", double(st.kv_bytes));
  metric("sparrow_requests_running", "gauge", "Requests decoding now.", double(st.active));
  metric("sparrow_requests_queued", "gauge", "Requests waiting for a slot.", double(st.queued));
  return out.str();
}

}  // namespace sparrow::server
