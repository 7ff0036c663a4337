// The MPI plugin's collectives and point-to-point calls: each as the plugin's own schedule
// (schedules.h) or MPI's call, started as a request (mpi_comm.h).
#include "mpi_comm.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

#include "dtypes.h"
#include "mpi_internal.h"
#include "plugin_support.h"

namespace backplane::mpi_plugin {

void MpiComm::allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op,
                        bpl_plugin_request** req) {
  const bpl_dtype acc = plugin::accumulation_dtype(dtype, op);
  const int n = mpi_count(count);
  void* work = recv;
  const void* input = in_place_or(send, recv);
  const size_t element = plugin::dtype_size(acc), bytes = count * element;
  auto request = std::make_unique<Request>(this, "allreduce", bytes, nullptr);
  if (acc != dtype) {
    work = request->staging(0, bytes);
    plugin::convert(send, dtype, work, acc, count);
    input = MPI_IN_PLACE;
  }
  if (schedulable(bytes)) {
    // The plugin's own schedule (schedules.h) into `work`: the ring reads the input where it lies.
    const bool ring = ring_allreduce(count, bytes);
    const void* values = input == MPI_IN_PLACE ? work : send;
    if (!ring && values != work && bytes > 0) std::memcpy(work, send, bytes);
    char* scratch = request->staging(1, allreduce_scratch_bytes(count, element, size_, ring));
    allreduce_rounds(request->schedule(), static_cast<const char*>(ring ? values : work), static_cast<char*>(work), scratch,
                     count, element, rank_, size_, ring);
    request->run_schedule(plugin::reduce_function(acc, op));
  } else {
    // The post may run later (after an agreement): it holds what it needs by value.
    request->post_ = [input, work, n, acc, op, comm = comm_](MPI_Request* r) {
      return MPI_Iallreduce(input, work, n, mpi_type(acc), mpi_op(op), comm, r);
    };
  }
  if (op == BPL_OP_AVG || acc != dtype) {
    request->on_complete([=] { plugin::finish_reduction(work, acc, recv, dtype, count, op, size_); });
  }
  start(std::move(request), req);
}

void MpiComm::broadcast(void* buf, size_t count, bpl_dtype dtype, int root, bpl_plugin_request** req) {
  const size_t bytes = count * plugin::dtype_size(dtype);
  auto request = std::make_unique<Request>(this, "broadcast", bytes, nullptr);
  if (schedulable(bytes)) {
    broadcast_rounds(request->schedule(), static_cast<char*>(buf), bytes, root, rank_, size_);
    request->run_schedule();
  } else {
    const int n = mpi_count(count);
    request->post_ = [=, comm = comm_](MPI_Request* r) { return MPI_Ibcast(buf, n, mpi_type(dtype), root, comm, r); };
  }
  start(std::move(request), req);
}

void MpiComm::reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root,
                     bpl_plugin_request** req) {
  const bpl_dtype acc = plugin::accumulation_dtype(dtype, op);
  const bool is_root = rank_ == root;
  const size_t element = plugin::dtype_size(acc), bytes = count * element;
  auto request = std::make_unique<Request>(this, "reduce", bytes, nullptr);
  const void* input = send;
  void* output = is_root ? recv : nullptr;
  if (acc != dtype) {  // widened: reduced in the request's copy, the root's result narrowed from it
    char* staging = request->staging(0, bytes);
    plugin::convert(send, dtype, staging, acc, count);
    input = staging;
    if (is_root) output = staging;
  }
  if (schedulable(bytes)) {
    char* work = is_root ? nullptr : request->staging(1, bytes);  // a rank with children folds into it
    reduce_rounds(request->schedule(), static_cast<const char*>(input), static_cast<char*>(output), work,
                  request->staging(2, reduce_scratch_bytes(count, element)), count, element, root, rank_, size_);
    request->run_schedule(plugin::reduce_function(acc, op));
  } else {
    const int n = mpi_count(count);
    const void* mpi_input = is_root && input == output ? MPI_IN_PLACE : input;
    request->post_ = [mpi_input, output, n, acc, op, root, comm = comm_](MPI_Request* r) {
      return MPI_Ireduce(mpi_input, output, n, mpi_type(acc), mpi_op(op), root, comm, r);
    };
  }
  if (is_root && (op == BPL_OP_AVG || acc != dtype)) {
    request->on_complete([=] { plugin::finish_reduction(output, acc, recv, dtype, count, op, size_); });
  }
  start(std::move(request), req);
}

