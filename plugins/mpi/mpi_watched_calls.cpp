// MPI's own blocking calls under BPL_MPI_WATCHDOG=1, watched by the process's watchdog (watchdog.h).
#include "mpi_comm.h"

#include <climits>
#include <utility>

#include "dtypes.h"
#include "mpi_internal.h"
#include "plugin_support.h"

namespace backplane::mpi_plugin {

template <typename Call>
bool MpiComm::watched(const Fingerprint& what, Call&& call) {
  require_usable();
  if (!watched_call_.enter(what)) return false;
  if (has_operations_in_flight()) process_.watchdog->wake();  // to step them while MPI's call runs
  int error = MPI_SUCCESS;
  {
    MpiLock lock(process_);
    error = call();
  }
  watched_call_.leave();
  if (error == MPI_SUCCESS) return true;
  const auto [status, message] = failure_of(describe(what).c_str(), error);
  poison(status, message);
  throw Error(status, message);
}

namespace {

bool fits_int(size_t count) { return count <= static_cast<size_t>(INT_MAX); }

}  // namespace

bool MpiComm::watched_allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op) {
  if (plugin::accumulation_dtype(dtype, op) != dtype || !fits_int(count)) return false;
  if (count * plugin::dtype_size(dtype) > kWatchedAllreduceMaxBytes) return false;
  if (!watched(fingerprint_of(BPL_COLL_ALLREDUCE, dtype, static_cast<int64_t>(count), -1, op), [&] {
        return MPI_Allreduce(in_place_or(send, recv), recv, static_cast<int>(count), mpi_type(dtype), mpi_op(op), comm_);
      })) {
    return false;
  }
  if (op == BPL_OP_AVG) plugin::finish_reduction(recv, dtype, recv, dtype, count, op, size_);
  return true;
}

bool MpiComm::watched_broadcast(void* buf, size_t count, bpl_dtype dtype, int root) {
  if (!fits_int(count)) return false;
  return watched(fingerprint_of(BPL_COLL_BROADCAST, dtype, static_cast<int64_t>(count), root),
                 [&] { return MPI_Bcast(buf, static_cast<int>(count), mpi_type(dtype), root, comm_); });
}

bool MpiComm::watched_reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root) {
  if (plugin::accumulation_dtype(dtype, op) != dtype || !fits_int(count)) return false;
  const bool is_root = rank_ == root;
  if (!watched(fingerprint_of(BPL_COLL_REDUCE, dtype, static_cast<int64_t>(count), root, op), [&] {
        return MPI_Reduce(is_root ? in_place_or(send, recv) : send, is_root ? recv : nullptr, static_cast<int>(count),
                          mpi_type(dtype), mpi_op(op), root, comm_);
      })) {
    return false;
  }
  if (is_root && op == BPL_OP_AVG) plugin::finish_reduction(recv, dtype, recv, dtype, count, op, size_);
  return true;
}

bool MpiComm::watched_allgather(const void* send, void* recv, size_t count, bpl_dtype dtype) {
  if (!fits_int(count * static_cast<size_t>(size_))) return false;
  const size_t block = count * plugin::dtype_size(dtype);
  const bool in_place = send == static_cast<char*>(recv) + block * static_cast<size_t>(rank_);
  const int n = static_cast<int>(count);
  return watched(fingerprint_of(BPL_COLL_ALLGATHER, dtype, static_cast<int64_t>(count)), [&] {
    return MPI_Allgather(in_place ? MPI_IN_PLACE : send, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_);
  });
}

bool MpiComm::watched_alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype) {
  if (!fits_int(count * static_cast<size_t>(size_))) return false;
  const int n = static_cast<int>(count);
  return watched(fingerprint_of(BPL_COLL_ALLTOALL, dtype, static_cast<int64_t>(count)), [&] {
    return MPI_Alltoall(send == recv ? MPI_IN_PLACE : send, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_);
  });
}

bool MpiComm::watched_gather(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) {
  if (!fits_int(count * static_cast<size_t>(size_))) return false;
  const size_t block = count * plugin::dtype_size(dtype);
  const bool in_place = rank_ == root && send == static_cast<char*>(recv) + block * static_cast<size_t>(root);
  const int n = static_cast<int>(count);
  return watched(fingerprint_of(BPL_COLL_GATHER, dtype, static_cast<int64_t>(count), root), [&] {
    return MPI_Gather(in_place ? MPI_IN_PLACE : send, n, mpi_type(dtype), recv, n, mpi_type(dtype), root, comm_);
  });
}

