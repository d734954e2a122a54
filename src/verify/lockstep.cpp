#include "verify/lockstep.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <vector>

#include "ops/gelu.h"
#include "util/error.h"

namespace sparrow::verify {

// Places every weight on both sides; the model holds the test side's, and the lockstep maps them back.
class LockstepWeightStore final : public WeightStore {
 public:
  explicit LockstepWeightStore(Lockstep& lockstep) : lockstep_(lockstep) {}
  WeightMatrix place(const WeightMatrix& host, bool on_device, WeightUse use) override {
    WeightMatrix test = lockstep_.test_store_->place(host, on_device, use);
    const WeightMatrix reference = lockstep_.reference_store_->place(host, on_device, use);
    lockstep_.remember(test.data, reference.data, tensor_row_bytes(host.type, host.n_in) * size_t(host.n_out));
    lockstep_.reference_matrices_[test.data] = reference;
    return test;
  }
  const float* place_floats(const float* host, size_t n) override {
    const float* test = lockstep_.test_store_->place_floats(host, n);
    lockstep_.remember(test, lockstep_.reference_store_->place_floats(host, n), n * sizeof(float));
    return test;
  }
  size_t device_bytes() const override { return lockstep_.test_store_->device_bytes(); }
  std::string describe() const override {
    return lockstep_.test_store_->describe() + " (in lockstep with " + lockstep_.reference_store_->describe() + ")";
  }

 private:
  Lockstep& lockstep_;
};

// Every op on both sides; see lockstep.h.
class LockstepBackend final : public Backend {
 public:
  explicit LockstepBackend(Lockstep& lockstep)
      : l_(lockstep), test_(*lockstep.test_), ref_(*lockstep.reference_) {}
  const char* name() const override { return "lockstep"; }

  float* alloc(size_t n) override { return static_cast<float*>(alloc_bytes(n * sizeof(float))); }
  void* alloc_bytes(size_t n) override {
    void* test = test_.alloc_bytes(n);
    l_.remember(test, ref_.alloc_bytes(n), n);
    return test;
  }
  void free_buffer(void* p) override {
    if (p == nullptr) return;
    ref_.free_buffer(l_.reference_of(p));
    l_.forget(p);
    test_.free_buffer(p);
  }
  void read(const float* src, float* host_dst, size_t n) override { test_.read(src, host_dst, n); }
  void write(float* dst, const float* host_src, size_t n) override {
    test_.write(dst, host_src, n);
    ref_.write(l_.reference_of(dst), host_src, n);
  }
  void read_bytes(const void* src, void* host_dst, size_t n) override { test_.read_bytes(src, host_dst, n); }
  void write_bytes(void* dst, const void* host_src, size_t n) override {
    test_.write_bytes(dst, host_src, n);
    ref_.write_bytes(l_.reference_of(dst), host_src, n);
  }
  size_t memory_capacity() const override { return std::min(test_.memory_capacity(), ref_.memory_capacity()); }

