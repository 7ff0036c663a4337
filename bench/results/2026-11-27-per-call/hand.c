// Per call, 2 ranks, alternated in one process (41 blocks of ITERS calls, medians): backplane's blocking
// call, raw Open MPI's blocking call, and the same exchange written by hand with MPI's non-blocking
// point-to-point calls the way the plugin's schedule makes it (allgather: probed, as the plugin does above
// the eager size; allreduce and broadcast: posted), and that again after BUSY iterations of an empty
// loop (how a fixed cost adds to the call; "busy alone" is its time). ONLY=k runs only variant k (for perf).
//   mpicc -O2 -Icore/include hand.c -o hand -Lbuild/lib -lbackplane -Wl,-rpath,$PWD/build/lib
//   BPL_BACKEND=mpi mpirun -np 2 ./hand allgather 1024
#include <backplane/backplane.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <mpi.h>
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static int cmp(const void* a, const void* b) { double x = *(const double*)a, y = *(const double*)b; return x < y ? -1 : x > y; }
static MPI_Comm dup;
static long busy_k;
__attribute__((noinline)) static void busy(long k) { for (volatile long i = 0; i < k; i++); }
static int rank;
static int hand(const char* op, float* a, float* b, long n) {
  MPI_Request r[2]; int flag = 0; int peer = 1 - rank;
  if (!strcmp(op, "bcast")) {
    if (rank == 0) MPI_Isend(a, n * 4, MPI_BYTE, 1, 7, dup, &r[0]); else MPI_Irecv(a, n * 4, MPI_BYTE, 0, 7, dup, &r[0]);
    MPI_Status st[1];
    do MPI_Testall(1, r, &flag, st); while (!flag);
  } else if (!strcmp(op, "allgather")) {
    // the plugin's way above the eager size: probe, check the size, receive the matched message
    memcpy(b + rank * n, a, n * 4);
    MPI_Isend(a, n * 4, MPI_BYTE, peer, 7, dup, &r[1]);
    MPI_Message m; MPI_Status s;
    do MPI_Improbe(peer, 7, dup, &flag, &m, &s); while (!flag);
    int got; MPI_Get_count(&s, MPI_BYTE, &got); if (got != n * 4) return 1;
    MPI_Imrecv(b + peer * n, n * 4, MPI_BYTE, &m, &r[0]);
    MPI_Status st[2]; flag = 0;
    do MPI_Testall(2, r, &flag, st); while (!flag);
  } else {
    MPI_Irecv(b, n * 4, MPI_BYTE, peer, 7, dup, &r[0]);
    MPI_Isend(a, n * 4, MPI_BYTE, peer, 7, dup, &r[1]);
    MPI_Status st[2];
    do MPI_Testall(2, r, &flag, st); while (!flag);
    for (long i = 0; i < n; ++i) b[i] += a[i];
  }
  return 0;
}
int main(int argc, char** argv) {
  const char* op = argc > 1 ? argv[1] : "bcast"; long n = argc > 2 ? atol(argv[2]) : 1;
  bpl_runtime* rt; bpl_comm* c;
  if (bpl_init(NULL, &rt) || bpl_comm_world(rt, &c)) return 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  float* a = calloc(n * 4 + 16, 4); float* b = calloc(n * 4 + 16, 4);
  enum { R = 41 }; const int I = getenv("ITERS") ? atoi(getenv("ITERS")) : 2000; double t[4][R];
  busy_k = getenv("BUSY") ? atol(getenv("BUSY")) : 0;
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < 4; ++k) {
      if (getenv("ONLY") && atoi(getenv("ONLY")) != k) continue;
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now();
      for (int i = 0; i < I; ++i) {
        int s;
        if (k == 0) {
          if (!strcmp(op, "bcast")) s = bpl_broadcast(c, a, n, BPL_DTYPE_F32, 0, NULL);
          else if (!strcmp(op, "allgather")) s = bpl_allgather(c, a, b, n, BPL_DTYPE_F32, NULL);
          else s = bpl_allreduce(c, a, b, n, BPL_DTYPE_F32, BPL_OP_SUM, NULL);
        } else if (k == 1) {
          if (!strcmp(op, "allgather")) s = MPI_Allgather(a, n, MPI_FLOAT, b, n, MPI_FLOAT, MPI_COMM_WORLD); else
          if (!strcmp(op, "bcast")) s = MPI_Bcast(a, n, MPI_FLOAT, 0, MPI_COMM_WORLD);
          else s = MPI_Allreduce(a, b, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        } else if (k == 2) {
          s = hand(op, a, b, n);
        } else {
          busy(busy_k); s = hand(op, a, b, n);
        }
        if (s) { printf("fail %d\n", s); return 1; }
      }
      t[k][r] = (now() - t0) / I;
    }
  }
  for (int k = 0; k < 4; ++k) qsort(t[k], R, sizeof(double), cmp);
  if (rank == 0) printf("%-9s %6ld: bpl %.3f us, raw %.3f us, hand p2p %.3f us, hand+busy %.3f\n", op, n, t[0][R / 2], t[1][R / 2], t[2][R / 2], t[3][R / 2]);
  { double t0 = now(); for (int i = 0; i < 100000; ++i) busy(busy_k); if (rank == 0) printf("busy alone %.3f us\n", (now() - t0) / 100000); }
  bpl_finalize(rt);
}
