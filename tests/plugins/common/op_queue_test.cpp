// The operation queue of the plugins whose library calls block (op_queue.h): order, who runs what, and
// that a request left for its waiter still runs when nobody waits for it.
#include "op_queue.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace backplane::plugin {
namespace {

using namespace std::chrono_literals;
using Start = OpQueue::Start;

Classifier status_of_what() {
  return [](std::exception_ptr thrown) -> std::pair<bpl_status, std::string> {
    try {
      std::rethrow_exception(thrown);
    } catch (const std::exception& e) {
      return {BPL_ERR_INTERNAL, e.what()};
    }
  };
}

// Waits as a request's waiter does with the operation's own bound: runs it here when it is next.
bool wait_as_waiter(OpQueue& queue, const std::shared_ptr<Operation>& op) {
  queue.run_if_next(op);
  return op->wait_for(5s);
}

TEST(OpQueue, ARequestLeftForItsWaiterRunsOnTheWaitersThread) {
  OpQueue queue(status_of_what(), 5000ms);
  int within_grace = 0;
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::thread::id ran_on;
    const auto posted = std::chrono::steady_clock::now();
    auto op = queue.post([&] { ran_on = std::this_thread::get_id(); }, Start::when_unclaimed);
    std::this_thread::sleep_for(std::chrono::microseconds(kUnclaimedGrace) / 4);  // enough for a woken worker
    const bool claimed = queue.run_if_next(op);
    ASSERT_TRUE(op->wait_for(5s));
    // A loaded machine may oversleep the grace; then the worker rightly ran it.
    if (std::chrono::steady_clock::now() - posted >= kUnclaimedGrace) continue;
    ++within_grace;
    EXPECT_TRUE(claimed) << "the worker took a request whose waiter came within the grace";
    EXPECT_EQ(ran_on, std::this_thread::get_id());
  }
  EXPECT_GT(within_grace, 0) << "no attempt's waiter came within the grace (an overloaded machine?)";
}

TEST(OpQueue, ARequestNobodyWaitsForStillRunsWithinTheGrace) {
  OpQueue queue(status_of_what(), 5000ms);
  std::thread::id ran_on;
  auto op = queue.post([&] { ran_on = std::this_thread::get_id(); }, Start::when_unclaimed);
  // ended() neither runs nor hurries it: only the worker can have run it.
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (!op->ended() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(op->ended()) << "a request nobody waited for never started";
  EXPECT_NE(ran_on, std::this_thread::get_id());
  EXPECT_EQ(op->status(), BPL_OK);
}

TEST(OpQueue, HurryHandsALeftRequestToTheWorker) {
  OpQueue queue(status_of_what(), 5000ms);
  std::thread::id ran_on;
  auto op = queue.post([&] { ran_on = std::this_thread::get_id(); }, Start::when_unclaimed);
  queue.hurry();
  ASSERT_TRUE(op->wait_for(5s));
  EXPECT_NE(ran_on, std::this_thread::get_id());
  // Once it ran, its waiter finds nothing to run.
  EXPECT_FALSE(queue.run_if_next(op));
}

TEST(OpQueue, OperationsRunInTheOrderPostedWhicheverThreadRunsThem) {
  OpQueue queue(status_of_what(), 5000ms);
  std::vector<int> order;
  std::vector<std::shared_ptr<Operation>> ops;
  for (int i = 0; i < 50; ++i) {
    ops.push_back(queue.post([&order, i] { order.push_back(i); }, i % 3 == 0 ? Start::when_unclaimed : Start::now));
    if (i % 7 == 0) queue.run([&order] { order.push_back(-1); });  // a blocking call among them
  }
  // Waited for out of order, some by their waiters, some not at all (the queue's end waits for them).
  for (int i = 49; i >= 0; i -= 2) ASSERT_TRUE(wait_as_waiter(queue, ops[i]));
  queue.shut_down();
  std::vector<int> posted;
  for (int i = 0; i < 50; ++i) {
    posted.push_back(i);
    if (i % 7 == 0) posted.push_back(-1);
  }
  EXPECT_EQ(order, posted);
}

TEST(OpQueue, AFailureReachesTheWaiterWhicheverThreadRanIt) {
  OpQueue queue(status_of_what(), 5000ms);
  auto left = queue.post([] { throw std::runtime_error("peer 3 left"); }, Start::when_unclaimed);
  ASSERT_TRUE(wait_as_waiter(queue, left));
  EXPECT_EQ(left->status(), BPL_ERR_INTERNAL);
  EXPECT_EQ(left->message(), "peer 3 left");
  auto worked = queue.post([] { throw std::runtime_error("peer 4 left"); }, Start::now);
  ASSERT_TRUE(worked->wait_for(5s));
  EXPECT_EQ(worked->message(), "peer 4 left");
}

TEST(OpQueue, ShutDownRunsWhatNobodyClaimed) {
  std::shared_ptr<Operation> op;
  bool ran = false;
  {
    OpQueue queue(status_of_what(), 5000ms);
    op = queue.post([&] { ran = true; }, Start::when_unclaimed);
  }
  EXPECT_TRUE(ran);
  EXPECT_TRUE(op->ended());
}

}  // namespace
}  // namespace backplane::plugin