  void matmul(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y) override {
    ref_.matmul(l_.reference_of(w), l_.reference_of(x), n_tokens, l_.reference_of(y));
    test_.matmul(w, x, n_tokens, y);
    l_.compare_and_force("matmul " + std::string(tensor_type_name(w.type)) + " " + std::to_string(w.n_in) + "x" +
                             std::to_string(w.n_out) + (n_tokens > 1 ? " batch" : " single"),
                         y, size_t(n_tokens * w.n_out));
  }
  void matmuls(const float* x, int64_t n_tokens, std::span<const MatmulTarget> targets) override {
    std::vector<MatmulTarget> ref_targets;
    for (const MatmulTarget& t : targets) ref_targets.push_back({l_.reference_of(t.w), l_.reference_of(t.y)});
    ref_.matmuls(l_.reference_of(x), n_tokens, ref_targets);
    test_.matmuls(x, n_tokens, targets);
    for (const MatmulTarget& t : targets) {
      l_.compare_and_force("matmuls " + std::string(tensor_type_name(t.w.type)) + " " + std::to_string(t.w.n_in) +
                               "x" + std::to_string(t.w.n_out) + (n_tokens > 1 ? " batch" : " single"),
                           t.y, size_t(n_tokens * t.w.n_out));
    }
  }
  void gated_matmul(const float* x, int64_t n_tokens, const GatedProduct& p, float* y) override {
    GatedProduct ref = p;
    ref.gate = l_.reference_of(p.gate);
    const WeightMatrix ref_up = p.up ? l_.reference_of(*p.up) : WeightMatrix{};
    if (p.up) ref.up = &ref_up, ref.up_y = l_.reference_of(p.up_y);
    if (p.mul) ref.mul = l_.reference_of(p.mul);
    ref_.gated_matmul(l_.reference_of(x), n_tokens, ref, l_.reference_of(y));
    test_.gated_matmul(x, n_tokens, p, y);
    const std::string name = "gated_matmul " + std::string(tensor_type_name(p.gate.type)) + " " +
                             std::to_string(p.gate.n_in) + "x" + std::to_string(p.gate.n_out) +
                             (p.up ? " (times up)" : " (times rows)") + (n_tokens > 1 ? " batch" : " single");
    l_.compare_and_force(name, y, size_t(n_tokens * p.gate.n_out), gelu_step_allowance(name, x, n_tokens, p, ref));
  }
  void embed(const WeightMatrix& w, const int32_t* ids, int64_t n_ids, float scale, float* out) override {
    ref_.embed(l_.reference_of(w), ids, n_ids, scale, l_.reference_of(out));
    test_.embed(w, ids, n_ids, scale, out);
    l_.compare_and_force("embed " + std::string(tensor_type_name(w.type)), out, size_t(n_ids * w.n_in));
  }
  void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y) override {
    ref_.rms_norm(l_.reference_of(x), weight ? l_.reference_of(weight) : nullptr, n_rows, dim, eps,
                  l_.reference_of(y));
    test_.rms_norm(x, weight, n_rows, dim, eps, y);
    l_.compare_and_force("rms_norm dim " + std::to_string(dim), y, size_t(n_rows * dim));
  }
  void add_rms_norm(float* x, float* r, const float* r_weight, int64_t n_rows, int64_t dim, float eps,
                    const float* next_weight, float* next, float x_scale) override {
    ref_.add_rms_norm(l_.reference_of(x), l_.reference_of(r), r_weight ? l_.reference_of(r_weight) : nullptr,
                      n_rows, dim, eps, next_weight ? l_.reference_of(next_weight) : nullptr,
                      next ? l_.reference_of(next) : nullptr, x_scale);
    test_.add_rms_norm(x, r, r_weight, n_rows, dim, eps, next_weight, next, x_scale);
    const size_t n = size_t(n_rows * dim);
    const std::string what = "add_rms_norm dim " + std::to_string(dim);
    l_.compare_and_force(what + " (block)", r, n);
    l_.compare_and_force(what + " (sum)", x, n);
    if (next) l_.compare_and_force(what + " (next input)", next, n);
  }
  void matmul_residual(const WeightMatrix& w, const float* in, int64_t n_tokens, float* r,
                       const ResidualStep& step) override {
    ResidualStep ref = step;
    ref.x = l_.reference_of(step.x);
    if (step.r_weight) ref.r_weight = l_.reference_of(step.r_weight);
    if (step.next_weight) ref.next_weight = l_.reference_of(step.next_weight);
    if (step.next) ref.next = l_.reference_of(step.next);
    ref_.matmul_residual(l_.reference_of(w), l_.reference_of(in), n_tokens, l_.reference_of(r), ref);
    test_.matmul_residual(w, in, n_tokens, r, step);
    const size_t n = size_t(n_tokens * w.n_out);
    const std::string what = "matmul_residual " + std::string(tensor_type_name(w.type)) + " " +
                             std::to_string(w.n_in) + "x" + std::to_string(w.n_out) +
                             (n_tokens > 1 ? " batch" : " single");
    l_.compare_and_force(what + " (block)", r, n);
    l_.compare_and_force(what + " (sum)", step.x, n);
    if (step.next) l_.compare_and_force(what + " (next input)", step.next, n);
  }
  void rms_norm_rope(std::span<const HeadTensor> tensors, float eps, int64_t n_tokens, int32_t head_dim,
                     int32_t first_position, const RopeParams& params) override {
    RopeParams ref_params = params;
    if (params.freq_divisors) ref_params.freq_divisors = l_.reference_of(params.freq_divisors);
    std::vector<HeadTensor> ref_tensors(tensors.begin(), tensors.end());
    for (HeadTensor& t : ref_tensors) {
      t.x = l_.reference_of(t.x);
      if (t.weight) t.weight = l_.reference_of(t.weight);
    }
    ref_.rms_norm_rope(ref_tensors, eps, n_tokens, head_dim, first_position, ref_params);
    test_.rms_norm_rope(tensors, eps, n_tokens, head_dim, first_position, params);
    for (const HeadTensor& t : tensors) {
      l_.compare_and_force("rms_norm_rope d " + std::to_string(head_dim) + (t.rotate ? "" : " (no rotation)"), t.x,
                           size_t(n_tokens * t.n_heads * head_dim));
    }
  }
  void rope(float* x, int64_t n_tokens, int32_t n_heads, int32_t head_dim, int32_t first_position,
            const RopeParams& params) override {
    RopeParams ref_params = params;
    if (params.freq_divisors) ref_params.freq_divisors = l_.reference_of(params.freq_divisors);
    ref_.rope(l_.reference_of(x), n_tokens, n_heads, head_dim, first_position, ref_params);
    test_.rope(x, n_tokens, n_heads, head_dim, first_position, params);
    l_.compare_and_force("rope d " + std::to_string(head_dim), x, size_t(n_tokens * n_heads * head_dim));
  }
  void gelu_mul(const float* gate, const float* up, int64_t n, float* y) override {
    ref_.gelu_mul(l_.reference_of(gate), up ? l_.reference_of(up) : nullptr, n, l_.reference_of(y));
    test_.gelu_mul(gate, up, n, y);
    l_.compare_and_force("gelu_mul", y, size_t(n));
  }
  void add(float* y, const float* x, int64_t n) override {
    ref_.add(l_.reference_of(y), l_.reference_of(x), n);
    test_.add(y, x, n);
    l_.compare_and_force("add", y, size_t(n));
  }
  void scale(float* y, float s, int64_t n) override {
    ref_.scale(l_.reference_of(y), s, n);
    test_.scale(y, s, n);
    l_.compare_and_force("scale", y, size_t(n));
  }
  void softcap(float* y, float cap, int64_t n) override {
    ref_.softcap(l_.reference_of(y), cap, n);
    test_.softcap(y, cap, n);
    l_.compare_and_force("softcap", y, size_t(n));
  }
  void copy(float* y, const float* x, int64_t n) override {
    ref_.copy(l_.reference_of(y), l_.reference_of(x), n);
    test_.copy(y, x, n);
    l_.compare_and_force("copy", y, size_t(n));
  }
  void mul_rows(float* y, const float* x, int64_t n_rows, int64_t row_len, int64_t x_row_stride) override {
    ref_.mul_rows(l_.reference_of(y), l_.reference_of(x), n_rows, row_len, x_row_stride);
    test_.mul_rows(y, x, n_rows, row_len, x_row_stride);
    l_.compare_and_force("mul_rows", y, size_t(n_rows * row_len));
  }
  void mean_rows(const float* x, int64_t n_rows, int64_t row_len, float* out) override {
    ref_.mean_rows(l_.reference_of(x), n_rows, row_len, l_.reference_of(out));
    test_.mean_rows(x, n_rows, row_len, out);
    l_.compare_and_force("mean_rows", out, size_t(row_len));
  }
  int32_t sample(const float* logits, int64_t n_vocab, const SamplingParams& params, float u) override {
    return test_.sample(logits, n_vocab, params, u);
  }

