#pragma once
// `sparrow serve`: an OpenAI-compatible HTTP server over the C API. Routes: /v1/chat/completions and
// /v1/completions (streamed as server-sent events or not), /v1/models, /health, /metrics (Prometheus text),
// /tokenize, /detokenize. Requests decode together by continuous batching (scheduler.h). docs/serve.md.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "scheduler.h"
#include "sparrow/sparrow.h"

namespace httplib {
class Server;
}

namespace sparrow::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;           // 0: any free port (tests)
  std::string api_key;       // "": no key; else every route but / and /health needs "Authorization: Bearer KEY"
  std::string model_name;    // the id /v1/models lists and requests may name
  size_t max_body_bytes = 4 << 20;
  SchedulerOptions scheduler;
};

class Server {
 public:
  // model stays owned by the caller and must outlive the server.
  Server(sparrow_model* model, const sparrow_context_params& params, const ServerOptions& options);
  ~Server();
  // Binds and serves on a thread of its own; returns the port bound. Throws when it cannot bind.
  int start();
  // Stops listening, ends the requests in flight (their streams finish), and joins.
  void stop();

 private:
  void routes();
  std::string metrics() const;

  sparrow_model* model_;
  ServerOptions options_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  std::atomic<bool> stopped_ = false;
};

}  // namespace sparrow::server
