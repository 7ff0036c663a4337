#include "work.h"

#include <algorithm>
#include <stdexcept>

namespace backplane::torch_backend {

void CompletionQueue::run() {
  for (;;) {
    c10::intrusive_ptr<BackplaneWork> work;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work->drive();
    work.reset();  // its future's callbacks, and maybe the last of its communicator, go here
    Pending::get().done();
  }
}

// What torch.profiler names an operation: as torch's own backends name theirs ("gloo:all_reduce"), with
// the public function's name where torch's suite looks for it.
const char* profiling_title(c10d::OpType type) {
  switch (type) {
    case c10d::OpType::BROADCAST: return "backplane:broadcast";
    case c10d::OpType::ALLREDUCE: return "backplane:all_reduce";
    case c10d::OpType::ALLREDUCE_COALESCED: return "backplane:all_reduce_coalesced";
    case c10d::OpType::REDUCE: return "backplane:reduce";
    case c10d::OpType::ALLGATHER: return "backplane:all_gather";
    case c10d::OpType::_ALLGATHER_BASE: return "backplane:all_gather_into_tensor";
    case c10d::OpType::ALLGATHER_COALESCED: return "backplane:all_gather_coalesced";
    case c10d::OpType::GATHER: return "backplane:gather";
    case c10d::OpType::SCATTER: return "backplane:scatter";
    case c10d::OpType::REDUCE_SCATTER: return "backplane:reduce_scatter";
    case c10d::OpType::_REDUCE_SCATTER_BASE: return "backplane:reduce_scatter_tensor";
    case c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED: return "backplane:reduce_scatter_tensor_coalesced";
    case c10d::OpType::ALLTOALL_BASE: case c10d::OpType::ALLTOALL: return "backplane:all_to_all";
    case c10d::OpType::SEND: return "backplane:send";
    case c10d::OpType::RECV: return "backplane:recv";
    case c10d::OpType::RECVANYSOURCE: return "backplane:recvAnySource";
    case c10d::OpType::BARRIER: return "backplane:barrier";
    default: return "backplane:coalesced";  // all_gather_into_tensor_coalesced: its own kind in newer torch only
  }
}

BackplaneWork::BackplaneWork(std::shared_ptr<Communicator> communicator, std::shared_ptr<CompletionQueue> completions,
                             int rank, const Operation& operation, Requests requests, std::function<void()> finish,
                             std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep)
    : c10d::Work(rank, operation.type, profiling_title(operation.type), operation.inputs),
      communicator_(std::move(communicator)),
      completions_(std::move(completions)),
      name_(operation.name),
      requests_(std::move(requests)),
      finish_(std::move(finish)),
      outputs_(std::move(outputs)),
      keep_(std::move(keep)) {}

BackplaneWork::~BackplaneWork() {
  std::lock_guard<std::mutex> lock(drive_mutex_);
  free_requests();  // waits, bounded, so no buffer is used after
}

bool BackplaneWork::isCompleted() {
  std::unique_lock<std::mutex> lock(drive_mutex_, std::try_to_lock);
  if (lock.owns_lock() && !requests_.empty() && !handed_off_) {
    bpl_status status = BPL_OK;
    int32_t done = 1;
    while (next_ < requests_.size() && done != 0) {
      status = bpl_request_test(requests_[next_], &done);
      if (status != BPL_OK) break;
      if (done != 0) ++next_;
    }
    if (status != BPL_OK || next_ == requests_.size()) complete(status);
  }
  return c10d::Work::isCompleted();
}

bool BackplaneWork::wait(std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lock(drive_mutex_);
    if (!requests_.empty() && !handed_off_) {
      const bool bounded = timeout != kNoTimeout;
      const auto until = bounded ? std::chrono::steady_clock::now() + timeout : std::chrono::steady_clock::time_point{};
      bpl_status status = BPL_OK;
      for (; next_ < requests_.size(); ++next_) {
        int64_t wait_ms = BPL_TIMEOUT_DEFAULT;
        if (bounded) {
          const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
          wait_ms = std::max<int64_t>(1, left.count());
        }
        status = bpl_request_wait(requests_[next_], wait_ms);
        if (status != BPL_OK) break;
      }
      int32_t done = 0;
      if (status == BPL_ERR_TIMEOUT && bounded && bpl_request_test(requests_[next_], &done) == BPL_OK && done == 0) {
        // A wait shorter than the group's timeout: the operation goes on and may be waited for again.
        throw std::runtime_error("backplane: " + name_ + " has not completed within " + std::to_string(timeout.count()) +
                                 " ms; it is still in flight and may be waited for again");
      }
      complete(status);
    }
  }
  return c10d::Work::wait(timeout);
}

int BackplaneWork::sourceRank() const {
  if (!source_) return c10d::Work::sourceRank();  // throws: only a recv from any rank has one
  return *source_;
}

c10::intrusive_ptr<c10::ivalue::Future> BackplaneWork::getFuture() {
  std::lock_guard<std::mutex> lock(drive_mutex_);
  if (!future_) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    if (requests_.empty()) {
      settle_future();
    } else if (!handed_off_) {
      handed_off_ = true;
      completions_->add(c10::intrusive_ptr<BackplaneWork>::reclaim_copy(this));
    }
  }
  return future_;
}

void BackplaneWork::drive() {
  std::lock_guard<std::mutex> lock(drive_mutex_);
  if (requests_.empty()) return;
  bpl_status status = BPL_OK;
  for (; next_ < requests_.size() && status == BPL_OK; ++next_) status = bpl_request_wait(requests_[next_], BPL_TIMEOUT_DEFAULT);
  complete(status);
}

void BackplaneWork::complete(bpl_status status) {
  const std::string message = bpl_last_error();
  free_requests();
  std::exception_ptr error;
  if (status != BPL_OK) {
    communicator_->record_failure(status);
    // A timeout says so in words, as torch's backends' do (" timed out", "timeout"), for whoever
    // reads the message for it.
    const std::string failed = status == BPL_ERR_TIMEOUT ? " did not complete within its timeout (" : " failed (";
    error = std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                                          "backplane: " + name_ + failed + bpl_status_name(status) + "): " + message));
  } else {
    try {
      if (finish_) finish_();
    } catch (...) {
      error = std::current_exception();
    }
  }
  finish_ = nullptr;  // with keep_, what holds its buffers (a scratch buffer is free again then)
  keep_.clear();
  finish(error);
  if (future_) settle_future();
}

void BackplaneWork::free_requests() {
  for (bpl_request* request : requests_) bpl_request_free(request);
  requests_.clear();
}

void BackplaneWork::settle_future() {
  if (exception_) {
    future_->setError(exception_);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

}  // namespace backplane::torch_backend
