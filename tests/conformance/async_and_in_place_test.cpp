// The conformance suite's in-place variants, requests completing in any order, and barriers.
#include "conformance/conformance.h"

namespace backplane::test {
namespace {

/* ---- the rest: in-place variants, async, point to point, barrier, split ---- */

TEST(Collectives, ReduceScatterInPlace) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_REDUCE_SCATTER, BPL_DTYPE_F32, BPL_OP_SUM);
  const Case c{BPL_DTYPE_F32, BPL_OP_SUM, 1001};
  Buffer buf = input(c, world.rank, world.size);
  char* own = static_cast<char*>(buf.data()) + c.count * world.rank * sizeof(float);
  EXPECT_OK(bpl_reduce_scatter(world.comm, buf.data(), own, c.count, c.dtype, c.op, nullptr));
  EXPECT_TRUE(elements_match(buf, c.count * world.rank, c.count,
                             [&](size_t i) { return reduced_value(c.dtype, c.op, world.size, c.count * world.rank + i); }));
}

// Reductions of several MiB a rank: larger than the pieces and chunks backends stage them in (the MPI
// plugin folds 4 MiB at a time), with odd counts so that no piece divides them.
TEST(Collectives, ReductionsLargerThanTheBackendsPieces) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_ALLREDUCE, BPL_DTYPE_F32, BPL_OP_SUM);
  SKIP_UNLESS_SUPPORTED(BPL_COLL_REDUCE, BPL_DTYPE_F32, BPL_OP_SUM);
  SKIP_UNLESS_SUPPORTED(BPL_COLL_REDUCE_SCATTER, BPL_DTYPE_F32, BPL_OP_SUM);
  const Case whole{BPL_DTYPE_F32, BPL_OP_SUM, (size_t{13} << 20) / sizeof(float) + 3};
  const auto reduced = [&](size_t first) {
    return [&, first](size_t i) { return reduced_value(BPL_DTYPE_F32, BPL_OP_SUM, world.size, first + i); };
  };
  Buffer send = input(whole, world.rank);
  Buffer recv(whole.dtype, whole.count);
  EXPECT_OK(bpl_allreduce(world.comm, send.data(), recv.data(), whole.count, whole.dtype, whole.op, nullptr));
  EXPECT_TRUE(elements_match(recv, 0, whole.count, reduced(0))) << "allreduce";
  const int root = world.size - 1;
  Buffer reduced_at_root(whole.dtype, whole.count);
  EXPECT_OK(bpl_reduce(world.comm, send.data(), reduced_at_root.data(), whole.count, whole.dtype, whole.op, root, nullptr));
  if (world.rank == root) {
    EXPECT_TRUE(elements_match(reduced_at_root, 0, whole.count, reduced(0))) << "reduce";
  }
  const Case block{BPL_DTYPE_F32, BPL_OP_SUM, (size_t{5} << 20) / sizeof(float) + 3};
  Buffer blocks = input(block, world.rank, world.size);
  Buffer mine(block.dtype, block.count);
  EXPECT_OK(bpl_reduce_scatter(world.comm, blocks.data(), mine.data(), block.count, block.dtype, block.op, nullptr));
  EXPECT_TRUE(elements_match(mine, 0, block.count, reduced(block.count * world.rank))) << "reduce_scatter";
  EXPECT_TRUE(recv.canary_intact() && reduced_at_root.canary_intact() && mine.canary_intact());
}

