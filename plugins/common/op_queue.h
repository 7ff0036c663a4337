// Runs a communicator's operations one at a time, in the order they were posted, on the caller's
// thread when nothing is pending (a blocking call pays no thread hand-off) and on a worker thread for
// asynchronous requests. Backends whose library calls block (Gloo) get the request model of
// backplane.h from this; every wait here is bounded.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
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

  // Posts `body` to run after everything posted before it; returns at once.
  std::shared_ptr<Operation> post(std::function<void()> body) {
    auto op = std::make_shared<Operation>(std::move(body));
    std::lock_guard<std::mutex> lock(mutex_);
    const auto ahead = static_cast<int64_t>(pending_.size()) + (busy_ ? 1 : 0);
    op->deadline_ = deadline_after(op_timeout_ * (ahead + 1) + std::chrono::seconds(1));
    if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
    pending_.push_back(op);
    queued_.fetch_add(1, std::memory_order_release);
    changed_.notify_all();
    return op;
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
    for (;;) {
      // Idle, not waiting on a peer: post() and shut_down() wake it.
      changed_.wait(lock, [this] { return (!pending_.empty() && !busy_) || (stopping_ && pending_.empty()); });
      if (pending_.empty()) return;  // stopping
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
  std::thread worker_;
};

}  // namespace backplane::plugin
