#include "neuron_core.h"

#include "plugin_support.h"
#include "runtime.h"

namespace backplane::neuron_plugin {

NeuronCore::NeuronCore(const NrtApi& runtime_api, int physical_core, size_t address_space)
    : api(runtime_api), core(physical_core), memory(address_space) {}

OwnedTensor& OwnedTensor::operator=(OwnedTensor&& other) noexcept {
  if (this != &other) {
    if (tensor_ != nullptr) api_->nrt_tensor_free(&tensor_);
    api_ = other.api_;
    tensor_ = other.tensor_;
    other.tensor_ = nullptr;
  }
  return *this;
}

OwnedTensor::~OwnedTensor() {
  if (tensor_ != nullptr) api_->nrt_tensor_free(&tensor_);
}

OwnedTensor allocate_device_tensor(const NeuronCore& core, size_t bytes, const char* name) {
  nrt_tensor_t* tensor = nullptr;
  const int status = core.api.nrt_tensor_allocate(kNrtPlacementDevice, core.vnc, bytes, name, &tensor);
  check_nrt(status, "nrt_tensor_allocate of " + std::to_string(bytes) + " bytes on NeuronCore " +
                        std::to_string(core.core));
  return OwnedTensor(&core.api, tensor);
}

OwnedTensor tensor_for_input(const NeuronCore& core, const void* ptr, size_t bytes, const char* what) {
  if (std::optional<DeviceAddressSpace::Location> device = core.memory.find(ptr)) {
    const DeviceAddressSpace::Location at = core.memory.locate(ptr, bytes, what);
    nrt_tensor_t* slice = nullptr;
    check_nrt(core.api.nrt_tensor_allocate_slice(at.tensor, at.offset, bytes, what, &slice),
              std::string("nrt_tensor_allocate_slice for ") + what);
    return OwnedTensor(&core.api, slice);
  }
  OwnedTensor staged = allocate_device_tensor(core, bytes, what);
  check_nrt(core.api.nrt_tensor_write(staged.get(), ptr, 0, bytes), std::string("nrt_tensor_write of ") + what);
  return staged;
}

void copy_out(const NeuronCore& core, nrt_tensor_t* source, size_t offset, void* ptr, size_t bytes, const char* what) {
  if (core.memory.find(ptr)) {
    const DeviceAddressSpace::Location at = core.memory.locate(ptr, bytes, what);
    check_nrt(core.api.nrt_tensor_copy(source, offset, at.tensor, at.offset, bytes),
              std::string("nrt_tensor_copy into ") + what);
  } else {
    check_nrt(core.api.nrt_tensor_read(source, ptr, offset, bytes), std::string("nrt_tensor_read into ") + what);
  }
}

}  // namespace backplane::neuron_plugin
