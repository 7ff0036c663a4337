// Backplane and raw MPI alternating call by call, under whatever load the machine has: per (operation,
// size), the mean time of each (scheduler stalls included, as a benchmark's repetition sees them), the
// median (the path's own cost), and the calls that took over 100 µs (stalls). Rank 0 prints a line each.
//   mpicc -O2 -Icore/include alternating.c -o alternating -Lbuild/lib -lbackplane -Wl,-rpath,$PWD/build/lib
//   BPL_BACKEND=mpi [BPL_MPI_WATCHDOG=1] mpirun -np 2 ./alternating [calls per point]
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backplane/backplane.h"

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

enum { ALLREDUCE, BROADCAST, ALLGATHER, ALLTOALLV, GATHER, SCATTER, PINGPONG, OPS };
static const char* names[OPS] = {"allreduce", "broadcast", "allgather", "alltoallv", "gather", "scatter", "pingpong"};

int main(int argc, char** argv) {
  bpl_runtime* rt;
  bpl_comm* world;
  if (bpl_init(NULL, &rt) != BPL_OK) {
    fprintf(stderr, "bpl_init: %s\n", bpl_last_error());
    return 1;
  }
  bpl_comm_world(rt, &world);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int calls = argc > 1 ? atoi(argv[1]) : 20000;
  const int sizes[] = {16, 1024, 65536};  // bytes per rank's block
  double* bp = malloc(sizeof(double) * calls);
  double* raw = malloc(sizeof(double) * calls);
  for (int op = 0; op < OPS; ++op) {
    for (int s = 0; s < 3; ++s) {
      const int count = sizes[s] / 4;
      float* in = calloc((size_t)count * size, sizeof(float));
      float* out = calloc((size_t)count * size, sizeof(float));
      int64_t counts64[64], displs64[64];
      int counts[64], displs[64];
      for (int q = 0; q < size; ++q) {
        counts64[q] = counts[q] = count;
        displs64[q] = displs[q] = q * count;
      }
      MPI_Barrier(MPI_COMM_WORLD);
      for (int i = 0; i < calls; ++i) {
        const double t0 = now_us();
        switch (op) {
          case ALLREDUCE: bpl_allreduce(world, in, out, count, BPL_DTYPE_F32, BPL_OP_SUM, NULL); break;
          case BROADCAST: bpl_broadcast(world, out, count, BPL_DTYPE_F32, 0, NULL); break;
          case ALLGATHER: bpl_allgather(world, in, out, count, BPL_DTYPE_F32, NULL); break;
          case ALLTOALLV: bpl_alltoallv(world, in, counts64, displs64, out, counts64, displs64, BPL_DTYPE_F32, NULL); break;
          case GATHER: bpl_gather(world, in, out, count, BPL_DTYPE_F32, 0, NULL); break;
          case SCATTER: bpl_scatter(world, in, out, count, BPL_DTYPE_F32, 0, NULL); break;
          case PINGPONG:
            if (rank == 0) {
              bpl_send(world, in, count, BPL_DTYPE_F32, 1, 0, NULL);
              bpl_recv(world, out, count, BPL_DTYPE_F32, 1, 0, NULL);
            } else if (rank == 1) {
              bpl_recv(world, out, count, BPL_DTYPE_F32, 0, 0, NULL);
              bpl_send(world, out, count, BPL_DTYPE_F32, 0, 0, NULL);
            }
            break;
        }
        const double t1 = now_us();
        switch (op) {
          case ALLREDUCE: MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
          case BROADCAST: MPI_Bcast(out, count, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
          case ALLGATHER: MPI_Allgather(in, count, MPI_FLOAT, out, count, MPI_FLOAT, MPI_COMM_WORLD); break;
          case ALLTOALLV: MPI_Alltoallv(in, counts, displs, MPI_FLOAT, out, counts, displs, MPI_FLOAT, MPI_COMM_WORLD); break;
          case GATHER: MPI_Gather(in, count, MPI_FLOAT, out, count, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
          case SCATTER: MPI_Scatter(in, count, MPI_FLOAT, out, count, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
          case PINGPONG:
            if (rank == 0) {
              MPI_Send(in, count, MPI_FLOAT, 1, 0, MPI_COMM_WORLD);
              MPI_Recv(out, count, MPI_FLOAT, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else if (rank == 1) {
              MPI_Recv(out, count, MPI_FLOAT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
              MPI_Send(out, count, MPI_FLOAT, 0, 0, MPI_COMM_WORLD);
            }
            break;
        }
        const double t2 = now_us();
        bp[i] = t1 - t0;
        raw[i] = t2 - t1;
      }
      double bp_sum = 0, raw_sum = 0;
      int bp_stalls = 0, raw_stalls = 0;
      for (int i = 0; i < calls; ++i) {
        bp_sum += bp[i];
        raw_sum += raw[i];
        bp_stalls += bp[i] > 100;
        raw_stalls += raw[i] > 100;
      }
      qsort(bp, calls, sizeof(double), by_value);
      qsort(raw, calls, sizeof(double), by_value);
      if (rank == 0) {
        printf("%-9s %6d B: mean %8.2f / %8.2f us (%.2fx); median %8.2f / %8.2f us (%.2fx); stalls >100 us %d / %d\n",
               names[op], sizes[s] * (op == ALLGATHER || op == GATHER ? size : 1), bp_sum / calls, raw_sum / calls,
               bp_sum / raw_sum, bp[calls / 2], raw[calls / 2], bp[calls / 2] / raw[calls / 2], bp_stalls, raw_stalls);
      }
      free(in);
      free(out);
    }
  }
  bpl_finalize(rt);
  return 0;
}
