// Every rank of the communicator on this machine: each collective through the one shared-memory
// segment (ShmGroup), which also tells a mismatch itself; sends and receives through its mailboxes
// where single copy is on, else over Gloo's pairs.
#include <algorithm>
#include <cstring>
#include <optional>

#include "collective_paths.h"
#include "dtypes.h"
#include "gloo_comm.h"
#include "polled_request.h"

namespace backplane::gloo_plugin {

namespace {

// A send or recv through the mailboxes, as a request. Its bytes move only while the receiver reads the
// sender's buffer: a test reads them (a PolledRequest, as MPI's requests are asked), so does every wait
// of the process on shared memory (ShmGroup::drive_posted_receives), and a wait as long as the
// communicator's bound sleeps on the mailbox as a blocking call does. No thread of its own.
class MailboxRequest : public Request, private plugin::PolledRequest {
 public:
  MailboxRequest(ShmGroup& segment, std::chrono::milliseconds timeout, const ShmGroup::SendTicket& sent)
      : PolledRequest("send", timeout, sent.bytes), segment_(segment), op_timeout_(timeout), sent_(sent), peer_(sent.peer),
        tag_(sent.tag) {
    start_clock();
  }
  // `source`: where a recv from any rank (`peer` ShmGroup::kAnyRank) writes the rank that sent.
  MailboxRequest(ShmGroup& segment, std::chrono::milliseconds timeout, size_t bytes, int peer, int tag,
                 std::shared_ptr<ShmGroup::PendingRecv> recv, int32_t* source)
      : PolledRequest("recv", timeout, bytes), segment_(segment), op_timeout_(timeout), recv_(std::move(recv)),
        source_(source), peer_(peer), tag_(tag) {
    start_clock();
  }

  bpl_status test(int32_t* done) override { return PolledRequest::test(done); }
  bpl_status wait(std::chrono::milliseconds timeout) override {
    if (timeout < op_timeout_ || done()) return PolledRequest::wait(timeout);
    try {
      if (recv_) {
        const int source = segment_.wait_received(recv_, timeout);
        if (source_ != nullptr) *source_ = source;
      } else {
        segment_.wait_sent(*sent_, timeout);
      }
    } catch (const plugin::Error& e) {
      PolledRequest::finish(e.status(), e.what());
      throw;
    }
    PolledRequest::finish(BPL_OK, "");
    return BPL_OK;
  }
  // Never waited for: ended here, within the bound (its failure was a wait's to report).
  bpl_status finish() override {
    try {
      wait(op_timeout_);
    } catch (const plugin::Error&) {
    }
    return BPL_OK;
  }

 private:
  void poll() override {
    try {
      int source = -1;
      if (recv_ ? segment_.received(recv_, &source) : segment_.sent(*sent_)) {
        if (source_ != nullptr) *source_ = source;
        PolledRequest::finish(BPL_OK, "");
      }
    } catch (const plugin::Error& e) {
      PolledRequest::finish(e.status(), e.what());
    }
  }
  void expire() override {
    const std::string rank = peer_ == ShmGroup::kAnyRank ? "any rank" : "rank " + std::to_string(peer_);
    const std::string what = recv_ ? "recv from " + rank + " (tag " + std::to_string(tag_) + "): no matching send in time"
                                   : "send to " + rank + " (tag " + std::to_string(tag_) + ") was not received in time";
    expired(BPL_ERR_TIMEOUT, segment_.give_up(peer_, recv_, what));
  }
  std::chrono::milliseconds timeout() const override { return op_timeout_; }

  ShmGroup& segment_;
  std::chrono::milliseconds op_timeout_;
  std::optional<ShmGroup::SendTicket> sent_;
  std::shared_ptr<ShmGroup::PendingRecv> recv_;
  int32_t* source_ = nullptr;
  int peer_, tag_;
};

}  // namespace

const char* ShmPath::name_of(bpl_collective op, uint64_t bytes) const {
  if (ShmGroup::through_mailboxes(op) && !segment_->single_copy()) return CollectivePath::name_of(op, bytes);
  return segment_->path_of(op, bytes);
}

void ShmPath::allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op) {
  ShmGroup& shm = *segment_;
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
  segment_->allreduce(work, work, count, acc, op, comm_.timeout());
  if (comm_.rank() == root) plugin::finish_reduction(work, acc, recv, dtype, count, op, comm_.size());
}

