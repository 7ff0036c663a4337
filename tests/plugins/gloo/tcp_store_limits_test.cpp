// The bounds of backplane's TCP store (TcpStoreLimits): the values' total, a connection that sits on
// part of a frame, and a process out of file descriptors, where accepting pauses instead of spinning.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "support/process.h"
#include "tcp_store.h"
#include "tcp_store_wire.h"

namespace {

using backplane::gloo_plugin::TcpStoreClient;
using backplane::gloo_plugin::TcpStoreLimits;
using backplane::gloo_plugin::TcpStoreServer;
using backplane::plugin::Error;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

int connect_to(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Milliseconds until the server closes `fd` (reading what it sends first), or -1 after `within`.
long long ms_until_closed(int fd, milliseconds within) {
  const auto start = Clock::now();
  char buffer[256];
  for (;;) {
    const auto left = within - std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    pollfd polled{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&polled, 1, static_cast<int>(left.count())) != 1) return -1;
    if (::recv(fd, buffer, sizeof(buffer), 0) <= 0) {
      return std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
    }
  }
}

TEST(TcpStoreLimits, AValuePastTheStoresBoundIsRefusedNamingIt) {
  const auto port = static_cast<uint16_t>(backplane::test::free_port());
  TcpStoreLimits limits;
  limits.stored_bytes = 1 << 20;
  TcpStoreServer server(port, nullptr, limits);
  TcpStoreClient client("127.0.0.1", port, milliseconds(2000), milliseconds(2000), "the test's store");
  const std::vector<uint8_t> big(600 << 10, 7);
  client.set("a", big);
  try {
    client.set("b", big);
    FAIL() << "a second 600 KiB value went past a bound of 1 MiB";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), BPL_ERR_OUT_OF_MEMORY);
    EXPECT_NE(std::string(e.what()).find("refused key 'b' (614400 bytes): it holds as much as it may"), std::string::npos)
        << e.what();
  }
  try {
    client.add(std::string(500 << 10, 'k'), 1);  // a counter's key counts too
    FAIL() << "a counter past the bound was kept";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), BPL_ERR_OUT_OF_MEMORY) << e.what();
    EXPECT_NE(std::string(e.what()).find("refused to add to key"), std::string::npos) << e.what();
  }
  client.set("a", big);  // replacing a value counts it once
  EXPECT_EQ(client.get("a", milliseconds(1000)), big);
  client.erase_prefix("a");
  client.set("b", big);  // erased keys free their room
  EXPECT_FALSE(client.check("a"));
}

TEST(TcpStoreLimits, AConnectionSittingOnPartOfAFrameOrOnNoGreetingIsClosed) {
  const auto port = static_cast<uint16_t>(backplane::test::free_port());
  TcpStoreLimits limits;
  limits.partial_frame_idle = milliseconds(300);
  TcpStoreServer server(port, nullptr, limits);
  const int silent = connect_to(port), partial = connect_to(port);
  ASSERT_GE(silent, 0);
  ASSERT_GE(partial, 0);
  std::vector<uint8_t> opening(backplane::gloo_plugin::wire::kGreeting,
                               backplane::gloo_plugin::wire::kGreeting + backplane::gloo_plugin::wire::kGreetingSize);
  opening.insert(opening.end(), {64, 0});  // two bytes of a frame's length
  ASSERT_EQ(::send(partial, opening.data(), opening.size(), 0), static_cast<ssize_t>(opening.size()));
  const auto start = Clock::now();
  for (int fd : {silent, partial}) {
    EXPECT_GE(ms_until_closed(fd, milliseconds(5000)), 0) << "still open after 5 s";
    const auto closed_after = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
    EXPECT_GE(closed_after, 200);
    EXPECT_LT(closed_after, 2000);
    ::close(fd);
  }
  // The store serves on.
  TcpStoreClient client("127.0.0.1", port, milliseconds(2000), milliseconds(2000), "the test's store");
  client.set("k", {1});
  EXPECT_TRUE(client.check("k"));
}

