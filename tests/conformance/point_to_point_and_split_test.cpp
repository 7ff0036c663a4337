// The conformance suite's point to point (tags, receives from any rank), comm_split, and the host device.
#include <fstream>
#include <string>
#include <vector>

#include "conformance/conformance.h"

namespace backplane::test {
namespace {

TEST(PointToPoint, TagsMatchInOrder) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_SEND, BPL_DTYPE_I32, 0);
  if (world.size < 2) GTEST_SKIP() << "needs 2 ranks";
  // Rank 0 sends two messages per tag to rank 1, tags interleaved; rank 1 receives tag 2 first.
  if (world.rank == 0) {
    int32_t values[4] = {10, 20, 11, 21};  // tag = value / 10
    bpl_request* sends[4] = {};
    for (int k = 0; k < 4; ++k) EXPECT_OK(bpl_send(world.comm, &values[k], 1, BPL_DTYPE_I32, 1, values[k] / 10, &sends[k]));
    for (bpl_request* r : sends) {
      EXPECT_OK(bpl_request_wait(r, BPL_TIMEOUT_DEFAULT));
      EXPECT_OK(bpl_request_free(r));
    }
  } else if (world.rank == 1) {
    int32_t got[4] = {0, 0, 0, 0};
    bpl_request* reqs[4] = {};
    EXPECT_OK(bpl_recv(world.comm, &got[0], 1, BPL_DTYPE_I32, 0, 2, &reqs[0]));
    EXPECT_OK(bpl_recv(world.comm, &got[1], 1, BPL_DTYPE_I32, 0, 2, &reqs[1]));
    EXPECT_OK(bpl_recv(world.comm, &got[2], 1, BPL_DTYPE_I32, 0, 1, &reqs[2]));
    EXPECT_OK(bpl_recv(world.comm, &got[3], 1, BPL_DTYPE_I32, 0, 1, &reqs[3]));
    for (bpl_request* r : reqs) {
      EXPECT_OK(bpl_request_wait(r, BPL_TIMEOUT_DEFAULT));
      EXPECT_OK(bpl_request_free(r));
    }
    EXPECT_EQ(got[0], 20);
    EXPECT_EQ(got[1], 21);
    EXPECT_EQ(got[2], 10);
    EXPECT_EQ(got[3], 11);
  }
  EXPECT_OK(bpl_barrier(world.comm, nullptr));
}

// Every other rank sends rank 0 two messages of `count` int32 (its rank, then 100 + its rank); rank 0
// first posts one recv from rank 1, then a recv from any rank for each other message. The recv from
// rank 1 takes rank 1's first message (posted first, it matches first); each recv from any rank says
// which rank sent what it holds, and every message arrives once.
void receive_from_any_rank(int64_t count) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_RECV_ANY, BPL_DTYPE_I32, 0);
  if (world.size < 2) GTEST_SKIP() << "needs 2 ranks";
  const int tag = 3;
  if (world.rank != 0) {
    std::vector<int32_t> first(static_cast<size_t>(count), world.rank), second(static_cast<size_t>(count), 100 + world.rank);
    bpl_request* sends[2] = {};
    EXPECT_OK(bpl_send(world.comm, first.data(), count, BPL_DTYPE_I32, 0, tag, &sends[0]));
    EXPECT_OK(bpl_send(world.comm, second.data(), count, BPL_DTYPE_I32, 0, tag, &sends[1]));
    for (bpl_request* r : sends) {
      EXPECT_OK(bpl_request_wait(r, BPL_TIMEOUT_DEFAULT));
      EXPECT_OK(bpl_request_free(r));
    }
  } else {
    const size_t messages = 2 * static_cast<size_t>(world.size - 1);
    std::vector<std::vector<int32_t>> got(messages, std::vector<int32_t>(static_cast<size_t>(count), -1));
    std::vector<int32_t> sources(messages, -1);
    std::vector<bpl_request*> reqs(messages);
    EXPECT_OK(bpl_recv(world.comm, got[0].data(), count, BPL_DTYPE_I32, 1, tag, &reqs[0]));
    for (size_t m = 1; m < messages; ++m) {
      EXPECT_OK(bpl_recv_any(world.comm, got[m].data(), count, BPL_DTYPE_I32, tag, &sources[m], &reqs[m]));
    }
    for (bpl_request* r : reqs) {
      EXPECT_OK(bpl_request_wait(r, BPL_TIMEOUT_DEFAULT));
      EXPECT_OK(bpl_request_free(r));
    }
    EXPECT_EQ(got[0].front(), 1) << "the recv from rank 1, posted first, takes its first message";
    std::multiset<int32_t> values{got[0].front()};
    for (size_t m = 1; m < messages; ++m) {
      const int32_t value = got[m].front();
      EXPECT_EQ(std::count(got[m].begin(), got[m].end(), value), count) << "message " << m << " is whole";
      EXPECT_EQ(sources[m], value % 100) << "message " << m << " holds " << value;
      values.insert(value);
    }
    std::multiset<int32_t> sent;
    for (int r = 1; r < world.size; ++r) sent.insert({r, 100 + r});
    EXPECT_EQ(values, sent);
  }
  EXPECT_OK(bpl_barrier(world.comm, nullptr));
}

