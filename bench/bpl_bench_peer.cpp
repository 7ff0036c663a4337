// A peer library measured as bpl-bench-collectives measures backplane (the same points, flags, timing on
// every rank and output: collective_points.h), without backplane. It is built once per peer that
// tools/install-deps installed (bench/CMakeLists.txt) and launched as that library's users launch it:
//
//   .peers/mpich/bin/mpiexec -n 2 bpl-bench-peer-mpich --ops=allreduce
//   LD_LIBRARY_PATH=.peers/impi/lib .peers/impi/bin/mpiexec -n 2 bpl-bench-peer-mpich   (Intel MPI: MPICH's ABI)
//   .peers/openmpi5/bin/mpirun -np 2 bpl-bench-peer-openmpi5
//   CCL_ATL_TRANSPORT=mpi CCL_WORKER_OFFLOAD=0 .peers/mpich/bin/mpiexec -n 2 bpl-bench-peer-oneccl   (oneCCL over MPICH)
//
// bpl-bench-compare runs each beside backplane. The benchmarks are named "<point>/raw", as the raw
// library's are in bpl-bench-collectives; the context's raw_library line names the library.
#include <mpi.h>

#include <string>

#include "collective_points.h"

namespace backplane::bench {
namespace {

void check(int code, const char* what) {
  if (code != MPI_SUCCESS) fail(std::string(what) + " failed");
}

// Every rank's seconds for a repetition, through the library's own job (MPI's world).
void share_times_through_mpi(double mine, double* every_rank) {
  check(MPI_Allgather(&mine, 1, MPI_DOUBLE, every_rank, 1, MPI_DOUBLE, MPI_COMM_WORLD), "MPI_Allgather of the ranks' times");
}

}  // namespace
}  // namespace backplane::bench

int main(int argc, char** argv) {
  using namespace backplane::bench;
  program_name = "bpl-bench-peer";
  const Settings settings = parse_settings(argc, argv);
#ifdef BPL_BENCH_PEER_ONECCL
  // oneCCL's MPI transport asks for every thread's calls; the MPIs alone start as their users start them.
  int provided = 0;
  check(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
#else
  check(MPI_Init(&argc, &argv), "MPI_Init");
#endif
  MPI_Comm_rank(MPI_COMM_WORLD, &job.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &job.size);
  job.share_times = share_times_through_mpi;
  keep_benchmark_flags_for_rank(job.rank, argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  try {
#ifdef BPL_BENCH_PEER_ONECCL
    job.raw = open_raw_oneccl();
#else
    job.raw = open_raw_mpi();
#endif
  } catch (const std::exception& e) {
    fail(std::string("opening the library: ") + e.what());
  }
  const bool nonblocking = settings.async && job.raw->set_nonblocking();
  benchmark::AddCustomContext("backend", "none (the library alone)");
  benchmark::AddCustomContext("ranks", std::to_string(job.size));
  benchmark::AddCustomContext("raw_library", job.raw->description() + (nonblocking ? ", non-blocking calls, each waited for at once"
                                                                                   : ", blocking calls"));
  add_machine_context(settings, "the library's");
  register_points(settings, [&](const Point& point) {
    if (!raw_has(point.op)) return;
    for (int r = 0; r < registrations(settings); ++r) {
      register_timed(point, "raw", settings, [] { job.raw->barrier(); }, [point](Buffers& buffers) {
        try {
          run_raw(*job.raw, point, buffers);
        } catch (const std::exception& e) {
          fail(point.op + ": " + e.what());
        }
      });
    }
  });
  run_benchmarks(settings);
  job.raw.reset();
  check(MPI_Finalize(), "MPI_Finalize");
  return 0;
}
