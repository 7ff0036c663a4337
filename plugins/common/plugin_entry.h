// The C boundary every plugin shares: the communicator, collective and request entries of the plugin
// table, each unwrapping its handles and turning exceptions into a status and the thread's last error.
//
// A plugin describes itself with a traits type and gets its table from comm_table<Traits>(), then sets
// the entries that are its own (runtime, device memory, kernels, programs):
//
//   struct Traits {
//     static constexpr const char* kName = "mpi";           // the backend's name, prefixing its messages
//     static bpl_status classify(const std::exception&);    // a dependency's exception as a status
//     using Comm = MpiComm;                                  // see below
//     using Request = MpiRequest;                            // test(int32_t*), wait(ms),
//                                                            // static bpl_status free(std::unique_ptr<Request>)
//     static Comm* world(bpl_plugin_runtime*);
//     // optional (ABI 1.2): a communicator its members make through a caller's store
//     static std::unique_ptr<Comm> create_from_store(bpl_plugin_runtime*, const bpl_store&, int rank, int size,
//                                                    std::chrono::milliseconds timeout);
//   };
//
// Comm has rank(), size(), set_timeout(ms), split(color, key) returning std::unique_ptr<Comm> (null for
// BPL_COLOR_UNDEFINED), and the collectives with the ABI's arguments (counts as size_t), each ending in
// `bpl_plugin_request** req` (NULL: complete before returning):
//   allreduce(send, recv, count, dtype, op, req)     broadcast(buf, count, dtype, root, req)
//   reduce(send, recv, count, dtype, op, root, req)  allgather(send, recv, count, dtype, req)
//   reduce_scatter(send, recv, recvcount, dtype, op, req)  barrier(req)
// and, where the backend has them, alltoall(send, recv, count, dtype, req), send(buf, count, dtype,
// peer, tag, req), recv(…), abort(), and (ABI 1.3) gather(send, recv, count, dtype, root, req),
// scatter(…the same…), allgatherv(send, sendcount, recv, CountsView recvcounts, CountsView displs,
// dtype, req) and alltoallv(send, CountsView sendcounts, CountsView sdispls, recv, CountsView
// recvcounts, CountsView rdispls, dtype, req), whose views (one count per rank, in elements) are the
// caller's arrays, valid during the call (a communicator keeps copies of what it keeps); and
// path_of(collective, bytes) (const), how it moves such an operation, for BPL_TRACE; and (ABI 1.6)
// recv_any(buf, count, dtype, tag, int32_t* source, req). An entry the
// communicator lacks stays NULL in the table, which the core reports as unsupported. A new collective
// of the ABI is added here once, and to each plugin's communicator.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "backplane/plugin.h"
#include "plugin_support.h"

#ifndef BPL_VERSION
#define BPL_VERSION "0.0.0"
#endif

