// The verification matrix: the CPU backend passes every cell on the committed fixtures, and the engine catches
// what it exists to catch: a corrupted expectation, a wrong op, an op writing past its buffer, a missing codec,
// a missing or malformed fixture, an unavailable backend. Also `sparrow verify` as a user runs it.
#include "verify/verify.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "cpu/kv/cpu_kv_codecs.h"
#include "formats/kv/kv_codec.h"
#include "formats/weight_formats.h"
#include "unit/cli_test_util.h"
#include "util/error.h"
#include "unit/table_backend.h"
#include "verify/target.h"
#include "verify/fixture.h"

namespace sparrow::verify {
namespace {

namespace fs = std::filesystem;
using formats::KvCodec;
using formats::KvCodecInfo;
using formats::KvCodecOps;

const fs::path kFixtureDir = fs::path(SPARROW_SOURCE_DIR) / "tests/fixtures/kv";

const Fixtures& committed() {
  static const Fixtures fixtures = load_fixtures(kFixtureDir);
  return fixtures;
}

std::vector<KvCodecInfo> only(KvCodec codec) { return {formats::kv_codec_info(codec)}; }

std::vector<KvCodecInfo> stock_codecs() {
  std::vector<KvCodecInfo> out;
  for (KvCodec c : {KvCodec::F16, KvCodec::BF16, KvCodec::Q8_0, KvCodec::Q4_0})
    out.push_back(formats::kv_codec_info(c));
  return out;
}

std::string describe(const Cell& c) {
  return c.codec + " " + std::string(op_name(c.op)) + " d=" + std::to_string(c.head_dim) + ": " +
         std::string(status_name(c.status)) + " " + std::to_string(c.passed) + "/" + std::to_string(c.total) +
         " " + c.note;
}

// The cells of `report` that did not pass, as "codec op d".
std::set<std::string> failing(const Report& report) {
  std::set<std::string> out;
  for (const Cell& c : report.cells) {
    if (c.status != CellStatus::Passed) {
      out.insert(c.codec + " " + std::string(op_name(c.op)) + " " + std::to_string(c.head_dim));
    }
  }
  return out;
}

std::set<std::string> cells_of(const std::string& codec, const std::string& op) {
  std::set<std::string> out;
  for (int d : kHeadDims) out.insert(codec + " " + op + " " + std::to_string(d));
  return out;
}

Target table_target(const std::string& name, sparrow::testing::TableBackend::OpsLookup ops) {
  return Target{name, std::make_unique<sparrow::testing::TableBackend>(name, std::move(ops)), ""};
}

Report verify_cpu(const Fixtures& fixtures, std::span<const KvCodecInfo> codecs = formats::kv_codecs()) {
  return run_verify(make_target("cpu"), fixtures, codecs);
}

// ---------------------------------------------------------------------------------------------------------
// The CPU backend on the committed fixtures.

// One failure per codec that is not N/N everywhere, with its first bad cell (the matrix has 260 cells).
TEST(Verify, CpuBackendPassesEveryCellOfEveryRegisteredCodec) {
  const Report report = verify_cpu(committed());
  ASSERT_EQ(report.cells.size(), formats::kv_codecs().size() * kOps.size() * kHeadDims.size());
  std::map<std::string, std::vector<const Cell*>> bad;
  for (const Cell& c : report.cells) {
    if (c.status != CellStatus::Passed) bad[c.codec].push_back(&c);
  }
  for (const auto& [codec, cells] : bad) {
    ADD_FAILURE() << codec << ": " << cells.size() << " of 20 cells did not pass; first: " << describe(*cells[0]);
  }
  EXPECT_TRUE(report.all_passed()) << format_report(report);
}

TEST(Verify, CellsCountTheirCasesAndStockEncodeIsExact) {
  const Report report = verify_cpu(committed(), only(KvCodec::Q8_0));
  ASSERT_EQ(report.cells.size(), 20u);
  for (const Cell& c : report.cells) {
    const HeadDimInputs& in = committed().inputs.at(c.head_dim);
    const int expected = c.op == Op::Score                            ? in.n_vectors * in.n_queries
                         : (c.op == Op::Encode || c.op == Op::Decode) ? in.n_vectors
                                                                      : in.n_sequences;
    EXPECT_EQ(c.total, expected) << describe(c);
    EXPECT_EQ(c.passed, c.total) << describe(c);
    if (c.op == Op::Encode || c.op == Op::Decode || c.op == Op::Finish)
      EXPECT_EQ(c.max_err, 0.0) << describe(c);
    else
      EXPECT_LT(c.max_err, 1e-5) << describe(c);
  }
  ASSERT_EQ(report.codecs.size(), 1u);
  EXPECT_DOUBLE_EQ(report.codecs[0].bits_per_element, 8.5);
  // q8_0 on unit vectors: a uniform quantizer with step amax/127 per 32 elements.
  for (int d : kHeadDims) EXPECT_NEAR(report.codecs[0].mse_unit_gaussian.at(d), 2.9e-5, 0.5e-5) << d;
}

TEST(Verify, InputsHaveTheDocumentedShape) {
  const FixtureInputs& in = committed().inputs;
  ASSERT_EQ(in.dims.size(), kHeadDims.size());
  for (const HeadDimInputs& h : in.dims) {
    EXPECT_EQ(h.vectors.size(), size_t(h.n_vectors) * h.head_dim);
    EXPECT_GE(h.n_gaussian + h.n_extra_gaussian(), 64) << "the MSE statistic needs enough unit-Gaussian vectors";
    for (float w : h.weights) EXPECT_TRUE(std::isfinite(w));
  }
}

// ---------------------------------------------------------------------------------------------------------
// Fixtures are made by a deterministic tool.

std::vector<uint8_t> file_bytes(const fs::path& p) {
  const std::string s = sparrow::testing::read_text(p);
  return std::vector<uint8_t>(s.begin(), s.end());
}

fs::path temp_dir(const std::string& name) {
  const fs::path dir = sparrow::testing::scratch_dir() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(Verify, RegeneratingFixturesGivesIdenticalBytes) {
  const fs::path dir = temp_dir("regen");
  const auto written = write_fixtures(dir, stock_codecs());
  ASSERT_EQ(written.size(), 5u);
  for (const fs::path& p : written) {
    EXPECT_EQ(file_bytes(p), file_bytes(kFixtureDir / p.filename()))
        << p.filename() << " differs from the committed one";
  }
  fs::remove_all(dir);
}

TEST(Verify, SerializationRoundTrips) {
  const CodecFixture& f = committed().codecs.at("q4_0");
  const std::vector<uint8_t> bytes = serialize_codec_fixture(f);
  EXPECT_EQ(bytes, file_bytes(kFixtureDir / "q4_0.kvfix"));
  const CodecFixture back = parse_codec_fixture(bytes, "memory");
  EXPECT_EQ(back.codec, "q4_0");
  EXPECT_EQ(back.at(256).scores, f.at(256).scores);
  EXPECT_EQ(back.at(512).near_boundary, f.at(512).near_boundary);
  EXPECT_EQ(serialize_inputs(committed().inputs), file_bytes(kFixtureDir / "inputs.kvfix"));
}

// ---------------------------------------------------------------------------------------------------------
// Corrupted expectations fail exactly the cells that read them.

TEST(Verify, CorruptedScoreFailsOnlyThatCell) {
  Fixtures fx = committed();
  std::vector<float>& scores = fx.codecs.at("f16").dims[1].scores;  // d = 128
  scores[37] = scores[37] * 1.01f + 0.01f;
  const Report report = verify_cpu(fx, only(KvCodec::F16));
  EXPECT_EQ(failing(report), std::set<std::string>{"f16 score 128"});
  for (const Cell& c : report.cells) {
    if (c.status == CellStatus::Failed) {
      EXPECT_EQ(c.passed, c.total - 1);
      EXPECT_NE(c.note.find("query 1 x vector 5"), std::string::npos) << c.note;  // case 37 = query 1, vector 5
      EXPECT_GT(c.max_err, 1e-4);                                                 // beyond the tolerance
    }
  }
}

TEST(Verify, CorruptedDecodedValueFailsEncodeAndDecode) {
  Fixtures fx = committed();
  HeadDimExpected& e = fx.codecs.at("q4_0").dims[2];  // d = 256
  size_t i = 3 * 256;
  while (e.near_boundary[i]) ++i;  // an element the encode check does not skip
  e.decoded[i] += 0.5f;
  const Report report = verify_cpu(fx, only(KvCodec::Q4_0));
  EXPECT_EQ(failing(report), (std::set<std::string>{"q4_0 encode 256", "q4_0 decode 256"}));
}

TEST(Verify, CorruptedBlockFailsTheOpsThatReadBlocks) {
  Fixtures fx = committed();
  HeadDimExpected& e = fx.codecs.at("q8_0").dims[3];  // d = 512
  e.blocks[2 + 5] ^= 0x40;                            // vector 0, block 0, element 5
  const Report report = verify_cpu(fx, only(KvCodec::Q8_0));
  // encode is judged against the stored decoded values and finish against the stored accumulators.
  EXPECT_EQ(failing(report), (std::set<std::string>{"q8_0 decode 512", "q8_0 score 512", "q8_0 accumulate 512"}));
}

TEST(Verify, FixtureFromOtherInputsOrLayoutIsNotTrusted) {
  Fixtures fx = committed();
  fx.codecs.at("bf16").dims[0].block_bytes += 2;  // as if the codec's layout had changed since
  const Report report = verify_cpu(fx, only(KvCodec::BF16));
  EXPECT_EQ(failing(report), (std::set<std::string>{"bf16 encode 64", "bf16 decode 64", "bf16 score 64",
                                                    "bf16 accumulate 64", "bf16 finish 64"}));
  EXPECT_NE(report.cells[0].note.find("regenerate"), std::string::npos) << report.cells[0].note;
}

// ---------------------------------------------------------------------------------------------------------
// Wrong op tables fail the right cells. Each broken op wraps the real CPU op of f16.

const KvCodecOps& cpu_f16() { return cpu::kv_codec_ops(KvCodec::F16); }

void truncating_encode(const float* x, int d, uint8_t* block) {  // drops the 13 low mantissa bits: no rounding
  for (int i = 0; i < d; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(x[i]);
    const uint16_t h = formats::f32_to_f16(std::bit_cast<float>(b & 0xFFFFE000u));
    std::memcpy(block + 2 * i, &h, 2);
  }
}
void overflowing_encode(const float* x, int d, uint8_t* block) {
  cpu_f16().encode(x, d, block);
  block[2 * d] = 0;  // one byte past the block
}
void off_by_one_ulp_decode(const uint8_t* block, int d, float* x) {
  cpu_f16().decode(block, d, x);
  x[d / 2] = std::nextafter(x[d / 2], INFINITY);
}
float biased_score(const float* q, const uint8_t* block, int d) { return cpu_f16().score(q, block, d) * 1.001f; }
float first_half_score(const float* q, const uint8_t* block, int d) {  // forgets the second half of the head
  float x[512];
  cpu_f16().decode(block, d, x);
  float s = 0;
  for (int i = 0; i < d / 2; ++i) s += q[i] * x[i];
  return s;
}
void unweighted_accumulate(float w, const uint8_t* block, int d, float* acc) {
  cpu_f16().accumulate(1.0f, block, d, acc);
}
void scaled_finish(const float* acc, int d, float* out) {
  for (int i = 0; i < d; ++i) out[i] = acc[i] * 1.001f;
}

struct BrokenCase {
  const char* what;
  KvCodecOps ops;
  std::set<std::string> failing;
};

TEST(Verify, WrongOpTablesFailTheRightCells) {
  const KvCodecOps good = cpu_f16();
  auto with = [&](auto field, auto fn) {
    KvCodecOps o = good;
    o.*field = fn;
    return o;
  };
  const BrokenCase cases[] = {
      {"truncating encode", with(&KvCodecOps::encode, truncating_encode), cells_of("f16", "encode")},
      {"encode past the block", with(&KvCodecOps::encode, overflowing_encode), cells_of("f16", "encode")},
      {"decode 1 ulp off", with(&KvCodecOps::decode, off_by_one_ulp_decode), cells_of("f16", "decode")},
      {"score 0.1% high", with(&KvCodecOps::score, biased_score), cells_of("f16", "score")},
      {"score of half the head", with(&KvCodecOps::score, first_half_score), cells_of("f16", "score")},
      {"accumulate ignoring w", with(&KvCodecOps::accumulate, unweighted_accumulate),
       cells_of("f16", "accumulate")},
      {"finish 0.1% high", with(&KvCodecOps::finish, scaled_finish), cells_of("f16", "finish")},
  };
  for (const BrokenCase& bc : cases) {
    SCOPED_TRACE(bc.what);
    const Target broken = table_target("broken", [&](KvCodec c) {
      return c == KvCodec::F16 ? &bc.ops : &cpu::kv_codec_ops(c);
    });
    const Report report = run_verify(broken, committed(), only(KvCodec::F16));
    EXPECT_EQ(failing(report), bc.failing);
    EXPECT_FALSE(report.all_passed());
  }
}

// No holes: a codec a backend lacks (or lacks one op of) fails every one of its cells, with the reason.
TEST(Verify, ACodecTheBackendLacksFailsItsCells) {
  const KvCodecOps incomplete{cpu_f16().encode, cpu_f16().decode, cpu_f16().prepare_query,
                              cpu_f16().score,  nullptr,          cpu_f16().finish};
  const Target partial = table_target("partial", [&](KvCodec c) -> const KvCodecOps* {
    if (c == KvCodec::Q4_0) return nullptr;
    if (c == KvCodec::BF16) return &incomplete;
    return &cpu::kv_codec_ops(c);
  });
  const std::vector<KvCodecInfo> codecs = {formats::kv_codec_info(KvCodec::BF16),
                                           formats::kv_codec_info(KvCodec::Q4_0),
                                           formats::kv_codec_info(KvCodec::Q8_0)};
  const Report report = run_verify(partial, committed(), codecs);
  EXPECT_EQ(report.count(CellStatus::Failed), 40);
  EXPECT_EQ(report.count(CellStatus::Passed), 20);
  EXPECT_FALSE(report.all_passed());
  for (const Cell& c : report.cells) {
    if (c.codec == "q8_0") continue;
    EXPECT_EQ(c.status, CellStatus::Failed) << describe(c);
    EXPECT_NE(c.note.find("has no complete ops for " + c.codec), std::string::npos) << describe(c);
  }
}

TEST(Verify, UnavailableBackendHasEveryCellMissing) {
  const Target gpu{"gpu", nullptr, "no GPU here"};
  const Report report = run_verify(gpu, committed());
  EXPECT_EQ(report.count(CellStatus::Missing), int(report.cells.size()));
  EXPECT_FALSE(report.all_passed());
  EXPECT_NE(format_report(report).find("unavailable"), std::string::npos);
  EXPECT_THROW(make_target("tpu"), Error);
}

// ---------------------------------------------------------------------------------------------------------
// Missing and malformed fixture files are reported, never crash, never pass.

TEST(Verify, MissingOrMalformedCodecFixturesAreMissingCells) {
  const fs::path dir = temp_dir("broken");
  for (const char* name : {"inputs.kvfix", "f16.kvfix", "bf16.kvfix", "q8_0.kvfix"})
    fs::copy_file(kFixtureDir / name, dir / name);
  fs::resize_file(dir / "bf16.kvfix", fs::file_size(dir / "bf16.kvfix") - 3);  // truncated
  {
    std::fstream f(dir / "q8_0.kvfix", std::ios::in | std::ios::out | std::ios::binary);
    f.put('X');  // bad magic
  }
  const Fixtures fx = load_fixtures(dir);
  EXPECT_EQ(fx.codecs.count("f16"), 1u);
  ASSERT_EQ(fx.problems.count("bf16"), 1u);
  EXPECT_NE(fx.problems.at("bf16").find("truncated"), std::string::npos) << fx.problems.at("bf16");
  EXPECT_NE(fx.problems.at("q8_0").find("bad magic"), std::string::npos) << fx.problems.at("q8_0");
  EXPECT_NE(fx.problems.at("q4_0").find("no fixture"), std::string::npos) << fx.problems.at("q4_0");
  const Report report = verify_cpu(fx, stock_codecs());
  for (const Cell& c : report.cells) {
    EXPECT_EQ(c.status == CellStatus::Passed, c.codec == "f16") << describe(c);
    if (c.codec != "f16") { EXPECT_EQ(c.status, CellStatus::Missing) << describe(c); }
  }
  fs::remove(dir / "inputs.kvfix");
  EXPECT_THROW(load_fixtures(dir), Error);
  fs::remove_all(dir);
}

TEST(Verify, RandomlyDamagedFixtureBytesThrowOrParseNeverCrash) {
  const std::vector<uint8_t> good = file_bytes(kFixtureDir / "q4_0.kvfix");
  std::mt19937 rng(5);
  int thrown = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<uint8_t> bad = good;
    if (trial % 3 == 0)
      bad.resize(rng() % good.size());
    else
      for (int k = 0; k < 4; ++k) bad[rng() % 200] ^= uint8_t(1 + rng() % 255);  // the header region
    try {
      parse_codec_fixture(bad, "damaged");
    } catch (const Error& e) {
      ++thrown;
      EXPECT_NE(std::string(e.what()).find("damaged: "), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(thrown, 100);
}

// ---------------------------------------------------------------------------------------------------------
// `sparrow verify` from the command line.

TEST(VerifyCli, PassingRunWritesTheDocumentedJson) {
  const fs::path json = temp_dir("cli") / "report.json";
  const auto r = sparrow::testing::run_sparrow("verify --codec f16,q4_0 --fixtures " + kFixtureDir.string() +
                                               " --json " + json.string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("40 cells: 40 passed"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(sparrow::testing::read_text(json));
  ASSERT_EQ(j.size(), 4u);  // backend, cells, codecs, attention
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_TRUE(j.contains("attention"));
  ASSERT_EQ(j["cells"].size(), 40u);
  const nlohmann::json& cell = j["cells"][0];
  EXPECT_EQ(cell.size(), 6u);
  EXPECT_EQ(cell["codec"], "f16");
  EXPECT_EQ(cell["op"], "encode");
  EXPECT_EQ(cell["head_dim"], 64);
  EXPECT_EQ(cell["passed"], 32);
  EXPECT_EQ(cell["total"], 32);
  EXPECT_EQ(cell["max_err"], 0.0);
  ASSERT_EQ(j["codecs"].size(), 2u);
  const nlohmann::json& q4 = j["codecs"][1];
  EXPECT_EQ(q4["name"], "q4_0");
  EXPECT_EQ(q4["bits_per_element"], 4.5);
  for (const char* d : {"64", "128", "256", "512"}) {
    EXPECT_GT(q4["mse_unit_gaussian"][d].get<double>(), 0.005) << d;
    EXPECT_LT(q4["mse_unit_gaussian"][d].get<double>(), 0.01) << d;
  }
  fs::remove_all(json.parent_path());
}

TEST(VerifyCli, CudaWithoutCudaFailsLoudly) {
  const auto r = sparrow::testing::run_sparrow("verify --backend cuda --fixtures " + kFixtureDir.string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("unavailable"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cells are missing"), std::string::npos) << r.err;
}

TEST(VerifyCli, BadArgumentsAreOneLineErrors) {
  auto r = sparrow::testing::run_sparrow("verify --fixtures /nonexistent/kv");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/nonexistent/kv/inputs.kvfix"), std::string::npos) << r.err;
  r = sparrow::testing::run_sparrow("verify --codec q9_9 --fixtures " + kFixtureDir.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown kv codec 'q9_9'"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace sparrow::verify
