// Collectives the MPI plugin runs itself, as rounds of MPI's non-blocking point-to-point transfers.
//
// MPI's blocking collectives are the fastest path through Open MPI but cannot be bounded (they spin
// until every peer comes); its non-blocking ones (libnbc) can, but cost more per call and choose slower
// algorithms on few ranks. A schedule of the plugin's own over MPI_Isend/MPI_Irecv keeps every wait
// bounded and quiet and runs at the blocking call's speed or better
// (bench/results/design-choices.md#the-mpi-plugins-own-schedules). Each
// round's sends and receives are posted together; its local work (`then`, a reduction) runs once they
// all completed, and the next round is posted after it.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "dtypes.h"
#include "plugin_support.h"

namespace backplane::mpi_plugin {

struct Transfer {
  bool is_send;
  void* buffer;
  size_t bytes;
  int peer;
};

// A round's local work once its transfers completed: into[i] = with[i] op from[i] for `count` elements
// (none when count is 0), with the schedule's reduction; `with` is `into` unless given.
struct Fold {
  char* into = nullptr;
  const char* from = nullptr;
  size_t count = 0;
  const char* with = nullptr;

  const char* first_operand() const { return with != nullptr ? with : into; }
};

// A collective's rounds in order, each a run of transfers posted together and the local work that
// follows them. Flat, so that a schedule kept between operations and cleared allocates nothing.
class Schedule {
 public:
  void clear() {
    transfers_.clear();
    rounds_.clear();
  }
  void add(const Transfer& transfer) { transfers_.push_back(transfer); }
  // Closes the round made of the transfers added since the last one closed.
  void end_round(const Fold& then = {}) { rounds_.push_back({transfers_.size(), then}); }

  size_t rounds() const { return rounds_.size(); }
  const Transfer* begin(size_t round) const { return transfers_.data() + (round == 0 ? 0 : rounds_[round - 1].end); }
  const Transfer* end(size_t round) const { return transfers_.data() + rounds_[round].end; }
  const Fold& then(size_t round) const { return rounds_[round].then; }

 private:
  struct Round {
    size_t end;  // its transfers end here in transfers_
    Fold then;
  };
  std::vector<Transfer> transfers_;
  std::vector<Round> rounds_;
};

// Each function below appends a collective's rounds to `schedule`.

// A reduction receives what it folds through scratch in pieces of at most this many bytes, each
// folded once it arrived: the scratch stays small and in cache (a whole block of a large allreduce was
// fresh memory on every call). The functions below take it as their last argument (tests pass less).
constexpr size_t kFoldPieceBytes = size_t{4} << 20;

// Allreduce of `count` elements of `element` bytes into `data`, on `size` ranks: recursive doubling
// (whole buffers, log2(size) rounds, and one round before and after for the ranks beyond the largest
// power of two) when `ring` is false, else a ring (a reduce-scatter then an allgather of size blocks,
// 2(size-1) steps). This rank's values are in `input`, which may be `data`; the ring reads them there,
// recursive doubling needs them in `data` (the caller copies them). `scratch` holds what a round
// receives: the whole buffer for recursive doubling, a piece of the largest block for the ring
// (allreduce_scratch_bytes). Every rank computes the bit-identical result (the reductions pair the
// same operands on every rank).
void allreduce_rounds(Schedule& schedule, const char* input, char* data, char* scratch, size_t count, size_t element,
                      int rank, int size, bool ring, size_t piece_bytes = kFoldPieceBytes);
size_t allreduce_scratch_bytes(size_t count, size_t element, int size, bool ring, size_t piece_bytes = kFoldPieceBytes);

// Where each rank's block of a gathered buffer lies (allgather(v), alltoall(v), gather, scatter), in
// bytes, by rank: blocks of one size end to end (the collectives of one count, which then allocate
// no list per call), or listed (the v-collectives).
class Blocks {
 public:
  static Blocks equal(size_t bytes) {
    Blocks blocks;
    blocks.equal_bytes_ = bytes;
    return blocks;
  }
  Blocks(plugin::Counts offsets, plugin::Counts bytes)
      : listed_(true), offsets_(std::move(offsets)), bytes_(std::move(bytes)) {}

  size_t offset(int rank) const {
    return listed_ ? offsets_[static_cast<size_t>(rank)] : static_cast<size_t>(rank) * equal_bytes_;
  }
  size_t bytes(int rank) const { return listed_ ? bytes_[static_cast<size_t>(rank)] : equal_bytes_; }

 private:
  Blocks() = default;
  bool listed_ = false;
  size_t equal_bytes_ = 0;
  plugin::Counts offsets_, bytes_;
};

// Allgather(v) into `data`: a ring, size - 1 rounds, in round s each rank passing on the block it
// received last (its own first) to the next rank. This rank's block goes out from `own` (its send
// buffer; the caller copies it into `data`): lines the caller just wrote would have to come from this
// core's cache to the reader's (bench/results/design-choices.md#the-mpi-plugins-own-schedules).
void allgather_rounds(Schedule& schedule, char* data, const char* own, const Blocks& blocks, int rank, int size);
// Alltoall(v): one round of every send and receive (`send_blocks` of `send`, `recv_blocks` of
// `recv`); a rank's own block is the caller's to copy.
void alltoall_rounds(Schedule& schedule, const char* send, const Blocks& send_blocks, char* recv, const Blocks& recv_blocks,
                                   int rank, int size);
// Gather to `root` (the root's own block is the caller's to copy) and scatter from it: one round.
void gather_rounds(Schedule& schedule, const char* send, char* recv, const Blocks& blocks, int root, int rank, int size);
void scatter_rounds(Schedule& schedule, const char* send, char* recv, const Blocks& blocks, int root, int rank, int size);
// Reduce-scatter of `size` blocks of `block_count` elements in `send`: a ring of size - 1 rounds, in
// round s each rank passing on its partial sum of block rank - s - 1 (its own block of `send` first)
// and folding the previous rank's partial sum of the next block with its own; the last fold, of block
// `rank`, lands in `recv` (which may be that block of `send`). `scratch` holds
// reduce_scatter_scratch_bytes. The input is read where it lies: no copy of it.
void reduce_scatter_rounds(Schedule& schedule, const char* send, char* recv, char* scratch, size_t block_count,
                           size_t element, int rank, int size, size_t piece_bytes = kFoldPieceBytes);
// Reduce of `count` elements in `send` to `root`'s `result` (which may be `send`): a binomial tree,
// each rank folding what its children send into its partial sum (`work`, `count` elements, on ranks
// with children other than the root) and sending that to its parent. `scratch` holds
// reduce_scratch_bytes.
void reduce_rounds(Schedule& schedule, const char* send, char* result, char* work, char* scratch, size_t count,
                   size_t element, int root, int rank, int size, size_t piece_bytes = kFoldPieceBytes);
size_t reduce_scatter_scratch_bytes(size_t block_count, size_t element, int size, size_t piece_bytes = kFoldPieceBytes);
size_t reduce_scratch_bytes(size_t count, size_t element, size_t piece_bytes = kFoldPieceBytes);
// Broadcast of `bytes` in `data` from `root`: a binomial tree, this rank receiving from its parent in
// one round and sending to all its children in the next.
void broadcast_rounds(Schedule& schedule, char* data, size_t bytes, int root, int rank, int size);
// Barrier: dissemination, ceil(log2(size)) rounds of empty messages.
void barrier_rounds(Schedule& schedule, int rank, int size);

}  // namespace backplane::mpi_plugin
