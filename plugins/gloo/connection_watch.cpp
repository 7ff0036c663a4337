#include "connection_watch.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "plugin_support.h"

namespace backplane::gloo_plugin {
namespace {

void wake(int eventfd) {
  const uint64_t one = 1;
  if (::write(eventfd, &one, sizeof(one)) < 0) {
    // full: the thread has yet to read the earlier wake-ups, and will look again anyway
  }
}

}  // namespace

ConnectionWatch::ConnectionWatch() {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    const std::string reason = std::strerror(errno);
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
    throw plugin::Error(BPL_ERR_INTERNAL, "cannot watch connections: " + reason);
  }
  epoll_event wake{};
  wake.events = EPOLLIN;
  wake.data.fd = wake_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &wake);
  thread_ = std::thread([this] { run(); });
}

ConnectionWatch::~ConnectionWatch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake(wake_fd_);
  thread_.join();
  ::close(wake_fd_);
  ::close(epoll_fd_);
}

ConnectionWatch::Handle ConnectionWatch::watch(const std::vector<std::pair<int, int>>& sockets,
                                               std::function<void(int)> ended, std::function<void()> check,
                                               std::chrono::milliseconds interval) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Handle handle = next_handle_++;
  Watched& watched = watched_[handle];
  watched.ended = std::move(ended);
  if (check) {
    watched.check = std::move(check);
    watched.interval = std::max(interval, std::chrono::milliseconds(1));
    watched.next_check = std::chrono::steady_clock::now() + watched.interval;
    wake(wake_fd_);  // its epoll_wait may have no timeout yet
  }
  for (const auto& [fd, peer] : sockets) {
    // A descriptor number still listed here belonged to a socket Gloo has closed since: reused now.
    const auto stale = socket_owner_.find(fd);
    if (stale != socket_owner_.end()) {
      auto& fds = watched_[stale->second.first].fds;
      fds.erase(std::remove(fds.begin(), fds.end(), fd), fds.end());
      socket_owner_.erase(stale);
    }
    epoll_event event{};
    event.events = EPOLLRDHUP;  // hang-ups and errors are always reported; data never is
    event.data.fd = fd;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) continue;
    watched.fds.push_back(fd);
    socket_owner_[fd] = {handle, peer};
  }
  return handle;
}

void ConnectionWatch::forget_sockets(Watched& watched) {
  for (int fd : watched.fds) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);  // fails harmlessly for a socket already closed
    socket_owner_.erase(fd);
  }
  watched.fds.clear();
}

void ConnectionWatch::unwatch(Handle handle) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = watched_.find(handle);
  if (it == watched_.end()) return;
  callback_done_.wait(lock, [&] { return !it->second.calling; });
  forget_sockets(it->second);
  watched_.erase(it);
}

int ConnectionWatch::until_next_check() const {
  auto next = std::chrono::steady_clock::time_point::max();
  for (const auto& [handle, watched] : watched_) {
    if (watched.check) next = std::min(next, watched.next_check);
  }
  if (next == std::chrono::steady_clock::time_point::max()) return -1;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(next - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 60000));
}

template <typename Call>
void ConnectionWatch::call_back(std::unique_lock<std::mutex>& lock, Watched& watched, Call&& call) {
  watched.calling = true;
  lock.unlock();
  call();
  lock.lock();
  watched.calling = false;
  callback_done_.notify_all();
}

void ConnectionWatch::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    const int timeout = until_next_check();
    lock.unlock();
    epoll_event events[16];
    const int ready = ::epoll_wait(epoll_fd_, events, 16, timeout);
    lock.lock();
    if (ready < 0 && errno != EINTR) return;
    for (int i = 0; i < ready; ++i) {
      if (events[i].data.fd == wake_fd_) {
        uint64_t count = 0;
        if (::read(wake_fd_, &count, sizeof(count)) < 0) {
          // already read: nothing to do
        }
        continue;
      }
      const auto owner = socket_owner_.find(events[i].data.fd);
      if (owner == socket_owner_.end()) continue;  // forgotten since epoll_wait returned
      const int peer = owner->second.second;
      Watched& watched = watched_[owner->second.first];
      forget_sockets(watched);  // once per communicator
      call_back(lock, watched, [&] { watched.ended(peer); });
    }
    // Entries of the map stay where they are while others come and go; this one, while it is called.
    const auto now = std::chrono::steady_clock::now();
    for (auto& [handle, watched] : watched_) {
      if (!watched.check || now < watched.next_check) continue;
      watched.next_check = now + watched.interval;
      call_back(lock, watched, watched.check);
    }
  }
}

}  // namespace backplane::gloo_plugin