namespace backplane::plugin {

namespace detail {

template <typename Comm, typename = void>
struct HasGatherScatter : std::false_type {};
template <typename Comm>
struct HasGatherScatter<Comm, std::void_t<decltype(std::declval<Comm&>().gather(nullptr, nullptr, size_t{}, bpl_dtype{}, 0,
                                                                                  static_cast<bpl_plugin_request**>(nullptr))),
                                          decltype(std::declval<Comm&>().scatter(nullptr, nullptr, size_t{}, bpl_dtype{}, 0,
                                                                                   static_cast<bpl_plugin_request**>(nullptr)))>>
    : std::true_type {};

template <typename Comm, typename = void>
struct HasVariableCollectives : std::false_type {};
template <typename Comm>
struct HasVariableCollectives<
    Comm, std::void_t<decltype(std::declval<Comm&>().allgatherv(nullptr, size_t{}, nullptr, std::declval<CountsView>(),
                                                                std::declval<CountsView>(), bpl_dtype{},
                                                                static_cast<bpl_plugin_request**>(nullptr))),
                      decltype(std::declval<Comm&>().alltoallv(
                          nullptr, std::declval<CountsView>(), std::declval<CountsView>(), nullptr,
                          std::declval<CountsView>(), std::declval<CountsView>(), bpl_dtype{},
                          static_cast<bpl_plugin_request**>(nullptr)))>>
    : std::true_type {};

template <typename Comm, typename = void>
struct HasPathOf : std::false_type {};
template <typename Comm>
struct HasPathOf<Comm, std::void_t<decltype(std::declval<const Comm&>().path_of(bpl_collective{}, uint64_t{}))>>
    : std::true_type {};

template <typename Comm, typename = void>
struct HasAlltoall : std::false_type {};
template <typename Comm>
struct HasAlltoall<Comm, std::void_t<decltype(std::declval<Comm&>().alltoall(
                             nullptr, nullptr, size_t{}, bpl_dtype{}, static_cast<bpl_plugin_request**>(nullptr)))>>
    : std::true_type {};

template <typename Comm, typename = void>
struct HasPointToPoint : std::false_type {};
template <typename Comm>
struct HasPointToPoint<Comm, std::void_t<decltype(std::declval<Comm&>().send(nullptr, size_t{}, bpl_dtype{}, 0, 0,
                                                                                static_cast<bpl_plugin_request**>(nullptr))),
                                         decltype(std::declval<Comm&>().recv(nullptr, size_t{}, bpl_dtype{}, 0, 0,
                                                                                static_cast<bpl_plugin_request**>(nullptr)))>>
    : std::true_type {};

template <typename Comm, typename = void>
struct HasRecvAny : std::false_type {};
template <typename Comm>
struct HasRecvAny<Comm, std::void_t<decltype(std::declval<Comm&>().recv_any(nullptr, size_t{}, bpl_dtype{}, 0,
                                                                               static_cast<int32_t*>(nullptr),
                                                                               static_cast<bpl_plugin_request**>(nullptr)))>>
    : std::true_type {};

template <typename Comm, typename = void>
struct HasAbort : std::false_type {};
template <typename Comm>
struct HasAbort<Comm, std::void_t<decltype(std::declval<Comm&>().abort())>> : std::true_type {};

template <typename Traits, typename = void>
struct HasCreateFromStore : std::false_type {};
template <typename Traits>
struct HasCreateFromStore<Traits, std::void_t<decltype(Traits::create_from_store(
                                      nullptr, std::declval<const bpl_store&>(), 0, 0, std::chrono::milliseconds{}))>>
    : std::true_type {};

}  // namespace detail

template <typename Traits>
struct CommEntries {
  using Comm = typename Traits::Comm;
  using Request = typename Traits::Request;

  template <typename Body>
  static bpl_status guarded(Body&& body) noexcept {
    return plugin::guarded(Traits::kName, Traits::classify, std::forward<Body>(body));
  }
  // Runs a call that completes or throws: BPL_OK unless it threw.
  template <typename Body>
  static bpl_status run(Body&& body) noexcept {
    return guarded([&] {
      body();
      return BPL_OK;
    });
  }

  static Comm& comm(bpl_plugin_comm* c) { return *reinterpret_cast<Comm*>(c); }
  static bpl_plugin_comm* handle(Comm* c) { return reinterpret_cast<bpl_plugin_comm*>(c); }
  static Request* request(bpl_plugin_request* req) { return reinterpret_cast<Request*>(req); }
  static size_t elements(int64_t count) { return static_cast<size_t>(count); }  // the core checked count >= 0
  // A per-rank array of the caller's, as the communicator reads it.
  static CountsView counts(const int64_t* values, Comm& c) { return CountsView(values, static_cast<size_t>(c.size())); }

  /* ---- communicators ---- */

  static bpl_status comm_world(bpl_plugin_runtime* rt, bpl_plugin_comm** out) {
    *out = handle(Traits::world(rt));
    return BPL_OK;
  }
  static bpl_status comm_split(bpl_plugin_comm* parent, int32_t color, int32_t key, bpl_plugin_comm** out) {
    return run([&] { *out = handle(comm(parent).split(color, key).release()); });
  }
  static bpl_status comm_create_from_store(bpl_plugin_runtime* rt, const bpl_store* store, int32_t rank, int32_t size,
                                           int64_t timeout_ms, bpl_plugin_comm** out) {
    return run([&] {
      *out = handle(Traits::create_from_store(rt, *store, rank, size, std::chrono::milliseconds(timeout_ms)).release());
    });
  }
  static bpl_status comm_destroy(bpl_plugin_comm* c) {
    return run([&] { delete &comm(c); });
  }
  static bpl_status comm_rank_size(bpl_plugin_comm* c, int32_t* rank, int32_t* size) {
    *rank = comm(c).rank();
    *size = comm(c).size();
    return BPL_OK;
  }
  static bpl_status comm_set_timeout(bpl_plugin_comm* c, int64_t timeout_ms) {
    return run([&] { comm(c).set_timeout(std::chrono::milliseconds(timeout_ms)); });
  }
  static bpl_status comm_abort(bpl_plugin_comm* c) {
    return run([&] { comm(c).abort(); });
  }

