// The C API of communicators: the world, splits, ranks, timeouts, abort, and going on after a failure
// (revoke, agree, shrink; grow and join).
#include <algorithm>
#include <string>
#include <vector>

#include "backplane/backplane.h"
#include "backplane/plugin.h"
#include "error.h"
#include "handles.h"
#include "operation.h"
#include "validation.h"
#include "log.h"

using namespace backplane;

namespace {

// A communicator the plugin has just made, handed to the caller: wrapped, given its timeout, and
// registered so that bpl_finalize destroys one the caller forgets. `store` is the one it was made
// through, kept as long as it lives. On failure the plugin's communicator is destroyed.
bpl_comm* adopt_comm(bpl_runtime* rt, bpl_plugin_comm* impl, std::string name, int64_t timeout_ms,
                     std::unique_ptr<bpl_store> store) {
  bpl_comm* wrapped = nullptr;
  try {
    wrapped = wrap_comm(rt, impl, false, std::move(name), timeout_ms);
    wrapped->store = std::move(store);
    if (auto set_timeout = rt->api().comm_set_timeout) {
      const bpl_status status = set_timeout(impl, timeout_ms);
      if (status != BPL_OK) throw Error(status, "comm_set_timeout on the new communicator failed: " + last_error());
    }
  } catch (...) {
    if (wrapped != nullptr) wrapped->magic = 0;
    delete wrapped;
    rt->api().comm_destroy(impl);
    throw;
  }
  std::lock_guard<std::mutex> lock(rt->mutex);
  rt->split_comms.insert(wrapped);
  return wrapped;
}

}  // namespace

extern "C" {

/* ---- communicators ---- */

bpl_status bpl_comm_world(bpl_runtime* runtime, bpl_comm** out) {
  return guarded("bpl_comm_world", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    REQUIRE(out != nullptr, "out is NULL");
    *out = rt->world;
    return BPL_OK;
  });
}

bpl_status bpl_comm_split(bpl_comm* parent, int32_t color, int32_t key, bpl_comm** out) {
  return guarded("bpl_comm_split", [&] {
    bpl_comm* comm = check_comm(parent);
    REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    REQUIRE(color >= BPL_COLOR_UNDEFINED,
            "color = " + std::to_string(color) + ": expected >= 0, or BPL_COLOR_UNDEFINED (-1)");
    bpl_runtime* rt = comm->runtime;
    auto fn = require_collective<BPL_COLL_COMM_SPLIT>(comm);
    bpl_plugin_comm* child = nullptr;
    bpl_status status = run_operation("bpl_comm_split", comm, fingerprint_of(BPL_COLL_COMM_SPLIT),
                                      Traced{BPL_COLL_COMM_SPLIT, 0, 0}, nullptr,
                                      [&](bpl_plugin_request**) { return fn(comm->impl, color, key, &child); });
    // Every rank of the parent splits, in the same order: the split's number names the children alike.
    const uint32_t split_number = comm->splits.fetch_add(1, std::memory_order_relaxed);
    if (status != BPL_OK) return status;
    if (child == nullptr) return BPL_OK;  // BPL_COLOR_UNDEFINED
    *out = adopt_comm(rt, child, comm->name + "/split" + std::to_string(split_number) + "/color" + std::to_string(color),
                      comm->state.timeout_ms(), nullptr);
    return BPL_OK;
  });
}

bpl_status bpl_comm_create_from_store(bpl_runtime* runtime, const bpl_store* store, int32_t rank, int32_t size,
                                      bpl_comm** out) {
  return guarded("bpl_comm_create_from_store", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    const RuntimeCall in_progress(rt);
    REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    REQUIRE(store != nullptr, "store is NULL");
    std::unique_ptr<bpl_store> copy = read_store(store, "store");
    REQUIRE(size >= 1, "size = " + std::to_string(size) + ": expected at least 1");
    REQUIRE(rank >= 0 && rank < size,
            "rank = " + std::to_string(rank) + ": expected 0.." + std::to_string(size - 1) + " (size " + std::to_string(size) + ")");
    auto fn = rt->api().comm_create_from_store;
    if (fn == nullptr) {
      throw Error(BPL_ERR_UNSUPPORTED, std::string(rt->backend()) + " (plugin ABI " + std::to_string(rt->api().abi_major) +
                                           "." + std::to_string(rt->api().abi_minor) +
                                           ") cannot make a communicator through a store");
    }
    const int64_t timeout_ms = rt->world->state.timeout_ms();
    bpl_plugin_comm* impl = nullptr;
    clear_last_error();
    const bpl_status status = fn(rt->impl, copy.get(), rank, size, timeout_ms, &impl);
    if (status != BPL_OK) return forward("bpl_comm_create_from_store", rt, status);
    // Members number their communicators from a store alike only by the store's keys, which the core
    // does not see: the name says where it came from, the label which rank this is.
    *out = adopt_comm(rt, impl, "store-comm(" + std::to_string(size) + " ranks)", timeout_ms, std::move(copy));
    return BPL_OK;
  });
}

