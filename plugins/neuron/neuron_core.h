// What every part of the Neuron plugin works on: the loaded runtime, this rank's NeuronCore, the
// device memory behind bpl pointers, and the tensors that stand for caller buffers in runtime calls.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "device_memory.h"
#include "nrt_api.h"

namespace backplane::neuron_plugin {

struct NeuronCore {
  NeuronCore(const NrtApi& api, int core, size_t address_space);

  const NrtApi& api;
  int core;     // the physical NeuronCore (for messages); the process sees only it
  int vnc = 0;  // its index in runtime calls: the first, and only, visible core
  DeviceAddressSpace memory;
  std::chrono::milliseconds timeout{0};
};

// A runtime tensor owned by the plugin (a staging buffer or a slice); freed on destruction.
class OwnedTensor {
 public:
  OwnedTensor() = default;
  OwnedTensor(const NrtApi* api, nrt_tensor_t* tensor) : api_(api), tensor_(tensor) {}
  OwnedTensor(OwnedTensor&& other) noexcept : api_(other.api_), tensor_(other.tensor_) { other.tensor_ = nullptr; }
  OwnedTensor& operator=(OwnedTensor&& other) noexcept;
  ~OwnedTensor();
  nrt_tensor_t* get() const { return tensor_; }
  // Hands the tensor to the caller, who frees it.
  nrt_tensor_t* release() {
    nrt_tensor_t* tensor = tensor_;
    tensor_ = nullptr;
    return tensor;
  }

 private:
  const NrtApi* api_ = nullptr;
  nrt_tensor_t* tensor_ = nullptr;
};

// A new device tensor of `bytes` on the core. Throws plugin::Error (OUT_OF_MEMORY for NRT_RESOURCE).
OwnedTensor allocate_device_tensor(const NeuronCore& core, size_t bytes, const char* name);

// A tensor that is exactly `bytes` of caller memory at `ptr`, for a runtime call that reads it: a slice
// of the allocation for a device pointer; for a host pointer, a device copy of the host bytes.
OwnedTensor tensor_for_input(const NeuronCore& core, const void* ptr, size_t bytes, const char* what);

// Copies `bytes` from `source` at `offset` to caller memory at `ptr` (host or device pointer).
void copy_out(const NeuronCore& core, nrt_tensor_t* source, size_t offset, void* ptr, size_t bytes, const char* what);

}  // namespace backplane::neuron_plugin
