// The core's part of every operation on a communicator: its number, label and identity, the
// BPL_DEBUG=detail fingerprint check, the plugin's call, and what a failure does (names the
// operation; fails the communicator for good when the ranks may have diverged, comm_state.h).
#pragma once

#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "error.h"
#include "fingerprint.h"
#include "handles.h"
#include "log.h"
#include "operation_identity.h"
#include "trace.h"

namespace backplane {

// "bpl_allreduce #17 on world (rank 0 of 3)": what every message about an operation starts with.
inline std::string operation_label(const char* function, const bpl_comm* comm, uint64_t sequence) {
  return std::string(function) + " #" + std::to_string(sequence) + " on " + comm->label;
}

// The plugin's message for a failed call, or one made up when it gave none.
inline std::string plugin_message(const bpl_comm* comm, bpl_status status) {
  return last_error().empty() ? std::string(comm->runtime->backend()) + ": failed with " + bpl_status_name(status) +
                                    " (the plugin gave no message)"
                              : last_error();
}

// An operation that ended in failure: the message names it; a failure after which the ranks may
// have diverged fails the communicator for good (comm_state.h), and BPL_TRACE's file is written then,
// while the process still can.
inline bpl_status operation_failed(const std::string& label, bpl_comm* comm, bpl_status status) {
  // Ended by bpl_finalize on another thread: that is the cause, whatever the plugin saw of the abort.
  const bool finalized = status == BPL_ERR_ABORTED && comm->runtime->finalizing.load() && comm->state.aborted();
  std::string message = label + ": " + (finalized ? comm->state.cause() : plugin_message(comm, status));
  if (CommState::poisons(status)) {
    comm->state.fail(status, message);
    if (comm->runtime->trace) comm->runtime->trace->write();
  }
  set_last_error(std::move(message));
  return status;
}

// What BPL_TRACE records of an operation beyond its fingerprint.
struct Traced {
  bpl_collective kind;
  uint64_t bytes;
  bpl_dtype dtype;
};

// The start of an operation in BPL_TRACE's ring (the caller checked that tracing is on).
inline uint64_t trace_begin(bpl_comm* comm, const char* function, uint64_t sequence, const Traced& traced) {
  const char* path = "";
  auto describe = comm->runtime->api().comm_path;
  if (describe != nullptr && traced.kind != BPL_COLL_COMM_SPLIT) {
    if (describe(comm->impl, traced.kind, traced.bytes, &path) != BPL_OK || path == nullptr) path = "";
  }
  const char* op = std::strncmp(function, "bpl_", 4) == 0 ? function + 4 : function;
  return comm->runtime->trace->begin({op, &comm->name, sequence, traced.bytes, traced.dtype, path});
}

// The end of a traced request, the first time it is seen (test, wait or free).
inline void trace_request_end(bpl_request* r, bpl_status status) {
  if (!r->traced) return;
  r->traced = false;
  r->comm->runtime->trace->end(r->trace_ticket, status);
}

// After the plugin ran operation `sequence`: report a failure, or wrap the request it started.
// `trace_ticket` is its BPL_TRACE entry, when traced.
inline bpl_status finish_operation(const char* function, bpl_comm* comm, uint64_t sequence, bpl_status status,
                                   bpl_plugin_request* preq, bpl_request** req, const uint64_t* trace_ticket) {
  Trace* trace = comm->runtime->trace.get();
  if (trace != nullptr && trace_ticket != nullptr && (status != BPL_OK || req == nullptr)) trace->end(*trace_ticket, status);
  if (status != BPL_OK) return operation_failed(operation_label(function, comm, sequence), comm, status);
  if (req != nullptr) {
    if (preq == nullptr) {
      throw Error(BPL_ERR_INTERNAL, std::string("backend '") + comm->runtime->backend() +
                                        "' returned BPL_OK without a request");
    }
    auto* request = new bpl_request;
    request->comm = comm;
    request->impl = preq;
    request->function = function;
    request->sequence = sequence;
    if (trace != nullptr && trace_ticket != nullptr) {
      request->traced = true;
      request->trace_ticket = *trace_ticket;
    }
    comm->live_requests.fetch_add(1, std::memory_order_relaxed);
    *req = request;
  }
  return BPL_OK;
}

// The end of a request-side call (`function` is bpl_request_test, _wait or _free) on request `r`.
inline bpl_status finish_request(const char* function, bpl_request* r, bpl_status status) {
  if (status != BPL_OK) trace_request_end(r, status);
  if (status == BPL_OK) return BPL_OK;
  return operation_failed(std::string(function) + ": " + operation_label(r->function, r->comm, r->sequence), r->comm,
                          status);
}

// BPL_DEBUG=detail: every rank of `comm` shows the others what it is about to run; BPL_OK when all
// agree, else MISMATCH with the report (on every rank: each sees every fingerprint), or the status
// of the exchange itself.
inline bpl_status check_fingerprints(bpl_comm* comm, const Fingerprint& mine) {
  bpl_runtime* rt = comm->runtime;
  if (comm->size == 1) return BPL_OK;
  if (!provides<BPL_COLL_ALLGATHER>(rt) ||
      (rt->caps.dtypes & BPL_BIT(BPL_DTYPE_I64)) == 0) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      log(BPL_LOG_WARN, "core", std::string("BPL_DEBUG=detail: backend '") + rt->backend() +
                                    "' has no allgather of i64 to exchange fingerprints with: collectives are not checked");
    });
    return BPL_OK;
  }
  const FingerprintWords words = encode(mine);
  std::vector<FingerprintWords> all(static_cast<size_t>(comm->size));
  clear_last_error();
  // The check shares the number of the collective it checks (plugin.h: BPL_OPERATION_FINGERPRINT_CHECK).
  Fingerprint check = fingerprint_of(static_cast<bpl_collective>(kFingerprintCheckOp), BPL_DTYPE_I64, kFingerprintWords);
  check.sequence = mine.sequence;
  const OperationScope checking(check);
  const bpl_status status = rt->api().allgather(comm->impl, words.data(), all.data(), kFingerprintWords, BPL_DTYPE_I64,
                                                nullptr);
  if (status != BPL_OK) {
    set_last_error("in the BPL_DEBUG=detail check before it (ranks that do not reach this collective leave the "
                   "others waiting here): " + plugin_message(comm, status));
    return status;
  }
  std::vector<Fingerprint> fingerprints;
  for (int32_t r = 0; r < comm->size; ++r) {
    const std::optional<Fingerprint> theirs = decode(all[static_cast<size_t>(r)]);
    if (!theirs) {
      set_last_error("rank " + std::to_string(r) +
                     " sent no BPL_DEBUG=detail fingerprint: is BPL_DEBUG=detail set on every rank?");
      return BPL_ERR_INTERNAL;
    }
    fingerprints.push_back(*theirs);
  }
  const std::string report = compare(fingerprints);
  if (report.empty()) return BPL_OK;
  set_last_error("BPL_DEBUG=detail: " + report);
  return BPL_ERR_MISMATCH;
}

