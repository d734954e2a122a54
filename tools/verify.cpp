// `sparrow verify`: every KV codec x op x head dim of a backend against the reference outputs in the committed
// fixtures (tests/fixtures/kv), then attention over every K codec x V codec pair (verify/attention_cells.h),
// printed as matrices; non-zero exit unless every cell passed. A codec the
// backend lacks, a codec without a fixture and a backend this build or machine cannot run are failures, never
// silent passes. `--write-fixtures DIR` regenerates the fixtures from the references (fixed seeds, identical
// bytes on regeneration). Details: docs/verify.md.
#include "verify/verify.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "formats/kv/kv_codec.h"
#include "util/error.h"
#include "verify/attention_cells.h"
#include "verify/target.h"
#include "verify/fixture.h"

namespace sparrow::tools {
namespace {

namespace fs = std::filesystem;

struct VerifyOptions {
  std::string backend = "cpu";
  std::string json_path;
  std::string fixtures_dir;
  std::string write_dir;
  std::vector<std::string> codecs;  // empty: all registered
};

// Where the committed fixtures are when --fixtures is not given: $SPARROW_KV_FIXTURES, then tests/fixtures/kv
// under the working directory, then beside the binary's build directory (build/sparrow -> ../tests/...).
fs::path default_fixtures_dir() {
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("SPARROW_KV_FIXTURES")) candidates.emplace_back(env);
  candidates.push_back(fs::current_path() / "tests/fixtures/kv");
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back(exe.parent_path().parent_path() / "tests/fixtures/kv");
    candidates.push_back(exe.parent_path().parent_path().parent_path() / "tests/fixtures/kv");
  }
  std::string tried;
  for (const fs::path& p : candidates) {
    if (fs::exists(p / verify::inputs_file_name())) return p;
    tried += (tried.empty() ? "" : ", ") + p.string();
  }
  throw Error("verify: no kv fixtures found (looked in " + tried + "); pass --fixtures DIR");
}

std::vector<formats::KvCodecInfo> selected_codecs(const std::vector<std::string>& names) {
  std::vector<formats::KvCodecInfo> out;
  if (names.empty()) return {formats::kv_codecs().begin(), formats::kv_codecs().end()};
  for (const std::string& name : names) {
    const auto codec = formats::parse_kv_codec(name);
    if (!codec) throw Error("verify: unknown kv codec '" + name + "'");
    out.push_back(formats::kv_codec_info(*codec));
  }
  return out;
}

// Keys in the documented order (docs/verify.md), not sorted.
using Json = nlohmann::ordered_json;

Json number_or_null(double x) { return std::isfinite(x) ? Json(x) : Json(nullptr); }

Json report_json(const verify::Report& report) {
  Json cells = Json::array(), codecs = Json::array();
  for (const verify::Cell& c : report.cells) {
    cells.push_back({{"codec", c.codec},
                     {"op", std::string(verify::op_name(c.op))},
                     {"head_dim", c.head_dim},
                     {"passed", c.passed},
                     {"total", c.total},
                     {"max_err", number_or_null(c.max_err)}});
  }
  for (const verify::CodecSummary& s : report.codecs) {
    Json mse = Json::object();
    for (const auto& [d, value] : s.mse_unit_gaussian) mse[std::to_string(d)] = number_or_null(value);
    codecs.push_back({{"name", s.name}, {"bits_per_element", s.bits_per_element}, {"mse_unit_gaussian", mse}});
  }
  Json attention = Json::array();
  for (const verify::AttentionCell& c : report.attention) {
    attention.push_back({{"k_codec", c.k_codec},
                         {"v_codec", c.v_codec},
                         {"heads", std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads)},
                         {"n_kv", c.n_kv},
                         {"mask", std::string(verify::mask_name(c.mask))},
                         {"head_dim", c.head_dim},
                         {"passed", c.passed},
                         {"total", c.total},
                         {"max_err", number_or_null(c.max_err)},
                         {"status", std::string(verify::status_name(c.status))}});
  }
  return {{"backend", report.backend}, {"cells", cells}, {"codecs", codecs}, {"attention", attention}};
}

int write_fixtures(const VerifyOptions& o) {
  std::vector<formats::KvCodecInfo> codecs;
  for (const formats::KvCodecInfo& info : selected_codecs(o.codecs)) {
    if (info.reference == nullptr) {
      std::cerr << "skipping " << info.name << ": it has no reference ops yet\n";
      continue;
    }
    codecs.push_back(info);
  }
  for (const fs::path& p : verify::write_fixtures(o.write_dir, codecs)) {
    std::cout << "wrote " << p.string() << " (" << fs::file_size(p) << " bytes)\n";
  }
  return 0;
}

int run_verify(const VerifyOptions& o) {
  const fs::path dir = o.fixtures_dir.empty() ? default_fixtures_dir() : fs::path(o.fixtures_dir);
  const verify::Fixtures fixtures = verify::load_fixtures(dir);
  const std::vector<formats::KvCodecInfo> codecs = selected_codecs(o.codecs);
  std::vector<std::string> backends = {o.backend};
  if (o.backend == "all") backends = verify::backend_names();
  std::cout << "fixtures: " << dir.string() << "\n";
  Json reports = Json::array();
  bool all_passed = true;
  for (const std::string& name : backends) {
    const verify::Target target = verify::make_target(name);
    verify::Report report = verify::run_verify(target, fixtures, codecs);
    report.attention = verify::run_attention_cells(target, codecs);
    std::cout << verify::format_report(report) << std::flush;
    const size_t n_cells = report.cells.size() + report.attention.size();
    const size_t n_passed = size_t(report.count(verify::CellStatus::Passed)) +
                            size_t(report.attention_count(verify::CellStatus::Passed));
    if (!report.unavailable.empty()) {
      std::cerr << "error: backend " << name << " is unavailable (" << report.unavailable << "): all " << n_cells
                << " cells are missing\n";
    } else if (!report.all_passed()) {
      std::cerr << "error: backend " << name << ": " << n_cells - n_passed << " of " << n_cells
                << " cells did not pass\n";
    }
    all_passed = all_passed && report.all_passed();
    reports.push_back(report_json(report));
  }
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    f << (reports.size() == 1 ? reports[0] : reports).dump(2) << "\n";
    if (!f) throw Error("verify: cannot write " + o.json_path);
  }
  return all_passed ? 0 : 1;
}

}  // namespace

void add_verify_command(CLI::App& app, int& exit_code) {
  auto* cmd =
      app.add_subcommand("verify", "check every KV codec x op x head dim, and attention over every K x V codec "
                                   "pair, of a backend against the references");
  auto o = std::make_shared<VerifyOptions>();
  cmd->add_option("--backend", o->backend, "backend to check")->check(CLI::IsMember({"cpu", "cuda", "all"}));
  cmd->add_option("--json", o->json_path, "write the matrix as JSON to this file");
  cmd->add_option("--fixtures", o->fixtures_dir,
                  "fixture directory (default: tests/fixtures/kv of the source tree)");
  cmd->add_option("--write-fixtures", o->write_dir,
                  "regenerate the fixtures into DIR from the reference ops, then exit");
  cmd->add_option("--codec", o->codecs, "only these codecs (repeat or comma-separate)")->delimiter(',');
  cmd->callback([o, &exit_code] { exit_code = o->write_dir.empty() ? run_verify(*o) : write_fixtures(*o); });
}

}  // namespace sparrow::tools
