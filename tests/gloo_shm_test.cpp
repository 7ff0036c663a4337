// The Gloo plugin's shared-memory path on its own (plugins/gloo/shm_group.h), without a rendezvous:
// ranks are threads that each map the segment themselves, or forked processes where a peer's end is
// what is tested. The plugin-level suites (conformance, fault_test) run the same code through bpl_*.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dtypes.h"
#include "plugin_support.h"
#include "shm_group.h"

namespace {

using backplane::gloo_plugin::ShmGroup;
using backplane::plugin::Error;
using backplane::plugin::reduce_function;
using std::chrono::milliseconds;

constexpr milliseconds kTimeout{20000};

std::string unique_segment_name() {
  static int counter = 0;
  return "/backplane-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

// The segment of one test: rank 0's group is created at once, the others map it; the name is
// removed when the test's groups exist (as the plugin does), so nothing stays in /dev/shm.
class Segment {
 public:
  explicit Segment(int size) : name_(unique_segment_name()), size_(size) {}
  ~Segment() { ::shm_unlink(name_.c_str()); }
  std::vector<std::unique_ptr<ShmGroup>> groups() {
    std::vector<std::unique_ptr<ShmGroup>> all;
    all.push_back(ShmGroup::create(name_, size_));
    for (int r = 1; r < size_; ++r) all.push_back(ShmGroup::open(name_, r, size_));
    return all;
  }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  int size_;
};

// Runs body(rank, group) on one thread per rank.
void run_threads(std::vector<std::unique_ptr<ShmGroup>>& groups, const std::function<void(int, ShmGroup&)>& body) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < groups.size(); ++r) {
    threads.emplace_back([&, r] { body(static_cast<int>(r), *groups[r]); });
  }
  for (std::thread& t : threads) t.join();
}

// Rank r's i-th value: small integers, so that sums in f32 are exact whatever the order.
float value(int rank, size_t i) { return static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13) % 101) - 50); }

// Element counts around every boundary of the algorithms: the flat allreduce limit, one slot, several.
std::vector<size_t> f32_counts() {
  const size_t flat = ShmGroup::kFlatAllreduceBytes / 4, slot = ShmGroup::kSlotBytes / 4;
  return {1, 3, flat - 1, flat, flat + 1, slot - 1, slot, slot + 1, 3 * slot + 17};
}

class ShmGroupRanks : public ::testing::TestWithParam<int> {};

TEST_P(ShmGroupRanks, AllreduceSumsAtEverySizeInPlaceAndNot) {
  const int size = GetParam();
  Segment segment(size);
  auto groups = segment.groups();
  const auto sum = reduce_function(BPL_DTYPE_F32, BPL_OP_SUM);
  for (size_t count : f32_counts()) {
    for (bool in_place : {false, true}) {
      run_threads(groups, [&](int rank, ShmGroup& group) {
        std::vector<float> send(count), recv(count, -1.0f);
        for (size_t i = 0; i < count; ++i) send[i] = value(rank, i);
        float* out = in_place ? send.data() : recv.data();
        group.allreduce(send.data(), out, count, BPL_DTYPE_F32, sum, kTimeout);
        for (size_t i = 0; i < count; ++i) {
          float expected = 0;
          for (int q = 0; q < size; ++q) expected += value(q, i);
          if (out[i] != expected) {
            ADD_FAILURE() << "rank " << rank << ", " << count << " elements, in place " << in_place << ": [" << i
                          << "] = " << out[i] << ", expected " << expected;
            return;
          }
        }
      });
    }
  }
}

