// The fingerprints ranks compare (fingerprint.h): what a report says, and the pairing of the counts of
// variable-size collectives, which no rank can check from its own arguments.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "fingerprint.h"
#include "stall.h"

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

// A stall's words, through a plugin's transport: the ranks that said nothing, as one rank or several,
// and the report of those that spoke; this rank's own word is its own, whatever the transport returned.
TEST(Fingerprint, AStallNamesTheSilentRanksAndComparesTheOthers) {
  const Fingerprint barrier = fingerprint_of(BPL_COLL_BARRIER);
  const Fingerprint allreduce = fingerprint_of(BPL_COLL_ALLREDUCE, BPL_DTYPE_F32, 16, -1, BPL_OP_SUM);
  using Said = std::vector<std::optional<Fingerprint>>;
  const auto saying = [](Said said) {
    return [said](const Fingerprint&, std::chrono::milliseconds) { return said; };
  };
  const StallExplanation agreed = explain_stall(barrier, 0, std::chrono::milliseconds(0),
                                                saying({std::nullopt, std::nullopt, barrier}));
  EXPECT_EQ(agreed.mismatch, "");
  EXPECT_EQ(agreed.answered, (std::vector<bool>{true, false, true}));
  EXPECT_FALSE(agreed.everyone_answered);
  EXPECT_EQ(agreed.silent, "rank 1");
  const StallExplanation split = explain_stall(barrier, 0, std::chrono::milliseconds(0),
                                               saying({barrier, std::nullopt, allreduce, std::nullopt}));
  EXPECT_EQ(split.silent, "ranks 1,3");
  EXPECT_NE(split.mismatch.find("rank 0 calls barrier"), std::string::npos) << split.mismatch;
  EXPECT_NE(split.mismatch.find("rank 2 calls allreduce"), std::string::npos) << split.mismatch;
  EXPECT_NE(split.mismatch.find("; no word from ranks 1,3, which left the operation or never came (found when the "
                                "operation stalled)"),
            std::string::npos)
      << split.mismatch;
  const StallExplanation all = explain_stall(allreduce, 1, std::chrono::milliseconds(0), saying({allreduce, allreduce}));
  EXPECT_TRUE(all.everyone_answered);
  EXPECT_EQ(all.mismatch, "");
}

// The identity the core hands a plugin carries the fingerprint whole, and its hash is the call's.
TEST(Fingerprint, AnOperationsIdentityCarriesItsFingerprint) {
  Fingerprint alltoallv = fingerprint_of(BPL_COLL_ALLTOALLV, BPL_DTYPE_I32);
  alltoallv.sequence = 7;
  alltoallv.pairing = -12345;
  const bpl_operation_identity identity = identity_of(alltoallv);
  EXPECT_EQ(identity.struct_size, sizeof(bpl_operation_identity));
  EXPECT_EQ(identity.hash, call_hash(alltoallv));
  EXPECT_EQ(encode(fingerprint_of(identity)), encode(alltoallv));
  EXPECT_EQ(encode(fingerprint_of(nullptr, alltoallv)), encode(alltoallv));
  Fingerprint check = fingerprint_of(static_cast<bpl_collective>(kFingerprintCheckOp), BPL_DTYPE_I64, 8);
  check.sequence = 7;
  EXPECT_EQ(describe(check), "the BPL_DEBUG=detail check before #7 (i64, count 8)");
}

}  // namespace
}  // namespace backplane
