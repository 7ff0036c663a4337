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

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <tuple>

#include "dtypes.h"
#include "plugin_support.h"
#include "rendezvous.h"

namespace backplane::gloo_plugin {

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

GlooComm::GlooComm(std::shared_ptr<Shared> shared, std::string uid, int rank, int size,
                   std::chrono::milliseconds timeout)
    : shared_(std::move(shared)),
      uid_(std::move(uid)),
      timeout_ms_(timeout.count()),
      queue_(classify, timeout),
      scratch_(2) {
  auto context = std::make_shared<::gloo::rendezvous::Context>(rank, size);
  context->setTimeout(timeout);
  ::gloo::rendezvous::PrefixStore store(uid_, *shared_->store);
  context->connectFullMesh(store, shared_->device);
  context_ = std::move(context);
  learn_peer_addresses(store);
}

GlooComm::~GlooComm() { queue_.shut_down(); }

void GlooComm::set_timeout(std::chrono::milliseconds timeout) {
  timeout_ms_.store(timeout.count(), std::memory_order_relaxed);
  queue_.set_op_timeout(timeout);
}

void GlooComm::abort() { context_->closeConnections(); }

namespace {

// "[127.0.0.1]:41234", as Gloo's tcp::Address::str() writes a socket address.
std::string address_text(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (address.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(address);
    inet_ntop(AF_INET, &in.sin_addr, host, sizeof(host));
    port = ntohs(in.sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(address);
    inet_ntop(AF_INET6, &in6.sin6_addr, host, sizeof(host));
    port = ntohs(in6.sin6_port);
  } else {
    return "";
  }
  return "[" + std::string(host) + "]:" + std::to_string(port);
}

// The local address of this process's TCP connection to `remote`, or "" if it has none. Gloo does not
// expose its sockets, so the process's descriptors are searched (once per communicator).
std::string local_end_of_connection_to(const std::string& remote) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", error)) {
    const int fd = std::atoi(entry.path().filename().c_str());
    struct stat info {};
    if (fstat(fd, &info) != 0 || !S_ISSOCK(info.st_mode)) continue;
    sockaddr_storage peer{}, local{};
    socklen_t peer_length = sizeof(peer), local_length = sizeof(local);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0) continue;
    if (address_text(peer) != remote) continue;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0) continue;
    return address_text(local);
  }
  return "";
}

// One line per rank of the communicator ("" for the caller's own).
std::vector<std::string> lines_of(const std::vector<char>& bytes) {
  std::vector<std::string> lines;
  std::string line;
  for (char c : bytes) {
    if (c == '\n') {
      lines.push_back(line);
      line.clear();
    } else {
      line += c;
    }
  }
  return lines;
}

}  // namespace

// Gloo names the remote end of a failed connection: the peer's listening address when this rank
// connected to it, or the peer's own (ephemeral) end when the peer connected here. Both are exchanged
// once, through the store, so that either can be traced to a rank.
void GlooComm::learn_peer_addresses(::gloo::rendezvous::Store& store) {
  if (size() == 1) return;
  auto exchange = [&](const std::string& key, const std::vector<std::string>& mine) {
    std::string text;
    for (const std::string& line : mine) text += line + "\n";
    store.set(key + "/" + std::to_string(rank()), std::vector<char>(text.begin(), text.end()));
    std::vector<std::vector<std::string>> all(static_cast<size_t>(size()));
    for (int r = 0; r < size(); ++r) {
      if (r != rank()) all[static_cast<size_t>(r)] = lines_of(store.get(key + "/" + std::to_string(r)));
    }
    return all;
  };
  std::vector<std::string> listening(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) {
    if (r != rank()) listening[static_cast<size_t>(r)] = context_->getPair(r)->address().str();
  }
  const auto peers_listening = exchange("listening_addresses", listening);
  std::vector<std::string> connected_from(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) {
    const auto& theirs = peers_listening[static_cast<size_t>(r)];
    if (r == rank() || theirs.size() != static_cast<size_t>(size())) continue;
    const std::string& their_end = theirs[static_cast<size_t>(rank())];  // rank r's end of our connection
    peer_of_address_[their_end] = r;
    connected_from[static_cast<size_t>(r)] = local_end_of_connection_to(their_end);
  }
  const auto peers_connected_from = exchange("connected_from", connected_from);
  for (int r = 0; r < size(); ++r) {
    const auto& theirs = peers_connected_from[static_cast<size_t>(r)];
    if (r == rank() || theirs.size() != static_cast<size_t>(size())) continue;
    if (!theirs[static_cast<size_t>(rank())].empty()) peer_of_address_[theirs[static_cast<size_t>(rank())]] = r;
  }
}

