// Fuzzes the GGUF reader, and the tokenizer built from what it reads. The input is the whole file. The reader maps
// files, so each input is written to an in-memory file (memfd) and opened by its /proc path. A sparrow::Error is
// the expected answer to a malformed file; anything else (a crash, a leak, UB, another exception) is a finding.
// Once a file opens, everything the reader promises to have validated is used without checks: every typed getter
// on every key, and every byte of every tensor, whose size must be what its type and shape imply. A file with
// tokenizer metadata goes on to build a tokenizer and encode and decode a text with it.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/fuzz_util.h"
#include "util/error.h"

namespace {

using sparrow::fuzz::property_failed;
namespace gguf = sparrow::gguf;

// An in-memory file rewritten with each input.
class ScratchFile {
 public:
  ScratchFile() : fd_(memfd_create("gguf_fuzz", 0)) {
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::exit(2);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  const std::string& write(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0 || pwrite(fd_, data, size, 0) != static_cast<ssize_t>(size)) {
      std::perror("gguf_fuzz: writing the scratch file");
      std::exit(2);
    }
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

// Calls the getter that matches each value's type (the others throw sparrow::Error, which is fine too).
void read_every_key(const gguf::File& file) {
  for (const auto& [key, value] : file.metadata()) {
    try {
      switch (value.type) {
        case gguf::ValueType::FLOAT32: case gguf::ValueType::FLOAT64: file.get_float(key); break;
        case gguf::ValueType::BOOL: file.get_bool(key); break;
        case gguf::ValueType::STRING: file.get_string(key); break;
        case gguf::ValueType::ARRAY:
          if (value.element_type == gguf::ValueType::STRING) file.get_string_array(key);
          else if (value.element_type == gguf::ValueType::BOOL) file.get_bool_array(key);
          else if (value.element_type == gguf::ValueType::FLOAT32 || value.element_type == gguf::ValueType::FLOAT64)
            file.get_float_array(key);
          else file.get_int_array(key);
          break;
        default: file.get_uint(key); break;
      }
    } catch (const sparrow::Error&) {
    }
  }
}

// Sums every byte of every tensor, checking its size against its shape and type.
uint64_t read_every_tensor(const gguf::File& file) {
  uint64_t sum = 0;
  for (const gguf::TensorInfo& t : file.tensors()) {
    if (file.find_tensor(t.name) != &t) property_failed("find_tensor does not find a listed tensor");
    const size_t row_bytes = sparrow::tensor_row_bytes(t.type, t.ne[0]);
    if (t.nbytes != row_bytes * static_cast<size_t>(t.n_elements() / t.ne[0])) {
      property_failed("a tensor's size disagrees with its type and shape");
    }
    const auto* bytes = static_cast<const uint8_t*>(t.data);
    for (size_t k = 0; k < t.nbytes; ++k) sum += bytes[k];
  }
  return sum;
}

void use_tokenizer(const gguf::File& file) {
  if (!file.has("tokenizer.ggml.model")) return;
  try {
    const std::unique_ptr<sparrow::Tokenizer> tokenizer = sparrow::Tokenizer::from_gguf(file);
    for (bool parse_special : {false, true}) {
      const std::vector<int32_t> ids = tokenizer->encode("Hello <bos> w\xC3\xB6rld\n\n  x\xFF", false, parse_special);
      for (int32_t id : ids) {
        if (id < 0 || id >= tokenizer->n_vocab()) property_failed("an id outside the vocabulary");
      }
      tokenizer->decode(ids, /*render_special=*/true);
    }
  } catch (const sparrow::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ScratchFile scratch;
  std::unique_ptr<gguf::File> file;
  try {
    file = gguf::File::open(scratch.write(data, size));
  } catch (const sparrow::Error&) {
    return 0;
  }
  read_every_key(*file);
  volatile uint64_t sink = read_every_tensor(*file);
  (void)sink;
  use_tokenizer(*file);
  return 0;
}
