// Runs a communicator's operations one at a time, in the order they were posted, on the caller's
// thread when nothing is pending (a blocking call pays no thread hand-off) and on a worker thread for
// asynchronous requests. Backends whose library calls block (Gloo) get the request model of
// backplane.h from this; every wait here is bounded.
//
// A small request posted to an idle queue is most often waited for at once (torch.distributed's
// blocking calls post a request and wait for it), and its waiter then runs it itself. Waking the worker
// for it anyway cost more than the operation: on a machine whose cores the ranks already fill, the
// woken worker takes one from a rank for a few microseconds (bench/results/epyc/README.md#2026-11-25-torch-backend).
// Such a request is posted `Start::when_unclaimed`: the worker runs it only if no waiter has taken it
// within kUnclaimedGrace, or as soon as someone tests, frees or briefly waits for it, or posts behind
// it; a loop of them wakes the worker about once per grace, not once per request.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>

#include "backplane/backplane.h"
#include "plugin_support.h"

namespace backplane::plugin {

// How long a thread spins before it sleeps when the event it waits for is typically a few
// microseconds away (the other side of a hand-off): sleeping and waking again costs tens of
// microseconds on a virtual machine.
constexpr std::chrono::microseconds kHandOffSpin{50};

// How late the worker may start a request posted Start::when_unclaimed that nobody waits for (Open
// MPI's non-blocking collectives do not move at all until their caller enters MPI again). A loop of
// such requests wakes the worker about once per grace, each wake costing the ranks tens of
// microseconds where they fill the machine's cores: the longer the grace, the smaller that share.
constexpr std::chrono::milliseconds kUnclaimedGrace{2};

// Spins on `ready()` for up to `limit`; true as soon as it holds.
template <typename Ready>
bool spin_until(Ready&& ready, std::chrono::microseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  do {
    if (ready()) return true;
    std::this_thread::yield();
  } while (std::chrono::steady_clock::now() < until);
  return ready();
}

// One posted operation and, once it ended, its result.
class Operation {
 public:
  explicit Operation(std::function<void()> body) : body_(std::move(body)) {}

  // Blocks until the operation ended or `timeout` passed; true if it ended.
  bool wait_for(std::chrono::milliseconds timeout) {
    if (spin_until([this] { return ended_flag_.load(std::memory_order_acquire); },
                   std::min<std::chrono::microseconds>(kHandOffSpin, timeout))) {
      return true;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    return ended_cv_.wait_for(lock, timeout, [this] { return ended_; });
  }
  // Blocks until the operation ended or its deadline (set when it was queued) passed; true if it ended.
  bool wait_for_deadline() {
    std::unique_lock<std::mutex> lock(mutex_);
    return ended_cv_.wait_until(lock, deadline_, [this] { return ended_; });
  }
  bool ended() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return ended_;
  }
  // Valid once ended(): the operation's status and message.
  bpl_status status() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return status_;
  }
  std::string message() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return message_;
  }

  // Runs the body; `classify` turns what it throws into a status and message.
  template <typename Classify>
  void run(Classify&& classify) {
    bpl_status status = BPL_OK;
    std::string message;
    try {
      body_();
    } catch (...) {
      std::tie(status, message) = classify(std::current_exception());
    }
    body_ = nullptr;  // release captured buffers' owners before waking waiters
    {
      std::lock_guard<std::mutex> lock(mutex_);
      status_ = status;
      message_ = std::move(message);
      ended_ = true;
    }
    ended_flag_.store(true, std::memory_order_release);
    ended_cv_.notify_all();
  }

 private:
  friend class OpQueue;
  std::function<void()> body_;
  // The latest it can end: every operation ahead of it and itself each run within the queue's timeout.
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
  mutable std::mutex mutex_;
  std::condition_variable ended_cv_;
  bool ended_ = false;
  std::atomic<bool> ended_flag_{false};  // ended_, readable without the lock, for spinning waiters
  bpl_status status_ = BPL_OK;
  std::string message_;
};

// Classifies an exception from an operation body into (status, message).
using Classifier = std::function<std::pair<bpl_status, std::string>(std::exception_ptr)>;

class OpQueue {
 public:
  // `op_timeout` bounds one operation; a caller queued behind others waits at most that per operation.
  OpQueue(Classifier classify, std::chrono::milliseconds op_timeout)
      : classify_(std::move(classify)), op_timeout_(op_timeout) {}
  ~OpQueue() { shut_down(); }
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  // Bounds the operations posted from now on.
  void set_op_timeout(std::chrono::milliseconds op_timeout) {
    std::lock_guard<std::mutex> lock(mutex_);
    op_timeout_ = op_timeout;
  }

  // When the worker starts a posted operation that is next in line: at once, or only if no waiter
  // has taken it within kUnclaimedGrace (see the top of this file).
  enum class Start { now, when_unclaimed };

