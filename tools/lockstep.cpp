// `sparrow lockstep`: runs a model on a device and on the CPU op by op in lockstep (verify/lockstep.h), each op on
// the same inputs, and reports where the device's outputs part from the CPU's. An internal diagnostic, like
// `sparrow verify`: it includes Sparrow's internal headers rather than going through the C API.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "common.h"
#include "formats/kv/kv_codec.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "util/error.h"
#include "verify/lockstep.h"

namespace sparrow::tools {
namespace {

struct LockstepOptions {
  std::string model_path;
  std::string device = "cuda";
  std::string prompt = "The capital of France is";
  int32_t n_greedy = 4;
  std::string cache_type = "f32";
  int32_t worst = 20;
  double tolerance = 1e-4;
};

formats::KvCodec codec_named(const std::string& name) {
  if (auto codec = formats::parse_kv_codec(name)) return *codec;
  throw Error("--cache-type: unknown KV codec '" + name + "'");
}

int run_lockstep(const LockstepOptions& o) {
  const std::optional<Device> device = parse_device(o.device);
  if (!device) throw Error("--device: unknown device '" + o.device + "'");
  verify::Lockstep lockstep(make_weight_store(*device), make_weight_store(Device::Cpu), make_backend(*device, 0),
                            make_backend(Device::Cpu, 0));
  ModelLoadOptions load;
  load.device = *device;
  load.n_gpu_layers = 99;
  load.make_store = [&] { return lockstep.make_weight_store(); };
  const std::string path = resolve_model_path(o.model_path);
  const std::unique_ptr<Model> model = Model::load(path, load);
  std::vector<int32_t> tokens = model->tokenizer->encode(o.prompt, true, true);

  SessionOptions session_options;
  session_options.n_ctx = int32_t(tokens.size()) + o.n_greedy + 1;
  session_options.k_codec = session_options.v_codec = codec_named(o.cache_type);
  session_options.make_backend = [&] { return lockstep.make_backend(); };
  Session session(*model, session_options);
  session.decode(tokens.data(), int32_t(tokens.size()), true);
  const int32_t n_vocab = model->config.n_vocab;
  for (int32_t step = 0; step < o.n_greedy; ++step) {
    const float* logits = session.logits(-1);
    int32_t next = 0;
    for (int32_t i = 1; i < n_vocab; ++i) next = logits[i] > logits[next] ? i : next;
    session.decode(&next, 1, false);
  }
  std::cout << path << ": " << tokens.size() << " prompt tokens then " << o.n_greedy << " greedy steps, " << o.device
            << " against cpu, KV " << o.cache_type << "\n";
  lockstep.report(std::cout, o.worst);
  // On identical inputs every op should differ only in summation order (~1e-6); a wrong kernel gives O(1).
  int64_t over = 0;
  for (const verify::LockstepRecord& r : lockstep.records()) over += r.mismatched_nan || r.relative() > o.tolerance;
  std::cout << "lockstep: " << (over == 0 ? "PASS" : "FAIL") << " (" << over << " op calls over the tolerance "
            << o.tolerance << ")\n";
  return over == 0 ? 0 : 1;
}

}  // namespace

void add_lockstep_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "lockstep", "run a model on a device and on the CPU op by op, on the same inputs, and report where they part");
  auto o = std::make_shared<LockstepOptions>();
  cmd->add_option("-m,--model", o->model_path, "GGUF model (default: the default model)");
  cmd->add_option("--device", o->device, "device under test")->check(CLI::IsMember(device_names()));
  cmd->add_option("-p,--prompt", o->prompt, "prompt (tokenized with BOS)");
  cmd->add_option("-n", o->n_greedy, "greedy decode steps after the prompt")->check(CLI::NonNegativeNumber);
  cmd->add_option("--cache-type", o->cache_type, "KV codec for K and V (default f32)");
  cmd->add_option("--worst", o->worst, "how many of the worst single op calls to list")->check(CLI::NonNegativeNumber);
  cmd->add_option("--tolerance", o->tolerance, "largest relative difference of one op call that passes")
      ->check(CLI::PositiveNumber);
  cmd->callback([o, &exit_code] { exit_code = run_lockstep(*o); });
}

}  // namespace sparrow::tools
