#pragma once
// One error type for the whole engine. Messages carry context: which file, which tensor or field, what was
// expected. Tools print what() on one line and exit non-zero; the C API turns it into an error string.
#include <stdexcept>
#include <string>

namespace sparrow {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace sparrow
