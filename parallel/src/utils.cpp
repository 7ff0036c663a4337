// CPU mode, device and printing helpers.
#include "backplane/parallel/utils.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "backplane/parallel/distributed.h"
#include "cpu_mode.h"

namespace backplane::parallel {

bool cpu_mode() {
  const char* value = std::getenv("NXD_CPU_MODE");
  if (value == nullptr || *value == '\0') return false;  // empty is unset, as everywhere (README)
  try {
    return settings::cpu_mode_from(value);  // as the core's backend selection reads it
  } catch (const std::invalid_argument& e) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, e.what());
  }
}

c10::Device get_device() { return c10::Device(c10::DeviceType::CPU); }

void master_print(const std::string& message) {
  if (is_initialized() && get_rank() != 0) return;
  std::printf("%s\n", message.c_str());
  std::fflush(stdout);
}

}  // namespace backplane::parallel