void MpiComm::allgather(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_plugin_request** req) {
  const size_t block = count * plugin::dtype_size(dtype);
  auto request = std::make_unique<Request>(this, "allgather", block * static_cast<size_t>(size_), nullptr);
  // In place, the caller's block already sits at recv + rank*count: MPI_IN_PLACE means exactly that.
  char* own = static_cast<char*>(recv) + block * static_cast<size_t>(rank_);
  const bool in_place = send == own;
  if (schedulable(block)) {
    if (!in_place && block > 0) std::memcpy(own, send, block);
    allgather_rounds(request->schedule(), static_cast<char*>(recv), static_cast<const char*>(send),
                     Blocks::equal(block), rank_, size_);
    request->run_schedule();
  } else {
    const int n = mpi_count(count);
    const void* input = in_place ? MPI_IN_PLACE : send;
    request->post_ = [=, comm = comm_](MPI_Request* r) {
      return MPI_Iallgather(input, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm, r);
    };
  }
  start(std::move(request), req);
}

void MpiComm::reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op,
                             bpl_plugin_request** req) {
  const bpl_dtype acc = plugin::accumulation_dtype(dtype, op);
  const size_t total = recvcount * static_cast<size_t>(size_), element = plugin::dtype_size(acc);
  auto request = std::make_unique<Request>(this, "reduce_scatter", total * element, nullptr);
  const void* input = send;
  void* output = recv;
  if (acc != dtype) {  // widened: reduced from the request's copy into its buffer, then narrowed
    char* staging = request->staging(0, total * element);
    plugin::convert(send, dtype, staging, acc, total);
    input = staging;
    output = request->staging(1, recvcount * element);
  }
  if (schedulable(recvcount * element)) {
    reduce_scatter_rounds(request->schedule(), static_cast<const char*>(input), static_cast<char*>(output),
                          request->staging(2, reduce_scatter_scratch_bytes(recvcount, element, size_)), recvcount, element,
                          rank_, size_);
    request->run_schedule(plugin::reduce_function(acc, op));
  } else {
    const int n = mpi_count(recvcount);
    mpi_count(total);
    // MPI's in-place form leaves the result at the start of the buffer, ours at the rank's block:
    // the result lands in the request's buffer first.
    if (output == static_cast<const char*>(input) + recvcount * element * static_cast<size_t>(rank_)) {
      output = request->staging(1, recvcount * element);
    }
    request->post_ = [input, output, n, acc, op, comm = comm_](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(input, output, n, mpi_type(acc), mpi_op(op), comm, r);
    };
  }
  if (output != recv || op == BPL_OP_AVG) {
    request->on_complete([=] { plugin::finish_reduction(output, acc, recv, dtype, recvcount, op, size_); });
  }
  start(std::move(request), req);
}

void MpiComm::alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_plugin_request** req) {
  const int n = mpi_count(count);
  mpi_count(count * static_cast<size_t>(size_));
  auto request =
      std::make_unique<Request>(this, "alltoall", count * static_cast<size_t>(size_) * plugin::dtype_size(dtype), nullptr);
  const size_t block = count * plugin::dtype_size(dtype), bytes = block * static_cast<size_t>(size_);
  const bool in_place = send == recv;
  if (schedulable(block)) {
    // In place, the blocks go out from the caller's buffer and arrive in the request's, copied over
    // the caller's once every send completed (the own block stays where it is).
    const Blocks blocks = Blocks::equal(block);
    char* arrivals = in_place ? request->staging(0, bytes) : static_cast<char*>(recv);
    const size_t own = block * static_cast<size_t>(rank_);
    if (!in_place && block > 0) std::memcpy(arrivals + own, static_cast<const char*>(send) + own, block);
    alltoall_rounds(request->schedule(), static_cast<const char*>(send), blocks, arrivals, blocks, rank_, size_);
    request->run_schedule();
    if (in_place && size_ > 1) {
      request->on_complete([=] {
        auto* out = static_cast<char*>(recv);
        if (own > 0) std::memcpy(out, arrivals, own);
        if (own + block < bytes) std::memcpy(out + own + block, arrivals + own + block, bytes - own - block);
      });
    }
  } else {
    const void* input = send;
    if (in_place) {  // MPI's non-blocking alltoall has no in-place form everywhere: copy the input
      char* copy = request->staging(0, bytes);
      std::memcpy(copy, send, bytes);
      input = copy;
    }
    request->post_ = [input, recv, n, dtype, comm = comm_](MPI_Request* r) {
      return MPI_Ialltoall(input, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm, r);
    };
  }
  start(std::move(request), req);
}