// A recv from one rank posted before a recv from any rank takes that rank's first message, however the
// messages and the posting interleave: rank 1 sends as rank 0 posts, many times over.
TEST(PointToPoint, RecvFromAnyRankKeepsThePostingOrder) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_RECV_ANY, BPL_DTYPE_I32, 0);
  if (world.size < 2) GTEST_SKIP() << "needs 2 ranks";
  const int tag = 4;
  for (const int64_t count : {int64_t{1}, int64_t{30000}}) {
    for (int round = 0; round < 100; ++round) {
      std::vector<int32_t> first(static_cast<size_t>(count), 1), second(static_cast<size_t>(count), 2);
      if (world.rank == 1) {
        EXPECT_OK(bpl_send(world.comm, first.data(), count, BPL_DTYPE_I32, 0, tag, nullptr));
        EXPECT_OK(bpl_send(world.comm, second.data(), count, BPL_DTYPE_I32, 0, tag, nullptr));
      } else if (world.rank == 0) {
        std::vector<int32_t> from_one(static_cast<size_t>(count), -1), from_any(static_cast<size_t>(count), -1);
        int32_t source = -1;
        bpl_request* reqs[2] = {};
        EXPECT_OK(bpl_recv(world.comm, from_one.data(), count, BPL_DTYPE_I32, 1, tag, &reqs[0]));
        EXPECT_OK(bpl_recv_any(world.comm, from_any.data(), count, BPL_DTYPE_I32, tag, &source, &reqs[1]));
        for (bpl_request* r : reqs) {
          EXPECT_OK(bpl_request_wait(r, BPL_TIMEOUT_DEFAULT));
          EXPECT_OK(bpl_request_free(r));
        }
        ASSERT_EQ(from_one.front(), 1) << "round " << round << ", " << count << " values: the recv posted first takes the first message";
        ASSERT_EQ(from_any.front(), 2) << "round " << round << ", " << count << " values";
        EXPECT_EQ(source, 1);
      }
    }
  }
  EXPECT_OK(bpl_barrier(world.comm, nullptr));
}