  void kv_store(const KvLayerView& kv, const float* k, const float* v, int64_t n_tokens,
                int32_t first_position) override {
    ref_.kv_store(l_.reference_of(kv), l_.reference_of(k), l_.reference_of(v), n_tokens, first_position);
    test_.kv_store(kv, k, v, n_tokens, first_position);
    const size_t blocks = size_t(kv.capacity) * size_t(kv.n_kv_heads);
    const auto& k_info = formats::kv_codec_info(kv.k_codec);
    const auto& v_info = formats::kv_codec_info(kv.v_codec);
    l_.compare_and_force_bytes("kv_store K " + std::string(k_info.name), kv.k, blocks * k_info.block_bytes(kv.head_dim));
    if (kv.v != kv.k)
      l_.compare_and_force_bytes("kv_store V " + std::string(v_info.name), kv.v,
                                 blocks * v_info.block_bytes(kv.head_dim));
  }
  void attention(const AttentionArgs& args) override {
    AttentionArgs ref_args = args;
    ref_args.q = l_.reference_of(args.q);
    ref_args.out = l_.reference_of(args.out);
    ref_args.kv = l_.reference_of(args.kv);
    ref_.attention(ref_args);
    test_.attention(args);
    l_.compare_and_force("attention d " + std::to_string(args.kv.head_dim) +
                             (args.sliding_window > 0 ? " sliding" : " global") +
                             (args.n_tokens > 1 ? " batch" : " single"),
                         args.out, size_t(args.n_tokens * args.n_heads * args.kv.head_dim));
  }

