// gemm through the C ABI (bpl_gemm on the gloo backend's LibTorch kernels) against LibTorch called
// directly, in one run: at::mm (allocating its result, as users call it) and at::mm_out (into a
// preallocated result, as bpl_gemm writes into the caller's C). Square sizes 256..4096, f32 and bf16.
// Compare the medians: --benchmark_repetitions=5 --benchmark_report_aggregates_only=true.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>


#include "backplane/backplane.h"
#include "bench_runtime.h"

namespace {

bpl_runtime* runtime = nullptr;

at::ScalarType scalar_type(bpl_dtype dtype) { return dtype == BPL_DTYPE_BF16 ? at::kBFloat16 : at::kFloat; }

struct Operands {
  explicit Operands(int64_t n, bpl_dtype dtype)
      : a(at::rand({n, n}).to(scalar_type(dtype))), b(at::rand({n, n}).to(scalar_type(dtype))),
        c(at::empty({n, n}, scalar_type(dtype))) {}
  at::Tensor a, b, c;
};

void flops(benchmark::State& state) {
  const double n = static_cast<double>(state.range(0));
  state.counters["flops"] = benchmark::Counter(2 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
}

template <bpl_dtype Dtype>
void BM_GemmThroughAbi(benchmark::State& state) {
  const int64_t n = state.range(0);
  Operands x(n, Dtype);
  bpl_gemm_args args = BPL_GEMM_ARGS_INIT;
  args.dtype = Dtype;
  args.m = args.n = args.k = n;
  args.a = x.a.data_ptr(), args.lda = n;
  args.b = x.b.data_ptr(), args.ldb = n;
  args.c = x.c.data_ptr(), args.ldc = n;
  for (auto _ : state) {
    if (bpl_gemm(runtime, &args) != BPL_OK) state.SkipWithError(bpl_last_error());
    benchmark::ClobberMemory();
  }
  flops(state);
}

template <bpl_dtype Dtype>
void BM_GemmAtMm(benchmark::State& state) {
  Operands x(state.range(0), Dtype);
  for (auto _ : state) benchmark::DoNotOptimize(at::mm(x.a, x.b));
  flops(state);
}

template <bpl_dtype Dtype>
void BM_GemmAtMmOut(benchmark::State& state) {
  Operands x(state.range(0), Dtype);
  for (auto _ : state) {
    at::mm_out(x.c, x.a, x.b);
    benchmark::ClobberMemory();
  }
  flops(state);
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {256, 512, 1024, 2048, 4096}) b->Arg(n);
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

// Interleaved per dtype so that each ABI figure sits next to its direct counterparts.
BENCHMARK_TEMPLATE(BM_GemmThroughAbi, BPL_DTYPE_F32)->Apply(sizes);
BENCHMARK_TEMPLATE(BM_GemmAtMm, BPL_DTYPE_F32)->Apply(sizes);
BENCHMARK_TEMPLATE(BM_GemmAtMmOut, BPL_DTYPE_F32)->Apply(sizes);
BENCHMARK_TEMPLATE(BM_GemmThroughAbi, BPL_DTYPE_BF16)->Apply(sizes);
BENCHMARK_TEMPLATE(BM_GemmAtMm, BPL_DTYPE_BF16)->Apply(sizes);
BENCHMARK_TEMPLATE(BM_GemmAtMmOut, BPL_DTYPE_BF16)->Apply(sizes);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  runtime = backplane::bench::start_world_of_one();
  benchmark::AddCustomContext("backend", "gloo (LibTorch CPU kernels)");
  benchmark::AddCustomContext("torch_threads", std::to_string(at::get_num_threads()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return bpl_finalize(runtime) == BPL_OK ? 0 : 1;
}
