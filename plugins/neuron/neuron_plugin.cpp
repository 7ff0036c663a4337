// libbackplane-neuron.so: the Neuron backend on the Neuron Runtime's public C API (libnrt.so.1),
// loaded at run time, so that the plugin builds and opens without the Neuron SDK. This file is the
// runtime's process lifecycle and the device and program entries (the communicator entries are the
// shared ones of plugin_entry.h); device memory is in device_memory/neuron_core, collectives in
// collectives, programs in programs.
//
// Without the runtime, opening fails with BPL_ERR_UNAVAILABLE and how to run on CPU instead: explicit
// selection (BPL_BACKEND=neuron, NXD_CPU_MODE=0) reports it, auto selection moves on to mpi or gloo.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "backplane/plugin.h"
#include "collectives.h"
#include "neuron_core.h"
#include "plugin_entry.h"
#include "plugin_support.h"
#include "programs.h"
#include "runtime.h"

struct bpl_plugin_runtime {
  std::unique_ptr<backplane::neuron_plugin::NeuronCore> core;
  backplane::neuron_plugin::nrta_error_tracker_t* errors = nullptr;
  std::unique_ptr<backplane::neuron_plugin::NeuronComm> world;
  std::string details;
};

namespace backplane::neuron_plugin {
namespace {

constexpr const char* kName = "neuron";
// Address space for device pointers: more than any NeuronCore's memory, a small part of 47 bits.
constexpr size_t kDeviceAddressSpace = size_t{1} << 40;
// neuronx-cc takes minutes on large graphs; a compiler that hangs is still stopped.
constexpr std::chrono::hours kCompileTimeout{2};

constexpr uint64_t kCollectives = BPL_BIT(BPL_COLL_ALLREDUCE) | BPL_BIT(BPL_COLL_BROADCAST) | BPL_BIT(BPL_COLL_REDUCE) |
                                  BPL_BIT(BPL_COLL_ALLGATHER) | BPL_BIT(BPL_COLL_REDUCE_SCATTER) |
                                  BPL_BIT(BPL_COLL_BARRIER) | BPL_BIT(BPL_COLL_COMM_SPLIT);
constexpr uint32_t kDtypes = static_cast<uint32_t>(BPL_BIT(BPL_DTYPE_F32) | BPL_BIT(BPL_DTYPE_F16) |
                                                   BPL_BIT(BPL_DTYPE_BF16) | BPL_BIT(BPL_DTYPE_I8) | BPL_BIT(BPL_DTYPE_U8) |
                                                   BPL_BIT(BPL_DTYPE_I32) | BPL_BIT(BPL_DTYPE_I64));
constexpr uint32_t kReduceOps = static_cast<uint32_t>(BPL_BIT(BPL_OP_SUM) | BPL_BIT(BPL_OP_MIN) | BPL_BIT(BPL_OP_MAX));

bpl_status classify(const std::exception&) { return BPL_ERR_INTERNAL; }

template <typename Body>
bpl_status guarded(Body&& body) noexcept {
  return plugin::guarded(kName, classify, std::forward<Body>(body));
}

NeffProgram* unwrap(bpl_plugin_program* program) { return reinterpret_cast<NeffProgram*>(program); }

// The runtime is loaded once per process (it cannot be unloaded safely) and initialised while any
// bpl runtime uses it.
struct ProcessState {
  std::mutex mutex;
  std::optional<LoadedRuntime> runtime;
  int runtimes = 0;
  std::optional<std::string> configured_cores;  // NEURON_RT_VISIBLE_CORES before the plugin pinned a core
};
ProcessState& state() {
  static ProcessState s;
  return s;
}
const NrtApi& api() { return state().runtime->api; }

std::string env(const char* name) {
  const char* value = plugin::env(name);
  return value != nullptr ? value : "";
}

// Before nrt_init: this process sees only its own core (as torch-neuronx arranges under torchrun), and
// the collectives know where to bootstrap.
int prepare_environment(const bpl_launch_info& launch, std::string& root) {
  ProcessState& s = state();
  if (!s.configured_cores) s.configured_cores = env("NEURON_RT_VISIBLE_CORES");
  uint32_t total = 0;
  check_nrt(api().nrt_get_total_vnc_count(&total), "nrt_get_total_vnc_count");
  const int core = core_for_local_rank(s.configured_cores->c_str(), launch.local_rank, static_cast<int>(total));
  ::setenv("NEURON_RT_VISIBLE_CORES", std::to_string(core).c_str(), 1);
  const std::string configured_root = env("NEURON_RT_ROOT_COMM_ID");
  root = root_comm_id(configured_root.c_str(), launch.master_addr, launch.master_port, launch.world_size);
  if (configured_root.empty() && !root.empty()) ::setenv("NEURON_RT_ROOT_COMM_ID", root.c_str(), 1);
  return core;
}

bpl_status runtime_create(const bpl_launch_info* launch, bpl_plugin_runtime** out) {
  return guarded([&] {
    plugin::refuse_native_comm(*launch, kName);
    ProcessState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    std::string root;
    const int physical_core = prepare_environment(*launch, root);
    if (s.runtimes == 0) {
      check_nrt(api().nrt_init(kNrtFrameworkNoFw, "", "backplane " BPL_VERSION), "nrt_init");
    }
    ++s.runtimes;
    auto runtime = std::make_unique<bpl_plugin_runtime>();
    auto close_on_failure = [&] {
      if (runtime->errors != nullptr) api().nrta_error_tracker_destroy(runtime->errors);
      if (--s.runtimes == 0) api().nrt_close();
    };
    try {
      runtime->core = std::make_unique<NeuronCore>(api(), physical_core, kDeviceAddressSpace);
      runtime->core->timeout = std::chrono::milliseconds(launch->timeout_ms);
      check_nrt(api().nrta_error_tracker_create(runtime->core->vnc, &runtime->errors), "nrta_error_tracker_create");
      check_nrt(api().nrt_cc_global_comm_init(runtime->core->vnc, launch->rank, launch->world_size),
                "nrt_cc_global_comm_init (rank " + std::to_string(launch->rank) + " of " +
                    std::to_string(launch->world_size) + (root.empty() ? "" : ", root " + root) + ")");
    } catch (...) {
      close_on_failure();
      throw;
    }
    std::vector<uint32_t> everyone(static_cast<size_t>(launch->world_size));
    for (size_t r = 0; r < everyone.size(); ++r) everyone[r] = static_cast<uint32_t>(r);
    runtime->world = std::make_unique<NeuronComm>(*runtime->core, runtime->errors, std::move(everyone), launch->rank,
                                                  launch->rank, launch->world_size,
                                                  std::chrono::milliseconds(launch->timeout_ms));
    std::string memory;
    if (api().nrt_get_vnc_memory_stats != nullptr) {
      NrtVncMemoryStats stats{};
      size_t written = 0;
      if (api().nrt_get_vnc_memory_stats(runtime->core->vnc, &stats, sizeof(stats), &written) == kNrtSuccess) {
        memory = "; device_memory=" + std::to_string(stats.bytes_limit) + " bytes";
      }
    }
    runtime->details = "runtime=" + s.runtime->version + " at " + s.runtime->path +
                       "; core=" + std::to_string(physical_core) + memory + (root.empty() ? "" : "; root_comm=" + root) +
                       "; broadcast=runtime allgather; reduce=runtime allreduce; host buffers staged in device memory";
    *out = runtime.release();
    return BPL_OK;
  });
}

bpl_status runtime_destroy(bpl_plugin_runtime* rt) {
  return guarded([&] {
    ProcessState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    rt->world.reset();
    // Memory the program did not free goes with the runtime, as the process's memory would.
    for (nrt_tensor_t* tensor : rt->core->memory.tensors()) api().nrt_tensor_free(&tensor);
    api().nrta_error_tracker_destroy(rt->errors);
    delete rt;
    if (--s.runtimes == 0) api().nrt_close();
    return BPL_OK;
  });
}

bpl_status runtime_describe(bpl_plugin_runtime* rt, bpl_plugin_caps* out) {
  out->collectives = kCollectives;
  out->dtypes = kDtypes;
  out->reduce_ops = kReduceOps;
  out->details = rt->details.c_str();
  out->kernels = 0;  // typed kernels need compiled NEFFs: run them as programs
  out->program_formats = "neff hlo";
  return BPL_OK;
}

/* ---- device ---- */

bpl_status device_count(bpl_plugin_runtime*, int32_t* count) {
  *count = 1;  // the rank's own NeuronCore
  return BPL_OK;
}

bpl_status device_properties(bpl_plugin_runtime* rt, int32_t device, bpl_device_properties* out) {
  return guarded([&] {
    const std::string name = "NeuronCore " + std::to_string(rt->core->core);
    std::strncpy(out->name, name.c_str(), sizeof(out->name) - 1);
    out->kind = BPL_DEVICE_ACCELERATOR;
    out->index = device;
    if (api().nrt_get_vnc_memory_stats != nullptr) {
      NrtVncMemoryStats stats{};
      size_t written = 0;
      check_nrt(api().nrt_get_vnc_memory_stats(rt->core->vnc, &stats, sizeof(stats), &written),
                "nrt_get_vnc_memory_stats");
      out->total_memory = stats.bytes_limit;
      out->free_memory = stats.bytes_limit > stats.bytes_used ? stats.bytes_limit - stats.bytes_used : 0;
    }
    return BPL_OK;
  });
}

bpl_status mem_alloc(bpl_plugin_runtime* rt, int32_t, size_t bytes, void** ptr) {
  return guarded([&] {
    OwnedTensor tensor = allocate_device_tensor(*rt->core, bytes, "bpl_malloc");
    *ptr = rt->core->memory.insert(tensor.get(), bytes);
    tensor.release();  // now owned by the address space
    return BPL_OK;
  });
}

bpl_status mem_free(bpl_plugin_runtime* rt, void* ptr) {
  return guarded([&] {
    nrt_tensor_t* tensor = rt->core->memory.erase(ptr);
    api().nrt_tensor_free(&tensor);
    return BPL_OK;
  });
}

void require_host(const NeuronCore& core, const void* ptr, const char* what, const char* kind) {
  if (core.memory.find(ptr)) {
    throw plugin::Error(BPL_ERR_INVALID_ARGUMENT, std::string(what) + " is device memory, but kind = " + kind +
                                                      " says host memory");
  }
}

bpl_status mem_copy(bpl_plugin_runtime* rt, void* dst, const void* src, size_t bytes, bpl_memcpy_kind kind) {
  return guarded([&] {
    const NeuronCore& core = *rt->core;
    switch (kind) {
      case BPL_MEMCPY_HOST_TO_HOST:
        require_host(core, dst, "dst", "BPL_MEMCPY_HOST_TO_HOST");
        require_host(core, src, "src", "BPL_MEMCPY_HOST_TO_HOST");
        std::memcpy(dst, src, bytes);
        break;
      case BPL_MEMCPY_HOST_TO_DEVICE: {
        require_host(core, src, "src", "BPL_MEMCPY_HOST_TO_DEVICE");
        const DeviceAddressSpace::Location to = core.memory.locate(dst, bytes, "dst");
        check_nrt(api().nrt_tensor_write(to.tensor, src, to.offset, bytes), "nrt_tensor_write");
        break;
      }
      case BPL_MEMCPY_DEVICE_TO_HOST: {
        require_host(core, dst, "dst", "BPL_MEMCPY_DEVICE_TO_HOST");
        const DeviceAddressSpace::Location from = core.memory.locate(src, bytes, "src");
        check_nrt(api().nrt_tensor_read(from.tensor, dst, from.offset, bytes), "nrt_tensor_read");
        break;
      }
      default: {
        const DeviceAddressSpace::Location to = core.memory.locate(dst, bytes, "dst");
        const DeviceAddressSpace::Location from = core.memory.locate(src, bytes, "src");
        check_nrt(api().nrt_tensor_copy(from.tensor, from.offset, to.tensor, to.offset, bytes), "nrt_tensor_copy");
      }
    }
    return BPL_OK;
  });
}

/* ---- programs ---- */

bpl_status program_compiler(bpl_plugin_runtime* rt, const char* format, const char** compiler) {
  return guarded([&] {
    static std::string hlo_compiler;  // the compiler's id does not change under a running process
    if (std::strcmp(format, "neff") == 0) {
      *compiler = "neff";  // already compiled: the cache keeps the NEFF as it was given
    } else {
      hlo_compiler = neuronx_cc_id(rt->core->timeout);
      *compiler = hlo_compiler.c_str();
    }
    return BPL_OK;
  });
}

bpl_status program_compile(bpl_plugin_runtime*, const char* format, const void* source, size_t source_size,
                           const char* flags, void** artifact, size_t* artifact_size) {
  return guarded([&] {
    std::vector<char> neff;
    if (std::strcmp(format, "neff") == 0) {
      neff.assign(static_cast<const char*>(source), static_cast<const char*>(source) + source_size);
    } else {
      neff = compile_hlo(source, source_size, flags != nullptr ? flags : "", kCompileTimeout);
    }
    *artifact = std::malloc(neff.size());
    if (*artifact == nullptr) throw std::bad_alloc();
    std::memcpy(*artifact, neff.data(), neff.size());
    *artifact_size = neff.size();
    return BPL_OK;
  });
}

void artifact_free(void* artifact) { std::free(artifact); }

bpl_status program_load(bpl_plugin_runtime* rt, const char*, const void* artifact, size_t artifact_size,
                        const bpl_program_options* options, bpl_plugin_program** out) {
  return guarded([&] {
    if (options->entry != nullptr && std::strcmp(options->entry, "forward") != 0) {
      throw plugin::Error(BPL_ERR_INVALID_ARGUMENT, std::string("options->entry = '") + options->entry +
                                                        "': a NEFF has one entry; pass NULL or \"forward\"");
    }
    *out = reinterpret_cast<bpl_plugin_program*>(new NeffProgram(*rt->core, artifact, artifact_size));
    return BPL_OK;
  });
}

bpl_status program_run(bpl_plugin_program* program, const bpl_tensor* inputs, int32_t num_inputs, bpl_tensor* outputs,
                       int32_t num_outputs) {
  return guarded([&] {
    unwrap(program)->run(inputs, num_inputs, outputs, num_outputs);
    return BPL_OK;
  });
}

bpl_status program_destroy(bpl_plugin_program* program) {
  return guarded([&] {
    delete unwrap(program);
    return BPL_OK;
  });
}

struct Traits {
  static constexpr const char* kName = neuron_plugin::kName;
  static bpl_status classify(const std::exception& e) { return neuron_plugin::classify(e); }
  using Comm = NeuronComm;  // no alltoall, send, recv (not in the runtime), nor abort (the core releases waits)
  using Request = neuron_plugin::Request;
  static Comm* world(bpl_plugin_runtime* rt) { return rt->world.get(); }
};

bpl_plugin_api make_table() {
  bpl_plugin_api api = plugin::comm_table<Traits>();
  api.runtime_create = runtime_create;
  api.runtime_destroy = runtime_destroy;
  api.runtime_describe = runtime_describe;
  api.device_count = device_count;
  api.device_properties = device_properties;
  api.mem_alloc = mem_alloc;
  api.mem_free = mem_free;
  api.mem_copy = mem_copy;
  // synchronize stays NULL: copies, collectives waited for and programs all complete before returning.
  // Typed kernels stay NULL: they need compiled NEFFs (see runtime_describe).
  api.program_compiler = program_compiler;
  api.program_compile = program_compile;
  api.artifact_free = artifact_free;
  api.program_load = program_load;
  api.program_run = program_run;
  api.program_destroy = program_destroy;
  return api;
}

const bpl_plugin_api kApi = make_table();

}  // namespace
}  // namespace backplane::neuron_plugin

extern "C" bpl_status bpl_plugin_open_v1(const bpl_host_api* host, const bpl_plugin_api** out) {
  using namespace backplane::neuron_plugin;
  return backplane::plugin::open_plugin<Traits>(host, &kApi, out, [host] {
    ProcessState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.runtime) s.runtime = load_runtime(runtime_candidates(host->get_env("NEURON_RT_LIB")));
  });
}
