// bpl-bench-collectives' settings: what its flags choose (sizes, dtypes, operations, repetitions, how
// backplane's calls are made), parsed from the command line with CLI11.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace backplane::bench {

// The operations measured, derived from the ABI's list of kinds: every collective, then "pingpong" (what
// send and recv cost: the point-to-point kinds) and "copy" (the machine's reference). A split moves no
// data. A kind added to the list without a runner in bpl_bench_collectives.cpp fails the benchmark's
// test by name.
std::vector<std::string> all_operations();

struct Settings {
  int64_t min_bytes = 4;
  int64_t max_bytes = int64_t{64} << 20;
  int64_t step_factor = 4;
  std::vector<std::string> dtypes = {"f32", "bf16"};
  std::vector<std::string> ops = all_operations();
  int repetitions = 5;
  int64_t max_iterations = 1000;
  // Where every buffer starts, in bytes past a page boundary. Page-aligned by default (as OSU's
  // benchmarks allocate); copies can be much slower at some offsets (16: a large malloc's), so the
  // flag shows a backend's sensitivity to it.
  int64_t buffer_offset = 0;
  bool raw = true;
  // Every operation posted with a request and waited for (bpl_request_wait), against the raw library's
  // non-blocking call and MPI_Wait where it has one.
  bool async = false;
  // Repetitions alternating between the two implementations of each point (see the flags above).
  bool interleave = false;
};

// A flag or value the command line should not have given: prints why and exits with status 2, as for an
// unknown flag.
[[noreturn]] void refuse(const std::string& message);

// Takes this program's flags out of argv, leaving Google Benchmark's (--benchmark_*) for it; --help and
// --list-operations print and exit.
Settings parse_settings(int& argc, char** argv);

}  // namespace backplane::bench
