// Who backplane's TCP store serves (TcpStoreAdmission): only the clients that give the job's secret,
// and only at the address its clients connect to; what it refuses, it says, naming where it came from.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/process.h"
#include "tcp_store.h"
#include "tcp_store_wire.h"

namespace {

using backplane::gloo_plugin::TcpStoreAdmission;
using backplane::gloo_plugin::TcpStoreClient;
using backplane::gloo_plugin::TcpStoreLimits;
using backplane::gloo_plugin::TcpStoreServer;
using backplane::plugin::Error;
using std::chrono::milliseconds;

// What the server logs, as a plugin's host would show it.
std::mutex said_mutex;
std::vector<std::string> said;
void keep_line(int32_t, const char*, const char* message) {
  std::lock_guard<std::mutex> lock(said_mutex);
  said.emplace_back(message);
}
const char* no_variable(const char*) { return nullptr; }
void no_error(const char*) {}
const bpl_host_api kHost = {sizeof(bpl_host_api), BPL_ABI_MAJOR, BPL_ABI_MINOR, BPL_LOG_WARN, 0, keep_line, no_variable,
                            no_error, nullptr};

// What the server said, once it said `expected` (it may say it just after its answer), or within 2 s.
std::string said_lines(const std::string& expected) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    std::string all;
    {
      std::lock_guard<std::mutex> lock(said_mutex);
      for (const std::string& line : said) all += line + "\n";
    }
    if (all.find(expected) != std::string::npos || std::chrono::steady_clock::now() > give_up) return all;
    std::this_thread::sleep_for(milliseconds(10));
  }
}

// A connection to `address`:`port`, or -1 when nothing listens there.
int connect_to(const char* address, uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  ::inet_pton(AF_INET, address, &to.sin_addr);
  to.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

class TcpStoreAdmissionTest : public ::testing::Test {
 protected:
  void SetUp() override { backplane::plugin::host() = &kHost; }
  void TearDown() override { backplane::plugin::host() = nullptr; }

  TcpStoreClient client(const std::string& secret) {
    return TcpStoreClient("127.0.0.1", port_, milliseconds(2000), milliseconds(2000), "rank 0", secret);
  }
  std::string refusal(const std::string& secret) {
    try {
      client(secret);
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), BPL_ERR_INVALID_ARGUMENT) << e.what();
      return e.what();
    }
    return "admitted";
  }

  uint16_t port_ = static_cast<uint16_t>(backplane::test::free_port());
  TcpStoreServer server_{port_, nullptr, TcpStoreLimits(), TcpStoreAdmission{"127.0.0.1", "the job's secret"}};
};

TEST_F(TcpStoreAdmissionTest, OnlyAClientWithTheJobsSecretIsServed) {
  TcpStoreClient member = client("the job's secret");
  member.set("key", {1, 2, 3});
  EXPECT_EQ(member.get("key", milliseconds(1000)), (std::vector<uint8_t>{1, 2, 3}));

  const std::string without = refusal("");
  EXPECT_NE(without.find("refused this process: it serves only the job's processes, and BPL_STORE_SECRET is not set "
                         "here"),
            std::string::npos)
      << without;
  const std::string wrong = refusal("another job's secret");
  EXPECT_NE(wrong.find("refused this process: BPL_STORE_SECRET here is not the job's"), std::string::npos) << wrong;
  EXPECT_NE(wrong.find("127.0.0.1:" + std::to_string(port_) + " (rank 0's)"), std::string::npos) << wrong;

  said_lines("it gave no secret");
  const std::string lines = said_lines("its secret is not the job's");
  EXPECT_NE(lines.find("closed the connection from 127.0.0.1:"), std::string::npos) << lines;
  EXPECT_NE(lines.find("it gave no secret"), std::string::npos) << lines;
  EXPECT_NE(lines.find("its secret is not the job's (BPL_STORE_SECRET)"), std::string::npos) << lines;
}

// A process that speaks the protocol but skips the admission reads nothing: its first request ends it.
TEST_F(TcpStoreAdmissionTest, ARequestBeforeTheAdmissionEndsTheConnectionUnanswered) {
  client("the job's secret").set("key", {7});
  const int fd = connect_to("127.0.0.1", port_);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> request{backplane::gloo_plugin::wire::kGet};
  backplane::gloo_plugin::wire::put_i64(request, 0);
  backplane::gloo_plugin::wire::put_string(request, "key");
  std::vector<uint8_t> sent(backplane::gloo_plugin::wire::kGreeting,
                            backplane::gloo_plugin::wire::kGreeting + backplane::gloo_plugin::wire::kGreetingSize);
  const std::vector<uint8_t> frame = backplane::gloo_plugin::wire::framed(request);
  sent.insert(sent.end(), frame.begin(), frame.end());
  ASSERT_EQ(::send(fd, sent.data(), sent.size(), 0), static_cast<ssize_t>(sent.size()));
  std::vector<uint8_t> received;
  uint8_t chunk[256];
  for (ssize_t n; (n = ::recv(fd, chunk, sizeof(chunk), 0)) > 0;) received.insert(received.end(), chunk, chunk + n);
  ::close(fd);
  // The greeting came back, and nothing after it.
  EXPECT_EQ(received.size(), backplane::gloo_plugin::wire::kGreetingSize);
  const std::string lines = said_lines("it made a request before it was admitted");
  EXPECT_NE(lines.find("it made a request before it was admitted"), std::string::npos) << lines;
}

// 127.0.0.2 is this machine too (all of 127/8 is loopback): a store for clients at 127.0.0.1 is not
// reached there, one that listens on every interface is.
TEST_F(TcpStoreAdmissionTest, AStoreListensOnlyWhereItsClientsConnect) {
  const int at_clients_address = connect_to("127.0.0.1", port_);
  EXPECT_GE(at_clients_address, 0);
  if (at_clients_address >= 0) ::close(at_clients_address);
  EXPECT_EQ(connect_to("127.0.0.2", port_), -1) << "the store answered at 127.0.0.2";

  const auto other_port = static_cast<uint16_t>(backplane::test::free_port());
  TcpStoreServer everywhere(other_port);
  const int elsewhere = connect_to("127.0.0.2", other_port);
  EXPECT_GE(elsewhere, 0) << "a store without a listening address is not reached on every interface";
  if (elsewhere >= 0) ::close(elsewhere);
}

// A store without a secret serves any client, a client with a secret too (as torch's TCPStore serves any).
TEST(TcpStoreWithoutSecret, ServesEveryClient) {
  const auto port = static_cast<uint16_t>(backplane::test::free_port());
  TcpStoreServer server(port);
  TcpStoreClient("127.0.0.1", port, milliseconds(2000), milliseconds(2000), "rank 0", "").set("a", {1});
  TcpStoreClient with_secret("127.0.0.1", port, milliseconds(2000), milliseconds(2000), "rank 0", "any");
  EXPECT_EQ(with_secret.get("a", milliseconds(1000)), std::vector<uint8_t>{1});
}

}  // namespace
