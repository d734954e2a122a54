// `sparrow logits`: raw little-endian float32 logits for every position, row-major [n_positions][n_vocab],
// for parity checks against llama.cpp. Prints the token ids it used.
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>
#include <vector>

#include "commands.h"
#include "common.h"
#include "util/error.h"

namespace sparrow::tools {
namespace {

std::vector<sparrow_token> parse_token_list(const std::string& list) {
  std::vector<sparrow_token> ids;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long v = 0;
    try {
      v = std::stol(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size()) throw Error("--tokens: '" + item + "' is not a token id");
    ids.push_back(sparrow_token(v));
  }
  if (ids.empty()) throw Error("--tokens: no token ids");
  return ids;
}

// (top1 - top2) / |top1| of the logits: how far the greedy choice was from its runner-up.
float top_two_margin(const float* logits, int32_t n_vocab) {
  float first = -INFINITY, second = -INFINITY;
  for (int32_t i = 0; i < n_vocab; ++i) {
    if (logits[i] > first) {
      second = first;
      first = logits[i];
    } else if (logits[i] > second) {
      second = logits[i];
    }
  }
  return first == 0.0f ? INFINITY : (first - second) / std::fabs(first);
}

}  // namespace

void add_logits_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("logits", "write float32 logits of every prompt position to a file");
  auto model = std::make_shared<ModelOptions>();
  auto prompt = std::make_shared<std::string>();
  auto token_list = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  add_model_options(*cmd, *model);
  auto* p = cmd->add_option("-p,--prompt", *prompt, "prompt text (tokenized with BOS)");
  auto* t = cmd->add_option("--tokens", *token_list, "comma-separated token ids");
  p->excludes(t);
  t->excludes(p);
  auto n_greedy = std::make_shared<int32_t>(0);
  cmd->add_option("-o,--output", *output, "output file")->required();
  cmd->add_option("-n,--n-greedy", *n_greedy,
                  "then decode N greedy tokens (argmax, lowest id on ties, no stop) and print their ids");
  cmd->callback([=, &exit_code] {
    if (prompt->empty() && token_list->empty()) throw Error("logits: give -p PROMPT or --tokens IDS");
    check_model_options(*model);
    if (*n_greedy < 0) throw Error("-n " + std::to_string(*n_greedy) + ": must not be negative");
    LoadedModel m(model->model_path, model->load);
    std::vector<sparrow_token> tokens =
        token_list->empty() ? tokenize(m.model, *prompt, true, true) : parse_token_list(*token_list);
    ModelOptions o = *model;
    if (o.n_ctx == 0) o.n_ctx = int32_t(tokens.size()) + *n_greedy + 1;
    Context ctx(m.model, o);
    check_fits_context(ctx.ctx, tokens.size());
    if (sparrow_decode(ctx.ctx, tokens.data(), int32_t(tokens.size()), 1) != 0) throw Error(sparrow_last_error());
    std::ofstream out(*output, std::ios::binary);
    if (!out) throw Error(*output + ": cannot open for writing");
    const int32_t n_vocab = sparrow_model_n_vocab(m.model);
    for (int32_t i = 0; i < int32_t(tokens.size()); ++i)
      out.write(reinterpret_cast<const char*>(sparrow_get_logits(ctx.ctx, i)), sizeof(float) * n_vocab);
    if (!out) throw Error(*output + ": write failed");
    std::cout << "tokens:";
    for (sparrow_token id : tokens) std::cout << " " << id;
    std::cout << "\nwrote " << tokens.size() << " x " << n_vocab << " float32 logits to " << *output << "\n";
    if (*n_greedy > 0) {
      std::vector<float> margins;
      std::cout << "greedy:";
      for (int32_t step = 0; step < *n_greedy; ++step) {
        const float* logits = sparrow_get_logits(ctx.ctx, -1);
        sparrow_token next = sparrow_sample_greedy(logits, n_vocab);
        margins.push_back(top_two_margin(logits, n_vocab));
        std::cout << " " << next << std::flush;
        if (step + 1 < *n_greedy && sparrow_decode(ctx.ctx, &next, 1, 0) != 0) throw Error(sparrow_last_error());
      }
      // How close each choice was: a backend whose greedy tokens part from another's should do so only where
      // this margin is small.
      std::cout << "\nmargins:";
      for (float m : margins) std::cout << " " << m;
      std::cout << "\n";
    }
    exit_code = 0;
  });
}

}  // namespace sparrow::tools
