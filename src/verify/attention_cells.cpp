// Attention cells: random K, V and Q from fixed seeds, K and V encoded by each codec's REFERENCE encode into
// the head-major KV layout, the backend's attention over those blocks, and float64 softmax attention over the
// REFERENCE-decoded vectors as the expectation (see attention_cells.h).
//
// Cost is dominated by the reference codecs (the QJL, TurboQuant-IP and trellis references take 1-3 ms per
// vector at d = 512), so encodings are shared as widely as the checks allow: per head dim there is one pool of
// kPoolVectors random vectors, each codec encodes and decodes it once, and every cell of every pair reads its
// K and V blocks from that pool (see pool_index). The softmax weights of a cell depend on the K codec only, so
// they are computed once and reused by every V codec.
#include "verify/attention_cells.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "cpu/thread_pool.h"
#include "formats/kv/seeded_random.h"
#include "util/error.h"
#include "verify/fixture.h"

namespace sparrow::verify {
namespace {

using formats::KvCodec;
using formats::KvCodecInfo;

constexpr double kNotRun = std::numeric_limits<double>::quiet_NaN();
constexpr uint64_t kSeed = 0xA77E'4710'4CE1'15ull;
constexpr int kMaxQueries = 4;  // query tokens per cell: the last min(n_kv, 4) positions
// Rows (t, h) with t + h odd get queries this much larger: softmax logits of standard deviation 4 instead of
// 1, so some rows are dominated by a few keys (the regime where a float32 softmax loses the most).
constexpr float kHotQueryGain = 4.0f;
// Distinct random vectors per head dim. Prime and above 512, so cells up to n_kv = 512 see distinct keys and
// values everywhere, and a 4097-key cell repeats each vector ~4 times at offsets no power-of-two tile matches.
constexpr int kPoolVectors = 1021;

// The pool vector at `position` of KV head `kv_head`, for keys or for values: heads and K/V are offset from
// each other, so a kernel that reads the wrong head, or K for V, reads other vectors.
int pool_index(int64_t position, int kv_head, bool value) {
  return int((position + int64_t(kv_head) * (kPoolVectors / 2) + (value ? kPoolVectors / 3 : 0)) % kPoolVectors);
}

// One cell's geometry.
struct Geometry {
  HeadGroup heads;
  int n_kv = 0;
  Mask mask = Mask::Causal;
  int head_dim = 0;
  int n_tokens() const { return std::min(n_kv, kMaxQueries); }
  int first_position() const { return n_kv - n_tokens(); }
  int sliding_window() const { return mask == Mask::Windowed ? std::max(1, n_kv / 3) : 0; }
  int rows() const { return n_tokens() * heads.n_heads; }
  int kv_head(int head) const { return head / (heads.n_heads / heads.n_kv_heads); }
  int first_visible(int position) const {
    return mask == Mask::Windowed ? std::max(0, position - sliding_window() + 1) : 0;
  }
  // Windowed: a ring of window + n_tokens slots, as the KV cache holds sliding layers (window + batch).
  // Causal: the whole shared buffer of `max_kv` slots, so keys after the queries are really there.
  int64_t capacity(int max_kv) const {
    return mask == Mask::Windowed ? int64_t(sliding_window()) + n_tokens() : max_kv;
  }
  float scale() const { return 1.0f / std::sqrt(float(head_dim)); }
};

// A codec's reference encoding of the pool of one head dim, and the reference decode of those blocks.
struct EncodedPool {
  int head_dim = 0;
  size_t block_bytes = 0;
  std::vector<uint8_t> blocks;  // kPoolVectors x block_bytes
  std::vector<float> decoded;   // kPoolVectors x head_dim
  const uint8_t* block(int i) const { return blocks.data() + size_t(i) * block_bytes; }
  const float* vector(int i) const { return decoded.data() + size_t(i) * head_dim; }
};

std::vector<float> random_pool(int d) {
  formats::SeededRandom rng(kSeed + uint64_t(d));
  std::vector<float> x(size_t(kPoolVectors) * d);
  for (float& v : x) v = float(rng.normal());
  return x;
}

EncodedPool encode_pool(const KvCodecInfo& info, const std::vector<float>& pool, int d, cpu::ThreadPool& threads) {
  EncodedPool e;
  e.head_dim = d;
  e.block_bytes = info.block_bytes(d);
  e.blocks.resize(size_t(kPoolVectors) * e.block_bytes);
  e.decoded.resize(size_t(kPoolVectors) * d);
  threads.parallel_for(kPoolVectors, [&](int64_t i, int) {
    info.reference->encode(pool.data() + size_t(i) * d, d, e.blocks.data() + size_t(i) * e.block_bytes);
    info.reference->decode(e.block(int(i)), d, e.decoded.data() + size_t(i) * d);
  });
  return e;
}

// n_kv_heads x capacity blocks in the layout of KvLayerView: slot s of head h holds the latest position
// below n_kv stored there (position p lives in slot p % capacity), or, where no such position exists yet,
// position s (a future key, which attention must never read).
std::vector<uint8_t> kv_blocks(const EncodedPool& pool, bool value, int n_kv_heads, int64_t capacity, int n_kv) {
  std::vector<uint8_t> out(size_t(n_kv_heads) * capacity * pool.block_bytes);
  for (int h = 0; h < n_kv_heads; ++h) {
    for (int64_t s = 0; s < capacity; ++s) {
      const int64_t position = s < n_kv ? s + (n_kv - 1 - s) / capacity * capacity : s;
      std::memcpy(out.data() + (size_t(h) * capacity + s) * pool.block_bytes,
                  pool.block(pool_index(position, h, value)), pool.block_bytes);
    }
  }
  return out;
}

uint64_t geometry_seed(const Geometry& g) {
  return kSeed ^ (uint64_t(g.heads.n_heads) << 8) ^ (uint64_t(g.heads.n_kv_heads) << 16) ^ (uint64_t(g.n_kv) << 24) ^
         (uint64_t(g.mask) << 40) ^ (uint64_t(g.head_dim) << 44);
}

// q[n_tokens][n_heads][d], N(0, 1), "hot" rows scaled by kHotQueryGain.
std::vector<float> random_queries(const Geometry& g) {
  formats::SeededRandom rng(geometry_seed(g));
  const int d = g.head_dim;
  std::vector<float> q(size_t(g.rows()) * d);
  for (int r = 0; r < g.rows(); ++r) {
    const int t = r / g.heads.n_heads, h = r % g.heads.n_heads;
    const float gain = (t + h) % 2 == 1 ? kHotQueryGain : 1.0f;
    for (int i = 0; i < d; ++i) q[size_t(r) * d + i] = gain * float(rng.normal());
  }
  return q;
}

// Softmax weights of one query row (token t, head h) over the keys it sees, first_key .. first_key + size - 1.
struct RowWeights {
  int first_key = 0;
  std::vector<double> w;
};

// float64 softmax of scale * q.k over the reference-decoded keys.
std::vector<RowWeights> reference_weights(const Geometry& g, const std::vector<float>& q, const EncodedPool& keys,
                                          cpu::ThreadPool& threads) {
  const int d = g.head_dim;
  std::vector<RowWeights> rows(g.rows());
  threads.parallel_for(g.rows(), [&](int64_t r, int) {
    const int position = g.first_position() + int(r) / g.heads.n_heads;
    const int kv_head = g.kv_head(int(r) % g.heads.n_heads);
    const float* qr = q.data() + size_t(r) * d;
    RowWeights& row = rows[r];
    row.first_key = g.first_visible(position);
    row.w.resize(position - row.first_key + 1);
    for (size_t j = 0; j < row.w.size(); ++j) {
      const float* k = keys.vector(pool_index(row.first_key + int(j), kv_head, false));
      double dot = 0;
      for (int i = 0; i < d; ++i) dot += double(qr[i]) * k[i];
      row.w[j] = double(g.scale()) * dot;
    }
    const double max_logit = *std::max_element(row.w.begin(), row.w.end());
    double sum = 0;
    for (double& w : row.w) sum += (w = std::exp(w - max_logit));
    for (double& w : row.w) w /= sum;
  });
  return rows;
}

// The outcome of one row: its largest error relative to max|v^| of the values it sees, and the first element
// out of tolerance (-1: none).
struct RowCheck {
  double err = 0;
  int bad = -1;
  float got = 0;
  double want = 0;
};

RowCheck check_row(const Geometry& g, int r, const RowWeights& weights, const EncodedPool& values, const float* got) {
  const int d = g.head_dim, kv_head = g.kv_head(r % g.heads.n_heads);
  std::vector<double> want(d, 0.0);
  double v_max = 0;
  for (size_t j = 0; j < weights.w.size(); ++j) {
    const float* v = values.vector(pool_index(weights.first_key + int(j), kv_head, true));
    for (int i = 0; i < d; ++i) {
      want[i] += weights.w[j] * v[i];
      v_max = std::max(v_max, double(std::fabs(v[i])));
    }
  }
  RowCheck c;
  for (int i = 0; i < d; ++i) {
    const double diff = std::fabs(double(got[i]) - want[i]);
    const double err = diff == 0.0 ? 0.0 : std::isnan(diff) ? std::numeric_limits<double>::infinity() : diff / v_max;
    if (!(err <= kAttentionTolerance) && c.bad < 0) {
      c.bad = i;
      c.got = got[i];
      c.want = want[i];
    }
    c.err = std::max(c.err, err);
  }
  return c;
}

// What a cell needs of one side (K or V): the codec, its pool encoding and the blocks the kernel reads.
struct Side {
  const KvCodecInfo* info = nullptr;
  const EncodedPool* pool = nullptr;
  std::vector<uint8_t>* blocks = nullptr;
};

void run_backend(sparrow::Backend& backend, const Geometry& g, int64_t capacity, const std::vector<float>& q,
                 const Side& k, const Side& v, std::vector<float>& out) {
  out.assign(size_t(g.rows()) * g.head_dim, 0.0f);
  AttentionArgs args;
  args.q = q.data();
  args.out = out.data();
  args.n_tokens = g.n_tokens();
  args.n_heads = g.heads.n_heads;
  args.first_position = g.first_position();
  args.sliding_window = g.sliding_window();
  args.scale = g.scale();
  args.kv = KvLayerView{k.info->codec, v.info->codec,      k.blocks->data(), v.blocks->data(),
                        capacity,      g.heads.n_kv_heads, g.head_dim};
  attention(backend, args);
}

void run_cell(AttentionCell& cell, sparrow::Backend& backend, const Geometry& g, int64_t capacity,
              const std::vector<float>& q, const std::vector<RowWeights>& weights, const Side& k, const Side& v, cpu::ThreadPool& threads) {
  cell.total = g.rows();
  cell.status = CellStatus::Failed;
  std::vector<float> out;
  try {
    run_backend(backend, g, capacity, q, k, v, out);
  } catch (const std::exception& e) {
    cell.note = e.what();
    return;
  }
  std::vector<RowCheck> checks(g.rows());
  threads.parallel_for(g.rows(), [&](int64_t r, int) {
    checks[r] = check_row(g, int(r), weights[r], *v.pool, out.data() + size_t(r) * g.head_dim);
  });
  cell.max_err = 0;
  for (int r = 0; r < g.rows(); ++r) {
    const RowCheck& c = checks[r];
    if (!(c.err <= cell.max_err)) cell.max_err = c.err;
    if (c.bad < 0) {
      ++cell.passed;
    } else if (cell.note.empty()) {
      char what[200];
      std::snprintf(what, sizeof what, "token %d head %d element %d: got %.9g, reference %.9g (error %.2g max|v|)",
                    r / g.heads.n_heads, r % g.heads.n_heads, c.bad, double(c.got), c.want, c.err);
      cell.note = what;
    }
  }
  if (cell.passed == cell.total) cell.status = CellStatus::Passed;
}

// The pair's cells cycle through the head dims instead of crossing them: a full cross would be 4x the cells
// and time. Each pair still covers every head dim (10 cells each), and the offset by the K codec gives every
// heads x n_kv x mask geometry every head dim somewhere in the matrix. Fixed by the codec, not by its place in
// a --codec selection, so a cell means the same thing in every run.
int cell_head_dim(int shape_index, KvCodec k_codec) {
  return kHeadDims[size_t(shape_index + int(k_codec)) % kHeadDims.size()];
}

std::vector<Geometry> pair_geometries(const AttentionShapes& shapes, KvCodec k_codec) {
  std::vector<Geometry> out;
  for (const HeadGroup& heads : shapes.heads) {
    for (int n_kv : shapes.n_kv) {
      for (Mask mask : shapes.masks) {
        out.push_back({heads, n_kv, mask, cell_head_dim(int(out.size()), k_codec)});
      }
    }
  }
  return out;
}

void check_shapes(const AttentionShapes& shapes) {
  for (const HeadGroup& h : shapes.heads) {
    if (h.n_kv_heads <= 0 || h.n_heads <= 0 || h.n_heads % h.n_kv_heads != 0)
      throw Error("verify: attention heads " + std::to_string(h.n_heads) + "/" + std::to_string(h.n_kv_heads) +
                  " are not a grouped-query layout");
  }
  for (int n : shapes.n_kv) {
    if (n <= 0) throw Error("verify: attention n_kv must be positive, got " + std::to_string(n));
  }
}

// The cells of one pair before running: missing (backend unavailable), failed (no reference ops), or to run:
// failed with total = 0 until they pass.
std::vector<AttentionCell> planned_cells(const KvCodecInfo& k, const KvCodecInfo& v,
                                         const AttentionShapes& shapes, const std::string& unavailable) {
  std::vector<AttentionCell> out;
  for (const Geometry& g : pair_geometries(shapes, k.codec)) {
    AttentionCell c;
    c.k_codec = std::string(k.name);
    c.v_codec = std::string(v.name);
    c.n_heads = g.heads.n_heads;
    c.n_kv_heads = g.heads.n_kv_heads;
    c.n_kv = g.n_kv;
    c.mask = g.mask;
    c.head_dim = g.head_dim;
    c.max_err = kNotRun;
    if (!unavailable.empty()) {
      c.note = unavailable;
    } else if (k.reference == nullptr || v.reference == nullptr) {
      c.status = CellStatus::Failed;
      c.note = "no reference ops for " + (k.reference == nullptr ? c.k_codec : c.v_codec);
    } else {
      c.status = CellStatus::Failed;
    }
    out.push_back(c);
  }
  return out;
}

bool runnable(const AttentionCell& c) { return c.status == CellStatus::Failed && c.note.empty(); }

// Every pool encoding one head dim needs, with the causal (full-length) K and V buffers built from them.
class HeadDimData {
 public:
  HeadDimData(int d, int max_kv, int max_kv_heads) : d_(d), max_kv_(max_kv), max_kv_heads_(max_kv_heads) {}

