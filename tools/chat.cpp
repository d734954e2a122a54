// `sparrow chat`: an interactive conversation using the model's chat template. The KV cache keeps the whole
// conversation, so each turn only processes the new text.
#include <iostream>

#include "commands.h"
#include "common.h"

namespace sparrow::tools {
namespace {

std::string format(sparrow_model* model, const std::vector<std::pair<std::string, std::string>>& turns,
                   bool add_generation_prompt) {
  std::vector<const char*> roles, contents;
  for (const auto& [role, content] : turns) {
    roles.push_back(role.c_str());
    contents.push_back(content.c_str());
  }
  std::string out(4096, '\0');
  int32_t n = sparrow_chat_format(model, roles.data(), contents.data(), int32_t(turns.size()),
                                  add_generation_prompt, out.data(), int32_t(out.size()));
  if (n < 0) {
    out.resize(-n);
    n = sparrow_chat_format(model, roles.data(), contents.data(), int32_t(turns.size()), add_generation_prompt,
                            out.data(), -n);
  }
  out.resize(n);
  return out;
}

}  // namespace

void add_chat_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("chat", "interactive chat with the model's chat template");
  auto model = std::make_shared<ModelOptions>();
  auto sampling = std::make_shared<SamplingOptions>();
  auto system = std::make_shared<std::string>();
  auto n_predict = std::make_shared<int32_t>(-1);
  add_model_options(*cmd, *model);
  add_sampling_options(*cmd, *sampling);
  cmd->add_option("-s,--system", *system, "system prompt");
  cmd->add_option("-n,--n-predict", *n_predict, "most tokens per reply (-1: until end of turn)");
  cmd->callback([=, &exit_code] {
    check_model_options(*model);
    check_n_predict(*n_predict);
    LoadedModel m(model->model_path, model->load);
    Context ctx(m.model, *model);
    std::vector<std::pair<std::string, std::string>> turns;
    if (!system->empty()) turns.push_back({"system", *system});
    std::string already_decoded;  // formatted text whose tokens are in the KV cache
    GenerationStats stats;
    std::cerr << "(type a message; an empty line or end of input quits)\n";
    std::string line;
    while (std::cout << "> " << std::flush, std::getline(std::cin, line) && !line.empty()) {
      turns.push_back({"user", line});
      const std::string prompt = format(m.model, turns, true);
      // Only the text after what the cache already holds is new; the template's turns only ever append.
      const std::string fresh = prompt.substr(already_decoded.size());
      std::vector<sparrow_token> tokens = tokenize(m.model, fresh, false, true);
      std::string reply = generate(ctx.ctx, tokens, *n_predict, *sampling, stats);
      std::cout << "\n";
      turns.push_back({"assistant", reply});
      // The reply's end-of-turn marker was sampled but not decoded; formatting the history again yields it.
      already_decoded = prompt + reply;
    }
    print_stats(stats);
    exit_code = 0;
  });
}

}  // namespace sparrow::tools
