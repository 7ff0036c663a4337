#include "store_torch_relay.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "plugin_support.h"
#include "side_module.h"
#include "torch_store_module.h"

namespace {

// The module loader reads the environment (BPL_TORCH_DIR, VIRTUAL_ENV) through its host, as in a plugin:
// bpl-store is its own host.
void log_to_stderr(int32_t, const char* source, const char* message) {
  std::fprintf(stderr, "bpl-store: %s: %s\n", source, message);
}
const char* environment(const char* name) { return ::secure_getenv(name); }
void keep_no_error(const char*) {}
const bpl_host_api kStoreHost = {sizeof(bpl_host_api), BPL_ABI_MAJOR, BPL_ABI_MINOR, BPL_LOG_WARN, 0,
                                 log_to_stderr, environment, keep_no_error, nullptr};

bool send_all(int fd, const uint8_t* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// A blocking connection to the torch store on this host's loopback, or -1.
int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  const int on = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
  return fd;
}

// Copies each side's bytes to the other until either ends; then ends both.
void relay(int client, int torch) {
  pollfd polled[2] = {{client, POLLIN, 0}, {torch, POLLIN, 0}};
  uint8_t chunk[64 * 1024];
  for (bool open = true; open;) {
    if (::poll(polled, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int side = 0; side < 2 && open; ++side) {
      if (polled[side].revents == 0) continue;
      const ssize_t n = ::recv(polled[side].fd, chunk, sizeof(chunk), 0);
      if (n < 0 && errno == EINTR) continue;
      open = n > 0 && send_all(polled[1 - side].fd, chunk, static_cast<size_t>(n));
    }
  }
  ::close(client);
  ::close(torch);
}

}  // namespace

struct TorchStoreRelay::TorchSide {
  std::string module_path;
  std::mutex mutex;
  int port = 0;         // the torch store's, once it serves
  std::string failure;  // why it cannot, once that is known

  // The torch store's port, started on the first call; 0 when it cannot serve (failure says why).
  int serving_port() {
    std::lock_guard<std::mutex> lock(mutex);
    if (port != 0 || !failure.empty()) return port;
    if (module_path.empty()) {
      failure = "this tree has no torch store module (it was built without LibTorch)";
      return 0;
    }
    backplane::plugin::SideModule module = backplane::plugin::load_side_module_at(module_path, "the torch store module");
    auto serve = reinterpret_cast<backplane::gloo_plugin::TorchStoreServe>(
        module.symbol(backplane::gloo_plugin::kTorchStoreServeSymbol));
    char error[1024] = {};
    int32_t served = 0;
    if (serve == nullptr) {
      failure = module.failure;
    } else if (serve(&served, error, sizeof(error)) != BPL_OK) {
      failure = std::string("torch's TCPStore did not start: ") + error;
    } else {
      port = served;
    }
    if (!failure.empty()) std::fprintf(stderr, "bpl-store: a torch.distributed client connected, but %s\n", failure.c_str());
    return port;
  }
};

TorchStoreRelay::TorchStoreRelay(std::string module_path) : torch_(std::make_shared<TorchSide>()) {
  torch_->module_path = std::move(module_path);
  if (backplane::plugin::host() == nullptr) backplane::plugin::host() = &kStoreHost;
}

void TorchStoreRelay::take(int fd, std::vector<uint8_t> received) {
  std::thread([torch = torch_, fd, received = std::move(received)] {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    const int port = torch->serving_port();
    const int upstream = port != 0 ? connect_loopback(port) : -1;
    if (upstream < 0 || !send_all(upstream, received.data(), received.size())) {
      if (upstream >= 0) ::close(upstream);
      ::close(fd);  // the client's own error follows: its store closed the connection
      return;
    }
    relay(fd, upstream);
  }).detach();
}
