#pragma once
// Forward passes recorded as CUDA graphs that are captured once and launched again for every later pass of the
// same shape (Backend::begin_pass, docs/cuda.md "Decode graphs").
//
// A decode step's kernels differ from the previous step's only in the token ids and positions. Those reach the
// kernels through a small device buffer (step values) instead of kernel arguments, so the graph captured for one
// step is the graph of the next: the backend's ops then only describe themselves (their arguments, the
// scratch they use), and when the description matches the captured pass, the pass costs one small kernel that
// writes the step values and one graph launch, instead of capturing and updating a thousand kernel nodes.
//
// Modes of a pass:
//  - direct: not recorded; ops launch as they come, with their step values as kernel arguments.
//  - capturing: no graph is held; the stream is captured and the ops' descriptions kept with the graph.
//  - matching: a graph is held; ops describe themselves and launch nothing. end() launches the graph if the
//    descriptions equal the held ones; otherwise it drops the graph and returns false (the caller runs the pass
//    again, directly), and the next recorded pass captures a new one.
//  - abandoned: a matching pass met something a recording cannot hold (interrupt(), too many step values); end()
//    returns false, keeping the graph.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/elementwise.h"

namespace sparrow::cuda {

class PassRecorder {
 public:
  // Step values a pass may hold (kernel arguments of the kernel that writes them: 1 KiB).
  static constexpr int kMaxStepValues = kInlineInts;

  explicit PassRecorder(const LaunchTarget& target);
  ~PassRecorder();
  PassRecorder(const PassRecorder&) = delete;
  PassRecorder& operator=(const PassRecorder&) = delete;

  void begin(bool record);
  // Ends the pass: launches its graph (captured now or held) after the kernel that writes its step values. False
  // when nothing of the pass ran (see the modes above).
  bool end();
  // Drops an unfinished pass after an error (its capture too); the held graph stays.
  void cancel();
  // Before what a recording cannot hold (a transfer, an allocation, a wait): a capturing pass launches what it
  // captured so far and goes on directly; a matching pass is abandoned (nothing of it ran, end() returns false).
  void interrupt();

  // Whether ops launch their kernels (direct, capturing) or only describe themselves (matching, abandoned).
  bool launching() const { return mode_ == Mode::Direct || mode_ == Mode::Capturing; }

  // Adds to the pass's description everything an op's launches depend on besides step values: its arguments
  // (scalars and pointers, each passed on its own so that no padding byte enters the comparison).
  template <class... Fields>
  void describe(const Fields&... fields) {
    if (mode_ == Mode::Direct) return;
    (append(fields), ...);
  }

  // In a recorded pass: device memory that holds values[0..n) (token ids, positions) when the pass's kernels
  // run. Null in a direct pass, where kernels take the values as arguments, and when a capturing pass had no
  // room left (it then went on directly, see interrupt()).
  const int32_t* values(const int32_t* values, int n);
  // One position; ops that ask for the same value in one pass share its slot.
  const int32_t* value(int32_t v);

 private:
  enum class Mode { Direct, Capturing, Matching, Abandoned };

  template <class T>
  void append(const T& field) {
    static_assert(std::is_scalar_v<T>, "describe scalars and pointers one by one");
    const size_t at = description_.size();
    description_.resize(at + sizeof(T));
    std::memcpy(description_.data() + at, &field, sizeof(T));
  }
  // Ends the capture and instantiates its graph; null when either failed.
  cudaGraphExec_t finish_capture();
  void launch_values_and_graph(cudaGraphExec_t graph);
  void drop_graph();

  LaunchTarget target_;
  Mode mode_ = Mode::Direct;
  int32_t* device_values_ = nullptr;   // kMaxStepValues
  std::vector<int32_t> values_;        // this pass's step values, in slot order
  std::vector<std::pair<int32_t, int>> position_slots_;  // value() of this pass: position, slot
  std::vector<uint8_t> description_;   // this pass's
  cudaGraphExec_t graph_ = nullptr;    // the held graph, or null
  std::vector<uint8_t> graph_description_;
};

}  // namespace sparrow::cuda
