#include "gloo_comm.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <tuple>

#include "dtypes.h"
#include "plugin_support.h"
#include "rendezvous.h"

namespace backplane::gloo_plugin {

using plugin::Error;

// Slot prefixes for the transfers this plugin makes itself; Gloo's own algorithms use 0x01..0x08.
constexpr uint8_t kReduceScatterSlotPrefix = 0x40;
constexpr uint8_t kPointToPointSlotPrefix = 0x41;

bpl_status classify_exception(const std::exception& e) {
  if (auto* error = dynamic_cast<const Error*>(&e)) return error->status();
  const bool timed_out = std::strstr(e.what(), "Timed out") != nullptr || is_store_timeout(e);
  if (timed_out) return BPL_ERR_TIMEOUT;
  if (dynamic_cast<const ::gloo::IoException*>(&e) != nullptr) return BPL_ERR_REMOTE;
  return BPL_ERR_INTERNAL;
}

namespace {

std::pair<bpl_status, std::string> classify(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::bad_alloc&) {
    return {BPL_ERR_OUT_OF_MEMORY, "out of memory"};
  } catch (const std::exception& e) {
    return {classify_exception(e), e.what()};
  } catch (...) {
    return {BPL_ERR_INTERNAL, "unknown exception"};
  }
}

// A collective posted to the communicator's queue.
class QueuedRequest : public Request {
 public:
  explicit QueuedRequest(std::shared_ptr<plugin::Operation> op) : op_(std::move(op)) {}
  bpl_status test(int32_t* done) override {
    *done = op_->ended() ? 1 : 0;
    return *done ? result() : BPL_OK;
  }
  bpl_status wait(std::chrono::milliseconds timeout) override {
    if (!op_->wait_for(timeout)) {
      plugin::host()->set_error(("gloo: the operation has not ended after " + std::to_string(timeout.count()) +
                                 " ms; it is still in flight")
                                    .c_str());
      return BPL_ERR_TIMEOUT;
    }
    return result();
  }
  bpl_status finish() override {
    if (op_->wait_for_deadline()) return BPL_OK;
    plugin::host()->set_error("gloo: the operation did not end within its timeout; its buffers may still be in use");
    return BPL_ERR_TIMEOUT;
  }

 private:
  bpl_status result() {
    if (op_->status() != BPL_OK) plugin::host()->set_error(("gloo: " + op_->message()).c_str());
    return op_->status();
  }
  std::shared_ptr<plugin::Operation> op_;
};

// An asynchronous send or recv: posted to Gloo at once; a thread waits for its completion with the
// communicator's timeout, because Gloo's own wait with a shorter timeout would close the whole context.
class PointToPointRequest : public Request {
 public:
  PointToPointRequest(std::unique_ptr<::gloo::transport::UnboundBuffer> buffer, bool is_send,
                      std::chrono::milliseconds timeout)
      : buffer_(std::move(buffer)), op_(std::make_shared<plugin::Operation>([this, is_send, timeout] {
          bool completed = is_send ? buffer_->waitSend(timeout) : buffer_->waitRecv(timeout);
          if (!completed) throw Error(BPL_ERR_INTERNAL, "transfer aborted");
        })) {
    waiter_ = std::thread([op = op_] { op->run(classify); });
  }
  ~PointToPointRequest() override {
    if (waiter_.joinable()) waiter_.join();
  }
  bpl_status test(int32_t* done) override { return QueuedRequest(op_).test(done); }
  bpl_status wait(std::chrono::milliseconds timeout) override { return QueuedRequest(op_).wait(timeout); }
  bpl_status finish() override {
    waiter_.join();  // the waiter ends within the communicator's timeout
    return BPL_OK;
  }

 private:
  std::unique_ptr<::gloo::transport::UnboundBuffer> buffer_;
  std::shared_ptr<plugin::Operation> op_;
  std::thread waiter_;
};

// Calls fn(T{}) with T a type of `dtype`'s size, for Gloo options that only need the element size.
template <typename Fn>
void with_element_type(bpl_dtype dtype, Fn&& fn) {
  plugin::detail::visit(dtype, std::forward<Fn>(fn));
}

}  // namespace

GlooComm::GlooComm(std::shared_ptr<Shared> shared, std::string uid, int rank, int size)
    : shared_(std::move(shared)),
      uid_(std::move(uid)),
      queue_(classify, shared_->timeout),
      scratch_(2) {
  auto context = std::make_shared<::gloo::rendezvous::Context>(rank, size);
  context->setTimeout(shared_->timeout);
  ::gloo::rendezvous::PrefixStore store(uid_, *shared_->store);
  context->connectFullMesh(store, shared_->device);
  context_ = std::move(context);
}

