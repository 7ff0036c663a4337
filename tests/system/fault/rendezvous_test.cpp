// The launcher and the rendezvous: bpl-run names a killed rank and stops the others; a port in use, a
// store host stopped, an address or interface that is wrong, ranks missing, duplicated or disagreeing.
#include "system/fault/fault_checks.h"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "backplane/backplane.h"

namespace backplane::test::faults {
namespace {

TEST(FaultGloo, BplRunNamesTheKilledRankAndStopsTheOthers) {
  ProcessResult r = backplane::test::run_process(
      {std::string(BPL_BIN_DIR) + "/bpl-run", "--nproc-per-node", "3", self_path(), "--worker=kill_mid_allreduce"},
      {{"BPL_BACKEND", "gloo"}, {"BPL_TIMEOUT_MS", std::to_string(kTimeoutMs)}});
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("bpl-run: rank 1 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was killed by SIGKILL"), std::string::npos) << r.output;
}

/* ---- 8. rendezvous ---- */

// Starts join_and_leave as the given (rank, world size) pairs on one port; returns their results.
std::vector<ProcessResult> start_ranks(const std::vector<std::pair<int, int>>& ranks, int port,
                                       int timeout_ms = kTimeoutMs) {
  std::vector<backplane::test::Process> started;
  for (const auto& [rank, world] : ranks) {
    auto env = backplane::test::rank_env(rank, world, port);
    env["BPL_BACKEND"] = "gloo";
    env["BPL_TIMEOUT_MS"] = std::to_string(timeout_ms);
    started.push_back(backplane::test::start_process({self_path(), "--worker=join_and_leave"}, env));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // in order: the first is the earlier rank
  }
  std::vector<ProcessResult> results;
  for (auto& process : started) results.push_back(backplane::test::finish_process(process, std::chrono::seconds(30)));
  return results;
}

TEST(Rendezvous, PortInUseFailsAtOnceNamingIt) {
  const int port = backplane::test::free_port();
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  auto results = start_ranks({{0, 2}}, port, 20000);
  close(listener);
  EXPECT_EQ(results[0].exit_code, 4) << results[0].output;
  // Most of it is loading the plugin (LibTorch's c10d), 0.7 s here and 1.5-2.1 s under sanitizers.
  EXPECT_LT(init_ms(results[0]), 5000) << "not at the 20 s timeout: " << results[0].output;
  EXPECT_NE(results[0].output.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << results[0].output;
  EXPECT_NE(results[0].output.find("Address already in use"), std::string::npos) << results[0].output;
}

// A listening socket on 127.0.0.1:`port` that is not a store. With `close_at_once` a thread accepts
// every connection and closes it at once; otherwise nothing ever accepts (the kernel completes the
// connections into the backlog, so a client's connect succeeds and its first request is never read).
class NotAStore {
 public:
  NotAStore(int port, bool close_at_once) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    const int on = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    listening_ = bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 && listen(fd_, 64) == 0;
    if (close_at_once) {
      closer_ = std::thread([this] {
        while (!stop_) {
          pollfd ready{fd_, POLLIN, 0};
          if (poll(&ready, 1, 50) > 0) {
            const int connection = accept(fd_, nullptr, nullptr);
            if (connection >= 0) close(connection);
          }
        }
      });
    }
  }
  ~NotAStore() {
    stop_ = true;
    if (closer_.joinable()) closer_.join();
    close(fd_);
  }
  bool listening() const { return listening_; }

 private:
  int fd_ = -1;
  bool listening_ = false;
  std::atomic<bool> stop_{false};
  std::thread closer_;
};

// MASTER_PORT held by a program that is not a store: a rank that connects there fails within the
// timeout, with a message saying so (no hang while the program runs, no crash when it closes).
TEST(Rendezvous, PortHeldByAProgramThatIsNotAStoreFailsWithinTheTimeout) {
  for (const bool close_at_once : {false, true}) {
    SCOPED_TRACE(close_at_once ? "accepts and closes" : "never answers");
    const int port = backplane::test::free_port();
    NotAStore listener(port, close_at_once);
    ASSERT_TRUE(listener.listening());
    auto results = start_ranks({{1, 2}}, port, 3000);
    EXPECT_EQ(results[0].signal, 0) << results[0].output;
    EXPECT_EQ(results[0].exit_code, 4) << results[0].output;
    EXPECT_LT(init_ms(results[0]), 3000 + kInitBeyondTimeoutMs) << results[0].output;
    EXPECT_NE(results[0].output.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << results[0].output;
    EXPECT_NE(results[0].output.find("not a store"), std::string::npos) << results[0].output;
    std::printf("%s: %s", close_at_once ? "accepts and closes" : "never answers", results[0].output.c_str());
  }
}

// Rank 0 stopped right after it opened the store: a rank joining then fails at the timeout with a
// TIMEOUT naming the store, instead of waiting for rank 0 to come back.
TEST(Rendezvous, StoppedStoreHostFailsAJoiningRankAtTheTimeout) {
  const int port = backplane::test::free_port();
  auto env = backplane::test::rank_env(0, 2, port);
  env["BPL_BACKEND"] = "gloo";
  env["BPL_TIMEOUT_MS"] = std::to_string(kTimeoutMs);
  backplane::test::Process host = backplane::test::start_process({self_path(), "--worker=join_and_leave"}, env);
  // Stopped as soon as its store listens.
  const auto give_up = Clock::now() + std::chrono::seconds(20);
  bool listening = false;
  while (!listening && Clock::now() < give_up) {
    const int probe = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    listening = connect(probe, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    close(probe);
    if (!listening) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(host.pid, SIGSTOP);
  ASSERT_TRUE(listening) << "rank 0 never opened its store";
  auto results = start_ranks({{1, 2}}, port, kTimeoutMs);
  kill(host.pid, SIGKILL);
  backplane::test::finish_process(host, std::chrono::seconds(10));
  EXPECT_EQ(results[0].exit_code, 4) << results[0].output;
  EXPECT_NE(results[0].output.find("BPL_ERR_TIMEOUT"), std::string::npos) << results[0].output;
  EXPECT_GE(init_ms(results[0]), kTimeoutMs / 2) << results[0].output;
  EXPECT_LT(init_ms(results[0]), kTimeoutMs + kInitBeyondTimeoutMs) << results[0].output;
  EXPECT_NE(results[0].output.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << results[0].output;
  EXPECT_NE(results[0].output.find("did not answer"), std::string::npos) << results[0].output;
  std::printf("%s", results[0].output.c_str());
}

// A MASTER_ADDR that does not resolve is reported as such, naming it, within the timeout. The rank
//     runs in a network namespace of its own with only a loopback that is down: the lookup fails
//     without sending anything anywhere.
TEST(Rendezvous, UnresolvableMasterAddrIsReportedAsSuch) {
  if (backplane::test::run_process({"unshare", "--net", "true"}, {}).exit_code != 0) {
    GTEST_SKIP() << "cannot make a network namespace here (unshare --net needs root or CAP_SYS_ADMIN)";
  }
  for (const int rank : {0, 1}) {
    auto env = backplane::test::rank_env(rank, 2, backplane::test::free_port());
    env["BPL_BACKEND"] = "gloo";
    env["BPL_TIMEOUT_MS"] = std::to_string(kTimeoutMs);
    env["MASTER_ADDR"] = "no-such-host.invalid";
    ProcessResult r = backplane::test::run_process({"unshare", "--net", self_path(), "--worker=join_and_leave"}, env,
                                                   std::chrono::seconds(30));
    EXPECT_EQ(r.exit_code, 4) << r.output;
    EXPECT_LE(init_ms(r), kTimeoutMs + kInitBeyondTimeoutMs) << r.output;
    EXPECT_NE(r.output.find("MASTER_ADDR 'no-such-host.invalid' does not resolve"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("MASTER_PORT"), std::string::npos) << "a hint about the port misleads: " << r.output;
    std::printf("rank %d: %s", rank, r.output.c_str());
  }
}

// A GLOO_SOCKET_IFNAME that names no interface is refused, naming it and the interfaces there are.
//     (In a network namespace of its own: nothing is sent anywhere.)
TEST(Rendezvous, AnUnknownSocketInterfaceIsRefusedNamingIt) {
  if (backplane::test::run_process({"unshare", "--net", "true"}, {}).exit_code != 0) {
    GTEST_SKIP() << "cannot make a network namespace here (unshare --net needs root or CAP_SYS_ADMIN)";
  }
  auto env = backplane::test::rank_env(1, 2, backplane::test::free_port());
  env["BPL_BACKEND"] = "gloo";
  env["MASTER_ADDR"] = "198.18.0.1";  // the range set aside for tests; unreachable from the namespace
  env["GLOO_SOCKET_IFNAME"] = "no-such-interface";
  ProcessResult r = backplane::test::run_process({"unshare", "--net", self_path(), "--worker=join_and_leave"}, env,
                                                 std::chrono::seconds(30));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("BPL_ERR_INVALID_ARGUMENT"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("GLOO_SOCKET_IFNAME='no-such-interface' names no interface of this host (it has: lo)"),
            std::string::npos)
      << r.output;
}

TEST(Rendezvous, MissingRankFailsEveryOtherAtTheTimeoutNamingIt) {
  auto results = start_ranks({{0, 3}, {2, 3}}, backplane::test::free_port(), 2000);
  for (const ProcessResult& r : results) {
    EXPECT_EQ(r.exit_code, 4) << r.output;
    EXPECT_NE(r.output.find("BPL_ERR_TIMEOUT"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("2/3 joined, missing ranks [1]"), std::string::npos) << r.output;
    EXPECT_GE(init_ms(r), 1900) << r.output;
    EXPECT_LT(init_ms(r), 6000) << r.output;
  }
}

TEST(Rendezvous, DuplicateRankFailsEveryRankFast) {
  auto results = start_ranks({{0, 3}, {1, 3}, {1, 3}}, backplane::test::free_port(), 20000);
  for (const ProcessResult& r : results) {
    EXPECT_EQ(r.exit_code, 4) << r.output;
    EXPECT_NE(r.output.find("BPL_ERR_MISMATCH"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("another process already joined as rank 1"), std::string::npos) << r.output;
    EXPECT_LT(init_ms(r), 5000) << "not at the 20 s timeout: " << r.output;
  }
}

TEST(Rendezvous, RanksDisagreeingOnTheWorldSizeFailFast) {
  auto results = start_ranks({{0, 2}, {1, 3}}, backplane::test::free_port(), 20000);
  for (const ProcessResult& r : results) {
    EXPECT_EQ(r.exit_code, 4) << r.output;
    EXPECT_NE(r.output.find("BPL_ERR_MISMATCH"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("WORLD_SIZE=3 but an earlier rank with WORLD_SIZE=2"), std::string::npos) << r.output;
    EXPECT_LT(init_ms(r), 5000) << r.output;
  }
}

TEST(Rendezvous, BadWorldSizesAreRefusedBeforeAnyConnection) {
  const std::vector<std::pair<std::pair<int, int>, std::string>> cases = {
      {{3, 3}, "rank 3 (from torchrun) is not below the world size 3"},
      {{0, 0}, "WORLD_SIZE='0' is not valid: expected an integer in [1, "},
      {{-1, 2}, "RANK='-1' is not valid: expected an integer in [0, "}};
  for (const auto& [launch, names] : cases) {
    auto results = start_ranks({launch}, backplane::test::free_port());
    EXPECT_EQ(results[0].exit_code, 4) << results[0].output;
    EXPECT_NE(results[0].output.find("BPL_ERR_INVALID_ARGUMENT"), std::string::npos) << results[0].output;
    EXPECT_NE(results[0].output.find(names), std::string::npos) << results[0].output;
    EXPECT_LT(init_ms(results[0]), 2000) << results[0].output;
  }
}

}  // namespace
}  // namespace backplane::test::faults
