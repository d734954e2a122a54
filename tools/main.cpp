// `sparrow`: one binary, one subcommand per job. Errors print one line and exit non-zero.
#include <algorithm>
#include <iostream>

#include "commands.h"
#include "common.h"
#include "sparrow/sparrow.h"

int main(int argc, char** argv) {
  CLI::App app{"Sparrow: Gemma 3 / Gemma 4 inference with compressed KV caches"};
  app.require_subcommand(1);
  app.set_version_flag("--version", sparrow_version());
  int exit_code = 0;
  sparrow::tools::add_run_command(app, exit_code);
  sparrow::tools::add_chat_command(app, exit_code);
  sparrow::tools::add_logits_command(app, exit_code);
  sparrow::tools::add_bench_command(app, exit_code);
  sparrow::tools::add_mkmodel_command(app, exit_code);
  sparrow::tools::add_verify_command(app, exit_code);
  sparrow::tools::add_perplexity_command(app, exit_code);
  sparrow::tools::add_lockstep_command(app, exit_code);
  sparrow::tools::add_calibrate_keys_command(app, exit_code);
#ifdef SPARROW_WITH_SERVER
  sparrow::tools::add_serve_command(app, exit_code);
#endif
  std::vector<std::string> args = sparrow::tools::normalize_arguments(argc, argv);
  std::reverse(args.begin(), args.end());  // CLI11 parses a vector from its back
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const sparrow::tools::DeviceUnavailable& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return exit_code;
}
