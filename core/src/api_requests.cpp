// The C API of requests: test, wait and free.
#include <algorithm>
#include <string>

#include "backplane/backplane.h"
#include "backplane/plugin.h"
#include "error.h"
#include "handles.h"
#include "operation.h"
#include "validation.h"
#include "log.h"

using namespace backplane;

extern "C" {

/* ---- requests ---- */

bpl_status bpl_request_test(bpl_request* req, int32_t* done) {
  return guarded("bpl_request_test", [&] {
    bpl_request* r = check_request(req);
    const RuntimeCall in_progress(r->comm->runtime);
    REQUIRE(done != nullptr, "done is NULL");
    const bpl_status status = r->comm->runtime->api().request_test(r->impl, done);
    if (status == BPL_OK && *done != 0) trace_request_end(r, BPL_OK);
    return finish_request("bpl_request_test", r, status);
  });
}

bpl_status bpl_request_wait(bpl_request* req, int64_t timeout_ms) {
  return guarded("bpl_request_wait", [&] {
    bpl_request* r = check_request(req);
    const RuntimeCall in_progress(r->comm->runtime);
    REQUIRE(timeout_ms >= BPL_TIMEOUT_DEFAULT,
            "timeout_ms = " + std::to_string(timeout_ms) + ": expected >= 0, or BPL_TIMEOUT_DEFAULT (-1)");
    bpl_comm* comm = r->comm;
    const bpl_plugin_api& api = comm->runtime->api();
    const int64_t comm_timeout_ms = comm->state.timeout_ms();
    timeout_ms = timeout_ms == BPL_TIMEOUT_DEFAULT ? comm_timeout_ms : std::min(timeout_ms, kLongestTimeoutMs);
    // A wait as long as the communicator's timeout that still sees the operation in flight has seen it
    // overrun its bound; a shorter wait is only a poll with a deadline.
    const bool overran_if_timed_out = timeout_ms >= comm_timeout_ms;
    // Such a wait also gives the plugin time to end the operation itself: a plugin that bounds its own
    // operations reports the overrun by T + min(T/4, 1 s), naming the stopped or missing rank it finds
    // (gloo and mpi: explanation_window); its report is better than the core's, which names no one.
    const int64_t report_grace_ms = overran_if_timed_out ? 2 * std::min<int64_t>(comm_timeout_ms / 4, 1000) : 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms + report_grace_ms);
    // The plugin is waited for in short slices so that bpl_comm_abort, from another thread, releases
    // this wait within one slice whatever the backend. A plugin whose comm_abort ends its own waits is
    // waited for at once to the end instead, when the wait is as long as the communicator's bound:
    // told so, it may run the operation on this thread rather than hand it to another.
    const bool abort_ends_plugin_waits = comm->runtime->api().comm_abort != nullptr;
    const int64_t slice_ms = overran_if_timed_out && abort_ends_plugin_waits ? kLongestTimeoutMs : 100;
    for (;;) {
      const int64_t left_ms = std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
      clear_last_error();
      bpl_status status = BPL_ERR_TIMEOUT;
      if (left_ms > 0) status = api.request_wait(r->impl, std::min(left_ms, slice_ms));
      if (status == BPL_OK) trace_request_end(r, BPL_OK);
      if (status != BPL_ERR_TIMEOUT) return finish_request("bpl_request_wait", r, status);
      int32_t done = 0;
      clear_last_error();
      status = api.request_test(r->impl, &done);
      if (done && status == BPL_OK) trace_request_end(r, BPL_OK);  // ended just now
      if (done || status != BPL_OK) return finish_request("bpl_request_wait", r, status);  // ended with TIMEOUT
      const std::string label = "bpl_request_wait: " + operation_label(r->function, comm, r->sequence);
      if (comm->state.aborted()) {
        set_last_error(label + ": released: " + comm->state.cause() + "; the operation may still be in flight "
                               "(bpl_request_free waits for it, bounded by the communicator's timeout)");
        return BPL_ERR_ABORTED;
      }
      if (left_ms == 0) {
        std::string message = label + ": has not ended after " + std::to_string(timeout_ms) + " ms";
        if (overran_if_timed_out) {
          message += ", the communicator's timeout: the communicator is failed";
          comm->state.fail(BPL_ERR_TIMEOUT, message);
        } else {
          message += "; it is still in flight and may be waited for again";
        }
        set_last_error(std::move(message));
        return BPL_ERR_TIMEOUT;
      }
    }
  });
}

bpl_status bpl_request_free(bpl_request* req) {
  return guarded("bpl_request_free", [&] {
    if (req == nullptr) return BPL_OK;
    bpl_request* r = check_request(req);
    const RuntimeCall in_progress(r->comm->runtime, RuntimeCall::kEnds);
    clear_last_error();
    bpl_status status = r->comm->runtime->api().request_free(r->impl);
    if (status == BPL_OK) trace_request_end(r, BPL_OK);  // ended without a wait
    status = finish_request("bpl_request_free", r, status);
    r->magic = 0;
    r->comm->live_requests.fetch_sub(1, std::memory_order_relaxed);
    delete r;
    return status;
  });
}


}  // extern "C"
