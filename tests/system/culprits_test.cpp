// The right rank named, on mpi under a real mpirun: a survivor that gave up in an operation is never
// named as what held it up, and a rank stopped before MPI_Init_thread returns is named by the ranks
// that wait for it there (its process on this machine, found by the launcher's job id).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "backplane/backplane.h"
#include "support/fault_job.h"
#include "support/process.h"

namespace {

using namespace backplane::test::faults;
using backplane::test::kNoMpi;
using backplane::test::mpi_backend_built;

// Rank 2 skips an allreduce (it sleeps); rank 0 gives up at T and then stops; rank 1 gives up at T + 2 s.
int skip_then_stop() {
  Rank r = join();
  if (r.rank == 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(r.timeout_ms + 6000));
    return 0;
  }
  if (r.rank == 1) bpl_comm_set_timeout(r.world, r.timeout_ms + 2000);
  float value = 1.0f;
  const auto start = Clock::now();
  report(r, "allreduce", bpl_allreduce(r.world, &value, &value, 1, BPL_DTYPE_F32, BPL_OP_SUM, nullptr), start);
  if (r.rank == 0) stop_self_until_killed(r.timeout_ms + 4000);
  std::this_thread::sleep_for(std::chrono::milliseconds(r.timeout_ms + 6000));
  return 0;
}

// Rank 0 was in the allreduce with rank 1 (its word came) and then stopped: rank 1 names rank 2, which
// never came, and not rank 0.
TEST(CulpritsMpi, ASurvivorThatGaveUpIsNotNamedAsTheCause) {
  if (!mpi_backend_built()) GTEST_SKIP() << kNoMpi;
  Job job = run_job("mpi", 3, "skip_then_stop", {});
  EXPECT_EVENT(job, 1, "allreduce", "BPL_ERR_TIMEOUT");
  if (const Event* failed = job.event(1, "allreduce")) {
    EXPECT_NE(failed->message.find("no word from rank 2 of this communicator"), std::string::npos) << failed->message;
    EXPECT_EQ(failed->message.find("rank 0 of this communicator"), std::string::npos) << failed->message;
  }
}

}  // namespace

int main(int argc, char** argv) { return main_with_scenarios(argc, argv, {{"skip_then_stop", skip_then_stop}}); }