TEST_P(ShmGroupRanks, AllreduceResultsAreBitIdenticalOnEveryRank) {
  // Values whose f32 sum depends on the order of the additions: every rank must still agree exactly.
  const int size = GetParam();
  Segment segment(size);
  auto groups = segment.groups();
  for (size_t count : f32_counts()) {
    std::vector<std::vector<float>> results(static_cast<size_t>(size), std::vector<float>(count));
    run_threads(groups, [&](int rank, ShmGroup& group) {
      std::mt19937 random(static_cast<unsigned>(rank + 1));
      std::uniform_real_distribution<float> uniform(-1e6f, 1e6f);
      std::vector<float> send(count);
      for (float& x : send) x = uniform(random) / static_cast<float>(rank + 3);
      group.allreduce(send.data(), results[static_cast<size_t>(rank)].data(), count, BPL_DTYPE_F32,
                      reduce_function(BPL_DTYPE_F32, BPL_OP_SUM), kTimeout);
    });
    for (int r = 1; r < size; ++r) {
      EXPECT_EQ(std::memcmp(results[0].data(), results[static_cast<size_t>(r)].data(), count * 4), 0)
          << "rank " << r << " differs from rank 0 at " << count << " elements";
    }
  }
}

TEST_P(ShmGroupRanks, MaxAndInt64ProdReduce) {
  const int size = GetParam();
  Segment segment(size);
  auto groups = segment.groups();
  const size_t count = ShmGroup::kSlotBytes / 8 + 5;  // i64: the chunked path
  run_threads(groups, [&](int rank, ShmGroup& group) {
    std::vector<int64_t> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<int64_t>(i % 5) + rank + 1;
    group.allreduce(data.data(), data.data(), count, BPL_DTYPE_I64, reduce_function(BPL_DTYPE_I64, BPL_OP_PROD), kTimeout);
    for (size_t i = 0; i < count; ++i) {
      int64_t expected = 1;
      for (int q = 0; q < size; ++q) expected *= static_cast<int64_t>(i % 5) + q + 1;
      if (data[i] != expected) {
        ADD_FAILURE() << "rank " << rank << " [" << i << "] = " << data[i] << ", expected " << expected;
        return;
      }
    }
    std::vector<float> values(7);
    for (size_t i = 0; i < values.size(); ++i) values[i] = value(rank, i);
    group.allreduce(values.data(), values.data(), values.size(), BPL_DTYPE_F32, reduce_function(BPL_DTYPE_F32, BPL_OP_MAX),
                    kTimeout);
    for (size_t i = 0; i < values.size(); ++i) {
      float expected = value(0, i);
      for (int q = 1; q < size; ++q) expected = std::max(expected, value(q, i));
      EXPECT_EQ(values[i], expected) << "rank " << rank << " [" << i << "]";
    }
  });
}

TEST_P(ShmGroupRanks, BroadcastFromEveryRoot) {
  const int size = GetParam();
  Segment segment(size);
  auto groups = segment.groups();
  for (size_t bytes : {size_t{1}, size_t{1000}, ShmGroup::kSlotBytes, 2 * ShmGroup::kSlotBytes + 3}) {
    for (int root = 0; root < size; ++root) {
      run_threads(groups, [&](int rank, ShmGroup& group) {
        std::vector<unsigned char> data(bytes);
        for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>(rank == root ? i * 31 + root : 0xEE);
        group.broadcast(data.data(), bytes, root, kTimeout);
        for (size_t i = 0; i < bytes; ++i) {
          if (data[i] != static_cast<unsigned char>(i * 31 + root)) {
            ADD_FAILURE() << "rank " << rank << ", root " << root << ", " << bytes << " bytes: [" << i << "] wrong";
            return;
          }
        }
      });
    }
  }
}

