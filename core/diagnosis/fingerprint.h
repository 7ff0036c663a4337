// What a rank is about to run (a fingerprint), and the comparison of every rank's: ranks calling
// different collectives, or the same one with different arguments, get BPL_ERR_MISMATCH naming the
// ranks and the differing fields instead of a hang, a timeout or a silently wrong result.
//
// BPL_DEBUG=detail exchanges fingerprints before each collective, as an allgather of a fixed number of
// int64 words on the communicator itself: its shape never depends on the arguments being checked, so
// it cannot mismatch even when they do. The core hands each operation's fingerprint to the plugin
// (bpl_operation_identity), which tags its messages with the hash and explains a stall with the words
// (stall.h); this file, stall.cpp and names.cpp are built into the plugins too (bpl_diagnosis).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backplane/plugin.h"

namespace backplane {

// The core's own exchanges (plugin.h): ranks tell the barrier of bpl_finalize from a bpl_barrier (where
// one rank finalizes while the others call a collective, it is named as finalizing), and
// BPL_DEBUG=detail's check from the collective it checks.
constexpr int64_t kFinalizeOp = BPL_OPERATION_FINALIZE;
constexpr int64_t kFingerprintCheckOp = BPL_OPERATION_FINGERPRINT_CHECK;

// Whether every rank of the communicator takes part (a send or recv is two ranks' business).
inline bool is_collective(int64_t op) { return op != BPL_COLL_SEND && op != BPL_COLL_RECV && op != BPL_COLL_RECV_ANY; }

// -1 marks a field the operation does not have (a barrier has no dtype, a broadcast no reduce op).
struct Fingerprint {
  int64_t sequence = 0;  // 1-based number of the collective on its communicator (0: not shown)
  int64_t op = -1;       // bpl_collective, or kFinalizeOp
  int64_t dtype = -1;
  int64_t count = -1;
  int64_t root = -1;
  int64_t reduce_op = -1;  // (a split's color and key legitimately differ: they are not fingerprinted)
  // A variable-size collective's counts differ from rank to rank, so no field can carry them: each
  // rank carries its share of a sum over all ranks (pairing_share) that is 0 exactly when every rank's
  // count for a peer is that peer's count for it (up to a chance of 2^-64). 0 elsewhere.
  int64_t pairing = 0;
};

// This rank's share of the pairing sum: `sent_to(q)` and `received_from(q)` are its counts for each of
// the communicator's `ranks` ranks, itself included. A hash of (sender, receiver, count) for each
// send, minus one for each receive: the sends and receives of all ranks cancel when they pair up.
uint64_t pairing_term(int sender, int receiver, uint64_t count);
template <typename SentTo, typename ReceivedFrom>
int64_t pairing_share(int rank, int ranks, SentTo&& sent_to, ReceivedFrom&& received_from) {
  uint64_t share = 0;  // unsigned: the sum wraps
  for (int q = 0; q < ranks; ++q) {
    share += pairing_term(rank, q, static_cast<uint64_t>(sent_to(q)));
    share -= pairing_term(q, rank, static_cast<uint64_t>(received_from(q)));
  }
  return static_cast<int64_t>(share);
}

// The fingerprint of collective `op` with these fields (-1: the operation has no such field).
inline Fingerprint fingerprint_of(bpl_collective op, int64_t dtype = -1, int64_t count = -1, int64_t root = -1,
                                  int64_t reduce_op = -1) {
  Fingerprint f;
  f.op = op;
  f.dtype = dtype;
  f.count = count;
  f.root = root;
  f.reduce_op = reduce_op;
  return f;
}

constexpr size_t kFingerprintWords = 8;
using FingerprintWords = std::array<int64_t, kFingerprintWords>;

FingerprintWords encode(const Fingerprint& fingerprint);

// A hash of the call a fingerprint describes (every field but the rank's own pairing share): plugins
// build message tags from it, so that ranks calling different collectives post messages that never
// match (up to its collisions) and stall, where the fingerprints then say what each called.
uint64_t call_hash(const Fingerprint& fingerprint);
// The identity the core hands a plugin for the operation `fingerprint` describes (its hash set), and
// the fingerprint a plugin reads from it.
bpl_operation_identity identity_of(const Fingerprint& fingerprint);
Fingerprint fingerprint_of(const bpl_operation_identity& identity);
// A plugin's operation: the core's identity of it, or `otherwise` where no call of the core started it
// (an exchange of the plugin's own, such as a communicator's making).
inline Fingerprint fingerprint_of(const bpl_operation_identity* identity, const Fingerprint& otherwise) {
  return identity != nullptr ? fingerprint_of(*identity) : otherwise;
}
// Nothing when `words` were not made by encode (a peer running another version, or not checking).
std::optional<Fingerprint> decode(const FingerprintWords& words);
// The words as text ("w0 w1 … w7"), for a store's values, and back (nothing when not such words).
std::string encode_text(const Fingerprint& fingerprint);
std::optional<Fingerprint> decode_text(const std::string& text);

// "allreduce #5 (f32, count 16, sum)"
std::string describe(const Fingerprint& fingerprint);

// Compares every rank's fingerprint (all[r] is rank r's). "" when they agree; otherwise the report of
// BPL_ERR_MISMATCH: each distinct fingerprint with the ranks that sent it, the ranks that differ from
// the most common one, and "differ in: …" naming the fields, or that the counts do not pair up. One line.
std::string compare(const std::vector<Fingerprint>& all);
// The same for (rank, fingerprint) pairs of a communicator of `ranks` ranks, some of which may be
// missing; the pairing of counts is checked only when none is.
std::string compare(const std::vector<std::pair<int, Fingerprint>>& by_rank, int ranks);

// The ranks grouped by what they call, given as (rank, description) pairs (equal descriptions, same
// call): "ranks 0,2 call X; rank 1 calls Y; rank 1 differs from the others". "" when all agree.
std::string disagreement(const std::vector<std::pair<int, std::string>>& call_of_rank);

}  // namespace backplane
