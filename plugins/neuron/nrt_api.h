// The subset of the Neuron Runtime's public C API (libnrt.so.1; nrt/nrt.h, nrt_experimental.h,
// nrt_version.h in aws-neuron-sdk/src/libnrt/include) that the plugin uses, declared from the documented
// signatures so that the plugin builds without the Neuron SDK. The library is loaded with dlopen when
// the plugin opens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace backplane::neuron_plugin {

// NRT_STATUS values (nrt_status.h).
enum NrtStatus : int {
  kNrtSuccess = 0,
  kNrtFailure = 1,
  kNrtInvalid = 2,
  kNrtInvalidHandle = 3,
  kNrtResource = 4,
  kNrtTimeout = 5,
  kNrtHwError = 6,
  kNrtQueueFull = 7,
  kNrtLoadNotEnoughNc = 9,
  kNrtUnsupportedNeffVersion = 10,
  kNrtUninitialized = 13,
  kNrtClosed = 14,
  kNrtExecBadInput = 1002,
  kNrtExecCompletedWithNumErr = 1003,
  kNrtExecCompletedWithErr = 1004,
  kNrtExecNcBusy = 1005,
  kNrtCollPending = 1100,
};

enum NrtFrameworkType : int { kNrtFrameworkNoFw = 1 };
enum NrtTensorPlacement : int { kNrtPlacementDevice = 0, kNrtPlacementHost = 1, kNrtPlacementVirtual = 2 };

struct nrt_model_t;
struct nrt_tensor_t;
struct nrt_tensor_set_t;

// nrt_version.h: four numbers, a detail string and the git hash; the runtime requires size >= 160.
constexpr size_t kNrtVersionDetailLength = 128;
constexpr size_t kNrtGitHashLength = 64;
struct NrtVersion {
  uint64_t rt_major, rt_minor, rt_patch, rt_maintenance;
  char rt_detail[kNrtVersionDetailLength];
  char git_hash[kNrtGitHashLength];
};

// The function table, one typed pointer per documented entry point.
struct NrtApi {
  int (*nrt_get_version)(NrtVersion* version, size_t size);
  int (*nrt_init)(int framework, const char* framework_version, const char* fal_version);
  void (*nrt_close)();
  int (*nrt_get_total_vnc_count)(uint32_t* count);
  int (*nrt_get_visible_vnc_count)(uint32_t* count);
  int (*nrt_load)(const void* neff, size_t size, int32_t start_vnc, int32_t vnc_count, nrt_model_t** model);
  int (*nrt_unload)(nrt_model_t* model);
  int (*nrt_allocate_tensor_set)(nrt_tensor_set_t** set);
  void (*nrt_destroy_tensor_set)(nrt_tensor_set_t** set);
  int (*nrt_add_tensor_to_tensor_set)(nrt_tensor_set_t* set, const char* name, nrt_tensor_t* tensor);
  int (*nrt_execute)(nrt_model_t* model, const nrt_tensor_set_t* inputs, nrt_tensor_set_t* outputs);
  int (*nrt_tensor_allocate)(int placement, int vnc, size_t size, const char* name, nrt_tensor_t** tensor);
  void (*nrt_tensor_free)(nrt_tensor_t** tensor);
  int (*nrt_tensor_read)(const nrt_tensor_t* tensor, void* buffer, size_t offset, size_t size);
  int (*nrt_tensor_write)(nrt_tensor_t* tensor, const void* buffer, size_t offset, size_t size);
  int (*nrt_tensor_copy)(const nrt_tensor_t* source, size_t source_offset, nrt_tensor_t* destination,
                         size_t destination_offset, size_t size);
  size_t (*nrt_tensor_get_size)(const nrt_tensor_t* tensor);
  int (*nrt_barrier)(int32_t vnc, uint32_t global_device_id, uint32_t global_device_count);
};

// Every entry of NrtApi with its symbol name, for resolving them all at once.
struct NrtSymbol {
  const char* name;
  void** slot;
};
inline std::vector<NrtSymbol> nrt_symbols(NrtApi& api) {
  return {{"nrt_get_version", reinterpret_cast<void**>(&api.nrt_get_version)},
          {"nrt_init", reinterpret_cast<void**>(&api.nrt_init)},
          {"nrt_close", reinterpret_cast<void**>(&api.nrt_close)},
          {"nrt_get_total_vnc_count", reinterpret_cast<void**>(&api.nrt_get_total_vnc_count)},
          {"nrt_get_visible_vnc_count", reinterpret_cast<void**>(&api.nrt_get_visible_vnc_count)},
          {"nrt_load", reinterpret_cast<void**>(&api.nrt_load)},
          {"nrt_unload", reinterpret_cast<void**>(&api.nrt_unload)},
          {"nrt_allocate_tensor_set", reinterpret_cast<void**>(&api.nrt_allocate_tensor_set)},
          {"nrt_destroy_tensor_set", reinterpret_cast<void**>(&api.nrt_destroy_tensor_set)},
          {"nrt_add_tensor_to_tensor_set", reinterpret_cast<void**>(&api.nrt_add_tensor_to_tensor_set)},
          {"nrt_execute", reinterpret_cast<void**>(&api.nrt_execute)},
          {"nrt_tensor_allocate", reinterpret_cast<void**>(&api.nrt_tensor_allocate)},
          {"nrt_tensor_free", reinterpret_cast<void**>(&api.nrt_tensor_free)},
          {"nrt_tensor_read", reinterpret_cast<void**>(&api.nrt_tensor_read)},
          {"nrt_tensor_write", reinterpret_cast<void**>(&api.nrt_tensor_write)},
          {"nrt_tensor_copy", reinterpret_cast<void**>(&api.nrt_tensor_copy)},
          {"nrt_tensor_get_size", reinterpret_cast<void**>(&api.nrt_tensor_get_size)},
          {"nrt_barrier", reinterpret_cast<void**>(&api.nrt_barrier)}};
}

}  // namespace backplane::neuron_plugin
