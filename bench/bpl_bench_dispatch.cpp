// What a call through the C ABI costs before any communication: argument validation, handle checks,
// routing into the plugin and (async) the request hand-off, measured on a world of one rank so that no
// network time hides it. Issue-level comparisons with raw Gloo/MPI live in the collective benchmarks.
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "backplane/backplane.h"
#include "bench_runtime.h"

namespace {

bpl_runtime* runtime = nullptr;
bpl_comm* world = nullptr;

void BM_AllreduceBlocking(benchmark::State& state) {
  std::vector<float> data(static_cast<size_t>(state.range(0)), 1.0f);
  for (auto _ : state) {
    bpl_status status = bpl_allreduce(world, data.data(), data.data(), state.range(0), BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
    if (status != BPL_OK) state.SkipWithError(bpl_last_error());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * static_cast<int64_t>(sizeof(float)));
}
BENCHMARK(BM_AllreduceBlocking)->Arg(1)->Arg(256)->Arg(65536);

void BM_AllreduceAsyncPostAndWait(benchmark::State& state) {
  std::vector<float> data(static_cast<size_t>(state.range(0)), 1.0f);
  for (auto _ : state) {
    bpl_request* request = nullptr;
    bpl_allreduce(world, data.data(), data.data(), state.range(0), BPL_DTYPE_F32, BPL_OP_SUM, &request);
    bpl_request_wait(request, BPL_TIMEOUT_DEFAULT);
    bpl_request_free(request);
  }
}
BENCHMARK(BM_AllreduceAsyncPostAndWait)->Arg(1)->Arg(65536);

void BM_RejectedCall(benchmark::State& state) {
  // The cost of validation that fails: a negative count, reported with a formatted message.
  float x = 0;
  for (auto _ : state) benchmark::DoNotOptimize(bpl_allreduce(world, &x, &x, -1, BPL_DTYPE_F32, BPL_OP_SUM, nullptr));
}
BENCHMARK(BM_RejectedCall);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;  // an unknown flag is refused, naming it
  runtime = backplane::bench::start_world_of_one();
  bpl_comm_world(runtime, &world);
  benchmark::AddCustomContext("backend", "gloo (world of 1)");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return bpl_finalize(runtime) == BPL_OK ? 0 : 1;
}
