#include "releasable_context.h"

#include <gloo/transport/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

namespace backplane::gloo_plugin {

namespace transport = ::gloo::transport;

// The transport the context's algorithms see: pairs are the TCP transport's own; each buffer is the
// TCP transport's, wrapped so that it can be released.
class ReleasableContext::Transport final : public transport::Context, public std::enable_shared_from_this<Transport> {
 public:
  explicit Transport(std::shared_ptr<transport::Context> tcp) : transport::Context(tcp->rank, tcp->size), tcp_(std::move(tcp)) {
    setTimeout(tcp_->getTimeout());
  }

  std::unique_ptr<transport::Pair>& getPair(int rank) override { return tcp_->getPair(rank); }
  std::unique_ptr<transport::Pair>& createPair(int rank) override { return tcp_->createPair(rank); }
  std::unique_ptr<transport::UnboundBuffer> createUnboundBuffer(void* ptr, size_t size) override;

  void release() {
    std::lock_guard<std::mutex> lock(buffers_mutex_);
    released_ = true;
    for (transport::UnboundBuffer* buffer : buffers_) {
      buffer->abortWaitSend();
      buffer->abortWaitRecv();
    }
  }
  bool released() const { return released_.load(); }

 private:
  class Buffer;
  std::shared_ptr<transport::Context> tcp_;
  std::mutex buffers_mutex_;
  std::vector<transport::UnboundBuffer*> buffers_;  // the TCP transport's, alive (a few at a time)
  std::atomic<bool> released_{false};
};

// A TCP buffer that throws instead of waiting once its context is released. An abort that reaches
// the TCP buffer before its wait begins still ends that wait (Gloo keeps it until a wait takes it).
class ReleasableContext::Transport::Buffer final : public transport::UnboundBuffer {
 public:
  Buffer(std::shared_ptr<Transport> owner, std::unique_ptr<transport::UnboundBuffer> tcp)
      : transport::UnboundBuffer(tcp->ptr, tcp->size), owner_(std::move(owner)), tcp_(std::move(tcp)) {
    std::lock_guard<std::mutex> lock(owner_->buffers_mutex_);
    owner_->buffers_.push_back(tcp_.get());
  }
  ~Buffer() override {
    std::lock_guard<std::mutex> lock(owner_->buffers_mutex_);
    std::vector<transport::UnboundBuffer*>& buffers = owner_->buffers_;
    *std::find(buffers.begin(), buffers.end(), tcp_.get()) = buffers.back();
    buffers.pop_back();
  }

  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override {
    if (owner_->released() || !tcp_->waitRecv(rank, timeout)) throw TransferReleased(false);
    return true;
  }
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override {
    if (owner_->released() || !tcp_->waitSend(rank, timeout)) throw TransferReleased(true);
    return true;
  }
  void abortWaitRecv() override { tcp_->abortWaitRecv(); }
  void abortWaitSend() override { tcp_->abortWaitSend(); }

  void send(int dst, uint64_t slot, size_t offset, size_t bytes) override {
    if (owner_->released()) throw TransferReleased(true);
    tcp_->send(dst, slot, offset, bytes);
  }
  void recv(int src, uint64_t slot, size_t offset, size_t bytes) override {
    if (owner_->released()) throw TransferReleased(false);
    tcp_->recv(src, slot, offset, bytes);
  }
  void recv(std::vector<int> srcs, uint64_t slot, size_t offset, size_t bytes) override {
    if (owner_->released()) throw TransferReleased(false);
    tcp_->recv(std::move(srcs), slot, offset, bytes);
  }

 private:
  std::shared_ptr<Transport> owner_;
  std::unique_ptr<transport::UnboundBuffer> tcp_;
};

std::unique_ptr<transport::UnboundBuffer> ReleasableContext::Transport::createUnboundBuffer(void* ptr, size_t size) {
  return std::make_unique<Buffer>(shared_from_this(), tcp_->createUnboundBuffer(ptr, size));
}

ReleasableContext::ReleasableContext(int rank, int size) : ::gloo::rendezvous::Context(rank, size) {}

ReleasableContext::~ReleasableContext() = default;

void ReleasableContext::connect_full_mesh(::gloo::rendezvous::Store& store,
                                          std::shared_ptr<transport::Device>& device) {
  connectFullMesh(store, device);
  transport_ = std::make_shared<Transport>(transportContext_);
  transportContext_ = transport_;
}

void ReleasableContext::release() {
  if (transport_) transport_->release();
  // And the connections closed: a pair that its peer's end, or the shut-down of the communicator's
  // sockets, left in some states stays registered in Gloo's event loop, which its socket then wakes
  // at once, over and over (an idle rank spun a core after a peer left).
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    const std::unique_ptr<transport::Pair>& pair = getPair(r);
    if (pair) pair->close();
  }
}

}  // namespace backplane::gloo_plugin
