// The shared-memory path's failures and edges: ranks that disagree, an absent or ended peer (forked
// processes where a peer's end is what is tested), single copy turned off or cut short, and the
// segments' names and leftovers.
#include "plugins/gloo/shm_group_test_support.h"

namespace {

using namespace backplane::gloo_plugin::shm_test;

TEST(ShmGroupFailures, DifferentSizesOrCollectivesAreAMismatchOnEveryRank) {
  Segment segment(2);
  auto groups = segment.groups();
  std::vector<Outcome> outcomes(2);
  run_threads(groups, [&](int rank, ShmGroup& group) {
    std::vector<float> data(rank == 0 ? 4 : 8);
    outcomes[static_cast<size_t>(rank)] = outcome_of([&] {
      group.allreduce(data.data(), data.data(), data.size(), BPL_DTYPE_F32, BPL_OP_SUM,
                      kTimeout);
    });
  });
  EXPECT_EQ(outcomes[0].status, BPL_ERR_MISMATCH) << outcomes[0].message;
  EXPECT_NE(outcomes[0].message.find("rank 0 calls allreduce or reduce of 16 bytes; rank 1 calls allreduce or reduce of 32 bytes"), std::string::npos)
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

// Ranks naming different roots of a broadcast, gather or scatter disagree at once (each would wait for
// or read the wrong rank), at a staged and a single-copy size.
TEST(ShmGroupFailures, DifferentRootsAreAMismatchOnEveryRank) {
  for (const std::string op : {"broadcast", "gather", "scatter"}) {
    for (size_t block : {size_t{64}, ShmGroup::kSingleCopyMinBytes}) {
      Segment segment(3);
      auto groups = segment.groups(true);
      std::vector<Outcome> outcomes(3);
      run_threads(groups, [&](int rank, ShmGroup& group) {
        const int root = rank == 2 ? 1 : 0;  // rank 2 names rank 1
        std::vector<char> big(3 * block), small(block);
        outcomes[static_cast<size_t>(rank)] = outcome_of([&] {
          if (op == "broadcast") group.broadcast(small.data(), block, root, kTimeout);
          if (op == "gather") group.gather(small.data(), big.data(), block, root, kTimeout);
          if (op == "scatter") group.scatter(big.data(), small.data(), block, root, kTimeout);
        });
      });
      for (size_t rank = 0; rank < 3; ++rank) {
        EXPECT_EQ(outcomes[rank].status, BPL_ERR_MISMATCH) << op << " " << block << ": " << outcomes[rank].message;
        EXPECT_NE(outcomes[rank].message.find("rank 2 calls " + op + " with root 1"), std::string::npos)
            << outcomes[rank].message;
      }
    }
  }
}

class AlltoallInPlaceOnOneRankOnly : public ::testing::TestWithParam<size_t> {};

TEST_P(AlltoallInPlaceOnOneRankOnly, IsAMismatch) {
  // At single-copy sizes a rank not in place reads its peers' send buffers, which a rank in place never
  // publishes; through the segment the two lay out their steps differently: both must fail, not read a
  // stale address or the wrong bytes.
  Segment segment(2);
  auto groups = segment.groups(true);
  const size_t block_bytes = GetParam();
  std::vector<Outcome> outcomes(2);
  run_threads(groups, [&](int rank, ShmGroup& group) {
    std::vector<char> send(2 * block_bytes, static_cast<char>(rank)), recv(2 * block_bytes);
    void* out = rank == 0 ? send.data() : recv.data();
    outcomes[static_cast<size_t>(rank)] = outcome_of([&] { group.alltoall(send.data(), out, block_bytes, kTimeout); });
  });
  const std::string bytes = std::to_string(block_bytes);
  EXPECT_EQ(outcomes[0].status, BPL_ERR_MISMATCH) << outcomes[0].message;
  EXPECT_NE(outcomes[0].message.find("rank 0 calls alltoall in place of " + bytes + " bytes; rank 1 calls alltoall of " +
                                     bytes + " bytes"),
            std::string::npos)
      << outcomes[0].message;
  EXPECT_EQ(outcomes[1].status, BPL_ERR_MISMATCH) << outcomes[1].message;
  EXPECT_NE(outcomes[1].message.find("rank 0 calls alltoall in place of " + bytes + " bytes"), std::string::npos)
      << outcomes[1].message;
}

INSTANTIATE_TEST_SUITE_P(ShmGroupFailures, AlltoallInPlaceOnOneRankOnly,
                         ::testing::Values(size_t{1024}, ShmGroup::kSingleCopyMinBytes, 2 * ShmGroup::kSingleCopyMaxBytes),
                         [](const ::testing::TestParamInfo<size_t>& info) { return std::to_string(info.param) + "_bytes"; });

TEST(ShmGroupFailures, AnAbsentPeerIsATimeoutThatEveryRankThenSees) {
  Segment segment(2);
  auto groups = segment.groups();
  float x = 1;
  const Outcome waited = outcome_of(
      [&] { groups[0]->allreduce(&x, &x, 1, BPL_DTYPE_F32, BPL_OP_SUM, milliseconds(300)); });
  EXPECT_EQ(waited.status, BPL_ERR_TIMEOUT) << waited.message;
  EXPECT_NE(waited.message.find("rank 1 did not arrive in time"), std::string::npos) << waited.message;
  EXPECT_GE(waited.seconds, 0.29);
  EXPECT_LT(waited.seconds, 2.0);
  // Rank 1 comes late: the group has failed, so it fails at once with rank 0's record.
  const Outcome late = outcome_of(
      [&] { groups[1]->allreduce(&x, &x, 1, BPL_DTYPE_F32, BPL_OP_SUM, kTimeout); });
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

TEST(ShmGroupSingleCopy, ARankThatCannotReadItsPeersTurnsItOffEverywhereNamingIt) {
  // Rank 0 is told that rank 1 is a process forked before the segment existed, which has not mapped
  // it: reading rank 1's word there fails, as where the kernel refuses process_vm_readv.
  const pid_t other = ::fork();
  ASSERT_GE(other, 0);
  if (other == 0) {
    ::pause();
    ::_exit(0);
  }
  Segment segment(2);
  std::vector<std::unique_ptr<ShmGroup>> groups;
  groups.push_back(ShmGroup::create(segment.name(), 2));
  groups.push_back(ShmGroup::open(segment.name(), 1, 2));
  groups[0]->set_peers({::getpid(), other});
  groups[1]->set_peers({::getpid(), ::getpid()});
  std::vector<std::string> refusals(2);
  run_threads(groups, [&](int rank, ShmGroup& group) { refusals[static_cast<size_t>(rank)] = group.enable_single_copy(true, kTimeout); });
  ::kill(other, SIGKILL);
  ::waitpid(other, nullptr, 0);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_FALSE(groups[static_cast<size_t>(rank)]->single_copy());
    EXPECT_EQ(refusals[static_cast<size_t>(rank)].rfind("rank 0 may not read its peers' memory (process_vm_readv: ", 0), 0u)
        << refusals[static_cast<size_t>(rank)];
  }
  groups[0]->set_peers({0, 0});  // the forked process is gone; rank 1 is a thread of this one
  // The staged path still runs, at a size that would have been single copy.
  const size_t block = ShmGroup::kSingleCopyMinBytes;
  run_threads(groups, [&](int rank, ShmGroup& group) {
    std::vector<char> mine(block, static_cast<char>('a' + rank)), all(2 * block);
    group.allgather(mine.data(), all.data(), block, kTimeout);
    EXPECT_EQ(all[block - 1], 'a') << "rank " << rank;
    EXPECT_EQ(all[2 * block - 1], 'b') << "rank " << rank;
  });
}

// Where single copy is on, each operation reads its peers' buffers at the sizes shm_group.h gives, and
// BPL_TRACE's path says so: data movers from kSingleCopyMinBytes to their largest size, scatter at
// every size from there, reductions never.
TEST(ShmGroupSingleCopy, EachOperationTakesItAtItsSizes) {
  Segment segment(2);
  auto groups = segment.groups(true);
  const ShmGroup& group = *groups[0];
  const std::string single = "shared memory, single copy", staged = "shared memory";
  const uint64_t min = ShmGroup::kSingleCopyMinBytes, max = ShmGroup::kSingleCopyMaxBytes;
  const uint64_t broadcast_max = ShmGroup::kSingleCopyBroadcastMaxBytes, huge = uint64_t{1} << 30;
  for (bpl_collective op : {BPL_COLL_ALLGATHER, BPL_COLL_ALLTOALL, BPL_COLL_GATHER, BPL_COLL_ALLGATHERV, BPL_COLL_ALLTOALLV}) {
    EXPECT_EQ(group.path_of(op, min - 1), staged) << op;
    EXPECT_EQ(group.path_of(op, min), single) << op;
    EXPECT_EQ(group.path_of(op, max), single) << op;
    EXPECT_EQ(group.path_of(op, max + 1), staged) << op;
  }
  EXPECT_EQ(group.path_of(BPL_COLL_BROADCAST, broadcast_max), single);
  EXPECT_EQ(group.path_of(BPL_COLL_BROADCAST, broadcast_max + 1), staged);
  EXPECT_EQ(group.path_of(BPL_COLL_SCATTER, min - 1), staged);
  EXPECT_EQ(group.path_of(BPL_COLL_SCATTER, huge), single);
  EXPECT_EQ(group.path_of(BPL_COLL_ALLREDUCE, max), staged);
  EXPECT_EQ(group.path_of(BPL_COLL_REDUCE_SCATTER, max), staged);
  EXPECT_EQ(group.path_of(BPL_COLL_SEND, huge), single);
}

TEST(ShmGroupSingleCopy, APeerThatEndsWhileItsBufferIsReadIsRemoteNamingIt) {
  Segment segment(2);
  auto group = ShmGroup::create(segment.name(), 2);
  const size_t block = ShmGroup::kSingleCopyMinBytes;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Rank 1 agrees to single copy, publishes its buffers for an allgather (on a thread, which waits
    // for rank 0), and ends before rank 0 comes to read them.
    auto peer = ShmGroup::open(segment.name(), 1, 2);
    peer->set_peers({::getppid(), 0});
    if (!peer->enable_single_copy(true, kTimeout).empty()) ::_exit(3);
    static std::vector<char> mine(block, 'b'), all(2 * block);
    std::thread([&] {
      try {
        peer->allgather(mine.data(), all.data(), block, kTimeout);
      } catch (...) {
      }
    }).detach();
    std::this_thread::sleep_for(milliseconds(100));
    ::_exit(0);
  }
  group->set_peers({0, child});
  ASSERT_EQ(group->enable_single_copy(true, kTimeout), "");
  int child_status = 0;
  ::waitpid(child, &child_status, 0);
  ASSERT_TRUE(WIFEXITED(child_status) && WEXITSTATUS(child_status) == 0) << "the peer could not set up single copy";
  std::vector<char> mine(block, 'a'), all(2 * block);
  const Outcome read = outcome_of([&] { group->allgather(mine.data(), all.data(), block, kTimeout); });
  EXPECT_EQ(read.status, BPL_ERR_REMOTE) << read.message;
  EXPECT_NE(read.message.find("rank 1 of this communicator, process " + std::to_string(child) + " on this machine, has ended"),
            std::string::npos)
      << read.message;
  EXPECT_LT(read.seconds, 2.0);
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
