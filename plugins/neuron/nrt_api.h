// The subset of the Neuron Runtime's public C API (libnrt.so.1; nrt/nrt.h, nrt_experimental.h,
// nrt_async.h, nrt_version.h in aws-neuron-sdk/src/libnrt/include) that the plugin uses, declared here
// from the documented signatures so that the plugin builds without the Neuron SDK. The library is
// loaded with dlopen when the plugin opens.
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
enum NrtTensorUsage : int { kNrtUsageInput = 0, kNrtUsageOutput = 1 };

// nrt_dtype_t (nrt.h): the runtime's own codes, not bpl's.
enum NrtDtype : int {
  kNrtDtypeInvalid = 0x0,
  kNrtDtypeUint64 = 0x1,
  kNrtDtypeInt8 = 0x2,
  kNrtDtypeUint8 = 0x3,
  kNrtDtypeInt16 = 0x4,
  kNrtDtypeUint16 = 0x5,
  kNrtDtypeBfloat16 = 0x6,
  kNrtDtypeFloat16 = 0x7,
  kNrtDtypeInt32 = 0x8,
  kNrtDtypeUint32 = 0x9,
  kNrtDtypeFloat32 = 0xA,
  kNrtDtypeInt64 = 0xC,
};

// nrt_op_type_t: the reductions of the runtime's collectives (no product, no average).
enum NrtReduceOp : int { kNrtOpAdd = 0x0, kNrtOpMax = 0x2, kNrtOpMin = 0x3 };
// nrt_cc_op_type_t: the collectives the runtime runs outside a NEFF.
enum NrtCollective : int { kNrtCcAllgather = 0, kNrtCcAllreduce = 1, kNrtCcReduceScatter = 2 };

struct nrt_model_t;
struct nrt_tensor_t;
struct nrt_cc_context_t;
struct nrta_error_tracker_t;
using nrt_tensor_set_t = void;  // the runtime's typedef
using nrta_seq_t = uint64_t;    // 16 bits of execution unit, 48 of sequence number

// nrt_version.h: four numbers, a detail string and the git hash; the runtime requires size >= 160.
constexpr size_t kNrtVersionDetailLength = 128;
constexpr size_t kNrtGitHashLength = 64;
struct NrtVersion {
  uint64_t rt_major, rt_minor, rt_patch, rt_maintenance;
  char rt_detail[kNrtVersionDetailLength];
  char git_hash[kNrtGitHashLength];
};

// nrt_cc_comm_t: a replica group (global device ids) and this worker's place in it.
struct NrtCcComm {
  uint32_t* replica_group;
  uint32_t rank;
  uint32_t rank_n;
  uint32_t ctx_device_id;
  uint32_t ctx_device_count;
  uint32_t vnc;
};

// nrt_tensor_list_t.
struct NrtTensorList {
  nrt_tensor_t** tensors;
  size_t num_tensors;
};

// nrta_error_t: an error the runtime recorded for a scheduled request.
struct NrtaError {
  nrta_seq_t seq_id;
  uint64_t error_code;  // an NRT_STATUS
};

// nrt_experimental.h: what a loaded NEFF takes and returns.
constexpr size_t kNrtTensorNameMax = 256;
struct NrtTensorInfo {
  char name[kNrtTensorNameMax];
  int usage;  // NrtTensorUsage
  size_t size;
  int dtype;  // NrtDtype
  uint32_t* shape;
  uint32_t ndim;
};
struct NrtTensorInfoArray {
  uint64_t tensor_count;
  NrtTensorInfo tensor_array[1];  // tensor_count entries (a flexible array in the C header)
};

// nrt.h: bytes in use and the limit of a core's device memory (append-only struct).
struct NrtVncMemoryStats {
  size_t bytes_used;
  size_t bytes_limit;
};

// The function table, one typed pointer per documented entry point.
struct NrtApi {
  int (*nrt_get_version)(NrtVersion* version, size_t size);
  int (*nrt_init)(int framework, const char* framework_version, const char* fal_version);
  void (*nrt_close)();
  int (*nrt_get_total_vnc_count)(uint32_t* count);
  int (*nrt_get_visible_vnc_count)(uint32_t* count);
  // Device memory: runtime tensors.
  int (*nrt_tensor_allocate)(int placement, int vnc, size_t size, const char* name, nrt_tensor_t** tensor);
  void (*nrt_tensor_free)(nrt_tensor_t** tensor);
  int (*nrt_tensor_allocate_slice)(const nrt_tensor_t* source, size_t offset, size_t size, const char* name,
                                   nrt_tensor_t** slice);
  int (*nrt_tensor_read)(const nrt_tensor_t* tensor, void* buffer, size_t offset, size_t size);
  int (*nrt_tensor_write)(nrt_tensor_t* tensor, const void* buffer, size_t offset, size_t size);
  int (*nrt_tensor_copy)(const nrt_tensor_t* source, size_t source_offset, nrt_tensor_t* destination,
                         size_t destination_offset, size_t size);
  // Programs: NEFFs.
  int (*nrt_load)(const void* neff, size_t size, int32_t vnc, int32_t vnc_count, nrt_model_t** model);
  int (*nrt_unload)(nrt_model_t* model);
  int (*nrt_get_model_tensor_info)(nrt_model_t* model, NrtTensorInfoArray** info);
  int (*nrt_free_model_tensor_info)(NrtTensorInfoArray* info);
  int (*nrt_allocate_tensor_set)(nrt_tensor_set_t** set);
  void (*nrt_destroy_tensor_set)(nrt_tensor_set_t** set);
  int (*nrt_add_tensor_to_tensor_set)(nrt_tensor_set_t* set, const char* name, nrt_tensor_t* tensor);
  int (*nrt_execute)(nrt_model_t* model, const nrt_tensor_set_t* inputs, nrt_tensor_set_t* outputs);
  // Collectives outside a NEFF (host-driven), asynchronous.
  int (*nrt_cc_global_comm_init)(uint32_t vnc, uint32_t global_device_id, uint32_t global_device_count);
  int (*nrta_cc_prepare)(NrtCcComm* comm, NrtTensorList* input, NrtTensorList* output, int dtype, int op,
                         int cc_op, nrt_cc_context_t** context);
  int (*nrta_cc_schedule)(nrt_cc_context_t** context, int queue, nrta_error_tracker_t* errors, nrta_seq_t* sequence);
  int (*nrta_is_completed)(nrta_seq_t sequence, bool* completed);
  int (*nrta_error_tracker_create)(uint32_t vnc, nrta_error_tracker_t** tracker);
  void (*nrta_error_tracker_destroy)(nrta_error_tracker_t* tracker);
  int (*nrta_error_tracker_get_list)(nrta_error_tracker_t* tracker, const NrtaError** list, size_t* count);
  // Optional (newer runtimes): memory figures for bpl_device_get_properties.
  int (*nrt_get_vnc_memory_stats)(uint32_t vnc, NrtVncMemoryStats* stats, size_t size_in, size_t* size_out);
};

// Every entry of NrtApi with its symbol name, for resolving them all at once. An optional one may be
// missing (its pointer stays NULL); a required one missing refuses the runtime.
struct NrtSymbol {
  const char* name;
  void** slot;
  bool required;
};
std::vector<NrtSymbol> nrt_symbols(NrtApi& api);

}  // namespace backplane::neuron_plugin
