/* root sends `bytes` to rank 1 each iteration (a broadcast on 2 ranks); rank 1 receives by posted
 * Irecv + Test loop, or by Improbe loop + Imrecv + Test loop. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
static int cmp(const void* a, const void* b) { double x = *(const double*)a, y = *(const double*)b; return x < y ? -1 : x > y; }
int main(int argc, char** argv) {
  int provided; MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char* buf = malloc(1 << 20);
  int sizes[] = {1024, 16384, 65536};
  for (int si = 0; si < 3; ++si) {
    int bytes = sizes[si]; enum { R = 21, I = 3000 }; double t[3][R];
    for (int r = 0; r < R; ++r) for (int mode = 0; mode < 3; ++mode) {
      MPI_Barrier(MPI_COMM_WORLD); double t0 = MPI_Wtime();
      for (int i = 0; i < I; ++i) {
        if (mode == 0) { MPI_Bcast(buf, bytes, MPI_BYTE, 0, MPI_COMM_WORLD); continue; }
        MPI_Request req; int flag = 0;
        if (rank == 0) { MPI_Isend(buf, bytes, MPI_BYTE, 1, 3, MPI_COMM_WORLD, &req); }
        else if (mode == 1) { MPI_Irecv(buf, bytes, MPI_BYTE, 0, 3, MPI_COMM_WORLD, &req); }
        else { MPI_Message m; MPI_Status st; while (!flag) MPI_Improbe(0, 3, MPI_COMM_WORLD, &flag, &m, &st); flag = 0; MPI_Imrecv(buf, bytes, MPI_BYTE, &m, &req); }
        while (!flag) MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      }
      t[mode][r] = (MPI_Wtime() - t0) / I * 1e6;
    }
    for (int mode = 0; mode < 3; ++mode) qsort(t[mode], R, sizeof(double), cmp);
    if (rank == 0) printf("%6d B: MPI_Bcast %.2f us, posted irecv %.2f us, improbe+imrecv %.2f us\n", bytes, t[0][R/2], t[1][R/2], t[2][R/2]);
  }
  MPI_Finalize();
}
