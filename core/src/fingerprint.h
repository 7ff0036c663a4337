// BPL_DEBUG=detail: before each collective, the ranks of the communicator exchange what they are about
// to run (a fingerprint) and compare, so that ranks calling different collectives, or the same one
// with different arguments, get BPL_ERR_MISMATCH naming the ranks and the differing fields instead of
// a hang, a timeout or a silently wrong result.
//
// The exchange is an allgather of a fixed number of int64 words on the communicator itself: its shape
// never depends on the arguments being checked, so it cannot mismatch even when they do.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "backplane/backplane.h"

namespace backplane {

// -1 marks a field the operation does not have (a barrier has no dtype, a broadcast no reduce op).
struct Fingerprint {
  int64_t sequence = 0;  // 1-based number of the collective on its communicator
  int64_t op = -1;       // bpl_collective
  int64_t dtype = -1;
  int64_t count = -1;
  int64_t root = -1;
  int64_t reduce_op = -1;  // (a split's color and key legitimately differ: they are not fingerprinted)

  bool operator==(const Fingerprint& other) const;
};

constexpr size_t kFingerprintWords = 8;
using FingerprintWords = std::array<int64_t, kFingerprintWords>;

FingerprintWords encode(const Fingerprint& fingerprint);
// Throws Error(INTERNAL) when `words` were not made by encode (a peer running another version).
Fingerprint decode(const FingerprintWords& words, int rank);

// "allreduce #5 (f32, count 16, sum)"
std::string describe(const Fingerprint& fingerprint);

// Compares every rank's fingerprint (all[r] is rank r's). "" when they agree; otherwise the report of
// BPL_ERR_MISMATCH: each distinct fingerprint with the ranks that sent it, the ranks that differ from
// the most common one, and "differ in: …" naming the fields. One line.
std::string compare(const std::vector<Fingerprint>& all);

}  // namespace backplane
