// A request whose operation the backend moves on only when asked (MPI progresses inside its calls; the
// Neuron runtime is asked whether a sequence number completed): one state machine for both, with one
// error convention, that of every plugin entry: a failure is thrown as Error, and the entry (guarded)
// turns it into the status and the thread's last error.
//
// A subclass says how to move its operation on (poll, which calls finish once it ended) and what a
// deadline that passed means (expire). The operation is bounded by the communicator's timeout from
// its start; past that it ends with BPL_ERR_TIMEOUT, but the backend may still own its buffers
// (owned_by_backend), and a freed request is then handed to its communicator to keep (abandon).
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "backplane/plugin.h"
#include "plugin_support.h"

namespace backplane::plugin {

// How a rank waits for a backend that progresses only when asked: it asks without pause for as long as
// the operation may be moving its bytes or its peer may be back on its core within a slice, 2 ms plus
// 1 ns a byte (a transfer at 1 GB/s), then with pauses of 50 and 100 us for 20 ms, then with pauses
// that double to 1 ms. Beside busy processes a peer may be off its core for milliseconds: a rank that
// spins that long holds a core from the peer or from what the peer waits behind, and a rank asleep for
// a millisecond when its peer comes back costs the peer that millisecond; short pauses let the
// scheduler hand the core back soon after the peer comes. A peer that is stopped, gone or far behind
// then costs this rank about one question a millisecond
// (bench/results/design-choices.md#waiting-on-a-backend-that-progresses-when-asked).
// A helper's wait (a thread that waits for a request another thread posted, as the torch backend's
// completion thread does while its caller goes on computing: a DDP backward pass) spins only a share
// of that, the same for every helper of the process: halved each time a helper's spin ran out (to 1/40
// at least), grown by 1/40 each time a helper's wait that had read the clock ended within its spin.
// Beside busy processes the peers come late, and a helper that spins holds a core from its own
// caller; on a quiet machine helpers' waits end within the spin and it stays whole (a helper that
// paused there cost a DDP step its overlap).
// While it asks without pause it yields the core now and then only where
// the job's ranks outnumber this machine's cores (the peer it waits for may need the core), as Open
// MPI's progress loop does: a yield hands the core to whatever else runs here, and with a busy process
// beside the ranks that costs a scheduler slice (milliseconds) per operation.
class Backoff {
 public:
  // Set once by a plugin that knows how its job sits on the machine (default: yield, the safe choice).
  static std::atomic<bool>& yield_while_spinning() {
    static std::atomic<bool> yield{true};
    return yield;
  }

  // The clock is first read at the 64th pause (a wait that ends sooner never reads it: a read costs
  // about what a question does). `helper`: the waiting thread did not post the request.
  explicit Backoff(size_t bytes, bool helper = false)
      : helper_share_(helper ? helper_share().load(std::memory_order_relaxed) : kWholeShare),
        spin_for_((std::chrono::nanoseconds(kSpin) + std::chrono::nanoseconds(std::min<size_t>(bytes, size_t{1} << 40))) *
                  helper_share_ / kWholeShare),
        helper_(helper) {}
  // A helper's wait that read the clock and ended within its spin grows the helpers' share.
  ~Backoff() {
    if (helper_ && spins_ >= 64 && pause_.count() == 0 && helper_share_ < kWholeShare) {
      helper_share().store(helper_share_ + 1, std::memory_order_relaxed);
    }
  }
  Backoff(const Backoff&) = delete;
  Backoff& operator=(const Backoff&) = delete;
  // Whether the waits have begun to sleep between questions (each then reads the clock anyway).
  bool sleeping() const { return pause_.count() != 0; }
  void pause() {
    if (pause_.count() == 0) {
      if ((++spins_ & 63) != 0) return;
      const auto now = std::chrono::steady_clock::now();
      if (spins_ == 64) spin_until_ = now + spin_for_;
      if (now < spin_until_) {
        if (yield_while_spinning().load(std::memory_order_relaxed)) sched_yield();
        return;
      }
      pause_ = kFirstPause;
      short_pauses_until_ = now + kShortPausesFor;
      if (helper_) helper_share().store(std::max<unsigned>(1, helper_share_ / 2), std::memory_order_relaxed);
    }
    std::this_thread::sleep_for(pause_);
    const bool short_pauses = pause_ < kShortPauseMax || std::chrono::steady_clock::now() < short_pauses_until_;
    pause_ = std::min(2 * pause_, short_pauses ? kShortPauseMax : kLongPauseMax);
  }

 private:
  static constexpr std::chrono::milliseconds kSpin{2};
  static constexpr unsigned kWholeShare = 40;  // helpers spin helper_share() / kWholeShare of the spin
  static constexpr std::chrono::microseconds kFirstPause{50};
  static constexpr std::chrono::microseconds kShortPauseMax{100};
  static constexpr std::chrono::milliseconds kShortPausesFor{20};
  static constexpr std::chrono::microseconds kLongPauseMax{1000};

  static std::atomic<unsigned>& helper_share() {
    static std::atomic<unsigned> share{kWholeShare};
    return share;
  }

  unsigned helper_share_;
  std::chrono::nanoseconds spin_for_;
  bool helper_;
  std::chrono::steady_clock::time_point spin_until_, short_pauses_until_;
  std::chrono::microseconds pause_{0};
  unsigned spins_ = 0;
};

class PolledRequest {
 public:
  // `op` names the operation in messages (a string literal); `bytes` sizes the busy part of a wait;
  // `timeout` bounds the operation from its start (start_clock).
  PolledRequest(const char* op, std::chrono::milliseconds timeout, size_t bytes)
      : op_(op), bytes_(bytes), timeout_(timeout) {}
  virtual ~PolledRequest() = default;
  PolledRequest(const PolledRequest&) = delete;
  PolledRequest& operator=(const PolledRequest&) = delete;

