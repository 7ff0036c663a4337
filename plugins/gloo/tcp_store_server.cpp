// The server of backplane's TCP store (tcp_store.h): one thread, poll() over the listening socket and
// every connection, asleep until a request comes or a waiting get reaches its deadline.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <list>
#include <unordered_map>

#include "tcp_store.h"
#include "tcp_store_wire.h"

namespace backplane::gloo_plugin {

using Clock = std::chrono::steady_clock;
using plugin::Error;

class TcpStoreServer::State {
 public:
  struct Connection {
    int fd = -1;
    bool greeted = false;
    bool closed = false;
    std::vector<uint8_t> in;
    std::vector<uint8_t> out;
    std::optional<std::string> waiting_key;  // a get whose key is not set yet
    Clock::time_point waiting_until;
    // Set once the connection ends: how the job learns that the process behind it ended, at once.
    std::vector<std::pair<std::string, std::vector<uint8_t>>> when_closed;
    bool handed_off = false;  // a torch client's, now the torch side's (see TorchClients)
  };

  std::list<Connection> connections;
  std::unordered_map<std::string, std::vector<uint8_t>> values;
  TcpStoreServer::TorchClients torch_clients;

  ~State() {
    for (Connection& c : connections) ::close(c.fd);
  }

  void accept_all(int listen_fd) {
    for (;;) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN: no more; anything else: that connection is lost to its client
      const int on = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
      connections.push_back(Connection{});
      connections.back().fd = fd;
    }
  }

  void read_from(Connection& c) {
    uint8_t chunk[64 * 1024];
    for (;;) {
      const ssize_t n = ::recv(c.fd, chunk, sizeof(chunk), 0);
      if (n > 0) {
        c.in.insert(c.in.end(), chunk, chunk + n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0 && errno == EINTR) continue;
      c.closed = true;  // the client left (or its connection failed)
      return;
    }
    serve_requests(c);
  }

  void write_to(Connection& c) {
    size_t sent = 0;
    while (sent < c.out.size()) {
      const ssize_t n = ::send(c.fd, c.out.data() + sent, c.out.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) c.closed = true;
        break;
      }
    }
    c.out.erase(c.out.begin(), c.out.begin() + static_cast<std::ptrdiff_t>(sent));
  }

  // Answers the gets whose deadline passed; returns how long until the next one's, or -1 (none).
  int expire_waits() {
    const auto now = Clock::now();
    Clock::time_point next = Clock::time_point::max();
    for (Connection& c : connections) {
      if (!c.waiting_key) continue;
      if (c.waiting_until <= now) {
        c.waiting_key.reset();
        answer(c, {wire::kTimedOut});
        serve_requests(c);
      } else {
        next = std::min(next, c.waiting_until);
      }
    }
    if (next == Clock::time_point::max()) return -1;
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
    return static_cast<int>(std::min<int64_t>(wait, 60'000));
  }

  void drop_closed() {
    std::vector<std::pair<std::string, std::vector<uint8_t>>> now_set;
    for (auto c = connections.begin(); c != connections.end();) {
      if (c->handed_off) {
        torch_clients(c->fd, std::move(c->in));
        c = connections.erase(c);
      } else if (c->closed) {
        ::close(c->fd);
        now_set.insert(now_set.end(), c->when_closed.begin(), c->when_closed.end());
        c = connections.erase(c);
      } else {
        ++c;
      }
    }
    for (auto& [key, value] : now_set) {
      values[key] = std::move(value);
      wake_waiting(key);
    }
  }

 private:
  void answer(Connection& c, const std::vector<uint8_t>& payload) {
    const std::vector<uint8_t> frame = wire::framed(payload);
    c.out.insert(c.out.end(), frame.begin(), frame.end());
    write_to(c);
  }

  // Requests are served in order, one at a time per connection: a get that waits holds the ones behind it.
  void serve_requests(Connection& c) {
    if (!c.greeted) {
      if (torch_clients && !c.in.empty() && c.in[0] == wire::kTorchStoreGreeting[0]) {
        if (c.in.size() < sizeof(wire::kTorchStoreGreeting) && !c.closed) return;
        c.handed_off = c.in.size() >= sizeof(wire::kTorchStoreGreeting) &&
                       std::memcmp(c.in.data(), wire::kTorchStoreGreeting, sizeof(wire::kTorchStoreGreeting)) == 0;
        c.closed = true;
        return;
      }
      if (c.in.size() < wire::kGreetingSize) return;
      if (std::memcmp(c.in.data(), wire::kGreeting, wire::kGreetingSize) != 0) {
        c.closed = true;  // not a client of this store
        return;
      }
      c.in.erase(c.in.begin(), c.in.begin() + wire::kGreetingSize);
      c.greeted = true;
      c.out.insert(c.out.end(), wire::kGreeting, wire::kGreeting + wire::kGreetingSize);
      write_to(c);
    }
    while (!c.closed && !c.waiting_key && c.in.size() >= 4) {
      const uint32_t length = wire::read_u32(c.in.data());
      if (length > wire::kMaxFrame) {
        c.closed = true;
        return;
      }
      if (c.in.size() < 4 + size_t{length}) return;
      std::vector<uint8_t> request(c.in.begin() + 4, c.in.begin() + 4 + length);
      c.in.erase(c.in.begin(), c.in.begin() + 4 + length);
      if (!serve(c, request)) c.closed = true;
    }
  }

  bool serve(Connection& c, const std::vector<uint8_t>& request) {
    wire::Reader r(request.data(), request.size());
    switch (r.u8()) {
      case wire::kSet: {
        const std::string key = r.string();
        if (!r.good()) return false;
        values[key] = r.rest();
        answer(c, {0});
        wake_waiting(key);
        return true;
      }
      case wire::kGet: {
        const int64_t timeout_ms = r.i64();
        const std::string key = r.string();
        if (!r.good() || !r.at_end()) return false;
        auto found = values.find(key);
        if (found != values.end()) {
          answer_found(c, found->second);
        } else {
          c.waiting_key = key;
          c.waiting_until = plugin::deadline_after(std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)));
        }
        return true;
      }
      case wire::kAdd: {
        const std::string key = r.string();
        const int64_t delta = r.i64();
        if (!r.good() || !r.at_end()) return false;
        std::vector<uint8_t>& value = values[key];
        // Kept as decimal text, as torch's TCPStore keeps its counters.
        const int64_t sum = static_cast<int64_t>(
            static_cast<uint64_t>(std::strtoll(text_of(value).c_str(), nullptr, 10)) + static_cast<uint64_t>(delta));
        value = bytes_of(std::to_string(sum));
        std::vector<uint8_t> payload;
        wire::put_i64(payload, sum);
        answer(c, payload);
        wake_waiting(key);
        return true;
      }
      case wire::kSetWhenClosed: {
        const std::string key = r.string();
        if (!r.good()) return false;
        c.when_closed.emplace_back(key, r.rest());
        answer(c, {0});
        return true;
      }
      case wire::kCheck: {
        const std::string key = r.string();
        if (!r.good() || !r.at_end()) return false;
        answer(c, {static_cast<uint8_t>(values.count(key) != 0 ? 1 : 0)});
        return true;
      }
      default:
        return false;
    }
  }

