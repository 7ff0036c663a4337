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
// BPL_COLOR_UNDEFINED), and a member for each entry of BPL_FOR_EACH_PLUGIN_OPERATION_ENTRY (plugin.h) it
// provides, of the entry's name (one, not overloaded: an overloaded name is not found, and the entry
// stays NULL), taking the entry's arguments after the communicator: a count as size_t
// (the core checked it is >= 0), a per-rank array (one count per rank, in elements) as a CountsView of
// the caller's array, valid during the call (a communicator keeps copies of what it keeps), anything
// else as the entry has it; the last is `bpl_plugin_request** req` (NULL: complete before returning):
//   void allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op,
//                  bpl_plugin_request** req);
// Optional: abort(); path_of(collective, bytes) (const), how it moves such an operation, for
// BPL_TRACE; and revoke(), agree(int32_t* flags, int32_t* failed, int32_t* num_failed),
// shrink(int32_t* failed, int32_t* num_failed) and grow(int32_t joiners) returning std::unique_ptr<Comm>,
// as the ABI's (all four), with Traits::join(rt, timeout) for a newcomer. An entry the communicator has no member for stays NULL in the table, which the core
// reports as unsupported: a new operation of the ABI is a line in plugin.h's list and a member of each
// plugin's communicator.
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
struct HasPathOf : std::false_type {};
template <typename Comm>
struct HasPathOf<Comm, std::void_t<decltype(std::declval<const Comm&>().path_of(bpl_collective{}, uint64_t{}))>>
    : std::true_type {};

template <typename Comm, typename = void>
struct HasAbort : std::false_type {};
template <typename Comm>
struct HasAbort<Comm, std::void_t<decltype(std::declval<Comm&>().abort())>> : std::true_type {};

// Going on after a failure (ABI 1.8): revoke(), agree(flags, failed, num_failed), and
// shrink(failed, num_failed) and grow(joiners) returning std::unique_ptr<Comm>, all four or none; and
// Traits::join(rt, timeout), a newcomer's.
template <typename Comm, typename = void>
struct HasFaultTolerance : std::false_type {};
template <typename Comm>
struct HasFaultTolerance<Comm, std::void_t<decltype(std::declval<Comm&>().revoke()),
                                           decltype(std::declval<Comm&>().agree(nullptr, nullptr, nullptr)),
                                           decltype(std::declval<Comm&>().shrink(nullptr, nullptr).release()),
                                           decltype(std::declval<Comm&>().grow(int32_t{}).release())>>
    : std::true_type {};

template <typename Traits, typename = void>
struct HasJoin : std::false_type {};
template <typename Traits>
struct HasJoin<Traits, std::void_t<decltype(Traits::join(nullptr, std::chrono::milliseconds{}).release())>>
    : std::true_type {};

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

  static bpl_status comm_revoke(bpl_plugin_comm* c) {
    return run([&] { comm(c).revoke(); });
  }
  static bpl_status comm_agree(bpl_plugin_comm* c, int32_t* flags, int32_t* failed, int32_t* num_failed) {
    return run([&] { comm(c).agree(flags, failed, num_failed); });
  }
  static bpl_status comm_shrink(bpl_plugin_comm* c, int32_t* failed, int32_t* num_failed, bpl_plugin_comm** out) {
    return run([&] { *out = handle(comm(c).shrink(failed, num_failed).release()); });
  }
  static bpl_status comm_grow(bpl_plugin_comm* c, int32_t joiners, bpl_plugin_comm** out) {
    return run([&] { *out = handle(comm(c).grow(joiners).release()); });
  }
  static bpl_status comm_join(bpl_plugin_runtime* rt, int64_t timeout_ms, bpl_plugin_comm** out) {
    return run([&] { *out = handle(Traits::join(rt, std::chrono::milliseconds(timeout_ms)).release()); });
  }

  static bpl_status comm_path(bpl_plugin_comm* c, bpl_collective op, uint64_t bytes, const char** path) {
    return run([&] { *path = comm(c).path_of(op, bytes); });
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

namespace detail {

// An entry's C argument as the communicator's member takes it.
template <typename Param, typename Arg, typename Comm>
Param member_argument(Arg value, const Comm& comm) {
  if constexpr (std::is_same_v<Param, CountsView>) {
    return CountsView(value, static_cast<size_t>(comm.size()));
  } else if constexpr (std::is_same_v<Param, size_t> && std::is_same_v<Arg, int64_t>) {
    return static_cast<size_t>(value);  // a count, which the core checked is >= 0
  } else {
    return value;
  }
}

// The table entry of type Entry that unwraps the communicator and calls Member with the rest.
template <typename Traits, typename Entry, auto Member>
struct OperationEntry;
template <typename Traits, typename... Args, typename Comm, typename... Params, void (Comm::*Member)(Params...)>
struct OperationEntry<Traits, bpl_status (*)(bpl_plugin_comm*, Args...), Member> {
  static_assert(sizeof...(Args) == sizeof...(Params), "a member takes its table entry's arguments");
  static bpl_status call(bpl_plugin_comm* c, Args... args) {
    return CommEntries<Traits>::run([&] {
      Comm& self = CommEntries<Traits>::comm(c);
      (self.*Member)(member_argument<Params>(args, self)...);
    });
  }
};

#define BPL_DETAIL_HAS_MEMBER(entry)                                                         \
  template <typename Comm, typename = void>                                                 \
  struct HasMember_##entry : std::false_type {};                                            \
  template <typename Comm>                                                                  \
  struct HasMember_##entry<Comm, std::void_t<decltype(&Comm::entry)>> : std::true_type {};
BPL_FOR_EACH_PLUGIN_OPERATION_ENTRY(BPL_DETAIL_HAS_MEMBER)
#undef BPL_DETAIL_HAS_MEMBER

}  // namespace detail

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
  if constexpr (detail::HasFaultTolerance<Comm>::value) {
    api.comm_revoke = E::comm_revoke;
    api.comm_agree = E::comm_agree;
    api.comm_shrink = E::comm_shrink;
    api.comm_grow = E::comm_grow;
  }
  if constexpr (detail::HasJoin<Traits>::value) api.comm_join = E::comm_join;
#define BPL_DETAIL_SET_ENTRY(entry)                                                                  \
  if constexpr (detail::HasMember_##entry<Comm>::value) {                                            \
    api.entry = detail::OperationEntry<Traits, decltype(api.entry), &Comm::entry>::call;             \
  }
  BPL_FOR_EACH_PLUGIN_OPERATION_ENTRY(BPL_DETAIL_SET_ENTRY)
#undef BPL_DETAIL_SET_ENTRY
  if constexpr (detail::HasPathOf<Comm>::value) api.comm_path = E::comm_path;
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
  // The plugin tags and explains its operations with the core's identity of them (ABI 1.10).
  if (host_api->struct_size < offsetof(bpl_host_api, current_operation) + sizeof(host_api->current_operation) ||
      host_api->current_operation == nullptr) {
    host_api->set_error((std::string(Traits::kName) + " plugin: needs a backplane core of ABI 1.10 or later (this core "
                         "is ABI " + std::to_string(host_api->abi_major) + "." + std::to_string(host_api->abi_minor) + ")")
                            .c_str());
    return BPL_ERR_ABI_MISMATCH;
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
