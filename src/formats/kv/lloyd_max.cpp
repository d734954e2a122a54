// The generated Lloyd-Max tables (scripts/gen-lloyd-max) and their lookup.
#include "formats/kv/lloyd_max.h"

#include <iterator>
#include <string>

#include "util/error.h"

namespace sparrow::formats {
namespace {

const LloydMaxCodebook kCodebooks[] = {
#include "formats/kv/lloyd_max_tables.inc"
};

}  // namespace

const LloydMaxCodebook& lloyd_max_codebook(int n, int bits) {
  for (const LloydMaxCodebook& book : kCodebooks)
    if (book.n == n && book.bits == bits) return book;
  throw Error("lloyd-max codebook: no table for sub-block size " + std::to_string(n) + " and " +
              std::to_string(bits) + " bits (tables exist for n = 64, 128 and bits = 1..4)");
}

}  // namespace sparrow::formats
