#include "backend.h"

#include "tensor_arguments.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>

namespace backplane::torch_backend {

// The process's backplane runtime, shared by every group torch makes; finalized with the last of them.
class Runtime {
 public:
  Runtime(bpl_runtime* handle, std::unique_ptr<StoreCallbacks> store) : handle_(handle), store_(std::move(store)) {}
  ~Runtime() { bpl_finalize(handle_); }
  bpl_runtime* handle() const { return handle_; }

  // The running one, if a group holds it.
  static std::shared_ptr<Runtime> current() {
    std::lock_guard<std::mutex> lock(mutex());
    return instance().lock();
  }
  static void set_current(const std::shared_ptr<Runtime>& runtime) {
    std::lock_guard<std::mutex> lock(mutex());
    instance() = runtime;
  }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::weak_ptr<Runtime>& instance() {
    static std::weak_ptr<Runtime> runtime;
    return runtime;
  }
  bpl_runtime* handle_;
  std::unique_ptr<StoreCallbacks> store_;  // the world's meeting place, used until bpl_finalize
};

// A group's communicator with what it lives on (the runtime, the store its members met through);
// destroyed with the last of the group and its works, so that no request outlives its communicator.
class Communicator {
 public:
  Communicator(std::shared_ptr<Runtime> runtime, bpl_comm* comm, bool owns_comm, std::unique_ptr<StoreCallbacks> store)
      : runtime_(std::move(runtime)), comm_(comm), owns_comm_(owns_comm), store_(std::move(store)) {}
  ~Communicator() {
    if (owns_comm_) bpl_comm_destroy(comm_);
  }
  bpl_comm* get() const { return comm_; }
  bpl_runtime* runtime() const { return runtime_->handle(); }
  // The status of the first operation of the group that failed (BPL_OK while none has): getError.
  void record_failure(bpl_status status) {
    int none = BPL_OK;
    first_failure_.compare_exchange_strong(none, status);
  }
  bpl_status first_failure() const { return static_cast<bpl_status>(first_failure_.load()); }

 private:
  std::atomic<int> first_failure_{BPL_OK};
  std::shared_ptr<Runtime> runtime_;  // first in, last out: the communicator goes before the runtime
  bpl_comm* comm_;
  bool owns_comm_;
  std::unique_ptr<StoreCallbacks> store_;  // the store this group met through, while it lives
};

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

// Flat buffers for the list forms of the collectives (a list gathered into, a list reduce-scattered,
// ...), reused. A fresh buffer of 32 MiB or more is a fresh mapping (glibc's malloc maps those) whose
// every page faults on first touch: allocated per call, it cost several times the collective itself
// (bench/results/2026-11-25-torch-backend/README.md). A buffer is free again once no tensor uses its
// storage: the works drop theirs when they end.
class ScratchBuffers {
 public:
  // A contiguous tensor of `numel` elements of `dtype`, its values undefined.
  at::Tensor take(int64_t numel, at::ScalarType dtype) {
    const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
    std::lock_guard<std::mutex> lock(mutex_);
    at::Tensor* chosen = nullptr;       // the smallest free buffer that is large enough
    at::Tensor* smaller_free = nullptr;  // else a free one to replace with a larger one
    for (at::Tensor& buffer : buffers_) {
      if (buffer.storage().use_count() != 1) continue;  // a work still holds it
      if (buffer.nbytes() >= bytes) {
        if (chosen == nullptr || buffer.nbytes() < chosen->nbytes()) chosen = &buffer;
      } else {
        smaller_free = &buffer;
      }
    }
    if (chosen == nullptr) {
      if (smaller_free == nullptr && buffers_.size() >= kKept) {
        return at::empty({numel}, at::TensorOptions().dtype(dtype));  // every kept one in use: not kept
      }
      at::Tensor fresh = at::empty({static_cast<int64_t>(bytes)}, at::kByte);
      if (smaller_free != nullptr) {
        *smaller_free = fresh;
        chosen = smaller_free;
      } else {
        buffers_.push_back(fresh);
        chosen = &buffers_.back();
      }
    }
    return view_of(*chosen, numel, dtype);
  }

 private:
  // `numel` elements of `dtype` at the start of `buffer`'s storage. Made without the dispatcher:
  // at::empty and set_ together cost about half a microsecond more per list operation (all_gather of a
  // list of 4 B tensors, 2 ranks, C++ side: 3.4 against 3.9-4.2 µs).
  static at::Tensor view_of(const at::Tensor& buffer, int64_t numel, at::ScalarType dtype) {
    auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(buffer.storage()), buffer.key_set(),
                                                     c10::scalarTypeToTypeMeta(dtype));
    impl->set_sizes_contiguous({numel});
    return at::Tensor(std::move(impl));
  }

  static constexpr size_t kKept = 4;  // operations of list form in flight at once, each with its buffer
  std::mutex mutex_;
  std::vector<at::Tensor> buffers_;
};

