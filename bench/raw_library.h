// A collective library called directly, without backplane: the baseline each backplane backend is
// measured against in the same run (raw Gloo for gloo, raw MPI for mpi). Every operation is a sum over
// all ranks, on host buffers, f32 or bf16; blocking, or (set_nonblocking) the library's non-blocking
// call waited for at once, where it has one.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "backplane/backplane.h"

namespace backplane::bench {

class RawLibrary {
 public:
  virtual ~RawLibrary() = default;
  // "gloo 0.0~git20220518" or MPI's library version line.
  virtual std::string description() const = 0;
  // Runs every later operation as its non-blocking form and a wait for it (MPI_Iallreduce and
  // MPI_Wait, ...). False where the library has none (Gloo's collectives only block).
  virtual bool set_nonblocking() { return false; }
  virtual void allreduce(void* buf, size_t count, bpl_dtype dtype) = 0;
  virtual void allgather(const void* send, void* recv, size_t count, bpl_dtype dtype) = 0;
  // recv = this rank's block (recvcount elements) of the sum of send over ranks. `send` may be used as
  // scratch.
  virtual void reduce_scatter(void* send, void* recv, size_t recvcount, bpl_dtype dtype) = 0;
  virtual void broadcast(void* buf, size_t count, bpl_dtype dtype, int root) = 0;
  // recv (at root only) = the sum of send over ranks.
  virtual void reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) = 0;
  virtual void alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype) = 0;
  // recv (size*count elements, at root only) = every rank's send; recv = block `rank` of send at root.
  virtual void gather(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) = 0;
  virtual void scatter(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) = 0;
  // The variable-size forms, here with `count` elements per rank laid end to end (as allgather and
  // alltoall): what the per-rank counts cost over the fixed forms.
  virtual void allgatherv(const void* send, void* recv, size_t count, bpl_dtype dtype) = 0;
  virtual void alltoallv(const void* send, void* recv, size_t count, bpl_dtype dtype) = 0;
  virtual void send(const void* buf, size_t bytes, int peer) = 0;
  virtual void recv(void* buf, size_t bytes, int peer) = 0;
  virtual void barrier() = 0;
};

// Gloo over the same TCP transport as the gloo plugin, meeting as PyTorch's Gloo does: through a store
// at master_addr:port, the launcher's (bpl-run's bpl-store) or, with `rank0_hosts`, one rank 0 hosts
// there (backplane's TCP store: only the meeting goes through it). Throws on failure.
std::unique_ptr<RawLibrary> open_raw_gloo(int rank, int world_size, const std::string& master_addr, int port,
                                          bool rank0_hosts, int64_t timeout_ms);

// MPI on a duplicate of MPI_COMM_WORLD, in the MPI the mpi plugin has initialised. nullptr when this
// build has no MPI.
std::unique_ptr<RawLibrary> open_raw_mpi();

// oneCCL, its communicator made over the job's MPI (initialised by the caller). Only in bpl-bench-peer-oneccl.
std::unique_ptr<RawLibrary> open_raw_oneccl();

}  // namespace backplane::bench
