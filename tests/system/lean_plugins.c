/* What a program that only communicates maps: run as a rank of any CPU backend (under bpl-run, mpirun,
 * or alone), it checks that after bpl_init and a collective no LibTorch, c10 or module of the plugin's
 * is mapped (/proc/self/maps), then that the first kernel maps the kernels module and computes what it
 * must. Prints "rank R: lean OK ..." and exits 0, or says what is wrong and exits 1.
 *
 *   lean_plugins                      the check above
 *   lean_plugins --module=absent DIR  the plugin in DIR has no kernels module beside it: bpl_init works,
 *                                     no kernels are offered, and a kernel is UNSUPPORTED naming the
 *                                     module and DIR
 *   lean_plugins --module=broken DIR  the module beside it is not a shared object: a kernel is
 *                                     UNSUPPORTED saying it could not be loaded */
#define _GNU_SOURCE
#include <backplane/backplane.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failed(int rank, const char* what, const char* detail) {
  printf("rank %d: FAILED: %s%s%s\n", rank, what, detail ? ": " : "", detail ? detail : "");
  return 1;
}

/* The first mapped file whose path contains any of `names` (NULL-terminated), copied to `found`. */
static int mapped(const char* const* names, char* found, size_t size) {
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[4096];
  int hit = 0;
  while (maps != NULL && !hit && fgets(line, sizeof(line), maps) != NULL) {
    const char* path = strchr(line, '/');
    if (path == NULL) continue;
    for (const char* const* name = names; *name != NULL && !hit; ++name) {
      if (strstr(path, *name) != NULL) {
        snprintf(found, size, "%s", path);
        found[strcspn(found, "\n")] = '\0';
        hit = 1;
      }
    }
  }
  if (maps != NULL) fclose(maps);
  return hit;
}

static int gemm_2x3x2(bpl_runtime* runtime) {
  const float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {7, 8, 9, 10, 11, 12};
  float c[4] = {0, 0, 0, 0};
  bpl_gemm_args args = BPL_GEMM_ARGS_INIT;
  args.dtype = BPL_DTYPE_F32;
  args.m = 2;
  args.n = 2;
  args.k = 3;
  args.a = a;
  args.lda = 3;
  args.b = b;
  args.ldb = 2;
  args.c = c;
  args.ldc = 2;
  args.alpha = 1.0;
  args.beta = 0.0;
  const bpl_status status = bpl_gemm(runtime, &args);
  if (status != BPL_OK) return status;
  const float expected[4] = {58, 64, 139, 154};
  return memcmp(c, expected, sizeof(c)) == 0 ? BPL_OK : -1;
}

static int without_module(bpl_runtime* runtime, const char* mode, const char* dir) {
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  bpl_runtime_describe(runtime, &info);
  const int status = gemm_2x3x2(runtime);
  const char* message = bpl_last_error();
  if (status != BPL_ERR_UNSUPPORTED) return failed(0, "a kernel without its module was not UNSUPPORTED", message);
  if (strstr(message, "libbpl-cpu-kernels.so") == NULL || strstr(message, dir) == NULL) {
    return failed(0, "the error does not name the module and its folder", message);
  }
  if (strcmp(mode, "absent") == 0) {
    if (info.kernels != 0 || info.program_formats[0] != '\0') return failed(0, "kernels offered without the module", NULL);
    if (strstr(message, "not installed") == NULL) return failed(0, "the error does not say it is not installed", message);
  } else if (strstr(message, "could not be loaded") == NULL) {
    return failed(0, "the error does not say the module could not be loaded", message);
  }
  printf("rank 0: module %s OK: %s\n", mode, message);
  return 0;
}

int main(int argc, char** argv) {
  bpl_runtime* runtime = NULL;
  if (bpl_init(NULL, &runtime) != BPL_OK) return failed(-1, "bpl_init", bpl_last_error());
  bpl_comm* world = NULL;
  int32_t rank = 0, size = 0;
  bpl_comm_world(runtime, &world);
  bpl_comm_rank(world, &rank);
  bpl_comm_size(world, &size);
  if (argc == 3 && strncmp(argv[1], "--module=", 9) == 0) {
    const int result = without_module(runtime, argv[1] + 9, argv[2]);
    bpl_finalize(runtime);
    return result;
  }

  float data[1024];
  for (int i = 0; i < 1024; ++i) data[i] = (float)(rank + 1);
  if (bpl_allreduce(world, data, data, 1024, BPL_DTYPE_F32, BPL_OP_SUM, NULL) != BPL_OK) {
    return failed(rank, "allreduce", bpl_last_error());
  }
  if (data[1023] != (float)(size * (size + 1) / 2)) return failed(rank, "allreduce gave a wrong sum", NULL);
  static const char* const heavy[] = {"libtorch", "libc10", "libbpl-cpu-kernels", "libbpl-torch-store", NULL};
  char found[4096];
  if (mapped(heavy, found, sizeof(found))) return failed(rank, "mapped after bpl_init and an allreduce", found);

  const int status = gemm_2x3x2(runtime);
  if (status != BPL_OK) return failed(rank, "gemm through the kernels module", bpl_last_error());
  static const char* const module[] = {"libbpl-cpu-kernels.so", NULL};
  static const char* const libtorch[] = {"libtorch_cpu", NULL};
  if (!mapped(module, found, sizeof(found))) return failed(rank, "the kernels module is not mapped after a kernel", NULL);
  if (!mapped(libtorch, found, sizeof(found))) return failed(rank, "LibTorch is not mapped after a kernel", NULL);
  static const char* const store[] = {"libbpl-torch-store", NULL};
  if (mapped(store, found, sizeof(found))) return failed(rank, "the torch store module is mapped", found);
  if (bpl_finalize(runtime) != BPL_OK) return failed(rank, "bpl_finalize", bpl_last_error());
  printf("rank %d: lean OK (nothing of LibTorch until the first kernel, which was right)\n", rank);
  return 0;
}