namespace {

// From this size of a rank's block, all_gather into a list runs as one broadcast per rank, each into
// its tensor of the list, rather than as an allgather into a flat buffer copied out after: that copy
// (the whole list) costs more than the extra operations' fixed costs from there. On 2 ranks of a Xeon
// VM, four runs, the list's time against the flat buffer's: 256 KiB 0.58-1.01x, 1 MiB 0.61-1.14x,
// 4 MiB 0.38-0.81x, 16 MiB 0.44-0.70x; at 64-128 KiB 1.3-1.8x (bench/results/2026-11-26-torch-backend-3).
constexpr int64_t kBroadcastListBytes = 256 * 1024;


// The tensors' elements in order in `flat` (as many elements as they have together). Contiguous ones of
// flat's dtype are copied as copy_ would, without its dispatch or a slice of `flat` (an all_gather of a
// list of two 4 B tensors took 2.4-3.5 µs less from Python without the slices).
at::Tensor flat_of(const std::vector<at::Tensor>& tensors, at::Tensor flat) {
  int64_t offset = 0;
  for (const at::Tensor& t : tensors) {
    if (t.is_contiguous() && t.scalar_type() == flat.scalar_type()) {
      if (t.numel() > 0) std::memcpy(static_cast<char*>(flat.data_ptr()) + offset * flat.element_size(), t.data_ptr(), t.nbytes());
    } else {
      flat.slice(0, offset, offset + t.numel()).view_as(t).copy_(t);
    }
    offset += t.numel();
  }
  return flat;
}

// `flat`'s elements into the tensors in order (the same shortcut).
void copy_slices(const at::Tensor& flat, const std::vector<at::Tensor>& targets) {
  int64_t offset = 0;
  for (const at::Tensor& t : targets) {
    if (t.is_contiguous() && t.scalar_type() == flat.scalar_type()) {
      if (t.numel() > 0) std::memcpy(t.data_ptr(), static_cast<const char*>(flat.data_ptr()) + offset * flat.element_size(), t.nbytes());
    } else {
      const_cast<at::Tensor&>(t).copy_(flat.slice(0, offset, offset + t.numel()).view_as(t));
    }
    offset += t.numel();
  }
}

int64_t total_numel(const std::vector<at::Tensor>& tensors) {
  int64_t total = 0;
  for (const at::Tensor& t : tensors) total += t.numel();
  return total;
}

}  // namespace

// One posted operation: one backplane request, or several run in order (a list gathered by one
// broadcast per rank). Whoever owns its requests waits for them: the caller (wait, isCompleted), or
// the completion thread once the future was asked for; never both.
class BackplaneWork : public c10d::Work {
 public:
  BackplaneWork(std::shared_ptr<Communicator> communicator, std::shared_ptr<CompletionQueue> completions, int rank,
                c10d::OpType type, const char* name, Requests requests, std::function<void()> finish,
                std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep)
      : c10d::Work(rank, type),
        communicator_(std::move(communicator)),
        completions_(std::move(completions)),
        name_(name),
        requests_(std::move(requests)),
        finish_(std::move(finish)),
        outputs_(std::move(outputs)),
        keep_(std::move(keep)) {}

  ~BackplaneWork() override {
    std::lock_guard<std::mutex> lock(drive_mutex_);
    free_requests();  // waits, bounded, so no buffer is used after
  }

