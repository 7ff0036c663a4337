// The fingerprints ranks compare (fingerprint.h): what a report says, and the pairing of the counts of
// variable-size collectives, which no rank can check from its own arguments.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fingerprint.h"

namespace backplane {
namespace {

// counts[r][q]: what rank r sends rank q in an alltoallv; received[r][q]: what r receives from q.
std::vector<Fingerprint> alltoallv(const std::vector<std::vector<int64_t>>& sent,
                                   const std::vector<std::vector<int64_t>>& received) {
  const int ranks = static_cast<int>(sent.size());
  std::vector<Fingerprint> all;
  for (int r = 0; r < ranks; ++r) {
    Fingerprint f;
    f.op = BPL_COLL_ALLTOALLV;
    f.dtype = BPL_DTYPE_F32;
    f.pairing = pairing_share(r, ranks, [&](int q) { return sent[r][q]; }, [&](int q) { return received[r][q]; });
    all.push_back(f);
  }
  return all;
}

std::vector<std::vector<int64_t>> transposed(const std::vector<std::vector<int64_t>>& m) {
  std::vector<std::vector<int64_t>> t(m[0].size(), std::vector<int64_t>(m.size()));
  for (size_t i = 0; i < m.size(); ++i) {
    for (size_t j = 0; j < m[i].size(); ++j) t[j][i] = m[i][j];
  }
  return t;
}

TEST(Fingerprint, CountsThatPairUpAgree) {
  const std::vector<std::vector<int64_t>> sent = {{1, 0, 7}, {3, 3, 0}, {0, 5, 2}};
  EXPECT_EQ(compare(alltoallv(sent, transposed(sent))), "");
}

TEST(Fingerprint, CountsThatDoNotPairUpAreAMismatch) {
  const std::vector<std::vector<int64_t>> sent = {{1, 0, 7}, {3, 3, 0}, {0, 5, 2}};
  for (size_t r = 0; r < 3; ++r) {
    for (size_t q = 0; q < 3; ++q) {
      auto received = transposed(sent);
      received[r][q] += 1;  // r expects one element more from q than q sends it
      const std::string report = compare(alltoallv(sent, received));
      EXPECT_NE(report.find("ranks disagree on the counts of alltoallv (f32): what some rank sends another is not what "
                            "that one receives from it; differ in: counts"),
                std::string::npos)
          << r << "," << q << ": " << report;
    }
  }
  // Two disagreements that a plain sum of counts would not see.
  auto received = transposed(sent);
  received[0][1] += 4;
  received[2][1] -= 4;
  EXPECT_NE(compare(alltoallv(sent, received)), "");
  // Each rank taking its own send counts for its receive counts (the classic slip).
  EXPECT_NE(compare(alltoallv(sent, sent)), "");
}

TEST(Fingerprint, PairingIsCheckedOnlyWhenEveryRankAnswered) {
  const std::vector<std::vector<int64_t>> sent = {{1, 2}, {3, 4}};
  auto received = transposed(sent);
  received[1][0] = 9;
  const std::vector<Fingerprint> all = alltoallv(sent, received);
  EXPECT_NE(compare({{0, all[0]}, {1, all[1]}}, 2), "");
  EXPECT_EQ(compare({{0, all[0]}}, 2), "");  // rank 1 said nothing: its part is unknown
}

TEST(Fingerprint, TheWordsCarryThePairing) {
  Fingerprint f;
  f.op = BPL_COLL_ALLGATHERV;
  f.pairing = -123456789;
  const std::optional<Fingerprint> back = decode(encode(f));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->pairing, f.pairing);
  EXPECT_EQ(back->op, f.op);
}

TEST(Fingerprint, DifferentCallsNameTheRanksAndFields) {
  Fingerprint allreduce;
  allreduce.op = BPL_COLL_ALLREDUCE;
  allreduce.dtype = BPL_DTYPE_F32;
  allreduce.count = 16;
  allreduce.reduce_op = BPL_OP_SUM;
  Fingerprint fewer = allreduce;
  fewer.count = 15;
  EXPECT_EQ(compare({allreduce, fewer, allreduce}),
            "ranks disagree on the collective they call: ranks 0,2 call allreduce (f32, count 16, sum); rank 1 calls "
            "allreduce (f32, count 15, sum); rank 1 differs from the others; differ in: count");
}

// bpl_finalize's barrier is not a bpl_barrier: a rank that finalizes while another calls a barrier is
// told apart, and named as finalizing.
TEST(Fingerprint, FinalizeIsNamedAndDiffersFromABarrier) {
  Fingerprint barrier;
  barrier.op = BPL_COLL_BARRIER;
  Fingerprint finalizing;
  finalizing.op = kFinalizeOp;
  EXPECT_EQ(describe(finalizing), "bpl_finalize");
  EXPECT_NE(call_hash(barrier), call_hash(finalizing));
  EXPECT_EQ(compare({barrier, finalizing}),
            "ranks disagree on the collective they call: rank 0 calls barrier; rank 1 calls bpl_finalize; differ in: op");
}

// A stall's words: the ranks that said nothing, as one rank or several, and the report of those that spoke.
TEST(Fingerprint, AStallNamesTheSilentRanksAndComparesTheOthers) {
  const Fingerprint barrier = fingerprint_of(BPL_COLL_BARRIER);
  const Fingerprint allreduce = fingerprint_of(BPL_COLL_ALLREDUCE, BPL_DTYPE_F32, 16, -1, BPL_OP_SUM);
  const StallFindings one_silent = compare_stalled({barrier, std::nullopt, barrier});
  EXPECT_EQ(one_silent.report, "");
  EXPECT_EQ(one_silent.silent, "rank 1");
  const StallFindings two_silent = compare_stalled({barrier, std::nullopt, allreduce, std::nullopt});
  EXPECT_EQ(two_silent.silent, "ranks 1,3");
  EXPECT_NE(two_silent.report.find("rank 0 calls barrier"), std::string::npos) << two_silent.report;
  EXPECT_NE(two_silent.report.find("rank 2 calls allreduce"), std::string::npos) << two_silent.report;
  EXPECT_EQ(compare_stalled({allreduce, allreduce}).silent, "");
}

}  // namespace
}  // namespace backplane