// Resident memory of this process, in MiB.
long resident_mib() {
  long pages = 0, resident = 0;
  FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr || std::fscanf(statm, "%ld %ld", &pages, &resident) != 2) resident = 0;
  if (statm != nullptr) std::fclose(statm);
  return resident * ::sysconf(_SC_PAGESIZE) / (1 << 20);
}

// A client that asks 100 times for an 8 MiB value and reads nothing makes the store hold about a frame
// of answers for it, not 800 MiB; as it reads, the store serves the rest.
TEST(TcpStoreLimits, AClientThatReadsNoAnswerIsServedOnlyAsItReads) {
  const auto port = static_cast<uint16_t>(backplane::test::free_port());
  TcpStoreServer server(port, nullptr);
  const size_t value_bytes = size_t{8} << 20;
  TcpStoreClient("127.0.0.1", port, milliseconds(2000), milliseconds(2000), "the test's store")
      .set("big", std::vector<uint8_t>(value_bytes, 7));
  const int fd = connect_to(port);
  ASSERT_GE(fd, 0);
  namespace wire = backplane::gloo_plugin::wire;
  std::vector<uint8_t> asked(wire::kGreeting, wire::kGreeting + wire::kGreetingSize);
  std::vector<uint8_t> get{wire::kGet};
  wire::put_i64(get, 0);
  wire::put_string(get, "big");
  const int gets = 100;
  for (int i = 0; i < gets; ++i) {
    const std::vector<uint8_t> frame = wire::framed(get);
    asked.insert(asked.end(), frame.begin(), frame.end());
  }
  const long before = resident_mib();
  ASSERT_EQ(::send(fd, asked.data(), asked.size(), 0), static_cast<ssize_t>(asked.size()));
  std::this_thread::sleep_for(milliseconds(1000));
  const long held = resident_mib() - before;
  EXPECT_LT(held, 300) << "MiB the store took for the answers of a client that reads none";
  // Read every answer: the greeting, then `gets` frames of 1 + value_bytes bytes.
  const size_t expected = wire::kGreetingSize + gets * (4 + 1 + value_bytes);
  std::vector<uint8_t> chunk(1 << 20);
  size_t received = 0;
  while (received < expected) {
    pollfd polled{fd, POLLIN, 0};
    if (::poll(&polled, 1, 5000) != 1) break;
    const ssize_t n = ::recv(fd, chunk.data(), chunk.size(), 0);
    if (n <= 0) break;
    received += static_cast<size_t>(n);
  }
  ::close(fd);
  EXPECT_EQ(received, expected) << "bytes of answers read";
}

// In a child process whose file descriptors run out while a connection waits to be accepted: over
// a second, the store's thread uses a few milliseconds of CPU, not the whole second.
TEST(TcpStoreLimits, NoFileDescriptorLeftPausesAcceptingWithoutSpinning) {
  const auto port = static_cast<uint16_t>(backplane::test::free_port());
  const pid_t child = ::fork();
  if (child == 0) {
    TcpStoreServer server(port, nullptr);
    std::vector<int> held;
    for (int fd; (fd = ::open("/dev/null", O_RDONLY)) >= 0 && held.size() < 100000;) held.push_back(fd);
    rlimit files{};
    ::getrlimit(RLIMIT_NOFILE, &files);
    files.rlim_cur = static_cast<rlim_t>(held.back() + 1);  // every descriptor below it is taken
    ::setrlimit(RLIMIT_NOFILE, &files);
    ::close(held.back());
    const int client = connect_to(port);  // the last descriptor: the server has none to accept it with
    if (client < 0) ::_exit(101);
    rusage before{}, after{};
    ::getrusage(RUSAGE_SELF, &before);
    std::this_thread::sleep_for(milliseconds(1000));
    ::getrusage(RUSAGE_SELF, &after);
    const auto cpu_ms = [](const rusage& u) {
      return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1000 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1000;
    };
    ::_exit(static_cast<int>(std::min<long>(cpu_ms(after) - cpu_ms(before), 100)));
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_NE(WEXITSTATUS(status), 101) << "the child could not connect";
  EXPECT_LT(WEXITSTATUS(status), 50) << "ms of CPU used in a second while no descriptor was left";
}

}  // namespace
