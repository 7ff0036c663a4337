// For GoogleTest binaries that run as every rank of a job: rank 0 prints the full report, the other
// ranks only their failures, tagged with their rank, so the log stays readable.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>

namespace backplane::test {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, result.file_name() ? result.file_name() : "?",
                   result.line_number(), result.summary());
    }
  }

 private:
  int rank_;
};

// Call after InitGoogleTest, on every rank.
inline void report_failures_only_unless_rank_zero(int rank) {
  if (rank == 0) return;
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankFailurePrinter(rank));
}

}  // namespace backplane::test