// Asynchronous collectives complete whichever order the ranks wait for them in (MPI asks only that
// ranks start them in the same order): odd ranks wait for the second first. Both move more than
// every eager limit, in several rounds.
TEST(Collectives, AsyncCollectivesCompleteWhicheverOrderTheRanksWaitForThem) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_ALLREDUCE, BPL_DTYPE_F32, BPL_OP_SUM);
  SKIP_UNLESS_SUPPORTED(BPL_COLL_ALLGATHER, BPL_DTYPE_F32, 0);
  const Case c{BPL_DTYPE_F32, BPL_OP_SUM, 64 * 1024 + 3};
  Buffer summed = input(c, world.rank), mine = input(c, world.rank);
  Buffer gathered(c.dtype, c.count * world.size);
  bpl_request* requests[2] = {nullptr, nullptr};
  EXPECT_OK(bpl_allreduce(world.comm, summed.data(), summed.data(), c.count, c.dtype, c.op, &requests[0]));
  EXPECT_OK(bpl_allgather(world.comm, mine.data(), gathered.data(), c.count, c.dtype, &requests[1]));
  for (const int i : {world.rank % 2, 1 - world.rank % 2}) {
    EXPECT_OK(bpl_request_wait(requests[i], 20000)) << "request " << i;
  }
  for (bpl_request* request : requests) EXPECT_OK(bpl_request_free(request));
  EXPECT_TRUE(elements_match(summed, 0, c.count, [&](size_t i) { return reduced_value(c.dtype, c.op, world.size, i); }));
  for (int r = 0; r < world.size; ++r) {
    EXPECT_TRUE(elements_match(gathered, c.count * r, c.count, [&](size_t i) { return input_value(c.dtype, c.op, r, i); }))
        << "block of rank " << r;
  }
}

// A blocking call between an asynchronous one and its wait, with the ranks waiting in different
// orders: odd ranks wait for the allreduce and the recv before the barrier, even ranks after it. As
// under MPI's progress rule, the asynchronous operations complete though a rank is inside the
// blocking call. Both move more than every eager limit, in several rounds.
TEST(Collectives, AsyncOperationsCompleteWhileAPeerIsInABlockingCall) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_ALLREDUCE, BPL_DTYPE_F32, BPL_OP_SUM);
  SKIP_UNLESS_SUPPORTED(BPL_COLL_SEND, BPL_DTYPE_F32, 0);
  if (world.size < 2) GTEST_SKIP() << "needs 2 ranks";
  const Case c{BPL_DTYPE_F32, BPL_OP_SUM, 256 * 1024 + 3};
  Buffer summed = input(c, world.rank), sent = input(c, world.rank), received(c.dtype, c.count);
  const int next = (world.rank + 1) % world.size, previous = (world.rank + world.size - 1) % world.size;
  bpl_request* requests[2] = {nullptr, nullptr};
  EXPECT_OK(bpl_allreduce(world.comm, summed.data(), summed.data(), c.count, c.dtype, c.op, &requests[0]));
  EXPECT_OK(bpl_recv(world.comm, received.data(), c.count, c.dtype, previous, 5, &requests[1]));
  const auto wait_for_both = [&] {
    for (bpl_request* request : requests) EXPECT_OK(bpl_request_wait(request, 20000));
  };
  if (world.rank % 2 == 1) wait_for_both();
  // The receiver of a blocking send has posted its recv, but may be waiting for something else.
  EXPECT_OK(bpl_send(world.comm, sent.data(), c.count, c.dtype, next, 5, nullptr));
  EXPECT_OK(bpl_barrier(world.comm, nullptr));
  if (world.rank % 2 == 0) wait_for_both();
  for (bpl_request* request : requests) EXPECT_OK(bpl_request_free(request));
  EXPECT_TRUE(elements_match(summed, 0, c.count, [&](size_t i) { return reduced_value(c.dtype, c.op, world.size, i); }));
  EXPECT_TRUE(elements_match(received, 0, c.count, [&](size_t i) { return input_value(c.dtype, c.op, previous, i); }));
}

// The same across communicators: a rank's recv posted on a copy of the world completes while the rank
// waits in a barrier of the world, which its sender joins only once its blocking send on the copy is
// received (odd ranks send first; even ranks after the barrier). As under MPI's progress rule, any
// wait of a rank moves every receive it posted.
TEST(Collectives, AReceiveCompletesWhileItsRankWaitsOnAnotherCommunicator) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_SEND, BPL_DTYPE_F32, 0);
  SKIP_UNLESS_SUPPORTED(BPL_COLL_COMM_SPLIT, 0, 0);
  if (world.size < 2) GTEST_SKIP() << "needs 2 ranks";
  const Case c{BPL_DTYPE_F32, BPL_OP_SUM, 256 * 1024 + 3};
  bpl_comm* copy = nullptr;
  ASSERT_EQ(bpl_comm_split(world.comm, 0, world.rank, &copy), BPL_OK) << bpl_last_error();
  Buffer sent = input(c, world.rank), received(c.dtype, c.count);
  const int next = (world.rank + 1) % world.size, previous = (world.rank + world.size - 1) % world.size;
  bpl_request* request = nullptr;
  EXPECT_OK(bpl_recv(copy, received.data(), c.count, c.dtype, previous, 7, &request));
  const bool sends_first = world.rank % 2 == 1;
  const auto send = [&] { EXPECT_OK(bpl_send(copy, sent.data(), c.count, c.dtype, next, 7, nullptr)); };
  if (sends_first) send();
  EXPECT_OK(bpl_barrier(world.comm, nullptr));
  if (!sends_first) send();
  EXPECT_OK(bpl_request_wait(request, 20000));
  EXPECT_OK(bpl_request_free(request));
  EXPECT_TRUE(elements_match(received, 0, c.count, [&](size_t i) { return input_value(c.dtype, c.op, previous, i); }));
  EXPECT_OK(bpl_comm_destroy(copy));
}