// Numbers a collective of `comm` (fingerprint.sequence), once, for the core and its plugin alike.
inline Fingerprint numbered(bpl_comm* comm, Fingerprint fingerprint) {
  fingerprint.sequence = static_cast<int64_t>(comm->state.next_collective());
  return fingerprint;
}

// Runs one operation on `comm` after the core's checks of its arguments: refuses it at once if the
// communicator failed or was aborted, numbers it, checks its fingerprint under BPL_DEBUG=detail, then
// calls the plugin (`call(preq)`, preq NULL for a blocking call) with the operation's identity
// (operation_identity.h) and reports the outcome.
template <typename Call>
bpl_status run_operation(const char* function, bpl_comm* comm, Fingerprint fingerprint, const Traced& traced,
                         bpl_request** req, Call&& call) {
  const RuntimeCall in_progress(comm->runtime);
  const bool collective = is_collective(fingerprint.op);
  if (collective) fingerprint = numbered(comm, fingerprint);
  const uint64_t sequence = collective ? static_cast<uint64_t>(fingerprint.sequence) : comm->state.next_point_to_point();
  if (comm->state.failed()) {
    const std::string cause = comm->state.cause();
    set_last_error(operation_label(function, comm, sequence) + ": not started: " +
                   (comm->state.status() == BPL_ERR_ABORTED ? cause : "the communicator failed earlier, at " + cause));
    return comm->state.status();
  }
  if (comm->runtime->debug_detail && collective) {
    const bpl_status checked = check_fingerprints(comm, fingerprint);
    if (checked != BPL_OK) {
      std::string message = last_error();
      set_last_error(operation_label(function, comm, sequence) + ": " + message);
      comm->state.fail(checked, last_error());
      if (comm->runtime->trace) comm->runtime->trace->write();
      return checked;
    }
  }
  std::optional<uint64_t> ticket;
  if (comm->runtime->trace) ticket = trace_begin(comm, function, sequence, traced);
  bpl_plugin_request* preq = nullptr;  // the message is still clear here (guarded() cleared it): no reset
  bpl_status status;
  {
    const OperationScope running(fingerprint);
    status = call(req != nullptr ? &preq : nullptr);
  }
  return finish_operation(function, comm, sequence, status, preq, req, ticket ? &*ticket : nullptr);
}

// Plugin call for functions that are not collectives: prefix the plugin's message with the function.
inline bpl_status forward(const char* function, const bpl_runtime* runtime, bpl_status status) {
  if (status != BPL_OK) {
    std::string message = last_error().empty() ? std::string(runtime->backend()) + ": failed with " +
                                                     bpl_status_name(status)
                                               : last_error();
    set_last_error(std::string(function) + ": " + message);
  }
  return status;
}

}  // namespace backplane
