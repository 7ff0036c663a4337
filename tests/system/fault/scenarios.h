// The rank programs of the fault suites: each runs as every rank of a job (run_job starts this binary
// with --worker=<name>), makes its fault on the faulty rank and reports what each rank saw as events.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "backplane/backplane.h"
#include "support/fault_job.h"

namespace backplane::test::faults {

// The rank a scenario fails (kills, stops, ends): BPL_TEST_FAULTY_RANK, rank 1 unless set. Rank 0
// hosts the gloo store.
inline int faulty_rank() { return env_int("BPL_TEST_FAULTY_RANK", 1); }

// Runs `operation` (one collective on r.world) `iterations` times; the faulty rank SIGKILLs itself 30 ms
// after starting the second, or, with BPL_TEST_STOPPED_MS set, stops itself then (SIGSTOP) and is
// killed that long later. A survivor reports the failure it sees ("failed") and that the world then
// refuses operations at once; every rank reports success if none failed.
template <typename Operation>
inline int kill_mid(Rank& r, const char* name, int iterations, Operation&& operation) {
  const int stopped_ms = env_int("BPL_TEST_STOPPED_MS", 0);
  std::printf("rank %d: pid BPL_OK after 0 ms: %d\n", r.rank, static_cast<int>(getpid()));  // as launchers name it
  std::fflush(stdout);
  for (int iteration = 0; iteration < iterations; ++iteration) {
    if (r.rank == faulty_rank() && iteration == 1 && stopped_ms == 0) sigkill_self_in(std::chrono::milliseconds(30));
    if (r.rank == faulty_rank() && iteration == 1 && stopped_ms > 0) {
      std::thread([stopped_ms] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        stop_self_until_killed(stopped_ms);
      }).detach();
    }
    const auto start = Clock::now();
    const bpl_status status = operation();
    if (status != BPL_OK) {
      report(r, "failed", status, start);
      retry_fails_at_once(r);
      finalize(r);
      return 3;
    }
  }
  std::printf("rank %d: every %s succeeded\n", r.rank, name);
  bpl_finalize(r.runtime);
  return 0;
}


// The programs, by the name --worker= gives (main.cpp).
int kill_mid_allreduce();
int kill_mid_broadcast();
int kill_mid_alltoallv();
int stop_mid_allreduce();
int per_call_timeouts();
int recv_tested_past_its_deadline();
int abort_from_another_thread();
int abort_notifies_peers();
int abort_blocking_call();
int stop_before_finalize();
int huge_values();
int exit_cleanly_mid_allreduce();
int kill_mid_exchange();
int mismatched_collectives();
int reinit_cycles();
int reinit_after_failure();
int idle_after_rank0_exits();
int stop_before_init();
int join_and_leave();

}  // namespace backplane::test::faults