  // Posts `body` to run after everything posted before it; returns at once.
  std::shared_ptr<Operation> post(std::function<void()> body, Start start = Start::now) {
    auto op = std::make_shared<Operation>(std::move(body));
    std::lock_guard<std::mutex> lock(mutex_);
    const auto ahead = static_cast<int64_t>(pending_.size()) + (busy_ ? 1 : 0);
    op->deadline_ = deadline_after(op_timeout_ * (ahead + 1) + std::chrono::seconds(1));
    if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
    pending_.push_back(op);
    queued_.fetch_add(1, std::memory_order_release);
    const auto now = std::chrono::steady_clock::now();
    if (ahead == 0 && start == Start::when_unclaimed) {
      front_due_ = now + kUnclaimedGrace;
      ++deferred_posts_;
      if (worker_asleep_) changed_.notify_all();  // to sleep again with that deadline
    } else {
      // Queued behind another (or not deferrable): everything pending is due.
      front_due_ = now;
      changed_.notify_all();
    }
    return op;
  }

  // Makes the operation next in line due now, if it was waiting to be claimed: someone tests or frees
  // a request, or waits for it without running it.
  void hurry() {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    if (pending_.empty() || front_due_ <= now) return;
    front_due_ = now;
    changed_.notify_all();
  }

  // Runs `body` after everything posted before it and returns when it ended. When the queue is idle
  // it runs right here on the caller's thread, never copied (a small collective's whole cost is a few
  // hundred nanoseconds: no allocation on this path). Throws what `body` threw.
  template <typename Body>
  void run(Body&& body) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!pending_.empty() || busy_) {
        lock.unlock();
        std::shared_ptr<Operation> op = post(std::function<void()>(std::forward<Body>(body)));
        if (!op->wait_for_deadline()) {
          throw QueuedFailure{BPL_ERR_TIMEOUT, "the operation, queued behind others, did not end within their timeouts"};
        }
        if (op->status() != BPL_OK) throw QueuedFailure{op->status(), op->message()};
        return;
      }
      busy_ = true;
    }
    struct Release {
      OpQueue* queue;
      ~Release() {
        std::lock_guard<std::mutex> lock(queue->mutex_);
        queue->busy_ = false;
        if (!queue->pending_.empty()) queue->changed_.notify_all();  // the worker waits for busy_ to clear
      }
    } release{this};
    body();
  }

  // Runs `op` on the caller's thread if it is the next to run and nothing runs now (its waiter got
  // there before the worker): a request waited for to its end costs no thread hand-off. False if the
  // worker has it, or others are ahead. The operation stays bounded by its own timeout.
  bool run_if_next(const std::shared_ptr<Operation>& op) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (busy_ || pending_.empty() || pending_.front() != op) return false;
      pending_.pop_front();
      queued_.fetch_sub(1, std::memory_order_release);
      busy_ = true;
    }
    op->run(classify_);
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
    if (!pending_.empty()) changed_.notify_all();
    return true;
  }

  std::chrono::milliseconds op_timeout() {
    std::lock_guard<std::mutex> lock(mutex_);
    return op_timeout_;
  }

  // Thrown by run() when the body ran on the worker and failed there.
  struct QueuedFailure {
    bpl_status status;
    std::string message;
  };

  // Lets queued operations finish (each bounded by its own timeout), then stops the worker.
  void shut_down() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      changed_.notify_all();
    }
    if (worker_.joinable()) worker_.join();
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    uint64_t deferred_posts_seen = 0;
    for (;;) {
      if (pending_.empty() || busy_) {
        if (stopping_ && pending_.empty()) return;
        // Nothing to run: not waiting on a peer. Right after requests left for their waiters it wakes
        // once more a grace later (a loop of them costs a wake per grace); otherwise only post(),
        // hurry(), the end of an operation run inline, and shut_down() wake it.
        if (deferred_posts_ != deferred_posts_seen) {
          deferred_posts_seen = deferred_posts_;
          changed_.wait_for(lock, kUnclaimedGrace);
        } else {
          worker_asleep_ = true;
          changed_.wait(lock);
          worker_asleep_ = false;
        }
        continue;
      }
      if (!stopping_ && std::chrono::steady_clock::now() < front_due_) {
        changed_.wait_until(lock, front_due_);  // left for its waiter to run: runs here if still unclaimed
        continue;
      }
      std::shared_ptr<Operation> op = pending_.front();
      pending_.pop_front();
      queued_.fetch_sub(1, std::memory_order_release);
      busy_ = true;
      lock.unlock();
      op->run(classify_);
      lock.lock();
      busy_ = false;
      if (pending_.empty() && !stopping_) {
        // A request posted right after the last one ended is common (a loop of async calls): look
        // for it briefly before sleeping.
        lock.unlock();
        spin_until([this] { return queued_.load(std::memory_order_acquire) > 0; }, kHandOffSpin);
        lock.lock();
      }
    }
  }

  Classifier classify_;
  std::chrono::milliseconds op_timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::shared_ptr<Operation>> pending_;
  std::atomic<size_t> queued_{0};  // pending_.size(), readable without the lock, for the spinning worker
  bool busy_ = false;  // an operation is running (on the worker or inline)
  bool stopping_ = false;
  // When the worker may start the operation next in line (see post()).
  std::chrono::steady_clock::time_point front_due_;
  uint64_t deferred_posts_ = 0;  // posts left for their waiters, so far
  bool worker_asleep_ = false;   // the worker sleeps with no deadline: a post must wake it
  std::thread worker_;
};

}  // namespace backplane::plugin
