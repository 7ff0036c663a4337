// The frontend's one exception type: a backplane status and a message that says what was wrong.
#pragma once

#include <stdexcept>
#include <string>

#include "backplane/backplane.h"

namespace backplane::parallel {

class Error : public std::runtime_error {
 public:
  Error(bpl_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  // BPL_ERR_INVALID_ARGUMENT for bad input; the C call's status when a backplane call failed.
  bpl_status status() const noexcept { return status_; }

 private:
  bpl_status status_;
};

// Throws Error(status, "<what>: <bpl_last_error()>") unless status is BPL_OK.
void check(bpl_status status, const char* what);

}  // namespace backplane::parallel