  void answer_found(Connection& c, const std::vector<uint8_t>& value) {
    std::vector<uint8_t> payload;
    payload.reserve(1 + value.size());
    payload.push_back(wire::kFound);
    payload.insert(payload.end(), value.begin(), value.end());
    answer(c, payload);
  }

  void wake_waiting(const std::string& key) {
    for (Connection& c : connections) {
      if (c.waiting_key && *c.waiting_key == key) {
        c.waiting_key.reset();
        answer_found(c, values[key]);
        serve_requests(c);
      }
    }
  }
};

namespace {

// A listening socket on `port` of every interface of `family`, or -1 with errno set.
int listen_on(int family, uint16_t port) {
  const int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int on = 1, off = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_storage address{};
  socklen_t length;
  if (family == AF_INET6) {
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));  // IPv4 clients too
    auto& v6 = reinterpret_cast<sockaddr_in6&>(address);
    v6.sin6_family = AF_INET6;
    v6.sin6_addr = in6addr_any;
    v6.sin6_port = htons(port);
    length = sizeof(v6);
  } else {
    auto& v4 = reinterpret_cast<sockaddr_in&>(address);
    v4.sin_family = AF_INET;
    v4.sin_addr.s_addr = htonl(INADDR_ANY);
    v4.sin_port = htons(port);
    length = sizeof(v4);
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int error = errno;
    ::close(fd);
    errno = error;
    return -1;
  }
  return fd;
}

}  // namespace

TcpStoreServer::TcpStoreServer(uint16_t port, TorchClients torch_clients) : state_(std::make_unique<State>()) {
  state_->torch_clients = std::move(torch_clients);
  // Every interface, IPv6 and IPv4 alike, as torch's TCPStore listens; IPv4 alone on a host without IPv6.
  listen_fd_ = listen_on(AF_INET6, port);
  if (listen_fd_ < 0 && errno != EADDRINUSE) listen_fd_ = listen_on(AF_INET, port);
  if (listen_fd_ < 0) {
    throw Error(BPL_ERR_IO, "cannot serve the store on port " + std::to_string(port) + ": " + std::strerror(errno));
  }
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    ::close(listen_fd_);
    throw Error(BPL_ERR_IO, "cannot make the store's eventfd: " + std::string(std::strerror(errno)));
  }
  thread_ = std::thread([this] { serve(); });
}

void TcpStoreServer::wake() {
  const uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof(one)) < 0) {
    // cannot fail for an eventfd far below its limit
  }
}

void TcpStoreServer::stop_listening() {
  stop_listening_.store(true);
  wake();
}

TcpStoreServer::~TcpStoreServer() {
  ending_.store(true);
  wake();
  thread_.join();
  ::close(wake_fd_);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void TcpStoreServer::serve() {
  State& s = *state_;
  std::vector<pollfd> polled;
  std::vector<State::Connection*> polled_connections;
  for (;;) {
    const int timeout_ms = s.expire_waits();
    s.drop_closed();
    // A listener closed is polled as -1, which poll passes over.
    polled.assign({{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}});
    polled_connections.clear();
    for (State::Connection& c : s.connections) {
      polled.push_back({c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      polled_connections.push_back(&c);
    }
    if (::poll(polled.data(), polled.size(), timeout_ms) < 0 && errno != EINTR) return;
    if (polled[0].revents != 0) {
      uint64_t count = 0;
      if (::read(wake_fd_, &count, sizeof(count)) < 0) {
        // nothing to read: woken already
      }
      if (ending_.load()) return;
      if (stop_listening_.load() && listen_fd_ >= 0) {
        ::close(listen_fd_);
        listen_fd_ = -1;
      }
    }
    if (listen_fd_ >= 0 && (polled[1].revents & POLLIN)) s.accept_all(listen_fd_);
    for (size_t i = 0; i < polled_connections.size(); ++i) {
      State::Connection& c = *polled_connections[i];
      const short events = polled[i + 2].revents;
      if (events & POLLOUT) s.write_to(c);
      if (events & (POLLIN | POLLHUP | POLLERR)) s.read_from(c);
    }
  }
}

}  // namespace backplane::gloo_plugin
