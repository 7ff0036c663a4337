// Gloo's collectives over the communicator's TCP mesh (a world of one needs no mesh), a ring
// reduce-scatter of its own, and the helpers every path shares.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/reduce.h>

#include <cstring>

#include "collective_paths.h"
#include "dtypes.h"
#include "gloo_comm.h"
#include "gloo_comm_internal.h"

namespace backplane::gloo_plugin {

void* CollectivePath::accumulation_copy(const void* send, bpl_dtype dtype, bpl_dtype acc, size_t count, void* work) {
  if (work == nullptr) work = comm_.scratch(0, count * plugin::dtype_size(acc));
  if (acc != dtype) {
    plugin::convert(send, dtype, work, acc, count);
  } else if (work != send) {
    std::memcpy(work, send, count * plugin::dtype_size(dtype));
  }
  return work;
}

void* CollectivePath::reduce_work(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_dtype acc, int root) {
  const bool in_recv = acc == dtype && comm_.rank() == root;
  return accumulation_copy(send, dtype, acc, count, in_recv ? recv : nullptr);
}

const char* CollectivePath::name_of(bpl_collective, uint64_t) const { return "tcp"; }

std::function<void()> CollectivePath::post_transfer(void* buf, size_t bytes, int peer, int tag, bool is_send) {
  return comm_.post_pair_transfer(buf, bytes, peer, tag, is_send, GlooComm::kPointToPointSlotPrefix);
}

std::function<void()> CollectivePath::post_recv_from_any(void* buf, size_t bytes, int tag, int32_t* source) {
  return comm_.post_pair_recv_from_any(buf, bytes, tag, source);
}

std::unique_ptr<Request> CollectivePath::post_request(void* buf, size_t bytes, int peer, int tag, bool is_send,
                                                      int32_t* source) {
  std::function<void()> complete =
      source != nullptr ? post_recv_from_any(buf, bytes, tag, source) : post_transfer(buf, bytes, peer, tag, is_send);
  return std::make_unique<PointToPointRequest>(std::move(complete), comm_.timeout());
}

void TcpPath::allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op) {
  const bpl_dtype acc = plugin::accumulation_dtype(dtype, op);
  void* work = accumulation_copy(send, dtype, acc, count, acc == dtype ? recv : nullptr);
  allreduce_work(work, count, acc, op);
  plugin::finish_reduction(work, acc, recv, dtype, count, op, comm_.size());
}

void TcpPath::allreduce_work(void* work, size_t count, bpl_dtype acc, bpl_reduce_op op) {
  if (comm_.size() == 1) return;
  ::gloo::AllreduceOptions options(comm_.context_);
  with_element_type(acc, [&](auto zero) { options.setOutput(static_cast<decltype(zero)*>(work), count); });
  options.setReduceFunction(plugin::reduce_function(acc, op));
  options.setTag(comm_.tag());
  options.setTimeout(comm_.timeout());
  ::gloo::allreduce(options);
}

void TcpPath::reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root) {
  const bpl_dtype acc = plugin::accumulation_dtype(dtype, op);
  void* work = reduce_work(send, recv, count, dtype, acc, root);
  reduce_work_to_root(work, count, acc, op, root);
  if (comm_.rank() == root) plugin::finish_reduction(work, acc, recv, dtype, count, op, comm_.size());
}

void TcpPath::reduce_work_to_root(void* work, size_t count, bpl_dtype acc, bpl_reduce_op op, int root) {
  if (comm_.size() == 1) return;
  ::gloo::ReduceOptions options(comm_.context_);
  with_element_type(acc, [&](auto zero) { options.setOutput(static_cast<decltype(zero)*>(work), count); });
  options.setRoot(root);
  options.setReduceFunction(plugin::reduce_function(acc, op));
  options.setTag(comm_.tag());
  options.setTimeout(comm_.timeout());
  ::gloo::reduce(options);
}

