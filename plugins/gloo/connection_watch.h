// Learns, without polling, that a connection of a communicator has ended.
//
// A Gloo TCP pair wakes only the operations waiting on that pair when its connection fails: a rank
// whose collective waits on another pair (the ring's other neighbour) keeps waiting until its timeout
// after a peer died, aborted or failed. ConnectionWatch puts every pair socket of a communicator into
// an epoll set of its own, for the connection's end only (EPOLLRDHUP, hang-up, error: never data, so a
// working connection costs nothing), and calls the communicator back on its first ended connection,
// on the watch's one thread, which sleeps in epoll_wait otherwise. The communicator then fails its own
// connections, which wakes its waits here and tells its other peers, and so on around the group.
//
// The same thread runs a communicator's periodic check, where it asks for one: what a collective
// stalled over those connections says while it waits (stall_report.h).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace backplane::gloo_plugin {

class ConnectionWatch {
 public:
  using Handle = uint64_t;

  ConnectionWatch();
  ~ConnectionWatch();  // stops the thread; every watch must have been removed
  ConnectionWatch(const ConnectionWatch&) = delete;
  ConnectionWatch& operator=(const ConnectionWatch&) = delete;

  // Watches `sockets` (descriptor, peer rank); `ended(peer)` runs once, on the watch's thread, for the
  // first of them whose connection ends, after which none of them is watched any more.
  // With `check`, also calls it on the watch's thread every `interval`, until unwatch.
  Handle watch(const std::vector<std::pair<int, int>>& sockets, std::function<void(int peer)> ended,
               std::function<void()> check = {}, std::chrono::milliseconds interval = std::chrono::milliseconds(0));
  // Stops watching. Once it returns the callback is not running and will not run.
  void unwatch(Handle handle);

 private:
  struct Watched {
    std::vector<int> fds;
    std::function<void(int)> ended;
    std::function<void()> check;
    std::chrono::milliseconds interval{0};
    std::chrono::steady_clock::time_point next_check;
    bool calling = false;
  };
  void run();
  void forget_sockets(Watched& watched);  // with mutex_ held
  // epoll_wait's timeout: until the next check is due, -1 when none is asked for (with mutex_ held).
  int until_next_check() const;
  // Runs `call` as the watch's callback of `watched`, which unwatch waits for (mutex_ held by `lock`).
  template <typename Call>
  void call_back(std::unique_lock<std::mutex>& lock, Watched& watched, Call&& call);

  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd: the thread looks again at what it watches, or stops
  bool stopping_ = false;
  std::mutex mutex_;
  std::condition_variable callback_done_;
  std::map<Handle, Watched> watched_;
  std::map<int, std::pair<Handle, int>> socket_owner_;  // fd → (watch, peer)
  Handle next_handle_ = 1;
  std::thread thread_;
};

}  // namespace backplane::gloo_plugin
