// The Gloo plugin's shared-memory path on its own (plugins/gloo/shm_group.h), without a rendezvous: its
// collectives at every size around the algorithms' boundaries, on 2 and 3 ranks that are threads each
// mapping the segment, staged and single-copy. The conformance and fault suites run the same code
// through bpl_*.
#include "plugins/gloo/shm_group_test_support.h"

namespace {

using namespace backplane::gloo_plugin::shm_test;

TEST_P(ShmGroupRanks, AllreduceSumsAtEverySizeInPlaceAndNot) {
  const int size = this->size();
  Segment segment(size);
  auto groups = this->groups(segment);
  for (size_t count : f32_counts()) {
    for (bool in_place : {false, true}) {
      run_threads(groups, [&](int rank, ShmGroup& group) {
        std::vector<float> send(count), recv(count, -1.0f);
        for (size_t i = 0; i < count; ++i) send[i] = value(rank, i);
        float* out = in_place ? send.data() : recv.data();
        group.allreduce(send.data(), out, count, BPL_DTYPE_F32, BPL_OP_SUM, kTimeout);
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
  const int size = this->size();
  Segment segment(size);
  auto groups = this->groups(segment);
  for (size_t count : f32_counts()) {
    std::vector<std::vector<float>> results(static_cast<size_t>(size), std::vector<float>(count));
    run_threads(groups, [&](int rank, ShmGroup& group) {
      std::mt19937 random(static_cast<unsigned>(rank + 1));
      std::uniform_real_distribution<float> uniform(-1e6f, 1e6f);
      std::vector<float> send(count);
      for (float& x : send) x = uniform(random) / static_cast<float>(rank + 3);
      group.allreduce(send.data(), results[static_cast<size_t>(rank)].data(), count, BPL_DTYPE_F32,
                      BPL_OP_SUM, kTimeout);
    });
    for (int r = 1; r < size; ++r) {
      EXPECT_EQ(std::memcmp(results[0].data(), results[static_cast<size_t>(r)].data(), count * 4), 0)
          << "rank " << r << " differs from rank 0 at " << count << " elements";
    }
  }
}

TEST_P(ShmGroupRanks, MaxAndInt64ProdReduce) {
  const int size = this->size();
  Segment segment(size);
  auto groups = this->groups(segment);
  const size_t count = ShmGroup::kSlotBytes / 8 + 5;  // i64: the chunked path
  run_threads(groups, [&](int rank, ShmGroup& group) {
    std::vector<int64_t> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<int64_t>(i % 5) + rank + 1;
    group.allreduce(data.data(), data.data(), count, BPL_DTYPE_I64, BPL_OP_PROD, kTimeout);
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
    group.allreduce(values.data(), values.data(), values.size(), BPL_DTYPE_F32, BPL_OP_MAX,
                    kTimeout);
    for (size_t i = 0; i < values.size(); ++i) {
      float expected = value(0, i);
      for (int q = 1; q < size; ++q) expected = std::max(expected, value(q, i));
      EXPECT_EQ(values[i], expected) << "rank " << rank << " [" << i << "]";
    }
  });
}

TEST_P(ShmGroupRanks, BroadcastFromEveryRoot) {
  const int size = this->size();
  Segment segment(size);
  auto groups = this->groups(segment);
  // Single-copy sizes too, where the root writes a share of every peer's buffer: shares of whole lines
  // and a remainder that the peers read.
  for (size_t bytes : {size_t{1}, size_t{1000}, ShmGroup::kSlotBytes, 2 * ShmGroup::kSlotBytes + 3,
                       ShmGroup::kSingleCopyMinBytes, ShmGroup::kSingleCopyMinBytes + 3 * 64 + 5,
                       ShmGroup::kSingleCopyBroadcastMaxBytes, ShmGroup::kSingleCopyBroadcastMaxBytes + 1}) {
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
  const int size = this->size();
  Segment segment(size);
  auto groups = this->groups(segment);
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
      group.reduce_scatter(blocks.data(), mine.data(), count, BPL_DTYPE_F32, BPL_OP_SUM,
                           kTimeout);
      // In place, as the plugin calls them: reduce_scatter into this rank's own block of the input,
      // allgather from this rank's block of the output.
      std::vector<float> in_place = blocks;
      float* own_block = in_place.data() + static_cast<size_t>(rank) * count;
      group.reduce_scatter(in_place.data(), own_block, count, BPL_DTYPE_F32, BPL_OP_SUM,
                           kTimeout);
      for (size_t i = 0; i < count; ++i) {
        float expected = 0;
        for (int q = 0; q < size; ++q) expected += value(q, static_cast<size_t>(rank) * count + i);
        if (mine[i] != expected || own_block[i] != expected) {
          ADD_FAILURE() << "reduce_scatter: rank " << rank << " [" << i << "] = " << mine[i] << ", in place "
                        << own_block[i] << ", expected " << expected;
          return;
        }
      }
      group.allgather(own_block, in_place.data(), count * 4, kTimeout);
      for (int q = 0; q < size; ++q) {
        for (size_t i = 0; i < count; ++i) {
          float expected = 0;
          for (int p = 0; p < size; ++p) expected += value(p, static_cast<size_t>(q) * count + i);
          if (in_place[static_cast<size_t>(q) * count + i] != expected) {
            ADD_FAILURE() << "allgather in place: rank " << rank << ", block " << q << " [" << i << "] wrong at " << count;
            return;
          }
        }
      }
    });
  }
}

TEST_P(ShmGroupRanks, AlltoallInPlaceAndNot) {
  const int size = this->size();
  Segment segment(size);
  auto groups = this->groups(segment);
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
  const int size = this->size();
  Segment segment(size);
  auto groups = this->groups(segment);
  // Flat and chunked allreduces, and a single-copy-sized allgather (where on), whose published buffer
  // addresses share the progress records with the staged steps.
  const size_t counts[] = {5, ShmGroup::kSlotBytes / 4 + 9, 2000, 4 * ShmGroup::kSlotBytes / 4 + 3};
  run_threads(groups, [&](int rank, ShmGroup& group) {
      for (int round = 0; round < 300; ++round) {
      const size_t count = counts[round % 4];
      std::vector<float> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = value(rank, i + static_cast<size_t>(round));
      group.allreduce(data.data(), data.data(), count, BPL_DTYPE_F32, BPL_OP_SUM, kTimeout);
      for (size_t i = 0; i < count; ++i) {
        float expected = 0;
        for (int q = 0; q < size; ++q) expected += value(q, i + static_cast<size_t>(round));
        if (data[i] != expected) {
          ADD_FAILURE() << "rank " << rank << ", round " << round << " [" << i << "] = " << data[i];
          return;
        }
      }
      if (round % 7 == 0) {
        const size_t block = ShmGroup::kSingleCopyMinBytes / 4;
        std::vector<float> mine(block, static_cast<float>(rank + round)), all(block * static_cast<size_t>(size));
        group.allgather(mine.data(), all.data(), block * 4, kTimeout);
        for (int q = 0; q < size; ++q) {
          if (all[static_cast<size_t>(q) * block] != static_cast<float>(q + round) ||
              all[static_cast<size_t>(q + 1) * block - 1] != static_cast<float>(q + round)) {
            ADD_FAILURE() << "rank " << rank << ", round " << round << ": allgather block " << q << " wrong";
            return;
          }
        }
      }
      if (round % 50 == 0) group.barrier(kTimeout);
    }
  });
}

// Outputs larger than the last-level cache are written with streaming stores (shm_copy.cpp's
// output_copy): every collective that copies out still delivers every byte, 2 ranks, 40 MiB outputs.
TEST(ShmGroupLargeOutputs, StreamedCopiesDeliverEveryByte) {
  Segment segment(2);
  auto groups = segment.groups(false);
  const size_t block = size_t{20} << 20;  // a rank's block: outputs of 40 MiB
  run_threads(groups, [&](int rank, ShmGroup& group) {
    const auto me = static_cast<size_t>(rank);
    auto byte = [](size_t from, size_t to, size_t i) { return static_cast<char>((i * 13 + from * 5 + to * 3) % 253); };
    std::vector<char> send(2 * block), recv(2 * block, 'x');
    for (size_t i = 0; i < send.size(); ++i) send[i] = byte(me, i / block, i % block);
    group.alltoall(send.data(), recv.data(), block, kTimeout);
    for (size_t i = 0; i < recv.size(); i += 4093) {
      ASSERT_EQ(recv[i], byte(i / block, me, i % block)) << "alltoall, rank " << rank << " [" << i << "]";
    }
    ASSERT_EQ(recv.back(), byte(1, me, block - 1));
    group.allgather(send.data(), recv.data(), block, kTimeout);  // rank q's first block, for rank 0
    for (size_t i = 0; i < recv.size(); i += 4093) ASSERT_EQ(recv[i], byte(i / block, 0, i % block)) << "allgather [" << i << "]";
    if (rank == 1) std::fill(recv.begin(), recv.end(), 'x');
    group.broadcast(recv.data(), recv.size(), 0, kTimeout);
    for (size_t i = 0; i < recv.size(); i += 4093) ASSERT_EQ(recv[i], byte(i / block, 0, i % block)) << "broadcast [" << i << "]";
  });
}

// A reduce_scatter whose result is larger than the last-level cache writes it with streaming stores
// (dtypes.h's Stores): 3 ranks, so that the passes before the last run in the group's partial buffer,
// into a result 4 bytes past a line's start (its first line and its last written through the cache),
// in place and not.
TEST(ShmGroupLargeOutputs, StreamedReductionsDeliverEveryElement) {
  constexpr int kRanks = 3;
  Segment segment(kRanks);
  auto groups = segment.groups(false);
  const size_t count = (size_t{33} << 20) / 4 + 5;  // a rank's result: just over 33 MiB
  run_threads(groups, [&](int rank, ShmGroup& group) {
    const auto me = static_cast<size_t>(rank);
    std::vector<float> blocks(count * kRanks), mine(count + 1);
    for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = value(rank, i);
    float* result = mine.data() + 1;
    group.reduce_scatter(blocks.data(), result, count, BPL_DTYPE_F32, BPL_OP_SUM, kTimeout);
    float* own_block = blocks.data() + me * count;
    group.reduce_scatter(blocks.data(), own_block, count, BPL_DTYPE_F32, BPL_OP_SUM, kTimeout);
    for (size_t i = 0; i < count; ++i) {
      float expected = 0;
      for (int q = 0; q < kRanks; ++q) expected += value(q, me * count + i);
      ASSERT_EQ(result[i], expected) << "rank " << rank << " [" << i << "] of " << count;
      ASSERT_EQ(own_block[i], expected) << "in place: rank " << rank << " [" << i << "] of " << count;
    }
  });
}

// The bytes of the rooted and variable-size tests: rank `from`'s block for rank `to`, its i-th byte.
char vbyte(size_t from, size_t to, size_t i) { return static_cast<char>((i * 31 + from * 7 + to * 3) % 251); }

TEST_P(ShmGroupRanks, GatherAndScatterFromEveryRoot) {
  const int size = this->size();
  const auto ranks = static_cast<size_t>(size);
  Segment segment(size);
  auto groups = this->groups(segment);
  const size_t slot = ShmGroup::kSlotBytes;
  for (size_t block : {size_t{1}, size_t{3000}, slot / 2 + 1, slot + 5, 3 * slot + 17, ShmGroup::kSingleCopyMinBytes / ranks + 3,
                       ShmGroup::kSingleCopyMaxBytes / ranks + 1}) {
    for (int root = 0; root < size; ++root) {
      run_threads(groups, [&](int rank, ShmGroup& group) {
        const auto me = static_cast<size_t>(rank);
        // gather: block q of the root's recv from rank q; the others pass no recv.
        std::vector<char> mine(block), all(rank == root ? block * ranks : 0, 'x');
        for (size_t i = 0; i < block; ++i) mine[i] = vbyte(me, static_cast<size_t>(root), i);
        group.gather(mine.data(), rank == root ? all.data() : nullptr, block, root, kTimeout);
        for (size_t i = 0; i < all.size(); ++i) {
          if (all[i] != vbyte(i / block, static_cast<size_t>(root), i % block)) {
            ADD_FAILURE() << "gather of " << block << " bytes to rank " << root << ": [" << i << "] wrong";
            return;
          }
        }
        // scatter: block q of the root's send to rank q; the others pass no send.
        std::vector<char> blocks(rank == root ? block * ranks : 0), got(block, 'x');
        for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = vbyte(static_cast<size_t>(root), i / block, i % block);
        group.scatter(rank == root ? blocks.data() : nullptr, got.data(), block, root, kTimeout);
        for (size_t i = 0; i < block; ++i) {
          if (got[i] != vbyte(static_cast<size_t>(root), me, i)) {
            ADD_FAILURE() << "scatter of " << block << " bytes from rank " << root << ": rank " << rank << " [" << i << "] wrong";
            return;
          }
        }
      });
    }
  }
}

// Uneven blocks (empty ones among them) around the slot, single-copy and streaming sizes: rank q sends
// rank r sizes[(q + 2 r + k) % n] bytes in round k, so that every rank's largest block differs.
TEST_P(ShmGroupRanks, AllgathervAndAlltoallvWithUnevenBlocks) {
  const int size = this->size();
  const auto ranks = static_cast<size_t>(size);
  Segment segment(size);
  auto groups = this->groups(segment);
  const size_t slot = ShmGroup::kSlotBytes, single = ShmGroup::kSingleCopyMinBytes / ranks;
  const std::vector<size_t> sizes = {0, 1, 3000, slot - 1, slot + 5, 3 * slot + 17, single + 3, ShmGroup::kSingleCopyMaxBytes / ranks + 1};
  for (size_t round = 0; round < sizes.size(); ++round) {
    auto bytes_of = [&](size_t from, size_t to) { return sizes[(from + 2 * to + round) % sizes.size()]; };
    run_threads(groups, [&](int rank, ShmGroup& group) {
      const auto me = static_cast<size_t>(rank);
      // allgatherv: this rank's block is bytes_of(me, me); blocks in recv in reverse rank order, a gap
      // of 5 bytes between them (checked untouched).
      backplane::plugin::Counts bytes(ranks), offsets(ranks);
      size_t at = 0;
      for (size_t q = ranks; q-- > 0;) {
        bytes[q] = bytes_of(q, q);
        offsets[q] = at;
        at += bytes[q] + 5;
      }
      std::vector<char> send(bytes[me]), recv(at, 'x');
      for (size_t i = 0; i < send.size(); ++i) send[i] = vbyte(me, me, i);
      const int64_t share = backplane::pairing_share(rank, size, [&](int) { return bytes[me]; },
                                                     [&](int q) { return bytes[static_cast<size_t>(q)]; });
      group.allgatherv(send.data(), send.size(), recv.data(), bytes, offsets, share, kTimeout);
      for (size_t q = 0; q < ranks; ++q) {
        for (size_t i = 0; i < bytes[q] + 5 && offsets[q] + i < recv.size(); ++i) {
          const char expected = i < bytes[q] ? vbyte(q, q, i) : 'x';
          if (recv[offsets[q] + i] != expected) {
            ADD_FAILURE() << "allgatherv, round " << round << ": rank " << rank << ", block " << q << " of " << bytes[q]
                          << " bytes, [" << i << "] wrong";
            return;
          }
        }
      }
      // alltoallv: blocks in send in rank order, in recv in reverse order.
      backplane::plugin::Counts send_bytes(ranks), send_offsets(ranks), recv_bytes(ranks), recv_offsets(ranks);
      size_t sent = 0, received = 0;
      for (size_t q = 0; q < ranks; ++q) {
        send_bytes[q] = bytes_of(me, q);
        send_offsets[q] = sent;
        sent += send_bytes[q];
      }
      for (size_t q = ranks; q-- > 0;) {
        recv_bytes[q] = bytes_of(q, me);
        recv_offsets[q] = received;
        received += recv_bytes[q] + 5;
      }
      std::vector<char> out(sent), in(received, 'x');
      for (size_t q = 0; q < ranks; ++q) {
        for (size_t i = 0; i < send_bytes[q]; ++i) out[send_offsets[q] + i] = vbyte(me, q, i);
      }
      const int64_t pairing = backplane::pairing_share(rank, size, [&](int q) { return send_bytes[static_cast<size_t>(q)]; },
                                                       [&](int q) { return recv_bytes[static_cast<size_t>(q)]; });
      group.alltoallv(out.data(), send_bytes, send_offsets, in.data(), recv_bytes, recv_offsets, pairing, kTimeout);
      for (size_t q = 0; q < ranks; ++q) {
        for (size_t i = 0; i < recv_bytes[q] + 5 && recv_offsets[q] + i < in.size(); ++i) {
          const char expected = i < recv_bytes[q] ? vbyte(q, me, i) : 'x';
          if (in[recv_offsets[q] + i] != expected) {
            ADD_FAILURE() << "alltoallv, round " << round << ": rank " << rank << ", from rank " << q << " ("
                          << recv_bytes[q] << " bytes), [" << i << "] wrong";
            return;
          }
        }
      }
    });
  }
}

// Counts that do not pair up (rank 1 expects one byte more from rank 0 than rank 0 sends it) are
// MISMATCH on every rank before any data moves, at a staged and a single-copy size.
TEST_P(ShmGroupRanks, VariableSizeCountsThatDoNotPairUpAreAMismatchOnEveryRank) {
  const int size = this->size();
  const auto ranks = static_cast<size_t>(size);
  Segment segment(size);
  auto groups = this->groups(segment);
  for (size_t block : {size_t{100}, ShmGroup::kSingleCopyMinBytes}) {
    std::vector<std::string> errors(ranks * 2);
    run_threads(groups, [&](int rank, ShmGroup& group) {
      const auto me = static_cast<size_t>(rank);
      backplane::plugin::Counts sends(ranks, block), recvs(ranks, block), offsets(ranks);
      if (rank == 1) recvs[0] = block + 1;
      for (size_t q = 0; q < ranks; ++q) offsets[q] = q * (block + 1);
      std::vector<char> out(ranks * (block + 1), 'o'), in(ranks * (block + 1), 'x');
      const int64_t pairing = backplane::pairing_share(rank, size, [&](int q) { return sends[static_cast<size_t>(q)]; },
                                                       [&](int q) { return recvs[static_cast<size_t>(q)]; });
      try {
        group.alltoallv(out.data(), sends, offsets, in.data(), recvs, offsets, pairing, kTimeout);
      } catch (const Error& e) {
        errors[me] = e.status() == BPL_ERR_MISMATCH ? e.what() : "not a mismatch: " + std::string(e.what());
      }
      // allgatherv: rank 1 takes rank 0's block for one byte longer and its own for one shorter (the
      // same total: the counts, not the sizes, differ).
      if (rank == 1) recvs[1] = block - 1;
      try {
        group.allgatherv(out.data(), block, in.data(), recvs, offsets,
                         backplane::pairing_share(rank, size, [&](int) { return block; },
                                                  [&](int q) { return recvs[static_cast<size_t>(q)]; }),
                         kTimeout);
      } catch (const Error& e) {
        errors[ranks + me] = e.status() == BPL_ERR_MISMATCH ? e.what() : "not a mismatch: " + std::string(e.what());
      }
      EXPECT_TRUE(std::all_of(in.begin(), in.end(), [](char c) { return c == 'x'; })) << "rank " << rank << " received data";
    });
    for (size_t i = 0; i < errors.size(); ++i) {
      const std::string op = i < ranks ? "alltoallv" : "allgatherv";
      EXPECT_NE(errors[i].find("the counts of " + op + " do not pair up"), std::string::npos)
          << op << " of " << block << " bytes, rank " << i % ranks << ": " << errors[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShmGroupRanks, ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks" +
                                  (std::get<1>(info.param) ? "_single_copy" : "_staged");
                         });

}  // namespace
