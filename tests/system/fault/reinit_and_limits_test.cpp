// bpl_init after bpl_finalize again and again, and after a failure; values at the top of their types.
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

// bpl_init right after bpl_finalize, again and again, in every rank's process: each world is a new
// one (no rank meets the store of the world before, whose host may still be ending it), through
// shared memory and over TCP; and on MPI, which backplane initialises once and finalises at exit.
TEST(Reinit, InitRightAfterFinalizeWorksEveryTimeOnEveryBackend) {
  for (const std::string backend : {"gloo", "gloo_tcp", "mpi"}) {
    SCOPED_TRACE(backend);
    if (backend == "mpi" && !mpi_backend_built()) continue;
    Job job = run_job(backend, 2, "reinit_cycles", {{"BPL_TEST_CYCLES", "40"}}, std::chrono::seconds(120));
    for (int rank = 0; rank < 2; ++rank) EXPECT_EVENT(job, rank, "cycles", "BPL_OK");
    for (const auto& process : job.processes) EXPECT_EQ(process.exit_code, 0) << job.output;  // mpi: MPI_Finalize at exit
    std::printf("%s: rank 0: %s\n", backend.c_str(), job.event(0, "cycles") ? job.event(0, "cycles")->message.c_str() : "");
  }
}

// On MPI, a process whose communicator failed cannot make a new world (duplicating MPI_COMM_WORLD
//     would wait for the failed rank): bpl_init after bpl_finalize is refused at once, saying why.
TEST(FaultMpi, InitAfterAFailureIsRefusedSayingWhy) {
  if (!mpi_backend_built()) GTEST_SKIP() << kNoMpi;
  Job job = run_job("mpi", 2, "reinit_after_failure", {{"BPL_TIMEOUT_MS", "1000"}});
  EXPECT_FALSE(job.processes.front().timed_out) << job.output;
  EXPECT_EVENT(job, 0, "allreduce", "BPL_ERR_TIMEOUT");
  EXPECT_EVENT(job, 0, "reinit", "BPL_ERR_UNAVAILABLE");
  if (const Event* reinit = job.event(0, "reinit")) {
    EXPECT_LT(reinit->ms, 500) << reinit->message;
    EXPECT_NE(reinit->message.find("failed or was aborted earlier in this process"), std::string::npos) << reinit->message;
  }
  EXPECT_NE(job.output.find("MPI_Finalize skipped at exit"), std::string::npos) << job.output;
}

// Values at the top of their types: an INT64_MAX (or 2^45 ms) timeout never runs out, and counts no
// address space can hold are INVALID_ARGUMENT naming the count, with the communicator still usable.
TEST_P(Fault, HugeTimeoutsAndCountsAreHandled) {
  Job job = run_job(backend(), 2, "huge_values", {});
  for (int rank = 0; rank < 2; ++rank) {
    for (const std::string suffix : {"max", "2p45"}) {
      EXPECT_EVENT(job, rank, "set_timeout_" + suffix, "BPL_OK");
      EXPECT_EVENT(job, rank, "allreduce_" + suffix, "BPL_OK");
      EXPECT_NE(job.event(rank, "allreduce_" + suffix)->message.find("sum=2"), std::string::npos) << job.output;
      EXPECT_EVENT(job, rank, "wait_" + suffix, "BPL_OK");
    }
    for (const std::string huge : {"huge_allreduce", "huge_broadcast", "huge_send"}) {
      EXPECT_EVENT(job, rank, huge, "BPL_ERR_INVALID_ARGUMENT");
      EXPECT_NE(job.event(rank, huge)->message.find("count = "), std::string::npos) << job.output;
      EXPECT_NE(job.event(rank, huge)->message.find("address space"), std::string::npos) << job.output;
    }
    EXPECT_EVENT(job, rank, "after", "BPL_OK");
    EXPECT_NE(job.event(rank, "after")->message.find("sum=2"), std::string::npos) << job.output;
    EXPECT_EVENT(job, rank, "finalize", "BPL_OK");
  }
  std::printf("%s: %s\n", backend().c_str(), job.event(0, "huge_allreduce")->message.c_str());
}

}  // namespace
}  // namespace backplane::test::faults
