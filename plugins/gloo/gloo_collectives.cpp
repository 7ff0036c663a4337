// The gloo communicator's collectives, each numbered and fingerprinted, then run on the path chosen
// when the communicator was made (collective_paths.h), and its split.
#include "gloo_comm.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iomanip>
#include <numeric>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "dtypes.h"
#include "local_process.h"
#include "peer_reachability.h"
#include "plugin_support.h"
#include "rendezvous.h"
#include "shm_group.h"
#include "gloo_comm_internal.h"

namespace backplane::gloo_plugin {

// Each collective is numbered and fingerprinted (begin) on every path, so that ranks number their
// collectives alike, then runs on the path chosen when the communicator was made.
void GlooComm::run_allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op) {
  const auto running = begin(BPL_COLL_ALLREDUCE, dtype, count, -1, op);
  if (count > 0) path_->allreduce(send, recv, count, dtype, op);
}

void GlooComm::run_broadcast(void* buf, size_t count, bpl_dtype dtype, int root) {
  const auto running = begin(BPL_COLL_BROADCAST, dtype, count, root);
  if (count > 0) path_->broadcast(buf, count * plugin::dtype_size(dtype), root);
}

void GlooComm::run_reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root) {
  const auto running = begin(BPL_COLL_REDUCE, dtype, count, root, op);
  if (count > 0) path_->reduce(send, recv, count, dtype, op, root);
}

void GlooComm::run_allgather(const void* send, void* recv, size_t count, bpl_dtype dtype) {
  const auto running = begin(BPL_COLL_ALLGATHER, dtype, count);
  if (count > 0) path_->allgather(send, recv, count * plugin::dtype_size(dtype));
}

void GlooComm::run_reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op) {
  const auto running = begin(BPL_COLL_REDUCE_SCATTER, dtype, recvcount, -1, op);
  if (recvcount > 0) path_->reduce_scatter(send, recv, recvcount, dtype, op);
}

void GlooComm::run_alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype) {
  const auto running = begin(BPL_COLL_ALLTOALL, dtype, count);
  if (count > 0) path_->alltoall(send, recv, count * plugin::dtype_size(dtype));
}

void GlooComm::run_barrier(bpl_collective as) {
  const auto running = begin(as);
  path_->barrier();
}

// A failure on this machine's segment reaches the other machines as the leaders' mesh and the
// communicator's connections close (their leaders then fail their own segments); a failure between
// machines reaches this machine's ranks through its segment's failure record. Either way the
// communicator's first failure is recorded in the store, so every rank names the same cause.
void GlooComm::across_machines(const std::function<void()>& body) {
  try {
    body();
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    const auto* own = dynamic_cast<const Error*>(&e);
    // A failure another rank of this machine put in the machine's segment is that rank's to record in
    // the store: repeating it would only wait on a store that may be unreachable (a partition).
    const bool told_by_this_machine = own != nullptr && machine_shm_ && machine_shm_->failed_by_another_rank();
    if (told_by_this_machine) failed_ = true;
    Error error = told_by_this_machine ? *own : own != nullptr ? recorded_failure(own->status(), own->what()) : failure(e);
    if (machine_shm_) machine_shm_->fail(error.status(), error.what());
    shut_down_connections();
    throw error;
  }
}

