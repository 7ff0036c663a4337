// The watchdog's cost while nothing moves: rank 0 posts an asynchronous allreduce and sleeps 4 s
// before waiting for it (rank 1 joins after 4 s); rank 0 reports its process's CPU time over the sleep.
#include <backplane/backplane.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>
static double cpu_ms(void) {
  struct rusage u; getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}
int main(void) {
  bpl_runtime* rt; bpl_comm* c; int32_t rank, size;
  if (bpl_init(NULL, &rt) || bpl_comm_world(rt, &c) || bpl_comm_rank(c, &rank) || bpl_comm_size(c, &size)) return 1;
  float x[1024] = {0};
  bpl_request* r = NULL;
  if (rank == 1) sleep(4);
  if (bpl_allreduce(c, x, x, 1024, BPL_DTYPE_F32, BPL_OP_SUM, &r)) return 2;
  double before = cpu_ms();
  if (rank == 0) sleep(4);
  double during = cpu_ms() - before;
  if (bpl_request_wait(r, BPL_TIMEOUT_DEFAULT) || bpl_request_free(r)) return 3;
  if (rank == 0) printf("rank 0: %.1f ms of CPU over 4 s with an allreduce in flight\n", during);
  return bpl_finalize(rt);
}