// A recv from any rank posted behind a recv from rank 1 that waits still takes rank 2's message: rank 1
// sends only once rank 0 has it, as MPI's order allows (the earlier recv holds back rank 1's messages
// only).
TEST(PointToPoint, RecvFromAnyRankPassesAWaitingRecvFromAnotherRank) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_RECV_ANY, BPL_DTYPE_I32, 0);
  if (world.size < 3) GTEST_SKIP() << "needs 3 ranks";
  const int tag = 5;
  for (const int64_t count : {int64_t{1}, int64_t{30000}}) {
    std::vector<int32_t> data(static_cast<size_t>(count), world.rank);
    int32_t go = 0;
    if (world.rank == 0) {
      std::vector<int32_t> from_one(static_cast<size_t>(count), -1), from_any(static_cast<size_t>(count), -1);
      int32_t source = -1;
      bpl_request* reqs[2] = {};
      EXPECT_OK(bpl_recv(world.comm, from_one.data(), count, BPL_DTYPE_I32, 1, tag, &reqs[0]));
      EXPECT_OK(bpl_recv_any(world.comm, from_any.data(), count, BPL_DTYPE_I32, tag, &source, &reqs[1]));
      EXPECT_OK(bpl_request_wait(reqs[1], BPL_TIMEOUT_DEFAULT));
      EXPECT_EQ(source, 2);
      EXPECT_EQ(from_any.front(), 2);
      EXPECT_OK(bpl_send(world.comm, &go, 1, BPL_DTYPE_I32, 1, tag + 1, nullptr));
      EXPECT_OK(bpl_request_wait(reqs[0], BPL_TIMEOUT_DEFAULT));
      EXPECT_EQ(from_one.front(), 1);
      for (bpl_request* r : reqs) EXPECT_OK(bpl_request_free(r));
    } else if (world.rank == 1) {
      EXPECT_OK(bpl_recv(world.comm, &go, 1, BPL_DTYPE_I32, 0, tag + 1, nullptr));
      EXPECT_OK(bpl_send(world.comm, data.data(), count, BPL_DTYPE_I32, 0, tag, nullptr));
    } else if (world.rank == 2) {
      EXPECT_OK(bpl_send(world.comm, data.data(), count, BPL_DTYPE_I32, 0, tag, nullptr));
    }
  }
  EXPECT_OK(bpl_barrier(world.comm, nullptr));
}

TEST(PointToPoint, RecvFromAnyRankSmall) { receive_from_any_rank(1); }
TEST(PointToPoint, RecvFromAnyRankLarge) { receive_from_any_rank(100000); }

TEST(PointToPoint, RecvFromAnyRankNeedsWhereToWriteTheSender) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_RECV_ANY, BPL_DTYPE_I32, 0);
  int32_t value = 0;
  EXPECT_EQ(bpl_recv_any(world.comm, &value, 1, BPL_DTYPE_I32, 0, nullptr, nullptr), BPL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(bpl_last_error()).find("source is NULL"), std::string::npos) << bpl_last_error();
}

TEST(PointToPoint, BlockingSendMeetsBlockingRecv) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_SEND, BPL_DTYPE_U8, 0);
  if (world.size < 2) GTEST_SKIP() << "needs 2 ranks";
  std::vector<uint8_t> data(300000);
  if (world.rank == 0) {
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 31);
    EXPECT_OK(bpl_send(world.comm, data.data(), data.size(), BPL_DTYPE_U8, world.size - 1, 0, nullptr));
  } else if (world.rank == world.size - 1) {
    EXPECT_OK(bpl_recv(world.comm, data.data(), data.size(), BPL_DTYPE_U8, 0, 0, nullptr));
    size_t wrong = 0;
    for (size_t i = 0; i < data.size(); ++i) wrong += data[i] != static_cast<uint8_t>(i * 31);
    EXPECT_EQ(wrong, 0u);
  }
  EXPECT_OK(bpl_barrier(world.comm, nullptr));
}

