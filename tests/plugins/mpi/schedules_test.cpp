// The MPI plugin's own schedules (plugins/mpi/schedules.h) on 1 to 9 ranks, without MPI: a small
// simulation delivers each round's messages as MPI would (in order per pair of ranks, a receive
// completing once its peer posted the matching send, a round's local work once all its receives
// completed), and checks every collective's result, every message's size, and that no schedule
// deadlocks. The conformance suite runs them through real MPI on 2 and 3 ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "schedules.h"

namespace {

using backplane::mpi_plugin::Blocks;
using backplane::mpi_plugin::Fold;
using backplane::mpi_plugin::Schedule;
using backplane::mpi_plugin::Transfer;

// The schedule `make(schedule, args...)` appends to an empty one.
template <typename Make, typename... Args>
Schedule plan(Make make, Args&&... args) {
  Schedule schedule;
  make(schedule, std::forward<Args>(args)...);
  return schedule;
}

void sum_floats(void* out, const void* a, const void* b, size_t n) {
  const auto* x = static_cast<const float*>(a);
  const auto* y = static_cast<const float*>(b);
  auto* z = static_cast<float*>(out);
  for (size_t i = 0; i < n; ++i) z[i] = x[i] + y[i];
}

// Runs every rank's rounds as far as they go: a rank posts a round's sends at once (their bytes copied
// as MPI's eager sends would be), and moves on once every receive of the round found the next message
// from its peer. Fails the test on a message of the wrong size and, unless told that some must stall,
// on a deadlock. Returns how many rounds each rank completed.
std::vector<size_t> run(std::vector<Schedule>& schedule, bool all_complete = true) {
  const size_t ranks = schedule.size();
  std::map<std::pair<int, int>, std::deque<std::vector<char>>> in_flight;  // (from, to): messages in order
  std::vector<size_t> round(ranks, 0);
  std::vector<bool> posted(ranks, false);
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t r = 0; r < ranks; ++r) {
      if (round[r] == schedule[r].rounds()) continue;
      const Schedule& mine = schedule[r];
      const size_t current = round[r];
      if (!posted[r]) {
        for (const Transfer* t = mine.begin(current); t != mine.end(current); ++t) {
          const auto* bytes = static_cast<const char*>(t->buffer);
          if (t->is_send) in_flight[{static_cast<int>(r), t->peer}].emplace_back(bytes, bytes + t->bytes);
        }
        posted[r] = true;
        moved = true;
      }
      // Each receive of the round takes the next message from its peer, in the round's order.
      std::map<int, size_t> taken;
      bool ready = true;
      for (const Transfer* t = mine.begin(current); t != mine.end(current); ++t) {
        if (t->is_send) continue;
        auto& queue = in_flight[{t->peer, static_cast<int>(r)}];
        if (queue.size() <= taken[t->peer]++) ready = false;
      }
      if (!ready) continue;
      for (const Transfer* t = mine.begin(current); t != mine.end(current); ++t) {
        if (t->is_send) continue;
        auto& queue = in_flight[{t->peer, static_cast<int>(r)}];
        const std::vector<char> message = std::move(queue.front());
        queue.pop_front();
        EXPECT_EQ(message.size(), t->bytes) << "rank " << r << " round " << current << ": from rank " << t->peer;
        if (message.size() != t->bytes) return round;
        if (t->bytes > 0) std::memcpy(t->buffer, message.data(), t->bytes);
      }
      const Fold& then = mine.then(current);
      if (then.count > 0) sum_floats(then.into, then.first_operand(), then.from, then.count);
      ++round[r];
      posted[r] = false;
      moved = true;
    }
  }
  if (!all_complete) return round;
  for (size_t r = 0; r < ranks; ++r) {
    EXPECT_EQ(round[r], schedule[r].rounds()) << "rank " << r << " is stuck in round " << round[r] << " (deadlock)";
  }
  for (const auto& [pair, queue] : in_flight) {
    EXPECT_TRUE(queue.empty()) << queue.size() << " messages from rank " << pair.first << " to " << pair.second
                               << " were never received";
  }
  return round;
}

// Rank r's i-th value: distinct small integers (sums in f32 stay exact).
float value(size_t rank, size_t i) { return static_cast<float>((rank * 131 + i * 7) % 1000); }

class Schedules : public ::testing::TestWithParam<int> {};

// Pieces of one float, of three, and the plugin's own (no piece at these sizes): a reduction's scratch
// takes what it receives piece by piece (schedules.h, kFoldPieceBytes).
const size_t kPieceBytes[] = {4, 12, backplane::mpi_plugin::kFoldPieceBytes};

