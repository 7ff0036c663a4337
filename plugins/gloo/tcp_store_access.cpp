// Where backplane's TCP store listens, and whom it admits (TcpStoreAdmission, tcp_store.h).
#include "tcp_store_access.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "tcp_store.h"

namespace backplane::gloo_plugin {

namespace {

// A listening socket at `address`, or -1 with errno set.
int listen_at(const sockaddr* address, socklen_t length) {
  const int fd = ::socket(address->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int on = 1, off = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (address->sa_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));  // IPv4 too
  if (::bind(fd, address, length) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int error = errno;
    ::close(fd);
    errno = error;
    return -1;
  }
  return fd;
}

// Every interface, IPv6 and IPv4 alike, as torch's TCPStore listens; IPv4 alone on a host without IPv6.
int listen_everywhere(uint16_t port) {
  sockaddr_in6 v6{};
  v6.sin6_family = AF_INET6;
  v6.sin6_addr = in6addr_any;
  v6.sin6_port = htons(port);
  int fd = listen_at(reinterpret_cast<sockaddr*>(&v6), sizeof(v6));
  if (fd >= 0 || errno == EADDRINUSE) return fd;
  sockaddr_in v4{};
  v4.sin_family = AF_INET;
  v4.sin_addr.s_addr = htonl(INADDR_ANY);
  v4.sin_port = htons(port);
  return listen_at(reinterpret_cast<sockaddr*>(&v4), sizeof(v4));
}

// Where the clients connect: an address given as a number (or localhost) is listened at alone, where it
// is this machine's. A name other than localhost may resolve here to another address than the clients'
// (Debian maps the host's own name to 127.0.1.1), and a number to one behind NAT: every interface then.
}  // namespace

int listen_where_clients_connect(const std::string& host, uint16_t port) {
  if (host.empty()) return listen_everywhere(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (host == "localhost" ? 0 : AI_NUMERICHOST);
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return listen_everywhere(port);
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = listen_at(a->ai_addr, a->ai_addrlen);
    if (fd < 0 && errno == EADDRINUSE) break;
  }
  const int error = errno;
  ::freeaddrinfo(found);
  if (fd >= 0 || error == EADDRINUSE) {
    errno = error;
    return fd;
  }
  plugin::log(BPL_LOG_INFO, "store", host + " is no address of this machine: the store listens on every interface");
  return listen_everywhere(port);
}

bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ |= static_cast<unsigned char>(a[i] ^ b[i]);
  return differ == 0;
}

std::string text_of_address(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = "";
  uint16_t port = 0;
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    ::inet_ntop(AF_INET, &v4.sin_addr, text, sizeof(text));
    port = ntohs(v4.sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
    ::inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof(text));
    port = ntohs(v6.sin6_port);
  }
  return std::string(text[0] != '\0' ? text : "an unknown address") + ":" + std::to_string(port);
}

std::string store_secret_from_environment() {
  const char* name = "BPL_STORE_SECRET";
  // A plugin reads it as its host does; a program of the project's own (bpl-store, a benchmark) has none.
  const char* value = plugin::host() != nullptr ? plugin::env(name) : std::getenv(name);
  const std::string secret = value != nullptr ? value : "";
  if (secret.size() > kMaxStoreSecret) {
    throw plugin::Error(BPL_ERR_INVALID_ARGUMENT, std::string(name) + " is " + std::to_string(secret.size()) +
                                                      " bytes long: expected at most " + std::to_string(kMaxStoreSecret));
  }
  return secret;
}

}  // namespace backplane::gloo_plugin
