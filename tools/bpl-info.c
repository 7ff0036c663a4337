/* bpl-info: which backend plugins are installed (path, version, ABI), which one the current
 * environment selects and why, and with --init, what the selected runtime reports once started.
 * Written in C against backplane.h alone, like any embedder. */
#include <backplane/backplane.h>
#include <stdio.h>
#include <string.h>

static const char* const known_backends[] = {"gloo", "mpi", "neuron"};

static const char* kernel_name(int32_t kernel) {
  static const char* const names[] = {"?", "gemm", "add", "scale", "axpby", "cast"};
  return kernel >= BPL_KERNEL_GEMM && kernel <= BPL_KERNEL_CAST ? names[kernel] : "?";
}

static void print_mask(const char* label, uint64_t mask, const char* (*name)(int32_t), int32_t first, int32_t last) {
  printf("  %-12s", label);
  for (int32_t v = first; v <= last; ++v) {
    if (mask & BPL_BIT(v)) printf(" %s", name(v));
  }
  printf("\n");
}

/* Every kind the header lists (BPL_FOR_EACH_COLLECTIVE) that the backend provides. */
static void print_collectives(uint64_t mask) {
#define BPL_CODE_OF(code, name, minor) code,
  static const bpl_collective kinds[] = {BPL_FOR_EACH_COLLECTIVE(BPL_CODE_OF)};
#undef BPL_CODE_OF
  printf("  %-12s", "collectives");
  for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); ++i) {
    if (mask & BPL_BIT(kinds[i])) printf(" %s", bpl_collective_name(kinds[i]));
  }
  printf("\n");
}

static void describe_runtime(bpl_runtime* runtime) {
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  bpl_runtime_describe(runtime, &info);
  printf("\nRuntime (rank %d of %d, local %d of %d, from %s):\n", info.rank, info.world_size, info.local_rank,
         info.local_world_size, info.launcher);
  printf("  backend      %s %s (ABI %d.%d)\n", info.backend, info.plugin_version, info.plugin_abi_major,
         info.plugin_abi_minor);
  printf("  plugin       %s\n", info.plugin_path);
  printf("  selected by  %s\n", info.selection_reason);
  printf("  details      %s\n", info.details);
  printf("  devices      %d\n", info.device_count);
  printf("  timeout      %lld ms\n", (long long)info.timeout_ms);
  print_collectives(info.collectives);
  print_mask("dtypes", info.dtypes, bpl_dtype_name, BPL_DTYPE_F32, BPL_DTYPE_I64);
  print_mask("reduce ops", info.reduce_ops, bpl_reduce_op_name, BPL_OP_SUM, BPL_OP_BXOR);
  print_mask("kernels", info.kernels, kernel_name, BPL_KERNEL_GEMM, BPL_KERNEL_CAST);
  printf("  programs     %s\n", info.program_formats[0] ? info.program_formats : "none");
}

int main(int argc, char** argv) {
  int init = 0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--init") == 0) {
      init = 1;
    } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      printf("usage: bpl-info [--init] [--version]\n"
             "  lists the backend plugins found and the backend this environment selects;\n"
             "  --init also starts that backend (a collective step under a launcher) and describes it\n");
      return 0;
    } else if (strcmp(argv[i], "--version") == 0) {
      int32_t major = 0, minor = 0;
      bpl_abi_version(&major, &minor);
      printf("bpl-info (backplane) %s, libbackplane ABI %d.%d\n", BPL_VERSION, major, minor);
      return 0;
    } else {
      fprintf(stderr, "bpl-info: unknown argument '%s'\nusage: bpl-info [--init] [--version] (--help says more)\n", argv[i]);
      return 2;
    }
  }

  /* Under a launcher every rank starts the backend (it is collective) but only rank 0 reports. */
  bpl_runtime* runtime = NULL;
  if (init) {
    bpl_status status = bpl_init(NULL, &runtime);
    if (status != BPL_OK) {
      fprintf(stderr, "bpl-info: bpl_init failed: %s: %s\n", bpl_status_name(status), bpl_last_error());
      return 1;
    }
    bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
    bpl_runtime_describe(runtime, &info);
    if (info.rank != 0) return bpl_finalize(runtime) == BPL_OK ? 0 : 1;
  }

  int32_t major = 0, minor = 0;
  bpl_abi_version(&major, &minor);
  printf("backplane ABI %d.%d\n\nPlugins:\n", major, minor);
  for (size_t i = 0; i < sizeof(known_backends) / sizeof(known_backends[0]); ++i) {
    bpl_plugin_info plugin = BPL_PLUGIN_INFO_INIT;
    if (bpl_plugin_probe(known_backends[i], &plugin) == BPL_OK) {
      printf("  %-7s %-8s ABI %d.%d  %s\n", plugin.name, plugin.version, plugin.abi_major, plugin.abi_minor,
             plugin.path);
    } else {
      printf("  %-7s not available: %s\n", known_backends[i], bpl_last_error());
    }
  }

  bpl_selection selection = BPL_SELECTION_INIT;
  bpl_status status = bpl_select_backend(NULL, &selection);
  printf("\nPlugin folders, searched in order (BPL_PLUGIN_PATH, then the one beside libbackplane.so):\n");
  for (const char* folder = selection.plugin_folders; *folder != '\0';) {
    const size_t length = strcspn(folder, ":");
    printf("  %.*s\n", (int)length, folder);
    folder += length + (folder[length] == ':');
  }
  printf("\nSelection for this environment:\n  backend      %s\n  because      %s\n", selection.backend,
         selection.reason);
  if (status != BPL_OK) {
    printf("  plugin       none: %s\n", bpl_last_error());
  } else {
    printf("  plugin       %s\n", selection.plugin_path);
  }
  if (!init) return status == BPL_OK ? 0 : 1;
  describe_runtime(runtime);
  return bpl_finalize(runtime) == BPL_OK ? 0 : 1;
}
