// NXD_CPU_MODE, the reference's switch between the accelerator and CPU mode, read one way wherever it is
// read: by the core's backend selection and by the training frontend's cpu_mode().
#pragma once

#include <string>

namespace backplane::settings {

// The value of NXD_CPU_MODE (set and not empty): true for CPU mode (an integer > 0), false for the
// accelerator (0). std::invalid_argument naming the value and what is expected otherwise (not one
// decimal integer, or negative).
bool cpu_mode_from(const std::string& value);

}  // namespace backplane::settings