void MpiComm::gather(const void* send, void* recv, size_t count, bpl_dtype dtype, int root, bpl_plugin_request** req) {
  const int n = mpi_count(count);
  mpi_count(count * static_cast<size_t>(size_));
  const size_t block = count * plugin::dtype_size(dtype);
  // In place, the root's block already sits at recv + root*count: MPI_IN_PLACE means exactly that.
  const bool in_place = rank_ == root && send == static_cast<char*>(recv) + block * static_cast<size_t>(root);
  auto request = std::make_unique<Request>(this, "gather", block * static_cast<size_t>(size_), nullptr);
  if (schedulable(block)) {
    if (rank_ == root && !in_place && block > 0) std::memcpy(static_cast<char*>(recv) + block * static_cast<size_t>(root), send, block);
    gather_rounds(request->schedule(), static_cast<const char*>(send), static_cast<char*>(recv),
                  Blocks::equal(block), root, rank_, size_);
    request->run_schedule();
  } else {
    const void* input = in_place ? MPI_IN_PLACE : send;
    request->post_ = [=, comm = comm_](MPI_Request* r) {
      return MPI_Igather(input, n, mpi_type(dtype), recv, n, mpi_type(dtype), root, comm, r);
    };
  }
  start(std::move(request), req);
}

void MpiComm::scatter(const void* send, void* recv, size_t count, bpl_dtype dtype, int root, bpl_plugin_request** req) {
  const int n = mpi_count(count);
  mpi_count(count * static_cast<size_t>(size_));
  const size_t block = count * plugin::dtype_size(dtype);
  const bool in_place = rank_ == root && recv == static_cast<const char*>(send) + block * static_cast<size_t>(root);
  auto request = std::make_unique<Request>(this, "scatter", block * static_cast<size_t>(size_), nullptr);
  if (schedulable(block)) {
    if (rank_ == root && !in_place && block > 0) std::memcpy(recv, static_cast<const char*>(send) + block * static_cast<size_t>(root), block);
    scatter_rounds(request->schedule(), static_cast<const char*>(send), static_cast<char*>(recv),
                   Blocks::equal(block), root, rank_, size_);
    request->run_schedule();
  } else {
    void* output = in_place ? MPI_IN_PLACE : recv;
    request->post_ = [=, comm = comm_](MPI_Request* r) {
      return MPI_Iscatter(send, n, mpi_type(dtype), output, n, mpi_type(dtype), root, comm, r);
    };
  }
  start(std::move(request), req);
}

void MpiComm::allgatherv(const void* send, size_t sendcount, void* recv, plugin::CountsView recvcounts,
                         plugin::CountsView displs, bpl_dtype dtype, bpl_plugin_request** req) {
  const int n = mpi_count(sendcount);
  auto request = std::make_unique<Request>(this, "allgatherv", recvcounts.sum() * plugin::dtype_size(dtype), nullptr);
  const size_t element = plugin::dtype_size(dtype);
  if (schedulable(recvcounts.max() * element)) {
    char* own = static_cast<char*>(recv) + displs[static_cast<size_t>(rank_)] * element;
    if (own != send && sendcount > 0) std::memcpy(own, send, sendcount * element);
    const Blocks blocks(displs.copy(element), recvcounts.copy(element));
    allgather_rounds(request->schedule(), static_cast<char*>(recv), static_cast<const char*>(send), blocks, rank_, size_);
    request->run_schedule();
    return start(std::move(request), req);
  }
  // MPI's arrays must live as long as the operation: the request keeps them.
  std::vector<int>& layout = request->counts();
  if (!append_mpi_counts(layout, {recvcounts, displs})) throw beyond_mpi_counts("allgatherv");
  const int* counts = layout.data();
  const int* offsets = layout.data() + size_;
  const bool in_place = send == static_cast<char*>(recv) + displs[static_cast<size_t>(rank_)] * plugin::dtype_size(dtype);
  const void* input = in_place ? MPI_IN_PLACE : send;
  request->post_ = [=, comm = comm_](MPI_Request* r) {
    return MPI_Iallgatherv(input, n, mpi_type(dtype), recv, counts, offsets, mpi_type(dtype), comm, r);
  };
  start(std::move(request), req);
}

