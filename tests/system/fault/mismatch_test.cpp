// Ranks that disagree (another collective, size, dtype or root; a skipped call): an error on every
// rank, never a hang or a write out of bounds.
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

// BPL_DEBUG=detail: mismatched collectives are MISMATCH on every rank, naming the differing field
// (and the rank, except where counts of alltoallv do not pair up: no rank's are wrong on their own).
TEST_P(Fault, DetailModeReportsMismatchedCollectivesOnEveryRank) {
  const std::map<std::string, std::string> differs = {{"op", "differ in: op"},     {"count", "differ in: count"},
                                                      {"skip", "differ in: op"},   {"root", "differ in: root"},
                                                      {"alltoallv", "differ in: counts"}};
  for (const auto& [which, field] : differs) {
    SCOPED_TRACE(which);
    Job job = run_job(backend(), 3, "mismatched_collectives",
                      {{"BPL_DEBUG", "detail"}, {"BPL_TEST_CASE", which}, {"BPL_TIMEOUT_MS", mismatch_timeout()}});
    for (int rank = 0; rank < 3; ++rank) {
      EXPECT_EVENT(job, rank, "mismatch", "BPL_ERR_MISMATCH");
      const std::string& message = job.event(rank, "mismatch")->message;
      EXPECT_NE(message.find("BPL_DEBUG=detail: ranks disagree"), std::string::npos) << message;
      EXPECT_NE(message.find(field), std::string::npos) << message;
      if (which != "alltoallv") {
        EXPECT_NE(message.find("rank 1 differs from the others"), std::string::npos) << message;
      }
      EXPECT_EVENT(job, rank, "retry", "BPL_ERR_MISMATCH");
    }
    std::printf("%s %s: %s\n", backend().c_str(), which.c_str(), job.event(0, "mismatch")->message.c_str());
  }
}

// Collectives are numbered apart from sends and receives, which ranks make in different numbers: under
// BPL_DEBUG=detail an allreduce after rank 0 sent to each peer is checked and runs (every rank's
// "mismatch" step reports BPL_OK and the sum).
TEST_P(Fault, DetailModeNumbersCollectivesApartFromSendsAndReceives) {
  Job job = run_job(backend(), 3, "mismatched_collectives",
                    {{"BPL_DEBUG", "detail"}, {"BPL_TEST_CASE", "uneven_sends"}, {"BPL_TIMEOUT_MS", mismatch_timeout()}});
  for (int rank = 0; rank < 3; ++rank) EXPECT_EVENT(job, rank, "mismatch", "BPL_OK");
}

// Without detail, ranks that disagree on a transfer's size never write out of bounds, never crash,
// and never all succeed. With 64 Ki elements (above every library's eager limit) every rank reports
// MISMATCH: at once through shared memory; on MPI, at once where a rank receives (the probe that
// matches a large collective's message or a recv checks its size first; a recv's sender completes:
// MPI delivered the message) and a rank that only sends at its timeout, from the fingerprints (except
// under Intel MPI, whose shared-memory sends complete once copied out at every size tried, up to 512
// KiB: a rooted operation's rank that only sends returns OK, and its next call meets the failure when
// it stalls);
// over Gloo's TCP pairs, whose messages then never match, when the operation stalls, from the
// ranks' records in the store. The sanitizer build runs this too.
TEST_P(Fault, MismatchedSizesWithoutDetailAreAnErrorOnEveryRankAndNeverCorruptMemory) {
  for (const std::string which :
       {"allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "alltoall", "gather", "scatter", "allgatherv",
        "alltoallv", "sendrecv"}) {
    SCOPED_TRACE(which);
    Job job = run_job(backend(), 2, "mismatched_collectives", {{"BPL_TEST_CASE", which}, {"BPL_TIMEOUT_MS", mismatch_timeout()}});
    EXPECT_EQ(job.output.find("AddressSanitizer"), std::string::npos) << job.output;
    const ProcessResult& launched = job.processes.front();
    EXPECT_FALSE(launched.timed_out) << job.output;
    for (int rank = 0; rank < 2; ++rank) {
      if (!is_mpi()) {
        EXPECT_EQ(job.processes[static_cast<size_t>(rank)].signal, 0) << job.output;
      }
      EXPECT_EVENT(job, rank, "guard", "BPL_OK");
      // MPI delivers a send whole (the receiver takes it into a buffer of its own and fails): the
      // sender's part succeeded.
      if (is_mpi() && which == "sendrecv" && rank == 0) continue;
      // The rank of a rooted operation that only sends (the root is 1 for reduce, 0 for the others).
      const int only_sender = which == "gather" ? 1 : which == "reduce" || which == "broadcast" || which == "scatter" ? 0 : -1;
      if (backend() == "mpi_impi" && rank == only_sender) {
        const Event* sent = job.event(rank, "mismatch");
        ASSERT_NE(sent, nullptr) << job.output;
        EXPECT_TRUE(sent->status == "BPL_OK" || sent->status == "BPL_ERR_MISMATCH") << sent->message;
        continue;
      }
      EXPECT_EVENT(job, rank, "mismatch", "BPL_ERR_MISMATCH");
      const Event& mismatch = *job.event(rank, "mismatch");
      EXPECT_LE(mismatch.ms, std::stoi(mismatch_timeout()) + 2000) << mismatch.message;
      std::printf("%s %s: rank %d after %lld ms: %s\n", backend().c_str(), which.c_str(), rank,
                  static_cast<long long>(mismatch.ms), mismatch.message.c_str());
    }
  }
}

