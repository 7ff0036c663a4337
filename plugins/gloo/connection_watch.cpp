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
  const uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof(one)) < 0) {
    // the eventfd cannot be full: one write, then the thread ends
  }
  thread_.join();
  ::close(wake_fd_);
  ::close(epoll_fd_);
}

ConnectionWatch::Handle ConnectionWatch::watch(const std::vector<std::pair<int, int>>& sockets,
                                               std::function<void(int)> ended) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Handle handle = next_handle_++;
  Watched& watched = watched_[handle];
  watched.ended = std::move(ended);
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

void ConnectionWatch::run() {
  for (;;) {
    epoll_event events[16];
    const int ready = ::epoll_wait(epoll_fd_, events, 16, -1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return;
    }
    for (int i = 0; i < ready; ++i) {
      if (events[i].data.fd == wake_fd_) return;
      std::function<void(int)> ended;
      int peer = -1;
      Watched* watched = nullptr;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        const auto owner = socket_owner_.find(events[i].data.fd);
        if (owner == socket_owner_.end()) continue;  // forgotten since epoll_wait returned
        peer = owner->second.second;
        watched = &watched_[owner->second.first];
        forget_sockets(*watched);  // once per communicator
        ended = watched->ended;
        watched->calling = true;
      }
      ended(peer);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        watched->calling = false;
      }
      callback_done_.notify_all();
    }
  }
}

}  // namespace backplane::gloo_plugin
