#include "runtime.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "plugin_support.h"

namespace backplane::neuron_plugin {

using plugin::Error;

namespace {
constexpr const char* kLibrary = "libnrt.so.1";

bool is_directory(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}
}  // namespace

std::vector<NrtSymbol> nrt_symbols(NrtApi& api) {
#define BPL_NRT_SYMBOL(function, required) {#function, reinterpret_cast<void**>(&api.function), required}
  return {BPL_NRT_SYMBOL(nrt_get_version, true),
          BPL_NRT_SYMBOL(nrt_init, true),
          BPL_NRT_SYMBOL(nrt_close, true),
          BPL_NRT_SYMBOL(nrt_get_total_vnc_count, true),
          BPL_NRT_SYMBOL(nrt_get_visible_vnc_count, true),
          BPL_NRT_SYMBOL(nrt_tensor_allocate, true),
          BPL_NRT_SYMBOL(nrt_tensor_free, true),
          BPL_NRT_SYMBOL(nrt_tensor_allocate_slice, true),
          BPL_NRT_SYMBOL(nrt_tensor_read, true),
          BPL_NRT_SYMBOL(nrt_tensor_write, true),
          BPL_NRT_SYMBOL(nrt_tensor_copy, true),
          BPL_NRT_SYMBOL(nrt_load, true),
          BPL_NRT_SYMBOL(nrt_unload, true),
          BPL_NRT_SYMBOL(nrt_get_model_tensor_info, true),
          BPL_NRT_SYMBOL(nrt_free_model_tensor_info, true),
          BPL_NRT_SYMBOL(nrt_allocate_tensor_set, true),
          BPL_NRT_SYMBOL(nrt_destroy_tensor_set, true),
          BPL_NRT_SYMBOL(nrt_add_tensor_to_tensor_set, true),
          BPL_NRT_SYMBOL(nrt_execute, true),
          BPL_NRT_SYMBOL(nrt_cc_global_comm_init, true),
          BPL_NRT_SYMBOL(nrta_cc_prepare, true),
          BPL_NRT_SYMBOL(nrta_cc_schedule, true),
          BPL_NRT_SYMBOL(nrta_is_completed, true),
          BPL_NRT_SYMBOL(nrta_error_tracker_create, true),
          BPL_NRT_SYMBOL(nrta_error_tracker_destroy, true),
          BPL_NRT_SYMBOL(nrta_error_tracker_get_list, true),
          BPL_NRT_SYMBOL(nrt_get_vnc_memory_stats, false)};
#undef BPL_NRT_SYMBOL
}

std::vector<std::string> runtime_candidates(const char* neuron_rt_lib) {
  std::vector<std::string> candidates;
  if (neuron_rt_lib != nullptr && *neuron_rt_lib != '\0') {
    const std::string value = neuron_rt_lib;
    candidates.push_back(is_directory(value) ? value + "/" + kLibrary : value);
  }
  candidates.push_back(std::string("/opt/aws/neuron/lib/") + kLibrary);
  candidates.push_back(kLibrary);  // the loader's path: LD_LIBRARY_PATH, ld.so.cache
  return candidates;
}

LoadedRuntime load_runtime(const std::vector<std::string>& candidates) {
  LoadedRuntime runtime;
  std::string tried;
  for (const std::string& candidate : candidates) {
    runtime.handle = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (runtime.handle != nullptr) {
      runtime.path = candidate;
      break;
    }
    const char* why = ::dlerror();
    tried += (tried.empty() ? "" : "; ") + (why != nullptr ? std::string(why) : candidate);
  }
  if (runtime.handle == nullptr) {
    throw Error(BPL_ERR_UNAVAILABLE, std::string("Neuron runtime (") + kLibrary + ") not found (tried: " + tried +
                                         "); set NXD_CPU_MODE=1 to run on CPU with Gloo");
  }
  // The version first, so that a missing function can be reported against it.
  runtime.version = "unknown version";
  if (auto get_version = reinterpret_cast<int (*)(NrtVersion*, size_t)>(::dlsym(runtime.handle, "nrt_get_version"))) {
    NrtVersion version{};
    if (get_version(&version, sizeof(version)) == kNrtSuccess) {
      runtime.version = std::to_string(version.rt_major) + "." + std::to_string(version.rt_minor) + "." +
                        std::to_string(version.rt_patch) + "." + std::to_string(version.rt_maintenance);
      version.rt_detail[kNrtVersionDetailLength - 1] = '\0';
      if (version.rt_detail[0] != '\0') runtime.version += std::string(" (") + version.rt_detail + ")";
    }
  }
  for (const NrtSymbol& symbol : nrt_symbols(runtime.api)) {
    *symbol.slot = ::dlsym(runtime.handle, symbol.name);
    if (*symbol.slot == nullptr && symbol.required) {
      const std::string path = runtime.path, version = runtime.version;
      ::dlclose(runtime.handle);
      throw Error(BPL_ERR_UNAVAILABLE, "the Neuron runtime at " + path + " (version " + version + ") lacks " +
                                           symbol.name + ", which backplane needs; update the Neuron SDK");
    }
  }
  return runtime;
}

std::string nrt_status_name(int status) {
  switch (status) {
    case kNrtSuccess: return "NRT_SUCCESS";
    case kNrtFailure: return "NRT_FAILURE";
    case kNrtInvalid: return "NRT_INVALID";
    case kNrtInvalidHandle: return "NRT_INVALID_HANDLE";
    case kNrtResource: return "NRT_RESOURCE";
    case kNrtTimeout: return "NRT_TIMEOUT";
    case kNrtHwError: return "NRT_HW_ERROR";
    case kNrtQueueFull: return "NRT_QUEUE_FULL";
    case kNrtLoadNotEnoughNc: return "NRT_LOAD_NOT_ENOUGH_NC";
    case kNrtUnsupportedNeffVersion: return "NRT_UNSUPPORTED_NEFF_VERSION";
    case kNrtUninitialized: return "NRT_UNINITIALIZED";
    case kNrtClosed: return "NRT_CLOSED";
    case kNrtExecBadInput: return "NRT_EXEC_BAD_INPUT";
    case kNrtExecCompletedWithNumErr: return "NRT_EXEC_COMPLETED_WITH_NUM_ERR";
    case kNrtExecCompletedWithErr: return "NRT_EXEC_COMPLETED_WITH_ERR";
    case kNrtExecNcBusy: return "NRT_EXEC_NC_BUSY";
    case kNrtCollPending: return "NRT_COLL_PENDING";
    default: return "NRT_STATUS " + std::to_string(status);
  }
}

bpl_status to_bpl_status(int status) {
  switch (status) {
    case kNrtSuccess: return BPL_OK;
    case kNrtTimeout: return BPL_ERR_TIMEOUT;
    case kNrtResource: return BPL_ERR_OUT_OF_MEMORY;
    case kNrtInvalid:
    case kNrtInvalidHandle:
    case kNrtExecBadInput: return BPL_ERR_INVALID_ARGUMENT;
    case kNrtUnsupportedNeffVersion: return BPL_ERR_UNSUPPORTED;
    case kNrtLoadNotEnoughNc:
    case kNrtUninitialized:
    case kNrtClosed:
    case kNrtQueueFull:
    case kNrtExecNcBusy: return BPL_ERR_UNAVAILABLE;
    default: return BPL_ERR_INTERNAL;
  }
}

void check_nrt(int status, const std::string& call) {
  if (status != kNrtSuccess) throw Error(to_bpl_status(status), call + " failed: " + nrt_status_name(status));
}

NrtDtype nrt_dtype(bpl_dtype dtype) {
  switch (dtype) {
    case BPL_DTYPE_F32: return kNrtDtypeFloat32;
    case BPL_DTYPE_F16: return kNrtDtypeFloat16;
    case BPL_DTYPE_BF16: return kNrtDtypeBfloat16;
    case BPL_DTYPE_I8: return kNrtDtypeInt8;
    case BPL_DTYPE_U8: return kNrtDtypeUint8;
    case BPL_DTYPE_I32: return kNrtDtypeInt32;
    case BPL_DTYPE_I64: return kNrtDtypeInt64;
    default: return kNrtDtypeInvalid;
  }
}

bpl_dtype bpl_dtype_of(int code) {
  for (bpl_dtype dtype = BPL_DTYPE_F32; dtype <= BPL_DTYPE_I64; ++dtype) {
    if (nrt_dtype(dtype) == code && code != kNrtDtypeInvalid) return dtype;
  }
  return 0;
}

std::string root_comm_id(const char* configured, const std::string& master_addr, int master_port, int world_size) {
  if (configured != nullptr && *configured != '\0') {
    const std::string value = configured;
    const size_t colon = value.rfind(':');
    const std::string port = colon == std::string::npos ? "" : value.substr(colon + 1);
    if (colon == 0 || port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(port) == 0 || std::stoi(port) > 65535) {
      throw Error(BPL_ERR_INVALID_ARGUMENT,
                  "NEURON_RT_ROOT_COMM_ID='" + value + "' is not valid: expected host:port, such as 10.0.0.1:62182");
    }
    return value;
  }
  if (world_size <= 1) return "";
  if (master_addr.empty() || master_port <= 0) {
    throw Error(BPL_ERR_UNAVAILABLE, std::to_string(world_size) +
                                         " ranks need an address for the Neuron collectives to meet at: set "
                                         "MASTER_ADDR and MASTER_PORT (as torchrun and bpl-run do) or NEURON_RT_ROOT_COMM_ID");
  }
  if (master_port >= 65535) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "MASTER_PORT=" + std::to_string(master_port) +
                                              " leaves no port after it for NEURON_RT_ROOT_COMM_ID; set that variable");
  }
  return master_addr + ":" + std::to_string(master_port + 1);
}

