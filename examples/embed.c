/* A pure C embedder: initialise backplane from the environment, allreduce over the world, split the
 * world by rank parity and reduce within each group, check every result and print it.
 *
 *   NXD_CPU_MODE=1 bpl-run --nproc-per-node 2 ./embed
 *   BPL_BACKEND=gloo bpl-run --nproc-per-node 3 ./embed
 */
#include <backplane/backplane.h>
#include <stdio.h>
#include <stdlib.h>

#define COUNT 4

/* Prints the failed call and its message, then leaves with status 1. */
static void check(bpl_status status, const char* what) {
  if (status != BPL_OK) {
    fprintf(stderr, "embed: %s failed: %s: %s\n", what, bpl_status_name(status), bpl_last_error());
    exit(1);
  }
}

int main(void) {
  bpl_runtime* runtime = NULL;
  check(bpl_init(NULL, &runtime), "bpl_init");

  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  check(bpl_runtime_describe(runtime, &info), "bpl_runtime_describe");
  const int rank = info.rank, world = info.world_size;
  if (rank == 0) {
    printf("backend %s %s (%s), world size %d\n", info.backend, info.plugin_version, info.selection_reason, world);
  }

  bpl_comm* comm_world = NULL;
  check(bpl_comm_world(runtime, &comm_world), "bpl_comm_world");

  /* World allreduce: element i of rank r is (r + 1) * (i + 1); the sum is (i + 1) * world(world+1)/2. */
  float values[COUNT];
  for (int i = 0; i < COUNT; ++i) values[i] = (float)((rank + 1) * (i + 1));
  check(bpl_allreduce(comm_world, values, values, COUNT, BPL_DTYPE_F32, BPL_OP_SUM, NULL), "bpl_allreduce");
  int failures = 0;
  for (int i = 0; i < COUNT; ++i) {
    float expected = (float)((i + 1) * world * (world + 1) / 2);
    if (values[i] != expected) {
      fprintf(stderr, "rank %d: world sum[%d] = %g, expected %g\n", rank, i, values[i], expected);
      ++failures;
    }
  }

  /* Groups by parity: ranks 0,2,4,… and 1,3,5,…; each sums its members' ranks. */
  const int parity = rank % 2;
  bpl_comm* group = NULL;
  check(bpl_comm_split(comm_world, parity, rank, &group), "bpl_comm_split");
  int32_t group_rank = 0, group_size = 0;
  check(bpl_comm_rank(group, &group_rank), "bpl_comm_rank");
  check(bpl_comm_size(group, &group_size), "bpl_comm_size");
  int64_t rank_sum = rank;
  check(bpl_allreduce(group, &rank_sum, &rank_sum, 1, BPL_DTYPE_I64, BPL_OP_SUM, NULL), "bpl_allreduce (group)");
  int64_t expected_sum = 0;
  int expected_size = 0;
  for (int r = parity; r < world; r += 2) {
    expected_sum += r;
    ++expected_size;
  }
  if (group_size != expected_size || group_rank != rank / 2 || rank_sum != expected_sum) {
    fprintf(stderr, "rank %d: group %d rank %d size %d sum %lld, expected rank %d size %d sum %lld\n", rank, parity,
            group_rank, group_size, (long long)rank_sum, rank / 2, expected_size, (long long)expected_sum);
    ++failures;
  }

  /* One line per rank, printed in rank order so the output reads the same on every backend. */
  for (int r = 0; r < world; ++r) {
    check(bpl_barrier(comm_world, NULL), "bpl_barrier");
    if (r == rank) {
      printf("rank %d: world sum = [%g %g %g %g]; %s group rank %d/%d, sum of group ranks = %lld%s\n", rank,
             values[0], values[1], values[2], values[3], parity ? "odd" : "even", group_rank, group_size,
             (long long)rank_sum, failures ? "  WRONG" : "  ok");
      fflush(stdout);
    }
  }

  check(bpl_comm_destroy(group), "bpl_comm_destroy");
  check(bpl_finalize(runtime), "bpl_finalize");
  return failures ? 1 : 0;
}
