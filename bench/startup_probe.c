/* The program whose start bpl-bench-startup measures, as an embedder writes it: initialise, one
 * allreduce of 1024 floats, finalise. Built twice: on backplane's C ABI (bpl-startup-probe) and on
 * Open MPI directly (bpl-startup-probe-raw-mpi, with BPL_PROBE_RAW_MPI). Each rank prints one line:
 *
 *   startup rank=R init_ns=T1 first_ns=T2 peak_rss_kb=K shared_objects=N libtorch=0|1
 *
 * T1 and T2 are CLOCK_REALTIME after init and after the first collective (the driver subtracts the
 * time it started the job); K is the peak resident set (VmHWM); N counts the distinct shared objects
 * mapped after the collective; libtorch says whether any of them is LibTorch or c10. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef BPL_PROBE_RAW_MPI
#include <mpi.h>
#else
#include <backplane/backplane.h>
#endif

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static long peak_rss_kb(void) {
  FILE* status = fopen("/proc/self/status", "r");
  char line[256];
  long kb = -1;
  while (status != NULL && fgets(line, sizeof(line), status) != NULL) {
    if (strncmp(line, "VmHWM:", 6) == 0) kb = strtol(line + 6, NULL, 10);
  }
  if (status != NULL) fclose(status);
  return kb;
}

/* Distinct files mapped whose name is a shared object's (".so" at the end or before a version). */
static int shared_objects(int* libtorch) {
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[4096];
  static char seen[1024][512];
  int count = 0;
  *libtorch = 0;
  while (maps != NULL && fgets(line, sizeof(line), maps) != NULL) {
    char* path = strchr(line, '/');
    if (path == NULL) continue;
    path[strcspn(path, "\n")] = '\0';
    const char* so = strstr(path, ".so");
    if (so == NULL || (so[3] != '\0' && so[3] != '.')) continue;
    int known = 0;
    for (int i = 0; i < count && !known; ++i) known = strcmp(seen[i], path) == 0;
    if (known || count == 1024) continue;
    snprintf(seen[count++], sizeof(seen[0]), "%s", path);
    if (strstr(path, "libtorch") != NULL || strstr(path, "libc10") != NULL) *libtorch = 1;
  }
  if (maps != NULL) fclose(maps);
  return count;
}

static int report(int rank, long long init_ns, long long first_ns) {
  int libtorch = 0;
  const int objects = shared_objects(&libtorch);
  printf("startup rank=%d init_ns=%lld first_ns=%lld peak_rss_kb=%ld shared_objects=%d libtorch=%d\n", rank, init_ns,
         first_ns, peak_rss_kb(), objects, libtorch);
  fflush(stdout);
  return 0;
}

int main(int argc, char** argv) {
  float data[1024];
  for (int i = 0; i < 1024; ++i) data[i] = 1.0f;
#ifdef BPL_PROBE_RAW_MPI
  MPI_Init(&argc, &argv);
  const long long init_ns = now_ns();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Allreduce(MPI_IN_PLACE, data, 1024, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const long long first_ns = now_ns();
  report(rank, init_ns, first_ns);
  MPI_Finalize();
  return 0;
#else
  (void)argc;
  (void)argv;
  bpl_runtime* runtime = NULL;
  if (bpl_init(NULL, &runtime) != BPL_OK) {
    fprintf(stderr, "bpl_init: %s\n", bpl_last_error());
    return 1;
  }
  const long long init_ns = now_ns();
  bpl_comm* world = NULL;
  int32_t rank = 0;
  if (bpl_comm_world(runtime, &world) != BPL_OK || bpl_comm_rank(world, &rank) != BPL_OK ||
      bpl_allreduce(world, data, data, 1024, BPL_DTYPE_F32, BPL_OP_SUM, NULL) != BPL_OK) {
    fprintf(stderr, "allreduce: %s\n", bpl_last_error());
    return 1;
  }
  const long long first_ns = now_ns();
  report(rank, init_ns, first_ns);
  return bpl_finalize(runtime) == BPL_OK ? 0 : 1;
#endif
}
