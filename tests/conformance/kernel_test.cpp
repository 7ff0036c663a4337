// The kernel interface through the C ABI, on every CPU backend built (gloo, and mpi as a one-rank job):
// each kernel × dtype against a reference computed in double, odd shapes and padded leading
// dimensions, aliasing, bad arguments; TorchScript programs and their trip through the compile cache.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backplane/backplane.h"
#include "support/values.h"

namespace backplane::test {
namespace {

// One runtime per backend for the whole binary (MPI can be initialised once per process).
std::map<std::string, bpl_runtime*> runtimes;

class KernelEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    char dir[] = "/tmp/bpl-kernel-cache-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    cache_dir_ = dir;
    setenv("BPL_CACHE_DIR", dir, 1);
    // BPL_TEST_BACKENDS ("gloo", "gloo,mpi") narrows the backends, e.g. to keep MPI out of a process
    // whose leaks are checked.
    const char* selected = std::getenv("BPL_TEST_BACKENDS");
    for (const char* backend : {"gloo", "mpi"}) {
      if (selected != nullptr && std::string(selected).find(backend) == std::string::npos) continue;
      bpl_plugin_info info = BPL_PLUGIN_INFO_INIT;
      if (bpl_plugin_probe(backend, &info) != BPL_OK) continue;
      bpl_init_options options = BPL_INIT_OPTIONS_INIT;
      options.backend = backend;
      options.rank = 0;
      options.world_size = 1;
      bpl_runtime* runtime = nullptr;
      ASSERT_EQ(bpl_init(&options, &runtime), BPL_OK) << bpl_last_error();
      runtimes[backend] = runtime;
    }
  }
  void TearDown() override {
    for (auto& [name, runtime] : runtimes) EXPECT_EQ(bpl_finalize(runtime), BPL_OK) << bpl_last_error();
    std::filesystem::remove_all(cache_dir_);
  }
  static std::string cache_dir_;
};
std::string KernelEnvironment::cache_dir_;

std::vector<std::string> backends() { return {"gloo", "mpi"}; }

class Kernels : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto it = runtimes.find(GetParam());
    if (it == runtimes.end()) GTEST_SKIP() << "backend " << GetParam() << " is not built or not in BPL_TEST_BACKENDS";
    rt_ = it->second;
  }
  bpl_runtime* rt_ = nullptr;
};

#define EXPECT_OK(call) EXPECT_EQ((call), BPL_OK) << bpl_last_error()

::testing::AssertionResult fails_with(bpl_status status, bpl_status expected, const char* fragment) {
  std::string message = bpl_last_error();
  if (status != expected) {
    return ::testing::AssertionFailure() << "status " << bpl_status_name(status) << " (" << message << "), expected "
                                         << bpl_status_name(expected);
  }
  if (message.find(fragment) == std::string::npos) {
    return ::testing::AssertionFailure() << "'" << fragment << "' not in: " << message;
  }
  return ::testing::AssertionSuccess();
}

// Small values exact in every floating dtype (quarters in [-1, 1]).
double matrix_value(int which, int64_t i, int64_t j) { return static_cast<double>((i * 7 + j * 3 + which * 5) % 9 - 4) / 4; }

double gemm_tolerance(bpl_dtype dtype, int64_t k, double magnitude) {
  const double scale = std::max(1.0, magnitude);
  switch (dtype) {
    case BPL_DTYPE_F64: return 1e-12 * k * scale;
    case BPL_DTYPE_F32: return 1e-5 * k * scale;
    case BPL_DTYPE_F16: return 2e-3 * scale;
    default: return 1e-2 * scale;  // bf16: 8 significant bits in the result
  }
}

struct GemmCase {
  int64_t m, n, k;
  int trans_a, trans_b;
  int64_t pad;  // extra elements per row in every leading dimension
  double alpha, beta;
};