// The process's threads, as the kernel counts them.
int thread_count() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// Receives and sends posted as requests, still waiting for their peers, hold no thread each: a request
// waited for as long as the communicator's timeout is completed by its waiter (a receive that moves
// only while its receiver reads the sender's buffer, by any wait of its rank).
TEST(PointToPoint, PendingSendsAndReceivesHoldNoThreadEach) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_SEND, BPL_DTYPE_I32, 0);
  if (world.size < 2) GTEST_SKIP() << "needs 2 ranks";
  if (world.rank > 1) {  // ranks 0 and 1 exchange; the others take part in the barrier only
    EXPECT_OK(bpl_barrier(world.comm, nullptr));
    return;
  }
  // Above every backend's size for a send copied at once (its buffer then free, its request ended).
  constexpr int kMessages = 16;
  constexpr size_t kCount = 64 * 1024;
  const int peer = 1 - world.rank;
  std::vector<std::vector<int32_t>> sent(kMessages, std::vector<int32_t>(kCount));
  std::vector<std::vector<int32_t>> received(kMessages, std::vector<int32_t>(kCount, -1));
  std::vector<bpl_request*> requests(2 * kMessages, nullptr);
  const int threads_before = thread_count();
  for (int k = 0; k < kMessages; ++k) {
    EXPECT_OK(bpl_recv(world.comm, received[k].data(), kCount, BPL_DTYPE_I32, peer, 100 + k, &requests[kMessages + k]));
  }
  const int threads_with_receives = thread_count();
  // After every receive is posted, before any send: no receive can have ended yet.
  EXPECT_OK(bpl_barrier(world.comm, nullptr));
  for (int k = 0; k < kMessages; ++k) {
    sent[k].assign(kCount, world.rank * 1000 + k);
    EXPECT_OK(bpl_send(world.comm, sent[k].data(), kCount, BPL_DTYPE_I32, peer, 100 + k, &requests[k]));
  }
  const int threads_with_sends = thread_count();
  for (bpl_request* r : requests) {
    EXPECT_OK(bpl_request_wait(r, BPL_TIMEOUT_DEFAULT));
    EXPECT_OK(bpl_request_free(r));
  }
  EXPECT_LT(threads_with_receives - threads_before, kMessages / 2)
      << kMessages << " pending receives took " << threads_with_receives - threads_before << " threads";
  EXPECT_LT(threads_with_sends - threads_with_receives, kMessages / 2)
      << kMessages << " sends took " << threads_with_sends - threads_with_receives << " threads";
  for (int k = 0; k < kMessages; ++k) {
    EXPECT_EQ(received[k].front(), peer * 1000 + k) << "message " << k;
    EXPECT_EQ(received[k].back(), peer * 1000 + k) << "message " << k;
  }
}

TEST(CommSplit, ParityGroupsReduceWithinThemselves) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_COMM_SPLIT, 0, 0);
  bpl_comm* group = nullptr;
  const int parity = world.rank % 2;
  EXPECT_OK(bpl_comm_split(world.comm, parity, world.rank, &group));
  ASSERT_NE(group, nullptr);
  int32_t rank = -1, size = -1;
  EXPECT_OK(bpl_comm_rank(group, &rank));
  EXPECT_OK(bpl_comm_size(group, &size));
  EXPECT_EQ(rank, world.rank / 2);
  EXPECT_EQ(size, (world.size - parity + 1) / 2);
  int64_t sum = world.rank;
  EXPECT_OK(bpl_allreduce(group, &sum, &sum, 1, BPL_DTYPE_I64, BPL_OP_SUM, nullptr));
  int64_t expected = 0;
  for (int r = parity; r < world.size; r += 2) expected += r;
  EXPECT_EQ(sum, expected);
  EXPECT_OK(bpl_comm_destroy(group));
}

TEST(CommSplit, KeyOrdersRanksAndUndefinedColorGetsNoComm) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_COMM_SPLIT, 0, 0);
  // The last rank opts out; the others form one group ordered by descending world rank.
  const bool opted_out = world.size > 1 && world.rank == world.size - 1;
  bpl_comm* group = reinterpret_cast<bpl_comm*>(&world);  // must be overwritten
  EXPECT_OK(bpl_comm_split(world.comm, opted_out ? BPL_COLOR_UNDEFINED : 5, -world.rank, &group));
  if (opted_out) {
    EXPECT_EQ(group, nullptr);
  } else {
    ASSERT_NE(group, nullptr);
    const int members = world.size > 1 ? world.size - 1 : 1;
    int32_t rank = -1;
    EXPECT_OK(bpl_comm_rank(group, &rank));
    EXPECT_EQ(rank, members - 1 - world.rank);
    // Gather world ranks in group order: descending.
    int32_t mine = world.rank;
    std::vector<int32_t> all(members, -1);
    EXPECT_OK(bpl_allgather(group, &mine, all.data(), 1, BPL_DTYPE_I32, nullptr));
    for (int i = 0; i < members; ++i) EXPECT_EQ(all[i], members - 1 - i);
    EXPECT_OK(bpl_comm_destroy(group));
  }
  EXPECT_OK(bpl_barrier(world.comm, nullptr));
}

