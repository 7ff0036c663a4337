#include "error.h"

namespace backplane {
std::string& last_error() {
  thread_local std::string message;
  return message;
}

void set_last_error(std::string message) { last_error() = std::move(message); }
void clear_last_error() { last_error().clear(); }

}  // namespace backplane

extern "C" const char* bpl_last_error(void) { return backplane::last_error().c_str(); }