  const EncodedPool& pool(const KvCodecInfo& info, cpu::ThreadPool& threads) {
    auto it = pools_.find(info.codec);
    if (it == pools_.end()) {
      if (vectors_.empty()) vectors_ = random_pool(d_);
      it = pools_.emplace(info.codec, encode_pool(info, vectors_, d_, threads)).first;
    }
    return it->second;
  }
  // The buffer causal cells read: max_kv slots per KV head, slot p holding position p.
  std::vector<uint8_t>& causal_blocks(const KvCodecInfo& info, bool value, cpu::ThreadPool& threads) {
    auto& slot = causal_[{info.codec, value}];
    if (slot.empty()) slot = kv_blocks(pool(info, threads), value, max_kv_heads_, max_kv_, max_kv_);
    return slot;
  }
  void drop_causal_keys(KvCodec codec) { causal_.erase({codec, false}); }

 private:
  int d_, max_kv_, max_kv_heads_;
  std::vector<float> vectors_;
  std::map<KvCodec, EncodedPool> pools_;
  std::map<std::pair<KvCodec, bool>, std::vector<uint8_t>> causal_;
};

// The blocks one side of a cell reads: the shared causal buffer, or a ring built for this windowed cell.
std::vector<uint8_t>* cell_blocks(HeadDimData& data, const KvCodecInfo& info, bool value, const Geometry& g, int max_kv,
                                  std::vector<uint8_t>& ring, cpu::ThreadPool& threads) {
  if (g.mask == Mask::Causal) return &data.causal_blocks(info, value, threads);
  ring = kv_blocks(data.pool(info, threads), value, g.heads.n_kv_heads, g.capacity(max_kv), g.n_kv);
  return &ring;
}

}  // namespace

std::string_view mask_name(Mask mask) { return mask == Mask::Causal ? "causal" : "windowed"; }

std::vector<AttentionCell> run_attention_cells(const Target& target, std::span<const KvCodecInfo> codecs,
                                               const AttentionShapes& shapes) {
  check_shapes(shapes);
  std::vector<const KvCodecInfo*> keys, values;
  for (const KvCodecInfo& info : codecs) {
    keys.push_back(&info);
    if (!info.keys_only) values.push_back(&info);
  }
  const std::string& unavailable = target.unavailable;
  std::vector<AttentionCell> cells;
  for (const KvCodecInfo* k : keys) {
    for (const KvCodecInfo* v : values) {
      const std::vector<AttentionCell> pair = planned_cells(*k, *v, shapes, unavailable);
      cells.insert(cells.end(), pair.begin(), pair.end());
    }
  }
  if (!unavailable.empty() || cells.empty()) return cells;

  const int max_kv = *std::max_element(shapes.n_kv.begin(), shapes.n_kv.end());
  int max_kv_heads = 0;
  for (const HeadGroup& h : shapes.heads) max_kv_heads = std::max(max_kv_heads, h.n_kv_heads);
  const size_t per_pair = size_t(shapes.cells_per_pair());
  cpu::ThreadPool threads(0);
  // One head dim at a time, so only its encodings are held.
  for (int d : kHeadDims) {
    HeadDimData data(d, max_kv, max_kv_heads);
    for (size_t ki = 0; ki < keys.size(); ++ki) {
      const std::vector<Geometry> geometries = pair_geometries(shapes, keys[ki]->codec);
      for (size_t s = 0; s < geometries.size(); ++s) {
        const Geometry& g = geometries[s];
        if (g.head_dim != d) continue;
        auto cell_at = [&](size_t vi) -> AttentionCell& { return cells[(ki * values.size() + vi) * per_pair + s]; };
        std::optional<std::vector<RowWeights>> weights;  // computed only if some V codec runs this cell
        std::vector<float> q;
        std::vector<uint8_t> k_ring, v_ring;
        Side k{keys[ki], nullptr, nullptr};
        for (size_t vi = 0; vi < values.size(); ++vi) {
          AttentionCell& cell = cell_at(vi);
          if (!runnable(cell)) continue;
          try {
            if (!weights) {
              k.pool = &data.pool(*keys[ki], threads);
              k.blocks = cell_blocks(data, *keys[ki], false, g, max_kv, k_ring, threads);
              q = random_queries(g);
              weights = reference_weights(g, q, *k.pool, threads);
            }
            Side v{values[vi], &data.pool(*values[vi], threads), nullptr};
            v.blocks = cell_blocks(data, *values[vi], true, g, max_kv, v_ring, threads);
            run_cell(cell, *target.backend, g, g.capacity(max_kv), q, *weights, k, v, threads);
          } catch (const std::exception& e) {
            cell.status = CellStatus::Failed;
            cell.note = e.what();
          }
        }
      }
      data.drop_causal_keys(keys[ki]->codec);  // V buffers stay: every K codec reads them
    }
  }
  return cells;
}

namespace {

// "passed/cells max_err" over the cells of one pair at one head dim.
std::string pair_column(const std::vector<const AttentionCell*>& cells) {
  if (cells.empty()) return "-";
  int passed = 0;
  double max_err = 0;
  bool all_missing = true;
  for (const AttentionCell* c : cells) {
    passed += c->status == CellStatus::Passed;
    all_missing = all_missing && c->status == CellStatus::Missing;
    if (!(c->max_err <= max_err)) max_err = c->max_err;
  }
  if (all_missing) return "missing";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s%d/%zu %.1e", passed == int(cells.size()) ? "" : "FAIL ", passed, cells.size(),
                max_err);
  return buf;
}

std::string padded(std::string s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

std::string describe(const AttentionCell& c) {
  return c.k_codec + "/" + c.v_codec + " heads " + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) +
         " n_kv=" + std::to_string(c.n_kv) + " " + std::string(mask_name(c.mask)) + " d=" + std::to_string(c.head_dim);
}

}  // namespace