GlooComm::~GlooComm() { queue_.shut_down(); }

void GlooComm::submit(std::function<void()> body, bpl_plugin_request** req) {
  if (req != nullptr) {
    *req = reinterpret_cast<bpl_plugin_request*>(static_cast<Request*>(new QueuedRequest(queue_.post(std::move(body)))));
    return;
  }
  try {
    queue_.run(body);
  } catch (const plugin::OpQueue::QueuedFailure& failure) {
    throw Error(failure.status, failure.message);
  }
}

char* GlooComm::scratch(size_t slot, size_t bytes) {
  std::vector<char>& buffer = scratch_[slot];
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

// Reductions run in the accumulation dtype (dtypes.h): when it differs from the caller's, the data is
// widened into scratch, reduced, divided for AVG, and narrowed once at the end.
void GlooComm::allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op) {
  if (count == 0) return;
  const bpl_dtype acc = plugin::accumulation_dtype(dtype, op);
  void* work = recv;
  if (acc != dtype) {
    work = scratch(0, count * plugin::dtype_size(acc));
    plugin::convert(send, dtype, work, acc, count);
  } else if (send != recv) {
    std::memcpy(recv, send, count * plugin::dtype_size(dtype));
  }
  if (size() > 1) {
    ::gloo::AllreduceOptions options(context_);
    with_element_type(acc, [&](auto zero) { options.setOutput(static_cast<decltype(zero)*>(work), count); });
    options.setReduceFunction(plugin::reduce_function(acc, op));
    options.setTag(next_tag());
    options.setTimeout(shared_->timeout);
    ::gloo::allreduce(options);
  }
  plugin::finish_reduction(work, acc, recv, dtype, count, op, size());
}

void GlooComm::broadcast(void* buf, size_t count, bpl_dtype dtype, int root) {
  if (count == 0 || size() == 1) return;
  ::gloo::BroadcastOptions options(context_);
  options.setOutput(static_cast<uint8_t*>(buf), count * plugin::dtype_size(dtype));
  options.setRoot(root);
  options.setTag(next_tag());
  options.setTimeout(shared_->timeout);
  ::gloo::broadcast(options);
}

void GlooComm::reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root) {
  if (count == 0) return;
  const bpl_dtype acc = plugin::accumulation_dtype(dtype, op);
  const bool is_root = rank() == root;
  // Gloo's reduce uses its buffer as scratch on every rank, so non-roots never reduce in `recv`.
  void* work = (acc == dtype && is_root) ? recv : scratch(0, count * plugin::dtype_size(acc));
  if (acc != dtype) {
    plugin::convert(send, dtype, work, acc, count);
  } else if (work != send) {
    std::memcpy(work, send, count * plugin::dtype_size(dtype));
  }
  if (size() > 1) {
    ::gloo::ReduceOptions options(context_);
    with_element_type(acc, [&](auto zero) { options.setOutput(static_cast<decltype(zero)*>(work), count); });
    options.setRoot(root);
    options.setReduceFunction(plugin::reduce_function(acc, op));
    options.setTag(next_tag());
    options.setTimeout(shared_->timeout);
    ::gloo::reduce(options);
  }
  if (is_root) plugin::finish_reduction(work, acc, recv, dtype, count, op, size());
}

void GlooComm::allgather(const void* send, void* recv, size_t count, bpl_dtype dtype) {
  if (count == 0) return;
  const size_t block = count * plugin::dtype_size(dtype);
  char* own_block = static_cast<char*>(recv) + block * static_cast<size_t>(rank());
  if (size() == 1) {
    if (send != own_block) std::memcpy(own_block, send, block);
    return;
  }
  ::gloo::AllgatherOptions options(context_);
  // In place (send already at recv's own block) Gloo reads the block from the output buffer.
  if (send != own_block) options.setInput(static_cast<uint8_t*>(const_cast<void*>(send)), block);
  options.setOutput(static_cast<uint8_t*>(recv), block * static_cast<size_t>(size()));
  options.setTag(next_tag());
  options.setTimeout(shared_->timeout);
  ::gloo::allgather(options);
}