TEST_P(ShmGroupRanks, AllgatherAndReduceScatter) {
  const int size = GetParam();
  Segment segment(size);
  auto groups = segment.groups();
  for (size_t count : f32_counts()) {
    run_threads(groups, [&](int rank, ShmGroup& group) {
      std::vector<float> block(count), gathered(count * static_cast<size_t>(size));
      for (size_t i = 0; i < count; ++i) block[i] = value(rank, i);
      group.allgather(block.data(), gathered.data(), count * 4, kTimeout);
      for (int q = 0; q < size; ++q) {
        for (size_t i = 0; i < count; ++i) {
          if (gathered[static_cast<size_t>(q) * count + i] != value(q, i)) {
            ADD_FAILURE() << "allgather: rank " << rank << ", block " << q << " [" << i << "] wrong at " << count;
            return;
          }
        }
      }
      // reduce_scatter: rank r's input block b holds value(r, b * count + i); rank b gets the sum.
      std::vector<float> blocks(count * static_cast<size_t>(size)), mine(count);
      for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = value(rank, i);
      group.reduce_scatter(blocks.data(), mine.data(), count, BPL_DTYPE_F32, reduce_function(BPL_DTYPE_F32, BPL_OP_SUM),
                           kTimeout);
      for (size_t i = 0; i < count; ++i) {
        float expected = 0;
        for (int q = 0; q < size; ++q) expected += value(q, static_cast<size_t>(rank) * count + i);
        if (mine[i] != expected) {
          ADD_FAILURE() << "reduce_scatter: rank " << rank << " [" << i << "] = " << mine[i] << ", expected " << expected;
          return;
        }
      }
    });
  }
}

TEST_P(ShmGroupRanks, AlltoallInPlaceAndNot) {
  const int size = GetParam();
  Segment segment(size);
  auto groups = segment.groups();
  for (size_t count : f32_counts()) {
    for (bool in_place : {false, true}) {
      run_threads(groups, [&](int rank, ShmGroup& group) {
        // Rank r's block q holds what r sends to q: value(r, q * count + i).
        std::vector<float> send(count * static_cast<size_t>(size)), recv(send.size(), -1.0f);
        for (size_t i = 0; i < send.size(); ++i) send[i] = value(rank, i);
        float* out = in_place ? send.data() : recv.data();
        group.alltoall(send.data(), out, count * 4, kTimeout);
        for (int q = 0; q < size; ++q) {
          for (size_t i = 0; i < count; ++i) {
            const float expected = value(q, static_cast<size_t>(rank) * count + i);
            if (out[static_cast<size_t>(q) * count + i] != expected) {
              ADD_FAILURE() << "rank " << rank << ", " << count << " elements, in place " << in_place << ": from rank "
                            << q << " [" << i << "] = " << out[static_cast<size_t>(q) * count + i] << ", expected "
                            << expected;
              return;
            }
          }
        }
      });
    }
  }
}

