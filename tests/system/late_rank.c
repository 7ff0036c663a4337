/* One allreduce of the world, which rank BPL_TEST_LATE_RANK (1 if unset) reaches BPL_TEST_LATE_S seconds
 * after the others: what a collective stalled by a late rank does while it waits
 * (tests/system/wait_reports_test.py). Prints "done <rank> <sum>" once it completes. */
#include <backplane/backplane.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int fail(const char* what, bpl_status status) {
  fprintf(stderr, "late_rank: %s: %s: %s\n", what, bpl_status_name(status), bpl_last_error());
  return 1;
}

int main(void) {
  bpl_runtime* runtime = NULL;
  bpl_status status = bpl_init(NULL, &runtime);
  if (status != BPL_OK) return fail("bpl_init", status);
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  bpl_comm* world = NULL;
  if ((status = bpl_runtime_describe(runtime, &info)) != BPL_OK) return fail("bpl_runtime_describe", status);
  if ((status = bpl_comm_world(runtime, &world)) != BPL_OK) return fail("bpl_comm_world", status);
  const char* late = getenv("BPL_TEST_LATE_S");
  const char* late_rank = getenv("BPL_TEST_LATE_RANK");
  if (info.rank == (late_rank != NULL ? atoi(late_rank) : 1) && late != NULL) sleep((unsigned)atoi(late));
  int32_t sum = info.rank + 1;
  if ((status = bpl_allreduce(world, &sum, &sum, 1, BPL_DTYPE_I32, BPL_OP_SUM, NULL)) != BPL_OK) {
    return fail("bpl_allreduce", status);
  }
  printf("done %d %d\n", info.rank, sum);
  return bpl_finalize(runtime) == BPL_OK ? 0 : 1;
}
