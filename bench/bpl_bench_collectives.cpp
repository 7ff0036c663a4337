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
#include <cstdlib>
#include <string>
#include <vector>

#include "backplane/backplane.h"
#include "collective_points.h"

namespace backplane::bench {
namespace {

bpl_runtime* runtime = nullptr;
bpl_comm* world = nullptr;

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
  if (op == "allreduce") return waited(bpl_allreduce(world, recv, recv, count, dtype, BPL_OP_SUM, req));
  if (op == "allgather") return waited(bpl_allgather(world, send, recv, count, dtype, req));
  if (op == "reduce_scatter") return waited(bpl_reduce_scatter(world, send, recv, count, dtype, BPL_OP_SUM, req));
  if (op == "broadcast") return waited(bpl_broadcast(world, recv, count, dtype, 0, req));
  if (op == "reduce") return waited(bpl_reduce(world, send, recv, count, dtype, BPL_OP_SUM, 0, req));
  if (op == "alltoall") return waited(bpl_alltoall(world, send, recv, count, dtype, req));
  if (op == "barrier") return waited(bpl_barrier(world, req));
  if (op == "gather") return waited(bpl_gather(world, send, recv, count, dtype, 0, req));
  if (op == "scatter") return waited(bpl_scatter(world, send, recv, count, dtype, 0, req));
  if (op == "allgatherv" || op == "alltoallv") {
    const std::vector<int64_t> counts(static_cast<size_t>(job.size), count);
    std::vector<int64_t> displs(counts.size());
    for (size_t r = 0; r < displs.size(); ++r) displs[r] = count * static_cast<int64_t>(r);
    if (op == "allgatherv") return waited(bpl_allgatherv(world, send, count, recv, counts.data(), displs.data(), dtype, req));
    return waited(bpl_alltoallv(world, send, counts.data(), displs.data(), recv, counts.data(), displs.data(), dtype, req));
  }
  if (op != "pingpong") fail("no backplane runner for the operation '" + op + "'");
  // pingpong between ranks 0 and 1; the others wait at the next collective
  const int64_t bytes = static_cast<int64_t>(s.send_bytes);
  if (job.rank == 0) {
    bpl_status status = waited(bpl_send(world, send, bytes, BPL_DTYPE_U8, 1, 0, req));
    return status != BPL_OK ? status : waited(bpl_recv(world, recv, bytes, BPL_DTYPE_U8, 1, 0, req));
  }
  if (job.rank == 1) {
    bpl_status status = waited(bpl_recv(world, recv, bytes, BPL_DTYPE_U8, 0, 0, req));
    return status != BPL_OK ? status : waited(bpl_send(world, recv, bytes, BPL_DTYPE_U8, 0, 0, req));
  }
  return BPL_OK;
}

// A point through backplane and, where it has the call, through the raw library underneath.
void register_pair(const Point& point, const Settings& settings) {
  auto through_backplane = [=](Buffers& buffers) {
    if (run_backplane(point.op, buffers, point.shape, point.dtype, settings.async) != BPL_OK) {
      fail(point.op + " through backplane: " + bpl_last_error());
    }
  };
  auto through_raw = [=](Buffers& buffers) {
    try {
      run_raw(*job.raw, point, buffers);
    } catch (const std::exception& e) {
      fail(point.op + " through the raw library: " + e.what());
    }
  };
  for (int r = 0; r < registrations(settings); ++r) {
    register_timed(point, "backplane", settings, [] {
      if (bpl_barrier(world, nullptr) != BPL_OK) fail(std::string("barrier through backplane: ") + bpl_last_error());
    }, through_backplane);
    if (!job.raw || !raw_has(point.op)) continue;
    register_timed(point, "raw", settings, [] { job.raw->barrier(); }, through_raw);
  }
}

}  // namespace
}  // namespace backplane::bench

int main(int argc, char** argv) {
  using namespace backplane::bench;
  const Settings settings = parse_settings(argc, argv);
  if (bpl_init(nullptr, &runtime) != BPL_OK) fail(std::string("bpl_init: ") + bpl_last_error());
  bpl_comm_world(runtime, &world);
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  bpl_runtime_describe(runtime, &info);
  job.rank = info.rank;
  job.size = info.world_size;
  // Every rank's times gathered through backplane's world, whichever library ran the calls.
  job.share_times = [](double mine, double* every_rank) {
    if (bpl_allgather(world, &mine, every_rank, 1, BPL_DTYPE_F64, nullptr) != BPL_OK) {
      fail(std::string("sharing the ranks' times: ") + bpl_last_error());
    }
  };
  keep_benchmark_flags_for_rank(job.rank, argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  const std::string backend = info.backend;
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

  benchmark::AddCustomContext("backend", backend + " " + info.plugin_version + " (" + info.details + ")");
  benchmark::AddCustomContext("ranks", std::to_string(job.size) + " (" + std::to_string(info.local_world_size) +
                                           " on this host)");
  benchmark::AddCustomContext("raw_library", job.raw ? job.raw->description() + ", " + raw_mode : "none");
  benchmark::AddCustomContext("backplane_calls", settings.async ? "asynchronous: a request, waited for at once"
                                                                : "blocking");
  add_machine_context(settings, "backplane's and the raw library's");
  register_points(settings, [&](const Point& point) { register_pair(point, settings); });
  run_benchmarks(settings);
  job.raw.reset();
  if (bpl_finalize(runtime) != BPL_OK) fail(std::string("bpl_finalize: ") + bpl_last_error());
  return 0;
}
