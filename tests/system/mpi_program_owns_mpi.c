/* A program that initialises MPI itself, uses backplane's mpi backend in between, and keeps using MPI
 * after bpl_finalize: backplane must neither initialise MPI again nor finalise it. Run under mpirun. */
#include <backplane/backplane.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

static int fail(const char* what) {
  fprintf(stderr, "%s failed: %s\n", what, bpl_last_error());
  return 1;
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.backend = "mpi";
  bpl_runtime* runtime = NULL;
  if (bpl_init(&options, &runtime) != BPL_OK) return fail("bpl_init");
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  bpl_runtime_describe(runtime, &info);
  if (strstr(info.details, "initialised by the program") == NULL || strstr(info.details, "MPI_THREAD_SERIALIZED") == NULL) {
    fprintf(stderr, "rank %d: details do not say MPI came from the program at its thread level: %s\n", rank, info.details);
    return 1;
  }
  bpl_comm* world = NULL;
  bpl_comm_world(runtime, &world);
  int value = rank + 1;
  if (bpl_allreduce(world, &value, &value, 1, BPL_DTYPE_I32, BPL_OP_SUM, NULL) != BPL_OK) return fail("bpl_allreduce");
  if (bpl_finalize(runtime) != BPL_OK) return fail("bpl_finalize");

  int finalized = 1;
  MPI_Finalized(&finalized);
  int again = rank + 1, total = 0;
  MPI_Allreduce(&again, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  const int expected = size * (size + 1) / 2;
  if (finalized || value != expected || total != expected) {
    fprintf(stderr, "rank %d: finalized=%d backplane sum=%d MPI sum=%d expected %d\n", rank, finalized, value, total,
            expected);
    return 1;
  }
  if (rank == 0) printf("program-owned MPI: backplane sum %d, MPI sum after bpl_finalize %d: ok\n", value, total);
  MPI_Finalize();
  return 0;
}
