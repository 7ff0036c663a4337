/* A program that runs MPI itself and hands backplane one half of MPI_COMM_WORLD as its world
 * (bpl_init_options.native_comm, ABI 1.4): the even and the odd ranks each make a backplane job of
 * their own, side by side, and MPI stays the program's after bpl_finalize. Bad native communicators
 * are refused naming what was expected. Run under mpirun with 4 ranks; every rank checks everything
 * and exits non-zero on the first thing that is wrong. */
#include <backplane/backplane.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

static int rank = 0;

static int fail(const char* what) {
  fprintf(stderr, "rank %d: %s failed: %s\n", rank, what, bpl_last_error());
  return 1;
}

/* bpl_init with `options` must fail with `status`, its message containing `text`. */
static int refused(const bpl_init_options* options, bpl_status status, const char* text, const char* what) {
  bpl_runtime* runtime = NULL;
  const bpl_status got = bpl_init(options, &runtime);
  if (got == status && runtime == NULL && strstr(bpl_last_error(), text) != NULL) return 0;
  fprintf(stderr, "rank %d: %s: expected %s naming \"%s\", got %s: %s\n", rank, what, bpl_status_name(status), text,
          bpl_status_name(got), bpl_last_error());
  return 1;
}

int main(int argc, char** argv) {
  int provided = 0, size = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int color = rank % 2;
  MPI_Comm half = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, rank, &half);
  int half_rank = 0, half_size = 0;
  MPI_Comm_rank(half, &half_rank);
  MPI_Comm_size(half, &half_size);

  /* Refused before anything is collective: placement given beside it, MPI_COMM_NULL, another backend. */
  bpl_init_options bad = BPL_INIT_OPTIONS_INIT;
  bad.backend = "mpi";
  bad.native_comm = &half;
  bad.rank = half_rank;
  bad.world_size = half_size;
  if (refused(&bad, BPL_ERR_INVALID_ARGUMENT, "options.native_comm is given, and with it rank and world size",
              "rank and world size beside native_comm")) return 1;
  MPI_Comm null_comm = MPI_COMM_NULL;
  bad = (bpl_init_options)BPL_INIT_OPTIONS_INIT;
  bad.backend = "mpi";
  bad.native_comm = &null_comm;
  if (refused(&bad, BPL_ERR_INVALID_ARGUMENT, "options->native_comm is MPI_COMM_NULL", "MPI_COMM_NULL")) return 1;
  bad.backend = "gloo";
  bad.native_comm = &half;
  if (refused(&bad, BPL_ERR_INVALID_ARGUMENT, "the gloo backend takes no native communicator", "gloo")) return 1;

  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.backend = "mpi";
  options.native_comm = &half;
  bpl_runtime* runtime = NULL;
  if (bpl_init(&options, &runtime) != BPL_OK) return fail("bpl_init");
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  if (bpl_runtime_describe(runtime, &info) != BPL_OK) return fail("bpl_runtime_describe");
  /* Every rank of this test runs on this machine: the local ones are the half's too. */
  if (info.rank != half_rank || info.world_size != half_size || info.local_rank != half_rank ||
      info.local_world_size != half_size || strcmp(info.launcher, "native communicator") != 0 ||
      strstr(info.details, "world: the program's communicator") == NULL) {
    fprintf(stderr, "rank %d: described as rank %d of %d (local %d of %d), launcher %s, details %s; the half says %d of %d\n",
            rank, info.rank, info.world_size, info.local_rank, info.local_world_size, info.launcher, info.details,
            half_rank, half_size);
    return 1;
  }

  bpl_comm* world = NULL;
  bpl_comm_world(runtime, &world);
  int value = rank + 1, expected = 0;
  for (int r = color; r < size; r += 2) expected += r + 1;
  if (bpl_allreduce(world, &value, &value, 1, BPL_DTYPE_I32, BPL_OP_SUM, NULL) != BPL_OK) return fail("bpl_allreduce");
  int members[64] = {0};
  if (half_size > 64) return 1;
  if (bpl_allgather(world, &rank, members, 1, BPL_DTYPE_I32, NULL) != BPL_OK) return fail("bpl_allgather");
  for (int i = 0; i < half_size; ++i) {
    if (members[i] != color + 2 * i) {
      fprintf(stderr, "rank %d: backplane's rank %d is MPI_COMM_WORLD's %d, expected %d\n", rank, i, members[i], color + 2 * i);
      return 1;
    }
  }
  bpl_comm* split = NULL;
  if (bpl_comm_split(world, 0, -half_rank, &split) != BPL_OK) return fail("bpl_comm_split");
  int split_rank = -1;
  bpl_comm_rank(split, &split_rank);
  if (bpl_barrier(split, NULL) != BPL_OK) return fail("bpl_barrier");
  bpl_comm_destroy(split);
  if (bpl_finalize(runtime) != BPL_OK) return fail("bpl_finalize");

  /* MPI is still the program's, and so is its communicator. */
  int finalized = 1, again = 1, total = 0;
  MPI_Finalized(&finalized);
  MPI_Allreduce(&again, &total, 1, MPI_INT, MPI_SUM, half);
  if (finalized || value != expected || total != half_size || split_rank != half_size - 1 - half_rank) {
    fprintf(stderr, "rank %d: finalized=%d backplane sum=%d (expected %d) MPI sum=%d split rank %d\n", rank, finalized,
            value, expected, total, split_rank);
    return 1;
  }
  printf("rank %d: backplane on half %d (rank %d of %d): sum %d, MPI after bpl_finalize: ok\n", rank, color, half_rank,
         half_size, value);
  MPI_Comm_free(&half);
  MPI_Finalize();
  return 0;
}