TEST_P(ShmGroupRanks, ManyCollectivesInARowReuseTheBuffersSafely) {
  // A fast rank runs ahead into the next collective while slower ones still read the last: the
  // buffers alternate by step, and nothing else guards them, so mixed sizes in a row must stay right.
  const int size = GetParam();
  Segment segment(size);
  auto groups = segment.groups();
  run_threads(groups, [&](int rank, ShmGroup& group) {
    const auto sum = reduce_function(BPL_DTYPE_F32, BPL_OP_SUM);
    for (int round = 0; round < 300; ++round) {
      const size_t count = (round % 3 == 0) ? 5 : (round % 3 == 1) ? ShmGroup::kSlotBytes / 4 + 9 : 2000;
      std::vector<float> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = value(rank, i + static_cast<size_t>(round));
      group.allreduce(data.data(), data.data(), count, BPL_DTYPE_F32, sum, kTimeout);
      for (size_t i = 0; i < count; ++i) {
        float expected = 0;
        for (int q = 0; q < size; ++q) expected += value(q, i + static_cast<size_t>(round));
        if (data[i] != expected) {
          ADD_FAILURE() << "rank " << rank << ", round " << round << " [" << i << "] = " << data[i];
          return;
        }
      }
      if (round % 50 == 0) group.barrier(kTimeout);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShmGroupRanks, ::testing::Values(2, 3), [](const auto& info) {
  return std::to_string(info.param) + "ranks";
});

// The status and message a call ends with.
struct Outcome {
  bpl_status status = BPL_OK;
  std::string message;
  double seconds = 0;
};

template <typename Call>
Outcome outcome_of(Call call) {
  const auto start = std::chrono::steady_clock::now();
  Outcome result;
  try {
    call();
  } catch (const Error& e) {
    result.status = e.status();
    result.message = e.what();
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

TEST(ShmGroupFailures, DifferentSizesOrCollectivesAreAMismatchOnEveryRank) {
  Segment segment(2);
  auto groups = segment.groups();
  std::vector<Outcome> outcomes(2);
  run_threads(groups, [&](int rank, ShmGroup& group) {
    std::vector<float> data(rank == 0 ? 4 : 8);
    outcomes[static_cast<size_t>(rank)] = outcome_of([&] {
      group.allreduce(data.data(), data.data(), data.size(), BPL_DTYPE_F32, reduce_function(BPL_DTYPE_F32, BPL_OP_SUM),
                      kTimeout);
    });
  });
  EXPECT_EQ(outcomes[0].status, BPL_ERR_MISMATCH) << outcomes[0].message;
  EXPECT_NE(outcomes[0].message.find("rank 1 calls allreduce of 32 bytes, this rank allreduce of 16 bytes"), std::string::npos)
      << outcomes[0].message;
  EXPECT_EQ(outcomes[1].status, BPL_ERR_MISMATCH) << outcomes[1].message;

  Segment other(2);
  auto fresh = other.groups();
  run_threads(fresh, [&](int rank, ShmGroup& group) {
    char bytes[2] = {1, 2};
    outcomes[static_cast<size_t>(rank)] = outcome_of([&] {
      if (rank == 0) {
        group.broadcast(bytes, 1, 0, kTimeout);
      } else {
        group.allgather(bytes, bytes, 1, kTimeout);
      }
    });
  });
  EXPECT_EQ(outcomes[0].status, BPL_ERR_MISMATCH) << outcomes[0].message;
  EXPECT_NE(outcomes[0].message.find("rank 1 calls allgather"), std::string::npos) << outcomes[0].message;
  EXPECT_EQ(outcomes[1].status, BPL_ERR_MISMATCH) << outcomes[1].message;
}

TEST(ShmGroupFailures, AnAbsentPeerIsATimeoutThatEveryRankThenSees) {
  Segment segment(2);
  auto groups = segment.groups();
  float x = 1;
  const Outcome waited = outcome_of(
      [&] { groups[0]->allreduce(&x, &x, 1, BPL_DTYPE_F32, reduce_function(BPL_DTYPE_F32, BPL_OP_SUM), milliseconds(300)); });
  EXPECT_EQ(waited.status, BPL_ERR_TIMEOUT) << waited.message;
  EXPECT_NE(waited.message.find("rank 1 did not arrive in time"), std::string::npos) << waited.message;
  EXPECT_GE(waited.seconds, 0.29);
  EXPECT_LT(waited.seconds, 2.0);
  // Rank 1 comes late: the group has failed, so it fails at once with rank 0's record.
  const Outcome late = outcome_of(
      [&] { groups[1]->allreduce(&x, &x, 1, BPL_DTYPE_F32, reduce_function(BPL_DTYPE_F32, BPL_OP_SUM), kTimeout); });
  EXPECT_EQ(late.status, BPL_ERR_TIMEOUT) << late.message;
  EXPECT_NE(late.message.find("seen by rank 0"), std::string::npos) << late.message;
  EXPECT_LT(late.seconds, 1.0);
}

TEST(ShmGroupFailures, FailFromAnotherThreadReleasesAWaitingRank) {
  Segment segment(3);
  auto groups = segment.groups();
  Outcome waiting;
  std::thread waiter([&] { waiting = outcome_of([&] { groups[0]->barrier(kTimeout); }); });
  std::this_thread::sleep_for(milliseconds(200));  // long enough for the waiter to sleep in the futex
  const auto failed_at = std::chrono::steady_clock::now();
  groups[2]->fail(BPL_ERR_ABORTED, "aborted by the test");
  waiter.join();
  const double release = std::chrono::duration<double>(std::chrono::steady_clock::now() - failed_at).count();
  EXPECT_EQ(waiting.status, BPL_ERR_REMOTE) << waiting.message;  // an abort elsewhere is REMOTE here
  EXPECT_NE(waiting.message.find("aborted by the test [the communicator's first failure, seen by rank 2]"), std::string::npos)
      << waiting.message;
  EXPECT_LT(release, 0.5);
  const Outcome aborter = outcome_of([&] { groups[2]->barrier(kTimeout); });
  EXPECT_EQ(aborter.status, BPL_ERR_ABORTED) << aborter.message;
}

TEST(ShmGroupFailures, APeerProcessThatEndsIsRemoteNamingIt) {
  for (int signal_number : {0, SIGKILL}) {
    Segment segment(2);
    auto group = ShmGroup::create(segment.name(), 2);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      // Rank 1 maps the segment and ends (exit or killed) without ever arriving.
      auto peer = ShmGroup::open(segment.name(), 1, 2);
      if (signal_number != 0) ::raise(signal_number);
      ::_exit(0);
    }
    group->set_peers({0, child});
    int child_status = 0;
    const Outcome waited = outcome_of([&] { group->barrier(kTimeout); });
    ::waitpid(child, &child_status, 0);
    EXPECT_EQ(waited.status, BPL_ERR_REMOTE) << waited.message;
    EXPECT_NE(waited.message.find("rank 1 of this communicator, process " + std::to_string(child) + " on this machine, has ended"),
              std::string::npos)
        << waited.message;
    EXPECT_LT(waited.seconds, 2.0) << "the end of a peer is noticed well before the timeout";
  }
}

TEST(ShmGroupSegments, BadNamesAndSizesAreErrorsNamingTheSegment) {
  Segment segment(2);
  auto group = ShmGroup::create(segment.name(), 2);
  const Outcome twice = outcome_of([&] { ShmGroup::create(segment.name(), 2); });
  EXPECT_EQ(twice.status, BPL_ERR_IO);
  EXPECT_NE(twice.message.find("creation of segment " + segment.name() + " failed"), std::string::npos) << twice.message;
  const Outcome wrong_size = outcome_of([&] { ShmGroup::open(segment.name(), 1, 3); });
  EXPECT_EQ(wrong_size.status, BPL_ERR_IO);
  EXPECT_NE(wrong_size.message.find("segment " + segment.name() + " has " + std::to_string(ShmGroup::segment_bytes(2)) +
                                    " bytes, expected " + std::to_string(ShmGroup::segment_bytes(3))),
            std::string::npos)
      << wrong_size.message;
  const Outcome missing = outcome_of([&] { ShmGroup::open("/backplane-test-no-such-segment", 1, 2); });
  EXPECT_EQ(missing.status, BPL_ERR_IO);
  EXPECT_NE(missing.message.find("opening of segment /backplane-test-no-such-segment failed"), std::string::npos)
      << missing.message;
}

// True if a segment of that name exists.
bool segment_exists(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

void create_segment(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << name << ": " << std::strerror(errno);
  ::close(fd);
}

TEST(ShmGroupSegments, ASegmentWhoseCreatorEndedIsRemovedByTheNextJob) {
  // A process that has ended: its pid, reaped, names no process (pids are not reused this soon).
  const pid_t ended = ::fork();
  ASSERT_GE(ended, 0);
  if (ended == 0) ::_exit(0);
  ::waitpid(ended, nullptr, 0);
  const std::string abandoned = ShmGroup::new_segment_name(ended);
  const std::string live = ShmGroup::new_segment_name();  // this process: still running
  // Another pid namespace's: its pids mean nothing here, so it is left alone.
  std::string foreign = abandoned;
  foreign.replace(foreign.find('-', std::string("/backplane-").size()), 1, "-1");
  create_segment(abandoned);
  create_segment(live);
  create_segment(foreign);
  EXPECT_EQ(abandoned.rfind("/backplane-" + std::to_string(ended) + "-", 0), 0u) << abandoned;

  EXPECT_GE(ShmGroup::remove_abandoned_segments(), 1);
  EXPECT_FALSE(segment_exists(abandoned)) << abandoned;
  EXPECT_TRUE(segment_exists(live)) << live;
  EXPECT_TRUE(segment_exists(foreign)) << foreign;
  ::shm_unlink(live.c_str());
  ::shm_unlink(foreign.c_str());
}

}  // namespace
