// The kernels and programs of the CPU backends (gloo, mpi) run on LibTorch, which a program that only
// communicates should never map: hundreds of shared objects and seconds of start-up. So they live in a
// module of their own, libbpl-cpu-kernels.so (plugins/cpu_kernels), beside the plugin that uses it, and
// the plugin loads it the first time a program asks for a kernel or a program. This is the plugin's
// side: the table entries that load the module and forward to it, and what the plugin reports of it.
#pragma once

#include <string>

#include "backplane/plugin.h"
#include "host_device.h"

namespace backplane::kernels_module {

// The module's file name, looked for in the folder of the plugin that links this code (and nowhere
// else: what the installer put beside the plugin).
constexpr const char* kFileName = "libbpl-cpu-kernels.so";

// The one symbol the module exports. It sets the calling plugin's `host` and `backend` name for its
// messages and fills the kernel and program entries of `table` (struct_size set by the caller).
constexpr const char* kEntrySymbol = "bpl_cpu_kernels_open_v1";
using OpenFunction = bpl_status (*)(const bpl_host_api* host, const char* backend, bpl_plugin_api* table);

constexpr uint32_t kKernels = BPL_BIT(BPL_KERNEL_GEMM) | BPL_BIT(BPL_KERNEL_ADD) | BPL_BIT(BPL_KERNEL_SCALE) |
                              BPL_BIT(BPL_KERNEL_AXPBY) | BPL_BIT(BPL_KERNEL_CAST);
constexpr const char* kProgramFormats = "torchscript";

// Where the module is (or would be): <the plugin's folder>/libbpl-cpu-kernels.so.
std::string path();

// Puts entries in the plugin's table that load the module on their first call and forward to it. If
// the module cannot be loaded, each returns BPL_ERR_UNSUPPORTED naming the file and why.
void set_kernels(bpl_plugin_api& api);

// The kernels and program formats the plugin can offer: the module's when its file is installed,
// none otherwise (looked up without loading it).
void describe(bpl_plugin_caps& caps);

// runtime_describe of a CPU plugin (gloo, mpi): every collective, dtype and reduce op of the ABI, on
// host memory; the runtime's `details`; the module's kernels and program formats.
template <typename Runtime>
bpl_status describe_cpu_runtime(Runtime* runtime, bpl_plugin_caps* out) {
  out->collectives = plugin::kAllCollectives;
  out->dtypes = plugin::kAllDtypes;
  out->reduce_ops = plugin::kAllReduceOps;
  out->details = runtime->details.c_str();
  describe(*out);
  return BPL_OK;
}

// For the plugin's details: "kernels=<path> (loaded on first use)", or "kernels=none: the kernels
// module <path> is not installed".
std::string details();

}  // namespace backplane::kernels_module