bpl_status bpl_comm_destroy(bpl_comm* comm) {
  return guarded("bpl_comm_destroy", [&] {
    if (comm == nullptr) return BPL_OK;
    check_comm(comm);
    const RuntimeCall in_progress(comm->runtime);
    REQUIRE(!comm->is_world, "comm is the world communicator, which the runtime owns: it ends with bpl_finalize");
    const int64_t pending = comm->live_requests.load();
    REQUIRE(pending == 0, "comm still has " + std::to_string(pending) +
                              " request(s) that were not released: call bpl_request_free on them first");
    {
      std::lock_guard<std::mutex> lock(comm->runtime->mutex);
      comm->runtime->split_comms.erase(comm);
    }
    destroy_comm(comm);
    return BPL_OK;
  });
}

bpl_status bpl_comm_rank(const bpl_comm* comm, int32_t* rank) {
  return guarded("bpl_comm_rank", [&] {
    const bpl_comm* c = check_comm(comm);
    REQUIRE(rank != nullptr, "rank is NULL");
    *rank = c->rank;
    return BPL_OK;
  });
}

bpl_status bpl_comm_size(const bpl_comm* comm, int32_t* size) {
  return guarded("bpl_comm_size", [&] {
    const bpl_comm* c = check_comm(comm);
    REQUIRE(size != nullptr, "size is NULL");
    *size = c->size;
    return BPL_OK;
  });
}


/* ---- communicator timeouts and abort (ABI 1.1) ---- */

bpl_status bpl_comm_set_timeout(bpl_comm* comm, int64_t timeout_ms) {
  return guarded("bpl_comm_set_timeout", [&] {
    bpl_comm* c = check_comm(comm);
    REQUIRE(timeout_ms > 0 || timeout_ms == BPL_TIMEOUT_DEFAULT,
            "timeout_ms = " + std::to_string(timeout_ms) + ": expected > 0 (milliseconds) or BPL_TIMEOUT_DEFAULT (-1)");
    bpl_runtime* rt = c->runtime;
    timeout_ms = timeout_ms == BPL_TIMEOUT_DEFAULT ? rt->launch.timeout_ms : std::min(timeout_ms, kLongestTimeoutMs);
    auto fn = rt->api().comm_set_timeout;
    if (fn == nullptr) {
      throw Error(BPL_ERR_UNSUPPORTED, std::string("backend '") + rt->backend() + "' (plugin ABI " +
                                           std::to_string(rt->api().abi_major) + "." + std::to_string(rt->api().abi_minor) +
                                           ") cannot change a communicator's timeout");
    }
    clear_last_error();
    const bpl_status status = fn(c->impl, timeout_ms);
    if (status == BPL_OK) c->state.set_timeout_ms(timeout_ms);
    return forward("bpl_comm_set_timeout", rt, status);
  });
}

bpl_status bpl_comm_get_timeout(const bpl_comm* comm, int64_t* timeout_ms) {
  return guarded("bpl_comm_get_timeout", [&] {
    const bpl_comm* c = check_comm(comm);
    REQUIRE(timeout_ms != nullptr, "timeout_ms is NULL");
    *timeout_ms = c->state.timeout_ms();
    return BPL_OK;
  });
}

bpl_status bpl_comm_abort(bpl_comm* comm) {
  return guarded("bpl_comm_abort", [&] {
    bpl_comm* c = check_comm(comm);
    if (!c->state.abort()) return BPL_OK;
    bpl_runtime* rt = c->runtime;
    log(BPL_LOG_INFO, "core", "communicator " + c->label + " aborted");
    auto fn = rt->api().comm_abort;
    if (fn == nullptr) return BPL_OK;  // the core alone refuses new operations and releases waits
    clear_last_error();
    return forward("bpl_comm_abort", rt, fn(c->impl));
  });
}


}  // extern "C"


/* ---- going on after a failure (ABI 1.8) ---- */

namespace {

// The plugin's fault-tolerance entry `field`, or UNSUPPORTED naming the backend and what it lacks.
template <typename Fn>
Fn require_fault_tolerance(const bpl_runtime* rt, Fn bpl_plugin_api::*field, const char* function) {
  Fn fn = rt->api().*field;
  if (fn == nullptr) {
    throw Error(BPL_ERR_UNSUPPORTED, std::string(function) + ": backend '" + rt->backend() + "' (plugin ABI " +
                                         std::to_string(rt->api().abi_major) + "." + std::to_string(rt->api().abi_minor) +
                                         ") cannot revoke, agree, shrink or grow (docs/faults.md says which backends can)");
  }
  return fn;
}

// The failed ranks a plugin found, into the caller's optional outputs.
void hand_out_failed(const std::vector<int32_t>& found, int32_t count, int32_t* failed, int32_t* num_failed) {
  if (failed != nullptr) std::copy(found.begin(), found.begin() + count, failed);
  if (num_failed != nullptr) *num_failed = count;
}

}  // namespace

