// The entry of libbpl-cpu-kernels.so, which a CPU plugin loads the first time a program asks for a
// kernel or a program (plugins/common/kernels_module.h).
#include <string>

#include "cpu_kernels.h"
#include "kernels_module.h"
#include "plugin_support.h"

extern "C" __attribute__((visibility("default"))) bpl_status bpl_cpu_kernels_open_v1(const bpl_host_api* host,
                                                                                   const char* backend,
                                                                                   bpl_plugin_api* table) {
  using namespace backplane;
  if (host == nullptr || backend == nullptr || table == nullptr || table->struct_size < sizeof(bpl_plugin_api)) {
    return BPL_ERR_INVALID_ARGUMENT;
  }
  // The messages of this module's failures go where the plugin's go, under the plugin's name (a copy:
  // the module outlives a plugin that is unloaded and loaded again).
  static std::string name;
  name = backend;
  plugin::host() = host;
  plugin::name() = name.c_str();
  table->gemm = cpu_kernels::gemm;
  table->elementwise = cpu_kernels::elementwise;
  table->cast = cpu_kernels::cast;
  table->program_compiler = cpu_kernels::program_compiler;
  table->program_compile = cpu_kernels::program_compile;
  table->artifact_free = cpu_kernels::artifact_free;
  table->program_load = cpu_kernels::program_load;
  table->program_run = cpu_kernels::program_run;
  table->program_destroy = cpu_kernels::program_destroy;
  return BPL_OK;
}
