// What every benchmark of collectives shares (bpl-bench-collectives, and bpl-bench-peer built once per
// peer library): a point (an operation, a dtype, a size) with its buffers and nccl-tests' shape, the raw
// libraries' call for each operation, how a point's repetitions are registered and timed on every rank,
// and the console that adds "backplane/raw" after each pair. One logic for every library measured.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "backplane/backplane.h"
#include "collectives_settings.h"
#include "rank_timing.h"
#include "raw_library.h"

namespace backplane::bench {

// The job as the benchmark sees it, whichever library started it.
struct BenchJob {
  int rank = 0;
  int size = 1;
  // Every rank's seconds for a repetition (an allgather of one double), through the job's library.
  std::function<void(double mine, double* every_rank)> share_times;
  std::unique_ptr<RawLibrary> raw;
};
extern BenchJob job;
extern const char* program_name;  // in fail()'s messages

[[noreturn]] void fail(const std::string& message);

// One buffer of zeros (repeated sums stay finite and normal), `offset` bytes past a page boundary.
class Buffer {
 public:
  Buffer(size_t bytes, size_t offset);
  unsigned char* data() { return data_; }

 private:
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char, Free> memory_;
  unsigned char* data_;
};

// Buffers for one (operation, dtype, size).
struct Buffers {
  Buffers(size_t send_bytes, size_t recv_bytes, size_t offset) : send(send_bytes, offset), recv(recv_bytes, offset) {}
  Buffer send, recv;
};

struct OpShape {
  double bus_factor;   // nccl-tests' busbw / algbw
  size_t count;        // elements per rank, as the call takes them
  size_t send_bytes, recv_bytes;
};

// A point of the sweep: "allreduce/f32/4096" (or "barrier"), what its calls take and how often they run.
struct Point {
  std::string op;
  bpl_dtype dtype;
  std::string name;
  int64_t bytes;
  bool sized;    // false for the barrier
  double moved;  // bytes one call moves for algbw: the nccl-tests size, both ways for the ping-pong
  OpShape shape;
  int64_t iterations;
  int64_t warm_up;  // untimed calls before each interleaved repetition
};

// The point, or nothing where the size is smaller than one element per rank.
std::optional<Point> make_point(const std::string& op, const std::string& dtype_name, int64_t bytes,
                                const Settings& settings);

// The point's call through the raw library; raw_has says whether it has one (an operation without one,
// a kind new to the ABI before its raw baseline is written, is measured through backplane alone).
bool raw_has(const std::string& op);
void run_raw(RawLibrary& raw, const Point& point, Buffers& buffers);

// How many times a point's benchmarks are registered: once, or once per repetition when interleaved.
int registrations(const Settings& settings);
// Google Benchmark's settings shared by every benchmark of a point.
void configure(benchmark::internal::Benchmark* b, int64_t iterations, const Settings& settings);
// Sets the point's counters: bytes, algbw and busbw (bytes per second, shown as G/s).
void set_counters(benchmark::State& state, const Point& point);

// Registers one repetition of the point through one implementation, "<point>/<implementation>": the
// ranks first meet (`meet`: one that left the previous benchmark early would time its wait for the
// others); interleaved, a quarter of the iterations then run untimed, as many on every rank (the other
// implementation ran in between: its caches, and this one's waits gone to sleep, would be timed); then
// the timed calls of `once`, on every rank.
template <typename Meet, typename Once>
void register_timed(const Point& point, const std::string& implementation, const Settings& settings, Meet meet,
                    Once once) {
  benchmark::internal::Benchmark* b = benchmark::RegisterBenchmark(
      (point.name + "/" + implementation).c_str(), [=](benchmark::State& state) {
        Buffers buffers(point.shape.send_bytes, point.shape.recv_bytes, static_cast<size_t>(settings.buffer_offset));
        meet();
        for (int64_t i = 0; i < point.warm_up; ++i) once(buffers);
        time_on_every_rank(state, job.size, [&] { once(buffers); }, job.share_times);
        set_counters(state, point);
      });
  configure(b, point.iterations, settings);
}

// The machine's reference ("copy/u8/<bytes>/memcpy"): a memcpy of `bytes` on every rank at once.
void register_copy(int64_t bytes, const Settings& settings);

// Registers every point that `settings` names, calling `each_point` for each; the copies are registered
// here. Pingpong is skipped (said by rank 0) for one rank.
void register_points(const Settings& settings, const std::function<void(const Point&)>& each_point);

// The context lines every run of collectives writes: the host (and the cores rank 0 may run on), the
// repetitions (alternating between `implementations` when interleaved), the buffers' offset.
void add_machine_context(const Settings& settings, const std::string& implementations);

// Runs the registered benchmarks: rank 0 shows them (with "backplane/raw" after each pair) and writes
// --benchmark_out; the other ranks run the same benchmarks silently.
void run_benchmarks(const Settings& settings);

// Google Benchmark's flags for this rank: only rank 0 keeps --benchmark_out (another rank opening the
// same file would truncate it under rank 0); --benchmark_enable_random_interleaving is refused (each
// rank would shuffle differently and the ranks would run different collectives).
void keep_benchmark_flags_for_rank(int rank, int& argc, char** argv);

}  // namespace backplane::bench