TEST_P(Schedules, AllreduceBothFormsSumEveryRanksData) {
  const int size = GetParam();
  for (bool ring : {false, true}) {
    // The ring also from a separate input, which it reads where it lies and leaves as it was.
    for (bool in_place : {true, false}) {
      if (!in_place && (!ring || size == 1)) continue;  // one rank: the plugin calls MPI
      for (size_t piece : kPieceBytes) {
        for (size_t count : {size_t{1}, size_t{7}, size_t{64}}) {
          if (ring && count < static_cast<size_t>(size)) continue;
          const auto ranks = static_cast<size_t>(size);
          std::vector<std::vector<float>> input(ranks), data(ranks, std::vector<float>(count, -7)), scratch(ranks);
          std::vector<Schedule> schedule;
          for (size_t r = 0; r < ranks; ++r) {
            for (size_t i = 0; i < count; ++i) input[r].push_back(value(r, i));
            if (in_place) data[r] = input[r];
            // Exactly the bytes it asks for: the sanitizer build sees a round that writes past them.
            scratch[r].resize(backplane::mpi_plugin::allreduce_scratch_bytes(count, 4, size, ring, piece) / 4);
            const float* values = in_place ? data[r].data() : input[r].data();
            schedule.push_back(plan(backplane::mpi_plugin::allreduce_rounds, reinterpret_cast<const char*>(values),
                                    reinterpret_cast<char*>(data[r].data()), reinterpret_cast<char*>(scratch[r].data()),
                                    count, 4, static_cast<int>(r), size, ring, piece));
          }
          const std::vector<std::vector<float>> untouched = input;
          run(schedule);
          for (size_t r = 0; r < ranks; ++r) {
            for (size_t i = 0; i < count; ++i) {
              float expected = 0;
              for (size_t q = 0; q < ranks; ++q) expected += value(q, i);
              ASSERT_EQ(data[r][i], expected) << (ring ? "ring" : "recursive doubling") << (in_place ? "" : " from an input")
                                              << ", pieces of " << piece << " bytes, rank " << r << " [" << i << "]";
            }
          }
          EXPECT_EQ(input, untouched) << "an input is only read";
        }
      }
    }
  }
}

// One rank runs MPI's own call (the plugin schedules only from two).
TEST_P(Schedules, ReduceScatterLeavesEachRankItsBlockSummedAndReadsTheInputInPlace) {
  const int size = GetParam();
  if (size < 2) return;
  const auto ranks = static_cast<size_t>(size);
  for (size_t piece : kPieceBytes) {
    for (size_t block : {size_t{1}, size_t{5}}) {
      for (bool in_place : {false, true}) {
        std::vector<std::vector<float>> send(ranks), recv(ranks, std::vector<float>(block)), scratch(ranks);
        for (size_t r = 0; r < ranks; ++r) {
          for (size_t i = 0; i < ranks * block; ++i) send[r].push_back(value(r, i));
        }
        const std::vector<std::vector<float>> input = send;
        std::vector<Schedule> schedule;
        for (size_t r = 0; r < ranks; ++r) {
          scratch[r].resize(backplane::mpi_plugin::reduce_scatter_scratch_bytes(block, 4, size, piece) / 4);
          float* out = in_place ? send[r].data() + r * block : recv[r].data();
          schedule.push_back(plan(backplane::mpi_plugin::reduce_scatter_rounds, reinterpret_cast<const char*>(send[r].data()),
                                  reinterpret_cast<char*>(out), reinterpret_cast<char*>(scratch[r].data()), block, 4,
                                  static_cast<int>(r), size, piece));
        }
        run(schedule);
        for (size_t r = 0; r < ranks; ++r) {
          const float* out = in_place ? send[r].data() + r * block : recv[r].data();
          for (size_t i = 0; i < block; ++i) {
            float expected = 0;
            for (size_t q = 0; q < ranks; ++q) expected += value(q, r * block + i);
            ASSERT_EQ(out[i], expected) << (in_place ? "in place, " : "") << "pieces of " << piece << " bytes, rank " << r
                                        << " [" << i << "]";
          }
          // Only the rank's own block of the input may change (in place: it holds the result).
          for (size_t i = 0; i < ranks * block; ++i) {
            if (in_place && i / block == r) continue;
            ASSERT_EQ(send[r][i], input[r][i]) << "rank " << r << "'s input [" << i << "]";
          }
        }
      }
    }
  }
}

