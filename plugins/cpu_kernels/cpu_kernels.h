// The kernel and program half of the plugin ABI for CPU backends, on LibTorch: one implementation, the
// module libbpl-cpu-kernels.so that the gloo and mpi plugins load on first use (kernels_module.h). Kernels wrap the caller's buffers
// (at::from_blob) and write results in place; programs are TorchScript modules, compiled to their
// serialized form (the artifact the core's compile cache keeps) and run on the caller's buffers.
#pragma once

#include "backplane/plugin.h"

namespace backplane::cpu_kernels {

bpl_status gemm(bpl_plugin_runtime* rt, const bpl_gemm_args* args);
bpl_status elementwise(bpl_plugin_runtime* rt, bpl_kernel kernel, const bpl_elementwise_args* args);
bpl_status cast(bpl_plugin_runtime* rt, const bpl_cast_args* args);

bpl_status program_compiler(bpl_plugin_runtime* rt, const char* format, const char** compiler);
bpl_status program_compile(bpl_plugin_runtime* rt, const char* format, const void* source, size_t source_size,
                           const char* flags, void** artifact, size_t* artifact_size);
void artifact_free(void* artifact);
bpl_status program_load(bpl_plugin_runtime* rt, const char* format, const void* artifact, size_t artifact_size,
                        const bpl_program_options* options, bpl_plugin_program** out);
bpl_status program_run(bpl_plugin_program* program, const bpl_tensor* inputs, int32_t num_inputs, bpl_tensor* outputs,
                       int32_t num_outputs);
bpl_status program_destroy(bpl_plugin_program* program);

}  // namespace backplane::cpu_kernels