// Ring reduce-scatter over Gloo's transport: N-1 steps; in step s a rank passes the partial sum of
// block (rank-s-1) to its right neighbour and adds its own data to block (rank-s-2) from its left, so
// after the last step it holds the full reduction of its own block. Each rank sends (N-1)/N of the
// data once, as an allreduce's first half would.
void GlooComm::reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op) {
  if (recvcount == 0) return;
  const int n = size();
  const int me = rank();
  const bpl_dtype acc = plugin::accumulation_dtype(dtype, op);
  const size_t block = recvcount * plugin::dtype_size(acc);
  char* work = scratch(0, block * static_cast<size_t>(n));
  if (acc != dtype) {
    plugin::convert(send, dtype, work, acc, recvcount * static_cast<size_t>(n));
  } else {
    std::memcpy(work, send, block * static_cast<size_t>(n));
  }
  if (n > 1) {
    char* incoming = scratch(1, block);
    const plugin::ReduceFn reduce_fn = plugin::reduce_function(acc, op);
    const uint64_t slot = ::gloo::Slot::build(kReduceScatterSlotPrefix, next_tag());
    const int right = (me + 1) % n;
    const int left = (me + n - 1) % n;
    auto in = context_->createUnboundBuffer(incoming, block);
    for (int step = 0; step < n - 1; ++step) {
      const int send_block = (me - step - 1 + 2 * n) % n;
      const int recv_block = (me - step - 2 + 2 * n) % n;
      auto out = context_->createUnboundBuffer(work + block * static_cast<size_t>(send_block), block);
      in->recv(left, slot);
      out->send(right, slot);
      in->waitRecv(shared_->timeout);
      out->waitSend(shared_->timeout);
      char* target = work + block * static_cast<size_t>(recv_block);
      reduce_fn(target, target, incoming, recvcount);
    }
  }
  plugin::finish_reduction(work + block * static_cast<size_t>(me), acc, recv, dtype, recvcount, op, n);
}

void GlooComm::alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype) {
  if (count == 0) return;
  const size_t total = count * plugin::dtype_size(dtype) * static_cast<size_t>(size());
  const void* input = send;
  if (send == recv) {  // in place: Gloo needs distinct buffers
    input = scratch(0, total);
    std::memcpy(const_cast<void*>(input), send, total);
  }
  if (size() == 1) {
    if (input != recv) std::memcpy(recv, input, total);
    return;
  }
  ::gloo::AlltoallOptions options(context_);
  options.setInput(static_cast<uint8_t*>(const_cast<void*>(input)), total);
  options.setOutput(static_cast<uint8_t*>(recv), total);
  options.setTag(next_tag());
  options.setTimeout(shared_->timeout);
  ::gloo::alltoall(options);
}

void GlooComm::barrier() {
  if (size() == 1) return;
  ::gloo::BarrierOptions options(context_);
  options.setTag(next_tag());
  options.setTimeout(shared_->timeout);
  ::gloo::barrier(options);
}

std::unique_ptr<GlooComm> GlooComm::split(int color, int key) {
  // Every rank learns every (color, key), then each group connects its own mesh under a store prefix
  // that all its members derive alike: parent uid / split number / color.
  const int n = size();
  std::vector<int64_t> mine = {color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(n));
  allgather(mine.data(), all.data(), 2, BPL_DTYPE_I64);
  const uint32_t split_number = splits_++;
  if (color < 0) return nullptr;

  std::vector<int> members;
  for (int r = 0; r < n; ++r) {
    if (all[2 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
  return std::make_unique<GlooComm>(shared_, uid_ + "/" + std::to_string(split_number) + "/" + std::to_string(color),
                                    new_rank, static_cast<int>(members.size()));
}

void GlooComm::point_to_point(void* buf, size_t bytes, int peer, int tag, bool is_send, bpl_plugin_request** req) {
  const uint64_t slot = ::gloo::Slot::build(kPointToPointSlotPrefix, static_cast<uint32_t>(tag));
  auto buffer = context_->createUnboundBuffer(buf, bytes);
  if (is_send) {
    buffer->send(peer, slot);
  } else {
    buffer->recv(peer, slot);
  }
  if (req != nullptr) {
    auto* request = new PointToPointRequest(std::move(buffer), is_send, shared_->timeout);
    *req = reinterpret_cast<bpl_plugin_request*>(static_cast<Request*>(request));
    return;
  }
  bool completed = is_send ? buffer->waitSend(shared_->timeout) : buffer->waitRecv(shared_->timeout);
  if (!completed) throw Error(BPL_ERR_INTERNAL, std::string(is_send ? "send" : "recv") + " aborted");
}

void GlooComm::send(const void* buf, size_t bytes, int peer, int tag, bpl_plugin_request** req) {
  point_to_point(const_cast<void*>(buf), bytes, peer, tag, true, req);
}

void GlooComm::recv(void* buf, size_t bytes, int peer, int tag, bpl_plugin_request** req) {
  point_to_point(buf, bytes, peer, tag, false, req);
}

}  // namespace backplane::gloo_plugin
