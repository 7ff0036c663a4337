// Raw Gloo: the same calls the gloo plugin makes, made directly, meeting as PyTorch's Gloo does (a TCP
// store seen as Gloo's store, and a Gloo TCP device), with nothing of the plugin's own.
#include <c10/util/BFloat16.h>
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/reduce_scatter.h>
#include <gloo/scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "gloo_kv_store.h"
#include "raw_library.h"
#include "tcp_store.h"

namespace backplane::bench {
namespace {

template <typename T>
void sum_into(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(static_cast<float>(x[i]) + static_cast<float>(y[i]));
}

template <typename T>
void sum_in_place(T* x, const T* y, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<T>(static_cast<float>(x[i]) + static_cast<float>(y[i]));
}

// Calls body with a null pointer of the element type: float for f32, c10::BFloat16 for bf16.
template <typename Body>
void with_type(bpl_dtype dtype, Body body) {
  if (dtype == BPL_DTYPE_BF16) {
    body(static_cast<c10::BFloat16*>(nullptr));
  } else {
    body(static_cast<float*>(nullptr));
  }
}

// Loopback when the job is on this host; otherwise GLOO_SOCKET_IFNAME's interface, else the address
// this host's name resolves to (torch's Gloo chooses the same way).
std::shared_ptr<gloo::transport::Device> device_for(const std::string& master_addr) {
  gloo::transport::tcp::attr attr;
  const char* iface = std::getenv("GLOO_SOCKET_IFNAME");
  if (master_addr == "localhost" || master_addr.rfind("127.", 0) == 0) {
    attr.hostname = "127.0.0.1";
  } else if (iface != nullptr && *iface != '\0') {
    attr.iface = iface;
  } else {
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    attr.hostname = name;
  }
  return gloo::transport::tcp::CreateDevice(attr);
}

class RawGloo : public RawLibrary {
 public:
  // Meets as PyTorch's Gloo does, through a TCP store at addr:port (backplane's own, the launcher's or
  // hosted by rank 0: only the meeting goes through it, none of the collectives).
  RawGloo(int rank, int world, const std::string& addr, int port, bool rank0_hosts, int64_t timeout_ms)
      : timeout_(timeout_ms), rank_(rank), world_(world) {
    if (rank == 0 && rank0_hosts) store_server_ = std::make_unique<backplane::gloo_plugin::TcpStoreServer>(static_cast<uint16_t>(port));
    auto client = std::make_shared<backplane::gloo_plugin::TcpStoreClient>(addr, static_cast<uint16_t>(port), timeout_,
                                                                           timeout_, "rank 0");
    backplane::gloo_plugin::GlooKvStore store(client, "bench-raw-gloo", timeout_);
    gloo::rendezvous::PrefixStore prefixed("bench-raw-gloo", store);
    context_ = std::make_shared<gloo::rendezvous::Context>(rank, world);
    context_->setTimeout(timeout_);
    std::shared_ptr<gloo::transport::Device> device = device_for(addr);
    context_->connectFullMesh(prefixed, device);
  }

  std::string description() const override { return std::string("gloo ") + BPL_GLOO_VERSION + " over tcp"; }

  void allreduce(void* buf, size_t count, bpl_dtype dtype) override {
    gloo::AllreduceOptions options(context_);
    with_type(dtype, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      options.setOutput(static_cast<T*>(buf), count);
      options.setReduceFunction(&sum_into<T>);
    });
    options.setTag(tag_++);
    gloo::allreduce(options);
  }

  void allgather(const void* send, void* recv, size_t count, bpl_dtype dtype) override {
    const size_t bytes = count * bpl_dtype_size(dtype);
    gloo::AllgatherOptions options(context_);
    options.setInput(static_cast<uint8_t*>(const_cast<void*>(send)), bytes);
    options.setOutput(static_cast<uint8_t*>(recv), bytes * static_cast<size_t>(world_));
    options.setTag(tag_++);
    gloo::allgather(options);
  }

  // Gloo's own reduce-scatter (the algorithm API's halving-doubling), in place on `send`.
  void reduce_scatter(void* send, void* recv, size_t recvcount, bpl_dtype dtype) override {
    with_type(dtype, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      static const gloo::ReductionFunction<T> sum(gloo::SUM, &sum_in_place<T>);
      std::vector<int> counts(static_cast<size_t>(world_), static_cast<int>(recvcount));
      gloo::ReduceScatterHalvingDoubling<T> algorithm(context_, {static_cast<T*>(send)},
                                                      static_cast<int>(recvcount) * world_, counts, &sum);
      algorithm.run();
      std::memcpy(recv, static_cast<T*>(send) + recvcount * static_cast<size_t>(rank_), recvcount * sizeof(T));
    });
  }