void MpiComm::alltoallv(const void* send, plugin::CountsView sendcounts, plugin::CountsView sdispls, void* recv,
                        plugin::CountsView recvcounts, plugin::CountsView rdispls, bpl_dtype dtype,
                        bpl_plugin_request** req) {
  const size_t element = plugin::dtype_size(dtype);
  // This rank's share of the bytes: it sizes the busy part of the waits.
  const size_t moved = (sendcounts.sum() + recvcounts.sum()) * element;
  auto request = std::make_unique<Request>(this, "alltoallv", moved, nullptr);
  if (schedulable(std::max(sendcounts.max(), recvcounts.max()) * element)) {
    const auto me = static_cast<size_t>(rank_);
    if (sendcounts[me] > 0) {
      std::memcpy(static_cast<char*>(recv) + rdispls[me] * element, static_cast<const char*>(send) + sdispls[me] * element,
                  sendcounts[me] * element);
    }
    const Blocks sent(sdispls.copy(element), sendcounts.copy(element));
    const Blocks received(rdispls.copy(element), recvcounts.copy(element));
    alltoall_rounds(request->schedule(), static_cast<const char*>(send), sent, static_cast<char*>(recv), received, rank_,
                    size_);
    request->run_schedule();
    return start(std::move(request), req);
  }
  std::vector<int>& layout = request->counts();
  if (!append_mpi_counts(layout, {sendcounts, sdispls, recvcounts, rdispls})) throw beyond_mpi_counts("alltoallv");
  const int* arrays = layout.data();
  const int ranks = size_;
  request->post_ = [=, comm = comm_](MPI_Request* r) {
    return MPI_Ialltoallv(send, arrays, arrays + ranks, mpi_type(dtype), recv, arrays + 2 * ranks, arrays + 3 * ranks,
                          mpi_type(dtype), comm, r);
  };
  start(std::move(request), req);
}

void MpiComm::barrier(bpl_plugin_request** req) {
  auto request = std::make_unique<Request>(this, "barrier", 0, nullptr);
  if (schedulable(0)) {
    barrier_rounds(request->schedule(), rank_, size_);
    request->run_schedule();
  } else {
    request->post_ = [comm = comm_](MPI_Request* r) { return MPI_Ibarrier(comm, r); };
  }
  start(std::move(request), req);
}

void MpiComm::check_tag(int tag) const {
  if (probes_all() && tag > process_.tag_upper_bound) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "tag = " + std::to_string(tag) + " exceeds this MPI's MPI_TAG_UB (" +
                                              std::to_string(process_.tag_upper_bound) + ")");
  }
  if (!probes_all() && tag >= large_message_tag()) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "tag = " + std::to_string(tag) + " exceeds the MPI backend's largest tag (" +
                                              std::to_string(large_message_tag() - 1) +
                                              ": one bit of MPI_TAG_UB tells large messages apart)");
  }
}

void MpiComm::send(const void* buf, size_t count, bpl_dtype dtype, int peer, int tag, bpl_plugin_request** req) {
  check_tag(tag);
  const int n = mpi_count(count);
  const size_t bytes = count * plugin::dtype_size(dtype);
  const int on_wire = wire_tag(tag, bytes);
  auto request = std::make_unique<Request>(this, "send", bytes, [=, comm = comm_](MPI_Request* r) {
    return MPI_Isend(buf, n, mpi_type(dtype), peer, on_wire, comm, r);
  });
  request->peer_ = peer;  // named if it times out
  request->tag_ = on_wire;
  start(std::move(request), req);
}

void MpiComm::recv(void* buf, size_t count, bpl_dtype dtype, int peer, int tag, bpl_plugin_request** req) {
  check_tag(tag);
  const int n = mpi_count(count);
  const size_t bytes = count * plugin::dtype_size(dtype);
  // Posted at once up to the eager size (wire_tag).
  if (!probes_all() && bytes <= eager_bytes()) {
    const int on_wire = wire_tag(tag, bytes);
    auto request = std::make_unique<Request>(this, "recv", bytes,
                                             [=, comm = comm_](MPI_Request* r) {
                                               return MPI_Irecv(buf, n, mpi_type(dtype), peer, on_wire, comm, r);
                                             });
    request->posted_recv_ = true;
    request->peer_ = peer;
    request->tag_ = on_wire;
    return start(std::move(request), req);
  }
  start(std::make_unique<Request>(this, buf, n, mpi_type(dtype), bytes, peer, wire_tag(tag, bytes)), req);
}

void MpiComm::recv_any(void* buf, size_t count, bpl_dtype dtype, int tag, int32_t* source, bpl_plugin_request** req) {
  check_tag(tag);
  const int n = mpi_count(count);
  const size_t bytes = count * plugin::dtype_size(dtype);
  const int on_wire = wire_tag(tag, bytes);
  std::unique_ptr<Request> request;
  if (!probes_all() && bytes <= eager_bytes()) {  // posted at once, as recv's
    request = std::make_unique<Request>(this, "recv", bytes, [=, comm = comm_](MPI_Request* r) {
      return MPI_Irecv(buf, n, mpi_type(dtype), MPI_ANY_SOURCE, on_wire, comm, r);
    });
    request->posted_recv_ = true;
    request->tag_ = on_wire;
  } else {
    request = std::make_unique<Request>(this, buf, n, mpi_type(dtype), bytes, MPI_ANY_SOURCE, on_wire);
  }
  request->peer_ = MPI_ANY_SOURCE;
  request->source_ = source;
  start(std::move(request), req);
}

}  // namespace backplane::mpi_plugin
