// The MPI plugin's own helpers, shared by its files (mpi_comm.cpp, the communicator; mpi_requests.cpp,
// its requests; mpi_collectives.cpp, the collectives as schedules or MPI's calls): MPI's types and ops for the ABI's, the lock that
// serializes MPI where it is not thread-safe, the fingerprints of the variable-size collectives, what
// an MPI error is to backplane, and the process's receives that wait for a match.
#pragma once

#include <algorithm>
#include <atomic>
#include <climits>
#include <deque>
#include <initializer_list>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "mpi_comm.h"
#include "plugin_support.h"

namespace backplane::mpi_plugin {

using plugin::Error;

// Holds the process-wide MPI lock when MPI was not granted MPI_THREAD_MULTIPLE.
class MpiLock {
 public:
  explicit MpiLock(const MpiProcess& process) : mutex_(process.serialize) {
    if (mutex_ != nullptr) mutex_->lock();
  }
  ~MpiLock() {
    if (mutex_ != nullptr) mutex_->unlock();
  }

 private:
  std::mutex* mutex_;
};

using plugin::Backoff;

inline MPI_Datatype mpi_type(bpl_dtype dtype) {
  switch (dtype) {
    case BPL_DTYPE_F32: return MPI_FLOAT;
    case BPL_DTYPE_F64: return MPI_DOUBLE;
    case BPL_DTYPE_F16:
    case BPL_DTYPE_BF16: return MPI_UINT16_T;  // moved as 2-byte words; reduced in f32 (dtypes.h)
    case BPL_DTYPE_I8: return MPI_INT8_T;
    case BPL_DTYPE_U8: return MPI_UINT8_T;
    case BPL_DTYPE_I32: return MPI_INT32_T;
    default: return MPI_INT64_T;
  }
}

inline MPI_Op mpi_op(bpl_reduce_op op) {
  switch (op) {
    case BPL_OP_PROD: return MPI_PROD;
    case BPL_OP_MIN: return MPI_MIN;
    case BPL_OP_MAX: return MPI_MAX;
    case BPL_OP_BAND: return MPI_BAND;
    case BPL_OP_BOR: return MPI_BOR;
    case BPL_OP_BXOR: return MPI_BXOR;
    default: return MPI_SUM;  // SUM, and AVG's sum before the division
  }
}

// MPI-3 counts are int.
inline int mpi_count(size_t count) {
  if (count > static_cast<size_t>(INT_MAX)) {
    throw Error(BPL_ERR_UNSUPPORTED, "count " + std::to_string(count) + " exceeds MPI's int counts (at most " +
                                         std::to_string(INT_MAX) + " elements per call)");
  }
  return static_cast<int>(count);
}

inline const void* in_place_or(const void* send, const void* recv) { return send == recv ? MPI_IN_PLACE : send; }

// Whether every rank of the communicator takes part (a point-to-point wait is two ranks' business: its
// timeout is not explained as a collective's stall, nor agreed on).
inline bool is_collective(const Fingerprint& f) { return backplane::is_collective(f.op); }

// MPI's int counts and displacements of a variable-size collective, one array after another (inline
// up to 8 ranks, as plugin::Counts).
using MpiCounts = boost::container::small_vector<int, 32>;

// Appends `arrays` to `out`, each value as MPI's int count; false (out partly filled) where one is
// beyond an int.
template <typename Out>
inline bool append_mpi_counts(Out& out, std::initializer_list<plugin::CountsView> arrays) {
  for (const plugin::CountsView& values : arrays) {
    for (size_t r = 0; r < values.size(); ++r) {
      if (values[r] > static_cast<size_t>(INT_MAX)) return false;
      out.push_back(static_cast<int>(values[r]));
    }
  }
  return true;
}

// UNSUPPORTED for a variable-size collective `op` whose counts or displacements MPI cannot take.
inline Error beyond_mpi_counts(const char* op) {
  return Error(BPL_ERR_UNSUPPORTED, std::string(op) + ": a count or displacement exceeds MPI's int counts (at most " +
                                        std::to_string(INT_MAX) + " elements)");
}

// MISMATCH's message for a recv of `bytes` from `peer` under the caller's `tag`, whose sender sent `arrived`.
inline std::string recv_mismatch_message(int peer, int tag, int arrived, size_t bytes) {
  return "rank " + std::to_string(peer) + " sent " + std::to_string(arrived) + " bytes with tag " + std::to_string(tag) +
         "; this recv expects " + std::to_string(bytes) + " bytes: the ranks disagree on the size";
}

// What an MPI error of operation `op` is to backplane.
inline std::pair<bpl_status, std::string> failure_of(const char* op, int mpi_error) {
  if (mpi_error == MPI_ERR_TRUNCATE) {
    return {BPL_ERR_MISMATCH, std::string(op) + " received more than this rank's buffer holds (MPI_ERR_TRUNCATE): the "
                                                "ranks disagree on the size"};
  }
  return {BPL_ERR_REMOTE, std::string(op) + " failed: " + mpi_error_string(mpi_error)};
}

// The fingerprints of a completed exchange, compared: "" when all agree.
inline std::string compared(const std::vector<FingerprintWords>& all) {
  std::vector<std::pair<int, Fingerprint>> by_rank;
  for (size_t r = 0; r < all.size(); ++r) {
    if (std::optional<Fingerprint> theirs = decode(all[r])) by_rank.emplace_back(static_cast<int>(r), *theirs);
  }
  return compare(by_rank, static_cast<int>(all.size()));
}

// Every recv of the process not matched yet, in the order they were posted. Any wait of the plugin
// matches them, as MPI matches a posted receive while it progresses anything: a sender of a large
// message waits for its receiver's match, and that receiver may be waiting for something else.
class PendingReceives {
 public:
  void add(Request* request) {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back(request);
    count_.store(pending_.size(), std::memory_order_release);
  }
  void forget(Request* request) {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.erase(std::remove(pending_.begin(), pending_.end(), request), pending_.end());
    count_.store(pending_.size(), std::memory_order_release);
  }
  // Calls match(request, blocked) for each, in order, as MPI orders receives: the first posted of those
  // a message could match takes it. So once a recv did not match, a later one of the same communicator
  // and tag is skipped where it could take what the earlier one waits for (one from the same rank, or
  // any recv behind a recv from any rank), and a later recv from any rank may take a message only from
  // a rank no earlier recv waits on (`blocked`, the ranks to leave alone). Drops those that matched.
  // Under the lock: a matched request's new state is seen by the next thread to take it.
  template <typename Match>
  void match_all(Match&& match) {
    if (count_.load(std::memory_order_acquire) == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    unmatched_.clear();
    for (auto it = pending_.begin(); it != pending_.end();) {
      const auto [comm, peer, tag] = (*it)->match_key();
      const auto waiting = [&, comm = comm, tag = tag](int rank) {
        return std::find(unmatched_.begin(), unmatched_.end(), std::make_tuple(comm, rank, tag)) != unmatched_.end();
      };
      bool skipped = waiting(MPI_ANY_SOURCE) || (peer != MPI_ANY_SOURCE && waiting(peer));
      if (!skipped) {
        blocked_.clear();
        if (peer == MPI_ANY_SOURCE) {
          for (const auto& [c, rank, t] : unmatched_) {
            if (c == comm && t == tag) blocked_.push_back(rank);
          }
        }
        skipped = !match(**it, blocked_);
        if (skipped) unmatched_.emplace_back(comm, peer, tag);
      }
      it = skipped ? std::next(it) : pending_.erase(it);
    }
    count_.store(pending_.size(), std::memory_order_release);
  }

 private:
  std::mutex mutex_;
  std::deque<Request*> pending_;
  // match_all's receives that did not match and the ranks a recv from any rank leaves alone, kept
  // between calls so that a test allocates nothing; few, so searched in a line.
  std::vector<std::tuple<MpiComm*, int, int>> unmatched_;
  std::vector<int> blocked_;
  std::atomic<size_t> count_{0};
};

inline PendingReceives& pending_receives() {
  static PendingReceives* receives = new PendingReceives;  // outlives every request, at exit too
  return *receives;
}

}  // namespace backplane::mpi_plugin
