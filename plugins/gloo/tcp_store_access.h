// Where backplane's TCP store listens, and whom it admits (TcpStoreAdmission, tcp_store.h): the
// server's side of both.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>

namespace backplane::gloo_plugin {

// A listening socket where the clients connect to `host` (TcpStoreAdmission::listen_host), or -1 with
// errno set.
int listen_where_clients_connect(const std::string& host, uint16_t port);

// Whether a client's secret is the store's, in time that does not depend on where they differ.
bool same_secret(const std::string& a, const std::string& b);

// "198.18.0.2:41234": where a connection came from, for what the store says of it.
std::string text_of_address(const sockaddr_storage& address);

}  // namespace backplane::gloo_plugin
