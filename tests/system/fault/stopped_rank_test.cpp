// A rank stopped (SIGSTOP) or silent: the survivors fail with TIMEOUT naming it within their bound, per
// call and per communicator; idle survivors use no core; finalize and MPI_Init end though a rank is
// stopped.
#include "system/fault/fault_checks.h"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "backplane/backplane.h"

namespace backplane::test::faults {
namespace {

// A rank SIGSTOPped: survivors fail with TIMEOUT after at least T/2 and at most T + 1 s,
// having used at most a quarter of that time on a core (no wait spins); the world then refuses
// operations at once, a split without the stopped rank keeps working, and (gloo) the survivors can
// start a new job of their own.
void expect_stopped_rank_is_a_timeout_on_every_survivor(const std::string& backend, int stopped,
                                                        std::map<std::string, std::string> env = {}) {
  env["BPL_TEST_FAULTY_RANK"] = std::to_string(stopped);
  const Job job = run_job(backend, 3, "stop_mid_allreduce", env);
  const bool is_mpi = backend.rfind("mpi", 0) == 0;
  for (int rank : survivors_of(stopped, 3)) {
    EXPECT_EVENT(job, rank, "failed", "BPL_ERR_TIMEOUT");
    const Event& failed = *job.event(rank, "failed");
    EXPECT_GE(failed.ms, kTimeoutMs / 2) << failed.message;
    EXPECT_LE(failed.ms, kTimeoutMs + 1000) << failed.message;
    std::printf("%s: rank %d timed out %lld ms after the operation started: %s\n", backend.c_str(), rank,
                static_cast<long long>(failed.ms), failed.message.c_str());
    // A rank alone on its machine can only name the stopped rank if another survivor told it.
    const bool alone = backend == "gloo_machines" && rank == 2;
    expect_names_only(failed.message, stopped, alone && stopped == 0);
    if (!alone) {
      EXPECT_NE(failed.message.find("rank " + std::to_string(stopped) + " of this communicator, process "),
                std::string::npos)
          << failed.message;
      EXPECT_NE(failed.message.find(" on this machine, is stopped"), std::string::npos) << failed.message;
    }
    std::smatch cpu;
    ASSERT_TRUE(std::regex_search(failed.message, cpu, std::regex("cpu_ms=(\\d+)"))) << failed.message;
    EXPECT_LT(std::stoll(cpu[1]), failed.ms / 4) << "the wait spun a core: " << failed.message;
    EXPECT_EVENT(job, rank, "retry", "BPL_ERR_TIMEOUT");
    EXPECT_LT(job.event(rank, "retry")->ms, 50);
    EXPECT_EVENT(job, rank, "survivors", "BPL_OK");
    EXPECT_NE(job.event(rank, "survivors")->message.find("sum=2"), std::string::npos) << job.output;
    EXPECT_EVENT(job, rank, "finalize", "BPL_OK");
    EXPECT_LT(job.event(rank, "finalize")->ms, kTimeoutMs + 1000) << job.output;
    if (!is_mpi) {
      EXPECT_EVENT(job, rank, "new_job", "BPL_OK");
      EXPECT_NE(job.event(rank, "new_job")->message.find("sum=2"), std::string::npos) << job.output;
    }
  }
}

TEST_P(Fault, StoppedRankIsATimeoutOnEverySurvivor) {
  expect_stopped_rank_is_a_timeout_on_every_survivor(backend(), 1);
}

// The same in alltoallv (ABI 1.3), whose transfers wait on each pair of ranks.
TEST_P(Fault, StoppedRankInAlltoallvIsATimeoutOnEverySurvivor) {
  expect_stopped_rank_is_a_timeout_on_every_survivor(backend(), 1, {{"BPL_TEST_OP", "alltoallv"}});
}

// The store's host stopped: a survivor's report of the failure through the store, and its finalize,
// give up on the store within their own short bound instead of waiting for it.
TEST_P(Fault, StoppedStoreHostIsATimeoutOnEverySurvivor) {
  expect_stopped_rank_is_a_timeout_on_every_survivor(backend(), 0);
}

// On machines of two ranks, rank 2 (alone on its machine) sees only that the other machine's leader,
// rank 0, does not come, while rank 0 sees rank 1 stopped. With rank 0 late, rank 2's wait ends first,
// and it still names rank 1: a timeout a rank cannot explain waits a moment for the explanation of a
// rank on another machine.
TEST(FaultGloo, StoppedRankIsNamedOnAnotherMachineThoughItsLeaderIsLate) {
  expect_stopped_rank_is_a_timeout_on_every_survivor("gloo_machines", 1, {{"BPL_TEST_RANK0_LATE_MS", "300"}});
}

// A wait shorter than the communicator's timeout is a poll: TIMEOUT, still in flight, communicator
// usable. A longer one ends at the communicator's timeout (as set by bpl_comm_set_timeout), which
// then fails the communicator.
TEST_P(Fault, PerCallTimeoutsShorterAndLongerThanTheCommunicators) {
  constexpr int kCommTimeoutMs = 1500;
  Job job = run_job(backend(), 2, "per_call_timeouts",
                    {{"BPL_TIMEOUT_MS", "6000"}, {"BPL_TEST_COMM_TIMEOUT_MS", std::to_string(kCommTimeoutMs)}});
  EXPECT_EVENT(job, 0, "set_timeout", "BPL_OK");
  EXPECT_NE(job.output.find("rank 0: comm timeout 1500 ms"), std::string::npos) << job.output;
  EXPECT_EVENT(job, 0, "short_wait", "BPL_ERR_TIMEOUT");
  const Event& short_wait = *job.event(0, "short_wait");
  EXPECT_GE(short_wait.ms, kCommTimeoutMs / 5 - 10);
  EXPECT_LT(short_wait.ms, kCommTimeoutMs / 5 + 500);
  EXPECT_NE(short_wait.message.find("still in flight"), std::string::npos) << short_wait.message;
  EXPECT_EVENT(job, 0, "test", "BPL_OK");
  EXPECT_NE(job.event(0, "test")->message.find("done=0"), std::string::npos) << job.output;
  EXPECT_EVENT(job, 0, "long_wait", "BPL_ERR_TIMEOUT");
  std::smatch since_post;
  ASSERT_TRUE(std::regex_search(job.event(0, "long_wait")->message, since_post, std::regex("since_post=(\\d+)")));
  EXPECT_GE(std::stoi(since_post[1]), kCommTimeoutMs - 50) << job.output;
  EXPECT_LE(std::stoi(since_post[1]), kCommTimeoutMs + 1000) << job.output;
  std::printf("%s: a %d ms wait timed out after %lld ms; a %d ms wait ended %s ms after the post\n", backend().c_str(),
              kCommTimeoutMs / 5, static_cast<long long>(short_wait.ms), 10 * kCommTimeoutMs, since_post[1].str().c_str());
  EXPECT_EVENT(job, 0, "retry", "BPL_ERR_TIMEOUT");
  EXPECT_LT(job.event(0, "retry")->ms, 50);
  // The free returns at once (the operation ended); MPI, which cannot cancel it, says so with TIMEOUT.
  ASSERT_NE(job.event(0, "free"), nullptr) << job.output;
  EXPECT_LT(job.event(0, "free")->ms, 100) << job.output;
  EXPECT_EVENT(job, 0, "finalize", "BPL_OK");
}

// A recv request that is only tested, never waited for, still ends at the communicator's timeout: a
// TIMEOUT naming the rank that sent nothing; that rank's barrier fails too.
TEST_P(Fault, RecvRequestOnlyTestedEndsAtTheTimeoutNamingTheSilentPeer) {
  constexpr int kTimeoutMs = 1500;
  Job job = run_job(backend(), 2, "recv_tested_past_its_deadline", {{"BPL_TIMEOUT_MS", std::to_string(kTimeoutMs)}});
  const Event* tested = job.event(0, "tested");
  ASSERT_NE(tested, nullptr) << job.output;
  EXPECT_EQ(tested->status, "BPL_ERR_TIMEOUT") << tested->message;
  EXPECT_NE(tested->message.find("done=1"), std::string::npos) << tested->message;
  EXPECT_NE(tested->message.find("rank 1"), std::string::npos) << tested->message;
  EXPECT_GE(tested->ms, kTimeoutMs - 50) << job.output;
  EXPECT_LT(tested->ms, kTimeoutMs + 3000) << job.output;
  const Event* barrier = job.event(1, "barrier");
  ASSERT_NE(barrier, nullptr) << job.output;
  EXPECT_NE(barrier->status, "BPL_OK") << job.output;
  std::printf("%s: rank 0's recv, only tested: %s after %lld ms: %s\n", backend().c_str(), tested->status.c_str(),
              static_cast<long long>(tested->ms), tested->message.c_str());
}

// Idle ranks use no core while nothing happens, also after a peer left the job: over 2 s of calling
// nothing after rank 0 exited, a survivor's process uses under 5% of a core. Their next call fails
// at once naming rank 0.
TEST(FaultGloo, IdleSurvivorsOfAnExitedRankUseNoCore) {
  for (const std::string backend : {"gloo", "gloo_tcp"}) {
    SCOPED_TRACE(backend);
    Job job = run_job(backend, 3, "idle_after_rank0_exits", {});
    for (int rank : {1, 2}) {
      EXPECT_EVENT(job, rank, "idle", "BPL_OK");
      const Event* idle = job.event(rank, "idle");
      if (idle == nullptr) continue;
      std::smatch cpu;
      ASSERT_TRUE(std::regex_search(idle->message, cpu, std::regex("cpu_ms=(\\d+)"))) << job.output;
      EXPECT_LT(std::stoll(cpu[1]), 100) << "rank " << rank << " spun while idle: " << idle->message;
      std::printf("%s: rank %d used %s ms of CPU in 2 s idle\n", backend.c_str(), rank, cpu[1].str().c_str());
      EXPECT_EVENT(job, rank, "next", "BPL_ERR_REMOTE");
      if (const Event* next = job.event(rank, "next")) expect_names_only(next->message, 0);
    }
  }
}

// A rank stopped before it finalizes: the others' bpl_finalize returns within T and a moment, and
// says (a warning naming the stopped rank) that the job did not end together.
TEST_P(Fault, FinalizeReturnsThoughARankIsStopped) {
  Job job = run_job(backend(), 3, "stop_before_finalize", {});
  for (int rank : {0, 2}) {
    EXPECT_EVENT(job, rank, "allreduce", "BPL_OK");
    EXPECT_EVENT(job, rank, "finalize", "BPL_OK");
    EXPECT_LE(job.event(rank, "finalize")->ms, kTimeoutMs + 1500) << job.output;
  }
  EXPECT_TRUE(std::regex_search(job.output, std::regex("WARN: not every rank reached bpl_finalize: [^\\n]*rank 1\\b")))
      << job.output;
  std::printf("%s: bpl_finalize returned after %lld ms\n", backend().c_str(),
              static_cast<long long>(job.event(0, "finalize")->ms));
}

// A rank stopped before MPI_Init: MPI_Init_thread waits for every rank with no bound of its own.
// Each other rank ends at T saying what it waited in, and mpirun then ends the job, well before the
// stopped rank's helper would (before, they waited for as long as it stayed stopped).
TEST(FaultMpi, RankStoppedBeforeMpiInitEndsTheJobAtTheTimeout) {
  if (!mpi_backend_built()) GTEST_SKIP() << kNoMpi;
  const auto start = Clock::now();
  Job job = run_job("mpi", 3, "stop_before_init", {});
  const auto took = ms_since(start);
  const ProcessResult& mpirun = job.processes.front();
  EXPECT_FALSE(mpirun.timed_out) << job.output;
  EXPECT_NE(mpirun.exit_code, 0) << job.output;
  EXPECT_GE(took, kTimeoutMs) << job.output;
  EXPECT_LT(took, kTimeoutMs + 4000) << "the job waited for the stopped rank: " << job.output;
  EXPECT_TRUE(std::regex_search(job.output, std::regex("MPI_Init_thread \\(rank [02] of 3\\) did not return within 3000 ms "
                                                       "\\(BPL_TIMEOUT_MS\\): it waits for every rank of the job to start")))
      << job.output;
  // The stopped rank is named, found by the launcher's job id among this machine's processes.
  EXPECT_TRUE(std::regex_search(job.output, std::regex("never started; rank 1 of the job, process \\d+ on this machine, "
                                                       "is stopped")))
      << job.output;
  std::printf("mpirun ended after %lld ms\n", static_cast<long long>(took));
}

}  // namespace
}  // namespace backplane::test::faults
