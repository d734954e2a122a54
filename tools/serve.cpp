// `sparrow serve`: the OpenAI-compatible server (server/server.h) on a model, until SIGINT or SIGTERM.
#include <csignal>
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "common.h"
#include "server.h"

namespace sparrow::tools {
namespace {

struct ServeOptions {
  ModelOptions model;
  server::ServerOptions server;
};

int serve(ServeOptions& o) {
  check_model_options(o.model);
  if (o.server.port < 0 || o.server.port > 65535) throw Error("--port " + std::to_string(o.server.port) + ": 0 to 65535");
  if (o.server.scheduler.parallel < 1 || o.server.scheduler.parallel > 256)
    throw Error("--parallel " + std::to_string(o.server.scheduler.parallel) + ": 1 to 256");
  if (o.server.scheduler.queue_limit < 0) throw Error("--queue must not be negative");
  // Signals are taken by this thread alone (sigwait), so every thread started below inherits them blocked.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  LoadedModel m(o.model.model_path, o.model.load);
  if (o.server.model_name.empty()) o.server.model_name = std::filesystem::path(m.path).stem().string();
  server::Server http(m.model, context_params(o.model), o.server);
  const int port = http.start();
  std::cerr << "serving " << o.server.model_name << " on http://" << o.server.host << ":" << port << " ("
            << o.server.scheduler.parallel << " parallel sequences" << (o.server.api_key.empty() ? "" : ", API key")
            << "); Ctrl-C stops\n";
  int signal = 0;
  sigwait(&stop_signals, &signal);
  std::cerr << "stopping: finishing the requests in flight\n";
  http.stop();
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("serve", "an OpenAI-compatible HTTP server (chat, completions, models, metrics)");
  auto o = std::make_shared<ServeOptions>();
  add_model_options(*cmd, o->model);
  cmd->add_option("--host", o->server.host, "address to listen on (default 127.0.0.1: this machine only)");
  cmd->add_option("--port", o->server.port, "port (default 8080; 0: any free port)");
  cmd->add_option("--parallel", o->server.scheduler.parallel, "sequences decoded together (default 4)");
  cmd->add_option("--queue", o->server.scheduler.queue_limit, "requests that may wait for a slot (default 64)");
  cmd->add_option("--api-key", o->server.api_key, "require Authorization: Bearer KEY on every route but / (the chat page) and /health");
  cmd->add_option("--alias", o->server.model_name, "the model's id in /v1/models (default: the file's name)");
  cmd->callback([o, &exit_code] { exit_code = serve(*o); });
}

}  // namespace sparrow::tools
