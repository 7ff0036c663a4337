// Collectives through backplane, and the same operations through the raw library underneath (Gloo for
// gloo, MPI for mpi), side by side in one run. Run it as every rank of a job; the backend comes from
// the environment:
//
//   NXD_CPU_MODE=1 bpl-run --nproc-per-node 2 bpl-bench-collectives
//   mpirun -np 2 bpl-bench-collectives
//
// Sizes follow nccl-tests: the bytes of the whole buffer (allgather, allgatherv and gather: the gathered
// output; reduce_scatter and scatter: the input; alltoall and alltoallv: what each rank sends). The
// variable-size forms run with equal counts (each rank's block end to end), so that they compare with
// the fixed forms and with the raw library's own v-forms. Every (operation, dtype, size) runs a fixed number of
// iterations decided from the size alone, so all ranks run the same counts without talking; every rank
// times its calls, and rank 0 reports the slowest rank's time per call (rank_timing.h). Counters: algbw = bytes / time, busbw = algbw × nccl-tests' bus factor (GB/s). The console
// adds "backplane/raw" after each pair: the abstraction's cost, measured in one run. The op "copy" is
// the machine's reference: every rank memcpy's each size from one buffer to another at the same time
// ("copy/u8/<bytes>/memcpy"), the copy bandwidth that bench/README.md's model of shared memory divides by.
//
// Its flags (bpl-bench-collectives --help) choose the sizes, dtypes and operations (every collective of
// backplane.h's BPL_FOR_EACH_COLLECTIVE, pingpong and copy), the repetitions, and how backplane's calls
// are made: --async (each posted with a request and waited for; the raw library's non-blocking form),
// --interleave (each point's repetitions alternate, backplane then the raw library, instead of running
// in a row: on a shared or loaded machine both then meet its slow and fast spells alike; the JSON then
// holds one run per repetition and no aggregates, and the console and the tools take the median).
#include <benchmark/benchmark.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "backplane/backplane.h"
#include "collectives_settings.h"
#include "rank_timing.h"
#include "raw_library.h"

namespace backplane::bench {
namespace {

struct Job {
  bpl_runtime* runtime = nullptr;
  bpl_comm* world = nullptr;
  int rank = 0;
  int size = 1;
  std::unique_ptr<RawLibrary> raw;
};
Job job;

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "bpl-bench-collectives (rank %d): %s\n", job.rank, message.c_str());
  std::exit(1);
}

// Every rank's seconds for a repetition, gathered through backplane's world whichever library ran it.
void share_times(double mine, double* every_rank) {
  if (bpl_allgather(job.world, &mine, every_rank, 1, BPL_DTYPE_F64, nullptr) != BPL_OK) {
    fail(std::string("sharing the ranks' times: ") + bpl_last_error());
  }
}

/* ---- one operation, two implementations ---- */

// One buffer of zeros (repeated sums stay finite and normal), `offset` bytes past a page boundary.
class Buffer {
 public:
  Buffer(size_t bytes, size_t offset)
      : memory_(static_cast<unsigned char*>(std::aligned_alloc(kPage, (bytes + offset + kPage - 1) / kPage * kPage))),
        data_(memory_.get() + offset) {
    if (!memory_) fail("cannot allocate " + std::to_string(bytes) + " bytes");
    std::memset(data_, 0, bytes);
  }
  unsigned char* data() { return data_; }

