// backplane's own TCP store (plugins/gloo/tcp_store.h) on loopback: what the rendezvous relies on
// (values, counters, a get that waits for its key and is woken by a set, from several clients at
// once), that every call keeps its deadline: a get whose key never comes, a server that stops
// answering, something at the port that is not a store; and that a torch client is handed off.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/process.h"
#include "tcp_store.h"
#include "tcp_store_wire.h"

namespace {

using backplane::gloo_plugin::TcpStoreClient;
using backplane::gloo_plugin::TcpStoreServer;
using backplane::plugin::Error;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::vector<uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }

long long ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
}

template <typename Call>
Error error_of(Call&& call) {
  try {
    call();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error";
  return Error(BPL_OK, "");
}

class TcpStore : public ::testing::Test {
 protected:
  uint16_t port_ = static_cast<uint16_t>(backplane::test::free_port());
  TcpStoreServer server_{port_};
  TcpStoreClient connect(milliseconds timeout = milliseconds(2000)) {
    return TcpStoreClient("127.0.0.1", port_, timeout, timeout, "rank 0");
  }
};

TEST_F(TcpStore, SetGetAddCheckAcrossClients) {
  TcpStoreClient a = connect(), b = connect();
  EXPECT_FALSE(b.check("k"));
  a.set("k", bytes("value"));
  EXPECT_TRUE(b.check("k"));
  EXPECT_EQ(b.get("k", milliseconds(100)), bytes("value"));
  a.set("empty", {});
  EXPECT_TRUE(b.get("empty", milliseconds(100)).empty());
  std::vector<uint8_t> large(1 << 20);
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<uint8_t>(i * 7);
  a.set("large", large);
  EXPECT_EQ(b.get("large", milliseconds(1000)), large);
  const Error too_large = error_of([&] { a.set("huge", std::vector<uint8_t>(64u << 20)); });
  EXPECT_EQ(too_large.status(), BPL_ERR_INVALID_ARGUMENT) << too_large.what();
  EXPECT_NE(std::string(too_large.what()).find("67108864 bytes for key 'huge'"), std::string::npos) << too_large.what();
  EXPECT_TRUE(a.check("large")) << "the connection goes on after a refused value";
  EXPECT_EQ(a.add("n", 5), 5);
  EXPECT_EQ(b.add("n", -2), 3);
  EXPECT_EQ(a.add("n", 0), 3);
}

// A get waits for its key and is answered as soon as another client sets it; a counter raised from
// many threads and clients at once loses no increment.
TEST_F(TcpStore, GetIsWokenBySetAndCountersAreAtomic) {
  TcpStoreClient waiter = connect();
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    connect().set("late", bytes("here"));
  });
  const auto start = Clock::now();
  EXPECT_EQ(waiter.get("late", milliseconds(5000)), bytes("here"));
  EXPECT_LT(ms_since(start), 2000);
  setter.join();

  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      TcpStoreClient client = connect();
      for (int i = 0; i < 100; ++i) client.add("count", 1);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(waiter.add("count", 0), 400);
}

// A get whose key never comes is a TIMEOUT at its own deadline, and the connection stays usable.
TEST_F(TcpStore, GetOfAKeyThatNeverComesTimesOutAndTheConnectionGoesOn) {
  TcpStoreClient client = connect();
  const auto start = Clock::now();
  const Error e = error_of([&] { client.get("never", milliseconds(300)); });
  EXPECT_EQ(e.status(), BPL_ERR_TIMEOUT) << e.what();
  EXPECT_NE(std::string(e.what()).find("'never' was not set within 300 ms"), std::string::npos) << e.what();
  EXPECT_GE(ms_since(start), 290);
  EXPECT_LT(ms_since(start), 1500);
  EXPECT_FALSE(client.wait_for("never", milliseconds(50)));
  client.set("k", bytes("v"));
  EXPECT_TRUE(client.wait_for("k", milliseconds(50)));
}

// Calls from several threads take the connection in turn: one that waits for another thread's get to
// end is bounded from when it has the connection, and is not failed (nor the connection ended) for
// the time it queued. (The failure board shares a connection between a rank's threads.)
TEST_F(TcpStore, ACallQueuedBehindALongGetIsNotTimedOut) {
  TcpStoreClient client("127.0.0.1", port_, milliseconds(2000), milliseconds(300), "rank 0");
  client.set("k", bytes("v"));
  std::thread long_get([&] { EXPECT_FALSE(client.wait_for("never", milliseconds(800))); });
  std::this_thread::sleep_for(milliseconds(100));  // the get has the connection
  try {
    EXPECT_TRUE(client.check("k"));  // queued about 700 ms, more than its 300 ms bound
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
  }
  long_get.join();
  EXPECT_EQ(client.get("k", milliseconds(100)), bytes("v"));
}

