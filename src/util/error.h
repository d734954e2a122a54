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

// A decode its caller stopped (an abort check between forward passes said so): not a failure of the engine.
class Cancelled : public Error {
 public:
  Cancelled() : Error("cancelled") {}
};

}  // namespace sparrow