  void broadcast(void* buf, size_t count, bpl_dtype dtype, int root) override {
    gloo::BroadcastOptions options(context_);
    options.setOutput(static_cast<uint8_t*>(buf), count * bpl_dtype_size(dtype));
    options.setRoot(root);
    options.setTag(tag_++);
    gloo::broadcast(options);
  }

  void reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) override {
    gloo::ReduceOptions options(context_);
    with_type(dtype, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      options.setInput(static_cast<T*>(const_cast<void*>(send)), count);
      options.setOutput(static_cast<T*>(recv), count);
      options.setReduceFunction(&sum_into<T>);
    });
    options.setRoot(root);
    options.setTag(tag_++);
    gloo::reduce(options);
  }

  void alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype) override {
    const size_t total = count * bpl_dtype_size(dtype) * static_cast<size_t>(world_);
    gloo::AlltoallOptions options(context_);
    options.setInput(static_cast<uint8_t*>(const_cast<void*>(send)), total);
    options.setOutput(static_cast<uint8_t*>(recv), total);
    options.setTag(tag_++);
    gloo::alltoall(options);
  }

  void gather(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) override {
    const size_t bytes = count * bpl_dtype_size(dtype);
    gloo::GatherOptions options(context_);
    options.setInput(static_cast<uint8_t*>(const_cast<void*>(send)), bytes);
    if (rank_ == root) options.setOutput(static_cast<uint8_t*>(recv), bytes * static_cast<size_t>(world_));
    options.setRoot(root);
    options.setTag(tag_++);
    gloo::gather(options);
  }

  void scatter(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) override {
    const size_t bytes = count * bpl_dtype_size(dtype);
    gloo::ScatterOptions options(context_);
    if (rank_ == root) {
      std::vector<uint8_t*> parts;
      for (int r = 0; r < world_; ++r) parts.push_back(static_cast<uint8_t*>(const_cast<void*>(send)) + bytes * static_cast<size_t>(r));
      options.setInputs(parts, bytes);
    }
    options.setOutput(static_cast<uint8_t*>(recv), bytes);
    options.setRoot(root);
    options.setTag(tag_++);
    gloo::scatter(options);
  }

  void allgatherv(const void* send, void* recv, size_t count, bpl_dtype dtype) override {
    const size_t bytes = count * bpl_dtype_size(dtype);
    gloo::AllgathervOptions options(context_);
    options.setInput(static_cast<uint8_t*>(const_cast<void*>(send)), bytes);
    options.setOutput(static_cast<uint8_t*>(recv), std::vector<size_t>(static_cast<size_t>(world_), bytes));
    options.setTag(tag_++);
    gloo::allgatherv(options);
  }

  void alltoallv(const void* send, void* recv, size_t count, bpl_dtype dtype) override {
    const auto bytes = static_cast<int64_t>(count * bpl_dtype_size(dtype));
    gloo::AlltoallvOptions options(context_);
    options.setInput(static_cast<uint8_t*>(const_cast<void*>(send)), std::vector<int64_t>(static_cast<size_t>(world_), bytes));
    options.setOutput(static_cast<uint8_t*>(recv), std::vector<int64_t>(static_cast<size_t>(world_), bytes));
    options.setTag(tag_++);
    gloo::alltoallv(options);
  }

  void send(const void* buf, size_t bytes, int peer) override {
    auto buffer = context_->createUnboundBuffer(const_cast<void*>(buf), bytes);
    buffer->send(peer, kPointToPointSlot);
    buffer->waitSend(timeout_);
  }

  void recv(void* buf, size_t bytes, int peer) override {
    auto buffer = context_->createUnboundBuffer(buf, bytes);
    buffer->recv(peer, kPointToPointSlot);
    buffer->waitRecv(timeout_);
  }

  void barrier() override {
    gloo::BarrierOptions options(context_);
    options.setTag(tag_++);
    gloo::barrier(options);
  }

 private:
  static constexpr uint64_t kPointToPointSlot = 0x7001;
  std::chrono::milliseconds timeout_;
  int rank_;
  int world_;
  uint32_t tag_ = 0;
  std::unique_ptr<backplane::gloo_plugin::TcpStoreServer> store_server_;  // rank 0's, which the others may still use
  std::shared_ptr<gloo::rendezvous::Context> context_;
};

}  // namespace

std::unique_ptr<RawLibrary> open_raw_gloo(int rank, int world_size, const std::string& master_addr, int port,
                                          bool rank0_hosts,
                                          int64_t timeout_ms) {
  return std::make_unique<RawGloo>(rank, world_size, master_addr, port, rank0_hosts, timeout_ms);
}

}  // namespace backplane::bench
