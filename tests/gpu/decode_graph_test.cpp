// Decode steps replayed as CUDA graphs (CudaBackend::begin_pass) against the same steps launched kernel by
// kernel: the same kernels with the same arguments, so the logits must be identical bit for bit, step after step,
// across the flash-decoding split changes that force a new graph, and with a compressed KV cache.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <vector>

#include "gpu_test_util.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "unit/cli_test_util.h"

namespace sparrow {
namespace {

namespace fs = std::filesystem;

const fs::path& tiny_model() {
  return testing::mkmodel_once("--arch gemma4 --preset tiny-ple --type q4_k --seed 11");
}

// The tiny model with every layer on the GPU.
std::unique_ptr<Model> load_on_gpu() {
  ModelLoadOptions load;
  load.device = Device::Cuda;
  load.n_gpu_layers = 99;
  return Model::load(tiny_model().string(), load);
}

// The logits of a prompt and then `steps` greedy decode steps, each step's row copied out.
std::vector<std::vector<float>> greedy_logits(const Model& model, bool graphs, formats::KvCodec kv, int steps) {
  SessionOptions options;
  options.n_ctx = 1024;
  options.k_codec = options.v_codec = kv;
  options.record_decode = graphs;
  Session session(model, options);
  std::vector<int32_t> prompt = {2, 651, 1234, 77, 9, 4021, 318, 66};
  session.decode(prompt.data(), int32_t(prompt.size()), false);
  std::vector<std::vector<float>> rows;
  for (int step = 0; step < steps; ++step) {
    const float* logits = session.logits(-1);
    rows.emplace_back(logits, logits + model.config.n_vocab);
    int32_t next = 0;
    for (int32_t i = 1; i < model.config.n_vocab; ++i) next = logits[i] > logits[next] ? i : next;
    session.decode(&next, 1, false);
  }
  return rows;
}

TEST(CudaDecodeGraphs, ReplayedStepsEqualStepsLaunchedOneByOne) {
  SPARROW_REQUIRE_GPU();
  const auto model = load_on_gpu();
  // 300 steps: past the context lengths at which the decode attention changes its number of splits.
  for (formats::KvCodec kv : {formats::KvCodec::F16, formats::KvCodec::TBQ4}) {
    const auto launched = greedy_logits(*model, false, kv, 300);
    const auto replayed = greedy_logits(*model, true, kv, 300);
    ASSERT_EQ(launched.size(), replayed.size());
    for (size_t step = 0; step < launched.size(); ++step)
      ASSERT_EQ(launched[step], replayed[step]) << "KV " << int(kv) << ", step " << step;
  }
}

// A process whose first forward pass is a one-token step records it at once: the codec tables (and the QJL
// projections that tbq4p's keys need) must already be on the device, since binding them inside the capture fails.
// ctest runs each test in a process of its own, so nothing ran before this one.
TEST(CudaDecodeGraphs, AOneTokenFirstPassIsRecordedWithSketchingCodecs) {
  SPARROW_REQUIRE_GPU();
  const auto model = load_on_gpu();
  std::vector<std::vector<float>> logits;
  for (bool graphs : {true, false}) {
    SessionOptions options;
    options.n_ctx = 64;
    options.k_codec = formats::KvCodec::TBQ4P;
    options.v_codec = formats::KvCodec::TBQ4;
    options.record_decode = graphs;
    Session session(*model, options);
    const int32_t token = 651;
    ASSERT_NO_THROW(session.decode(&token, 1, false));
    const float* row = session.logits(-1);
    logits.emplace_back(row, row + model->config.n_vocab);
  }
  EXPECT_EQ(logits[0], logits[1]);
}

}  // namespace
}  // namespace sparrow