TEST_P(Kernels, GemmMatchesDoubleReference) {
  const GemmCase cases[] = {
      {1, 1, 1, 0, 0, 0, 1.0, 0.0},  {7, 5, 3, 0, 0, 0, 1.5, 0.0},   {7, 5, 3, 1, 0, 2, 1.0, 0.5},
      {7, 5, 3, 0, 1, 1, -0.5, 1.0}, {33, 17, 65, 1, 1, 3, 1.0, 0.25}, {4, 6, 0, 0, 0, 0, 1.0, 2.0},
  };
  for (bpl_dtype dtype : {BPL_DTYPE_F32, BPL_DTYPE_F64, BPL_DTYPE_F16, BPL_DTYPE_BF16}) {
    for (const GemmCase& g : cases) {
      const int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
      const int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
      // Leading dimensions are at least 1, as in BLAS, even for an empty k.
      const int64_t lda = std::max<int64_t>(1, a_cols + g.pad), ldb = std::max<int64_t>(1, b_cols + g.pad);
      const int64_t ldc = g.n + g.pad;
      Buffer a(dtype, static_cast<size_t>(std::max<int64_t>(1, a_rows * lda)));
      Buffer b(dtype, static_cast<size_t>(std::max<int64_t>(1, b_rows * ldb)));
      Buffer c(dtype, static_cast<size_t>(g.m * ldc));
      for (int64_t i = 0; i < a_rows; ++i)
        for (int64_t j = 0; j < a_cols; ++j) a.set(i * lda + j, matrix_value(1, i, j));
      for (int64_t i = 0; i < b_rows; ++i)
        for (int64_t j = 0; j < b_cols; ++j) b.set(i * ldb + j, matrix_value(2, i, j));
      for (int64_t i = 0; i < g.m * ldc; ++i) c.set(i, 0.5);  // padding keeps 0.5: it must not change

      bpl_gemm_args args = BPL_GEMM_ARGS_INIT;
      args.dtype = dtype;
      args.trans_a = g.trans_a;
      args.trans_b = g.trans_b;
      args.m = g.m, args.n = g.n, args.k = g.k;
      args.alpha = g.alpha, args.beta = g.beta;
      args.a = a.data(), args.lda = lda;
      args.b = b.data(), args.ldb = ldb;
      args.c = c.data(), args.ldc = ldc;
      ASSERT_EQ(bpl_gemm(rt_, &args), BPL_OK) << bpl_last_error();

      const std::string label = std::string(bpl_dtype_name(dtype)) + " m=" + std::to_string(g.m) + " n=" +
                                std::to_string(g.n) + " k=" + std::to_string(g.k) + " ta=" + std::to_string(g.trans_a) +
                                " tb=" + std::to_string(g.trans_b);
      for (int64_t i = 0; i < g.m; ++i) {
        for (int64_t j = 0; j < ldc; ++j) {
          if (j >= g.n) {
            ASSERT_EQ(c.get(i * ldc + j), 0.5) << label << ": padding of C at (" << i << "," << j << ") changed";
            continue;
          }
          double expected = 0;
          for (int64_t p = 0; p < g.k; ++p) {
            const double av = g.trans_a ? matrix_value(1, p, i) : matrix_value(1, i, p);
            const double bv = g.trans_b ? matrix_value(2, j, p) : matrix_value(2, p, j);
            expected += av * bv;
          }
          expected = g.alpha * expected + g.beta * 0.5;
          ASSERT_NEAR(c.get(i * ldc + j), expected, gemm_tolerance(dtype, g.k, std::fabs(expected)))
              << label << " at (" << i << "," << j << ")";
        }
      }
    }
  }
}

TEST_P(Kernels, GemmWithBetaZeroIgnoresNaNInC) {
  float a[4] = {1, 2, 3, 4}, b[4] = {1, 0, 0, 1}, c[4] = {NAN, NAN, NAN, NAN};
  bpl_gemm_args args = BPL_GEMM_ARGS_INIT;
  args.m = args.n = args.k = 2;
  args.a = a, args.lda = 2, args.b = b, args.ldb = 2, args.c = c, args.ldc = 2;
  ASSERT_EQ(bpl_gemm(rt_, &args), BPL_OK) << bpl_last_error();
  EXPECT_EQ(c[0], 1);
  EXPECT_EQ(c[3], 4);
}

