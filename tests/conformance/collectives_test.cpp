// The conformance suite's reductions and data movement: every collective × dtype × reduce op × size,
// checked against values computed locally.
#include "conformance/conformance.h"

namespace backplane::test {
namespace {

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

}  // namespace
}  // namespace backplane::test