Error GlooComm::failure(const std::exception& e) {
  const bpl_status status = classify_exception(e);
  std::string message = e.what();
  for (const auto& [address, peer] : peer_of_address_) {
    if (message.find(address) != std::string::npos) {
      message += " (peer " + address + " is rank " + std::to_string(peer) + " of this communicator)";
      break;
    }
  }
  if (status == BPL_ERR_TIMEOUT) {
    message += " (no peer of this rank in the operation made progress within " + std::to_string(timeout().count()) +
               " ms: one is stopped, stuck or far behind)";
  }
  if (status != BPL_ERR_REMOTE && status != BPL_ERR_TIMEOUT) return Error(status, message);
  // "<status>|<rank>|<message>": the first failure recorded for this communicator.
  const std::string mine = std::to_string(status) + "|" + std::to_string(rank()) + "|" + message;
  const std::string first = shared_->record_first(uid_ + "/first_failure", mine);
  context_->closeConnections();
  const size_t bar1 = first.find('|'), bar2 = first.find('|', bar1 + 1);
  if (first == mine || bar1 == std::string::npos || bar2 == std::string::npos) return Error(status, message);
  const auto first_status = static_cast<bpl_status>(std::atoi(first.c_str()));
  return Error(first_status, first.substr(bar2 + 1) + " [the communicator's first failure, seen by rank " +
                                 first.substr(bar1 + 1, bar2 - bar1 - 1) + "; here: " + message + "]");
}

void GlooComm::submit(std::function<void()> body, bpl_plugin_request** req) {
  auto checked = [this, body = std::move(body)] {
    try {
      body();
    } catch (const Error&) {
      throw;  // the plugin's own, already classified
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {
      throw failure(e);
    }
  };
  if (req != nullptr) {
    *req = reinterpret_cast<bpl_plugin_request*>(static_cast<Request*>(new QueuedRequest(queue_.post(std::move(checked)))));
    return;
  }
  try {
    queue_.run(checked);
  } catch (const plugin::OpQueue::QueuedFailure& queued) {
    throw Error(queued.status, queued.message);
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
    options.setTimeout(timeout());
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
  options.setTimeout(timeout());
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
    options.setTimeout(timeout());
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
  options.setTimeout(timeout());
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
      in->waitRecv(timeout());
      out->waitSend(timeout());
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
  options.setTimeout(timeout());
  ::gloo::alltoall(options);
}

void GlooComm::barrier() {
  if (size() == 1) return;
  ::gloo::BarrierOptions options(context_);
  options.setTag(next_tag());
  options.setTimeout(timeout());
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
                                    new_rank, static_cast<int>(members.size()), timeout());
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
    auto* request = new PointToPointRequest(std::move(buffer), is_send, timeout());
    *req = reinterpret_cast<bpl_plugin_request*>(static_cast<Request*>(request));
    return;
  }
  bool completed = is_send ? buffer->waitSend(timeout()) : buffer->waitRecv(timeout());
  if (!completed) throw Error(BPL_ERR_INTERNAL, std::string(is_send ? "send" : "recv") + " aborted");
}

void GlooComm::send(const void* buf, size_t bytes, int peer, int tag, bpl_plugin_request** req) {
  point_to_point(const_cast<void*>(buf), bytes, peer, tag, true, req);
}

void GlooComm::recv(void* buf, size_t bytes, int peer, int tag, bpl_plugin_request** req) {
  point_to_point(buf, bytes, peer, tag, false, req);
}

}  // namespace backplane::gloo_plugin
