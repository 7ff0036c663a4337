#include "cpu_mode.h"

#include <cerrno>
#include <cstdlib>
#include <stdexcept>

namespace backplane::settings {

bool cpu_mode_from(const std::string& value) {
  // The whole value is one decimal integer, with an optional sign.
  const char* text = value.c_str();
  char* end = nullptr;
  errno = 0;
  const long long mode = std::strtoll(text, &end, 10);
  const bool starts_like_number = (text[0] >= '0' && text[0] <= '9') || text[0] == '-' || text[0] == '+';
  if (!starts_like_number || errno != 0 || end == text || *end != '\0') {
    throw std::invalid_argument("NXD_CPU_MODE='" + value +
                                "' is not an integer (expected 1 for CPU mode, 0 for the accelerator, Neuron)");
  }
  if (mode < 0) {
    throw std::invalid_argument("NXD_CPU_MODE='" + value +
                                "' is negative (expected 1, or any integer > 0, for CPU mode; 0 for the accelerator, Neuron)");
  }
  return mode > 0;
}

}  // namespace backplane::settings