// The server ends with its owner: a client's next call is REMOTE naming the store's address and host,
// at once, and so is every call after it.
TEST(TcpStoreEnds, ACallAfterTheServerEndedIsARemoteErrorNamingIt) {
  const auto port = static_cast<uint16_t>(backplane::test::free_port());
  auto server = std::make_unique<TcpStoreServer>(port);
  TcpStoreClient client("127.0.0.1", port, milliseconds(2000), milliseconds(2000), "rank 0");
  client.set("k", bytes("v"));
  server.reset();
  const auto start = Clock::now();
  const Error e = error_of([&] { client.get("k", milliseconds(1000)); });
  EXPECT_EQ(e.status(), BPL_ERR_REMOTE) << e.what();
  EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
  EXPECT_LT(ms_since(start), 500);
  EXPECT_EQ(error_of([&] { client.check("k"); }).status(), BPL_ERR_REMOTE);
}

// Nothing listens yet: the client tries again until its deadline, then names the address and the host
// that never came; a server that comes within the deadline is met.
TEST(TcpStoreEnds, ConnectWaitsForALateServerWithinItsDeadline) {
  const auto port = static_cast<uint16_t>(backplane::test::free_port());
  const auto start = Clock::now();
  const Error e = error_of([&] { TcpStoreClient("127.0.0.1", port, milliseconds(300), milliseconds(300), "rank 0"); });
  EXPECT_EQ(e.status(), BPL_ERR_TIMEOUT) << e.what();
  EXPECT_NE(std::string(e.what()).find("rank 0, which hosts the store, never came"), std::string::npos) << e.what();
  EXPECT_GE(ms_since(start), 290);
  EXPECT_LT(ms_since(start), 1500);

  std::unique_ptr<TcpStoreServer> server;
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(200));
    server = std::make_unique<TcpStoreServer>(port);
  });
  TcpStoreClient client("127.0.0.1", port, milliseconds(5000), milliseconds(1000), "rank 0");
  late.join();
  client.set("k", bytes("v"));
  EXPECT_TRUE(client.check("k"));
}

// Something that accepts connections and never answers is not taken for a store: TIMEOUT within the
// operation bound. A second server on the same port is refused, naming the port and the reason.
TEST(TcpStoreEnds, APortHeldByAnotherProgramIsNamed) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
  const uint16_t port = ntohs(address.sin_port);
  const auto start = Clock::now();
  const Error silent = error_of([&] { TcpStoreClient("127.0.0.1", port, milliseconds(1000), milliseconds(300), "rank 0"); });
  EXPECT_EQ(silent.status(), BPL_ERR_TIMEOUT) << silent.what();
  EXPECT_NE(std::string(silent.what()).find("not a store"), std::string::npos) << silent.what();
  EXPECT_LT(ms_since(start), 1500);
  const Error taken = error_of([&] { TcpStoreServer second(port); });
  EXPECT_EQ(taken.status(), BPL_ERR_IO) << taken.what();
  EXPECT_NE(std::string(taken.what()).find("port " + std::to_string(port)), std::string::npos) << taken.what();
  ::close(listener);
}

// A connection that opens as torch's TCPStore client does goes to the torch side with every byte read
// from it; one that sends a single byte of that greeting and closes does not, and backplane's own
// clients are served beside them at the same port.
TEST(TcpStoreTorchClients, ATorchGreetingIsHandedOffWithItsBytes) {
  const auto port = static_cast<uint16_t>(backplane::test::free_port());
  std::mutex mutex;
  std::vector<std::vector<uint8_t>> handed;
  TcpStoreServer server(port, [&](int fd, std::vector<uint8_t> received) {
    std::lock_guard<std::mutex> lock(mutex);
    handed.push_back(std::move(received));
    ::close(fd);
  });
  // Sends `opening` (then, with `ends`, nothing more) and waits for the server to close the connection.
  auto send_and_close = [&](const std::vector<uint8_t>& opening, bool ends) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(port);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    ASSERT_EQ(::send(fd, opening.data(), opening.size(), 0), static_cast<ssize_t>(opening.size()));
    if (ends) ::shutdown(fd, SHUT_WR);
    char answer = 0;
    pollfd polled{fd, POLLIN, 0};
    ASSERT_EQ(::poll(&polled, 1, 2000), 1);  // the torch side closes it, or the server
    EXPECT_LE(::recv(fd, &answer, 1, 0), 0);
    ::close(fd);
  };
  std::vector<uint8_t> torch(std::begin(backplane::gloo_plugin::wire::kTorchStoreGreeting),
                             std::end(backplane::gloo_plugin::wire::kTorchStoreGreeting));
  torch.push_back(13);  // the start of the client's next query
  send_and_close(torch, false);
  send_and_close({0}, true);
  TcpStoreClient client("127.0.0.1", port, milliseconds(2000), milliseconds(2000), "bpl-store");
  client.set("key", bytes("value"));
  EXPECT_EQ(client.get("key", milliseconds(1000)), bytes("value"));
  std::lock_guard<std::mutex> lock(mutex);
  ASSERT_EQ(handed.size(), 1u);
  EXPECT_EQ(handed[0], torch);
}

}  // namespace
