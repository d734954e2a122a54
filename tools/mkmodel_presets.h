#pragma once
// Model geometries `sparrow mkmodel` can write: the published Gemma 3 / Gemma 4 shapes (../shared/spec/gemma.md,
// HF configs) and tiny ones that keep each mechanism (sliding/global layers, GQA, PLE, shared KV, k_eq_v,
// per-layer KV head counts, double-wide MLP) at a size the test suite can write in a second or two.
#include <cstdint>
#include <string>
#include <vector>

#include "util/error.h"

namespace sparrow::tools::mkmodel {

enum class Arch { Gemma3, Gemma4 };

inline const char* arch_name(Arch arch) { return arch == Arch::Gemma3 ? "gemma3" : "gemma4"; }

struct Geometry {
  Arch arch = Arch::Gemma3;
  std::string preset;
  uint32_t n_layer = 0;
  uint32_t n_embd = 0;
  uint32_t n_head = 0;
  uint32_t n_head_kv_swa = 0;   // KV heads of sliding layers
  uint32_t n_head_kv_full = 0;  // KV heads of global (full-attention) layers
  uint32_t head_dim_swa = 0;    // Gemma 3: the one head dim of every layer
  uint32_t head_dim_full = 0;
  std::vector<uint32_t> n_ff;   // per layer
  std::vector<bool> is_swa;     // per layer: true = sliding window layer
  uint32_t sliding_window = 0;  // tokens
  uint32_t context_length = 0;
  uint32_t shared_kv_layers = 0;     // Gemma 4: the last N layers reuse earlier layers' KV
  uint32_t per_layer_input_dim = 0;  // Gemma 4 PLE width P; 0 = no per-layer embeddings
  bool k_eq_v = false;               // Gemma 4: global layers have no attn_v (V is the raw K projection)
  float rope_freq_base = 1e6f;
  float rope_freq_base_swa = 1e4f;
  float final_logit_softcapping = 0;  // 0 = key absent
  float rms_eps = 1e-6f;