TEST(Collectives, AlltoallInPlace) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_ALLTOALL, BPL_DTYPE_I32, 0);
  const size_t count = 513;
  Buffer buf(BPL_DTYPE_I32, count * world.size);
  for (int b = 0; b < world.size; ++b)
    for (size_t i = 0; i < count; ++i) buf.set(count * b + i, 1000 * world.rank + 10 * b + static_cast<double>(i % 7));
  EXPECT_OK(bpl_alltoall(world.comm, buf.data(), buf.data(), count, BPL_DTYPE_I32, nullptr));
  for (int r = 0; r < world.size; ++r) {
    EXPECT_TRUE(elements_match(buf, count * r, count,
                               [&](size_t i) { return 1000 * r + 10 * world.rank + static_cast<double>(i % 7); }));
  }
}

// In place: the root's own block already in recv (gather) or left in send (scatter); allgatherv's own
// block already at its displacement. Asynchronous, all three in flight at once.
TEST(Collectives, GatherScatterAllgathervInPlaceAndAsync) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_GATHER, BPL_DTYPE_I32, 0);
  SKIP_UNLESS_SUPPORTED(BPL_COLL_ALLGATHERV, BPL_DTYPE_I32, 0);
  const size_t count = 301;
  const int root = 0;
  auto value = [](int r, size_t i) { return 1000.0 * r + static_cast<double>(i % 97); };
  Buffer gathered(BPL_DTYPE_I32, count * world.size), own(BPL_DTYPE_I32, count);
  for (size_t i = 0; i < count; ++i) {
    if (world.rank == root) {
      gathered.set(count * root + i, value(root, i));
    } else {
      own.set(i, value(world.rank, i));
    }
  }
  Buffer scattered(BPL_DTYPE_I32, world.rank == root ? count * world.size : count);
  if (world.rank == root) {
    for (size_t i = 0; i < scattered.count; ++i) scattered.set(i, value(static_cast<int>(i / count), i % count));
  }
  std::vector<int64_t> counts(static_cast<size_t>(world.size), static_cast<int64_t>(count)), displs(counts.size());
  for (int r = 0; r < world.size; ++r) displs[static_cast<size_t>(r)] = static_cast<int64_t>(count) * r;
  Buffer all(BPL_DTYPE_I32, count * world.size);
  for (size_t i = 0; i < count; ++i) all.set(count * world.rank + i, value(world.rank, i));
  auto* gathered_own = static_cast<char*>(gathered.data()) + count * root * sizeof(int32_t);
  auto* scattered_own = static_cast<char*>(scattered.data()) + (world.rank == root ? count * root * sizeof(int32_t) : 0);
  bpl_request* requests[3] = {nullptr, nullptr, nullptr};
  EXPECT_OK(bpl_gather(world.comm, world.rank == root ? gathered_own : own.data(), gathered.data(), count, BPL_DTYPE_I32,
                       root, &requests[0]));
  EXPECT_OK(bpl_scatter(world.comm, scattered.data(), scattered_own, count, BPL_DTYPE_I32, root, &requests[1]));
  EXPECT_OK(bpl_allgatherv(world.comm, static_cast<char*>(all.data()) + count * world.rank * sizeof(int32_t),
                           static_cast<int64_t>(count), all.data(), counts.data(), displs.data(), BPL_DTYPE_I32, &requests[2]));
  for (bpl_request* request : requests) {
    EXPECT_OK(bpl_request_wait(request, BPL_TIMEOUT_DEFAULT));
    EXPECT_OK(bpl_request_free(request));
  }
  for (int r = 0; r < world.size; ++r) {
    if (world.rank == root) {
      EXPECT_TRUE(elements_match(gathered, count * r, count, [&](size_t i) { return value(r, i); })) << "gathered from " << r;
    }
    EXPECT_TRUE(elements_match(all, count * r, count, [&](size_t i) { return value(r, i); })) << "allgatherv from " << r;
  }
  EXPECT_TRUE(elements_match(scattered, world.rank == root ? count * root : 0, count,
                             [&](size_t i) { return value(world.rank, i); }));
}

