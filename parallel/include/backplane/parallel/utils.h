// CPU mode and device helpers, as neuronx_distributed.utils has them.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace backplane::parallel {

// NXD_CPU_MODE read on every call (nothing cached): an integer > 0 means CPU mode; unset means 0.
// Error (BPL_ERR_INVALID_ARGUMENT, naming the value) for a value that is not an integer.
bool cpu_mode();

// The device the frontend's tensors live on: the CPU. The frontend's tensors are LibTorch CPU tensors on
// every backend (there is no XLA device here); kept so that scripts written for neuronx-distributed
// port line by line.
c10::Device get_device();

// Prints `message` and a newline on global rank 0 only (or when no process group is initialised).
void master_print(const std::string& message);

}  // namespace backplane::parallel
