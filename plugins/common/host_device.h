// What the CPU plugins share beyond arithmetic: the one host device (host pointers are device
// pointers) and the capability masks of "every dtype and reduce op".
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backplane/plugin.h"
#include "plugin_support.h"

namespace backplane::plugin {

constexpr size_t kHostAlignment = 64;

// Every kind of BPL_FOR_EACH_COLLECTIVE (the CPU plugins implement them all).
#define BPL_BIT_OF(code, name, minor) | BPL_BIT(code)
constexpr uint64_t kAllCollectives = 0 BPL_FOR_EACH_COLLECTIVE(BPL_BIT_OF);
#undef BPL_BIT_OF
constexpr uint32_t kAllDtypes = static_cast<uint32_t>(
    BPL_BIT(BPL_DTYPE_F32) | BPL_BIT(BPL_DTYPE_F64) | BPL_BIT(BPL_DTYPE_F16) | BPL_BIT(BPL_DTYPE_BF16) |
    BPL_BIT(BPL_DTYPE_I8) | BPL_BIT(BPL_DTYPE_U8) | BPL_BIT(BPL_DTYPE_I32) | BPL_BIT(BPL_DTYPE_I64));
constexpr uint32_t kAllReduceOps = static_cast<uint32_t>(BPL_BIT(BPL_OP_SUM) | BPL_BIT(BPL_OP_PROD) | BPL_BIT(BPL_OP_MIN) |
                                                         BPL_BIT(BPL_OP_MAX) | BPL_BIT(BPL_OP_AVG) | BPL_BIT(BPL_OP_BAND) |
                                                         BPL_BIT(BPL_OP_BOR) | BPL_BIT(BPL_OP_BXOR));

namespace host_device {

inline bpl_status count(bpl_plugin_runtime*, int32_t* count) {
  *count = 1;
  return BPL_OK;
}

inline bpl_status properties(bpl_plugin_runtime*, int32_t device, bpl_device_properties* out) {
  std::strncpy(out->name, "cpu", sizeof(out->name) - 1);
  out->kind = BPL_DEVICE_HOST;
  out->index = device;
  const long pages = sysconf(_SC_PHYS_PAGES), available = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  out->total_memory = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
  out->free_memory = available > 0 && page > 0 ? static_cast<uint64_t>(available) * static_cast<uint64_t>(page) : 0;
  return BPL_OK;
}

inline bpl_status alloc(bpl_plugin_runtime*, int32_t, size_t bytes, void** ptr) {
  *ptr = std::aligned_alloc(kHostAlignment, (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment);
  if (*ptr != nullptr) return BPL_OK;
  host()->set_error((std::string(name()) + ": cannot allocate " + std::to_string(bytes) + " bytes of host memory").c_str());
  return BPL_ERR_OUT_OF_MEMORY;
}

inline bpl_status free(bpl_plugin_runtime*, void* ptr) {
  std::free(ptr);
  return BPL_OK;
}

inline bpl_status copy(bpl_plugin_runtime*, void* dst, const void* src, size_t bytes, bpl_memcpy_kind) {
  std::memcpy(dst, src, bytes);
  return BPL_OK;
}

}  // namespace host_device

// Puts the one host device above in a plugin's table (synchronize stays NULL: nothing is queued).
inline void set_host_device(bpl_plugin_api& api) {
  api.device_count = host_device::count;
  api.device_properties = host_device::properties;
  api.mem_alloc = host_device::alloc;
  api.mem_free = host_device::free;
  api.mem_copy = host_device::copy;
}

}  // namespace backplane::plugin
