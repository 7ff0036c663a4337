// Collectives the MPI plugin runs itself, as rounds of MPI's non-blocking point-to-point transfers.
//
// MPI's blocking collectives are the fastest path through Open MPI but cannot be bounded (they spin
// until every peer comes); its non-blocking ones (libnbc) can, but cost 0.3-0.9 µs more per call and
// choose slower algorithms on few ranks (allgather 2-5x raw from 16 KiB to 4 MiB on 2 ranks). A schedule of the plugin's own over MPI_Isend/MPI_Irecv keeps
// every wait bounded and quiet and runs at the blocking call's speed or better
// (bench/results/2026-11-25-mpi-paths). Each round's sends and receives are posted together; its local
// work (`then`, a reduction) runs once they all completed, and the next round is posted after it.
#pragma once

#include <cstddef>
#include <vector>

#include "dtypes.h"

namespace backplane::mpi_plugin {

struct Transfer {
  bool is_send;
  void* buffer;
  size_t bytes;
  int peer;
};

// A round's local work once its transfers completed: into[i] = into[i] op from[i] for `count` elements
// (none when count is 0), with the schedule's reduction.
struct Fold {
  char* into = nullptr;
  const char* from = nullptr;
  size_t count = 0;
};

struct Round {
  std::vector<Transfer> transfers;
  Fold then;
};

// Allreduce of `count` elements of `element` bytes in `data` (in place), on `size` ranks:
// recursive doubling (whole buffers, log2(size) rounds, and one round before and after for the ranks
// beyond the largest power of two) when `ring` is false, else a ring (a reduce-scatter then an
// allgather of size blocks, 2(size-1) rounds). `scratch` holds what a round receives: the whole
// buffer for recursive doubling, the largest block for the ring (allreduce_scratch_bytes). Every rank
// computes the bit-identical result (the reductions pair the same operands on every rank).
std::vector<Round> allreduce_rounds(char* data, char* scratch, size_t count, size_t element, int rank, int size,
                                    bool ring);
size_t allreduce_scratch_bytes(size_t count, size_t element, int size, bool ring);

// Where each rank's block of a gathered buffer lies (allgather, allgatherv, gather, scatter), in
// bytes, by rank.
struct Blocks {
  std::vector<size_t> offsets;
  std::vector<size_t> bytes;
};

// Allgather(v) into `data`: a ring, size - 1 rounds, in round s each rank passing on the block it
// received last (its own first) to the next rank. This rank's block goes out from `own` (its send
// buffer; the caller copies it into `data`): lines the caller just wrote would have to come from this
// core's cache to the reader's, several times slower on a VM than a buffer the peer read before
// (bench/results/2026-11-25-raw-speed).
std::vector<Round> allgather_rounds(char* data, const char* own, const Blocks& blocks, int rank, int size);
// Alltoall(v): one round of every send and receive (`send_blocks` of `send`, `recv_blocks` of
// `recv`); a rank's own block is the caller's to copy.
std::vector<Round> alltoall_rounds(const char* send, const Blocks& send_blocks, char* recv, const Blocks& recv_blocks,
                                   int rank, int size);
// Gather to `root` (the root's own block is the caller's to copy) and scatter from it: one round.
std::vector<Round> gather_rounds(const char* send, char* recv, const Blocks& blocks, int root, int rank, int size);
std::vector<Round> scatter_rounds(const char* send, char* recv, const Blocks& blocks, int root, int rank, int size);
// Broadcast of `bytes` in `data` from `root`: a binomial tree, this rank receiving from its parent in
// one round and sending to all its children in the next.
std::vector<Round> broadcast_rounds(char* data, size_t bytes, int root, int rank, int size);
// Barrier: dissemination, ceil(log2(size)) rounds of empty messages.
std::vector<Round> barrier_rounds(int rank, int size);

}  // namespace backplane::mpi_plugin
