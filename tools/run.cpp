// `sparrow run`: complete a prompt, streaming tokens, then report prompt and generation speed.
#include "commands.h"
#include "common.h"

namespace sparrow::tools {

void add_run_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("run", "generate text from a prompt");
  auto model = std::make_shared<ModelOptions>();
  auto sampling = std::make_shared<SamplingOptions>();
  auto prompt = std::make_shared<std::string>();
  auto n_predict = std::make_shared<int32_t>(128);
  add_model_options(*cmd, *model);
  add_sampling_options(*cmd, *sampling);
  cmd->add_option("-p,--prompt", *prompt, "prompt text")->required();
  cmd->add_option("-n,--n-predict", *n_predict, "tokens to generate (-1: until end of generation)");
  cmd->callback([=, &exit_code] {
    check_model_options(*model);
    check_n_predict(*n_predict);
    LoadedModel m(model->model_path, model->load);
    Context ctx(m.model, *model);
    std::vector<sparrow_token> tokens = tokenize(m.model, *prompt, true, true);
    check_fits_context(ctx.ctx, tokens.size());  // before the prompt is echoed
    GenerationStats stats;
    std::cout << *prompt << std::flush;
    generate(ctx.ctx, tokens, *n_predict, *sampling, stats);
    std::cout << "\n";
    print_stats(stats);
    exit_code = 0;
  });
}

}  // namespace sparrow::tools
