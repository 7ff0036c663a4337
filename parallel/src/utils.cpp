// CPU mode, device and printing helpers.
#include "backplane/parallel/utils.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backplane/parallel/distributed.h"

namespace backplane::parallel {

bool cpu_mode() {
  const char* value = std::getenv("NXD_CPU_MODE");
  if (value == nullptr || *value == '\0') return false;  // empty is unset, as everywhere (README)
  // The same rule as backend selection in the core: the whole value is one decimal integer.
  char* end = nullptr;
  errno = 0;
  const long long mode = std::strtoll(value, &end, 10);
  const bool starts_like_number = (value[0] >= '0' && value[0] <= '9') || value[0] == '-' || value[0] == '+';
  if (!starts_like_number || errno != 0 || end == value || *end != '\0') {
    throw Error(BPL_ERR_INVALID_ARGUMENT, std::string("NXD_CPU_MODE='") + value +
                                              "' is not an integer (expected 1 for CPU mode, 0 for the accelerator)");
  }
  if (mode < 0) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, std::string("NXD_CPU_MODE='") + value +
                                              "' is negative (expected 1, or any integer > 0, for CPU mode; 0 for the accelerator)");
  }
  return mode > 0;
}

c10::Device get_device() { return c10::Device(c10::DeviceType::CPU); }

void master_print(const std::string& message) {
  if (is_initialized() && get_rank() != 0) return;
  std::printf("%s\n", message.c_str());
  std::fflush(stdout);
}

}  // namespace backplane::parallel
