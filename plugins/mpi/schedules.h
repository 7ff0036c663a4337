// Collectives the MPI plugin runs itself, as rounds of MPI's non-blocking point-to-point transfers.
//
// MPI's blocking collectives are the fastest path through Open MPI but cannot be bounded (they spin
// until every peer comes); its non-blocking ones (libnbc) can, but cost 0.3-0.9 µs more per call and
// choose slower algorithms on few ranks. A schedule of the plugin's own over MPI_Isend/MPI_Irecv keeps
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

}  // namespace backplane::mpi_plugin