void TcpPath::broadcast(void* buf, size_t bytes, int root) {
  if (comm_.size() == 1) return;
  ::gloo::BroadcastOptions options(comm_.context_);
  options.setOutput(static_cast<uint8_t*>(buf), bytes);
  options.setRoot(root);
  options.setTag(comm_.tag());
  options.setTimeout(comm_.timeout());
  ::gloo::broadcast(options);
}

void TcpPath::allgather(const void* send, void* recv, size_t block) {
  char* own_block = static_cast<char*>(recv) + block * static_cast<size_t>(comm_.rank());
  if (comm_.size() == 1) {
    if (send != own_block) std::memcpy(own_block, send, block);
    return;
  }
  ::gloo::AllgatherOptions options(comm_.context_);
  // In place (send already at recv's own block) Gloo reads the block from the output buffer.
  if (send != own_block) options.setInput(static_cast<uint8_t*>(const_cast<void*>(send)), block);
  options.setOutput(static_cast<uint8_t*>(recv), block * static_cast<size_t>(comm_.size()));
  options.setTag(comm_.tag());
  options.setTimeout(comm_.timeout());
  ::gloo::allgather(options);
}

// A ring: N-1 steps; in step s a rank passes the partial sum of block (rank-s-1) to its right
// neighbour and adds its own data to block (rank-s-2) from its left, so after the last step it holds
// the full reduction of its own block. Each rank sends (N-1)/N of the data once, as an allreduce's
// first half would.
void TcpPath::reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op) {
  const int n = comm_.size();
  const int me = comm_.rank();
  const bpl_dtype acc = plugin::accumulation_dtype(dtype, op);
  const size_t block = recvcount * plugin::dtype_size(acc);
  char* work = static_cast<char*>(accumulation_copy(send, dtype, acc, recvcount * static_cast<size_t>(n)));
  if (n > 1) {
    char* incoming = comm_.scratch(1, block);
    const plugin::ReduceFn reduce_fn = plugin::reduce_function(acc, op);
    const uint64_t slot = ::gloo::Slot::build(GlooComm::kReduceScatterSlotPrefix, comm_.tag());
    const int right = (me + 1) % n;
    const int left = (me + n - 1) % n;
    auto in = comm_.context_->createUnboundBuffer(incoming, block);
    for (int step = 0; step < n - 1; ++step) {
      const int send_block = (me - step - 1 + 2 * n) % n;
      const int recv_block = (me - step - 2 + 2 * n) % n;
      auto out = comm_.context_->createUnboundBuffer(work + block * static_cast<size_t>(send_block), block);
      in->recv(left, slot);
      out->send(right, slot);
      in->waitRecv(comm_.timeout());
      out->waitSend(comm_.timeout());
      char* target = work + block * static_cast<size_t>(recv_block);
      reduce_fn(target, target, incoming, recvcount);
    }
  }
  plugin::finish_reduction(work + block * static_cast<size_t>(me), acc, recv, dtype, recvcount, op, n);
}

void TcpPath::alltoall(const void* send, void* recv, size_t block) {
  const size_t total = block * static_cast<size_t>(comm_.size());
  const void* input = send;
  if (send == recv) {  // in place: Gloo needs distinct buffers
    input = comm_.scratch(0, total);
    std::memcpy(const_cast<void*>(input), send, total);
  }
  if (comm_.size() == 1) {
    if (input != recv) std::memcpy(recv, input, total);
    return;
  }
  ::gloo::AlltoallOptions options(comm_.context_);
  options.setInput(static_cast<uint8_t*>(const_cast<void*>(input)), total);
  options.setOutput(static_cast<uint8_t*>(recv), total);
  options.setTag(comm_.tag());
  options.setTimeout(comm_.timeout());
  ::gloo::alltoall(options);
}

void TcpPath::barrier() {
  if (comm_.size() == 1) return;
  ::gloo::BarrierOptions options(comm_.context_);
  options.setTag(comm_.tag());
  options.setTimeout(comm_.timeout());
  ::gloo::barrier(options);
}

