// The client of backplane's TCP store (tcp_store.h): a non-blocking socket, every wait a poll() with
// what is left of the call's deadline.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "tcp_store.h"
#include "tcp_store_wire.h"

namespace backplane::gloo_plugin {
namespace {

using Clock = std::chrono::steady_clock;
using plugin::Error;

enum class Io { kDone, kTimedOut, kClosed, kFailed };

// Waits until `fd` is ready for `events` or `deadline` passes.
bool ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left < 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left + 1, 60'000)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // the next send or recv says what is wrong
  }
}

Io send_all(int fd, const uint8_t* data, size_t size, Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < size) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!ready(fd, POLLOUT, deadline)) return Io::kTimedOut;
    } else {
      return Io::kFailed;
    }
  }
  return Io::kDone;
}

Io receive_all(int fd, uint8_t* data, size_t size, Clock::time_point deadline) {
  size_t got = 0;
  while (got < size) {
    const ssize_t n = ::recv(fd, data + got, size - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n == 0) {
      return Io::kClosed;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!ready(fd, POLLIN, deadline)) return Io::kTimedOut;
    } else {
      return Io::kFailed;
    }
  }
  return Io::kDone;
}

// One attempt to connect to any address of host:port within `deadline`; -1 and `why` if none took it.
int connect_once(const std::string& host, uint16_t port, Clock::time_point deadline, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (error != 0) {
    why = error == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(error);
    return -1;
  }
  int connected = -1;
  for (addrinfo* a = found; a != nullptr && connected < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int result = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (result != 0 && errno == EINPROGRESS) {
      if (ready(fd, POLLOUT, deadline)) {
        socklen_t length = sizeof(result);
        if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &result, &length) != 0) result = errno;
        errno = result;
      } else {
        errno = ETIMEDOUT;
        result = -1;
      }
    }
    if (result == 0) {
      connected = fd;
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  return connected;
}

}  // namespace

TcpStoreClient::TcpStoreClient(const std::string& host, uint16_t port, std::chrono::milliseconds connect_timeout,
                               std::chrono::milliseconds operation_timeout, std::string host_name,
                               const std::string& secret)
    : where_(host + ":" + std::to_string(port)), host_name_(std::move(host_name)), operation_timeout_(operation_timeout) {
  // The store's host may not listen yet: try again, more slowly each time, until the deadline.
  const auto give_up = plugin::deadline_after(connect_timeout);
  std::string why;
  auto pause = std::chrono::milliseconds(10);
  plugin::WaitReport report(plugin::kWaitReportInterval);
  for (;;) {
    fd_ = connect_once(host, port, give_up, why);
    if (fd_ >= 0) break;
    const auto now = Clock::now();
    if (now >= give_up) {
      throw Error(BPL_ERR_TIMEOUT, "nothing took a connection at " + where_ + " within " +
                                       std::to_string(connect_timeout.count()) + " ms (BPL_TIMEOUT_MS; last: " + why +
                                       "): " + host_name_ + ", which hosts the store, never came");
    }
    if (report.due()) {
      plugin::log(BPL_LOG_INFO, "gloo", "waiting for the store at " + where_ + " (" + host_name_ + "'s): nothing took a "
                                            "connection in " + report.waited() + " of " +
                                            std::to_string(connect_timeout.count()) + " ms (last: " + why + ")");
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, give_up - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
  const int on = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));

  // The greeting proves that a store of this protocol answers.
  const auto deadline = plugin::deadline_after(operation_timeout_);
  uint8_t greeting[wire::kGreetingSize];
  Io io = send_all(fd_, reinterpret_cast<const uint8_t*>(wire::kGreeting), wire::kGreetingSize, deadline);
  if (io == Io::kDone) io = receive_all(fd_, greeting, sizeof(greeting), deadline);
  const std::string error = std::strerror(errno);
  if (io == Io::kDone && std::memcmp(greeting, wire::kGreeting, sizeof(greeting)) == 0) {
    admit(secret);
    return;
  }
  ::close(fd_);
  fd_ = -1;
  if (io == Io::kTimedOut) {
    throw Error(BPL_ERR_TIMEOUT, "the store at " + where_ + " did not answer within " +
                                     std::to_string(operation_timeout_.count()) + " ms (BPL_TIMEOUT_MS): its host, " +
                                     host_name_ + ", is stopped or stuck, or what listens there is not a store");
  }
  if (io == Io::kDone) {
    throw Error(BPL_ERR_IO, "what listens at " + where_ + " is not a backplane store (it answered something else): " +
                                "is MASTER_PORT another program's?");
  }
  throw Error(BPL_ERR_IO, "the store at " + where_ + " closed the connection before answering (" +
                              (io == Io::kClosed ? std::string("end of stream") : error) +
                              "): what listens there is not a store, or its host, " + host_name_ + ", is ending");
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

void TcpStoreClient::fail(bpl_status status, const std::string& message) {
  failed_ = status;
  failure_ = message;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  throw Error(failed_, failure_);
}

std::vector<uint8_t> TcpStoreClient::call(const char* operation, const std::vector<uint8_t>& request,
                                          std::chrono::milliseconds server_holds) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failed_ != BPL_OK) throw Error(failed_, failure_);
  // From now, not from the call: a caller that waited for another's get to end took none of its bound.
  const auto answered_by = plugin::deadline_after(server_holds);
  const auto deadline = answered_by == Clock::time_point::max() ? answered_by
                                                                 : plugin::deadline_after(operation_timeout_, answered_by);
  const std::vector<uint8_t> frame = wire::framed(request);
  Io io = send_all(fd_, frame.data(), frame.size(), deadline);
  uint8_t length_bytes[4];
  if (io == Io::kDone) io = receive_all(fd_, length_bytes, sizeof(length_bytes), deadline);
  std::vector<uint8_t> answer;
  if (io == Io::kDone) {
    const uint32_t length = wire::read_u32(length_bytes);
    if (length > wire::kMaxFrame) fail(BPL_ERR_REMOTE, "the store at " + where_ + " sent a malformed answer");
    answer.resize(length);
    io = receive_all(fd_, answer.data(), answer.size(), deadline);
  }
  if (io == Io::kDone) return answer;
  if (io == Io::kTimedOut) {
    fail(BPL_ERR_TIMEOUT, "the store at " + where_ + " did not answer (" + operation + ") within " +
                              std::to_string(operation_timeout_.count()) + " ms: its host, " + host_name_ +
                              ", is stopped or stuck, or the network to it is cut");
  }
  fail(BPL_ERR_REMOTE, "the connection to the store at " + where_ + " failed (" + operation + "): " +
                           (io == Io::kClosed ? std::string("closed") : std::string(std::strerror(errno))) +
                           ": its host, " + host_name_ + ", has ended or closed it");
}