std::vector<int> parse_visible_cores(const std::string& text) {
  auto invalid = [&](const std::string& why) {
    return Error(BPL_ERR_INVALID_ARGUMENT, "NEURON_RT_VISIBLE_CORES='" + text + "' is not valid: " + why +
                                               " (expected core indices and ranges such as 0-3 or 0,2,5-7)");
  };
  auto number = [&](const std::string& part) {
    if (part.empty() || part.size() > 6 || part.find_first_not_of("0123456789") != std::string::npos) {
      throw invalid("'" + part + "' is not a core index");
    }
    return std::stoi(part);
  };
  std::vector<int> cores;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(start, comma - start);
    const size_t dash = item.find('-');
    const int first = number(item.substr(0, dash));
    const int last = dash == std::string::npos ? first : number(item.substr(dash + 1));
    if (last < first) throw invalid("the range " + item + " descends");
    for (int core = first; core <= last; ++core) {
      if (std::find(cores.begin(), cores.end(), core) != cores.end()) {
        throw invalid("core " + std::to_string(core) + " is listed twice");
      }
      cores.push_back(core);
    }
    start = comma + 1;
  }
  return cores;
}

int core_for_local_rank(const char* visible_cores, int local_rank, int total_cores) {
  if (visible_cores != nullptr && *visible_cores != '\0') {
    const std::vector<int> cores = parse_visible_cores(visible_cores);
    if (local_rank >= static_cast<int>(cores.size())) {
      throw Error(BPL_ERR_UNAVAILABLE, "local rank " + std::to_string(local_rank) + " has no core: NEURON_RT_VISIBLE_CORES='" +
                                           visible_cores + "' lists " + std::to_string(cores.size()));
    }
    return cores[static_cast<size_t>(local_rank)];
  }
  if (local_rank >= total_cores) {
    throw Error(BPL_ERR_UNAVAILABLE, "local rank " + std::to_string(local_rank) + " has no core: the runtime reports " +
                                         std::to_string(total_cores) + " NeuronCore(s)");
  }
  return local_rank;
}

}  // namespace backplane::neuron_plugin