TEST_P(Kernels, ElementwiseEveryDtypeAndAliasing) {
  const size_t count = 1001;
  for (bpl_dtype dtype : kAllDtypes) {
    Buffer x(dtype, count), y(dtype, count), out(dtype, count);
    for (size_t i = 0; i < count; ++i) {
      x.set(i, input_value(dtype, BPL_OP_SUM, 0, i));
      y.set(i, input_value(dtype, BPL_OP_SUM, 1, i));
    }
    bpl_elementwise_args args = BPL_ELEMENTWISE_ARGS_INIT;
    args.dtype = dtype;
    args.count = static_cast<int64_t>(count);
    args.x = x.data(), args.y = y.data(), args.out = out.data();
    EXPECT_OK(bpl_add(rt_, &args));
    EXPECT_TRUE(elements_match(out, 0, count, [&](size_t i) {
      return input_value(dtype, BPL_OP_SUM, 0, i) + input_value(dtype, BPL_OP_SUM, 1, i);
    })) << "add " << bpl_dtype_name(dtype);
    if (is_integer(dtype)) {
      EXPECT_EQ(bpl_scale(rt_, &args), BPL_ERR_UNSUPPORTED) << bpl_dtype_name(dtype);
      continue;
    }
    args.alpha = -0.5;
    args.beta = 2.0;
    EXPECT_OK(bpl_scale(rt_, &args));
    EXPECT_TRUE(elements_match(out, 0, count, [&](size_t i) { return -0.5 * input_value(dtype, BPL_OP_SUM, 0, i); }))
        << "scale " << bpl_dtype_name(dtype);
    args.out = y.data();  // out aliases y: y must be read before it is overwritten
    EXPECT_OK(bpl_axpby(rt_, &args));
    EXPECT_TRUE(elements_match(y, 0, count, [&](size_t i) {
      return -0.5 * input_value(dtype, BPL_OP_SUM, 0, i) + 2.0 * input_value(dtype, BPL_OP_SUM, 1, i);
    })) << "axpby into y " << bpl_dtype_name(dtype);
    args.out = x.data();  // and into x
    args.y = out.data();
    EXPECT_OK(bpl_axpby(rt_, &args));
    EXPECT_TRUE(elements_match(x, 0, count, [&](size_t i) {
      return -0.5 * input_value(dtype, BPL_OP_SUM, 0, i) + 2.0 * (-0.5 * input_value(dtype, BPL_OP_SUM, 0, i));
    })) << "axpby into x " << bpl_dtype_name(dtype);
  }
}

TEST_P(Kernels, CastRoundsToNearestEven) {
  // Values that are not representable in the narrow types, ties included.
  const std::vector<float> values = {1.0f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 3.14159265f, -2.71828f, 65504.0f,
                                     1e-3f, 1.0f + 1.0f / 2048, 0.0f, -0.0f, 1e20f};
  for (bpl_dtype narrow : {BPL_DTYPE_BF16, BPL_DTYPE_F16}) {
    std::vector<uint16_t> packed(values.size());
    std::vector<float> back(values.size());
    bpl_cast_args args = BPL_CAST_ARGS_INIT;
    args.from = BPL_DTYPE_F32;
    args.to = narrow;
    args.count = static_cast<int64_t>(values.size());
    args.src = values.data();
    args.dst = packed.data();
    ASSERT_EQ(bpl_cast(rt_, &args), BPL_OK) << bpl_last_error();
    args.from = narrow;
    args.to = BPL_DTYPE_F32;
    args.src = packed.data();
    args.dst = back.data();
    ASSERT_EQ(bpl_cast(rt_, &args), BPL_OK) << bpl_last_error();
    for (size_t i = 0; i < values.size(); ++i) {
      const float expected = narrow == BPL_DTYPE_BF16 ? static_cast<float>(c10::BFloat16(values[i]))
                                                      : static_cast<float>(c10::Half(values[i]));
      EXPECT_EQ(std::memcmp(&back[i], &expected, sizeof(float)), 0)
          << bpl_dtype_name(narrow) << " " << values[i] << " -> " << back[i] << ", expected " << expected;
    }
  }
  EXPECT_EQ(static_cast<float>(c10::BFloat16(1.0f + 1.0f / 256)), 1.0f) << "the reference itself rounds to even";
}

