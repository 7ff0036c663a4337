// bpl-store: backplane's TCP store (plugins/gloo/tcp_store.h) for a launcher, in a process of its own.
//
// --port P serves a job's store: bpl-run starts it beside the ranks, as torchrun's agent hosts the store
// of its workers; --host H listens only where the job's processes connect (MASTER_ADDR), and
// BPL_STORE_SECRET, where set, admits only the processes that have it (tcp_store.h). A torch.distributed client that connects there is served torch's own TCPStore
// (store_torch_relay.h; --torch-store-module names the module that serves it), so a job needs one port. The store then outlives any rank: the survivors of a rank's failure, rank 0's
// included, still meet there to agree and go on (docs/faults.md), and a rank that cannot reach it knows
// it is cut off from the job. It says "bpl-store: listening on port P" on stdout once it serves, and
// ends on SIGTERM or SIGINT, or when the process that started it ends, however it ends (the kernel tells
// it: PR_SET_PDEATHSIG).
//
// --client HOST:PORT lends the same store's client to a launcher written in another language (bpl-run's
// agents meeting across nodes): one request a line on stdin, one answer a line on stdout, each bounded
// by --timeout-ms. Values travel in hex, so that any bytes fit a line. Requests: "set KEY HEX" (ok),
// "add KEY DELTA" (the sum), "check KEY" (1 or 0), "wait KEY MS" (1 once set, 0 if not within MS),
// "get KEY" (the value in hex; the key must be set: wait first), "on-close KEY HEX" (the server sets KEY
// when this client's connection ends, however bpl-store ends: ok). An answer "error MESSAGE" ends the
// client: every later request gets the same error.
#include <CLI/CLI.hpp>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "store_torch_relay.h"
#include "tcp_store.h"

namespace {

using backplane::gloo_plugin::TcpStoreClient;
using backplane::gloo_plugin::TcpStoreServer;

// Ends this process when the one that started it ends; false if it has ended already.
bool end_with_parent() {
  const pid_t launcher = getppid();
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  return getppid() == launcher;
}

int serve(int port, const std::string& host, const std::string& torch_store_module) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  // Blocked before the server's thread starts, so that only sigwait takes them; the launcher's end is
  // one of them.
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  if (!end_with_parent()) return 0;
  // Also bpl-store's host (store_torch_relay.cpp): what the store says of the connections it ends (a
  // process without the job's secret, one that is no client of the store) goes to stderr.
  TorchStoreRelay torch_clients(torch_store_module);
  TcpStoreServer server(
      static_cast<uint16_t>(port),
      [&torch_clients](int fd, std::vector<uint8_t> received) { torch_clients.take(fd, std::move(received)); },
      backplane::gloo_plugin::TcpStoreLimits(),
      backplane::gloo_plugin::TcpStoreAdmission{host, backplane::gloo_plugin::store_secret_from_environment()});
  std::printf("bpl-store: listening on port %d\n", port);
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&stop, &signal_number);
  // Now, connections and all: the kernel ends them, and torch's side (never torn down while its relays
  // may run) gets no static destructors to run under them.
  std::_Exit(0);
}

std::string to_hex(const std::vector<uint8_t>& bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string text;
  for (uint8_t b : bytes) text += {digits[b >> 4], digits[b & 15]};
  return text;
}

std::vector<uint8_t> from_hex(const std::string& text) {
  if (text.size() % 2 != 0 || text.find_first_not_of("0123456789abcdef") != std::string::npos) {
    throw std::invalid_argument("'" + text + "' is not a value in hex");
  }
  std::vector<uint8_t> bytes;
  for (size_t i = 0; i < text.size(); i += 2) bytes.push_back(static_cast<uint8_t>(std::stoi(text.substr(i, 2), nullptr, 16)));
  return bytes;
}

std::string answer(TcpStoreClient& client, const std::string& line) {
  std::istringstream words(line);
  std::string op, key, argument;
  words >> op >> key >> argument;
  if (op == "set") {
    client.set(key, from_hex(argument));
    return "ok";
  }
  if (op == "add") return std::to_string(client.add(key, std::stoll(argument)));
  if (op == "check") return client.check(key) ? "1" : "0";
  if (op == "wait") return client.wait_for(key, std::chrono::milliseconds(std::stoll(argument))) ? "1" : "0";
  if (op == "get") {
    if (!client.check(key)) throw std::invalid_argument("get " + key + ": not set (wait for it first)");
    return to_hex(client.get(key, std::chrono::milliseconds(0)));
  }
  if (op == "on-close") {
    client.set_when_closed(key, from_hex(argument));
    return "ok";
  }
  throw std::invalid_argument("'" + op + "' is not a request: expected set, add, check, wait, get or on-close");
}

int bridge(const std::string& where, int64_t timeout_ms) {
  const size_t colon = where.rfind(':');
  const std::string host = colon == std::string::npos ? "" : where.substr(0, colon);
  const int port = colon == std::string::npos ? 0 : std::atoi(where.c_str() + colon + 1);
  if (host.empty() || port < 1 || port > 65535) {
    std::fprintf(stderr, "bpl-store: --client %s: expected HOST:PORT\n", where.c_str());
    return 2;
  }
  if (!end_with_parent()) return 0;
  const auto timeout = std::chrono::milliseconds(timeout_ms);
  TcpStoreClient client(host, static_cast<uint16_t>(port), timeout, timeout, "the rendezvous host");
  std::printf("connected\n");
  std::fflush(stdout);
  std::string line, failed;
  while (std::getline(std::cin, line)) {
    std::string reply;
    try {
      reply = failed.empty() ? answer(client, line) : failed;
    } catch (const backplane::plugin::Error& e) {
      reply = failed = std::string("error ") + e.what();
    } catch (const std::exception& e) {  // a malformed request: the connection is still good
      reply = std::string("error ") + e.what();
    }
    std::printf("%s\n", reply.c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int port = 0;
  std::string client, host, torch_store_module;
  int64_t timeout_ms = 30000;
  CLI::App app{"Serves backplane's store for a job (--port), or lends its client to a launcher (--client).",
               "bpl-store"};
  app.set_version_flag("--version", std::string("bpl-store (backplane) ") + BPL_VERSION);
  auto* serving = app.add_option("--port", port, "serve the store on this TCP port")->check(CLI::Range(1, 65535));
  app.add_option("--host", host, "--port: listen only at this address of this machine (default: every interface)")
      ->needs(serving);
  auto* bridging = app.add_option("--client", client, "HOST:PORT: requests on stdin, answers on stdout");
  serving->excludes(bridging);
  app.add_option("--torch-store-module", torch_store_module,
                 "--port: libbpl-torch-store.so, which serves torch.distributed's clients at the same port")
      ->check(CLI::ExistingFile)
      ->needs(serving);
  app.add_option("--timeout-ms", timeout_ms, "--client: the bound of the connection and of each request (default 30000)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  try {
    app.parse(argc, argv);
    if (port == 0 && client.empty()) throw CLI::RequiredError("--port or --client");
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return client.empty() ? serve(port, host, torch_store_module) : bridge(client, timeout_ms);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bpl-store: %s\n", e.what());
    return 1;
  }
}
