#include <backplane/backplane.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <mpi.h>
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static int cmp(const void* a, const void* b) { double x = *(const double*)a, y = *(const double*)b; return x < y ? -1 : x > y; }
int main(int argc, char** argv) {
  const char* op = argc > 1 ? argv[1] : "bcast"; long n = argc > 2 ? atol(argv[2]) : 1;
  bpl_runtime* rt; bpl_comm* c;
  if (bpl_init(NULL, &rt) || bpl_comm_world(rt, &c)) return 1;
  int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  float* a = calloc(n * 4 + 16, 4); float* b = calloc(n * 4 + 16, 4);
  enum { R = 41, I = 2000 }; double tb[R], tr[R];
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < 2; ++k) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now();
      for (int i = 0; i < I; ++i) {
        int s;
        if (k == 0) {
          if (!strcmp(op, "bcast")) s = bpl_broadcast(c, a, n, BPL_DTYPE_F32, 0, NULL);
          else if (!strcmp(op, "allreduce")) s = bpl_allreduce(c, a, b, n, BPL_DTYPE_F32, BPL_OP_SUM, NULL);
          else if (!strcmp(op, "gather")) s = bpl_gather(c, a, b, n, BPL_DTYPE_F32, 0, NULL);
          else s = bpl_allgather(c, a, b, n, BPL_DTYPE_F32, NULL);
        } else {
          if (!strcmp(op, "bcast")) s = MPI_Bcast(a, n, MPI_FLOAT, 0, MPI_COMM_WORLD);
          else if (!strcmp(op, "allreduce")) s = MPI_Allreduce(a, b, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          else if (!strcmp(op, "gather")) s = MPI_Gather(a, n, MPI_FLOAT, b, n, MPI_FLOAT, 0, MPI_COMM_WORLD);
          else s = MPI_Allgather(a, n, MPI_FLOAT, b, n, MPI_FLOAT, MPI_COMM_WORLD);
        }
        if (s) { printf("fail %d\n", s); return 1; }
      }
      (k ? tr : tb)[r] = (now() - t0) / I;
    }
  }
  qsort(tb, R, sizeof(double), cmp); qsort(tr, R, sizeof(double), cmp);
  if (rank == 0) printf("%-9s %6ld: bpl %.3f us, raw %.3f us, +%.3f\n", op, n, tb[R / 2], tr[R / 2], tb[R / 2] - tr[R / 2]);
  bpl_finalize(rt);
}
