// Device memory behind bpl_malloc's pointers. The Neuron runtime hands out device memory as tensors
// (nrt_tensor_t), not addresses, so the plugin reserves a range of virtual address space that is never
// mapped (a host access through such a pointer faults at once instead of corrupting memory) and gives
// each tensor a block of addresses in it. An address inside a block names that tensor and an offset, so
// callers' pointer arithmetic works: `p + n` is byte n of the tensor, as for any device pointer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "nrt_api.h"

namespace backplane::neuron_plugin {

class DeviceAddressSpace {
 public:
  struct Location {
    nrt_tensor_t* tensor;
    size_t offset;     // of the address in the tensor
    size_t available;  // bytes from the address to the tensor's end
  };

  // Reserves `bytes` of address space (rounded up to pages). Throws plugin::Error if mmap fails.
  explicit DeviceAddressSpace(size_t bytes);
  ~DeviceAddressSpace();
  DeviceAddressSpace(const DeviceAddressSpace&) = delete;
  DeviceAddressSpace& operator=(const DeviceAddressSpace&) = delete;

  // The start of a new block of `bytes` for `tensor`, 64-byte aligned. Throws OUT_OF_MEMORY when no
  // free range is large enough.
  void* insert(nrt_tensor_t* tensor, size_t bytes);
  // Releases the block that starts at `ptr` and returns its tensor (the caller frees it). Throws
  // INVALID_ARGUMENT naming the pointer if no block starts there.
  nrt_tensor_t* erase(const void* ptr);
  // Where `ptr` lies: nullopt if it is not device memory of this space (a host pointer).
  std::optional<Location> find(const void* ptr) const;
  // find(), but `bytes` from `ptr` must lie inside one tensor; throws INVALID_ARGUMENT naming `what`.
  Location locate(const void* ptr, size_t bytes, const char* what) const;
  // Every live block's tensor, for teardown.
  std::vector<nrt_tensor_t*> tensors() const;

 private:
  struct Block {
    nrt_tensor_t* tensor;
    size_t bytes;
  };
  static constexpr size_t kAlignment = 64;

  mutable std::mutex mutex_;
  char* base_ = nullptr;
  size_t size_ = 0;
  std::map<uintptr_t, Block> blocks_;  // by start address
  std::map<uintptr_t, size_t> free_;   // start -> length; neighbours are always merged
};

}  // namespace backplane::neuron_plugin
