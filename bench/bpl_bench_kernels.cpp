// Kernels through the C ABI (the gloo backend's LibTorch kernels) against LibTorch called directly, in
// one run:
//  - gemm: bpl_gemm vs at::mm (allocating its result, as users call it) and at::mm_out (into a
//    preallocated result, as bpl_gemm writes into the caller's C); square sizes 256..4096, f32 and bf16;
//  - elementwise: bpl_add / bpl_scale / bpl_axpby / bpl_cast vs at::add_out / at::mul_out /
//    at::mul_out + add_ / Tensor::copy_, 4 Ki..16 Mi elements, f32 (cast: f32 -> bf16).
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

/* ---- elementwise ---- */

enum class Elementwise { Add, Scale, Axpby, Cast };

struct Vectors {
  explicit Vectors(int64_t n) : x(at::rand({n})), y(at::rand({n})), out(at::empty({n})), out_bf16(at::empty({n}, at::kBFloat16)) {}
  at::Tensor x, y, out, out_bf16;
};

void bytes_moved(benchmark::State& state, Elementwise kind) {
  // Reads and writes of 4-byte elements (the cast writes 2 bytes).
  const double n = static_cast<double>(state.range(0));
  const double per_element = kind == Elementwise::Scale ? 8 : kind == Elementwise::Cast ? 6 : 12;
  state.counters["bytes_per_second"] =
      benchmark::Counter(n * per_element, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1024);
}

template <Elementwise Kind>
void BM_ElementwiseThroughAbi(benchmark::State& state) {
  Vectors v(state.range(0));
  bpl_elementwise_args args = BPL_ELEMENTWISE_ARGS_INIT;
  args.count = state.range(0);
  args.alpha = 0.5;
  args.beta = 2.0;
  args.x = v.x.data_ptr(), args.y = v.y.data_ptr(), args.out = v.out.data_ptr();
  bpl_cast_args cast = BPL_CAST_ARGS_INIT;
  cast.count = state.range(0);
  cast.src = v.x.data_ptr(), cast.dst = v.out_bf16.data_ptr();
  for (auto _ : state) {
    bpl_status status = Kind == Elementwise::Add     ? bpl_add(runtime, &args)
                        : Kind == Elementwise::Scale ? bpl_scale(runtime, &args)
                        : Kind == Elementwise::Axpby ? bpl_axpby(runtime, &args)
                                                     : bpl_cast(runtime, &cast);
    if (status != BPL_OK) state.SkipWithError(bpl_last_error());
    benchmark::ClobberMemory();
  }
  bytes_moved(state, Kind);
}

template <Elementwise Kind>
void BM_ElementwiseAten(benchmark::State& state) {
  Vectors v(state.range(0));
  for (auto _ : state) {
    if (Kind == Elementwise::Add) at::add_out(v.out, v.x, v.y);
    if (Kind == Elementwise::Scale) at::mul_out(v.out, v.x, 0.5);
    if (Kind == Elementwise::Axpby) at::mul_out(v.out, v.x, 0.5).add_(v.y, 2.0);
    if (Kind == Elementwise::Cast) v.out_bf16.copy_(v.x);
    benchmark::ClobberMemory();
  }
  bytes_moved(state, Kind);
}

void lengths(benchmark::internal::Benchmark* b) {
  for (int64_t n : {int64_t{1} << 12, int64_t{1} << 16, int64_t{1} << 20, int64_t{1} << 24}) b->Arg(n);
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK_TEMPLATE(BM_ElementwiseThroughAbi, Elementwise::Add)->Apply(lengths);
BENCHMARK_TEMPLATE(BM_ElementwiseAten, Elementwise::Add)->Apply(lengths);
BENCHMARK_TEMPLATE(BM_ElementwiseThroughAbi, Elementwise::Scale)->Apply(lengths);
BENCHMARK_TEMPLATE(BM_ElementwiseAten, Elementwise::Scale)->Apply(lengths);
BENCHMARK_TEMPLATE(BM_ElementwiseThroughAbi, Elementwise::Axpby)->Apply(lengths);
BENCHMARK_TEMPLATE(BM_ElementwiseAten, Elementwise::Axpby)->Apply(lengths);
BENCHMARK_TEMPLATE(BM_ElementwiseThroughAbi, Elementwise::Cast)->Apply(lengths);
BENCHMARK_TEMPLATE(BM_ElementwiseAten, Elementwise::Cast)->Apply(lengths);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;  // an unknown flag is refused, naming it
  runtime = backplane::bench::start_world_of_one();
  benchmark::AddCustomContext("backend", "gloo (LibTorch CPU kernels)");
  benchmark::AddCustomContext("torch_threads", std::to_string(at::get_num_threads()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return bpl_finalize(runtime) == BPL_OK ? 0 : 1;
}
