#include "runtime/sequence_state.h"

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "util/binary_io.h"
#include "util/error.h"

namespace sparrow {

namespace {

constexpr std::array<char, 8> kMagic = {'S', 'P', 'R', 'W', 'S', 'E', 'Q', '\0'};
constexpr uint32_t kVersion = 3;  // 2: each layer says whether its keys are balanced; 3: protected positions

}  // namespace

void save_sequence_state(const std::string& path, const Model& model, const KvCache& cache, int32_t n_past,
                         std::span<const int32_t> tokens) {
  if (!tokens.empty() && int64_t(tokens.size()) != n_past)
    throw Error(path + ": " + std::to_string(tokens.size()) + " token ids given for a sequence of " +
                std::to_string(n_past) + " tokens (give all of them or none)");
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(path + ": cannot write");
    binary::write_bytes(out, kMagic.data(), kMagic.size());
    binary::write(out, kVersion);
    binary::write(out, model.state_fingerprint());
    binary::write(out, n_past);
    binary::write(out, uint32_t(tokens.size()));
    binary::write_bytes(out, tokens.data(), tokens.size_bytes());
    cache.save(out, n_past);
    out.flush();
    if (!out) {
      std::remove(partial.c_str());
      throw Error(path + ": writing failed (disk full?)");
    }
  }
  std::error_code ec;
  std::filesystem::rename(partial, path, ec);
  if (ec) {
    std::remove(partial.c_str());
    throw Error(path + ": " + ec.message());
  }
}

RestoredSequence restore_sequence_state(const std::string& path, const Model& model, KvCache& cache) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open");
  try {
    std::array<char, 8> magic{};
    binary::read_bytes(in, magic.data(), magic.size(), "the header");
    if (magic != kMagic) throw Error("not a Sparrow sequence state file");
    const auto version = binary::read<uint32_t>(in, "the header");
    if (version != kVersion)
      throw Error("format version " + std::to_string(version) + "; this build reads " + std::to_string(kVersion));
    if (binary::read<uint64_t>(in, "the header") != model.state_fingerprint())
      throw Error("saved from a different model file, or with other key transforms (--key-transforms)");
    RestoredSequence r;
    r.n_past = binary::read<int32_t>(in, "the header");
    if (r.n_past < 0 || r.n_past > cache.n_ctx())
      throw Error("holds " + std::to_string(r.n_past) + " tokens; this context holds " + std::to_string(cache.n_ctx()));
    const auto n_tokens = binary::read<uint32_t>(in, "the header");
    if (n_tokens != 0 && int64_t(n_tokens) != r.n_past)
      throw Error(std::to_string(n_tokens) + " token ids for " + std::to_string(r.n_past) + " tokens (corrupt file)");
    r.tokens.resize(n_tokens);
    binary::read_bytes(in, r.tokens.data(), n_tokens * sizeof(int32_t), "the token ids");
    cache.restore(in, r.n_past);
    if (in.peek() != std::ifstream::traits_type::eof()) throw Error("bytes after the end of the state (corrupt file)");
    return r;
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

}  // namespace sparrow