void TcpStoreClient::admit(const std::string& secret) {
  std::vector<uint8_t> request{wire::kAdmit};
  wire::put_string(request, secret);
  const std::vector<uint8_t> answer = call("admit", request, std::chrono::milliseconds(0));
  if (answer.size() == 1 && answer[0] == wire::kStored) return;
  std::lock_guard<std::mutex> lock(mutex_);
  fail(BPL_ERR_INVALID_ARGUMENT,
       "the store at " + where_ + " (" + host_name_ + "'s) refused this process: " +
           (secret.empty() ? "it serves only the job's processes, and BPL_STORE_SECRET is not set here"
                           : "BPL_STORE_SECRET here is not the job's") +
           " (bpl-run hands the job's to every process it starts; a job started otherwise needs the same value in "
           "every process)");
}

void TcpStoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  if (value.size() + key.size() + 16 > wire::kMaxFrame) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "a value of " + std::to_string(value.size()) + " bytes for key '" + key +
                                              "': the store takes values of at most " +
                                              std::to_string(wire::kMaxFrame - key.size() - 16) + " bytes");
  }
  std::vector<uint8_t> request{wire::kSet};
  wire::put_string(request, key);
  request.insert(request.end(), value.begin(), value.end());
  const std::vector<uint8_t> answer = call("set", request, std::chrono::milliseconds(0));
  if (!answer.empty() && answer[0] == wire::kRefused) {
    throw Error(BPL_ERR_OUT_OF_MEMORY, "the store at " + where_ + " refused key '" + key.substr(0, 200) + "' (" +
                                           std::to_string(value.size()) + " bytes): it holds as much as it may");
  }
}

void TcpStoreClient::set_when_closed(const std::string& key, const std::vector<uint8_t>& value) {
  std::vector<uint8_t> request{wire::kSetWhenClosed};
  wire::put_string(request, key);
  request.insert(request.end(), value.begin(), value.end());
  call("set when closed", request, std::chrono::milliseconds(0));
}

std::optional<std::vector<uint8_t>> TcpStoreClient::get_within(const std::string& key, std::chrono::milliseconds timeout) {
  std::vector<uint8_t> request{wire::kGet};
  wire::put_i64(request, timeout.count());
  wire::put_string(request, key);
  // The server answers at the get's deadline itself; the connection's own bound comes on top.
  std::vector<uint8_t> answer = call("get", request, timeout);
  if (answer.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    fail(BPL_ERR_REMOTE, "the store at " + where_ + " sent a malformed answer to get");
  }
  if (answer[0] == wire::kTimedOut) return std::nullopt;
  answer.erase(answer.begin());
  return answer;
}

std::vector<uint8_t> TcpStoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::optional<std::vector<uint8_t>> value = get_within(key, timeout);
  if (!value) {
    throw Error(BPL_ERR_TIMEOUT, "the store at " + where_ + ": key '" + key + "' was not set within " +
                                     std::to_string(timeout.count()) + " ms");
  }
  return std::move(*value);
}

bool TcpStoreClient::wait_for(const std::string& key, std::chrono::milliseconds within) {
  return get_within(key, within).has_value();
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  std::vector<uint8_t> request{wire::kAdd};
  wire::put_string(request, key);
  wire::put_i64(request, delta);
  const std::vector<uint8_t> answer = call("add", request, std::chrono::milliseconds(0));
  if (answer.empty()) {
    throw Error(BPL_ERR_OUT_OF_MEMORY, "the store at " + where_ + " refused to add to key '" + key.substr(0, 200) +
                                           "': it holds as much as it may");
  }
  wire::Reader r(answer.data(), answer.size());
  const int64_t sum = r.i64();
  if (!r.good()) {
    std::lock_guard<std::mutex> lock(mutex_);
    fail(BPL_ERR_REMOTE, "the store at " + where_ + " sent a malformed answer to add");
  }
  return sum;
}

bool TcpStoreClient::erase_prefix(const std::string& prefix) {
  std::vector<uint8_t> request{wire::kErasePrefix};
  wire::put_string(request, prefix);
  call("erase prefix", request, std::chrono::milliseconds(0));
  return true;
}

bool TcpStoreClient::check(const std::string& key) {
  std::vector<uint8_t> request{wire::kCheck};
  wire::put_string(request, key);
  const std::vector<uint8_t> answer = call("check", request, std::chrono::milliseconds(0));
  return !answer.empty() && answer[0] == 1;
}

}  // namespace backplane::gloo_plugin