  // *done = 1 once the operation ended: complete, failed, or past its deadline (then BPL_ERR_TIMEOUT,
  // as expire explains it). A failure is thrown, on this and every later call.
  bpl_status test(int32_t* done) {
    if (!done_) {
      poll();
      if (!done_) {
        const auto now = std::chrono::steady_clock::now();
        start_clock(now);
        if (now >= deadline_) expire();
      }
    }
    *done = done_ ? 1 : 0;
    if (done_ && status_ != BPL_OK) throw Error(status_, message_);
    return BPL_OK;
  }

  // Tests until done or `timeout` passes (BPL_ERR_TIMEOUT; the request stays in flight), or, when
  // `released_by_abort`, until the communicator is aborted (BPL_ERR_ABORTED; likewise).
  bpl_status wait(std::chrono::milliseconds timeout, bool released_by_abort = true) {
    std::chrono::steady_clock::time_point give_up{};  // from the clock's first read
    Backoff backoff(bytes_, std::this_thread::get_id() != poster_);
    for (unsigned polls = 0;; ++polls) {
      if (!done_) poll();
      // While it asks without pause, the clock is read every 64th question only: a read costs about
      // what a question does, and a deadline is a matter of milliseconds.
      const bool read_clock = (polls & 63) == 63 || backoff.sleeping();
      const auto now = read_clock ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
      if (read_clock && give_up == std::chrono::steady_clock::time_point{}) {
        give_up = deadline_after(timeout, now);
        start_clock(now);
      }
      if (!done_ && read_clock && now >= deadline_) expire();
      if (done_) {
        if (status_ != BPL_OK) throw Error(status_, message_);
        return BPL_OK;
      }
      // An abort is looked for when the clock is read (every 64th question, a few microseconds apart):
      // no caller needs its release sooner, and asking at every question adds a virtual call to each.
      if (released_by_abort && read_clock && aborted()) {
        throw Error(BPL_ERR_ABORTED, std::string(op_) + " released by bpl_comm_abort; " + uncancellable());
      }
      if (read_clock && now >= give_up) {
        throw Error(BPL_ERR_TIMEOUT, std::string(op_) + " has not completed after " + std::to_string(timeout.count()) +
                                         " ms; it is still in flight");
      }
      backoff.pause();
    }
  }

  // Starts the operation's deadline (its timeout from `now`) unless it started: a request handed to
  // its caller starts it when posted; a blocking one at its wait's first reading of the clock, a
  // moment later (a wait that ends sooner never reads the clock: a read costs about what a question does).
  void start_clock(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) {
    if (deadline_ == std::chrono::steady_clock::time_point{}) deadline_ = deadline_after(timeout_, now);
  }

  // True while the backend may still use the operation's buffers: not ended, or ended by its deadline.
  bool owned_by_backend() const { return !done_ || expired_; }
  const std::string& message() const { return message_; }
  const char* op() const { return op_; }

  // bpl_request_free: waits for the operation to end (bounded by its own deadline; an abort does not
  // cut it short, so that no buffer is touched after this returns). One the backend still owns goes to
  // its communicator (`keep`), and its failure is reported.
  template <typename Request, typename Keep>
  static bpl_status free(std::unique_ptr<Request> request, Keep&& keep) {
    PolledRequest& base = *request;
    try {
      base.wait(base.timeout() + std::chrono::milliseconds(1), /*released_by_abort=*/false);
    } catch (const Error&) {
      if (base.owned_by_backend()) {
        if (!base.done_) base.expire();
        const Error failure(base.status_ != BPL_OK ? base.status_ : BPL_ERR_TIMEOUT, base.message_);
        keep(std::move(request));
        throw failure;
      }
      // An operation that failed is over: nothing more to report at free.
    }
    return BPL_OK;
  }

 protected:
  // Moves the operation on; calls finish once it ended.
  virtual void poll() = 0;
  // The deadline passed and the operation did not end: ends it with BPL_ERR_TIMEOUT and says why,
  // through expired(). The backend keeps it.
  virtual void expire() = 0;
  // The communicator's timeout (what bounds the operation) and whether it was aborted.
  virtual std::chrono::milliseconds timeout() const = 0;
  virtual bool aborted() const { return false; }
  // What a caller released by an abort is told about the operation.
  virtual std::string uncancellable() const { return "the backend cannot cancel it, and keeps its buffers"; }

  // The outcome is written before done_ is set: a thread that sees done_ sees it (a plugin may move a
  // request on from another thread's wait).
  void finish(bpl_status status, std::string message) {
    status_ = status;
    message_ = std::move(message);
    done_.store(true, std::memory_order_release);
  }
  void expired(bpl_status status, std::string message) {
    expired_ = true;
    finish(status, std::move(message));
  }
  bool done() const { return done_.load(std::memory_order_acquire); }
  bpl_status status() const { return status_; }

 private:
  const char* op_;
  size_t bytes_;
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point deadline_{};  // {} until start_clock
  const std::thread::id poster_ = std::this_thread::get_id();  // a wait on another thread is a helper's
  std::atomic<bool> done_{false};
  bool expired_ = false;
  bpl_status status_ = BPL_OK;
  std::string message_;
};

}  // namespace backplane::plugin