 private:
  static constexpr size_t kPage = 4096;
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

// Blocking, or (async) posted with a request and waited for: the request's wait and free are part
// of what an asynchronous call costs.
bpl_status run_backplane(const std::string& op, Buffers& b, const OpShape& s, bpl_dtype dtype, bool async) {
  void* send = b.send.data();
  void* recv = b.recv.data();
  const auto count = static_cast<int64_t>(s.count);
  bpl_request* request = nullptr;
  bpl_request** req = async ? &request : nullptr;
  auto waited = [&](bpl_status status) {
    if (status != BPL_OK || request == nullptr) return status;
    status = bpl_request_wait(request, BPL_TIMEOUT_DEFAULT);
    const bpl_status freed = bpl_request_free(request);
    request = nullptr;
    return status != BPL_OK ? status : freed;
  };
  if (op == "allreduce") return waited(bpl_allreduce(job.world, recv, recv, count, dtype, BPL_OP_SUM, req));
  if (op == "allgather") return waited(bpl_allgather(job.world, send, recv, count, dtype, req));
  if (op == "reduce_scatter") return waited(bpl_reduce_scatter(job.world, send, recv, count, dtype, BPL_OP_SUM, req));
  if (op == "broadcast") return waited(bpl_broadcast(job.world, recv, count, dtype, 0, req));
  if (op == "reduce") return waited(bpl_reduce(job.world, send, recv, count, dtype, BPL_OP_SUM, 0, req));
  if (op == "alltoall") return waited(bpl_alltoall(job.world, send, recv, count, dtype, req));
  if (op == "barrier") return waited(bpl_barrier(job.world, req));
  if (op == "gather") return waited(bpl_gather(job.world, send, recv, count, dtype, 0, req));
  if (op == "scatter") return waited(bpl_scatter(job.world, send, recv, count, dtype, 0, req));
  if (op == "allgatherv" || op == "alltoallv") {
    const std::vector<int64_t> counts(static_cast<size_t>(job.size), count);
    std::vector<int64_t> displs(counts.size());
    for (size_t r = 0; r < displs.size(); ++r) displs[r] = count * static_cast<int64_t>(r);
    if (op == "allgatherv") return waited(bpl_allgatherv(job.world, send, count, recv, counts.data(), displs.data(), dtype, req));
    return waited(bpl_alltoallv(job.world, send, counts.data(), displs.data(), recv, counts.data(), displs.data(), dtype, req));
  }
  if (op != "pingpong") fail("no backplane runner for the operation '" + op + "'");
  // pingpong between ranks 0 and 1; the others wait at the next collective
  const int64_t bytes = static_cast<int64_t>(s.send_bytes);
  if (job.rank == 0) {
    bpl_status status = waited(bpl_send(job.world, send, bytes, BPL_DTYPE_U8, 1, 0, req));
    return status != BPL_OK ? status : waited(bpl_recv(job.world, recv, bytes, BPL_DTYPE_U8, 1, 0, req));
  }
  if (job.rank == 1) {
    bpl_status status = waited(bpl_recv(job.world, recv, bytes, BPL_DTYPE_U8, 0, 0, req));
    return status != BPL_OK ? status : waited(bpl_send(job.world, recv, bytes, BPL_DTYPE_U8, 0, 0, req));
  }
  return BPL_OK;
}

// The same operation through the raw library, for the operations it has a call for. An operation
// without one (a kind new to the ABI, before its raw baseline is written) is measured through backplane
// alone.
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

// Enough iterations for a stable median without long runs: ~256 MiB moved per repetition, at least 5.
int64_t iterations_for(int64_t bytes, int64_t max_iterations) {
  return std::clamp<int64_t>((int64_t{256} << 20) / std::max<int64_t>(bytes, 1), std::min<int64_t>(5, max_iterations),
                             max_iterations);
}

// Google Benchmark's settings shared by every benchmark of a size. Interleaved, each registration is
// one repetition: the caller registers the point's pair once per repetition.
void configure(benchmark::internal::Benchmark* b, int64_t iterations, const Settings& settings) {
  b->Iterations(iterations)->Repetitions(settings.interleave ? 1 : settings.repetitions)->ReportAggregatesOnly(true)
      ->UseManualTime()->Unit(benchmark::kMicrosecond);
}

// How many times a point's benchmarks are registered: once, or once per repetition when interleaved.
int registrations(const Settings& settings) { return settings.interleave ? settings.repetitions : 1; }

// The reference: a memcpy of `bytes` on every rank at once (each rank runs the same loop), as the ranks
// of a collective in shared memory copy at once.
void register_copy(int64_t bytes, const Settings& settings) {
  for (int r = 0; r < registrations(settings); ++r) {
    benchmark::internal::Benchmark* b = benchmark::RegisterBenchmark(
        ("copy/u8/" + std::to_string(bytes) + "/memcpy").c_str(), [=](benchmark::State& state) {
          Buffers buffers(static_cast<size_t>(bytes), static_cast<size_t>(bytes), static_cast<size_t>(settings.buffer_offset));
          time_on_every_rank(state, job.size, [&] {
            std::memcpy(buffers.recv.data(), buffers.send.data(), static_cast<size_t>(bytes));
            benchmark::ClobberMemory();
          }, share_times);
          state.counters["bytes"] = static_cast<double>(bytes);
          for (const char* counter : {"algbw", "busbw"}) {  // bytes per second, shown as G/s
            state.counters[counter] = benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate);
          }
        });
    configure(b, iterations_for(bytes, settings.max_iterations), settings);
  }
}

