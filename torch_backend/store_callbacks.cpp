#include "store_callbacks.h"

#include <torch/csrc/distributed/c10d/exception.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace backplane::torch_backend {
namespace {

thread_local std::string last_failure;

// What a c10d::Store's exception means: a timeout (LibTorch 1.13 throws its TimeoutError for a connect
// that timed out, and a plain c10::Error, "Socket Timeout" or "Wait timeout", for a call that did); a
// connection to the store's host that failed (REMOTE, as backplane's own store client says); else IO.
bpl_status status_of(const std::exception& e) {
  if (dynamic_cast<const c10d::TimeoutError*>(&e) != nullptr) return BPL_ERR_TIMEOUT;
  const char* what = e.what();
  if (std::strstr(what, "imeout") != nullptr || std::strstr(what, "imed out") != nullptr) return BPL_ERR_TIMEOUT;
  if (dynamic_cast<const c10::DistNetworkError*>(&e) != nullptr) return BPL_ERR_REMOTE;
  return BPL_ERR_IO;
}

// The exception's message without the backtrace c10's errors append.
std::string message_of(const std::exception& e) {
  const auto* error = dynamic_cast<const c10::Error*>(&e);
  return error != nullptr ? error->what_without_backtrace() : e.what();
}

}  // namespace

// The store and the thread its calls run on, one call at a time.
class StoreCalls {
 public:
  StoreCalls(c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds bound, std::string name)
      : store_(std::move(store)), bound_(bound), name_(std::move(name)) {}

  static void start(const std::shared_ptr<StoreCalls>& calls) {
    std::thread([calls] { calls->serve(); }).detach();
  }
  // Ends the thread once its queue is empty, and waits for that up to the bound (kLongestStop at most): a
  // thread still in a call at exit would race the process's teardown, so only a call to a store that
  // stopped answering outlasts the wait, which then costs a closing job no more than kLongestStop.
  void stop() {
    std::unique_lock<std::mutex> lock(mutex_);
    stopping_ = true;
    changed_.notify_all();
    changed_.wait_for(lock, std::min(bound_, kLongestStop), [&] { return served_; });
  }

  // Runs `body(store)` on the store's thread and waits at most the bound (plus `extra`, a wait's own
  // timeout) for it; its outcome as a status, the message of a failure in last_failure.
  bpl_status run(const char* what, const std::string& key, std::chrono::milliseconds extra,
                 std::function<void(c10d::Store&)> body) {
    auto outcome = std::make_shared<Outcome>();
    std::unique_lock<std::mutex> lock(mutex_);
    if (!broken_.empty()) return fail(BPL_ERR_IO, broken_);
    calls_.push_back([this, outcome, body = std::move(body)] {
      bpl_status status = BPL_OK;
      std::string message;
      try {
        body(*store_);
      } catch (const std::exception& e) {
        status = status_of(e);
        message = message_of(e);
      } catch (...) {
        status = BPL_ERR_INTERNAL;
        message = "unknown exception";
      }
      std::lock_guard<std::mutex> done_lock(mutex_);
      outcome->status = status;
      outcome->message = std::move(message);
      outcome->done = true;
      changed_.notify_all();
    });
    changed_.notify_all();
    const std::chrono::milliseconds bound = bound_ + extra;
    if (!changed_.wait_for(lock, bound, [&] { return outcome->done; })) {
      broken_ = name_ + " stopped answering: " + std::string(what) + " '" + key + "' had no reply within " +
                std::to_string(bound.count()) + " ms (no call to this store is made after that)";
      return fail(BPL_ERR_TIMEOUT, broken_);
    }
    return outcome->status == BPL_OK ? BPL_OK : fail(outcome->status, outcome->message);
  }

 private:
  static constexpr std::chrono::milliseconds kLongestStop{1000};

  struct Outcome {
    bool done = false;
    bpl_status status = BPL_OK;
    std::string message;
  };

  static bpl_status fail(bpl_status status, const std::string& message) {
    last_failure = message;
    return status;
  }

  void serve() {
    for (;;) {
      std::function<void()> call;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || !calls_.empty(); });
        if (calls_.empty()) {
          served_ = true;
          changed_.notify_all();
          return;
        }
        call = std::move(calls_.front());
        calls_.pop_front();
      }
      call();
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
  const std::chrono::milliseconds bound_;
  const std::string name_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> calls_;
  bool stopping_ = false;
  bool served_ = false;  // the thread has left serve()
  std::string broken_;  // set by the first call past its bound
};

namespace {

StoreCalls& calls_of(void* context) { return *static_cast<StoreCalls*>(context); }

// Each body owns what it reads and writes (shared with the caller): a call past its bound may still run
// after its caller has returned.
bpl_status set(void* context, const char* key, const void* value, size_t size) {
  const auto* bytes = static_cast<const uint8_t*>(value);
  return calls_of(context).run("set", key, std::chrono::milliseconds(0),
                               [key = std::string(key), data = std::vector<uint8_t>(bytes, bytes + size)](c10d::Store& store) {
                                 store.set(key, data);
                               });
}

bpl_status get(void* context, const char* key, int64_t timeout_ms, void* value, size_t capacity, size_t* size) {
  auto found = std::make_shared<std::vector<uint8_t>>();
  const std::chrono::milliseconds timeout(timeout_ms);
  const bpl_status status =
      calls_of(context).run("get", key, timeout, [key = std::string(key), timeout, read = capacity > 0, found](c10d::Store& store) {
        store.wait({key}, timeout);
        if (read) *found = store.get(key);
      });
  if (status != BPL_OK) return status;
  *size = found->size();
  if (capacity > 0 && !found->empty()) std::memcpy(value, found->data(), std::min(capacity, found->size()));
  return BPL_OK;
}

bpl_status add(void* context, const char* key, int64_t delta, int64_t* result) {
  auto sum = std::make_shared<int64_t>(0);
  const bpl_status status = calls_of(context).run("add", key, std::chrono::milliseconds(0),
                                                  [key = std::string(key), delta, sum](c10d::Store& store) {
                                                    *sum = store.add(key, delta);
                                                  });
  if (status == BPL_OK) *result = *sum;
  return status;
}

bpl_status check(void* context, const char* key, int32_t* found) {
  auto there = std::make_shared<bool>(false);
  const bpl_status status = calls_of(context).run("check", key, std::chrono::milliseconds(0),
                                                  [key = std::string(key), there](c10d::Store& store) {
                                                    *there = store.check({key});
                                                  });
  if (status == BPL_OK) *found = *there ? 1 : 0;
  return status;
}

const char* last_error(void*) { return last_failure.c_str(); }

}  // namespace

StoreCallbacks::StoreCallbacks(c10::intrusive_ptr<c10d::Store> store)
    : StoreCallbacks(store, std::min<std::chrono::milliseconds>(kCallBound, store->getTimeout() / 4)) {}

StoreCallbacks::StoreCallbacks(c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds call_bound, std::string name)
    : calls_(std::make_shared<StoreCalls>(std::move(store), call_bound, std::move(name))), table_(BPL_STORE_INIT) {
  StoreCalls::start(calls_);
  table_.context = calls_.get();
  table_.set = set;
  table_.get = get;
  table_.add = add;
  table_.check = check;
  table_.last_error = last_error;
}

StoreCallbacks::~StoreCallbacks() { calls_->stop(); }

}  // namespace backplane::torch_backend