  bool isCompleted() override {
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

  bool wait(std::chrono::milliseconds timeout) override {
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

  std::vector<at::Tensor> result() override { return outputs_; }

  // A recv from any rank's: the sender, written by its request once done (recvAnysource).
  void set_source(std::shared_ptr<int32_t> source) { source_ = std::move(source); }
  int sourceRank() const override {
    if (!source_) return c10d::Work::sourceRank();  // throws: only a recv from any rank has one
    return *source_;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
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

  // The completion thread's part: waits for the requests (each bounded by the communicator's timeout).
  void drive() {
    std::lock_guard<std::mutex> lock(drive_mutex_);
    if (requests_.empty()) return;
    bpl_status status = BPL_OK;
    for (; next_ < requests_.size() && status == BPL_OK; ++next_) status = bpl_request_wait(requests_[next_], BPL_TIMEOUT_DEFAULT);
    complete(status);
  }

 private:
  // With drive_mutex_ held: the requests ended, the first that failed with `status`.
  void complete(bpl_status status) {
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

  // Frees every request; those not ended yet are waited for (bounded) first.
  void free_requests() {
    for (bpl_request* request : requests_) bpl_request_free(request);
    requests_.clear();
  }

  void settle_future() {
    if (exception_) {
      future_->setError(exception_);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
  }

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

c10::intrusive_ptr<c10d::Backend> BackendBackplane::create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                                     int size, std::chrono::milliseconds timeout) {
  auto callbacks = std::make_unique<StoreCallbacks>(store);
  std::shared_ptr<Runtime> runtime = Runtime::current();
  if (!runtime) {
    bpl_init_options options = BPL_INIT_OPTIONS_INIT;
    options.rank = rank;
    options.world_size = size;
    options.timeout_ms = timeout.count();
    options.store = callbacks->table();
    bpl_runtime* handle = nullptr;
    check(bpl_init(&options, &handle), "bpl_init");
    runtime = std::make_shared<Runtime>(handle, std::move(callbacks));
    Runtime::set_current(runtime);
    bpl_comm* world = nullptr;
    check(bpl_comm_world(handle, &world), "bpl_comm_world");
    return c10::make_intrusive<BackendBackplane>(runtime, world, false, store, nullptr, timeout);
  }
  bpl_comm* comm = nullptr;
  check(bpl_comm_create_from_store(runtime->handle(), callbacks->table(), rank, size, &comm), "bpl_comm_create_from_store");
  const bpl_status status = bpl_comm_set_timeout(comm, timeout.count());
  if (status != BPL_OK) {
    bpl_comm_destroy(comm);
    check(status, "bpl_comm_set_timeout");
  }
  return c10::make_intrusive<BackendBackplane>(runtime, comm, true, store, std::move(callbacks), timeout);
}

namespace {
int rank_of(bpl_comm* comm) {
  int32_t rank = 0;
  bpl_comm_rank(comm, &rank);
  return rank;
}
int size_of(bpl_comm* comm) {
  int32_t size = 1;
  bpl_comm_size(comm, &size);
  return size;
}
}  // namespace

BackendBackplane::BackendBackplane(std::shared_ptr<Runtime> runtime, bpl_comm* comm, bool owns_comm,
                                   c10::intrusive_ptr<c10d::Store> group_store, std::unique_ptr<StoreCallbacks> store,
                                   std::chrono::milliseconds timeout)
    : c10d::Backend(rank_of(comm), size_of(comm)),
      communicator_(std::make_shared<Communicator>(std::move(runtime), comm, owns_comm, std::move(store))),
      completions_(std::make_shared<CompletionQueue>()),
      scratch_(std::make_unique<ScratchBuffers>()),
      comm_(comm),
      timeout_(timeout),
      store_(std::move(group_store)) {
  if (!owns_comm) bpl_comm_set_timeout(comm_, timeout.count());
}

BackendBackplane::~BackendBackplane() { completions_->stop(); }

std::string BackendBackplane::describe() const {
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  check(bpl_runtime_describe(communicator_->runtime(), &info), "bpl_runtime_describe");
  return std::string(info.backend) + " (" + info.selection_reason + "): " + info.details;
}

void BackendBackplane::wait_for_completions() { CompletionQueue::wait_until_idle(); }

void BackendBackplane::setTimeout(std::chrono::milliseconds timeout) {
  check(bpl_comm_set_timeout(comm_, timeout.count()), "bpl_comm_set_timeout");
  timeout_ = timeout;
}

c10d::ErrorType BackendBackplane::getError() {
  switch (communicator_->first_failure()) {
    case BPL_OK: return c10d::ErrorType::SUCCESS;
    case BPL_ERR_TIMEOUT: return c10d::ErrorType::TIMEOUT;
    case BPL_ERR_REMOTE: return c10d::ErrorType::REMOTE_ERROR;
    default: return c10d::ErrorType::COMM_ERROR;
  }
}

void BackendBackplane::abort() {
  check(bpl_comm_abort(comm_), "bpl_comm_abort");
  communicator_->record_failure(BPL_ERR_ABORTED);
}

void BackendBackplane::shutdown() { completions_->stop(); }

c10::intrusive_ptr<c10d::Backend> BackendBackplane::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                          const std::vector<int>& ranks,
                                                          const c10::intrusive_ptr<Options>& opts) {
  // `ranks` are the new group's members by their rank here; they alone meet, through `store`.
  const auto me = std::find(ranks.begin(), ranks.end(), getRank());
  if (me == ranks.end()) return nullptr;  // not a member: no backend here
  return create(store, static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()),
                opts ? opts->timeout : timeout_);
}

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

c10::intrusive_ptr<c10d::Work> BackendBackplane::post(c10d::OpType type, const char* name,
                                                           const std::function<bpl_status(bpl_request**)>& start,
                                                           std::function<void()> finish, std::vector<at::Tensor> outputs,
                                                           std::vector<at::Tensor> keep) {
  bpl_request* request = nullptr;
  check(start(&request), name);
  ++sequence_;
  return c10::make_intrusive<BackplaneWork>(communicator_, completions_, getRank(), type, name, Requests{request},
                                            std::move(finish), std::move(outputs), std::move(keep));
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::post_each(c10d::OpType type, const char* name, int count,
                                                                const std::function<bpl_status(int, bpl_request**)>& start,
                                                                std::function<void()> finish, std::vector<at::Tensor> outputs,
                                                                std::vector<at::Tensor> keep) {
  Requests requests;
  for (int i = 0; i < count; ++i) {
    bpl_request* request = nullptr;
    const bpl_status status = start(i, &request);
    if (status != BPL_OK) {
      const std::string message = bpl_last_error();
      for (bpl_request* posted : requests) bpl_request_free(posted);  // waits, bounded, for what was posted
      fail(std::string(name) + " failed (" + bpl_status_name(status) + "): " + message);
    }
    requests.push_back(request);
  }
  ++sequence_;
  return c10::make_intrusive<BackplaneWork>(communicator_, completions_, getRank(), type, name, std::move(requests),
                                            std::move(finish), std::move(outputs), std::move(keep));
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::post_pairs(c10d::OpType type, const char* name,
                                                           const std::vector<at::Tensor>& sources,
                                                           const std::vector<at::Tensor>& results,
                                                           const std::vector<at::Tensor>& outputs,
                                                           const std::function<bpl_status(int, bpl_request**)>& start) {
  std::vector<at::Tensor> keep = sources;
  keep.insert(keep.end(), results.begin(), results.end());
  return post_each(
      type, name, static_cast<int>(results.size()), start,
      [results, outputs] {
        for (size_t i = 0; i < outputs.size(); ++i) copy_back(outputs[i], results[i]);
      },
      outputs, keep);
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::allreduce(std::vector<at::Tensor>& tensors,
                                                                const c10d::AllreduceOptions& opts) {
  const char* op_name = "allreduce";
  if (tensors.empty()) fail("allreduce: no tensor given");
  if (tensors.size() == 1 && tensors[0].is_sparse()) return sparse_allreduce(tensors[0], opts);
  const bpl_dtype dtype = dtype_of(tensors[0], op_name);
  for (size_t i = 1; i < tensors.size(); ++i) require_same(tensors[0], tensors[i], op_name, "tensor " + std::to_string(i));
  std::optional<double> factor;
  bpl_reduce_op op = reduce_op_of(opts.reduceOp, op_name, &factor);
  // Several tensors (as Gloo's CPU allreduce takes): each gets the reduction over all of them on every rank.
  at::Tensor buffer = contiguous(tensors[0]);
  if (tensors.size() > 1) {
    buffer = buffer.clone();
    for (size_t i = 1; i < tensors.size(); ++i) {
      switch (op) {
        case BPL_OP_PROD: buffer.mul_(tensors[i]); break;
        case BPL_OP_MIN: buffer = at::minimum(buffer, tensors[i]); break;
        case BPL_OP_MAX: buffer = at::maximum(buffer, tensors[i]); break;
        default: buffer.add_(tensors[i]); break;
      }
    }
    if (op == BPL_OP_AVG) buffer.div_(static_cast<double>(tensors.size()));
  }
  if (factor) buffer = buffer.mul(*factor);
  const int64_t count = buffer.numel();
  std::vector<at::Tensor> targets = tensors;
  return post(
      c10d::OpType::ALLREDUCE, op_name,
      [&](bpl_request** req) { return bpl_allreduce(comm_, buffer.data_ptr(), buffer.data_ptr(), count, dtype, op, req); },
      [buffer, targets] {
        for (const at::Tensor& t : targets) copy_back(t, buffer);
      },
      tensors, {buffer});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                          const c10d::AllreduceCoalescedOptions& opts) {
  const char* op_name = "allreduce_coalesced";
  if (tensors.empty()) fail("allreduce_coalesced: no tensor given");
  const bpl_dtype dtype = dtype_of(tensors[0], op_name);
  for (size_t i = 1; i < tensors.size(); ++i) {
    if (tensors[i].scalar_type() != tensors[0].scalar_type()) {
      fail(std::string(op_name) + ": tensor " + std::to_string(i) + " is " + std::string(c10::toString(tensors[i].scalar_type())) +
           ", tensor 0 " + std::string(c10::toString(tensors[0].scalar_type())) + ": one dtype per call");
    }
    dtype_of(tensors[i], op_name);
  }
  std::optional<double> factor;
  const bpl_reduce_op op = reduce_op_of(opts.reduceOp, op_name, &factor);
  at::Tensor flat = flat_of(tensors, scratch_->take(total_numel(tensors), tensors[0].scalar_type()));
  if (factor) flat.mul_(*factor);
  const int64_t count = flat.numel();
  std::vector<at::Tensor> targets = tensors;
  return post(
      c10d::OpType::ALLREDUCE_COALESCED, op_name,
      [&](bpl_request** req) { return bpl_allreduce(comm_, flat.data_ptr(), flat.data_ptr(), count, dtype, op, req); },
      [flat, targets] { copy_slices(flat, targets); }, tensors, {flat});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::broadcast(std::vector<at::Tensor>& tensors,
                                                                const c10d::BroadcastOptions& opts) {
  const char* op_name = "broadcast";
  const at::Tensor& tensor = single(tensors, op_name);
  const bpl_dtype dtype = dtype_of(tensor, op_name);
  const int64_t root = checked_rank(opts.rootRank, getSize(), op_name);
  at::Tensor buffer = contiguous(tensor);
  return post(
      c10d::OpType::BROADCAST, op_name,
      [&](bpl_request** req) {
        return bpl_broadcast(comm_, buffer.data_ptr(), buffer.numel(), dtype, static_cast<int32_t>(root), req);
      },
      [buffer, tensor] { copy_back(tensor, buffer); }, tensors, {buffer});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::reduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::ReduceOptions& opts) {
  const char* op_name = "reduce";
  const at::Tensor& tensor = single(tensors, op_name);
  const bpl_dtype dtype = dtype_of(tensor, op_name);
  const int64_t root = checked_rank(opts.rootRank, getSize(), op_name);
  std::optional<double> factor;
  const bpl_reduce_op op = reduce_op_of(opts.reduceOp, op_name, &factor);
  at::Tensor buffer = factor ? tensor.mul(*factor) : contiguous(tensor);
  // Only the root's tensor receives the result (as torch's backends); the others keep their input.
  at::Tensor result = scratch_->take(buffer.numel(), buffer.scalar_type());
  const bool at_root = root == getRank();
  return post(
      c10d::OpType::REDUCE, op_name,
      [&](bpl_request** req) {
        return bpl_reduce(comm_, buffer.data_ptr(), result.data_ptr(), buffer.numel(), dtype, op, static_cast<int32_t>(root), req);
      },
      [result, tensor, at_root] {
        if (at_root) copy_back(tensor, result);
      },
      tensors, {buffer, result});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                                std::vector<at::Tensor>& inputs,
                                                                const c10d::AllgatherOptions&) {
  const char* op_name = "allgather";
  const at::Tensor& input = single(inputs, op_name);
  const bpl_dtype dtype = dtype_of(input, op_name);
  if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize()) {
    fail(std::string(op_name) + ": expected one list of " + std::to_string(getSize()) + " output tensors (one per rank)");
  }
  for (size_t r = 0; r < outputs[0].size(); ++r) require_same(input, outputs[0][r], op_name, "output tensor " + std::to_string(r));
  at::Tensor source = contiguous(input);
  std::vector<at::Tensor> targets = outputs[0];
  if (source.nbytes() >= kBroadcastListBytes) {
    // Each rank's block broadcast by it straight into its output tensor on every rank: no flat buffer
    // to copy out of, which from this size costs more than the operations' fixed costs. Chosen by the
    // size alone, which every rank shares; a tensor of the list that is not contiguous (a layout of
    // this rank's own) receives into a contiguous one, copied into it after.
    std::vector<at::Tensor> blocks;
    blocks.reserve(targets.size());
    for (const at::Tensor& t : targets) blocks.push_back(t.is_contiguous() ? t : at::empty_like(t, at::MemoryFormat::Contiguous));
    copy_back(blocks[static_cast<size_t>(getRank())], source);
    return post_each(
        c10d::OpType::ALLGATHER, op_name, getSize(),
        [&](int root, bpl_request** req) {
          return bpl_broadcast(comm_, blocks[static_cast<size_t>(root)].data_ptr(), source.numel(), dtype, root, req);
        },
        [blocks, targets] {
          for (size_t r = 0; r < targets.size(); ++r) copy_back(targets[r], blocks[r]);
        },
        targets, blocks);
  }
  at::Tensor gathered = scratch_->take(getSize() * input.numel(), input.scalar_type());
  return post(
      c10d::OpType::ALLGATHER, op_name,
      [&](bpl_request** req) { return bpl_allgather(comm_, source.data_ptr(), gathered.data_ptr(), source.numel(), dtype, req); },
      [gathered, targets] { copy_slices(gathered, targets); }, targets, {source, gathered});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::AllgatherOptions&) {
  const char* op_name = "_allgather_base";
  const bpl_dtype dtype = dtype_of(input, op_name);
  dtype_of(output, op_name);
  if (output.scalar_type() != input.scalar_type() || output.numel() != getSize() * input.numel()) {
    fail(std::string(op_name) + ": the output has " + std::to_string(output.numel()) + " elements of " +
         std::string(c10::toString(output.scalar_type())) + "; expected " + std::to_string(getSize() * input.numel()) +
         " (world size x input) of " + std::string(c10::toString(input.scalar_type())));
  }
  at::Tensor source = contiguous(input);
  at::Tensor gathered = contiguous(output);
  return post(
      c10d::OpType::_ALLGATHER_BASE, op_name,
      [&](bpl_request** req) { return bpl_allgather(comm_, source.data_ptr(), gathered.data_ptr(), source.numel(), dtype, req); },
      [gathered, output] { copy_back(output, gathered); }, {output}, {source, gathered});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::AllgatherOptions&) {
  const char* op_name = "allgather_into_tensor_coalesced";
  if (outputs.size() != inputs.size()) {
    fail(std::string(op_name) + ": " + std::to_string(outputs.size()) + " outputs for " + std::to_string(inputs.size()) + " inputs");
  }
  std::vector<at::Tensor> sources, results;
  std::vector<bpl_dtype> dtypes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    dtypes.push_back(dtype_of(inputs[i], op_name));
    if (outputs[i].scalar_type() != inputs[i].scalar_type() || outputs[i].numel() != getSize() * inputs[i].numel()) {
      fail(std::string(op_name) + ": output " + std::to_string(i) + " has " + std::to_string(outputs[i].numel()) +
           " elements; expected " + std::to_string(getSize() * inputs[i].numel()) + " (world size x input " +
           std::to_string(i) + ") of its dtype");
    }
    sources.push_back(contiguous(inputs[i]));
    results.push_back(contiguous(outputs[i]));
  }
  return post_pairs(c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED, op_name, sources, results, outputs,
                    [&](int i, bpl_request** req) {
                      return bpl_allgather(comm_, sources[i].data_ptr(), results[i].data_ptr(), sources[i].numel(),
                                           dtypes[i], req);
                    });
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::ReduceScatterOptions& opts) {
  const char* op_name = "reduce_scatter_tensor_coalesced";
  if (outputs.size() != inputs.size()) {
    fail(std::string(op_name) + ": " + std::to_string(outputs.size()) + " outputs for " + std::to_string(inputs.size()) + " inputs");
  }
  std::optional<double> factor;
  const bpl_reduce_op op = reduce_op_of(opts.reduceOp, op_name, &factor);
  std::vector<at::Tensor> sources, results;
  std::vector<bpl_dtype> dtypes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    dtypes.push_back(dtype_of(outputs[i], op_name));
    if (outputs[i].scalar_type() != inputs[i].scalar_type() || inputs[i].numel() != getSize() * outputs[i].numel()) {
      fail(std::string(op_name) + ": input " + std::to_string(i) + " has " + std::to_string(inputs[i].numel()) +
           " elements; expected " + std::to_string(getSize() * outputs[i].numel()) + " (world size x output " +
           std::to_string(i) + ") of its dtype");
    }
    sources.push_back(factor ? inputs[i].mul(*factor) : contiguous(inputs[i]));
    results.push_back(contiguous(outputs[i]));
  }
  return post_pairs(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, op_name, sources, results, outputs,
                    [&](int i, bpl_request** req) {
                      return bpl_reduce_scatter(comm_, sources[i].data_ptr(), results[i].data_ptr(), results[i].numel(),
                                                dtypes[i], op, req);
                    });
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::allgather_coalesced(std::vector<std::vector<at::Tensor>>& output_lists,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions&) {
  // output_lists[r][i]: rank r's input i.
  const char* op_name = "allgather_coalesced";
  if (output_lists.size() != static_cast<size_t>(getSize())) {
    fail(std::string(op_name) + ": " + std::to_string(output_lists.size()) + " output lists; expected one per rank (" +
         std::to_string(getSize()) + ")");
  }
  for (size_t r = 0; r < output_lists.size(); ++r) {
    if (output_lists[r].size() != inputs.size()) {
      fail(std::string(op_name) + ": output list " + std::to_string(r) + " has " + std::to_string(output_lists[r].size()) +
           " tensors; expected one per input (" + std::to_string(inputs.size()) + ")");
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      require_same(inputs[i], output_lists[r][i], op_name, "output " + std::to_string(i) + " of list " + std::to_string(r));
    }
  }
  // Each input gathered into a flat tensor of world x input, then spread over the lists.
  std::vector<at::Tensor> sources, flats;
  std::vector<bpl_dtype> dtypes;
  for (const at::Tensor& input : inputs) {
    dtypes.push_back(dtype_of(input, op_name));
    sources.push_back(contiguous(input));
    flats.push_back(at::empty({getSize() * input.numel()}, input.options()));
  }
  std::vector<at::Tensor> outputs;
  for (const auto& list : output_lists) outputs.insert(outputs.end(), list.begin(), list.end());
  std::vector<at::Tensor> keep = sources;
  keep.insert(keep.end(), flats.begin(), flats.end());
  return post_each(
      c10d::OpType::ALLGATHER_COALESCED, op_name, static_cast<int>(inputs.size()),
      [&](int i, bpl_request** req) {
        return bpl_allgather(comm_, sources[i].data_ptr(), flats[i].data_ptr(), sources[i].numel(), dtypes[i], req);
      },
      [flats, output_lists] {
        for (size_t i = 0; i < flats.size(); ++i) {
          const at::Tensor blocks = flats[i].view({static_cast<int64_t>(output_lists.size()), -1});
          for (size_t r = 0; r < output_lists.size(); ++r) output_lists[r][i].copy_(blocks[r].view_as(output_lists[r][i]));
        }
      },
      outputs, keep);
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  const char* op_name = "gather";
  const at::Tensor& input = single(inputs, op_name);
  const bpl_dtype dtype = dtype_of(input, op_name);
  const int64_t root = checked_rank(opts.rootRank, getSize(), op_name);
  const bool at_root = root == getRank();
  if (at_root) {
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize()) {
      fail(std::string(op_name) + ": the root expects one list of " + std::to_string(getSize()) + " output tensors");
    }
    for (size_t r = 0; r < outputs[0].size(); ++r) require_same(input, outputs[0][r], op_name, "output tensor " + std::to_string(r));
  } else if (!outputs.empty() && !outputs[0].empty()) {
    fail(std::string(op_name) + ": only the root (rank " + std::to_string(root) + ") gives output tensors");
  }
  at::Tensor source = contiguous(input);
  at::Tensor gathered = at_root ? scratch_->take(getSize() * input.numel(), input.scalar_type()) : at::Tensor();
  std::vector<at::Tensor> targets = at_root ? outputs[0] : std::vector<at::Tensor>{};
  return post(
      c10d::OpType::GATHER, op_name,
      [&](bpl_request** req) {
        return bpl_gather(comm_, source.data_ptr(), at_root ? gathered.data_ptr() : nullptr, source.numel(), dtype,
                          static_cast<int32_t>(root), req);
      },
      [gathered, targets] {
        if (!targets.empty()) copy_slices(gathered, targets);
      },
      targets, {source, gathered});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::scatter(std::vector<at::Tensor>& outputs,
                                                              std::vector<std::vector<at::Tensor>>& inputs,
                                                              const c10d::ScatterOptions& opts) {
  const char* op_name = "scatter";
  const at::Tensor& output = single(outputs, op_name);
  const bpl_dtype dtype = dtype_of(output, op_name);
  const int64_t root = checked_rank(opts.rootRank, getSize(), op_name);
  at::Tensor parts;  // the root's inputs, flat
  if (root == getRank()) {
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize()) {
      fail(std::string(op_name) + ": the root expects one list of " + std::to_string(getSize()) + " input tensors");
    }
    for (size_t r = 0; r < inputs[0].size(); ++r) require_same(output, inputs[0][r], op_name, "input tensor " + std::to_string(r));
    parts = flat_of(inputs[0], scratch_->take(getSize() * output.numel(), output.scalar_type()));
  } else if (!inputs.empty() && !inputs[0].empty()) {
    fail(std::string(op_name) + ": only the root (rank " + std::to_string(root) + ") gives input tensors");
  }
  at::Tensor result = contiguous(output);
  return post(
      c10d::OpType::SCATTER, op_name,
      [&](bpl_request** req) {
        return bpl_scatter(comm_, parts.defined() ? parts.data_ptr() : nullptr, result.data_ptr(), result.numel(), dtype,
                           static_cast<int32_t>(root), req);
      },
      [result, output] { copy_back(output, result); }, outputs, {parts, result});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                                     const c10d::ReduceScatterOptions& opts) {
  const char* op_name = "reduce_scatter";
  const at::Tensor& output = single(outputs, op_name);
  const bpl_dtype dtype = dtype_of(output, op_name);
  if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize()) {
    fail(std::string(op_name) + ": expected one list of " + std::to_string(getSize()) + " input tensors (one per rank)");
  }
  for (size_t r = 0; r < inputs[0].size(); ++r) require_same(output, inputs[0][r], op_name, "input tensor " + std::to_string(r));
  std::optional<double> factor;
  const bpl_reduce_op op = reduce_op_of(opts.reduceOp, op_name, &factor);
  at::Tensor flat = flat_of(inputs[0], scratch_->take(getSize() * output.numel(), output.scalar_type()));
  if (factor) flat.mul_(*factor);
  at::Tensor result = contiguous(output);
  return post(
      c10d::OpType::REDUCE_SCATTER, op_name,
      [&](bpl_request** req) { return bpl_reduce_scatter(comm_, flat.data_ptr(), result.data_ptr(), result.numel(), dtype, op, req); },
      [result, output] { copy_back(output, result); }, outputs, {flat, result});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                           const c10d::ReduceScatterOptions& opts) {
  const char* op_name = "_reduce_scatter_base";
  const bpl_dtype dtype = dtype_of(output, op_name);
  dtype_of(input, op_name);
  if (output.scalar_type() != input.scalar_type() || input.numel() != getSize() * output.numel()) {
    fail(std::string(op_name) + ": the input has " + std::to_string(input.numel()) + " elements; expected " +
         std::to_string(getSize() * output.numel()) + " (world size x output) of the output's dtype");
  }
  std::optional<double> factor;
  const bpl_reduce_op op = reduce_op_of(opts.reduceOp, op_name, &factor);
  at::Tensor source = factor ? input.mul(*factor) : contiguous(input);
  at::Tensor result = contiguous(output);
  return post(
      c10d::OpType::_REDUCE_SCATTER_BASE, op_name,
      [&](bpl_request** req) { return bpl_reduce_scatter(comm_, source.data_ptr(), result.data_ptr(), result.numel(), dtype, op, req); },
      [result, output] { copy_back(output, result); }, {output}, {source, result});
}

namespace {
// Counts and displacements, in elements, of blocks of `sizes` elements laid end to end.
struct Layout {
  std::vector<int64_t> counts, displs;
  explicit Layout(const std::vector<int64_t>& sizes) {
    int64_t next = 0;
    for (int64_t n : sizes) {
      counts.push_back(n);
      displs.push_back(next);
      next += n;
    }
  }
  bool even() const { return std::all_of(counts.begin(), counts.end(), [&](int64_t n) { return n == counts[0]; }); }
};

// all_to_all_single's splits (rows of dim 0 per rank; none: equal) as element counts per rank.
std::vector<int64_t> split_elements(const std::vector<int64_t>& splits, const at::Tensor& t, int size, const char* op,
                                    const char* which) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const int64_t row = rows == 0 ? 0 : t.numel() / rows;
  if (splits.empty()) {
    if (rows % size != 0) {
      fail(std::string(op) + ": the " + which + "'s " + std::to_string(rows) + " rows do not split evenly over " +
           std::to_string(size) + " ranks (give split sizes)");
    }
    return std::vector<int64_t>(static_cast<size_t>(size), rows / size * row);
  }
  if (static_cast<int>(splits.size()) != size) {
    fail(std::string(op) + ": " + std::to_string(splits.size()) + " " + which + " split sizes for " + std::to_string(size) +
         " ranks");
  }
  int64_t total = 0;
  std::vector<int64_t> elements;
  for (int64_t n : splits) {
    if (n < 0) fail(std::string(op) + ": " + which + " split size " + std::to_string(n) + " is negative");
    total += n;
    elements.push_back(n * row);
  }
  if (total != rows) {
    fail(std::string(op) + ": the " + which + " split sizes add up to " + std::to_string(total) + " rows; the " + which +
         " has " + std::to_string(rows));
  }
  return elements;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> BackendBackplane::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                    std::vector<int64_t>& output_splits,
                                                                    std::vector<int64_t>& input_splits,
                                                                    const c10d::AllToAllOptions&) {
  const char* op_name = "alltoall_base";
  const bpl_dtype dtype = dtype_of(input, op_name);
  dtype_of(output, op_name);
  if (output.scalar_type() != input.scalar_type()) {
    fail(std::string(op_name) + ": the output is " + std::string(c10::toString(output.scalar_type())) + ", the input " +
         std::string(c10::toString(input.scalar_type())));
  }
  const int size = getSize();
  const Layout sent(split_elements(input_splits, input, size, op_name, "input"));
  const Layout received(split_elements(output_splits, output, size, op_name, "output"));
  at::Tensor source = contiguous(input);
  at::Tensor result = contiguous(output);
  const bool even = sent.even() && received.even() && sent.counts[0] == received.counts[0];
  return post(
      c10d::OpType::ALLTOALL_BASE, op_name,
      [&](bpl_request** req) {
        if (even) return bpl_alltoall(comm_, source.data_ptr(), result.data_ptr(), sent.counts[0], dtype, req);
        return bpl_alltoallv(comm_, source.data_ptr(), sent.counts.data(), sent.displs.data(), result.data_ptr(),
                             received.counts.data(), received.displs.data(), dtype, req);
      },
      [result, output] { copy_back(output, result); }, {output}, {source, result});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                               const c10d::AllToAllOptions&) {
  const char* op_name = "alltoall";
  const int size = getSize();
  if (static_cast<int>(inputs.size()) != size || static_cast<int>(outputs.size()) != size) {
    fail(std::string(op_name) + ": expected " + std::to_string(size) + " input and output tensors (one per rank), got " +
         std::to_string(inputs.size()) + " and " + std::to_string(outputs.size()));
  }
  const bpl_dtype dtype = dtype_of(inputs[0], op_name);
  std::vector<int64_t> send_sizes, recv_sizes;
  for (int r = 0; r < size; ++r) {
    for (const at::Tensor* t : {&inputs[r], &outputs[r]}) {
      dtype_of(*t, op_name);
      if (t->scalar_type() != inputs[0].scalar_type()) {
        fail(std::string(op_name) + ": tensor " + std::to_string(r) + " is " + std::string(c10::toString(t->scalar_type())) +
             ", input 0 " + std::string(c10::toString(inputs[0].scalar_type())) + ": one dtype per call");
      }
    }
    send_sizes.push_back(inputs[r].numel());
    recv_sizes.push_back(outputs[r].numel());
  }
  const Layout sent(send_sizes), received(recv_sizes);
  at::Tensor source = flat_of(inputs, scratch_->take(total_numel(inputs), inputs[0].scalar_type()));
  at::Tensor result = scratch_->take(total_numel(outputs), inputs[0].scalar_type());
  std::vector<at::Tensor> targets = outputs;
  const bool even = sent.even() && received.even() && sent.counts[0] == received.counts[0];
  return post(
      c10d::OpType::ALLTOALL, op_name,
      [&](bpl_request** req) {
        if (even) return bpl_alltoall(comm_, source.data_ptr(), result.data_ptr(), sent.counts[0], dtype, req);
        return bpl_alltoallv(comm_, source.data_ptr(), sent.counts.data(), sent.displs.data(), result.data_ptr(),
                             received.counts.data(), received.displs.data(), dtype, req);
      },
      [result, targets] { copy_slices(result, targets); }, outputs, {source, result});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::barrier(const c10d::BarrierOptions&) {
  return post(
      c10d::OpType::BARRIER, "barrier", [&](bpl_request** req) { return bpl_barrier(comm_, req); }, nullptr, {}, {});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  const char* op_name = "send";
  const at::Tensor& tensor = single(tensors, op_name);
  const bpl_dtype dtype = dtype_of(tensor, op_name);
  checked_rank(dst_rank, getSize(), op_name, "destination");
  at::Tensor buffer = contiguous(tensor);
  return post(
      c10d::OpType::SEND, op_name,
      [&](bpl_request** req) { return bpl_send(comm_, buffer.data_ptr(), buffer.numel(), dtype, dst_rank, tag, req); }, nullptr,
      tensors, {buffer});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  const char* op_name = "recv";
  const at::Tensor& tensor = single(tensors, op_name);
  const bpl_dtype dtype = dtype_of(tensor, op_name);
  checked_rank(src_rank, getSize(), op_name, "source");
  at::Tensor buffer = contiguous(tensor);
  return post(
      c10d::OpType::RECV, op_name,
      [&](bpl_request** req) { return bpl_recv(comm_, buffer.data_ptr(), buffer.numel(), dtype, src_rank, tag, req); },
      [buffer, tensor] { copy_back(tensor, buffer); }, tensors, {buffer});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const char* op_name = "recv (from any source)";
  const at::Tensor& tensor = single(tensors, op_name);
  const bpl_dtype dtype = dtype_of(tensor, op_name);
  at::Tensor buffer = contiguous(tensor);
  auto source = std::make_shared<int32_t>(-1);
  c10::intrusive_ptr<c10d::Work> work = post(
      c10d::OpType::RECVANYSOURCE, op_name,
      [&](bpl_request** req) {
        return bpl_recv_any(comm_, buffer.data_ptr(), buffer.numel(), dtype, tag, source.get(), req);
      },
      [buffer, tensor] { copy_back(tensor, buffer); }, tensors, {buffer});
  static_cast<BackplaneWork*>(work.get())->set_source(std::move(source));
  return work;
}

}  // namespace backplane::torch_backend