  /* ---- collectives ---- */

  static bpl_status allreduce(bpl_plugin_comm* c, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                              bpl_reduce_op op, bpl_plugin_request** req) {
    return run([&] { comm(c).allreduce(send, recv, elements(count), dtype, op, req); });
  }
  static bpl_status broadcast(bpl_plugin_comm* c, void* buf, int64_t count, bpl_dtype dtype, int32_t root,
                              bpl_plugin_request** req) {
    return run([&] { comm(c).broadcast(buf, elements(count), dtype, root, req); });
  }
  static bpl_status reduce(bpl_plugin_comm* c, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                           bpl_reduce_op op, int32_t root, bpl_plugin_request** req) {
    return run([&] { comm(c).reduce(send, recv, elements(count), dtype, op, root, req); });
  }
  static bpl_status allgather(bpl_plugin_comm* c, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                              bpl_plugin_request** req) {
    return run([&] { comm(c).allgather(send, recv, elements(count), dtype, req); });
  }
  static bpl_status reduce_scatter(bpl_plugin_comm* c, const void* send, void* recv, int64_t recvcount, bpl_dtype dtype,
                                   bpl_reduce_op op, bpl_plugin_request** req) {
    return run([&] { comm(c).reduce_scatter(send, recv, elements(recvcount), dtype, op, req); });
  }
  static bpl_status alltoall(bpl_plugin_comm* c, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                             bpl_plugin_request** req) {
    return run([&] { comm(c).alltoall(send, recv, elements(count), dtype, req); });
  }
  static bpl_status barrier(bpl_plugin_comm* c, bpl_plugin_request** req) {
    return run([&] { comm(c).barrier(req); });
  }
  static bpl_status comm_path(bpl_plugin_comm* c, bpl_collective op, uint64_t bytes, const char** path) {
    return run([&] { *path = comm(c).path_of(op, bytes); });
  }
  static bpl_status gather(bpl_plugin_comm* c, const void* send, void* recv, int64_t count, bpl_dtype dtype, int32_t root,
                           bpl_plugin_request** req) {
    return run([&] { comm(c).gather(send, recv, elements(count), dtype, root, req); });
  }
  static bpl_status scatter(bpl_plugin_comm* c, const void* send, void* recv, int64_t count, bpl_dtype dtype, int32_t root,
                            bpl_plugin_request** req) {
    return run([&] { comm(c).scatter(send, recv, elements(count), dtype, root, req); });
  }
  static bpl_status allgatherv(bpl_plugin_comm* c, const void* send, int64_t sendcount, void* recv, const int64_t* recvcounts,
                               const int64_t* displs, bpl_dtype dtype, bpl_plugin_request** req) {
    return run([&] {
      Comm& self = comm(c);
      self.allgatherv(send, elements(sendcount), recv, counts(recvcounts, self), counts(displs, self), dtype, req);
    });
  }
  static bpl_status alltoallv(bpl_plugin_comm* c, const void* send, const int64_t* sendcounts, const int64_t* sdispls,
                              void* recv, const int64_t* recvcounts, const int64_t* rdispls, bpl_dtype dtype,
                              bpl_plugin_request** req) {
    return run([&] {
      Comm& self = comm(c);
      self.alltoallv(send, counts(sendcounts, self), counts(sdispls, self), recv, counts(recvcounts, self),
                     counts(rdispls, self), dtype, req);
    });
  }
  static bpl_status send(bpl_plugin_comm* c, const void* buf, int64_t count, bpl_dtype dtype, int32_t peer, int32_t tag,
                         bpl_plugin_request** req) {
    return run([&] { comm(c).send(buf, elements(count), dtype, peer, tag, req); });
  }
  static bpl_status recv(bpl_plugin_comm* c, void* buf, int64_t count, bpl_dtype dtype, int32_t peer, int32_t tag,
                         bpl_plugin_request** req) {
    return run([&] { comm(c).recv(buf, elements(count), dtype, peer, tag, req); });
  }
  static bpl_status recv_any(bpl_plugin_comm* c, void* buf, int64_t count, bpl_dtype dtype, int32_t tag, int32_t* source,
                             bpl_plugin_request** req) {
    return run([&] { comm(c).recv_any(buf, elements(count), dtype, tag, source, req); });
  }