TEST_P(Schedules, ReduceToEveryRootSumsEveryRanksDataThere) {
  const int size = GetParam();
  if (size < 2) return;
  const auto ranks = static_cast<size_t>(size);
  // Empty too: its buffers may be NULL, and its ranks must still meet (a message of no bytes; run
  // fails on a rank left waiting).
  for (const size_t count : {size_t{0}, size_t{7}}) {
    for (size_t piece : kPieceBytes) {
      for (int root = 0; root < size; ++root) {
        std::vector<std::vector<float>> send(ranks), work(ranks, std::vector<float>(count)), scratch(ranks);
        std::vector<float> result(count, -1);
        for (size_t r = 0; r < ranks; ++r) {
          for (size_t i = 0; i < count; ++i) send[r].push_back(value(r, i));
          scratch[r].resize(backplane::mpi_plugin::reduce_scratch_bytes(count, 4, piece) / 4);
        }
        const std::vector<std::vector<float>> input = send;
        std::vector<Schedule> schedule;
        for (size_t r = 0; r < ranks; ++r) {
          schedule.push_back(plan(backplane::mpi_plugin::reduce_rounds, reinterpret_cast<const char*>(send[r].data()),
                                  reinterpret_cast<char*>(result.data()), reinterpret_cast<char*>(work[r].data()),
                                  reinterpret_cast<char*>(scratch[r].data()), count, 4, root, static_cast<int>(r), size,
                                  piece));
        }
        run(schedule);
        for (size_t i = 0; i < count; ++i) {
          float expected = 0;
          for (size_t q = 0; q < ranks; ++q) expected += value(q, i);
          ASSERT_EQ(result[i], expected) << "root " << root << ", pieces of " << piece << " bytes [" << i << "]";
        }
        EXPECT_EQ(send, input) << "the inputs stay as they were (root " << root << ")";
      }
    }
  }
}

TEST_P(Schedules, AllgatherOfUnevenBlocksFillsEveryRanksBuffer) {
  const int size = GetParam();
  const auto ranks = static_cast<size_t>(size);
  backplane::plugin::Counts offsets, bytes;
  size_t total = 0;
  for (size_t q = 0; q < ranks; ++q) {
    offsets.push_back(total);
    bytes.push_back((q * 5) % 3 * 8);  // some empty
    total += bytes.back();
  }
  const Blocks blocks(offsets, bytes);
  // Each rank's block in its own send buffer, copied into its data as the plugin does.
  std::vector<std::vector<char>> data(ranks, std::vector<char>(total, 0)), own(ranks);
  std::vector<Schedule> schedule;
  for (size_t r = 0; r < ranks; ++r) {
    for (size_t i = 0; i < bytes[r]; ++i) own[r].push_back(static_cast<char>(value(r, i)));
    std::copy(own[r].begin(), own[r].end(), data[r].begin() + static_cast<std::ptrdiff_t>(offsets[r]));
    schedule.push_back(plan(backplane::mpi_plugin::allgather_rounds, data[r].data(), own[r].data(), blocks, static_cast<int>(r), size));
  }
  run(schedule);
  for (size_t r = 0; r < ranks; ++r) {
    for (size_t q = 0; q < ranks; ++q) {
      for (size_t i = 0; i < bytes[q]; ++i) {
        ASSERT_EQ(data[r][offsets[q] + i], static_cast<char>(value(q, i))) << "rank " << r << ", block " << q;
      }
    }
  }
}

