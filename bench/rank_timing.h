// Every repetition timed on every rank, as OSU's micro-benchmarks report a point (min, avg, max over the
// ranks): each rank times its own run of the calls, the ranks then share their times (after the timed
// calls), and the repetition counts at the slowest rank's time per call. A rank that finishes early (a
// broadcast's root, a pingpong's idle ranks) would otherwise hide a slow one.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace backplane::bench {

// Runs the benchmark's iterations of `once` on this rank, timed, and reports them (as manual time: the
// benchmark is registered with UseManualTime) at the slowest rank's time per call; the counters say the
// fastest rank's time per call (fastest_rank_us) and the slowest's over it (rank_spread).
// `share(mine, all)` gathers every rank's seconds into all[0..ranks) (an allgather of one double).
template <typename Once, typename Share>
void time_on_every_rank(benchmark::State& state, int ranks, Once&& once, Share&& share) {
  const auto calls = static_cast<double>(state.max_iterations);
  std::vector<double> seconds(static_cast<size_t>(ranks), 0.0);
  bool ran = false;
  for (auto _ : state) {
    if (!ran) {  // every call runs in the first iteration; the others only report
      const auto start = std::chrono::steady_clock::now();
      for (benchmark::IterationCount i = 0; i < state.max_iterations; ++i) once();
      const double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      share(mine, seconds.data());
      ran = true;
    }
    state.SetIterationTime(*std::max_element(seconds.begin(), seconds.end()) / calls);
  }
  const auto [fastest, slowest] = std::minmax_element(seconds.begin(), seconds.end());
  state.counters["fastest_rank_us"] = 1e6 * *fastest / calls;
  state.counters["rank_spread"] = *fastest > 0 ? *slowest / *fastest : 0.0;
}

}  // namespace backplane::bench
