// Learns, without polling, that a connection of a communicator has ended.
//
// A Gloo TCP pair wakes only the operations waiting on that pair when its connection fails: a rank
// whose collective waits on another pair (the ring's other neighbour) keeps waiting until its timeout
// after a peer died, aborted or failed. ConnectionWatch puts every pair socket of a communicator into
// an epoll set of its own, for the connection's end only (EPOLLRDHUP, hang-up, error: never data, so a
// working connection costs nothing), and calls the communicator back on its first ended connection,
// on the watch's one thread, which sleeps in epoll_wait otherwise. The communicator then fails its own
// connections, which wakes its waits here and tells its other peers, and so on around the group.
#pragma once

#include <sys/types.h>

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
  Handle watch(const std::vector<std::pair<int, int>>& sockets, std::function<void(int peer)> ended);
  // Stops watching. Once it returns the callback is not running and will not run.
  void unwatch(Handle handle);

 private:
  struct Watched {
    std::vector<int> fds;
    std::function<void(int)> ended;
    bool calling = false;
  };
  void run();
  void forget_sockets(Watched& watched);  // with mutex_ held

  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd: stops the thread
  std::mutex mutex_;
  std::condition_variable callback_done_;
  std::map<Handle, Watched> watched_;
  std::map<int, std::pair<Handle, int>> socket_owner_;  // fd → (watch, peer)
  Handle next_handle_ = 1;
  std::thread thread_;
};

}  // namespace backplane::gloo_plugin
