// What the fault suites share: the fixture run on every backend, and the checks of what survivors say.
#pragma once

#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "support/fault_job.h"
#include "support/process.h"

namespace backplane::test::faults {

using backplane::test::kNoMpi;
using backplane::test::mpi_backend_built;
using backplane::test::ProcessResult;

class Fault : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "mpi" && !mpi_backend_built()) GTEST_SKIP() << kNoMpi;
    if (is_mpi() && GetParam() != "mpi" && other_mpi(GetParam()) == nullptr) GTEST_SKIP() << kNoOtherMpi;
  }
  const std::string& backend() const { return GetParam(); }
  bool is_mpi() const { return GetParam().rfind("mpi", 0) == 0; }
  // T of the mismatch jobs: their ranks that fail at once wait T + 1 s on MPI (mismatched_collectives),
  // and mpirun's ranks meet without the store whose rendezvous needs T to outlast loading the plugin.
  std::string mismatch_timeout() const { return is_mpi() ? "1500" : std::to_string(kTimeoutMs); }
};


// Every peer `message` names, as "rank N of this communicator" (the cause) or as "the connection to
// rank N" (what was seen of it from another machine), is `culprit`: a survivor never names another
// survivor. With `may_not_know`, naming none is allowed (a rank alone on its machine cannot see a
// peer's process, and may not learn what the others saw when the store's host is the one that failed).
// Where the message reports the communicator's first failure, what this rank saw itself ("; here: …",
// a survivor's connection closing after that failure, say) is context, not the culprit.
inline void expect_names_only(const std::string& message, int culprit, bool may_not_know = false) {
  const std::regex named("rank (\\d+) of this communicator|the connection to rank (\\d+)");
  const size_t first_failure = message.find("the communicator's first failure");
  const std::string claim =
      first_failure == std::string::npos ? message : message.substr(0, message.find("; here: ", first_failure));
  int names = 0;
  for (std::sregex_iterator it(claim.begin(), claim.end(), named), end; it != end; ++it, ++names) {
    EXPECT_EQ(std::stoi((*it)[1].matched ? (*it)[1] : (*it)[2]), culprit) << "names the wrong rank: " << message;
  }
  if (!may_not_know) {
    EXPECT_GT(names, 0) << "names no rank: " << message;
  }
}

inline std::vector<int> survivors_of(int faulty, int size) {
  std::vector<int> survivors;
  for (int r = 0; r < size; ++r) {
    if (r != faulty) survivors.push_back(r);
  }
  return survivors;
}

// Survivor `rank` of a job whose rank 1 was killed: it did not time out and failed with REMOTE in
// `op` within `within_ms`. Its event, or null (the failure is recorded).
inline const Event* expect_remote_failure_in(const Job& job, int rank, const std::string& op, int64_t within_ms) {
  EXPECT_FALSE(job.processes[static_cast<size_t>(rank)].timed_out) << job.output;
  const Event* failed = job.event(rank, "failed");
  EXPECT_NE(failed, nullptr) << "rank " << rank << " reported no failure:\n" << job.output;
  if (failed == nullptr) return nullptr;
  EXPECT_EQ(failed->status, "BPL_ERR_REMOTE") << "rank " << rank << ":\n" << job.output;
  EXPECT_LT(failed->ms, within_ms) << failed->message;
  EXPECT_NE(failed->message.find(op), std::string::npos) << failed->message;
  return failed;
}

// What a bpl_init that fails at its timeout may take beyond it: mostly loading the plugin (LibTorch's
// c10d), 0.7 s here and 1.5-2.1 s under sanitizers beside another test (4.56 s in all was seen there
// with a 3 s timeout). Less than a second timeout, so that a rank that waited for it twice fails.
constexpr int64_t kInitBeyondTimeoutMs = 2900;

// How long the rank's bpl_init took to fail, as it reported.
inline int64_t init_ms(const ProcessResult& r) {
  std::smatch match;
  if (!std::regex_search(r.output, match, std::regex("init BPL_\\w+ after (\\d+) ms"))) return -1;
  return std::stoll(match[1]);
}

}  // namespace backplane::test::faults
