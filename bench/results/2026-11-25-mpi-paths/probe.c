/* Which of Open MPI's paths can carry the MPI backend at raw speed (issue #25): per size, the median of
 * MPI's blocking allreduce and allgather against their non-blocking forms tested in a loop (what a
 * bounded, non-spinning wait must use), their persistent forms (Open MPI 4.1's MPIX_*_init), and, for
 * allreduce on 2 ranks, one MPI_Isend/MPI_Irecv exchange tested in a loop followed by the sum (what a
 * schedule of the backend's own over MPI's point-to-point costs). Each time is taken between barriers.
 *
 *   mpicc -O2 -o probe probe.c && mpirun -np 2 ./probe
 *   mpirun -np 2 -x OMPI_MCA_coll_libnbc_iallreduce_algorithm=1 ./probe   # libnbc's ring
 */
#include <mpi.h>
#include <mpi-ext.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* medians of blocking vs non-blocking allreduce/allgather/bcast, per size */
static double now(void) { return MPI_Wtime(); }
static int cmp(const void* a, const void* b) { double x = *(const double*)a, y = *(const double*)b; return x < y ? -1 : x > y; }
int main(int argc, char** argv) {
  int provided; MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank, size; MPI_Comm_rank(MPI_COMM_WORLD, &rank); MPI_Comm_size(MPI_COMM_WORLD, &size);
  size_t sizes[] = {4, 1024, 4096, 65536, 1 << 20, 4 << 20};
  float* a = malloc((4 << 20) * (size + 1)); float* b = malloc((4 << 20) * (size + 1));
  memset(a, 0, (4 << 20) * (size + 1)); memset(b, 0, (4 << 20) * (size + 1));
  for (int s = 0; s < 6; ++s) {
    int n = (int)(sizes[s] / 4); if (n == 0) n = 1;
    int iters = sizes[s] >= (1 << 20) ? 50 : 2000;
    double t[7][2000];
    MPI_Request pr, pg; MPIX_Allreduce_init(a, b, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, MPI_INFO_NULL, &pr); MPIX_Allgather_init(a, n, MPI_FLOAT, b, n, MPI_FLOAT, MPI_COMM_WORLD, MPI_INFO_NULL, &pg);
    for (int mode = 0; mode < 7; ++mode) {
      for (int i = 0; i < iters + 10; ++i) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        MPI_Request r;
        switch (mode) {
          case 0: MPI_Allreduce(a, b, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
          case 1: MPI_Iallreduce(a, b, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r); { int f = 0; while (!f) MPI_Test(&r, &f, MPI_STATUS_IGNORE); } break;
          case 2: MPI_Allgather(a, n, MPI_FLOAT, b, n, MPI_FLOAT, MPI_COMM_WORLD); break;
          case 4: MPI_Start(&pr); { int f = 0; while (!f) MPI_Test(&pr, &f, MPI_STATUS_IGNORE); } break;
          case 5: MPI_Start(&pg); { int f = 0; while (!f) MPI_Test(&pg, &f, MPI_STATUS_IGNORE); } break;
          case 6: { MPI_Request rr[2]; int peer = rank ^ 1; MPI_Irecv(b, n, MPI_FLOAT, peer, 9, MPI_COMM_WORLD, &rr[0]); MPI_Isend(a, n, MPI_FLOAT, peer, 9, MPI_COMM_WORLD, &rr[1]); int f = 0; while (!f) MPI_Testall(2, rr, &f, MPI_STATUSES_IGNORE); for (int k = 0; k < n; ++k) b[k] += a[k]; } break;
          case 3: MPI_Iallgather(a, n, MPI_FLOAT, b, n, MPI_FLOAT, MPI_COMM_WORLD, &r); { int f = 0; while (!f) MPI_Test(&r, &f, MPI_STATUS_IGNORE); } break;
        }
        if (i >= 10) t[mode][i - 10] = (now() - t0) * 1e6;
      }
      qsort(t[mode], iters, sizeof(double), cmp);
    }
    if (rank == 0) printf("%8zu B: allreduce %.2f / i %.2f / persistent %.2f us; allgather %.2f / i %.2f / persistent %.2f us; p2p allreduce %.2f\n", sizes[s],
                          t[0][iters / 2], t[1][iters / 2], t[4][iters/2], t[2][iters / 2], t[3][iters / 2], t[5][iters/2], t[6][iters/2]);
    MPI_Request_free(&pr); MPI_Request_free(&pg);
  }
  MPI_Finalize();
  return 0;
}