bool MpiComm::watched_scatter(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) {
  if (!fits_int(count * static_cast<size_t>(size_))) return false;
  const size_t block = count * plugin::dtype_size(dtype);
  const bool in_place = rank_ == root && recv == static_cast<const char*>(send) + block * static_cast<size_t>(root);
  const int n = static_cast<int>(count);
  return watched(fingerprint_of(BPL_COLL_SCATTER, dtype, static_cast<int64_t>(count), root), [&] {
    return MPI_Scatter(send, n, mpi_type(dtype), in_place ? MPI_IN_PLACE : recv, n, mpi_type(dtype), root, comm_);
  });
}

bool MpiComm::watched_allgatherv(const void* send, size_t sendcount, void* recv, plugin::CountsView recvcounts,
                                 plugin::CountsView displs, bpl_dtype dtype) {
  MpiCounts layout;
  if (!fits_int(sendcount) || !append_mpi_counts(layout, {recvcounts, displs})) return false;
  const Fingerprint f = allgatherv_fingerprint(dtype, sendcount, recvcounts, rank_, size_);
  const bool in_place = send == static_cast<char*>(recv) + displs[static_cast<size_t>(rank_)] * plugin::dtype_size(dtype);
  return watched(f, [&] {
    return MPI_Allgatherv(in_place ? MPI_IN_PLACE : send, static_cast<int>(sendcount), mpi_type(dtype), recv,
                          layout.data(), layout.data() + size_, mpi_type(dtype), comm_);
  });
}

bool MpiComm::watched_alltoallv(const void* send, plugin::CountsView sendcounts, plugin::CountsView sdispls, void* recv,
                                plugin::CountsView recvcounts, plugin::CountsView rdispls, bpl_dtype dtype) {
  MpiCounts layout;
  if (!append_mpi_counts(layout, {sendcounts, sdispls, recvcounts, rdispls})) return false;
  const int* arrays = layout.data();
  return watched(alltoallv_fingerprint(dtype, sendcounts, recvcounts, rank_, size_), [&] {
    return MPI_Alltoallv(send, arrays, arrays + size_, mpi_type(dtype), recv, arrays + 2 * size_, arrays + 3 * size_,
                         mpi_type(dtype), comm_);
  });
}

bool MpiComm::watched_barrier() {
  return watched(fingerprint_of(BPL_COLL_BARRIER), [&] { return MPI_Barrier(comm_); });
}

bool MpiComm::watched_send(const void* buf, size_t count, bpl_dtype dtype, int peer, int tag) {
  if (!fits_int(count)) return false;
  const int on_wire = wire_tag(tag, count * plugin::dtype_size(dtype));
  return watched(fingerprint_of(BPL_COLL_SEND),
                 [&] { return MPI_Send(buf, static_cast<int>(count), mpi_type(dtype), peer, on_wire, comm_); });
}

bool MpiComm::watched_recv(void* buf, size_t count, bpl_dtype dtype, int peer, int tag) {
  if (!fits_int(count)) return false;
  const size_t bytes = count * plugin::dtype_size(dtype);
  const int on_wire = wire_tag(tag, bytes);
  int arrived = 0;
  const auto mismatch = [&] {
    const std::string message = recv_mismatch_message(peer, tag, arrived, bytes);
    poison(BPL_ERR_MISMATCH, message);
    return Error(BPL_ERR_MISMATCH, message);
  };
  if (bytes <= eager_bytes() && !probes_all()) {  // only eagerly copied messages travel under its tag
    MPI_Status status;
    if (!watched(fingerprint_of(BPL_COLL_RECV), [&] {
          return MPI_Recv(buf, static_cast<int>(count), mpi_type(dtype), peer, on_wire, comm_, &status);
        })) {
      return false;
    }
    MPI_Get_count(&status, MPI_BYTE, &arrived);
    if (static_cast<size_t>(arrived) != bytes) throw mismatch();
    return true;
  }
  // Above the eager size (or where tags do not tell the classes apart) Open MPI may write a message
  // whole: its size is checked before it is received.
  MPI_Message message = MPI_MESSAGE_NULL;
  std::vector<char> drained;
  if (!watched(fingerprint_of(BPL_COLL_RECV), [&] {
        MPI_Status status;
        int error = MPI_Mprobe(peer, on_wire, comm_, &message, &status);
        if (error == MPI_SUCCESS) error = MPI_Get_count(&status, MPI_BYTE, &arrived);
        if (error != MPI_SUCCESS) return error;
        if (static_cast<size_t>(arrived) == bytes) {
          return MPI_Mrecv(buf, static_cast<int>(count), mpi_type(dtype), &message, MPI_STATUS_IGNORE);
        }
        drained.resize(static_cast<size_t>(arrived));  // received whole, so that the sender completes
        return MPI_Mrecv(drained.data(), arrived, MPI_BYTE, &message, MPI_STATUS_IGNORE);
      })) {
    return false;
  }
  if (static_cast<size_t>(arrived) != bytes) throw mismatch();
  return true;
}

}  // namespace backplane::mpi_plugin
