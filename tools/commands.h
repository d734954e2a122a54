#pragma once
// Each `sparrow` subcommand lives in its own file and adds itself to the app here. A command's callback
// stores its exit status in `exit_code`; errors are printed as one line on stderr.
#include <CLI/CLI.hpp>

namespace sparrow::tools {

void add_run_command(CLI::App& app, int& exit_code);
void add_chat_command(CLI::App& app, int& exit_code);
void add_logits_command(CLI::App& app, int& exit_code);
void add_mkmodel_command(CLI::App& app, int& exit_code);
void add_bench_command(CLI::App& app, int& exit_code);
void add_verify_command(CLI::App& app, int& exit_code);
void add_perplexity_command(CLI::App& app, int& exit_code);
void add_lockstep_command(CLI::App& app, int& exit_code);
void add_serve_command(CLI::App& app, int& exit_code);
void add_calibrate_keys_command(CLI::App& app, int& exit_code);

}  // namespace sparrow::tools