std::unique_ptr<GlooComm> GlooComm::run_split(int color, int key) {
  // Every rank learns every (color, key), then each group connects its own mesh under a store prefix
  // that all its members derive alike: parent uid / split number / color.
  const int n = size();
  std::vector<int64_t> mine = {color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(n));
  run_allgather(mine.data(), all.data(), 2, BPL_DTYPE_I64);
  const uint32_t split_number = splits_++;
  if (color < 0) return nullptr;

  std::vector<int> members;
  for (int r = 0; r < n; ++r) {
    if (all[2 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
  return std::make_unique<GlooComm>(shared_, uid_ + "/" + std::to_string(split_number) + "/" + std::to_string(color),
                                    new_rank, static_cast<int>(members.size()), timeout());
}

// Posted now; `complete` waits for the transfer, here (uncopied: a small send is a hot path) or on a
// request's waiter. Over Gloo's pairs the slot carries the tag and 24 bits of a hash of the size: a
// send and a recv of different sizes never match (they stall, time out, and are told why) instead of
// the larger overflowing the smaller, which Gloo's transport answers with abort().
const char* GlooComm::path_of(bpl_collective op, uint64_t bytes) const {
  if (shm_) {
    // Point to point goes over Gloo's pairs where single copy is off (post_transfer).
    if (ShmGroup::through_mailboxes(op) && !shm_->single_copy()) return "tcp";
    return shm_->path_of(op, bytes);
  }
  const bool hierarchical = dynamic_cast<const HierarchicalPath*>(path_.get()) != nullptr;
  if (hierarchical && (op == BPL_COLL_ALLREDUCE || op == BPL_COLL_REDUCE || op == BPL_COLL_BARRIER)) return "hierarchical";
  return "tcp";  // Gloo's own algorithms and pairs
}

// Across machines, gather, scatter, allgatherv and alltoallv move each block straight from the rank
// that has it to the rank that wants it: one transfer per pair of ranks over Gloo's pairs (the
// hierarchical path's ranks on one machine too). Within one machine they run in the segment like
// allgather and alltoall (ShmGroup): the ranks' steps check that they call the same, and large blocks
// stream through the segment faster than process_vm_readv reads them. Their tags are negative, so that they never match the caller's
// sends and recvs (whose tags are >= 0), and carry the collective's number.
void GlooComm::exchange(const std::vector<Transfer>& transfers, const std::function<void()>& meanwhile) {
  const int tag = -1 - static_cast<int>(collectives_ & 0x3fffffff);
  std::vector<std::function<void()>> receives, sends;
  for (const Transfer& t : transfers) {
    if (t.bytes == 0) continue;
    (t.is_send ? sends : receives).push_back(post_transfer(t.buffer, t.bytes, t.peer, tag, t.is_send, kCollectiveSlotPrefix));
  }
  if (meanwhile) meanwhile();
  for (auto& received : receives) received();  // first: a send within the machine ends once its peer read it
  for (auto& sent : sends) sent();
}

void GlooComm::run_gather(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) {
  const auto running = begin(BPL_COLL_GATHER, dtype, count, root);
  const size_t block = count * plugin::dtype_size(dtype);
  if (shm_) return shm_->gather(send, recv, block, root, timeout());
  if (rank() != root) return exchange({{const_cast<void*>(send), block, root, true}});
  auto* out = static_cast<char*>(recv);
  std::vector<Transfer> transfers;
  for (int q = 0; q < size(); ++q) {
    if (q != root) transfers.push_back({out + block * static_cast<size_t>(q), block, q, false});
  }
  char* own = out + block * static_cast<size_t>(root);
  exchange(transfers, [&] {
    if (own != send && block > 0) std::memcpy(own, send, block);
  });
}

void GlooComm::run_scatter(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) {
  const auto running = begin(BPL_COLL_SCATTER, dtype, count, root);
  const size_t block = count * plugin::dtype_size(dtype);
  if (shm_) return shm_->scatter(send, recv, block, root, timeout());
  if (rank() != root) return exchange({{recv, block, root, false}});
  const auto* in = static_cast<const char*>(send);
  std::vector<Transfer> transfers;
  for (int q = 0; q < size(); ++q) {
    if (q != root) transfers.push_back({const_cast<char*>(in + block * static_cast<size_t>(q)), block, q, true});
  }
  const char* own = in + block * static_cast<size_t>(root);
  exchange(transfers, [&] {
    if (own != recv && block > 0) std::memcpy(recv, own, block);
  });
}

void GlooComm::run_allgatherv(const void* send, size_t sendcount, void* recv, const plugin::Counts& recvcounts,
                              const plugin::Counts& displs, bpl_dtype dtype) {
  size_t total = 0;
  for (size_t c : recvcounts) total += c;
  const auto sent = [&](int) { return sendcount; };
  const auto received = [&](int q) { return recvcounts[static_cast<size_t>(q)]; };
  const int64_t pairing = pairing_share(rank(), size(), sent, received);
  const auto running = begin(BPL_COLL_ALLGATHERV, dtype, static_cast<int64_t>(total), -1, -1, pairing);
  const size_t element = plugin::dtype_size(dtype);
  if (shm_) {
    return shm_->allgatherv(send, sendcount * element, recv, plugin::in_bytes(recvcounts, element),
                            plugin::in_bytes(displs, element), pairing, timeout());
  }
  auto* out = static_cast<char*>(recv);
  std::vector<Transfer> transfers;
  for (int q = 0; q < size(); ++q) {
    if (q == rank()) continue;
    transfers.push_back({const_cast<void*>(send), sendcount * element, q, true});
    transfers.push_back({out + displs[static_cast<size_t>(q)] * element, recvcounts[static_cast<size_t>(q)] * element, q, false});
  }
  char* own = out + displs[static_cast<size_t>(rank())] * element;
  exchange(transfers, [&] {
    if (own != send && sendcount > 0) std::memcpy(own, send, sendcount * element);
  });
}

void GlooComm::run_alltoallv(const void* send, const plugin::Counts& sendcounts, const plugin::Counts& sdispls, void* recv,
                             const plugin::Counts& recvcounts, const plugin::Counts& rdispls, bpl_dtype dtype) {
  const auto sent = [&](int q) { return sendcounts[static_cast<size_t>(q)]; };
  const auto received = [&](int q) { return recvcounts[static_cast<size_t>(q)]; };
  const int64_t pairing = pairing_share(rank(), size(), sent, received);
  const auto running = begin(BPL_COLL_ALLTOALLV, dtype, -1, -1, -1, pairing);
  const size_t element = plugin::dtype_size(dtype);
  if (shm_) {
    return shm_->alltoallv(send, plugin::in_bytes(sendcounts, element), plugin::in_bytes(sdispls, element), recv,
                           plugin::in_bytes(recvcounts, element), plugin::in_bytes(rdispls, element), pairing, timeout());
  }
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  std::vector<Transfer> transfers;
  for (int q = 0; q < size(); ++q) {
    if (q == rank()) continue;
    const auto i = static_cast<size_t>(q);
    transfers.push_back({const_cast<char*>(in + sdispls[i] * element), sendcounts[i] * element, q, true});
    transfers.push_back({out + rdispls[i] * element, recvcounts[i] * element, q, false});
  }
  const auto me = static_cast<size_t>(rank());
  exchange(transfers, [&] {
    if (sendcounts[me] > 0) std::memcpy(out + rdispls[me] * element, in + sdispls[me] * element, sendcounts[me] * element);
  });
}

}  // namespace backplane::gloo_plugin
