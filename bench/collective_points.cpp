#include "collective_points.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <ostream>
#include <thread>
#include <vector>

namespace backplane::bench {

BenchJob job;
const char* program_name = "bpl-bench-collectives";

void fail(const std::string& message) {
  std::fprintf(stderr, "%s (rank %d): %s\n", program_name, job.rank, message.c_str());
  std::exit(1);
}

namespace {
constexpr size_t kPage = 4096;
}

Buffer::Buffer(size_t bytes, size_t offset)
    : memory_(static_cast<unsigned char*>(std::aligned_alloc(kPage, (bytes + offset + kPage - 1) / kPage * kPage))),
      data_(memory_.get() + offset) {
  if (!memory_) fail("cannot allocate " + std::to_string(bytes) + " bytes");
  std::memset(data_, 0, bytes);
}

namespace {

OpShape shape_of(const std::string& op, int64_t bytes, size_t element, int n) {
  const size_t elements = static_cast<size_t>(bytes) / element;
  const double ring = static_cast<double>(n - 1) / n;
  const size_t per_rank = elements / static_cast<size_t>(n);
  if (op == "allreduce") return {2 * ring, elements, elements * element, elements * element};
  if (op == "allgather" || op == "allgatherv") return {ring, per_rank, per_rank * element, per_rank * element * n};
  if (op == "gather") return {ring, per_rank, per_rank * element, per_rank * element * n};
  if (op == "scatter") return {ring, per_rank, per_rank * element * n, per_rank * element};
  if (op == "reduce_scatter") return {ring, per_rank, per_rank * element * n, per_rank * element};
  if (op == "alltoall" || op == "alltoallv") return {ring, per_rank, per_rank * element * n, per_rank * element * n};
  if (op == "broadcast") return {1.0, elements, 0, elements * element};
  if (op == "reduce") return {1.0, elements, elements * element, elements * element};
  return {1.0, static_cast<size_t>(bytes), static_cast<size_t>(bytes), static_cast<size_t>(bytes)};  // pingpong, barrier
}

// Enough iterations for a stable median without long runs: ~256 MiB moved per repetition, at least 5.
int64_t iterations_for(int64_t bytes, int64_t max_iterations) {
  return std::clamp<int64_t>((int64_t{256} << 20) / std::max<int64_t>(bytes, 1), std::min<int64_t>(5, max_iterations),
                             max_iterations);
}

using RawRunner = void (*)(RawLibrary&, Buffers&, const OpShape&, bpl_dtype);
const std::map<std::string, RawRunner>& raw_runners() {
  static const std::map<std::string, RawRunner> runners = {
      {"allreduce", [](RawLibrary& raw, Buffers& b, const OpShape& s, bpl_dtype t) {
         raw.allreduce(b.recv.data(), s.count, t);
       }},
      {"allgather", [](RawLibrary& raw, Buffers& b, const OpShape& s, bpl_dtype t) {
         raw.allgather(b.send.data(), b.recv.data(), s.count, t);
       }},
      {"reduce_scatter", [](RawLibrary& raw, Buffers& b, const OpShape& s, bpl_dtype t) {
         raw.reduce_scatter(b.send.data(), b.recv.data(), s.count, t);
       }},
      {"broadcast", [](RawLibrary& raw, Buffers& b, const OpShape& s, bpl_dtype t) {
         raw.broadcast(b.recv.data(), s.count, t, 0);
       }},
      {"reduce", [](RawLibrary& raw, Buffers& b, const OpShape& s, bpl_dtype t) {
         raw.reduce(b.send.data(), b.recv.data(), s.count, t, 0);
       }},
      {"alltoall", [](RawLibrary& raw, Buffers& b, const OpShape& s, bpl_dtype t) {
         raw.alltoall(b.send.data(), b.recv.data(), s.count, t);
       }},
      {"barrier", [](RawLibrary& raw, Buffers&, const OpShape&, bpl_dtype) {
         raw.barrier();
       }},
      {"gather", [](RawLibrary& raw, Buffers& b, const OpShape& s, bpl_dtype t) {
         raw.gather(b.send.data(), b.recv.data(), s.count, t, 0);
       }},
      {"scatter", [](RawLibrary& raw, Buffers& b, const OpShape& s, bpl_dtype t) {
         raw.scatter(b.send.data(), b.recv.data(), s.count, t, 0);
       }},
      {"allgatherv", [](RawLibrary& raw, Buffers& b, const OpShape& s, bpl_dtype t) {
         raw.allgatherv(b.send.data(), b.recv.data(), s.count, t);
       }},
      {"alltoallv", [](RawLibrary& raw, Buffers& b, const OpShape& s, bpl_dtype t) {
         raw.alltoallv(b.send.data(), b.recv.data(), s.count, t);
       }},
      {"pingpong",
       [](RawLibrary& raw, Buffers& b, const OpShape& s, bpl_dtype) {
         if (job.rank == 0) {
           raw.send(b.send.data(), s.send_bytes, 1);
           raw.recv(b.recv.data(), s.send_bytes, 1);
         } else if (job.rank == 1) {
           raw.recv(b.recv.data(), s.send_bytes, 0);
           raw.send(b.recv.data(), s.send_bytes, 0);
         }
       }},
  };
  return runners;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Google Benchmark's own display (its --benchmark_format and --benchmark_color: no colour off a
// terminal), plus "backplane/raw" after each raw median; interleaved (no aggregates), the ratio of the
// medians of each point's runs once its last raw run is in.
class RatioReporter : public benchmark::BenchmarkReporter {
 public:
  explicit RatioReporter(int interleaved_runs) : interleaved_runs_(interleaved_runs) {}

  bool ReportContext(const Context& context) override { return display_->ReportContext(context); }
  void Finalize() override { display_->Finalize(); }

  void ReportRuns(const std::vector<Run>& runs) override {
    display_->ReportRuns(runs);
    for (const Run& run : runs) {
      const bool one_run = interleaved_runs_ > 0 && run.aggregate_name.empty();
      if (run.aggregate_name != "median" && !one_run) continue;
      const std::string name = run.run_name.function_name;
      const size_t slash = name.rfind('/');
      const std::string key = name.substr(0, slash), impl = name.substr(slash + 1);
      if (impl != "backplane" && impl != "raw") continue;
      std::vector<double>& times = (impl == "backplane" ? backplane_ : raw_)[key];
      times.push_back(run.GetAdjustedRealTime());
      const size_t complete = one_run ? static_cast<size_t>(interleaved_runs_) : 1;
      if (impl == "raw" && times.size() == complete && backplane_[key].size() == complete) {
        display_->GetOutputStream() << "  " << key << ": backplane/raw = " << median(backplane_[key]) / median(times)
                                    << (one_run ? " (medians of " + std::to_string(complete) + " interleaved runs)" : "")
                                    << "\n";
      }
    }
  }

 private:
  // The library's own, made from its flags; it owns it (a static), so it is never deleted here.
  benchmark::BenchmarkReporter* display_ = benchmark::CreateDefaultDisplayReporter();
  int interleaved_runs_;  // runs per benchmark when interleaved, else 0
  std::map<std::string, std::vector<double>> backplane_, raw_;
};

class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

std::optional<Point> make_point(const std::string& op, const std::string& dtype_name, int64_t bytes,
                                const Settings& settings) {
  Point p;
  p.op = op;
  p.dtype = dtype_name == "bf16" ? BPL_DTYPE_BF16 : BPL_DTYPE_F32;
  p.bytes = bytes;
  p.sized = op != "barrier";
  p.shape = shape_of(op, bytes, bpl_dtype_size(p.dtype), job.size);
  if (p.sized && p.shape.count == 0) return std::nullopt;
  p.moved = op == "pingpong" ? 2.0 * static_cast<double>(bytes) : static_cast<double>(bytes);
  p.name = p.sized ? op + "/" + dtype_name + "/" + std::to_string(bytes) : op;
  p.iterations = p.sized ? iterations_for(bytes, settings.max_iterations) : settings.max_iterations;
  p.warm_up = settings.interleave ? std::max<int64_t>(1, p.iterations / 4) : 0;
  return p;
}

bool raw_has(const std::string& op) { return raw_runners().count(op) != 0; }

void run_raw(RawLibrary& raw, const Point& point, Buffers& buffers) {
  raw_runners().at(point.op)(raw, buffers, point.shape, point.dtype);
}

int registrations(const Settings& settings) { return settings.interleave ? settings.repetitions : 1; }

void configure(benchmark::internal::Benchmark* b, int64_t iterations, const Settings& settings) {
  b->Iterations(iterations)->Repetitions(settings.interleave ? 1 : settings.repetitions)->ReportAggregatesOnly(true)
      ->UseManualTime()->Unit(benchmark::kMicrosecond);
}

void set_counters(benchmark::State& state, const Point& point) {
  if (!point.sized) return;
  state.counters["bytes"] = static_cast<double>(point.bytes);
  state.counters["algbw"] = benchmark::Counter(point.moved, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["busbw"] =
      benchmark::Counter(point.moved * point.shape.bus_factor, benchmark::Counter::kIsIterationInvariantRate);
}

void register_copy(int64_t bytes, const Settings& settings) {
  for (int r = 0; r < registrations(settings); ++r) {
    benchmark::internal::Benchmark* b = benchmark::RegisterBenchmark(
        ("copy/u8/" + std::to_string(bytes) + "/memcpy").c_str(), [=](benchmark::State& state) {
          Buffers buffers(static_cast<size_t>(bytes), static_cast<size_t>(bytes), static_cast<size_t>(settings.buffer_offset));
          time_on_every_rank(state, job.size, [&] {
            std::memcpy(buffers.recv.data(), buffers.send.data(), static_cast<size_t>(bytes));
            benchmark::ClobberMemory();
          }, job.share_times);
          state.counters["bytes"] = static_cast<double>(bytes);
          for (const char* counter : {"algbw", "busbw"}) {  // bytes per second, shown as G/s
            state.counters[counter] = benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate);
          }
        });
    configure(b, iterations_for(bytes, settings.max_iterations), settings);
  }
}

void register_points(const Settings& settings, const std::function<void(const Point&)>& each_point) {
  auto each = [&](const std::string& op, const std::string& dtype, int64_t bytes) {
    if (std::optional<Point> point = make_point(op, dtype, bytes, settings)) each_point(*point);
  };
  for (const std::string& op : settings.ops) {
    if (op == "pingpong" && job.size < 2) {
      if (job.rank == 0) std::fprintf(stderr, "%s: one rank: pingpong is skipped\n", program_name);
      continue;
    }
    if (op == "barrier") {
      each(op, "f32", 0);
      continue;
    }
    if (op == "copy") {
      for (int64_t bytes = settings.min_bytes; bytes <= settings.max_bytes; bytes *= settings.step_factor) {
        register_copy(bytes, settings);
      }
      continue;
    }
    for (const std::string& dtype : settings.dtypes) {
      for (int64_t bytes = settings.min_bytes; bytes <= settings.max_bytes; bytes *= settings.step_factor) {
        each(op, dtype, bytes);
      }
    }
  }
}

void add_machine_context(const Settings& settings, const std::string& implementations) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  // Where the ranks may run: bound (mpirun's default, bpl-run --bind-to core) or not changes how they
  // meet a load.
  cpu_set_t cpus;
  const int allowed = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
  benchmark::AddCustomContext("host", std::string(host) + ", " + std::to_string(std::thread::hardware_concurrency()) +
                                          " hardware threads, rank 0 may run on " + std::to_string(allowed));
  benchmark::AddCustomContext("repetitions", std::to_string(settings.repetitions) +
                                                 (settings.interleave ? " per point, " + implementations + " alternating"
                                                                      : " per benchmark, in a row"));
  benchmark::AddCustomContext("buffer_offset", std::to_string(settings.buffer_offset) + " bytes past a page boundary");
}

void run_benchmarks(const Settings& settings) {
  if (job.rank == 0) {
    RatioReporter display(settings.interleave ? settings.repetitions : 0);
    benchmark::RunSpecifiedBenchmarks(&display);
  } else {
    NullReporter display;
    benchmark::RunSpecifiedBenchmarks(&display);
  }
  benchmark::Shutdown();
}

void keep_benchmark_flags_for_rank(int rank, int& argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--benchmark_enable_random_interleaving", 38) == 0) {
      refuse("--benchmark_enable_random_interleaving cannot be used: every rank must run the benchmarks in the same order");
    }
    if (rank == 0 || std::strncmp(argv[i], "--benchmark_out", 15) != 0) argv[kept++] = argv[i];
  }
  argc = kept;
}

}  // namespace backplane::bench