TEST_P(Schedules, AlltoallGatherAndScatterDeliverEachBlockToItsRank) {
  const int size = GetParam();
  const auto ranks = static_cast<size_t>(size);
  const size_t block = 6;
  const Blocks blocks = Blocks::equal(block);
  auto byte = [](size_t from, size_t to, size_t i) { return static_cast<char>(from * 31 + to * 7 + i); };
  // alltoall: rank r's block q goes to rank q's block r; each rank copies its own block itself.
  std::vector<std::vector<char>> send(ranks, std::vector<char>(ranks * block)), recv = send;
  std::vector<Schedule> schedule;
  for (size_t r = 0; r < ranks; ++r) {
    for (size_t i = 0; i < send[r].size(); ++i) send[r][i] = byte(r, i / block, i % block);
    std::memcpy(recv[r].data() + r * block, send[r].data() + r * block, block);
    schedule.push_back(plan(backplane::mpi_plugin::alltoall_rounds, send[r].data(), blocks, recv[r].data(), blocks,
                                                              static_cast<int>(r), size));
  }
  run(schedule);
  for (size_t r = 0; r < ranks; ++r) {
    for (size_t i = 0; i < recv[r].size(); ++i) ASSERT_EQ(recv[r][i], byte(i / block, r, i % block)) << "alltoall, rank " << r;
  }
  for (int root = 0; root < size; ++root) {
    const auto root_index = static_cast<size_t>(root);
    // gather: block q of the root's buffer from rank q.
    std::vector<std::vector<char>> mine(ranks, std::vector<char>(block)), gathered(ranks, std::vector<char>(ranks * block));
    schedule.clear();
    for (size_t r = 0; r < ranks; ++r) {
      for (size_t i = 0; i < block; ++i) mine[r][i] = byte(r, root_index, i);
      if (r == root_index) std::memcpy(gathered[r].data() + r * block, mine[r].data(), block);
      schedule.push_back(plan(backplane::mpi_plugin::gather_rounds, mine[r].data(), gathered[r].data(), blocks, root,
                                                              static_cast<int>(r), size));
    }
    run(schedule);
    for (size_t i = 0; i < ranks * block; ++i) {
      ASSERT_EQ(gathered[root_index][i], byte(i / block, root_index, i % block)) << "gather to rank " << root;
    }
    // scatter: block q of the root's buffer to rank q.
    std::vector<char> blocks_of_root(ranks * block);
    for (size_t i = 0; i < blocks_of_root.size(); ++i) blocks_of_root[i] = byte(root_index, i / block, i % block);
    std::vector<std::vector<char>> got(ranks, std::vector<char>(block));
    schedule.clear();
    for (size_t r = 0; r < ranks; ++r) {
      if (r == root_index) std::memcpy(got[r].data(), blocks_of_root.data() + r * block, block);
      schedule.push_back(plan(backplane::mpi_plugin::scatter_rounds, blocks_of_root.data(), got[r].data(), blocks, root,
                                                               static_cast<int>(r), size));
    }
    run(schedule);
    for (size_t r = 0; r < ranks; ++r) {
      for (size_t i = 0; i < block; ++i) ASSERT_EQ(got[r][i], byte(root_index, r, i)) << "scatter from rank " << root;
    }
  }
}

TEST_P(Schedules, BroadcastFromEveryRootReachesEveryRankOnce) {
  const int size = GetParam();
  for (int root = 0; root < size; ++root) {
    std::vector<std::vector<char>> data(static_cast<size_t>(size), std::vector<char>(9, 0));
    std::string("broadcast").copy(data[static_cast<size_t>(root)].data(), 9);
    std::vector<Schedule> schedule;
    size_t receives = 0;
    for (int r = 0; r < size; ++r) {
      schedule.push_back(plan(backplane::mpi_plugin::broadcast_rounds, data[static_cast<size_t>(r)].data(), 9, root, r, size));
      const Schedule& mine = schedule.back();
      for (size_t round = 0; round < mine.rounds(); ++round) {
        for (const Transfer* t = mine.begin(round); t != mine.end(round); ++t) receives += t->is_send ? 0 : 1;
      }
    }
    EXPECT_EQ(receives, static_cast<size_t>(size - 1)) << "every rank but the root receives once (root " << root << ")";
    run(schedule);
    for (const auto& d : data) ASSERT_EQ(std::string(d.data(), 9), "broadcast") << "root " << root;
  }
}

TEST_P(Schedules, BarrierCompletesOnlyOnceEveryRankArrived) {
  const int size = GetParam();
  std::vector<Schedule> schedule;
  for (int r = 0; r < size; ++r) schedule.push_back(plan(backplane::mpi_plugin::barrier_rounds, r, size));
  run(schedule);
  // Whichever rank never arrives, no other rank gets through the barrier.
  for (int absent = 0; absent < size && size > 1; ++absent) {
    std::vector<Schedule> without;
    for (int r = 0; r < size; ++r) without.push_back(r == absent ? Schedule{} : plan(backplane::mpi_plugin::barrier_rounds, r, size));
    const std::vector<size_t> done = run(without, /*all_complete=*/false);
    for (int r = 0; r < size; ++r) {
      if (r == absent) continue;
      EXPECT_LT(done[static_cast<size_t>(r)], without[static_cast<size_t>(r)].rounds())
          << "rank " << r << " passed the barrier without rank " << absent;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Schedules, ::testing::Range(1, 10),
                         [](const ::testing::TestParamInfo<int>& info) { return std::to_string(info.param) + "ranks"; });

}  // namespace