// Gather, scatter, allgatherv and alltoallv move each block straight from the rank that has it to the
// rank that wants it: one transfer per pair of ranks over Gloo's pairs (the hierarchical path's ranks
// on one machine too). Their tags are negative, so that they never match the caller's sends and recvs
// (whose tags are >= 0), and carry the collective's number.
void TcpPath::exchange(const std::vector<Transfer>& transfers, const std::function<void()>& meanwhile) {
  const int tag = -1 - static_cast<int>(comm_.current_.sequence & 0x3fffffff);
  std::vector<std::function<void()>> receives, sends;
  for (const Transfer& t : transfers) {
    if (t.bytes == 0) continue;
    (t.is_send ? sends : receives)
        .push_back(comm_.post_pair_transfer(t.buffer, t.bytes, t.peer, tag, t.is_send, GlooComm::kCollectiveSlotPrefix));
  }
  if (meanwhile) meanwhile();
  for (auto& received : receives) received();
  for (auto& sent : sends) sent();
}

void TcpPath::gather(const void* send, void* recv, size_t block, int root) {
  if (comm_.rank() != root) return exchange({{const_cast<void*>(send), block, root, true}});
  auto* out = static_cast<char*>(recv);
  std::vector<Transfer> transfers;
  for (int q = 0; q < comm_.size(); ++q) {
    if (q != root) transfers.push_back({out + block * static_cast<size_t>(q), block, q, false});
  }
  char* own = out + block * static_cast<size_t>(root);
  exchange(transfers, [&] {
    if (own != send && block > 0) std::memcpy(own, send, block);
  });
}

void TcpPath::scatter(const void* send, void* recv, size_t block, int root) {
  if (comm_.rank() != root) return exchange({{recv, block, root, false}});
  const auto* in = static_cast<const char*>(send);
  std::vector<Transfer> transfers;
  for (int q = 0; q < comm_.size(); ++q) {
    if (q != root) transfers.push_back({const_cast<char*>(in + block * static_cast<size_t>(q)), block, q, true});
  }
  const char* own = in + block * static_cast<size_t>(root);
  exchange(transfers, [&] {
    if (own != recv && block > 0) std::memcpy(recv, own, block);
  });
}

void TcpPath::allgatherv(const void* send, size_t send_bytes, void* recv, const plugin::Counts& recv_bytes,
                         const plugin::Counts& recv_offsets, int64_t) {
  auto* out = static_cast<char*>(recv);
  std::vector<Transfer> transfers;
  for (int q = 0; q < comm_.size(); ++q) {
    if (q == comm_.rank()) continue;
    const auto i = static_cast<size_t>(q);
    transfers.push_back({const_cast<void*>(send), send_bytes, q, true});
    transfers.push_back({out + recv_offsets[i], recv_bytes[i], q, false});
  }
  char* own = out + recv_offsets[static_cast<size_t>(comm_.rank())];
  exchange(transfers, [&] {
    if (own != send && send_bytes > 0) std::memcpy(own, send, send_bytes);
  });
}

void TcpPath::alltoallv(const void* send, const plugin::Counts& send_bytes, const plugin::Counts& send_offsets,
                        void* recv, const plugin::Counts& recv_bytes, const plugin::Counts& recv_offsets, int64_t) {
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  std::vector<Transfer> transfers;
  for (int q = 0; q < comm_.size(); ++q) {
    if (q == comm_.rank()) continue;
    const auto i = static_cast<size_t>(q);
    transfers.push_back({const_cast<char*>(in + send_offsets[i]), send_bytes[i], q, true});
    transfers.push_back({out + recv_offsets[i], recv_bytes[i], q, false});
  }
  const auto me = static_cast<size_t>(comm_.rank());
  exchange(transfers, [&] {
    if (send_bytes[me] > 0) std::memcpy(out + recv_offsets[me], in + send_offsets[me], send_bytes[me]);
  });
}

}  // namespace backplane::gloo_plugin