  // The codec ops one by one are `sparrow verify`'s; a forward pass does not call them.
  void kv_encode(formats::KvCodec, int, const float*, int64_t, uint8_t*) override { unused("kv_encode"); }
  void kv_decode(formats::KvCodec, int, const uint8_t*, int64_t, float*) override { unused("kv_decode"); }
  void kv_score(formats::KvCodec, int, const float*, int64_t, const uint8_t*, int64_t, float*) override {
    unused("kv_score");
  }
  void kv_accumulate(formats::KvCodec, int, const float*, int64_t, const uint8_t*, int64_t, float*) override {
    unused("kv_accumulate");
  }
  void kv_finish(formats::KvCodec, int, const float*, int64_t, float*) override { unused("kv_finish"); }

 private:
  // The gelu looks its input up by the input's f16 rounding (ops/gelu.h). Where the two sides' gate products
  // differ in their last bits (another summation order) across an f16 rounding boundary, their outputs differ
  // by a whole table step times the multiplier: a difference of the inputs, not an error of the op. Per
  // output, that step, |m| |gelu(g_test) - gelu(g_ref)|, from each side's gate product computed on its own
  // (recorded as an op call of its own, "... (gate product)", so its own difference is judged too) and the
  // reference's multiplier m.
  std::vector<double> gelu_step_allowance(const std::string& name, const float* x, int64_t n_tokens,
                                          const GatedProduct& p, const GatedProduct& ref) {
    const int64_t n_out = p.gate.n_out;
    const size_t n = size_t(n_tokens * n_out);
    const float* ref_x = l_.reference_of(x);
    std::vector<float> gate_test(n), gate_ref(n), m(n);
    float* test_buffer = test_.alloc(n);
    float* ref_buffer = ref_.alloc(n);
    test_.matmul(p.gate, x, n_tokens, test_buffer);
    test_.read(test_buffer, gate_test.data(), n);
    ref_.matmul(ref.gate, ref_x, n_tokens, ref_buffer);
    ref_.read(ref_buffer, gate_ref.data(), n);
    if (ref.up) {
      ref_.matmul(*ref.up, ref_x, n_tokens, ref_buffer);
      ref_.read(ref_buffer, m.data(), n);
    } else {
      for (int64_t t = 0; t < n_tokens; ++t) ref_.read(ref.mul + t * ref.mul_stride, m.data() + t * n_out, size_t(n_out));
    }
    test_.free_buffer(test_buffer);
    ref_.free_buffer(ref_buffer);
    l_.record(name + " (gate product)", gate_test, gate_ref);
    std::vector<double> allowance(n);
    for (size_t i = 0; i < n; ++i) {
      const double step = std::fabs(double(gelu_looked_up(gate_test[i])) - gelu_looked_up(gate_ref[i]));
      allowance[i] = step * std::fabs(double(m[i]));
    }
    return allowance;
  }

  [[noreturn]] static void unused(const char* op) {
    throw Error(std::string("lockstep: ") + op + " is checked by `sparrow verify`, not in lockstep");
  }
  Lockstep& l_;
  Backend& test_;
  Backend& ref_;
};

Lockstep::Lockstep(std::unique_ptr<WeightStore> test_store, std::unique_ptr<WeightStore> reference_store,
                   std::unique_ptr<Backend> test, std::unique_ptr<Backend> reference)
    : test_store_(std::move(test_store)),
      reference_store_(std::move(reference_store)),
      test_(std::move(test)),
      reference_(std::move(reference)) {}

Lockstep::~Lockstep() = default;

std::unique_ptr<WeightStore> Lockstep::make_weight_store() { return std::make_unique<LockstepWeightStore>(*this); }
std::unique_ptr<Backend> Lockstep::make_backend() { return std::make_unique<LockstepBackend>(*this); }

void Lockstep::remember(const void* test, const void* reference, size_t bytes) {
  if (test == nullptr) return;
  allocations_[reinterpret_cast<uintptr_t>(test)] = {reinterpret_cast<uintptr_t>(reference), bytes};
}

void Lockstep::forget(const void* test) { allocations_.erase(reinterpret_cast<uintptr_t>(test)); }

const void* Lockstep::reference_of(const void* test) const {
  if (test == nullptr) return nullptr;
  const uintptr_t address = reinterpret_cast<uintptr_t>(test);
  auto it = allocations_.upper_bound(address);
  if (it == allocations_.begin()) throw Error("lockstep: an address outside every known buffer");
  --it;
  const uintptr_t offset = address - it->first;
  if (offset >= std::max<size_t>(it->second.bytes, 1)) throw Error("lockstep: an address outside every known buffer");
  return reinterpret_cast<const void*>(it->second.reference + offset);
}

WeightMatrix Lockstep::reference_of(const WeightMatrix& w) const {
  const auto it = reference_matrices_.find(w.data);
  if (it == reference_matrices_.end()) throw Error("lockstep: a weight matrix that was not placed");
  return it->second;
}