void register_pair(const std::string& op, const std::string& dtype_name, int64_t bytes, const Settings& settings) {
  const bpl_dtype dtype = dtype_name == "bf16" ? BPL_DTYPE_BF16 : BPL_DTYPE_F32;
  const OpShape s = shape_of(op, bytes, bpl_dtype_size(dtype), job.size);
  const bool sized = op != "barrier";
  if (sized && s.count == 0) return;  // smaller than one element per rank
  // Bytes one iteration moves for algbw: the nccl-tests size, both ways for the ping-pong.
  const double moved = op == "pingpong" ? 2.0 * bytes : static_cast<double>(bytes);
  const std::string base = sized ? op + "/" + dtype_name + "/" + std::to_string(bytes) : op;

  auto set_counters = [=](benchmark::State& state) {
    if (!sized) return;
    state.counters["bytes"] = static_cast<double>(bytes);
    // Bytes per second (Google Benchmark shows them as "2.43G/s"), nccl-tests' algbw and busbw.
    state.counters["algbw"] = benchmark::Counter(moved, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["busbw"] = benchmark::Counter(moved * s.bus_factor, benchmark::Counter::kIsIterationInvariantRate);
  };
  const int64_t iterations = sized ? iterations_for(bytes, settings.max_iterations) : settings.max_iterations;
  // One repetition of one implementation. The ranks first meet: one that left the previous benchmark
  // early would time its wait for the others. Interleaved, a quarter of the iterations then run
  // untimed, as many on every rank: the other implementation ran in between (its caches, and this
  // one's waits gone to sleep, would be timed).
  const int64_t warm_up = settings.interleave ? std::max<int64_t>(1, iterations / 4) : 0;
  auto repetition = [=](benchmark::State& state, auto meet, auto once) {
    Buffers buffers(s.send_bytes, s.recv_bytes, static_cast<size_t>(settings.buffer_offset));
    meet();
    for (int64_t i = 0; i < warm_up; ++i) once(buffers);
    time_on_every_rank(state, job.size, [&] { once(buffers); }, share_times);
    set_counters(state);
  };
  auto through_backplane = [=](Buffers& buffers) {
    if (run_backplane(op, buffers, s, dtype, settings.async) != BPL_OK) fail(op + " through backplane: " + bpl_last_error());
  };
  auto through_raw = [=](Buffers& buffers) {
    try {
      raw_runners().at(op)(*job.raw, buffers, s, dtype);
    } catch (const std::exception& e) {
      fail(op + " through the raw library: " + e.what());
    }
  };
  for (int r = 0; r < registrations(settings); ++r) {
    configure(benchmark::RegisterBenchmark((base + "/backplane").c_str(), [=](benchmark::State& state) {
      repetition(state, [] {
        if (bpl_barrier(job.world, nullptr) != BPL_OK) fail(std::string("barrier through backplane: ") + bpl_last_error());
      }, through_backplane);
    }), iterations, settings);
    if (!job.raw || raw_runners().count(op) == 0) continue;
    configure(benchmark::RegisterBenchmark((base + "/raw").c_str(), [=](benchmark::State& state) {
      repetition(state, [] { job.raw->barrier(); }, through_raw);
    }), iterations, settings);
  }
}

/* ---- reporting ---- */

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
}  // namespace backplane::bench

