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
#include "tcp_store_access.h"
#include "tcp_store_wire.h"

namespace backplane::gloo_plugin {

using Clock = std::chrono::steady_clock;
using plugin::Error;

// How long accepting pauses when the process has no file descriptor left (else poll wakes at once).
constexpr std::chrono::milliseconds kAcceptPause{100};

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
    bool admitted = false;    // it gave the job's secret (or the store has none)
    std::string from;         // its peer's address, for what the store says of it
    Clock::time_point last_received = Clock::now();
  };

  std::list<Connection> connections;
  std::unordered_map<std::string, std::vector<uint8_t>> values;
  size_t stored_bytes = 0;  // of every key and value
  TcpStoreServer::Limits limits;
  std::string secret;  // empty: every connection is admitted
  Clock::time_point accept_paused_until;
  TcpStoreServer::TorchClients torch_clients;

  ~State() {
    for (Connection& c : connections) ::close(c.fd);
  }

  void accept_all(int listen_fd) {
    for (;;) {
      sockaddr_storage peer{};
      socklen_t peer_length = sizeof(peer);
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &peer_length, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
        // The connection waits in the backlog; the listener is not polled until the pause ends.
        if (accept_paused_until == Clock::time_point()) {
          plugin::log(BPL_LOG_WARN, "store", std::string("cannot take a connection: ") + std::strerror(errno) +
                                                 " (trying again every " + std::to_string(kAcceptPause.count()) + " ms)");
        }
        accept_paused_until = Clock::now() + kAcceptPause;
        return;
      }
      if (fd < 0) return;  // EAGAIN: no more; anything else: that connection is lost to its client
      accept_paused_until = Clock::time_point();
      const int on = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
      connections.push_back(Connection{});
      connections.back().fd = fd;
      connections.back().from = text_of_address(peer);
      connections.back().admitted = secret.empty();
    }
  }

  void read_from(Connection& c) {
    uint8_t chunk[64 * 1024];
    for (;;) {
      if (c.in.size() > wire::kMaxFrame + 4) break;  // what it sent is served before more is read
      const ssize_t n = ::recv(c.fd, chunk, sizeof(chunk), 0);
      if (n > 0) {
        c.in.insert(c.in.end(), chunk, chunk + n);
        c.last_received = Clock::now();
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0 && errno == EINTR) continue;
      c.closed = true;  // the client left (or its connection failed)
      return;
    }
    serve_requests(c);
  }

  // Sends what it can of the answers, then serves the requests that waited for them to leave.
  void send_answers(Connection& c) {
    write_to(c);
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

  // Answers the gets whose deadline passed, and ends the connections that sat on part of a frame (or
  // on no greeting) too long; returns how long until the next such deadline, or -1 (none).
  int expire_waits() {
    const auto now = Clock::now();
    Clock::time_point next = Clock::time_point::max();
    for (Connection& c : connections) {
      const bool answers_wait = c.out.size() > wire::kMaxFrame;  // its client's to read, not to send
      if (!c.waiting_key && !answers_wait && (!c.in.empty() || !c.greeted) && !c.closed) {
        const Clock::time_point idle_until = c.last_received + limits.partial_frame_idle;
        if (idle_until <= now) {
          close_saying(c, c.greeted ? "it sat on part of a request" : "it sent no greeting");
        } else {
          next = std::min(next, idle_until);
        }
      }
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
      if (!keep(key, std::move(value))) {
        plugin::log(BPL_LOG_WARN, "store", "a connection ended, but its word '" + key + "' found the store full");
        continue;
      }
      wake_waiting(key);
    }
  }

  // Stores `value` under `key` unless that would take the values past their bound.
  bool keep(const std::string& key, std::vector<uint8_t> value) {
    auto found = values.find(key);
    const size_t before = found == values.end() ? 0 : key.size() + found->second.size();
    if (stored_bytes - before + key.size() + value.size() > limits.stored_bytes) return false;
    stored_bytes = stored_bytes - before + key.size() + value.size();
    values[key] = std::move(value);
    return true;
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
        close_saying(c, "it did not open as a client of this store does");
        return;
      }
      c.in.erase(c.in.begin(), c.in.begin() + wire::kGreetingSize);
      c.greeted = true;
      c.out.insert(c.out.end(), wire::kGreeting, wire::kGreeting + wire::kGreetingSize);
      write_to(c);
    }
    // A client that does not read its answers gets no more: what it asks waits, and so does what it sends.
    while (!c.closed && !c.waiting_key && c.out.size() <= wire::kMaxFrame && c.in.size() >= 4) {
      const uint32_t length = wire::read_u32(c.in.data());
      if (length > wire::kMaxFrame) {
        close_saying(c, "it sent a frame of " + std::to_string(length) + " bytes, past the bound of " +
                            std::to_string(wire::kMaxFrame));
        return;
      }
      if (c.in.size() < 4 + size_t{length}) return;
      std::vector<uint8_t> request(c.in.begin() + 4, c.in.begin() + 4 + length);
      c.in.erase(c.in.begin(), c.in.begin() + 4 + length);
      const std::string refused = serve(c, request);
      if (!refused.empty()) close_saying(c, refused);
    }
  }

  // Ends a connection that is not a client of this job's store, saying what came from where.
  void close_saying(Connection& c, const std::string& why) {
    plugin::log(BPL_LOG_WARN, "store", "closed the connection from " + c.from + ": " + why);
    c.closed = true;
  }

  // Serves one request; what was wrong with it (the connection then ends), or empty.
  std::string serve(Connection& c, const std::vector<uint8_t>& request) {
    wire::Reader r(request.data(), request.size());
    const uint8_t operation = r.u8();
    if (operation == wire::kAdmit) return admit(c, r);
    if (!c.admitted) {
      return "it made a request before it was admitted (this store serves only the job's processes: "
             "BPL_STORE_SECRET)";
    }
    const auto malformed = [&] {
      return "a malformed request (operation " + std::to_string(operation) + ", " + std::to_string(request.size()) +
             " bytes)";
    };
    switch (operation) {
      case wire::kSet: {
        const std::string key = r.string();
        if (!r.good()) return malformed();
        if (!keep(key, r.rest())) {
          answer(c, {wire::kRefused});
          return {};
        }
        answer(c, {wire::kStored});
        wake_waiting(key);
        return {};
      }
      case wire::kGet: {
        const int64_t timeout_ms = r.i64();
        const std::string key = r.string();
        if (!r.good() || !r.at_end()) return malformed();
        auto found = values.find(key);
        if (found != values.end()) {
          answer_found(c, found->second);
        } else {
          c.waiting_key = key;
          c.waiting_until = plugin::deadline_after(std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)));
        }
        return {};
      }
      case wire::kAdd: {
        const std::string key = r.string();
        const int64_t delta = r.i64();
        if (!r.good() || !r.at_end()) return malformed();
        auto found = values.find(key);
        // Kept as decimal text, as torch's TCPStore keeps its counters (within the bound: a few bytes).
        const int64_t sum = static_cast<int64_t>(
            static_cast<uint64_t>(found == values.end() ? 0 : std::strtoll(text_of(found->second).c_str(), nullptr, 10)) +
            static_cast<uint64_t>(delta));
        std::vector<uint8_t> payload;  // empty: refused
        if (keep(key, bytes_of(std::to_string(sum)))) wire::put_i64(payload, sum);
        answer(c, payload);
        wake_waiting(key);
        return {};
      }
      case wire::kSetWhenClosed: {
        const std::string key = r.string();
        if (!r.good()) return malformed();
        c.when_closed.emplace_back(key, r.rest());
        answer(c, {0});
        return {};
      }
      case wire::kErasePrefix: {
        const std::string prefix = r.string();
        if (!r.good() || !r.at_end()) return malformed();
        int64_t erased = 0;
        for (auto v = values.begin(); v != values.end();) {
          const bool under = v->first.compare(0, prefix.size(), prefix) == 0;
          if (under) stored_bytes -= v->first.size() + v->second.size();
          v = under ? values.erase(v) : std::next(v);
          erased += under ? 1 : 0;
        }
        std::vector<uint8_t> payload;
        wire::put_i64(payload, erased);
        answer(c, payload);
        return {};
      }
      case wire::kCheck: {
        const std::string key = r.string();
        if (!r.good() || !r.at_end()) return malformed();
        answer(c, {static_cast<uint8_t>(values.count(key) != 0 ? 1 : 0)});
        return {};
      }
      default:
        return "a request of no known operation (" + std::to_string(operation) + ")";
    }
  }

  std::string admit(Connection& c, wire::Reader& r) {
    const std::string offered = r.string();
    if (!r.good() || !r.at_end()) return "a malformed admission";
    if (secret.empty() || same_secret(offered, secret)) {
      c.admitted = true;
      answer(c, {wire::kStored});
      return {};
    }
    answer(c, {wire::kRefused});
    return offered.empty() ? "it gave no secret, and this store serves only the job's processes (BPL_STORE_SECRET)"
                           : "its secret is not the job's (BPL_STORE_SECRET)";
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


TcpStoreServer::TcpStoreServer(uint16_t port, TorchClients torch_clients, Limits limits, TcpStoreAdmission admission)
    : state_(std::make_unique<State>()) {
  state_->torch_clients = std::move(torch_clients);
  state_->limits = limits;
  state_->secret = std::move(admission.secret);
  listen_fd_ = listen_where_clients_connect(admission.listen_host, port);
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
    const bool accepting = Clock::now() >= s.accept_paused_until;
    polled.assign({{wake_fd_, POLLIN, 0}, {accepting ? listen_fd_ : -1, POLLIN, 0}});
    polled_connections.clear();
    for (State::Connection& c : s.connections) {
      // Input that waits to be served is not polled for more (it would wake at once); its end still is.
      const bool room = c.in.size() <= wire::kMaxFrame + 4;
      polled.push_back({c.fd, static_cast<short>((room ? POLLIN : 0) | (c.out.empty() ? 0 : POLLOUT)), 0});
      polled_connections.push_back(&c);
    }
    int wait_ms = timeout_ms;
    if (!accepting) {
      const auto pause = std::chrono::duration_cast<std::chrono::milliseconds>(s.accept_paused_until - Clock::now()).count() + 1;
      wait_ms = wait_ms < 0 ? static_cast<int>(pause) : std::min(wait_ms, static_cast<int>(pause));
    }
    if (::poll(polled.data(), polled.size(), wait_ms) < 0 && errno != EINTR) return;
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
      if (events & POLLOUT) s.send_answers(c);
      if (events & (POLLIN | POLLHUP | POLLERR)) s.read_from(c);
    }
  }
}

}  // namespace backplane::gloo_plugin