TEST(Collectives, AsyncRequestsCompleteInOrder) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_ALLREDUCE, BPL_DTYPE_F64, BPL_OP_SUM);
  // Several collectives in flight at once; each request gives its own result.
  constexpr int kInFlight = 4;
  const size_t count = 100003;
  std::vector<Buffer> buffers;
  for (int k = 0; k < kInFlight; ++k) {
    buffers.emplace_back(BPL_DTYPE_F64, count);
    for (size_t i = 0; i < count; ++i) buffers[k].set(i, (k + 1) * (world.rank + 1) + static_cast<double>(i % 13));
  }
  std::vector<bpl_request*> requests(kInFlight, nullptr);
  for (int k = 0; k < kInFlight; ++k) {
    EXPECT_OK(bpl_allreduce(world.comm, buffers[k].data(), buffers[k].data(), count, BPL_DTYPE_F64, BPL_OP_SUM,
                            &requests[k]));
  }
  // Poll the first, wait for the rest.
  int32_t done = 0;
  for (int spins = 0; spins < 100000 && !done; ++spins) EXPECT_OK(bpl_request_test(requests[0], &done));
  EXPECT_OK(bpl_request_wait(requests[0], BPL_TIMEOUT_DEFAULT));
  for (int k = 1; k < kInFlight; ++k) EXPECT_OK(bpl_request_wait(requests[k], 60000));
  for (int k = 0; k < kInFlight; ++k) {
    EXPECT_OK(bpl_request_test(requests[k], &done));
    EXPECT_EQ(done, 1);
    EXPECT_OK(bpl_request_free(requests[k]));
  }
  const double rank_sum = world.size * (world.size + 1) / 2.0;
  for (int k = 0; k < kInFlight; ++k) {
    EXPECT_TRUE(elements_match(buffers[k], 0, count,
                               [&](size_t i) { return (k + 1) * rank_sum + world.size * static_cast<double>(i % 13); }))
        << "request " << k;
  }
}

TEST(Collectives, AsyncThenBlockingKeepOrder) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_BROADCAST, BPL_DTYPE_I64, 0);
  // A blocking call posted after an async one runs after it on every rank.
  int64_t first = world.rank == 0 ? 11 : -1;
  int64_t second = world.rank == 0 ? 22 : -1;
  bpl_request* request = nullptr;
  EXPECT_OK(bpl_broadcast(world.comm, &first, 1, BPL_DTYPE_I64, 0, &request));
  EXPECT_OK(bpl_broadcast(world.comm, &second, 1, BPL_DTYPE_I64, 0, nullptr));
  EXPECT_OK(bpl_request_wait(request, BPL_TIMEOUT_DEFAULT));
  EXPECT_OK(bpl_request_free(request));
  EXPECT_EQ(first, 11);
  EXPECT_EQ(second, 22);
}

TEST(Collectives, BarrierAndAsyncBarrier) {
  SKIP_UNLESS_SUPPORTED(BPL_COLL_BARRIER, 0, 0);
  EXPECT_OK(bpl_barrier(world.comm, nullptr));
  bpl_request* request = nullptr;
  EXPECT_OK(bpl_barrier(world.comm, &request));
  EXPECT_OK(bpl_request_wait(request, BPL_TIMEOUT_DEFAULT));
  EXPECT_OK(bpl_request_free(request));
}

}  // namespace
}  // namespace backplane::test