// A recv whose sender sends another size, where the MPI backend posts the recv at once (a message it
// copies eagerly) or the sender's message is not one (it travels under a tag apart, mpi_comm.h):
// the recv is MISMATCH naming both sizes, at once for a shorter eager message, at the timeout for
// one of the other class; nothing is written past its buffer. (The sender's own outcome differs by
// backend: MPI completes an eager send, and times out a large one nobody receives.)
TEST_P(Fault, RecvOfAnotherSizeThanItsSendIsMismatchNamingBoth) {
  for (const std::string which : {"sendrecv_short", "sendrecv_classes"}) {
    SCOPED_TRACE(which);
    Job job = run_job(backend(), 2, "mismatched_collectives", {{"BPL_TEST_CASE", which}, {"BPL_TIMEOUT_MS", mismatch_timeout()}});
    EXPECT_FALSE(job.processes.front().timed_out) << job.output;
    for (int rank = 0; rank < 2; ++rank) EXPECT_EVENT(job, rank, "guard", "BPL_OK");
    EXPECT_EVENT(job, 1, "mismatch", "BPL_ERR_MISMATCH");
    const Event& mismatch = *job.event(1, "mismatch");
    EXPECT_LE(mismatch.ms, std::stoi(mismatch_timeout()) + 2000) << mismatch.message;
    const std::string sent = which == "sendrecv_classes" ? "8192" : "2000", expected = which == "sendrecv_classes" ? "2000" : "2400";
    EXPECT_NE(mismatch.message.find(sent + " bytes"), std::string::npos) << mismatch.message;
    EXPECT_NE(mismatch.message.find(expected + " bytes"), std::string::npos) << mismatch.message;
    std::printf("%s %s: rank 1 after %lld ms: %s\n", backend().c_str(), which.c_str(), static_cast<long long>(mismatch.ms),
                mismatch.message.c_str());
  }
}

// A recv from any rank that nobody answers is a point-to-point wait that ran out: TIMEOUT on its
// rank, never a collective's MISMATCH beside the ranks that wait in a barrier for it (they fail,
// and say that rank 0 is in the recv).
TEST_P(Fault, UnansweredRecvFromAnyRankIsATimeoutNotACollectiveMismatch) {
  Job job = run_job(backend(), 3, "mismatched_collectives", {{"BPL_TEST_CASE", "recv_any"}, {"BPL_TIMEOUT_MS", mismatch_timeout()}});
  EXPECT_FALSE(job.processes.front().timed_out) << job.output;
  const Event* recv = job.event(0, "mismatch");
  ASSERT_NE(recv, nullptr) << job.output;
  EXPECT_EQ(recv->status, "BPL_ERR_TIMEOUT") << recv->message;
  EXPECT_NE(recv->message.find("recv"), std::string::npos) << recv->message;
  for (int rank = 1; rank < 3; ++rank) {
    const Event* barrier = job.event(rank, "mismatch");
    ASSERT_NE(barrier, nullptr) << job.output;
    EXPECT_NE(barrier->status, "BPL_OK") << barrier->message;
    std::printf("%s: rank %d: %s: %s\n", backend().c_str(), rank, barrier->status.c_str(), barrier->message.c_str());
  }
  std::printf("%s: rank 0: %s after %lld ms: %s\n", backend().c_str(), recv->status.c_str(),
              static_cast<long long>(recv->ms), recv->message.c_str());
}

