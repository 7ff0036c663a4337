// Finding and loading the Neuron Runtime, its status codes, and which NeuronCore a rank uses: the
// plugin's logic up to the runtime boundary, testable without Neuron hardware.
#pragma once

#include <string>
#include <vector>

#include "backplane/backplane.h"
#include "nrt_api.h"

namespace backplane::neuron_plugin {

// Where libnrt.so.1 is looked for, in order: NEURON_RT_LIB (the library file, or a folder holding it),
// the standard install location /opt/aws/neuron/lib, then the dynamic loader's own search path.
std::vector<std::string> runtime_candidates(const char* neuron_rt_lib);

struct LoadedRuntime {
  void* handle = nullptr;  // from dlopen; kept for the process's life (the runtime cannot be unloaded safely)
  std::string path;
  std::string version;     // "2.21.0.0 (libnrt version …)"
  NrtApi api{};
};

// Loads the first candidate that exists and resolves every function of NrtApi. Throws plugin::Error:
// BPL_ERR_UNAVAILABLE "Neuron runtime (libnrt.so.1) not found (tried …); set NXD_CPU_MODE=1 to run on
// CPU with Gloo", or naming the first missing function and the runtime version found.
LoadedRuntime load_runtime(const std::vector<std::string>& candidates);

// The runtime's name for a status ("NRT_TIMEOUT", or "NRT_STATUS 42" for one it does not document).
std::string nrt_status_name(int status);
// The bpl status for it: NRT_TIMEOUT -> TIMEOUT, NRT_RESOURCE -> OUT_OF_MEMORY, NRT_INVALID* and
// NRT_EXEC_BAD_INPUT -> INVALID_ARGUMENT, NRT_UNSUPPORTED_NEFF_VERSION -> UNSUPPORTED,
// NRT_LOAD_NOT_ENOUGH_NC and NRT_UNINITIALIZED/NRT_CLOSED -> UNAVAILABLE, NRT_HW_ERROR and
// NRT_EXEC_COMPLETED_WITH_* -> INTERNAL, NRT_QUEUE_FULL/NRT_EXEC_NC_BUSY -> UNAVAILABLE, others INTERNAL.
bpl_status to_bpl_status(int status);

// Throws plugin::Error with the mapped status when a runtime call failed: "<call> failed: NRT_TIMEOUT".
void check_nrt(int status, const std::string& call);

// The runtime's dtype code for a bpl dtype, or kNrtDtypeInvalid where the runtime has none (f64).
NrtDtype nrt_dtype(bpl_dtype dtype);
// The bpl dtype of a runtime dtype code, or 0 where bpl has none (u16, u32, fp8, …).
bpl_dtype bpl_dtype_of(int nrt_dtype);

// NEURON_RT_ROOT_COMM_ID, the address where the runtime's collectives bootstrap: the configured value
// if set (it must be host:port), else MASTER_ADDR and the port after MASTER_PORT (MASTER_PORT itself
// is the launcher's rendezvous store under torchrun). One rank needs none. Throws plugin::Error
// (INVALID_ARGUMENT naming the value, or UNAVAILABLE when several ranks have no address to meet at).
std::string root_comm_id(const char* configured, const std::string& master_addr, int master_port, int world_size);

// NEURON_RT_VISIBLE_CORES as a list of core indices: "3", "0-3", "0,2,5-7". Throws plugin::Error
// (INVALID_ARGUMENT, naming the value) for anything else, a descending range or a repeated core.
std::vector<int> parse_visible_cores(const std::string& text);

// The core a local rank uses, as torch-neuronx picks it: with NEURON_RT_VISIBLE_CORES set, entry
// local_rank of that list (which must be long enough); otherwise core local_rank of the `total` cores
// the runtime reports. Throws plugin::Error naming the values when there is no such core.
int core_for_local_rank(const char* visible_cores, int local_rank, int total_cores);

}  // namespace backplane::neuron_plugin