extern "C" {

bpl_status bpl_comm_revoke(bpl_comm* comm) {
  return guarded("bpl_comm_revoke", [&] {
    bpl_comm* c = check_comm(comm);
    const RuntimeCall in_progress(c->runtime);
    bpl_runtime* rt = c->runtime;
    auto fn = require_fault_tolerance(rt, &bpl_plugin_api::comm_revoke, "bpl_comm_revoke");
    if (!c->state.revoke(c->rank)) return BPL_OK;
    log(BPL_LOG_INFO, "core", "communicator " + c->label + " revoked by this rank");
    clear_last_error();
    return forward("bpl_comm_revoke", rt, fn(c->impl));
  });
}

bpl_status bpl_comm_agree(bpl_comm* comm, int32_t* flags, int32_t* failed, int32_t* num_failed) {
  return guarded("bpl_comm_agree", [&] {
    bpl_comm* c = check_comm(comm);
    const RuntimeCall in_progress(c->runtime);
    REQUIRE(flags != nullptr, "flags is NULL");
    bpl_runtime* rt = c->runtime;
    auto fn = require_fault_tolerance(rt, &bpl_plugin_api::comm_agree, "bpl_comm_agree");
    std::vector<int32_t> found(static_cast<size_t>(c->size), -1);
    int32_t count = 0;
    clear_last_error();
    const bpl_status status = fn(c->impl, flags, found.data(), &count);
    if (status != BPL_OK) return forward(("bpl_comm_agree on " + c->label).c_str(), rt, status);
    hand_out_failed(found, count, failed, num_failed);
    return BPL_OK;
  });
}

bpl_status bpl_comm_shrink(bpl_comm* comm, int32_t* failed, int32_t* num_failed, bpl_comm** out) {
  return guarded("bpl_comm_shrink", [&] {
    bpl_comm* c = check_comm(comm);
    const RuntimeCall in_progress(c->runtime);
    REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    bpl_runtime* rt = c->runtime;
    auto fn = require_fault_tolerance(rt, &bpl_plugin_api::comm_shrink, "bpl_comm_shrink");
    std::vector<int32_t> found(static_cast<size_t>(c->size), -1);
    int32_t count = 0;
    bpl_plugin_comm* impl = nullptr;
    clear_last_error();
    const bpl_status status = fn(c->impl, found.data(), &count, &impl);
    // Every survivor shrinks in the same order: the number names the new communicator alike on each.
    const uint32_t shrink_number = c->shrinks.fetch_add(1, std::memory_order_relaxed);
    if (status != BPL_OK) return forward(("bpl_comm_shrink on " + c->label).c_str(), rt, status);
    // A communicator made through a caller's store shrinks through it too: it must outlive both.
    *out = adopt_comm(rt, impl, c->name + "/shrink" + std::to_string(shrink_number), c->state.timeout_ms(),
                      c->store ? std::make_unique<bpl_store>(*c->store) : nullptr);
    hand_out_failed(found, count, failed, num_failed);
    return BPL_OK;
  });
}

bpl_status bpl_comm_grow(bpl_comm* comm, int32_t joiners, bpl_comm** out) {
  return guarded("bpl_comm_grow", [&] {
    bpl_comm* c = check_comm(comm);
    const RuntimeCall in_progress(c->runtime);
    REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    REQUIRE(joiners >= 1, "joiners = " + std::to_string(joiners) + ": expected at least 1");
    bpl_runtime* rt = c->runtime;
    auto fn = require_fault_tolerance(rt, &bpl_plugin_api::comm_grow, "bpl_comm_grow");
    bpl_plugin_comm* impl = nullptr;
    clear_last_error();
    const bpl_status status = fn(c->impl, joiners, &impl);
    const uint32_t grow_number = c->grows.fetch_add(1, std::memory_order_relaxed);
    if (status != BPL_OK) return forward(("bpl_comm_grow on " + c->label).c_str(), rt, status);
    *out = adopt_comm(rt, impl, c->name + "/grow" + std::to_string(grow_number), c->state.timeout_ms(),
                      c->store ? std::make_unique<bpl_store>(*c->store) : nullptr);
    return BPL_OK;
  });
}

bpl_status bpl_comm_join(bpl_runtime* runtime, bpl_comm** out) {
  return guarded("bpl_comm_join", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    const RuntimeCall in_progress(rt);
    REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    auto fn = require_fault_tolerance(rt, &bpl_plugin_api::comm_join, "bpl_comm_join");
    const int64_t timeout_ms = rt->world->state.timeout_ms();
    bpl_plugin_comm* impl = nullptr;
    clear_last_error();
    const bpl_status status = fn(rt->impl, timeout_ms, &impl);
    if (status != BPL_OK) return forward("bpl_comm_join", rt, status);
    // The members name it by how it was grown, which a newcomer does not know.
    *out = adopt_comm(rt, impl, "joined", timeout_ms, nullptr);
    return BPL_OK;
  });
}

}  // extern "C"
