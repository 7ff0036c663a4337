// bpl_comm_abort from another thread, and a rank that finalizes alone: waits and blocking calls are
// released at once, and the peers learn of it.
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

// bpl_comm_abort from another thread releases a blocked wait within 1 s; a second abort is a no-op;
// later operations fail at once with ABORTED; the free stays bounded by the timeout.
TEST_P(Fault, AbortFromAnotherThreadReleasesAWait) {
  Job job = run_job(backend(), 2, "abort_from_another_thread", {});
  EXPECT_EVENT(job, 0, "abort", "BPL_OK");
  EXPECT_EVENT(job, 0, "abort_again", "BPL_OK");
  EXPECT_EVENT(job, 0, "wait", "BPL_ERR_ABORTED");
  std::smatch released;
  ASSERT_TRUE(std::regex_search(job.event(0, "wait")->message, released, std::regex("released_after_abort=(-?\\d+)")));
  EXPECT_LT(std::stoi(released[1]), 1000) << job.output;
  std::printf("%s: the wait returned %s ms after the abort\n", backend().c_str(), released[1].str().c_str());
  EXPECT_EVENT(job, 0, "retry", "BPL_ERR_ABORTED");
  EXPECT_LT(job.event(0, "retry")->ms, 50);
  ASSERT_NE(job.event(0, "free"), nullptr) << job.output;
  EXPECT_LE(job.event(0, "free")->ms, kTimeoutMs + 1500) << job.output;
  EXPECT_EVENT(job, 0, "finalize", "BPL_OK");
}

// Rank 0 finalizes alone: its barrier gives up on the others at the timeout and it exits. The
// survivors' next call fails at once naming rank 0, which ended, not the rank it gave up waiting for
// (on shared memory, rank 1 used to read rank 0's record as news of itself).
TEST(FaultGloo, ARankThatFinalizedAloneIsNamedAtTheSurvivorsNextCall) {
  for (const std::string backend : {"gloo", "gloo_tcp"}) {
    SCOPED_TRACE(backend);
    Job job = run_job(backend, 3, "idle_after_rank0_exits", {{"BPL_TEST_CASE", "finalize"}, {"BPL_TIMEOUT_MS", "1000"}});
    for (int rank : {1, 2}) {
      EXPECT_EVENT(job, rank, "next", "BPL_ERR_REMOTE");
      const Event* next = job.event(rank, "next");
      if (next == nullptr) continue;
      EXPECT_LT(next->ms, 500) << next->message;
      expect_names_only(next->message, 0);
      EXPECT_NE(next->message.find("has ended"), std::string::npos) << next->message;
      std::printf("%s: rank %d: %s\n", backend.c_str(), rank, next->message.c_str());
    }
  }
}

// bpl_comm_abort on gloo closes the connections: every peer in a collective learns of it at once,
// the third rank as well as the two the aborting rank's collective was exchanging with.
TEST(FaultGloo, AbortClosesTheConnectionsSoPeersFailAtOnce) {
  for (const std::string backend : {"gloo", "gloo_tcp"}) {
    SCOPED_TRACE(backend);
    Job job = run_job(backend, 3, "abort_notifies_peers", {});
    EXPECT_EVENT(job, 0, "abort", "BPL_OK");
    for (int rank : {1, 2}) {
      EXPECT_EVENT(job, rank, "failed", "BPL_ERR_REMOTE");
      EXPECT_LT(job.event(rank, "failed")->ms, 1000) << job.output;
      expect_names_only(job.event(rank, "failed")->message, 0);
      EXPECT_NE(job.event(rank, "failed")->message.find("aborted (bpl_comm_abort) by rank 0"), std::string::npos)
          << job.output;
    }
  }
}

// Abort from another thread releases a blocking call (not only a request's wait) within 1 s; on
//     gloo the third rank, in the same allreduce, fails at once too, naming the aborting rank. MPI
//     cannot tell its peers: rank 2 waits out its timeout there.
TEST_P(Fault, AbortFromAnotherThreadReleasesABlockingCall) {
  Job job = run_job(backend(), 3, "abort_blocking_call", {});
  EXPECT_EVENT(job, 0, "blocked", "BPL_ERR_ABORTED");
  std::smatch released;
  ASSERT_TRUE(std::regex_search(job.event(0, "blocked")->message, released, std::regex("released_after_abort=(-?\\d+)")));
  EXPECT_LT(std::stoi(released[1]), 1000) << job.output;
  EXPECT_GE(std::stoi(released[1]), 0) << job.output;
  EXPECT_EVENT(job, 0, "finalize", "BPL_OK");
  const Event* third = job.event(2, "blocked");
  ASSERT_NE(third, nullptr) << job.output;
  if (is_mpi()) {
    EXPECT_EQ(third->status, "BPL_ERR_TIMEOUT") << job.output;
  } else {
    EXPECT_EQ(third->status, "BPL_ERR_REMOTE") << job.output;
    EXPECT_LT(third->ms, 500 + 1000) << job.output;
    expect_names_only(third->message, 0);
  }
  std::printf("%s: the blocking call returned %s ms after the abort; rank 2: %s after %lld ms: %s\n", backend().c_str(),
              released[1].str().c_str(), third->status.c_str(), static_cast<long long>(third->ms), third->message.c_str());
}

}  // namespace
}  // namespace backplane::test::faults
