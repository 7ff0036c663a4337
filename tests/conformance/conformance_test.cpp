// The plugin conformance suite: every collective × dtype × reduce op × size, in place and async,
// point to point and comm_split, checked against values computed locally. It runs unchanged against
// any backend, as real processes under a launcher:
//
//   bpl-run --nproc-per-node 3 bpl-conformance --backend=gloo
//   mpirun -np 3 bpl-conformance --backend=mpi
//
// Every rank runs every test in the same order; a test never returns between collectives, so one
// rank's failed check cannot desynchronise the others. Without --backend the environment selects.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "backplane/backplane.h"
#include "support/ranks.h"
#include "support/values.h"

namespace backplane::test {
namespace {

struct World {
  bpl_runtime* runtime = nullptr;
  bpl_comm* comm = nullptr;
  int rank = 0;
  int size = 1;
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
};
World world;

// 1 MiB and a bit for any dtype, and odd.
size_t large_count(bpl_dtype dtype) { return (1u << 20) / bpl_dtype_size(dtype) + 3; }

std::vector<size_t> sizes_for(bpl_dtype dtype) { return {0, 1, 37, large_count(dtype)}; }

// Skips (with the reason) what the backend reports it does not provide.
#define SKIP_UNLESS_SUPPORTED(coll, dtype, op)                                                                   \
  do {                                                                                                          \
    if (!(world.info.collectives & BPL_BIT(coll))) GTEST_SKIP() << world.info.backend << " lacks " << bpl_collective_name(coll); \
    if ((dtype) && !(world.info.dtypes & BPL_BIT(dtype))) GTEST_SKIP() << world.info.backend << " lacks dtype " << bpl_dtype_name(dtype); \
    if ((op) && !(world.info.reduce_ops & BPL_BIT(op))) GTEST_SKIP() << world.info.backend << " lacks op " << bpl_reduce_op_name(op); \
  } while (0)

#define EXPECT_OK(call) EXPECT_EQ((call), BPL_OK) << bpl_last_error()

struct Case {
  bpl_dtype dtype;
  bpl_reduce_op op;  // 0 for collectives without one
  size_t count;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = bpl_dtype_name(info.param.dtype);
  if (info.param.op) name += std::string("_") + bpl_reduce_op_name(info.param.op);
  return name + "_" + std::to_string(info.param.count);
}

std::vector<Case> reduction_cases() {
  std::vector<Case> cases;
  for (bpl_dtype dtype : kAllDtypes)
    for (bpl_reduce_op op : kAllOps)
      for (size_t count : sizes_for(dtype)) cases.push_back({dtype, op, count});
  return cases;
}

std::vector<Case> data_cases() {
  std::vector<Case> cases;
  for (bpl_dtype dtype : kAllDtypes)
    for (size_t count : sizes_for(dtype)) cases.push_back({dtype, 0, count});
  return cases;
}

Buffer input(const Case& c, int rank, size_t blocks = 1) {
  Buffer buffer(c.dtype, c.count * blocks);
  for (size_t i = 0; i < c.count * blocks; ++i) buffer.set(i, input_value(c.dtype, c.op, rank, i));
  return buffer;
}

/* ---- reductions ---- */

class Reduction : public ::testing::TestWithParam<Case> {};

TEST_P(Reduction, Allreduce) {
  const Case c = GetParam();
  SKIP_UNLESS_SUPPORTED(BPL_COLL_ALLREDUCE, c.dtype, c.op);
  Buffer send = input(c, world.rank);
  Buffer recv(c.dtype, c.count);
  EXPECT_OK(bpl_allreduce(world.comm, send.data(), recv.data(), c.count, c.dtype, c.op, nullptr));
  EXPECT_TRUE(elements_match(recv, 0, c.count, [&](size_t i) { return reduced_value(c.dtype, c.op, world.size, i); }));
  EXPECT_TRUE(elements_match(send, 0, c.count, [&](size_t i) { return input_value(c.dtype, c.op, world.rank, i); }))
      << "the send buffer changed";
  EXPECT_TRUE(recv.canary_intact());
}

TEST_P(Reduction, AllreduceInPlace) {
  const Case c = GetParam();
  SKIP_UNLESS_SUPPORTED(BPL_COLL_ALLREDUCE, c.dtype, c.op);
  Buffer buf = input(c, world.rank);
  EXPECT_OK(bpl_allreduce(world.comm, buf.data(), buf.data(), c.count, c.dtype, c.op, nullptr));
  EXPECT_TRUE(elements_match(buf, 0, c.count, [&](size_t i) { return reduced_value(c.dtype, c.op, world.size, i); }));
  EXPECT_TRUE(buf.canary_intact());
}

TEST_P(Reduction, Reduce) {
  const Case c = GetParam();
  SKIP_UNLESS_SUPPORTED(BPL_COLL_REDUCE, c.dtype, c.op);
  const int root = world.size - 1;  // not rank 0, to catch root confusion
  Buffer send = input(c, world.rank);
  Buffer recv(c.dtype, c.count);
  const std::vector<unsigned char> untouched = recv.bytes;
  EXPECT_OK(bpl_reduce(world.comm, send.data(), recv.data(), c.count, c.dtype, c.op, root, nullptr));
  if (world.rank == root) {
    EXPECT_TRUE(elements_match(recv, 0, c.count, [&](size_t i) { return reduced_value(c.dtype, c.op, world.size, i); }));
  } else {
    EXPECT_EQ(recv.bytes, untouched) << "reduce wrote into recv on a non-root rank";
  }
  EXPECT_TRUE(recv.canary_intact());
}

TEST_P(Reduction, ReduceScatter) {
  const Case c = GetParam();
  SKIP_UNLESS_SUPPORTED(BPL_COLL_REDUCE_SCATTER, c.dtype, c.op);
  Buffer send = input(c, world.rank, world.size);
  Buffer recv(c.dtype, c.count);
  EXPECT_OK(bpl_reduce_scatter(world.comm, send.data(), recv.data(), c.count, c.dtype, c.op, nullptr));
  const size_t first = c.count * world.rank;
  EXPECT_TRUE(elements_match(recv, 0, c.count, [&](size_t i) { return reduced_value(c.dtype, c.op, world.size, first + i); }));
  EXPECT_TRUE(recv.canary_intact());
}

INSTANTIATE_TEST_SUITE_P(All, Reduction, ::testing::ValuesIn(reduction_cases()), case_name);

/* ---- data movement ---- */

class Movement : public ::testing::TestWithParam<Case> {};

TEST_P(Movement, Broadcast) {
  const Case c = GetParam();
  SKIP_UNLESS_SUPPORTED(BPL_COLL_BROADCAST, c.dtype, 0);
  const int root = 1 % world.size;
  Buffer buf = input(c, world.rank);
  EXPECT_OK(bpl_broadcast(world.comm, buf.data(), c.count, c.dtype, root, nullptr));
  EXPECT_TRUE(elements_match(buf, 0, c.count, [&](size_t i) { return input_value(c.dtype, 0, root, i); }));
  EXPECT_TRUE(buf.canary_intact());
}

TEST_P(Movement, Allgather) {
  const Case c = GetParam();
  SKIP_UNLESS_SUPPORTED(BPL_COLL_ALLGATHER, c.dtype, 0);
  Buffer send = input(c, world.rank);
  Buffer recv(c.dtype, c.count * world.size);
  EXPECT_OK(bpl_allgather(world.comm, send.data(), recv.data(), c.count, c.dtype, nullptr));
  for (int r = 0; r < world.size; ++r) {
    EXPECT_TRUE(elements_match(recv, c.count * r, c.count, [&](size_t i) { return input_value(c.dtype, 0, r, i); }))
        << "block of rank " << r;
  }
  EXPECT_TRUE(recv.canary_intact());
}

TEST_P(Movement, AllgatherInPlace) {
  const Case c = GetParam();
  SKIP_UNLESS_SUPPORTED(BPL_COLL_ALLGATHER, c.dtype, 0);
  Buffer buf(c.dtype, c.count * world.size);
  for (size_t i = 0; i < c.count; ++i) buf.set(c.count * world.rank + i, input_value(c.dtype, 0, world.rank, i));
  char* own = static_cast<char*>(buf.data()) + c.count * world.rank * bpl_dtype_size(c.dtype);
  EXPECT_OK(bpl_allgather(world.comm, own, buf.data(), c.count, c.dtype, nullptr));
  for (int r = 0; r < world.size; ++r) {
    EXPECT_TRUE(elements_match(buf, c.count * r, c.count, [&](size_t i) { return input_value(c.dtype, 0, r, i); }))
        << "block of rank " << r;
  }
}

TEST_P(Movement, Alltoall) {
  const Case c = GetParam();
  SKIP_UNLESS_SUPPORTED(BPL_COLL_ALLTOALL, c.dtype, 0);
  // Block b of rank r's send holds input_value(r * size + b, …): rank r receives block r of everyone.
  Buffer send(c.dtype, c.count * world.size);
  for (int b = 0; b < world.size; ++b)
    for (size_t i = 0; i < c.count; ++i) send.set(c.count * b + i, input_value(c.dtype, 0, world.rank * world.size + b, i));
  Buffer recv(c.dtype, c.count * world.size);
  EXPECT_OK(bpl_alltoall(world.comm, send.data(), recv.data(), c.count, c.dtype, nullptr));
  for (int r = 0; r < world.size; ++r) {
    EXPECT_TRUE(elements_match(recv, c.count * r, c.count,
                               [&](size_t i) { return input_value(c.dtype, 0, r * world.size + world.rank, i); }))
        << "block from rank " << r;
  }
  EXPECT_TRUE(recv.canary_intact());
}

TEST_P(Movement, Gather) {
  const Case c = GetParam();
  SKIP_UNLESS_SUPPORTED(BPL_COLL_GATHER, c.dtype, 0);
  const int root = 1 % world.size;
  Buffer send = input(c, world.rank);
  Buffer recv(c.dtype, world.rank == root ? c.count * world.size : 0);
  EXPECT_OK(bpl_gather(world.comm, send.data(), world.rank == root ? recv.data() : nullptr, c.count, c.dtype, root, nullptr));
  if (world.rank == root) {
    for (int r = 0; r < world.size; ++r) {
      EXPECT_TRUE(elements_match(recv, c.count * r, c.count, [&](size_t i) { return input_value(c.dtype, 0, r, i); }))
          << "block of rank " << r;
    }
  }
  EXPECT_TRUE(recv.canary_intact());
}

TEST_P(Movement, Scatter) {
  const Case c = GetParam();
  SKIP_UNLESS_SUPPORTED(BPL_COLL_SCATTER, c.dtype, 0);
  const int root = world.size - 1;
  Buffer send(c.dtype, world.rank == root ? c.count * world.size : 0);
  for (size_t i = 0; i < send.count; ++i) send.set(i, input_value(c.dtype, 0, static_cast<int>(i / c.count), i % c.count));
  Buffer recv(c.dtype, c.count);
  EXPECT_OK(bpl_scatter(world.comm, world.rank == root ? send.data() : nullptr, recv.data(), c.count, c.dtype, root, nullptr));
  EXPECT_TRUE(elements_match(recv, 0, c.count, [&](size_t i) { return input_value(c.dtype, 0, world.rank, i); }));
  EXPECT_TRUE(recv.canary_intact());
}

// Uneven blocks: rank r gives count + r elements, placed in recv in reverse rank order with a gap of 2
// elements between blocks (left as they were).
TEST_P(Movement, Allgatherv) {
  const Case c = GetParam();
  SKIP_UNLESS_SUPPORTED(BPL_COLL_ALLGATHERV, c.dtype, 0);
  std::vector<int64_t> counts(static_cast<size_t>(world.size)), displs(counts.size());
  int64_t next = 0;
  for (int r = world.size - 1; r >= 0; --r) {
    counts[static_cast<size_t>(r)] = static_cast<int64_t>(c.count) + r;
    displs[static_cast<size_t>(r)] = next;
    next += counts[static_cast<size_t>(r)] + 2;
  }
  const size_t mine = c.count + static_cast<size_t>(world.rank);
  Buffer send(c.dtype, mine);
  for (size_t i = 0; i < mine; ++i) send.set(i, input_value(c.dtype, 0, world.rank, i));
  Buffer recv(c.dtype, static_cast<size_t>(next));
  EXPECT_OK(bpl_allgatherv(world.comm, send.data(), static_cast<int64_t>(mine), recv.data(), counts.data(), displs.data(),
                           c.dtype, nullptr));
  for (int r = 0; r < world.size; ++r) {
    const auto i = static_cast<size_t>(r);
    EXPECT_TRUE(elements_match(recv, static_cast<size_t>(displs[i]), static_cast<size_t>(counts[i]),
                               [&](size_t k) { return input_value(c.dtype, 0, r, k); }))
        << "block of rank " << r;
  }
  EXPECT_TRUE(recv.canary_intact());
}

// Rank q sends rank r count + (7q + r) % 3 elements; blocks sit in reverse order with gaps of 2 elements.
TEST_P(Movement, Alltoallv) {
  const Case c = GetParam();
  SKIP_UNLESS_SUPPORTED(BPL_COLL_ALLTOALLV, c.dtype, 0);
  auto between = [&](int from, int to) { return static_cast<int64_t>(c.count) + (7 * from + to) % 3; };
  const auto ranks = static_cast<size_t>(world.size);
  std::vector<int64_t> sendcounts(ranks), sdispls(ranks), recvcounts(ranks), rdispls(ranks);
  int64_t sent = 0, received = 0;
  for (int r = world.size - 1; r >= 0; --r) {
    const auto i = static_cast<size_t>(r);
    sendcounts[i] = between(world.rank, r);
    sdispls[i] = sent;
    sent += sendcounts[i] + 2;
    recvcounts[i] = between(r, world.rank);
    rdispls[i] = received;
    received += recvcounts[i] + 2;
  }
  Buffer send(c.dtype, static_cast<size_t>(sent));
  for (int r = 0; r < world.size; ++r) {
    const auto i = static_cast<size_t>(r);
    for (int64_t k = 0; k < sendcounts[i]; ++k) {
      send.set(static_cast<size_t>(sdispls[i] + k), input_value(c.dtype, 0, world.rank * world.size + r, static_cast<size_t>(k)));
    }
  }
  Buffer recv(c.dtype, static_cast<size_t>(received));
  EXPECT_OK(bpl_alltoallv(world.comm, send.data(), sendcounts.data(), sdispls.data(), recv.data(), recvcounts.data(),
                          rdispls.data(), c.dtype, nullptr));
  for (int r = 0; r < world.size; ++r) {
    const auto i = static_cast<size_t>(r);
    EXPECT_TRUE(elements_match(recv, static_cast<size_t>(rdispls[i]), static_cast<size_t>(recvcounts[i]),
                               [&](size_t k) { return input_value(c.dtype, 0, r * world.size + world.rank, k); }))
        << "block from rank " << r;
  }
  EXPECT_TRUE(recv.canary_intact());
}

TEST_P(Movement, SendRecvRing) {
  const Case c = GetParam();
  SKIP_UNLESS_SUPPORTED(BPL_COLL_SEND, c.dtype, 0);
  if (world.size < 2) GTEST_SKIP() << "needs 2 ranks";
  // Everyone sends to the right and receives from the left at once: needs the async path.
  const int right = (world.rank + 1) % world.size;
  const int left = (world.rank + world.size - 1) % world.size;
  Buffer send = input(c, world.rank);
  Buffer recv(c.dtype, c.count);
  bpl_request* receiving = nullptr;
  bpl_request* sending = nullptr;
  EXPECT_OK(bpl_recv(world.comm, recv.data(), c.count, c.dtype, left, 7, &receiving));
  EXPECT_OK(bpl_send(world.comm, send.data(), c.count, c.dtype, right, 7, &sending));
  EXPECT_OK(bpl_request_wait(sending, BPL_TIMEOUT_DEFAULT));
  EXPECT_OK(bpl_request_wait(receiving, BPL_TIMEOUT_DEFAULT));
  EXPECT_OK(bpl_request_free(sending));
  EXPECT_OK(bpl_request_free(receiving));
  EXPECT_TRUE(elements_match(recv, 0, c.count, [&](size_t i) { return input_value(c.dtype, 0, left, i); }));
  EXPECT_TRUE(recv.canary_intact());
}

INSTANTIATE_TEST_SUITE_P(All, Movement, ::testing::ValuesIn(data_cases()), case_name);

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
// blocking call (with BPL_MPI_WATCHDOG=1 that is MPI's own barrier, which moves nothing of backplane's
// on by itself). Both move more than every eager limit, in several rounds.
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

/* ---- the list of kinds ---- */

// Whether a test's "Suite.Name" has the words of a kind's name in order ("recv_any": Recv...Any),
// ignoring case.
bool names_kind(std::string test, const std::string& kind) {
  std::transform(test.begin(), test.end(), test.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  size_t at = 0;
  for (size_t start = 0; start <= kind.size();) {
    const size_t end = std::min(kind.find('_', start), kind.size());
    at = test.find(kind.substr(start, end - start), at);
    if (at == std::string::npos) return false;
    start = end + 1;
  }
  return true;
}

// Every kind of the ABI's list (BPL_FOR_EACH_COLLECTIVE) has a test here that names it: a kind added to
// the list without one fails here, by name.
TEST(Conformance, EveryKindOfTheAbiHasATest) {
  std::vector<std::string> tests;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      tests.push_back(std::string(suite.name()) + "." + suite.GetTestInfo(t)->name());
    }
  }
#define BPL_EXPECT_TESTED(code, name, minor)                                                            \
  EXPECT_TRUE(std::any_of(tests.begin(), tests.end(), [](const std::string& test) { return names_kind(test, name); })) \
      << "no conformance test names " << name;
  BPL_FOR_EACH_COLLECTIVE(BPL_EXPECT_TESTED)
#undef BPL_EXPECT_TESTED
  EXPECT_FALSE(names_kind("Movement.Allgather", "recv_any"));  // the matcher itself can say no
}

}  // namespace
}  // namespace backplane::test

