// Every rank of the communicator on this machine: each collective through the one shared-memory
// segment (ShmGroup), which also tells a mismatch itself.
#include <algorithm>
#include <cstring>

#include "collective_paths.h"
#include "dtypes.h"
#include "gloo_comm.h"

namespace backplane::gloo_plugin {

void ShmPath::allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op) {
  ShmGroup& shm = *comm_.shm_;
  const bpl_dtype acc = plugin::accumulation_dtype(dtype, op);
  if (acc == dtype) {  // straight from send to recv, no copy beforehand
    shm.allreduce(send, recv, count, acc, op, comm_.timeout());
    plugin::finish_reduction(recv, acc, recv, dtype, count, op, comm_.size());
    return;
  }
  // Widened, reduced and narrowed a slot's worth at a time, so that the accumulation copy stays in
  // cache and its size bounded (measured against widening the whole buffer first: bench/results).
  const size_t piece = ShmGroup::kSlotBytes / plugin::dtype_size(acc);
  const size_t element = plugin::dtype_size(dtype);
  char* work = comm_.scratch(0, std::min(count, piece) * plugin::dtype_size(acc));
  for (size_t first = 0; first < count; first += piece) {
    const size_t n = std::min(piece, count - first);
    plugin::convert(static_cast<const char*>(send) + first * element, dtype, work, acc, n);
    shm.allreduce(work, work, n, acc, op, comm_.timeout());
    plugin::finish_reduction(work, acc, static_cast<char*>(recv) + first * element, dtype, n, op, comm_.size());
  }
}

void ShmPath::reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root) {
  const bpl_dtype acc = plugin::accumulation_dtype(dtype, op);
  void* work = reduce_work(send, recv, count, dtype, acc, root);
  // An allreduce whose result only the root keeps.
  comm_.shm_->allreduce(work, work, count, acc, op, comm_.timeout());
  if (comm_.rank() == root) plugin::finish_reduction(work, acc, recv, dtype, count, op, comm_.size());
}

void ShmPath::broadcast(void* buf, size_t bytes, int root) { comm_.shm_->broadcast(buf, bytes, root, comm_.timeout()); }

void ShmPath::allgather(const void* send, void* recv, size_t block) {
  comm_.shm_->allgather(send, recv, block, comm_.timeout());
}

void ShmPath::reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op) {
  const bpl_dtype acc = plugin::accumulation_dtype(dtype, op);
  if (acc == dtype) {  // straight from send to recv: a copy of the whole send first doubled its time
    comm_.shm_->reduce_scatter(send, recv, recvcount, acc, op, comm_.timeout());
    plugin::finish_reduction(recv, acc, recv, dtype, recvcount, op, comm_.size());
    return;
  }
  const size_t block = recvcount * plugin::dtype_size(acc);
  char* work = static_cast<char*>(accumulation_copy(send, dtype, acc, recvcount * static_cast<size_t>(comm_.size())));
  char* own = work + block * static_cast<size_t>(comm_.rank());
  comm_.shm_->reduce_scatter(work, own, recvcount, acc, op, comm_.timeout());
  plugin::finish_reduction(own, acc, recv, dtype, recvcount, op, comm_.size());
}

void ShmPath::alltoall(const void* send, void* recv, size_t block) {
  comm_.shm_->alltoall(send, recv, block, comm_.timeout());
}

void ShmPath::barrier() { comm_.shm_->barrier(comm_.timeout()); }

}  // namespace backplane::gloo_plugin