KvLayerView Lockstep::reference_of(const KvLayerView& kv) const {
  KvLayerView r = kv;
  r.k = reference_of(kv.k);
  r.v = reference_of(kv.v);
  r.k_center = reference_of(kv.k_center);
  return r;
}

void Lockstep::compare_and_force(const std::string& op, float* test, size_t n, const std::vector<double>& allowance) {
  std::vector<float> a(n), b(n);
  test_->read(test, a.data(), n);
  reference_->read(reference_of(test), b.data(), n);
  record(op, a, b, allowance);
  test_->write(test, b.data(), n);
}

void Lockstep::record(const std::string& op, const std::vector<float>& test, const std::vector<float>& reference,
                      const std::vector<double>& allowance) {
  LockstepRecord r{int64_t(records_.size()), op, int64_t(test.size())};
  for (size_t i = 0; i < test.size(); ++i) {
    const float a = test[i], b = reference[i];
    if (std::isnan(a) != std::isnan(b)) r.mismatched_nan = true;
    if (std::isnan(a) || std::isnan(b)) continue;
    const double diff = std::fabs(double(a) - b), allowed = allowance.empty() ? 0.0 : allowance[i];
    r.max_abs_diff_raw = std::max(r.max_abs_diff_raw, diff);
    r.max_abs_diff = std::max(r.max_abs_diff, std::max(0.0, diff - allowed));
    r.n_excused += allowed > 0 && diff > 0;
    r.max_abs_reference = std::max(r.max_abs_reference, std::fabs(double(b)));
  }
  records_.push_back(r);
}

void Lockstep::compare_and_force_bytes(const std::string& op, void* test, size_t n) {
  std::vector<uint8_t> a(n), b(n);
  test_->read_bytes(test, a.data(), n);
  reference_->read_bytes(reference_of(test), b.data(), n);
  size_t differing = 0;
  for (size_t i = 0; i < n; ++i) differing += a[i] != b[i];
  records_.push_back({int64_t(records_.size()), op, int64_t(n), double(differing), double(n), false});
  test_->write_bytes(test, b.data(), n);
}

void Lockstep::report(std::ostream& out, int worst) const {
  struct Summary {
    int64_t calls = 0;
    double worst = 0.0, sum = 0.0;
    int64_t nan_mismatches = 0, excused = 0;
  };
  std::map<std::string, Summary> by_op;
  for (const LockstepRecord& r : records_) {
    Summary& s = by_op[r.op];
    ++s.calls;
    s.worst = std::max(s.worst, r.relative());
    s.sum += r.relative();
    s.nan_mismatches += r.mismatched_nan;
    s.excused += r.n_excused;
  }
  out << "lockstep: " << records_.size() << " op calls; relative difference = max|test - reference| / "
      << "max|reference| of one call's output (kv_store: fraction of bytes that differ); \"gelu steps\": outputs "
      << "whose difference a gelu table step of the two sides' gate products explains, left out of it\n";
  out << std::left << std::setw(44) << "op" << std::right << std::setw(7) << "calls" << std::setw(12) << "worst"
      << std::setw(12) << "mean" << std::setw(6) << "NaN" << std::setw(12) << "gelu steps" << "\n";
  for (const auto& [op, s] : by_op) {
    out << std::left << std::setw(44) << op << std::right << std::setw(7) << s.calls << std::scientific
        << std::setprecision(2) << std::setw(12) << s.worst << std::setw(12) << s.sum / double(s.calls)
        << std::setw(6) << s.nan_mismatches << std::setw(12) << s.excused << std::defaultfloat << "\n";
  }
  std::vector<const LockstepRecord*> sorted;
  for (const LockstepRecord& r : records_) sorted.push_back(&r);
  std::sort(sorted.begin(), sorted.end(),
            [](const LockstepRecord* a, const LockstepRecord* b) { return a->relative() > b->relative(); });
  out << "worst calls:\n";
  for (int i = 0; i < worst && i < int(sorted.size()); ++i) {
    const LockstepRecord& r = *sorted[size_t(i)];
    out << "  #" << r.index << "  " << r.op << "  " << std::scientific << std::setprecision(2) << r.relative()
        << " (max|diff| " << r.max_abs_diff << ", max|ref| " << r.max_abs_reference << ", " << r.n_values
        << " values";
    if (r.n_excused > 0) {
      out << "; " << r.n_excused << " at a gelu table step, max|diff| " << r.max_abs_diff_raw << " before allowing them";
    }
    out << ")" << std::defaultfloat << "\n";
  }
}

}  // namespace sparrow::verify