  uint32_t first_shared_layer() const { return n_layer - shared_kv_layers; }
  bool has_kv(uint32_t il) const { return il < first_shared_layer(); }
  uint32_t head_dim(uint32_t il) const { return is_swa[il] ? head_dim_swa : head_dim_full; }
  uint32_t n_head_kv(uint32_t il) const { return is_swa[il] ? n_head_kv_swa : n_head_kv_full; }
  bool has_attn_v(uint32_t il) const { return has_kv(il) && !(k_eq_v && !is_swa[il]); }
  // The converter writes these keys as per-layer arrays only when the values differ between layers.
  bool n_head_kv_is_array() const { return n_head_kv_swa != n_head_kv_full; }
  bool n_ff_is_array() const {
    for (uint32_t v : n_ff) if (v != n_ff[0]) return true;
    return false;
  }
};

namespace detail {

// Sliding everywhere except layers where (il % period == period - 1): Gemma's "5 sliding + 1 global" style.
inline std::vector<bool> sliding_pattern(uint32_t n_layer, uint32_t period) {
  std::vector<bool> is_swa(n_layer);
  for (uint32_t il = 0; il < n_layer; ++il) is_swa[il] = il % period != period - 1;
  return is_swa;
}

// E2B's use_double_wide_mlp: the KV-shared layers have twice the FFN width.
inline std::vector<uint32_t> double_wide_ff(uint32_t n_layer, uint32_t n_ff, uint32_t first_shared) {
  std::vector<uint32_t> ff(n_layer, n_ff);
  for (uint32_t il = first_shared; il < n_layer; ++il) ff[il] = 2 * n_ff;
  return ff;
}

// Gemma 3 in llama.cpp: the sliding pattern is hard-coded (period 6) and not written to the file.
inline Geometry gemma3(std::string preset, uint32_t n_layer, uint32_t n_embd, uint32_t n_head, uint32_t n_head_kv,
                       uint32_t n_ff, uint32_t window, uint32_t context) {
  Geometry g;
  g.arch = Arch::Gemma3;
  g.preset = std::move(preset);
  g.n_layer = n_layer;
  g.n_embd = n_embd;
  g.n_head = n_head;
  g.n_head_kv_swa = g.n_head_kv_full = n_head_kv;
  g.head_dim_swa = g.head_dim_full = 256;
  g.n_ff.assign(n_layer, n_ff);
  g.is_swa = sliding_pattern(n_layer, 6);
  g.sliding_window = window;
  g.context_length = context;
  return g;
}

inline Geometry gemma4(std::string preset, uint32_t n_layer, uint32_t n_embd, uint32_t n_head, uint32_t period,
                       uint32_t window, uint32_t context) {
  Geometry g;
  g.arch = Arch::Gemma4;
  g.preset = std::move(preset);
  g.n_layer = n_layer;
  g.n_embd = n_embd;
  g.n_head = n_head;
  g.head_dim_swa = 256;
  g.head_dim_full = 512;
  g.is_swa = sliding_pattern(n_layer, period);
  g.sliding_window = window;
  g.context_length = context;
  g.final_logit_softcapping = 30;
  return g;
}

}  // namespace detail

inline std::vector<Geometry> all_presets() {
  using detail::double_wide_ff;
  std::vector<Geometry> presets;

  // Gemma 3. tiny: 6 layers because llama.cpp's hard-coded pattern makes layer 5 the first global one; a 16-token
  // window so short prompts already exercise the sliding mask; 2 KV heads for 4 query heads (GQA).
  presets.push_back(detail::gemma3("tiny", 6, 128, 4, 2, 512, 16, 8192));
  presets.push_back(detail::gemma3("270m", 18, 640, 4, 1, 2048, 512, 32768));
  presets.push_back(detail::gemma3("1b", 26, 1152, 4, 1, 6912, 512, 32768));

  // Gemma 4 tiny presets: real head dims (256 sliding / 512 global), sliding S S G S S G (period 3), window 16.
  {
    // E2B shrunk: PLE, MQA, and the last 3 layers sharing KV. llama.cpp reuses layer (first_shared - 2) for
    // sliding and (first_shared - 1) for global layers, so the last two owning layers are S then G, as in E2B.
    Geometry g = detail::gemma4("tiny-ple", 6, 128, 4, 3, 16, 8192);
    g.n_head_kv_swa = g.n_head_kv_full = 1;
    g.shared_kv_layers = 3;
    g.per_layer_input_dim = 16;  // 6 layers x 16 = 96 columns: Q8_0-able, small per_layer_token_embd
    g.n_ff = double_wide_ff(g.n_layer, 256, g.first_shared_layer());
    presets.push_back(g);
  }
  {
    // 31B shrunk: k_eq_v on global layers, different KV head counts on sliding (2) and global (1) layers.
    Geometry g = detail::gemma4("tiny-keqv", 6, 128, 4, 3, 16, 8192);
    g.n_head_kv_swa = 2;
    g.n_head_kv_full = 1;
    g.k_eq_v = true;
    g.n_ff.assign(g.n_layer, 512);
    presets.push_back(g);
  }
  {
    // Plain Gemma 4; n_embd 256 so every matrix, token_embd included, can be Q4_K.
    Geometry g = detail::gemma4("tiny-dense", 4, 256, 4, 3, 16, 8192);
    g.n_head_kv_swa = g.n_head_kv_full = 2;
    g.n_ff.assign(g.n_layer, 512);
    presets.push_back(g);
  }

  // Published Gemma 4 geometries (spec table).
  {
    Geometry g = detail::gemma4("e2b", 35, 1536, 8, 5, 512, 131072);
    g.n_head_kv_swa = g.n_head_kv_full = 1;
    g.shared_kv_layers = 20;
    g.per_layer_input_dim = 256;
    g.n_ff = double_wide_ff(g.n_layer, 6144, g.first_shared_layer());
    presets.push_back(g);
  }
  {
    Geometry g = detail::gemma4("e4b", 42, 2560, 8, 6, 512, 131072);
    g.n_head_kv_swa = g.n_head_kv_full = 2;
    g.shared_kv_layers = 18;
    g.per_layer_input_dim = 256;
    g.n_ff.assign(g.n_layer, 10240);
    presets.push_back(g);
  }
  {
    Geometry g = detail::gemma4("31b", 60, 5376, 32, 6, 1024, 262144);
    g.n_head_kv_swa = 16;
    g.n_head_kv_full = 4;
    g.k_eq_v = true;
    g.n_ff.assign(g.n_layer, 21504);
    presets.push_back(g);
  }
  return presets;
}

inline std::string preset_names(Arch arch) {
  std::string names;
  for (const Geometry& g : all_presets()) {
    if (g.arch != arch) continue;
    if (!names.empty()) names += ", ";
    names += g.preset;
  }
  return names;
}

inline Geometry find_preset(Arch arch, const std::string& name) {
  for (const Geometry& g : all_presets()) {
    if (g.arch == arch && g.preset == name) return g;
  }
  throw Error(std::string("--preset: no preset '") + name + "' for " + arch_name(arch) + " (have: " +
              preset_names(arch) + ")");
}

}  // namespace sparrow::tools::mkmodel
