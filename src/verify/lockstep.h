#pragma once
// Lockstep: one forward pass run op by op on two backends at once, to find the op where a backend under test
// parts from a reference (llama.cpp's eval-callback comparisons, done between Sparrow's own backends).
//
// The model sees only the test backend's buffers and weights; every op runs on both, with the reference's own
// copies of its inputs, and the test's output is compared with the reference's and then overwritten by it
// ("teacher forcing"), so that each op is judged on identical inputs and its error is its own, not the sum of
// everything before it. Use: a weight store and a backend from Lockstep in place of the device's (the runtime's
// ModelLoadOptions::make_store and SessionOptions::make_backend), run the model, then report().
#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "ops/backend.h"

namespace sparrow::verify {

// One op call's difference: max |test - reference| over its output, relative to max |reference|.
struct LockstepRecord {
  int64_t index = 0;  // the op's place in the run
  std::string op;     // "matmul q4_k 640x1024", "attention", ...
  int64_t n_values = 0;
  double max_abs_diff = 0.0;
  double max_abs_reference = 0.0;
  bool mismatched_nan = false;  // one side NaN where the other is not
  // Outputs whose difference an input's rounding step explains (a gelu table step, below), and the largest
  // difference before that allowance; max_abs_diff is what is left after it.
  int64_t n_excused = 0;
  double max_abs_diff_raw = 0.0;
  double relative() const { return max_abs_reference > 0 ? max_abs_diff / max_abs_reference : max_abs_diff; }
};

class Lockstep {
 public:
  // test: the backend under test (its weight store places what the model reads); reference: the one trusted.
  Lockstep(std::unique_ptr<WeightStore> test_store, std::unique_ptr<WeightStore> reference_store,
           std::unique_ptr<Backend> test, std::unique_ptr<Backend> reference);
  ~Lockstep();

  // A store and a backend that forward to both sides. The store must outlive nothing of the Lockstep's; the
  // backend must be destroyed before the Lockstep (it frees its buffers through it).
  std::unique_ptr<WeightStore> make_weight_store();
  std::unique_ptr<Backend> make_backend();

  const std::vector<LockstepRecord>& records() const { return records_; }
  // Per op name: calls, worst and mean relative difference; then the `worst` single calls.
  void report(std::ostream& out, int worst) const;

 private:
  friend class LockstepBackend;
  friend class LockstepWeightStore;
  struct Allocation {
    uintptr_t reference = 0;
    size_t bytes = 0;
  };
  // The reference's address for a test address inside a buffer or weight known to the lockstep.
  const void* reference_of(const void* test) const;
  template <typename T>
  T* reference_of(T* test) const {
    return static_cast<T*>(const_cast<void*>(reference_of(static_cast<const void*>(test))));
  }
  WeightMatrix reference_of(const WeightMatrix& w) const;
  KvLayerView reference_of(const KvLayerView& kv) const;
  void remember(const void* test, const void* reference, size_t bytes);
  void forget(const void* test);
  // Compares n floats at test (device) and its reference, records the difference, then copies the reference's
  // values over the test's. allowance (n values, or empty): per output, a difference that is not the op's
  // error and is subtracted before the difference is recorded.
  void compare_and_force(const std::string& op, float* test, size_t n, const std::vector<double>& allowance = {});
  // Records the difference of two host copies of one output (test, reference) with that allowance.
  void record(const std::string& op, const std::vector<float>& test, const std::vector<float>& reference,
              const std::vector<double>& allowance = {});
  // The same for a byte buffer (encoded KV): the difference is the fraction of bytes that differ.
  void compare_and_force_bytes(const std::string& op, void* test, size_t n);

  std::unique_ptr<WeightStore> test_store_, reference_store_;
  std::unique_ptr<Backend> test_, reference_;
  std::map<uintptr_t, Allocation> allocations_;  // by test base address
  // Placed matrices by the test side's data: the two stores may lay the same matrix out differently
  // (WeightMatrix::interleaved), so the reference's view is the one its store returned.
  std::map<const void*, WeightMatrix> reference_matrices_;
  std::vector<LockstepRecord> records_;
};

}  // namespace sparrow::verify