TEST(CommSplit, DestroyWaitsUntilRequestsAreReleased) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_COMM_SPLIT, BPL_DTYPE_I32, BPL_OP_SUM);
  bpl_comm* group = nullptr;
  EXPECT_OK(bpl_comm_split(world.comm, 0, world.rank, &group));
  ASSERT_NE(group, nullptr);
  int32_t value = 1;
  bpl_request* request = nullptr;
  EXPECT_OK(bpl_allreduce(group, &value, &value, 1, BPL_DTYPE_I32, BPL_OP_SUM, &request));
  EXPECT_EQ(bpl_comm_destroy(group), BPL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(bpl_last_error()).find("1 request(s) that were not released"), std::string::npos)
      << bpl_last_error();
  EXPECT_OK(bpl_request_wait(request, BPL_TIMEOUT_DEFAULT));
  EXPECT_OK(bpl_request_free(request));
  EXPECT_EQ(value, world.size);
  EXPECT_OK(bpl_comm_destroy(group));
}

TEST(CommSplit, NestedSplitAndConcurrentGroups) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_COMM_SPLIT, 0, 0);
  // Split the world into singletons of a split of the world: every level still works.
  bpl_comm* all = nullptr;
  EXPECT_OK(bpl_comm_split(world.comm, 0, 0, &all));
  ASSERT_NE(all, nullptr);
  bpl_comm* single = nullptr;
  EXPECT_OK(bpl_comm_split(all, world.rank, 0, &single));
  ASSERT_NE(single, nullptr);
  int32_t size = 0;
  EXPECT_OK(bpl_comm_size(single, &size));
  EXPECT_EQ(size, 1);
  float value = 2.5f;
  EXPECT_OK(bpl_allreduce(single, &value, &value, 1, BPL_DTYPE_F32, BPL_OP_SUM, nullptr));
  EXPECT_EQ(value, 2.5f);
  int64_t n = 1;
  EXPECT_OK(bpl_allreduce(all, &n, &n, 1, BPL_DTYPE_I64, BPL_OP_SUM, nullptr));
  EXPECT_EQ(n, world.size);
  EXPECT_OK(bpl_comm_destroy(single));
  EXPECT_OK(bpl_comm_destroy(all));
}

TEST(Device, HostDeviceAllocCopy) {
  int32_t count = 0;
  EXPECT_OK(bpl_device_count(world.runtime, &count));
  ASSERT_GE(count, 1);
  bpl_device_properties props = BPL_DEVICE_PROPERTIES_INIT;
  EXPECT_OK(bpl_device_get_properties(world.runtime, 0, &props));
  EXPECT_GT(std::strlen(props.name), 0u);
  void* device = nullptr;
  EXPECT_OK(bpl_malloc(world.runtime, 0, 4096, &device));
  ASSERT_NE(device, nullptr);
  std::vector<uint8_t> in(4096), out(4096, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i ^ 0x3c);
  EXPECT_OK(bpl_memcpy(world.runtime, device, in.data(), in.size(), BPL_MEMCPY_HOST_TO_DEVICE));
  EXPECT_OK(bpl_memcpy(world.runtime, out.data(), device, out.size(), BPL_MEMCPY_DEVICE_TO_HOST));
  EXPECT_OK(bpl_synchronize(world.runtime, 0));
  EXPECT_EQ(in, out);
  EXPECT_OK(bpl_free(world.runtime, device));
}

}  // namespace
}  // namespace backplane::test
