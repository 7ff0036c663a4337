/* Does Open MPI write past a receive buffer smaller than the message? Rank 1 sends `sent` bytes, rank 0
 * posts a receive of `posted` bytes followed by a zeroed guard, and counts the guard bytes written.
 *
 *   mpicc eager-limit.c -o eager-limit && mpirun -np 2 ./eager-limit
 *
 * On Open MPI 4.1.4 (vader, CMA) both ranks on one machine: MPI_ERR_TRUNCATE every time, but from
 * 4041 bytes (btl_vader_eager_limit 4096 less its headers) the message is written whole, past the
 * buffer; up to 4040 bytes at most `posted` bytes are written. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  const int cases[][2] = {{16, 3000}, {16, 4040}, {16, 4041}, {16, 4096}, {1024, 65536}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
    const int posted = cases[k][0], sent = cases[k][1];
    if (rank == 1) {
      char* data = malloc((size_t)sent);
      memset(data, 7, (size_t)sent);
      MPI_Send(data, sent, MPI_BYTE, 0, 5, MPI_COMM_WORLD);
      free(data);
    } else if (rank == 0) {
      char* buffer = calloc((size_t)(posted + sent), 1);
      MPI_Status status;
      const int error = MPI_Recv(buffer, posted, MPI_BYTE, 1, 5, MPI_COMM_WORLD, &status);
      int overrun = 0;
      for (int i = posted; i < posted + sent; ++i) overrun += buffer[i] != 0;
      printf("posted %5d, sent %5d: error %d, %d bytes written past the buffer\n", posted, sent, error, overrun);
      free(buffer);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_Finalize();
  return 0;
}
