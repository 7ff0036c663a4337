/* Compiled as strict C99 with -pedantic -Werror: the public headers are valid C for every embedder,
 * and their initializers are complete. */
#include <backplane/backplane.h>
#include <backplane/plugin.h>

int bpl_header_check(void);
int bpl_header_check(void) {
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  bpl_selection selection = BPL_SELECTION_INIT;
  bpl_plugin_info plugin = BPL_PLUGIN_INFO_INIT;
  bpl_device_properties props = BPL_DEVICE_PROPERTIES_INIT;
  bpl_gemm_args gemm = BPL_GEMM_ARGS_INIT;
  bpl_elementwise_args elementwise = BPL_ELEMENTWISE_ARGS_INIT;
  bpl_cast_args cast = BPL_CAST_ARGS_INIT;
  bpl_program_options program = BPL_PROGRAM_OPTIONS_INIT;
  bpl_tensor tensor = BPL_TENSOR_INIT;
  return (int)(options.struct_size + info.struct_size + selection.struct_size + plugin.struct_size + props.struct_size +
               gemm.struct_size + elementwise.struct_size + cast.struct_size + program.struct_size + tensor.struct_size);
}
