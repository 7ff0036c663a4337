// What the gloo communicator's files share (gloo_comm.cpp, gloo_collectives.cpp,
// gloo_point_to_point.cpp, gloo_failures.cpp): its requests, a collective queued to the communicator's
// OpQueue (QueuedRequest) and a send or recv posted to Gloo at once (PointToPointRequest); `classify`,
// what an operation threw as its status and message; a socket's address.
#pragma once

#include <gloo/common/error.h>
#include <gloo/transport/tcp/address.h>

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "gloo_comm.h"
#include "plugin_support.h"

namespace backplane::gloo_plugin {

inline std::pair<bpl_status, std::string> classify(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::bad_alloc&) {
    return {BPL_ERR_OUT_OF_MEMORY, "out of memory"};
  } catch (const std::exception& e) {
    return {classify_exception(e), e.what()};
  } catch (...) {
    return {BPL_ERR_INTERNAL, "unknown exception"};
  }
}

// A collective posted to the communicator's queue (`queue`, which outlives its requests). A wait for
// its end (as long as the operation's own bound, or longer) that finds it next in line, not yet taken
// by the worker, runs it on the waiting thread; a shorter wait only waits, so that it returns at its
// timeout with the operation in flight.
class QueuedRequest : public Request {
 public:
  explicit QueuedRequest(std::shared_ptr<plugin::Operation> op, plugin::OpQueue* queue = nullptr)
      : op_(std::move(op)), queue_(queue) {}
  bpl_status test(int32_t* done) override {
    *done = op_->ended() ? 1 : 0;
    if (!*done && queue_ != nullptr) queue_->hurry();  // whoever polls expects it to move now
    return *done ? result() : BPL_OK;
  }
  bpl_status wait(std::chrono::milliseconds timeout) override {
    if (queue_ != nullptr && !op_->ended()) {
      if (timeout < queue_->op_timeout() || !queue_->run_if_next(op_)) queue_->hurry();
    }
    if (!op_->wait_for(timeout)) {
      plugin::host()->set_error(("gloo: the operation has not ended after " + std::to_string(timeout.count()) +
                                 " ms; it is still in flight")
                                    .c_str());
      return BPL_ERR_TIMEOUT;
    }
    return result();
  }
  bpl_status finish() override {
    if (queue_ != nullptr && !op_->ended()) queue_->hurry();
    if (op_->wait_for_deadline()) return BPL_OK;
    plugin::host()->set_error("gloo: the operation did not end within its timeout; its buffers may still be in use");
    return BPL_ERR_TIMEOUT;
  }

 private:
  bpl_status result() {
    if (op_->status() != BPL_OK) plugin::host()->set_error(("gloo: " + op_->message()).c_str());
    return op_->status();
  }
  std::shared_ptr<plugin::Operation> op_;
  plugin::OpQueue* queue_;
};

// An asynchronous send or recv over Gloo's pairs, posted at once (Gloo's thread moves its bytes). Its
// completion (`complete`, which waits within the communicator's timeout) runs on the thread that waits
// for the request at least that long: the usual post-then-wait starts no thread. Gloo's wait cannot be
// polled, and one with a shorter timeout fails the whole context, so a request tested, or waited for
// less, has its completion run on a thread of its own, started then.
class PointToPointRequest : public Request {
 public:
  PointToPointRequest(std::function<void()> complete, std::chrono::milliseconds op_timeout)
      : op_(std::make_shared<plugin::Operation>(std::move(complete))), op_timeout_(op_timeout) {}
  ~PointToPointRequest() override {
    if (waiter_.joinable()) waiter_.join();
  }
  bpl_status test(int32_t* done) override {
    complete_elsewhere();
    return QueuedRequest(op_).test(done);
  }
  bpl_status wait(std::chrono::milliseconds timeout) override {
    if (timeout >= op_timeout_ && claim()) {
      op_->run(classify);
    } else {
      complete_elsewhere();
    }
    return QueuedRequest(op_).wait(timeout);
  }
  bpl_status finish() override {
    if (claim()) op_->run(classify);  // never waited for: completed here, within the timeout
    if (waiter_.joinable()) waiter_.join();  // the waiter ends within the communicator's timeout
    return BPL_OK;
  }

 private:
  // Whether this caller takes the completion on (only the first does).
  bool claim() { return !claimed_.exchange(true); }
  void complete_elsewhere() {
    if (claim()) waiter_ = std::thread([op = op_] { op->run(classify); });
  }

  std::shared_ptr<plugin::Operation> op_;
  std::chrono::milliseconds op_timeout_;
  std::atomic<bool> claimed_{false};
  std::thread waiter_;
};

inline std::string address_of(int fd, bool local) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  const int got = local ? ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length)
                        : ::getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length);
  if (got != 0 || (address.ss_family != AF_INET && address.ss_family != AF_INET6)) return "";
  return ::gloo::transport::tcp::Address(address).str();
}

}  // namespace backplane::gloo_plugin