std::string format_attention_cells(const std::vector<AttentionCell>& cells) {
  constexpr size_t kNotesShown = 20;
  std::ostringstream out;
  out << "attention (K codec x V codec; cells passed and max_err per head dim, in units of max|v|; tolerance "
      << kAttentionTolerance << "):\n";
  std::string header = padded("k", 8) + padded("v", 8);
  for (int d : kHeadDims) header += padded("d=" + std::to_string(d), 18);
  while (header.back() == ' ') header.pop_back();
  out << header << "\n";
  for (size_t i = 0; i < cells.size();) {
    size_t end = i;
    while (end < cells.size() && cells[end].k_codec == cells[i].k_codec && cells[end].v_codec == cells[i].v_codec)
      ++end;
    std::string row = padded(cells[i].k_codec, 8) + padded(cells[i].v_codec, 8);
    for (int d : kHeadDims) {
      std::vector<const AttentionCell*> at_d;
      for (size_t j = i; j < end; ++j)
        if (cells[j].head_dim == d) at_d.push_back(&cells[j]);
      row += padded(pair_column(at_d), 18);
    }
    while (row.back() == ' ') row.pop_back();
    out << row << "\n";
    i = end;
  }
  auto count = [&](CellStatus s) {
    return std::count_if(cells.begin(), cells.end(), [&](const AttentionCell& c) { return c.status == s; });
  };
  out << cells.size() << " attention cells: " << count(CellStatus::Passed) << " passed, " << count(CellStatus::Failed)
      << " failed, " << count(CellStatus::Missing) << " missing\n";
  size_t shown = 0, not_passed = 0;
  for (const AttentionCell& c : cells) {
    if (c.status == CellStatus::Passed) continue;
    if (++not_passed > kNotesShown) continue;
    out << "  " << describe(c) << ": " << status_name(c.status) << ": " << c.note << "\n";
    ++shown;
  }
  if (not_passed > shown) out << "  ... and " << not_passed - shown << " more cells that did not pass\n";
  return out.str();
}

}  // namespace sparrow::verify