int main(int argc, char** argv) {
  using namespace backplane::bench;
  const Settings settings = parse_settings(argc, argv);
  for (int i = 1; i < argc; ++i) {
    // Each rank would shuffle differently and the ranks would run different collectives.
    if (std::strncmp(argv[i], "--benchmark_enable_random_interleaving", 38) == 0) {
      refuse("--benchmark_enable_random_interleaving cannot be used: every rank must run the benchmarks in the same order");
    }
  }
  if (bpl_init(nullptr, &job.runtime) != BPL_OK) fail(std::string("bpl_init: ") + bpl_last_error());
  bpl_comm_world(job.runtime, &job.world);
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  bpl_runtime_describe(job.runtime, &info);
  job.rank = info.rank;
  job.size = info.world_size;
  if (job.rank != 0) {
    // Only rank 0 writes --benchmark_out: another rank opening the same file would truncate it under rank 0.
    int kept = 1;
    for (int i = 1; i < argc; ++i) {
      if (std::strncmp(argv[i], "--benchmark_out", 15) != 0) argv[kept++] = argv[i];
    }
    argc = kept;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  const std::string backend = info.backend;
  if (job.size < 2 && std::find(settings.ops.begin(), settings.ops.end(), "pingpong") != settings.ops.end() &&
      job.rank == 0) {
    std::fprintf(stderr, "bpl-bench-collectives: one rank: pingpong is skipped\n");
  }
  if (settings.raw) {
    try {
      if (backend == "gloo") {
        const char* addr = std::getenv("MASTER_ADDR");
        const char* port = std::getenv("MASTER_PORT");
        if (job.size > 1 && (addr == nullptr || port == nullptr)) fail("raw Gloo needs MASTER_ADDR and MASTER_PORT");
        // The launcher's store where it has one (bpl-run's), else one of rank 0's at the port after the
        // plugin's own.
        const char* launcher_store = std::getenv("BPL_STORE_PORT");
        const int raw_port = launcher_store ? std::atoi(launcher_store) : port ? std::atoi(port) + 1 : 0;
        job.raw = open_raw_gloo(job.rank, job.size, addr ? addr : "127.0.0.1", raw_port, launcher_store == nullptr,
                                info.timeout_ms);
      } else if (backend == "mpi") {
        job.raw = open_raw_mpi();
      }
    } catch (const std::exception& e) {
      fail(std::string("opening the raw library: ") + e.what());
    }
  }
  std::string raw_mode = "blocking calls";
  if (settings.async) {
    raw_mode = job.raw && job.raw->set_nonblocking() ? "non-blocking calls, each waited for at once"
                                                     : "blocking calls (it has no non-blocking form)";
  }

  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  benchmark::AddCustomContext("backend", backend + " " + info.plugin_version + " (" + info.details + ")");
  benchmark::AddCustomContext("ranks", std::to_string(job.size) + " (" + std::to_string(info.local_world_size) +
                                           " on this host)");
  benchmark::AddCustomContext("raw_library", job.raw ? job.raw->description() + ", " + raw_mode : "none");
  benchmark::AddCustomContext("backplane_calls", settings.async ? "asynchronous: a request, waited for at once"
                                                                : "blocking");
  // Where the ranks may run: bound (mpirun's default, bpl-run --bind-to core) or not changes how they
  // meet a load.
  cpu_set_t cpus;
  const int allowed = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
  benchmark::AddCustomContext("host", std::string(host) + ", " + std::to_string(std::thread::hardware_concurrency()) +
                                          " hardware threads, rank 0 may run on " + std::to_string(allowed));
  benchmark::AddCustomContext("repetitions", std::to_string(settings.repetitions) +
                                                 (settings.interleave ? " per point, backplane's and the raw library's alternating"
                                                                      : " per benchmark, in a row"));
  benchmark::AddCustomContext("buffer_offset", std::to_string(settings.buffer_offset) + " bytes past a page boundary");

  for (const std::string& op : settings.ops) {
    if (op == "pingpong" && job.size < 2) continue;
    if (op == "barrier") {
      register_pair(op, "f32", 0, settings);
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
        register_pair(op, dtype, bytes, settings);
      }
    }
  }

  if (job.rank == 0) {
    RatioReporter display(settings.interleave ? settings.repetitions : 0);
    benchmark::RunSpecifiedBenchmarks(&display);
  } else {
    NullReporter display;
    benchmark::RunSpecifiedBenchmarks(&display);
  }
  benchmark::Shutdown();
  job.raw.reset();
  if (bpl_finalize(job.runtime) != BPL_OK) fail(std::string("bpl_finalize: ") + bpl_last_error());
  return 0;
}