void ShmPath::broadcast(void* buf, size_t bytes, int root) { segment_->broadcast(buf, bytes, root, comm_.timeout()); }

void ShmPath::allgather(const void* send, void* recv, size_t block) {
  segment_->allgather(send, recv, block, comm_.timeout());
}

void ShmPath::reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op) {
  const bpl_dtype acc = plugin::accumulation_dtype(dtype, op);
  if (acc == dtype) {  // straight from send to recv: a copy of the whole send first doubled its time
    segment_->reduce_scatter(send, recv, recvcount, acc, op, comm_.timeout());
    plugin::finish_reduction(recv, acc, recv, dtype, recvcount, op, comm_.size());
    return;
  }
  const size_t block = recvcount * plugin::dtype_size(acc);
  char* work = static_cast<char*>(accumulation_copy(send, dtype, acc, recvcount * static_cast<size_t>(comm_.size())));
  char* own = work + block * static_cast<size_t>(comm_.rank());
  segment_->reduce_scatter(work, own, recvcount, acc, op, comm_.timeout());
  plugin::finish_reduction(own, acc, recv, dtype, recvcount, op, comm_.size());
}

void ShmPath::alltoall(const void* send, void* recv, size_t block) {
  segment_->alltoall(send, recv, block, comm_.timeout());
}

void ShmPath::barrier() { segment_->barrier(comm_.timeout()); }

void ShmPath::gather(const void* send, void* recv, size_t block, int root) {
  segment_->gather(send, recv, block, root, comm_.timeout());
}

void ShmPath::scatter(const void* send, void* recv, size_t block, int root) {
  segment_->scatter(send, recv, block, root, comm_.timeout());
}

void ShmPath::allgatherv(const void* send, size_t send_bytes, void* recv, const plugin::Counts& recv_bytes,
                         const plugin::Counts& recv_offsets, int64_t pairing) {
  segment_->allgatherv(send, send_bytes, recv, recv_bytes, recv_offsets, pairing, comm_.timeout());
}

void ShmPath::alltoallv(const void* send, const plugin::Counts& send_bytes, const plugin::Counts& send_offsets,
                        void* recv, const plugin::Counts& recv_bytes, const plugin::Counts& recv_offsets,
                        int64_t pairing) {
  segment_->alltoallv(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets, pairing, comm_.timeout());
}

// Within the machine, the receiver reads the sender's buffer (ShmGroup's mailboxes).
std::function<void()> ShmPath::post_transfer(void* buf, size_t bytes, int peer, int tag, bool is_send) {
  if (!segment_->single_copy()) return CollectivePath::post_transfer(buf, bytes, peer, tag, is_send);
  const std::chrono::milliseconds timeout = comm_.timeout();
  if (is_send) {
    return [segment = segment_.get(), ticket = segment_->post_send(buf, bytes, peer, tag, timeout), timeout] {
      segment->wait_sent(ticket, timeout);
    };
  }
  return [segment = segment_.get(), recv = segment_->post_recv(buf, bytes, peer, tag), timeout] {
    segment->wait_received(recv, timeout);
  };
}

std::function<void()> ShmPath::post_recv_from_any(void* buf, size_t bytes, int tag, int32_t* source) {
  if (!segment_->single_copy()) return CollectivePath::post_recv_from_any(buf, bytes, tag, source);
  return [segment = segment_.get(), recv = segment_->post_recv(buf, bytes, ShmGroup::kAnyRank, tag), source,
          timeout = comm_.timeout()] { *source = segment->wait_received(recv, timeout); };
}

std::unique_ptr<Request> ShmPath::post_request(void* buf, size_t bytes, int peer, int tag, bool is_send,
                                               int32_t* source) {
  if (!segment_->single_copy()) return CollectivePath::post_request(buf, bytes, peer, tag, is_send, source);
  const std::chrono::milliseconds timeout = comm_.timeout();
  if (is_send) return std::make_unique<MailboxRequest>(*segment_, timeout, segment_->post_send(buf, bytes, peer, tag, timeout));
  if (source != nullptr) peer = ShmGroup::kAnyRank;
  return std::make_unique<MailboxRequest>(*segment_, timeout, bytes, peer, tag, segment_->post_recv(buf, bytes, peer, tag),
                                          source);
}

}  // namespace backplane::gloo_plugin
