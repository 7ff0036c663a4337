// Worlds in a store that outlives them (plugins/gloo/arrival.h), on backplane's own TCP store: every
// bpl_init of a process enters a new world, the store forgets a world once all ranks entered the next,
// a newcomer finds the current one, and a second process as the same rank is refused at once, unless
// the one before it ended.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "arrival.h"
#include "support/process.h"
#include "tcp_store.h"

namespace {

using backplane::gloo_plugin::arrive;
using backplane::gloo_plugin::current_world;
using backplane::gloo_plugin::enter_world;
using backplane::gloo_plugin::gone_key;
using backplane::gloo_plugin::TcpStoreClient;
using backplane::gloo_plugin::TcpStoreServer;
using backplane::gloo_plugin::World;
using backplane::plugin::Error;
using std::chrono::milliseconds;

constexpr milliseconds kTimeout{5000};

class Worlds : public ::testing::Test {
 protected:
  uint16_t port_ = static_cast<uint16_t>(backplane::test::free_port());
  TcpStoreServer server_{port_};
  TcpStoreClient connect() { return TcpStoreClient("127.0.0.1", port_, kTimeout, kTimeout, "the test's store"); }

  // Ranks 0 and 1, processes "p0" and "p1", each on a thread and a connection of its own, enter a world
  // and arrive in it; returns the world each entered.
  std::vector<World> make_world() {
    std::vector<World> entered(2);
    std::vector<std::thread> ranks;
    for (int32_t rank = 0; rank < 2; ++rank) {
      ranks.emplace_back([&, rank] {
        TcpStoreClient store = connect();
        entered[rank] = enter_world(store, "job", rank, "p" + std::to_string(rank), kTimeout);
        arrive(store, entered[rank], rank, 2, kTimeout);
      });
    }
    for (std::thread& rank : ranks) rank.join();
    return entered;
  }
};

TEST_F(Worlds, EachInitEntersANewWorldAndTheOneBeforeIsForgotten) {
  TcpStoreClient look = connect();
  for (int64_t number = 1; number <= 3; ++number) {
    const std::vector<World> entered = make_world();
    EXPECT_EQ(entered[0].number, number);
    EXPECT_EQ(entered[1].prefix, "job/world" + std::to_string(number));
    EXPECT_EQ(current_world(look, "job", kTimeout).number, number);
    EXPECT_TRUE(look.check("job/world" + std::to_string(number) + "/arrival/all_joined"));
    if (number > 1) {
      EXPECT_FALSE(look.check("job/world" + std::to_string(number - 1) + "/arrival/all_joined"));
    }
  }
}

TEST_F(Worlds, ASecondProcessAsTheSameRankIsRefusedNamingBoth) {
  TcpStoreClient first = connect(), second = connect();
  const World world = enter_world(first, "job", 1, "p1", kTimeout);
  try {
    enter_world(second, "job", 1, "intruder", kTimeout);
    FAIL() << "a second process entered as rank 1";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), BPL_ERR_MISMATCH);
    EXPECT_NE(std::string(e.what()).find("another process already joined as rank 1 (p1)"), std::string::npos) << e.what();
  }
  // The first process's world is told: its arrival fails at once with the same reason.
  const auto start = std::chrono::steady_clock::now();
  try {
    arrive(first, world, 1, 2, kTimeout);
    FAIL() << "the arrival went on";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), BPL_ERR_MISMATCH) << e.what();
    EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2000));
  }
}

// What no rank writes, written by another process under the arrival's outcome, is said to be that.
TEST_F(Worlds, AForeignRecordOfTheOutcomeIsNamedNotAnEmptyReason) {
  TcpStoreClient store = connect();
  const World world = enter_world(store, "job", 0, "p0", kTimeout);
  store.set(world.prefix + "/arrival/failed", {'x'});
  try {
    arrive(store, world, 0, 2, kTimeout);
    FAIL() << "the arrival went on";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), BPL_ERR_INTERNAL);
    EXPECT_NE(std::string(e.what()).find("the job's store holds 'x' under job/world1/arrival/failed, which is no "
                                         "rank's record"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(Worlds, AProcessThatTakesTheRankOfOneThatEndedIsNoDuplicate) {
  TcpStoreClient store = connect();
  const World world = enter_world(store, "job", 1, "p1", kTimeout);
  store.set(world.prefix + "/" + gone_key("p1"), {'1'});
  EXPECT_EQ(enter_world(store, "job", 1, "newcomer", kTimeout).number, 2);
}

}  // namespace
