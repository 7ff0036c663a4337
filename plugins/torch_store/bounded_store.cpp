#include "bounded_store.h"

#include <torch/csrc/distributed/c10d/exception.h>

#include <cstring>
#include <stdexcept>
#include <typeinfo>
#include <utility>

#include "plugin_support.h"

namespace backplane::torch_store {

using plugin::Error;

namespace {

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

BoundedStore::BoundedStore(const std::string& host, const c10d::TCPStoreOptions& options,
                           std::chrono::milliseconds operation_timeout, std::string where, std::string host_name)
    : Store(operation_timeout),
      operation_timeout_(operation_timeout),
      where_(std::move(where)),
      host_name_(std::move(host_name)) {
  store_ = c10::make_intrusive<c10d::TCPStore>(host, options);
  // get() waits for its key with the store's own timeout, which re-arms the socket with it too.
  store_->setTimeout(operation_timeout_);
  try {
    arm();
  } catch (const std::exception& e) {
    const std::string what = first_line(e.what());
    if (is_store_timeout(e)) {
      throw Error(BPL_ERR_TIMEOUT, "the store at " + where_ + " did not answer within " +
                                       std::to_string(operation_timeout_.count()) + " ms (BPL_TIMEOUT_MS): its host, " +
                                       host_name_ + ", is stopped or stuck, or what listens there is not a store");
    }
    throw Error(BPL_ERR_IO, "the store at " + where_ + " closed the connection before answering (" + what +
                                "): what listens there is not a store, or its host, " + host_name_ + ", is ending");
  }
}

// An empty wait: answered at once by any store, and it leaves the receive timeout set.
void BoundedStore::arm() { store_->wait({}, operation_timeout_); }

template <typename Call>
auto BoundedStore::bounded(const char* operation, Call&& call) -> decltype(call()) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failed_ != BPL_OK) throw Error(failed_, failure_);
  try {
    return call();
  } catch (const std::exception& e) {
    if (is_store_timeout(e)) {
      failed_ = BPL_ERR_TIMEOUT;
      failure_ = "the store at " + where_ + " did not answer (" + operation + ") within " +
                 std::to_string(operation_timeout_.count()) + " ms: its host, " + host_name_ + ", is stopped or stuck";
    } else {
      failed_ = BPL_ERR_REMOTE;
      failure_ = "the connection to the store at " + where_ + " failed (" + operation + "): " + first_line(e.what()) +
                 ": its host, " + host_name_ + ", has ended or closed it";
    }
    throw Error(failed_, failure_);
  }
}

c10::intrusive_ptr<c10d::Store> BoundedStore::clone() {
  throw plugin::Error(BPL_ERR_UNSUPPORTED, "the store connection to " + where_ + " is not cloned");
}

void BoundedStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  bounded("set", [&] { store_->set(key, value); });
}

std::vector<uint8_t> BoundedStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                              const std::vector<uint8_t>& desired) {
  return bounded("compareSet", [&] { return store_->compareSet(key, expected, desired); });
}

std::vector<uint8_t> BoundedStore::get(const std::string& key) {
  return bounded("get", [&] { return store_->get(key); });
}

int64_t BoundedStore::add(const std::string& key, int64_t value) {
  return bounded("add", [&] { return store_->add(key, value); });
}

bool BoundedStore::deleteKey(const std::string& key) {
  return bounded("deleteKey", [&] { return store_->deleteKey(key); });
}

bool BoundedStore::check(const std::vector<std::string>& keys) {
  return bounded("check", [&] { return store_->check(keys); });
}

int64_t BoundedStore::getNumKeys() {
  return bounded("getNumKeys", [&] { return store_->getNumKeys(); });
}

void BoundedStore::wait(const std::vector<std::string>& keys) { wait(keys, operation_timeout_); }

// A wait that times out leaves the connection out of step (the store answers when the keys come), so
// it too ends the connection: callers wait only for keys that must come, with a bound that means failure.
void BoundedStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  bounded("wait", [&] {
    store_->wait(keys, timeout);
    if (timeout != operation_timeout_) arm();
  });
}

bool is_store_timeout(const std::exception& e) {
  if (dynamic_cast<const c10d::TimeoutError*>(&e) != nullptr) return true;  // a connect that timed out
  // LibTorch 1.13 reports a store call that ran past its timeout as an untyped error (TORCH_CHECK's
  // c10::Error "Socket Timeout", "Wait timeout"): for those only the text tells.
  if (dynamic_cast<const c10::Error*>(&e) == nullptr && typeid(e) != typeid(std::runtime_error)) return false;
  const char* what = e.what();
  return std::strstr(what, "imed out") != nullptr || std::strstr(what, "imeout") != nullptr;
}

}  // namespace backplane::torch_store
