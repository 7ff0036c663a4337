// What the shared-memory path's tests share: a segment of groups whose ranks are threads of this
// process, and the values and sizes the collectives are checked at.
#pragma once

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

namespace backplane::gloo_plugin::shm_test {

using backplane::gloo_plugin::ShmGroup;
using backplane::plugin::Error;
using std::chrono::milliseconds;

constexpr milliseconds kTimeout{20000};

inline std::string unique_segment_name() {
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
inline void run_threads(std::vector<std::unique_ptr<ShmGroup>>& groups, const std::function<void(int, ShmGroup&)>& body) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < groups.size(); ++r) {
    threads.emplace_back([&, r] { body(static_cast<int>(r), *groups[r]); });
  }
  for (std::thread& t : threads) t.join();
}

// Rank r's i-th value: small integers, so that sums in f32 are exact whatever the order.
inline float value(int rank, size_t i) { return static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13) % 101) - 50); }

// Element counts around every boundary of the algorithms: the flat allreduce limit, one slot, several,
// where single copy starts and ends, and where a copy into the segment starts streaming.
inline std::vector<size_t> f32_counts() {
  const size_t flat = ShmGroup::kFlatAllreduceBytes / 4, slot = ShmGroup::kSlotBytes / 4;
  const size_t single_min = ShmGroup::kSingleCopyMinBytes / 4, single_max = ShmGroup::kSingleCopyMaxBytes / 4;
  return {1, 3, 511, 512, 513, flat - 1, flat, flat + 1, slot - 1, slot, slot + 1, 3 * slot + 17, single_min - 1,
          single_min, single_min + 3, single_max / 2, single_max, single_max + 1};
}

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

// Ranks, and whether single copy is on.
class ShmGroupRanks : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  int size() const { return std::get<0>(GetParam()); }
  std::vector<std::unique_ptr<ShmGroup>> groups(Segment& segment) { return segment.groups(std::get<1>(GetParam())); }
};


}  // namespace backplane::gloo_plugin::shm_test
