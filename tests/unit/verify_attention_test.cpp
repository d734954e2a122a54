// The attention cells of the verification matrix: the CPU attention passes them, deliberately broken attention
// kernels (a window ignored, a scale 1% off, the wrong KV head for a query head, a write past the output) fail
// exactly the cells they should, and an unavailable backend leaves every cell missing. Also the JSON that
// `sparrow verify` writes for them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "cpu/kv/cpu_kv_codecs.h"
#include "formats/kv/kv_codec.h"
#include "ops/backend.h"
#include "unit/cli_test_util.h"
#include "verify/attention_cells.h"
#include "unit/table_backend.h"
#include "util/error.h"
#include "verify/target.h"
#include "verify/verify.h"

namespace sparrow::verify {
namespace {

namespace fs = std::filesystem;
using formats::KvCodec;
using formats::KvCodecInfo;

// The matrix the task asks for, written out here rather than read from AttentionShapes.
const std::vector<HeadGroup> kSpecHeads = {{.n_heads = 1, .n_kv_heads = 1},
                                           {.n_heads = 4, .n_kv_heads = 2},
                                           {.n_heads = 8, .n_kv_heads = 1},
                                           {.n_heads = 8, .n_kv_heads = 2}};
const std::vector<int> kSpecKvLengths = {1, 7, 64, 512, 4097};

std::vector<KvCodecInfo> codecs_of(std::initializer_list<KvCodec> list) {
  std::vector<KvCodecInfo> out;
  for (KvCodec c : list) out.push_back(formats::kv_codec_info(c));
  return out;
}

sparrow::Backend& cpu_kernels() {
  static const std::unique_ptr<sparrow::Backend> backend = make_cpu_backend(2);
  return *backend;
}

using sparrow::testing::TableBackend;

Target table_target(TableBackend::OpsLookup ops, TableBackend::AttentionKernel kernel = {}) {
  return Target{"test", std::make_unique<TableBackend>("test", std::move(ops), std::move(kernel)), ""};
}

// The CPU codec ops with `kernel` as the attention.
Target cpu_with(TableBackend::AttentionKernel kernel) {
  return table_target([](KvCodec c) { return &cpu::kv_codec_ops(c); }, std::move(kernel));
}

std::string key(int n_heads, int n_kv_heads, int n_kv, Mask mask) {
  return std::to_string(n_heads) + "/" + std::to_string(n_kv_heads) + " n_kv=" + std::to_string(n_kv) + " " +
         std::string(mask_name(mask));
}
std::string key(const AttentionCell& c) { return key(c.n_heads, c.n_kv_heads, c.n_kv, c.mask); }

std::set<std::string> failing(const std::vector<AttentionCell>& cells) {
  std::set<std::string> out;
  for (const AttentionCell& c : cells)
    if (c.status != CellStatus::Passed) out.insert(key(c));
  return out;
}

// The cells of one pair for which `fails(heads, n_kv, mask)` holds.
std::set<std::string> spec_cells_where(const std::function<bool(HeadGroup, int, Mask)>& fails) {
  std::set<std::string> out;
  for (HeadGroup h : kSpecHeads)
    for (int n : kSpecKvLengths)
      for (Mask m : {Mask::Causal, Mask::Windowed})
        if (fails(h, n, m)) out.insert(key(h.n_heads, h.n_kv_heads, n, m));
  return out;
}

std::string describe(const AttentionCell& c) {
  return c.k_codec + "/" + c.v_codec + " " + key(c) + " d=" + std::to_string(c.head_dim) + ": " +
         std::string(status_name(c.status)) + " " + std::to_string(c.passed) + "/" + std::to_string(c.total) + " " +
         c.note;
}

TEST(VerifyAttention, DefaultShapesAreTheSpecifiedMatrix) {
  const AttentionShapes shapes;
  ASSERT_EQ(shapes.heads.size(), kSpecHeads.size());
  for (size_t i = 0; i < kSpecHeads.size(); ++i) {
    EXPECT_EQ(shapes.heads[i].n_heads, kSpecHeads[i].n_heads);
    EXPECT_EQ(shapes.heads[i].n_kv_heads, kSpecHeads[i].n_kv_heads);
  }
  EXPECT_EQ(shapes.n_kv, kSpecKvLengths);
  EXPECT_EQ(shapes.cells_per_pair(), 40);
}

// f16 (exact values), q8_0 (block scales) and tbq4 (rotated basis, prepared queries) against the CPU kernel.
TEST(VerifyAttention, CpuAttentionPassesEveryCellOfSomePairs) {
  const std::vector<AttentionCell> cells =
      run_attention_cells(make_target("cpu"), codecs_of({KvCodec::F16, KvCodec::Q8_0, KvCodec::TBQ4}));
  ASSERT_EQ(cells.size(), 9u * 40u);
  std::map<std::string, std::map<int, int>> head_dims_per_pair;
  for (const AttentionCell& c : cells) {
    EXPECT_EQ(c.status, CellStatus::Passed) << describe(c);
    // One case per output row: the last min(n_kv, 4) positions times every query head.
    EXPECT_EQ(c.total, std::min(c.n_kv, 4) * c.n_heads) << describe(c);
    EXPECT_EQ(c.passed, c.total) << describe(c);
    EXPECT_LE(c.max_err, kAttentionTolerance) << describe(c);
    ++head_dims_per_pair[c.k_codec + "/" + c.v_codec][c.head_dim];
  }
  for (const auto& [pair, dims] : head_dims_per_pair) {
    for (int d : kHeadDims) EXPECT_EQ(dims.count(d) ? dims.at(d) : 0, 10) << pair << " d=" << d;
  }
  // f16 values are exact and the softmax is float32: far inside the tolerance, but not bit-equal.
  const auto f16 = std::find_if(cells.begin(), cells.end(), [](const AttentionCell& c) {
    return c.k_codec == "f16" && c.v_codec == "f16" && c.n_kv == 4097;
  });
  ASSERT_NE(f16, cells.end());
  EXPECT_LT(f16->max_err, 2e-5) << describe(*f16);
}

struct BrokenKernel {
  const char* what;
  TableBackend::AttentionKernel kernel;
  std::set<std::string> failing;
};

// Query head h reads KV head h % n_kv_heads instead of h / (n_heads / n_kv_heads): the real kernel run one
// query head at a time over a one-head view of the wrong KV head.
void wrong_kv_head_attention(const AttentionArgs& args) {
  const int d = args.kv.head_dim;
  const size_t k_bytes = formats::kv_codec_info(args.kv.k_codec).block_bytes(d) * args.kv.capacity;
  const size_t v_bytes = formats::kv_codec_info(args.kv.v_codec).block_bytes(d) * args.kv.capacity;
  std::vector<float> q(size_t(args.n_tokens) * d), out(q.size());
  for (int h = 0; h < args.n_heads; ++h) {
    for (int64_t t = 0; t < args.n_tokens; ++t)
      std::memcpy(&q[t * d], args.q + (t * args.n_heads + h) * d, sizeof(float) * d);
    AttentionArgs one = args;
    one.q = q.data();
    one.out = out.data();
    one.n_heads = 1;
    one.kv.n_kv_heads = 1;
    const int kv_head = h % args.kv.n_kv_heads;
    one.kv.k = static_cast<uint8_t*>(args.kv.k) + kv_head * k_bytes;
    one.kv.v = static_cast<uint8_t*>(args.kv.v) + kv_head * v_bytes;
    cpu_kernels().attention(one);
    for (int64_t t = 0; t < args.n_tokens; ++t)
      std::memcpy(args.out + (t * args.n_heads + h) * d, &out[t * d], sizeof(float) * d);
  }
}

TEST(VerifyAttention, BrokenKernelsFailTheRightCells) {
  const BrokenKernel cases[] = {
      {"ignores the sliding window",
       [](const AttentionArgs& a) {
         AttentionArgs b = a;
         b.sliding_window = 0;
         cpu_kernels().attention(b);
       },
       // n_kv = 1: the window of 1 holds the only key there is.
       spec_cells_where([](HeadGroup, int n_kv, Mask m) { return m == Mask::Windowed && n_kv > 1; })},
      {"scale 1% high",
       [](const AttentionArgs& a) {
         AttentionArgs b = a;
         b.scale *= 1.01f;
         cpu_kernels().attention(b);
       },
       // One visible key gets weight 1 whatever the scale.
       spec_cells_where([](HeadGroup, int n_kv, Mask) { return n_kv > 1; })},
      {"query head h reads KV head h % n_kv_heads", wrong_kv_head_attention,
       spec_cells_where([](HeadGroup h, int, Mask) {
         for (int head = 0; head < h.n_heads; ++head)
           if (head % h.n_kv_heads != head / (h.n_heads / h.n_kv_heads)) return true;
         return false;
       })},
      {"writes one float past its output",
       [](const AttentionArgs& a) {
         cpu_kernels().attention(a);
         a.out[a.n_tokens * a.n_heads * a.kv.head_dim] = 0.0f;
       },
       spec_cells_where([](HeadGroup, int, Mask) { return true; })},
  };
  for (const BrokenKernel& bc : cases) {
    SCOPED_TRACE(bc.what);
    const Target backend = cpu_with(bc.kernel);
    const std::vector<AttentionCell> cells = run_attention_cells(backend, codecs_of({KvCodec::F16}));
    ASSERT_EQ(cells.size(), 40u);
    EXPECT_EQ(failing(cells), bc.failing);
    for (const AttentionCell& c : cells) {
      if (c.status != CellStatus::Passed) {
        EXPECT_EQ(c.status, CellStatus::Failed) << describe(c);
        EXPECT_FALSE(c.note.empty()) << describe(c);
      }
    }
  }
}

// A scale off by one in d (1/sqrt(d - 1), 0.1% at d = 512) is a smaller error than the cases above: not every
// cell sees it above the tolerance, but some do, and never a cell with a single visible key.
TEST(VerifyAttention, ScaleOffByOneInTheHeadDimFailsTheReport) {
  const Target backend = cpu_with([](const AttentionArgs& a) {
    AttentionArgs b = a;
    b.scale = 1.0f / std::sqrt(float(a.kv.head_dim - 1));
    cpu_kernels().attention(b);
  });
  Report report;
  report.cells.push_back(Cell{.codec = "f16", .op = Op::Encode, .head_dim = 64, .passed = 32, .total = 32,
                               .max_err = 0.0, .status = CellStatus::Passed});
  report.attention = run_attention_cells(backend, codecs_of({KvCodec::F16}));
  EXPECT_FALSE(report.all_passed());
  for (const AttentionCell& c : report.attention) {
    if (c.n_kv == 1) {
      EXPECT_EQ(c.status, CellStatus::Passed) << describe(c);
    }
  }
}

TEST(VerifyAttention, BrokenCellsAreNamedInTheReport) {
  const Target backend = cpu_with([](const AttentionArgs& a) {
    AttentionArgs b = a;
    b.sliding_window = 0;
    cpu_kernels().attention(b);
  });
  Report report;
  report.attention = run_attention_cells(backend, codecs_of({KvCodec::F16}));
  const std::string text = format_attention_cells(report.attention);
  EXPECT_NE(text.find("40 attention cells: 24 passed, 16 failed, 0 missing"), std::string::npos) << text;
  EXPECT_NE(text.find("f16/f16 heads 1/1 n_kv=7 windowed"), std::string::npos) << text;
  EXPECT_NE(text.find("got "), std::string::npos) << text;
  EXPECT_FALSE(report.all_passed());
}

// K: every codec; V: every codec but the keys-only qjl. Nothing runs, nothing passes.
TEST(VerifyAttention, UnavailableBackendHasEveryCellMissing) {
  const Target backend{"gpu", nullptr, "no GPU here"};
  const std::vector<AttentionCell> cells =
      run_attention_cells(backend, codecs_of({KvCodec::F16, KvCodec::QJL, KvCodec::Q4_0}));
  ASSERT_EQ(cells.size(), 3u * 2u * 40u);
  std::set<std::string> pairs;
  for (const AttentionCell& c : cells) {
    EXPECT_EQ(c.status, CellStatus::Missing) << describe(c);
    EXPECT_EQ(c.note, "no GPU here");
    EXPECT_NE(c.v_codec, "qjl");
    pairs.insert(c.k_codec + "/" + c.v_codec);
  }
  EXPECT_EQ(pairs, (std::set<std::string>{"f16/f16", "f16/q4_0", "qjl/f16", "qjl/q4_0", "q4_0/f16", "q4_0/q4_0"}));
  EXPECT_NE(format_attention_cells(cells).find("240 attention cells: 0 passed, 0 failed, 240 missing"),
            std::string::npos);
}

// No holes: pairs with a codec the backend's attention cannot read fail, with the backend's reason.
TEST(VerifyAttention, PairsWithACodecTheBackendLacksFail) {
  const Target backend = table_target([](KvCodec c) { return c == KvCodec::Q4_0 ? nullptr : &cpu::kv_codec_ops(c); },
                                      [](const AttentionArgs& a) {
                                        if (a.kv.k_codec == KvCodec::Q4_0 || a.kv.v_codec == KvCodec::Q4_0)
                                          throw Error("this backend cannot read q4_0");
                                        cpu_kernels().attention(a);
                                      });
  const std::vector<AttentionCell> cells = run_attention_cells(backend, codecs_of({KvCodec::F16, KvCodec::Q4_0}));
  ASSERT_EQ(cells.size(), 4u * 40u);
  for (const AttentionCell& c : cells) {
    const bool lacks = c.k_codec == "q4_0" || c.v_codec == "q4_0";
    EXPECT_EQ(c.status, lacks ? CellStatus::Failed : CellStatus::Passed) << describe(c);
    if (lacks) EXPECT_NE(c.note.find("cannot read q4_0"), std::string::npos) << describe(c);
  }
}

TEST(VerifyAttention, ABackendWithoutAnAttentionKernelFailsEveryCell) {
  const Target backend = table_target([](KvCodec c) { return &cpu::kv_codec_ops(c); });
  const std::vector<AttentionCell> cells = run_attention_cells(backend, codecs_of({KvCodec::F16}));
  for (const AttentionCell& c : cells) {
    EXPECT_EQ(c.status, CellStatus::Failed) << describe(c);
    EXPECT_NE(c.note.find("no attention kernel"), std::string::npos) << describe(c);
  }
}

TEST(VerifyAttention, AFailingAttentionCellFailsTheReport) {
  Report report;
  report.cells.push_back(Cell{.codec = "f16", .op = Op::Encode, .head_dim = 64, .passed = 32, .total = 32,
                               .max_err = 0.0, .status = CellStatus::Passed});
  EXPECT_TRUE(report.all_passed());
  AttentionCell bad;
  bad.status = CellStatus::Failed;
  report.attention.push_back(bad);
  EXPECT_FALSE(report.all_passed());
  report.attention[0].status = CellStatus::Passed;
  EXPECT_TRUE(report.all_passed());
}

TEST(VerifyAttentionCli, JsonHasTheAttentionSection) {
  const fs::path json = sparrow::testing::scratch_dir() / "report.json";
  const auto r = sparrow::testing::run_sparrow("verify --codec f16 --fixtures " +
                                               (fs::path(SPARROW_SOURCE_DIR) / "tests/fixtures/kv").string() +
                                               " --json " + json.string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("40 attention cells: 40 passed"), std::string::npos) << r.out;
  const nlohmann::ordered_json j =
      nlohmann::ordered_json::parse(sparrow::testing::read_text(json));  // keys in file order
  ASSERT_EQ(j["attention"].size(), 40u);
  const nlohmann::ordered_json& first = j["attention"][0];
  const std::vector<std::string> keys = {"k_codec",  "v_codec", "heads", "n_kv",    "mask",
                                         "head_dim", "passed",  "total", "max_err", "status"};
  ASSERT_EQ(first.size(), keys.size());
  size_t i = 0;
  for (const auto& [name, value] : first.items()) EXPECT_EQ(name, keys[i++]);
  EXPECT_EQ(first["k_codec"], "f16");
  EXPECT_EQ(first["v_codec"], "f16");
  EXPECT_EQ(first["heads"], "1/1");
  EXPECT_EQ(first["n_kv"], 1);
  EXPECT_EQ(first["mask"], "causal");
  EXPECT_EQ(first["passed"], 1);
  EXPECT_EQ(first["total"], 1);
  EXPECT_EQ(first["status"], "passed");
  const nlohmann::ordered_json& last = j["attention"][39];
  EXPECT_EQ(last["heads"], "8/2");
  EXPECT_EQ(last["n_kv"], 4097);
  EXPECT_EQ(last["mask"], "windowed");
  EXPECT_EQ(last["total"], 32);
}

}  // namespace
}  // namespace sparrow::verify