int main(int argc, char** argv) {
  using backplane::test::world;
  ::testing::InitGoogleTest(&argc, argv);
  std::string backend;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--backend=", 10) == 0) {
      backend = argv[i] + 10;
    } else {
      std::fprintf(stderr, "usage: bpl-conformance [gtest flags] [--backend=NAME|PATH]\n");
      return 2;
    }
  }
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.backend = backend.empty() ? nullptr : backend.c_str();
  bpl_status status = bpl_init(&options, &world.runtime);
  if (status != BPL_OK) {
    std::fprintf(stderr, "bpl-conformance: bpl_init failed: %s: %s\n", bpl_status_name(status), bpl_last_error());
    return 1;
  }
  bpl_runtime_describe(world.runtime, &world.info);
  bpl_comm_world(world.runtime, &world.comm);
  world.rank = world.info.rank;
  world.size = world.info.world_size;
  if (world.rank == 0) {
    std::printf("conformance: backend %s (%s) from %s, %d rank(s)\n", world.info.backend, world.info.details,
                world.info.plugin_path, world.size);
  }
  backplane::test::report_failures_only_unless_rank_zero(world.rank);
  int result = RUN_ALL_TESTS();
  status = bpl_finalize(world.runtime);
  if (status != BPL_OK) {
    std::fprintf(stderr, "rank %d: bpl_finalize failed: %s\n", world.rank, bpl_last_error());
    result = 1;
  }
  return result;
}
