#include "kernels_module.h"

#include "plugin_support.h"
#include "side_module.h"

namespace backplane::kernels_module {
namespace {

using plugin::Error;

plugin::SideModuleState state() { return plugin::side_module_state(kFileName, "the kernels module"); }

// The module's table, or why there is none: loaded once by each load of the plugin; a failure is kept
// too, and repeated by every call.
struct Loaded {
  bpl_plugin_api table{};
  std::string failure;
};

Loaded load() {
  Loaded loaded;
  plugin::SideModule module = plugin::load_side_module(kFileName, "the kernels module");
  auto open = reinterpret_cast<OpenFunction>(module.symbol(kEntrySymbol));
  if (open == nullptr) {
    loaded.failure = module.failure + " (the " + plugin::name() + " backend's kernels and programs live in it)";
    return loaded;
  }
  loaded.table.struct_size = sizeof(loaded.table);
  if (open(plugin::host(), plugin::name(), &loaded.table) != BPL_OK) {
    loaded.failure = "the kernels module " + module.path + " refused to open";
  }
  return loaded;
}

const bpl_plugin_api& module_table() {
  static const Loaded loaded = load();
  if (!loaded.failure.empty()) throw Error(BPL_ERR_UNSUPPORTED, loaded.failure);
  return loaded.table;
}

bpl_status classify(const std::exception&) { return BPL_ERR_INTERNAL; }

// Loads the module (once) and calls its entry `field` with `args`; a module that cannot be loaded is
// UNSUPPORTED, said through the host like any failure of the plugin.
template <typename Field, typename... Args>
bpl_status forward(Field bpl_plugin_api::*field, Args... args) {
  const bpl_plugin_api* table = nullptr;
  const bpl_status status = plugin::guarded(plugin::name(), classify, [&] {
    table = &module_table();
    return BPL_OK;
  });
  if (status != BPL_OK) return status;
  return (table->*field)(args...);
}

bpl_status gemm(bpl_plugin_runtime* rt, const bpl_gemm_args* args) { return forward(&bpl_plugin_api::gemm, rt, args); }

bpl_status elementwise(bpl_plugin_runtime* rt, bpl_kernel kernel, const bpl_elementwise_args* args) {
  return forward(&bpl_plugin_api::elementwise, rt, kernel, args);
}

bpl_status cast(bpl_plugin_runtime* rt, const bpl_cast_args* args) { return forward(&bpl_plugin_api::cast, rt, args); }

bpl_status program_compiler(bpl_plugin_runtime* rt, const char* format, const char** compiler) {
  return forward(&bpl_plugin_api::program_compiler, rt, format, compiler);
}

bpl_status program_compile(bpl_plugin_runtime* rt, const char* format, const void* source, size_t source_size,
                           const char* flags, void** artifact, size_t* artifact_size) {
  return forward(&bpl_plugin_api::program_compile, rt, format, source, source_size, flags, artifact, artifact_size);
}

// Only ever given what the module made, so the module is loaded; nothing may throw across the C
// boundary all the same (a void entry has no status to carry a failure).
void artifact_free(void* artifact) noexcept {
  try {
    module_table().artifact_free(artifact);
  } catch (const std::exception& e) {
    plugin::log(BPL_LOG_ERROR, plugin::name(), std::string("artifact_free: ") + e.what());
  }
}

bpl_status program_load(bpl_plugin_runtime* rt, const char* format, const void* artifact, size_t artifact_size,
                        const bpl_program_options* options, bpl_plugin_program** out) {
  return forward(&bpl_plugin_api::program_load, rt, format, artifact, artifact_size, options, out);
}

bpl_status program_run(bpl_plugin_program* program, const bpl_tensor* inputs, int32_t num_inputs, bpl_tensor* outputs,
                       int32_t num_outputs) {
  return forward(&bpl_plugin_api::program_run, program, inputs, num_inputs, outputs, num_outputs);
}

bpl_status program_destroy(bpl_plugin_program* program) { return forward(&bpl_plugin_api::program_destroy, program); }

}  // namespace

std::string path() { return plugin::side_module_path(kFileName); }

void set_kernels(bpl_plugin_api& api) {
  api.gemm = gemm;
  api.elementwise = elementwise;
  api.cast = cast;
  api.program_compiler = program_compiler;
  api.program_compile = program_compile;
  api.artifact_free = artifact_free;
  api.program_load = program_load;
  api.program_run = program_run;
  api.program_destroy = program_destroy;
}

void describe(bpl_plugin_caps& caps) {
  const bool present = state().loadable;
  caps.kernels = present ? kKernels : 0;
  caps.program_formats = present ? kProgramFormats : "";
}

std::string details() {
  const plugin::SideModuleState now = state();
  return now.loadable ? "kernels=" + path() + " (loaded on first use)" : "kernels=none: " + now.why_not;
}

}  // namespace backplane::kernels_module
