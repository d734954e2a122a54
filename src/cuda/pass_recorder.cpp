#include "cuda/pass_recorder.h"

#include <algorithm>

#include "cuda/cuda_check.h"
#include "cuda/device_scratch.h"
#include "util/error.h"

namespace sparrow::cuda {

PassRecorder::PassRecorder(const LaunchTarget& target) : target_(target) {
  SPARROW_CUDA_CHECK(cudaMalloc(&device_values_, sizeof(int32_t) * kMaxStepValues));
}

// Destructors do not throw: failures while releasing are ignored.
PassRecorder::~PassRecorder() {
  cancel();
  if (graph_ != nullptr) cudaGraphExecDestroy(graph_);
  cudaFree(device_values_);
}

void PassRecorder::begin(bool record) {
  cancel();  // a pass that ended in an error may have left its capture open
  values_.clear();
  position_slots_.clear();
  description_.clear();
  if (!record) {
    mode_ = Mode::Direct;
  } else if (graph_ != nullptr) {
    mode_ = Mode::Matching;
  } else {
    // Relaxed: a scratch buffer may still grow (cudaMalloc) while the pass is being captured.
    SPARROW_CUDA_CHECK(cudaStreamBeginCapture(target_.stream, cudaStreamCaptureModeRelaxed));
    mode_ = Mode::Capturing;
  }
}

bool PassRecorder::end() {
  // Scratch that moved since the held graph was captured leaves it pointing at freed memory.
  describe(DeviceScratch::moves());
  const Mode mode = mode_;
  mode_ = Mode::Direct;
  switch (mode) {
    case Mode::Direct:
      return true;
    case Mode::Abandoned:
      return false;
    case Mode::Capturing: {
      cudaGraphExec_t graph = finish_capture();
      if (graph == nullptr) return false;
      drop_graph();
      graph_ = graph;
      graph_description_ = description_;
      launch_values_and_graph(graph_);
      return true;
    }
    case Mode::Matching:
      if (description_ != graph_description_) {
        drop_graph();
        return false;
      }
      launch_values_and_graph(graph_);
      return true;
  }
  return false;
}

void PassRecorder::cancel() {
  if (mode_ == Mode::Capturing) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(target_.stream, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // a failed capture leaves its error behind; nothing of it ran
  }
  mode_ = Mode::Direct;
}

void PassRecorder::interrupt() {
  if (mode_ == Mode::Matching) {
    mode_ = Mode::Abandoned;
  } else if (mode_ == Mode::Capturing) {
    // What was captured runs now and is not kept: a pass that needs a transfer midway is not launched again.
    mode_ = Mode::Direct;
    cudaGraphExec_t partial = finish_capture();
    if (partial == nullptr) {
      throw Error("cuda backend: recording the forward pass as a CUDA graph failed (--graphs off avoids it)");
    }
    launch_values_and_graph(partial);
    SPARROW_CUDA_CHECK(cudaStreamSynchronize(target_.stream));
    SPARROW_CUDA_CHECK(cudaGraphExecDestroy(partial));
  }
}

const int32_t* PassRecorder::values(const int32_t* values, int n) {
  if (mode_ == Mode::Direct) return nullptr;
  if (mode_ == Mode::Abandoned) return device_values_;  // nothing of the pass runs
  const int slot = int(values_.size());
  if (n < 0 || slot + n > kMaxStepValues) {
    interrupt();
    return mode_ == Mode::Abandoned ? device_values_ : nullptr;
  }
  values_.insert(values_.end(), values, values + n);
  describe(slot, n);
  return device_values_ + slot;
}

const int32_t* PassRecorder::value(int32_t v) {
  if (mode_ == Mode::Capturing || mode_ == Mode::Matching) {
    const auto same = [v](const std::pair<int32_t, int>& p) { return p.first == v; };
    const auto it = std::find_if(position_slots_.begin(), position_slots_.end(), same);
    if (it != position_slots_.end()) {
      describe(it->second, 1);
      return device_values_ + it->second;
    }
  }
  const int slot = int(values_.size());
  const int32_t* at = values(&v, 1);
  if (at != nullptr && (mode_ == Mode::Capturing || mode_ == Mode::Matching)) position_slots_.emplace_back(v, slot);
  return at;
}

cudaGraphExec_t PassRecorder::finish_capture() {
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(target_.stream, &graph) != cudaSuccess || graph == nullptr) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  const bool instantiated = cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  cudaGraphDestroy(graph);
  if (!instantiated) {
    cudaGetLastError();
    return nullptr;
  }
  return exec;
}

void PassRecorder::launch_values_and_graph(cudaGraphExec_t graph) {
  write_inline_ints(target_, values_.data(), int(values_.size()), device_values_);
  SPARROW_CUDA_CHECK(cudaGraphLaunch(graph, target_.stream));
}

void PassRecorder::drop_graph() {
  if (graph_ != nullptr) cudaGraphExecDestroy(graph_);
  graph_ = nullptr;
  graph_description_.clear();
}

}  // namespace sparrow::cuda