// A small count mismatch (99 and 100 elements, below every eager limit), a rank that skips a
// collective, and ranks that move the same bytes but disagree on the dtype, the reduce op or a
// reduce's root: no rank crashes, none writes out of bounds, no rank's wait spins, and every rank
// reports MISMATCH naming rank 1 (the ranks' messages never match: gloo's and the MPI plugin's schedules tag them with the
// call's fingerprint, and shared memory compares it at every step).
TEST_P(Fault, SmallMismatchesAndSkippedCollectivesWithoutDetailAreErrors) {
  for (const std::string which : {"count", "skip", "dtype", "reduce_op", "reduce_root"}) {
    SCOPED_TRACE(which);
    // On MPI, rank 2 of a reduce whose root ranks disagree on is a leaf of both trees: its part reaches
    // rank 0, which agrees with it, and it returns BPL_OK, as from MPI's own reduce; ranks 0 and 1 stall
    // and find the difference in the words of the ranks still in the operation.
    const bool leaf_returns = is_mpi() && which == "reduce_root";
    Job job = run_job(backend(), 3, "mismatched_collectives", {{"BPL_TEST_CASE", which}, {"BPL_TIMEOUT_MS", mismatch_timeout()}});
    EXPECT_EQ(job.output.find("AddressSanitizer"), std::string::npos) << job.output;
    EXPECT_FALSE(job.processes.front().timed_out) << job.output;
    for (int rank = 0; rank < 3; ++rank) {
      if (!is_mpi()) {
        EXPECT_EQ(job.processes[static_cast<size_t>(rank)].signal, 0) << job.output;
      }
      EXPECT_EVENT(job, rank, "guard", "BPL_OK");
      const Event* mismatch = job.event(rank, "mismatch");
      ASSERT_NE(mismatch, nullptr) << job.output;
      std::printf("%s %s: rank %d: %s after %lld ms: %s\n", backend().c_str(), which.c_str(), rank,
                  mismatch->status.c_str(), static_cast<long long>(mismatch->ms), mismatch->message.c_str());
      if (leaf_returns && rank == 2) {
        EXPECT_EQ(mismatch->status, "BPL_OK") << mismatch->message;
        continue;
      }
      EXPECT_EQ(mismatch->status, "BPL_ERR_MISMATCH") << mismatch->message;
      // A wait for a peer that never comes uses no core: under a tenth of the time waited, beyond start-up.
      std::smatch cpu;
      ASSERT_TRUE(std::regex_search(mismatch->message, cpu, std::regex("cpu_ms=(\\d+)"))) << mismatch->message;
      EXPECT_LT(std::stoll(cpu[1]), 50 + mismatch->ms / 10) << "the wait spun: " << mismatch->message;
      // On machines of two ranks, ranks 0 and 1 find it in their segment, as MPI's ranks 0 and 1 do
      // without rank 2: two ranks, no majority.
      EXPECT_NE(mismatch->message.find(backend() == "gloo_machines" || leaf_returns ? "rank 1 calls"
                                                                                    : "rank 1 differs from the others"),
                std::string::npos)
          << mismatch->message;
      if (leaf_returns) {
        EXPECT_NE(mismatch->message.find("differ in: root; no word from rank 2"), std::string::npos) << mismatch->message;
      }
      // Every backend names the calls by the core's numbers (the barrier before them is #1).
      if (which == "skip") {
        EXPECT_NE(mismatch->message.find(" allreduce #2 (f32"), std::string::npos) << mismatch->message;
        EXPECT_NE(mismatch->message.find("calls barrier #2"), std::string::npos) << mismatch->message;
      }
    }
  }
}
}  // namespace
}  // namespace backplane::test::faults