  /* ---- requests ---- */

  static bpl_status request_test(bpl_plugin_request* req, int32_t* done) {
    return guarded([&] { return request(req)->test(done); });
  }
  static bpl_status request_wait(bpl_plugin_request* req, int64_t timeout_ms) {
    return guarded([&] { return request(req)->wait(std::chrono::milliseconds(timeout_ms)); });
  }
  static bpl_status request_free(bpl_plugin_request* req) {
    return guarded([&] { return Request::free(std::unique_ptr<Request>(request(req))); });
  }
};

// The table with the identity and every communicator, collective and request entry filled; runtime,
// device, kernel and program entries are NULL for the plugin to set.
template <typename Traits>
bpl_plugin_api comm_table() {
  using E = CommEntries<Traits>;
  using Comm = typename Traits::Comm;
  bpl_plugin_api api{};
  api.struct_size = sizeof(bpl_plugin_api);
  api.abi_major = BPL_ABI_MAJOR;
  api.abi_minor = BPL_ABI_MINOR;
  api.name = Traits::kName;
  api.version = BPL_VERSION;
  api.comm_world = E::comm_world;
  api.comm_split = E::comm_split;
  api.comm_destroy = E::comm_destroy;
  api.comm_rank_size = E::comm_rank_size;
  api.comm_set_timeout = E::comm_set_timeout;
  if constexpr (detail::HasAbort<Comm>::value) api.comm_abort = E::comm_abort;
  if constexpr (detail::HasCreateFromStore<Traits>::value) api.comm_create_from_store = E::comm_create_from_store;
  api.allreduce = E::allreduce;
  api.broadcast = E::broadcast;
  api.reduce = E::reduce;
  api.allgather = E::allgather;
  api.reduce_scatter = E::reduce_scatter;
  if constexpr (detail::HasAlltoall<Comm>::value) api.alltoall = E::alltoall;
  api.barrier = E::barrier;
  if constexpr (detail::HasGatherScatter<Comm>::value) {
    api.gather = E::gather;
    api.scatter = E::scatter;
  }
  if constexpr (detail::HasPathOf<Comm>::value) api.comm_path = E::comm_path;
  if constexpr (detail::HasVariableCollectives<Comm>::value) {
    api.allgatherv = E::allgatherv;
    api.alltoallv = E::alltoallv;
  }
  if constexpr (detail::HasPointToPoint<Comm>::value) {
    api.send = E::send;
    api.recv = E::recv;
  }
  if constexpr (detail::HasRecvAny<Comm>::value) api.recv_any = E::recv_any;
  api.request_test = E::request_test;
  api.request_wait = E::request_wait;
  api.request_free = E::request_free;
  return api;
}

// The body of every plugin's bpl_plugin_open_v1: check the host, remember it, then `open()` (loading
// what the backend needs; throws when it cannot) and hand out the table.
template <typename Traits, typename Open>
bpl_status open_plugin(const bpl_host_api* host_api, const bpl_plugin_api* table, const bpl_plugin_api** out,
                       Open&& open) {
  if (host_api == nullptr || out == nullptr ||
      host_api->struct_size < offsetof(bpl_host_api, set_error) + sizeof(host_api->set_error)) {
    return BPL_ERR_INVALID_ARGUMENT;
  }
  host() = host_api;
  name() = Traits::kName;
  *out = nullptr;
  return CommEntries<Traits>::guarded([&] {
    open();
    *out = table;
    return BPL_OK;
  });
}

template <typename Traits>
bpl_status open_plugin(const bpl_host_api* host_api, const bpl_plugin_api* table, const bpl_plugin_api** out) {
  return open_plugin<Traits>(host_api, table, out, [] {});
}

}  // namespace backplane::plugin
