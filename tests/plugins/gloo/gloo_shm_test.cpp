// The Gloo plugin's shared-memory path on its own (plugins/gloo/shm_group.h), without a rendezvous:
// ranks are threads that each map the segment themselves, or forked processes where a peer's end is
// what is tested. The plugin-level suites (conformance, fault_test) run the same code through bpl_*.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "fingerprint.h"
#include "plugin_support.h"
#include "shm_group.h"

namespace {

using backplane::gloo_plugin::ShmGroup;
using backplane::plugin::Error;
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
  // With `single_copy`, the groups read each other's buffers above the sizes where that pays (the
  // ranks are threads of this process, which process_vm_readv reads like any other).
  std::vector<std::unique_ptr<ShmGroup>> groups(bool single_copy = false) {
    std::vector<std::unique_ptr<ShmGroup>> all;
    all.push_back(ShmGroup::create(name_, size_));
    for (int r = 1; r < size_; ++r) all.push_back(ShmGroup::open(name_, r, size_));
    for (auto& group : all) group->set_peers(std::vector<pid_t>(static_cast<size_t>(size_), ::getpid()));
    std::vector<std::thread> threads;
    std::vector<std::string> refusals(all.size());
    for (size_t r = 0; r < all.size(); ++r) {
      threads.emplace_back([&, r] { refusals[r] = all[r]->enable_single_copy(single_copy, kTimeout); });
    }
    for (std::thread& t : threads) t.join();
    for (size_t r = 0; r < all.size(); ++r) {
      EXPECT_EQ(all[r]->single_copy(), single_copy) << "rank " << r << ": " << refusals[r];
    }
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

// Element counts around every boundary of the algorithms: the flat allreduce limit, one slot, several,
// where single copy starts and ends, and where a copy into the segment starts streaming.
std::vector<size_t> f32_counts() {
  const size_t flat = ShmGroup::kFlatAllreduceBytes / 4, slot = ShmGroup::kSlotBytes / 4;
  const size_t single_min = ShmGroup::kSingleCopyMinBytes / 4, single_max = ShmGroup::kSingleCopyMaxBytes / 4;
  return {1, 3, 511, 512, 513, flat - 1, flat, flat + 1, slot - 1, slot, slot + 1, 3 * slot + 17, single_min - 1,
          single_min, single_min + 3, single_max / 2, single_max, single_max + 1};
}

// Ranks, and whether single copy is on.
class ShmGroupRanks : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  int size() const { return std::get<0>(GetParam()); }
  std::vector<std::unique_ptr<ShmGroup>> groups(Segment& segment) { return segment.groups(std::get<1>(GetParam())); }
};

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

// Point to point through the mailboxes (single copy): rank 0 sends, rank 1 receives.
TEST(ShmGroupPointToPoint, TagsMatchOutOfOrderAndTheSameTagInPostingOrder) {
  Segment segment(2);
  auto groups = segment.groups(true);
  run_threads(groups, [&](int rank, ShmGroup& group) {
    std::vector<int> one(1000, 1), two(3, 2), three(5, 3), four(5, 4);
    if (rank == 0) {
      // tag 7: one, then three and four under tag 9 (in that order), then two under tag 8.
      auto a = group.post_send(one.data(), one.size() * 4, 1, 7, kTimeout);
      auto b = group.post_send(three.data(), three.size() * 4, 1, 9, kTimeout);
      auto c = group.post_send(four.data(), four.size() * 4, 1, 9, kTimeout);
      auto d = group.post_send(two.data(), two.size() * 4, 1, 8, kTimeout);
      for (const auto& ticket : {d, c, b, a}) group.wait_sent(ticket, kTimeout);
    } else {
      std::vector<int> got_two(3), got_first9(5), got_second9(5), got_one(1000);
      auto r8 = group.post_recv(got_two.data(), 12, 0, 8);
      auto r9a = group.post_recv(got_first9.data(), 20, 0, 9);
      auto r9b = group.post_recv(got_second9.data(), 20, 0, 9);
      group.wait_received(r9b, kTimeout);  // waited in reverse: still the second send of tag 9
      group.wait_received(r9a, kTimeout);
      group.wait_received(r8, kTimeout);
      group.wait_received(group.post_recv(got_one.data(), 4000, 0, 7), kTimeout);
      EXPECT_EQ(got_two, two);
      EXPECT_EQ(got_first9, three);
      EXPECT_EQ(got_second9, four);
      EXPECT_EQ(got_one, one);
    }
  });
}

TEST(ShmGroupPointToPoint, ManyMoreSendsThanMailboxSlotsArriveInOrder) {
  Segment segment(2);
  auto groups = segment.groups(true);
  const int messages = 3 * static_cast<int>(ShmGroup::kMailboxSlots) + 5;
  run_threads(groups, [&](int rank, ShmGroup& group) {
    if (rank == 0) {
      // Posted ahead of the receiver: once the mailbox is full, a send waits for room.
      std::vector<std::vector<int64_t>> payloads(static_cast<size_t>(messages));
      std::vector<ShmGroup::SendTicket> tickets;
      for (int m = 0; m < messages; ++m) {
        // 0 to 1920 bytes: sends inside the announcement and sends read from the sender's buffer, mixed.
        payloads[static_cast<size_t>(m)].assign(static_cast<size_t>(m % 7) * 40, m);
        tickets.push_back(group.post_send(payloads[static_cast<size_t>(m)].data(), payloads[static_cast<size_t>(m)].size() * 8, 1,
                                          0, kTimeout));
      }
      for (const auto& ticket : tickets) group.wait_sent(ticket, kTimeout);
    } else {
      for (int m = 0; m < messages; ++m) {
        std::vector<int64_t> got(static_cast<size_t>(m % 7) * 40, -1);
        group.wait_received(group.post_recv(got.data(), got.size() * 8, 0, 0), kTimeout);
        if (got != std::vector<int64_t>(static_cast<size_t>(m % 7) * 40, m)) {
          ADD_FAILURE() << "message " << m << " wrong";
          return;
        }
      }
    }
  });
}

TEST(ShmGroupPointToPoint, ASmallSendIsDoneBeforeItsRecvIsPosted) {
  Segment segment(2);
  auto groups = segment.groups(true);
  char small[ShmGroup::kInlineSendBytes];
  for (size_t i = 0; i < sizeof(small); ++i) small[i] = static_cast<char>(i + 1);
  const Outcome sent = outcome_of([&] { groups[0]->wait_sent(groups[0]->post_send(small, sizeof(small), 1, 4, kTimeout), kTimeout); });
  EXPECT_EQ(sent.status, BPL_OK) << sent.message;
  EXPECT_LT(sent.seconds, 0.1) << "the bytes travel in the announcement: nothing to wait for";
  std::memset(small, 0, sizeof(small));  // the sender's buffer is its own again
  char got[ShmGroup::kInlineSendBytes] = {};
  groups[1]->wait_received(groups[1]->post_recv(got, sizeof(got), 0, 4), kTimeout);
  for (size_t i = 0; i < sizeof(got); ++i) ASSERT_EQ(got[i], static_cast<char>(i + 1)) << i;
}

TEST(ShmGroupPointToPoint, DifferentSizesAreAMismatchOnBothSides) {
  // Both sizes above the inline limit, so that the sender waits for the recv and learns its size.
  Segment segment(2);
  auto groups = segment.groups(true);
  const size_t sent_bytes = ShmGroup::kInlineSendBytes + 100, recv_bytes = ShmGroup::kInlineSendBytes + 60;
  std::vector<Outcome> outcomes(2);
  run_threads(groups, [&](int rank, ShmGroup& group) {
    std::vector<char> data(rank == 0 ? sent_bytes : recv_bytes);
    outcomes[static_cast<size_t>(rank)] = outcome_of([&] {
      if (rank == 0) {
        group.wait_sent(group.post_send(data.data(), sent_bytes, 1, 3, kTimeout), kTimeout);
      } else {
        group.wait_received(group.post_recv(data.data(), recv_bytes, 0, 3), kTimeout);
      }
    });
  });
  const std::string sent = std::to_string(sent_bytes), received = std::to_string(recv_bytes);
  EXPECT_EQ(outcomes[0].status, BPL_ERR_MISMATCH);
  EXPECT_EQ(outcomes[0].message, "send of " + sent + " bytes to rank 1 (tag 3) met a recv of " + received + " bytes");
  EXPECT_EQ(outcomes[1].status, BPL_ERR_MISMATCH);
  EXPECT_EQ(outcomes[1].message, "recv of " + received + " bytes from rank 0 (tag 3) met a send of " + sent + " bytes");
}

TEST(ShmGroupPointToPoint, AnUnmatchedRecvTimesOutAndLeavesItsBufferAlone) {
  Segment segment(2);
  auto groups = segment.groups(true);
  int buffer = 5;
  const Outcome waited = outcome_of([&] { groups[1]->wait_received(groups[1]->post_recv(&buffer, 4, 0, 1), milliseconds(300)); });
  EXPECT_EQ(waited.status, BPL_ERR_TIMEOUT) << waited.message;
  EXPECT_NE(waited.message.find("recv from rank 0 (tag 1): no matching send in time"), std::string::npos) << waited.message;
  EXPECT_GE(waited.seconds, 0.29);
  // The group has failed: a send that comes now fails at once, and nothing is written to the buffer.
  int late = 9;
  const Outcome sent = outcome_of([&] { groups[0]->post_send(&late, 4, 1, 1, kTimeout); });
  EXPECT_EQ(sent.status, BPL_ERR_TIMEOUT) << sent.message;
  EXPECT_EQ(buffer, 5);
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