// Bad arguments of the kernels are in tests/core/bad_arguments_test.cpp; here, what a backend lacks.
TEST_P(Kernels, GemmOfAnUnsupportedDtypeIsUnsupported) {
  float a[4] = {}, b[4] = {}, c[4] = {};
  bpl_gemm_args args = BPL_GEMM_ARGS_INIT;
  args.m = args.n = args.k = 2;
  args.a = a, args.lda = 2, args.b = b, args.ldb = 2, args.c = c, args.ldc = 2;
  ASSERT_EQ(bpl_gemm(rt_, &args), BPL_OK) << bpl_last_error();
  args.dtype = BPL_DTYPE_I32;
  EXPECT_TRUE(fails_with(bpl_gemm(rt_, &args), BPL_ERR_UNSUPPORTED, "gemm of dtype i32"));
}

/* ---- programs ---- */

const std::string kMatmulPlusOne = "def forward(self, x, y):\n    return x @ y + 1.0\n";

bpl_tensor tensor_of(void* data, bpl_dtype dtype, std::initializer_list<int64_t> shape) {
  bpl_tensor t = BPL_TENSOR_INIT;
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  int d = 0;
  for (int64_t extent : shape) t.shape[d++] = extent;
  return t;
}

bpl_program* compile(bpl_runtime* rt, const std::string& source, const char* flags = nullptr,
                     const char* entry = nullptr, bpl_status* status = nullptr) {
  bpl_program_options options = BPL_PROGRAM_OPTIONS_INIT;
  options.format = "torchscript";
  options.flags = flags;
  options.entry = entry;
  bpl_program* program = nullptr;
  bpl_status result = bpl_program_compile(rt, source.data(), source.size(), &options, &program);
  if (status != nullptr) *status = result;
  return program;
}

// Bytes of a counter file in the one cache entry whose path contains `flags_marker`.
size_t entry_counter(const std::string& file) {
  size_t total = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(KernelEnvironment::cache_dir_)) {
    if (entry.path().filename() == file) total += std::filesystem::file_size(entry.path());
  }
  return total;
}

TEST_P(Kernels, TorchScriptProgramRunsOnCallerBuffers) {
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  ASSERT_EQ(bpl_runtime_describe(rt_, &info), BPL_OK);
  EXPECT_STREQ(info.program_formats, "torchscript");
  EXPECT_TRUE(info.kernels & BPL_BIT(BPL_KERNEL_GEMM));

  bpl_program* program = compile(rt_, kMatmulPlusOne);
  ASSERT_NE(program, nullptr) << bpl_last_error();
  float x[6] = {1, 2, 3, 4, 5, 6}, y[6] = {1, 0, 0, 1, 1, 1}, out[4] = {};
  bpl_tensor inputs[2] = {tensor_of(x, BPL_DTYPE_F32, {2, 3}), tensor_of(y, BPL_DTYPE_F32, {3, 2})};
  bpl_tensor outputs[1] = {tensor_of(out, BPL_DTYPE_F32, {2, 2})};
  ASSERT_EQ(bpl_program_run(program, inputs, 2, outputs, 1), BPL_OK) << bpl_last_error();
  EXPECT_EQ(out[0], 5);
  EXPECT_EQ(out[1], 6);
  EXPECT_EQ(out[2], 11);
  EXPECT_EQ(out[3], 12);

  // A wrong output shape or count is named, and nothing is written.
  float wrong[3] = {-1, -1, -1};
  bpl_tensor bad[1] = {tensor_of(wrong, BPL_DTYPE_F32, {3})};
  EXPECT_TRUE(fails_with(bpl_program_run(program, inputs, 2, bad, 1), BPL_ERR_INVALID_ARGUMENT, "outputs[0] is Float[3]"));
  EXPECT_EQ(wrong[0], -1);
  EXPECT_TRUE(fails_with(bpl_program_run(program, inputs, 2, outputs, 0), BPL_ERR_INVALID_ARGUMENT, "num_outputs = 0"));
  EXPECT_TRUE(fails_with(bpl_program_run(program, nullptr, 2, outputs, 1), BPL_ERR_INVALID_ARGUMENT, "inputs is NULL"));
  EXPECT_OK(bpl_program_destroy(program));
}

