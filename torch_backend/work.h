// A posted operation's Work, and the queue that completes the works whose futures were asked for.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend.h"
#include "communicator.h"

namespace backplane::torch_backend {

class BackplaneWork;

// Completes, in order and on a thread of its own, the works whose futures were asked for; their
// futures' callbacks (Python's included) run there. Nobody waits for the thread: it holds the queue,
// and ends once the queue is stopped and empty.
class CompletionQueue : public std::enable_shared_from_this<CompletionQueue> {
 public:
  void add(c10::intrusive_ptr<BackplaneWork> work) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!started_) {
      started_ = true;
      std::thread([self = shared_from_this()] { self->run(); }).detach();
    }
    queue_.push_back(std::move(work));
    Pending::get().add();
    ready_.notify_one();
  }
  void stop() {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    ready_.notify_one();
  }
  // Until no queue of the process holds a work.
  static void wait_until_idle() { Pending::get().wait_for_none(); }

 private:
  // Works queued or being completed in the whole process.
  class Pending {
   public:
    static Pending& get() {
      static Pending* pending = new Pending;  // never destroyed: a detached thread may use it at exit
      return *pending;
    }
    void add() {
      std::lock_guard<std::mutex> lock(mutex_);
      ++count_;
    }
    void done() {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--count_ == 0) none_.notify_all();
    }
    void wait_for_none() {
      std::unique_lock<std::mutex> lock(mutex_);
      none_.wait(lock, [&] { return count_ == 0; });  // each work's wait is bounded by its timeout
    }

   private:
    std::mutex mutex_;
    std::condition_variable none_;
    int64_t count_ = 0;
  };

  void run();

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<c10::intrusive_ptr<BackplaneWork>> queue_;
  bool started_ = false;
  bool stopping_ = false;
};

// One posted operation: one backplane request, or several run in order (a list gathered by one
// broadcast per rank). Whoever owns its requests waits for them: the caller (wait, isCompleted), or
// the completion thread once the future was asked for; never both.
class BackplaneWork : public c10d::Work {
 public:
  // `finish` runs once the requests succeeded (copies results into the caller's tensors); `outputs` are
  // the result; `keep` stays alive until the work ends.
  // torch.profiler sees it as "backplane:<operation>" (profiling_title), from now until it ends.
  BackplaneWork(std::shared_ptr<Communicator> communicator, std::shared_ptr<CompletionQueue> completions, int rank,
                const Operation& operation, Requests requests, std::function<void()> finish,
                std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep);
  ~BackplaneWork() override;

  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // A recv from any rank's: the sender, written by its request once done (recvAnysource).
  void set_source(std::shared_ptr<int32_t> source) { source_ = std::move(source); }
  int sourceRank() const override;

  // The completion thread's part: waits for the requests (each bounded by the communicator's timeout).
  void drive();

 private:
  // With drive_mutex_ held: the requests ended, the first that failed with `status`.
  void complete(bpl_status status);
  // Frees every request; those not ended yet are waited for (bounded) first.
  void free_requests();
  void settle_future();

  std::shared_ptr<Communicator> communicator_;  // its requests': released after them
  std::shared_ptr<CompletionQueue> completions_;
  std::string name_;
  std::mutex drive_mutex_;
  Requests requests_;  // in posting order; empty once the work completed
  size_t next_ = 0;    // requests before it have ended
  bool handed_off_ = false;
  std::function<void()> finish_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;
  std::shared_ptr<int32_t> source_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace backplane::torch_backend
