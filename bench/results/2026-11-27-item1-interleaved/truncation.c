// Does Open MPI write a message larger than the posted receive past the receive's buffer? Rank 0 sends
// each size, rank 1 receives half of it into a buffer followed by canary bytes and counts those overwritten.
//   mpicc truncation.c -o truncation && mpirun -np 2 ./truncation
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int sizes[] = {2048, 8192, 65536, 1 << 20};
  for (int i = 0; i < 4; ++i) {
    int sent = sizes[i], posted = sent / 2;
    char* b = malloc(sent + 64);
    if (rank == 0) { memset(b, 'x', sent); MPI_Send(b, sent, MPI_BYTE, 1, 5, MPI_COMM_WORLD); }
    else {
      memset(b, 'c', sent + 64);
      MPI_Status st; int err = MPI_Recv(b, posted, MPI_BYTE, 0, 5, MPI_COMM_WORLD, &st);
      int written = 0; for (int k = posted; k < sent; ++k) written += b[k] == 'x';
      printf("sent %d posted %d: error %d, bytes past the buffer written: %d\n", sent, posted, err, written);
    }
    free(b);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_Finalize();
}
