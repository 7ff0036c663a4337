// BPL_MPI_WATCHDOG=1 on mpi: a watched blocking call past its bound ends the job naming what it was.
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

/* BPL_MPI_WATCHDOG=1: MPI's own blocking calls, watched. A call past the timeout (or on a communicator
   aborted meanwhile) ends the job: mpirun exits with the watchdog's code, 124, and the ranks' log says
   what the call was and what is known of the peers. */

class FaultMpiWatchdog : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!mpi_backend_built()) GTEST_SKIP() << kNoMpi;
  }
  static Job run(int ranks, const std::string& scenario, std::map<std::string, std::string> env) {
    env["BPL_MPI_WATCHDOG"] = "1";
    return run_job("mpi", ranks, scenario, env);
  }
  // The job ended by the watchdog (not by the test's limit, not by success), its message matching
  // `pattern` on some rank.
  static void expect_ended_by_the_watchdog(const Job& job, const std::string& pattern) {
    const ProcessResult& mpirun = job.processes.front();
    EXPECT_FALSE(mpirun.timed_out) << job.output;
    EXPECT_EQ(mpirun.exit_code, 124) << job.output;
    const std::regex message("\\[backplane:mpi\\] ERROR: " + pattern +
                             "[^\\n]*; BPL_MPI_WATCHDOG=1 ends the job \\(MPI cannot cancel its own blocking calls\\): "
                             "MPI_Abort, exit code 124");
    EXPECT_TRUE(std::regex_search(job.output, message)) << "expected " << pattern << " in: " << job.output;
  }
};

// A rank stopped in the middle of blocking allreduces: the others' watchdog ends the job a timeout
// (and at most a few of its sixteenths) after the call began, naming the allreduce and the stopped rank.
TEST_F(FaultMpiWatchdog, StoppedRankEndsTheJobAtTheTimeoutNamingIt) {
  const Job job = run(3, "stop_mid_allreduce", {{"BPL_TEST_FAULTY_RANK", "1"}});
  expect_ended_by_the_watchdog(job, "allreduce \\(f32, count 262144, sum\\) on rank [02] of a communicator of 3 did not "
                                    "complete within " + std::to_string(kTimeoutMs) + " ms \\(the communicator's timeout\\) "
                                    "\\(rank 1 of this communicator, process \\d+ on this machine, is stopped\\)");
  EXPECT_EQ(job.event(0, "failed"), nullptr) << "the call returned instead: " << job.output;
  EXPECT_EQ(job.output.find("every allreduce succeeded"), std::string::npos) << job.output;
  // Started, ran one allreduce, waited out the timeout, explained (a moment), ended.
  const double seconds = job.processes.front().seconds;
  EXPECT_GE(seconds, kTimeoutMs / 1000.0) << job.output;
  EXPECT_LT(seconds, kTimeoutMs * 1.25 / 1000.0 + 10) << job.output;
  std::printf("mpi watchdog: the job ended %.1f s after mpirun started\n", seconds);
}

// Ranks calling different collectives: MPI's calls stall, and the watchdog says what each called.
TEST_F(FaultMpiWatchdog, MismatchedCollectivesEndTheJobNamingWhatEachCalled) {
  const Job job = run(3, "mismatched_collectives", {{"BPL_TEST_CASE", "op"}, {"BPL_TIMEOUT_MS", "1500"}});
  expect_ended_by_the_watchdog(job, "(allreduce|broadcast) \\(f32, count 16, [^)]*\\) on rank \\d of a communicator of 3 did "
                                    "not complete within 1500 ms \\(the communicator's timeout\\): ranks disagree on the "
                                    "collective they call: ranks 0,2 call allreduce \\(f32, count 16, sum\\); rank 1 calls "
                                    "broadcast \\(f32, count 16, root 0\\); rank 1 differs from the others");
  EXPECT_EQ(job.event(0, "mismatch"), nullptr) << job.output;
}

// bpl_comm_abort from another thread cannot release MPI's blocking call: the watchdog ends the job at
// once rather than at the timeout.
TEST_F(FaultMpiWatchdog, AbortDuringABlockingCallEndsTheJobAtOnce) {
  const Job job = run(3, "abort_blocking_call", {});
  expect_ended_by_the_watchdog(job, "the communicator was aborted \\(bpl_comm_abort\\) during allreduce \\(f32, count "
                                    "1024, sum\\) on rank 0 of a communicator of 3, which MPI cannot release");
  EXPECT_EQ(job.output.find("did not complete within"), std::string::npos) << "ended at the timeout: " << job.output;
}

// A recv of another size than its send is MISMATCH on the receiver, its buffer intact: above the eager
// size the watched recv probes the message's size first; within it MPI copies at most what was posted.
TEST_F(FaultMpiWatchdog, RecvOfAnotherSizeIsMismatchAndWritesNothingPastItsBuffer) {
  for (const std::string which : {"sendrecv", "sendrecv_short"}) {
    SCOPED_TRACE(which);
    const Job job = run(2, "mismatched_collectives", {{"BPL_TEST_CASE", which}, {"BPL_TIMEOUT_MS", "1500"}});
    EXPECT_FALSE(job.processes.front().timed_out) << job.output;
    EXPECT_EVENT(job, 0, "mismatch", "BPL_OK");
    EXPECT_EVENT(job, 1, "mismatch", "BPL_ERR_MISMATCH");
    EXPECT_NE(job.event(1, "mismatch")->message.find("rank 0 sent "), std::string::npos) << job.output;
    EXPECT_NE(job.event(1, "mismatch")->message.find("the ranks disagree on the size"), std::string::npos) << job.output;
    for (int rank = 0; rank < 2; ++rank) EXPECT_EVENT(job, rank, "guard", "BPL_OK");
    std::printf("mpi watchdog %s: %s\n", which.c_str(), job.event(1, "mismatch")->message.c_str());
  }
}

}  // namespace
}  // namespace backplane::test::faults
