#include "device_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "plugin_support.h"

namespace backplane::neuron_plugin {

using plugin::Error;

namespace {
std::string address(const void* ptr) {
  std::ostringstream text;
  text << ptr;
  return text.str();
}
}  // namespace

DeviceAddressSpace::DeviceAddressSpace(size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGE_SIZE));
  size_ = (bytes + page - 1) / page * page;
  void* base = ::mmap(nullptr, size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    throw Error(BPL_ERR_OUT_OF_MEMORY, "cannot reserve " + std::to_string(size_) +
                                           " bytes of address space for device pointers: " + std::strerror(errno));
  }
  base_ = static_cast<char*>(base);
  free_[reinterpret_cast<uintptr_t>(base_)] = size_;
}

DeviceAddressSpace::~DeviceAddressSpace() { ::munmap(base_, size_); }

void* DeviceAddressSpace::insert(nrt_tensor_t* tensor, size_t bytes) {
  const size_t length = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto range = free_.begin(); range != free_.end(); ++range) {
    if (range->second < length) continue;
    const uintptr_t start = range->first;
    const size_t left = range->second - length;
    free_.erase(range);
    if (left > 0) free_[start + length] = left;
    blocks_[start] = Block{tensor, bytes};
    return reinterpret_cast<void*>(start);
  }
  throw Error(BPL_ERR_OUT_OF_MEMORY, "no free range of " + std::to_string(bytes) + " bytes left in the " +
                                         std::to_string(size_) + " bytes of device address space");
}

nrt_tensor_t* DeviceAddressSpace::erase(const void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uintptr_t start = reinterpret_cast<uintptr_t>(ptr);
  auto block = blocks_.find(start);
  if (block == blocks_.end()) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "ptr = " + address(ptr) + " was not returned by bpl_malloc of this runtime "
                                          "(or was freed already)");
  }
  nrt_tensor_t* tensor = block->second.tensor;
  size_t length = (block->second.bytes + kAlignment - 1) / kAlignment * kAlignment;
  blocks_.erase(block);
  // Merge with the free neighbours so that large blocks can be reused.
  uintptr_t begin = start;
  auto next = free_.find(start + length);
  if (next != free_.end()) {
    length += next->second;
    free_.erase(next);
  }
  auto previous = free_.lower_bound(start);
  if (previous != free_.begin()) {
    --previous;
    if (previous->first + previous->second == start) {
      begin = previous->first;
      length += previous->second;
      free_.erase(previous);
    }
  }
  free_[begin] = length;
  return tensor;
}

std::optional<DeviceAddressSpace::Location> DeviceAddressSpace::find(const void* ptr) const {
  const uintptr_t at = reinterpret_cast<uintptr_t>(ptr);
  const uintptr_t base = reinterpret_cast<uintptr_t>(base_);
  if (at < base || at >= base + size_) return std::nullopt;
  std::lock_guard<std::mutex> lock(mutex_);
  auto block = blocks_.upper_bound(at);
  if (block == blocks_.begin()) return Location{nullptr, 0, 0};
  --block;
  const size_t offset = at - block->first;
  if (offset >= block->second.bytes) return Location{nullptr, 0, 0};
  return Location{block->second.tensor, offset, block->second.bytes - offset};
}

DeviceAddressSpace::Location DeviceAddressSpace::locate(const void* ptr, size_t bytes, const char* what) const {
  std::optional<Location> location = find(ptr);
  if (!location) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, std::string(what) + " = " + address(ptr) + " is host memory, expected a "
                                          "device pointer from bpl_malloc");
  }
  if (location->tensor == nullptr) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, std::string(what) + " = " + address(ptr) +
                                              " is not in any live bpl_malloc allocation of this runtime");
  }
  if (bytes > location->available) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, std::string(what) + " = " + address(ptr) + ": " + std::to_string(bytes) +
                                              " bytes run past the end of its allocation (" +
                                              std::to_string(location->available) + " bytes left there)");
  }
  return *location;
}

std::vector<nrt_tensor_t*> DeviceAddressSpace::tensors() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<nrt_tensor_t*> all;
  for (const auto& [start, block] : blocks_) all.push_back(block.tensor);
  return all;
}

}  // namespace backplane::neuron_plugin
