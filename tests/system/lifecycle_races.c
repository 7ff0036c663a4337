/* Two ranks that end a runtime while it is busy, or fork after bpl_init (tests/system/lifecycle_test.py).
 *
 *   lifecycle_races finalize-while-blocked    rank 0: a thread in bpl_allreduce, bpl_finalize on the main
 *   lifecycle_races finalize-while-waiting    thread meanwhile (blocked, or in bpl_request_wait); rank 1
 *                                             comes to the allreduce 2 s late
 *   lifecycle_races fork-and-call             rank 0 forks: the child calls an allreduce and
 *   lifecycle_races fork-and-exit             bpl_finalize (or only exits); then both ranks allreduce
 *   lifecycle_races reinit                    bpl_init, an allreduce and bpl_finalize, 5 times over
 *
 * Each rank prints "rank R: <what> <status> <message>" lines; the driver checks them and the statuses. */
#include <backplane/backplane.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static bpl_comm* world;
static int use_request;

static void report(int rank, const char* what, bpl_status status) {
  printf("rank %d: %s %s %s\n", rank, what, bpl_status_name(status), status == BPL_OK ? "" : bpl_last_error());
  fflush(stdout);
}

/* The allreduce, blocking or as a request waited for and freed; reported as `what` (the wait's error,
 * when it failed, before the free's). */
static bpl_status allreduce_once(int rank, const char* what, int32_t* value) {
  if (!use_request) {
    const bpl_status status = bpl_allreduce(world, value, value, 1, BPL_DTYPE_I32, BPL_OP_SUM, NULL);
    report(rank, what, status);
    return status;
  }
  bpl_request* request = NULL;
  bpl_status status = bpl_allreduce(world, value, value, 1, BPL_DTYPE_I32, BPL_OP_SUM, &request);
  if (status == BPL_OK) status = bpl_request_wait(request, BPL_TIMEOUT_DEFAULT);
  report(rank, what, status);
  if (request != NULL) report(rank, "request freed:", bpl_request_free(request));
  return status;
}

static void* busy_thread(void* unused) {
  (void)unused;
  int32_t value = 1;
  allreduce_once(0, "allreduce on another thread:", &value);
  return NULL;
}

static int finalize_while_busy(bpl_runtime* runtime, int rank) {
  int32_t value = 1;
  if (rank == 1) {
    sleep(2);
    allreduce_once(1, "allreduce:", &value);
    report(1, "finalize:", bpl_finalize(runtime));
    return 0;
  }
  pthread_t thread;
  pthread_create(&thread, NULL, busy_thread, NULL);
  usleep(500 * 1000);  /* the thread is in its allreduce by now */
  report(0, "finalize:", bpl_finalize(runtime));
  pthread_join(thread, NULL);
  return 0;
}

static int fork_child(bpl_runtime* runtime, int rank, int call) {
  int32_t value = rank + 1;
  bpl_status status = bpl_allreduce(world, &value, &value, 1, BPL_DTYPE_I32, BPL_OP_SUM, NULL);
  report(rank, "first allreduce:", status);
  if (rank == 0) {
    const pid_t child = fork();
    if (child == 0) {
      if (call) {
        int32_t mine = 100;
        report(0, "child's allreduce:", bpl_allreduce(world, &mine, &mine, 1, BPL_DTYPE_I32, BPL_OP_SUM, NULL));
        report(0, "child's finalize:", bpl_finalize(runtime));
      }
      exit(0);
    }
    int child_status = 0;
    waitpid(child, &child_status, 0);
    printf("rank 0: child ended with %d\n", WIFEXITED(child_status) ? WEXITSTATUS(child_status) : 128 + WTERMSIG(child_status));
  }
  value = rank + 1;
  status = bpl_allreduce(world, &value, &value, 1, BPL_DTYPE_I32, BPL_OP_SUM, NULL);
  printf("rank %d: second allreduce %s, sum %d\n", rank, bpl_status_name(status), value);
  report(rank, "finalize:", bpl_finalize(runtime));
  return status == BPL_OK ? 0 : 1;
}

static int init(bpl_runtime** runtime, bpl_runtime_info* info) {
  if (bpl_init(NULL, runtime) != BPL_OK || bpl_runtime_describe(*runtime, info) != BPL_OK ||
      bpl_comm_world(*runtime, &world) != BPL_OK) {
    fprintf(stderr, "lifecycle_races: %s\n", bpl_last_error());
    return 0;
  }
  return 1;
}

/* Each world a new one: its allreduce sums rank + 1 + cycle over the ranks. */
static int reinit(bpl_runtime* runtime, bpl_runtime_info info) {
  const int cycles = 5;
  for (int cycle = 0;; ++cycle) {
    int64_t value = info.rank + 1 + cycle;
    const bpl_status status = bpl_allreduce(world, &value, &value, 1, BPL_DTYPE_I64, BPL_OP_SUM, NULL);
    const int64_t expected = (int64_t)info.world_size * (info.world_size + 1) / 2 + (int64_t)info.world_size * cycle;
    if (status != BPL_OK || value != expected) {
      printf("rank %d: cycle %d: allreduce %s, sum %lld (expected %lld) %s\n", info.rank, cycle, bpl_status_name(status),
             (long long)value, (long long)expected, status == BPL_OK ? "" : bpl_last_error());
      return 1;
    }
    report(info.rank, "finalize:", bpl_finalize(runtime));
    if (cycle + 1 == cycles) break;
    if (!init(&runtime, &info)) return 1;
  }
  printf("rank %d: %d worlds made and ended\n", info.rank, cycles);
  return 0;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  bpl_runtime* runtime = NULL;
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  if (!init(&runtime, &info)) return 1;
  if (strcmp(mode, "reinit") == 0) return reinit(runtime, info);
  use_request = strcmp(mode, "finalize-while-waiting") == 0;
  if (strcmp(mode, "finalize-while-blocked") == 0 || use_request) return finalize_while_busy(runtime, info.rank);
  if (strcmp(mode, "fork-and-call") == 0) return fork_child(runtime, info.rank, 1);
  if (strcmp(mode, "fork-and-exit") == 0) return fork_child(runtime, info.rank, 0);
  fprintf(stderr, "lifecycle_races: '%s': expected finalize-while-blocked, finalize-while-waiting, fork-and-call or "
                  "fork-and-exit or reinit\n", mode);
  return 2;
}
