// Errors inside the core: a C++ exception carrying a bpl_status, turned into a status and a
// thread-local message at the C boundary (ABI rule 4: nothing thrown crosses it).
#pragma once

#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "backplane/backplane.h"

namespace backplane {

class Error : public std::runtime_error {
 public:
  Error(bpl_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  bpl_status status() const { return status_; }

 private:
  bpl_status status_;
};

// The calling thread's message buffer behind bpl_last_error().
std::string& last_error();

// Sets / clears the calling thread's bpl_last_error() message.
void set_last_error(std::string message);
void clear_last_error();

// Runs `body` (which returns a bpl_status) and converts every exception into a status and a message
// prefixed with `function`. A status other than BPL_OK returned by `body` keeps the message it set.
template <typename Body>
bpl_status guarded(const char* function, Body&& body) noexcept {
  try {
    clear_last_error();
    return std::forward<Body>(body)();
  } catch (const Error& e) {
    set_last_error(std::string(function) + ": " + e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error(std::string(function) + ": out of memory");
    return BPL_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(std::string(function) + ": internal error: " + e.what());
    return BPL_ERR_INTERNAL;
  } catch (...) {
    set_last_error(std::string(function) + ": internal error: unknown exception");
    return BPL_ERR_INTERNAL;
  }
}

}  // namespace backplane