TEST_P(Kernels, ProgramReturningATupleAndNamedEntry) {
  const std::string source =
      "def forward(self, x):\n    return x\n"
      "def split(self, x):\n    return x * 2.0, x.sum().reshape([1])\n";
  bpl_program* program = compile(rt_, source, nullptr, "split");
  ASSERT_NE(program, nullptr) << bpl_last_error();
  double x[3] = {1, 2, 3}, doubled[3] = {}, sum[1] = {};
  bpl_tensor inputs[1] = {tensor_of(x, BPL_DTYPE_F64, {3})};
  bpl_tensor outputs[2] = {tensor_of(doubled, BPL_DTYPE_F64, {3}), tensor_of(sum, BPL_DTYPE_F64, {1})};
  ASSERT_EQ(bpl_program_run(program, inputs, 1, outputs, 2), BPL_OK) << bpl_last_error();
  EXPECT_EQ(doubled[2], 6);
  EXPECT_EQ(sum[0], 6);
  EXPECT_OK(bpl_program_destroy(program));

  bpl_status status = BPL_OK;
  EXPECT_EQ(compile(rt_, source, nullptr, "nosuch", &status), nullptr);
  EXPECT_TRUE(fails_with(status, BPL_ERR_INVALID_ARGUMENT, "entry 'nosuch' is not a method of the program (methods: forward, split)"));
}

TEST_P(Kernels, CompileErrorsAndUnknownFormats) {
  bpl_status status = BPL_OK;
  EXPECT_EQ(compile(rt_, "def forward(self, x):\n    return x +\n", "--unique-flag-for-syntax-error", nullptr, &status), nullptr);
  EXPECT_TRUE(fails_with(status, BPL_ERR_INVALID_ARGUMENT, "expected"));

  bpl_program_options options = BPL_PROGRAM_OPTIONS_INIT;
  options.format = "neff";
  bpl_program* program = nullptr;
  EXPECT_TRUE(fails_with(bpl_program_compile(rt_, "x", 1, &options, &program), BPL_ERR_INVALID_ARGUMENT,
                         "options->format = 'neff'"));
  EXPECT_NE(std::string(bpl_last_error()).find("accepts: torchscript"), std::string::npos) << bpl_last_error();
}

TEST_P(Kernels, SecondCompileIsACacheHitThatDoesNotCompile) {
  // A source of its own, so that this entry's counters are this test's.
  const std::string source = "def forward(self, x):\n    return x * 3.0  # " + GetParam() + "\n";
  const size_t compiles = entry_counter("model.compiles");
  bpl_program* first = compile(rt_, source);
  ASSERT_NE(first, nullptr) << bpl_last_error();
  EXPECT_EQ(entry_counter("model.compiles"), compiles + 1);
  const size_t hits = entry_counter("model.hits");
  bpl_program* second = compile(rt_, source);
  ASSERT_NE(second, nullptr) << bpl_last_error();
  EXPECT_EQ(entry_counter("model.compiles"), compiles + 1) << "the hit compiled again";
  EXPECT_EQ(entry_counter("model.hits"), hits + 1);
  float x[2] = {1, 2}, y[2] = {};
  bpl_tensor in[1] = {tensor_of(x, BPL_DTYPE_F32, {2})}, out[1] = {tensor_of(y, BPL_DTYPE_F32, {2})};
  EXPECT_OK(bpl_program_run(second, in, 1, out, 1));
  EXPECT_EQ(y[1], 6);
  EXPECT_OK(bpl_program_destroy(first));
  EXPECT_OK(bpl_program_destroy(second));
}

INSTANTIATE_TEST_SUITE_P(Backends, Kernels, ::testing::ValuesIn(backends()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace backplane::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new backplane::test::KernelEnvironment);
  return RUN_ALL_TESTS();
}
