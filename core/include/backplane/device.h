/*
 * backplane/device.h — device memory, kernels and programs.
 * Part of backplane.h, which includes it: include <backplane/backplane.h>, not this file.
 */
#ifndef BACKPLANE_DEVICE_H
#define BACKPLANE_DEVICE_H

#ifndef BACKPLANE_BACKPLANE_H
#error "include <backplane/backplane.h>, which includes this file"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------------ */
/* Device interface. CPU backends expose one host device (index 0); there, host pointers are valid  */
/* device pointers.                                                                                  */

#define BPL_DEVICE_HOST 1
#define BPL_DEVICE_ACCELERATOR 2

typedef struct bpl_device_properties {
  size_t struct_size;    /* sizeof(bpl_device_properties) */
  char name[64];         /* e.g. "cpu", "NeuronCore-v2 3" */
  int32_t kind;          /* BPL_DEVICE_HOST or BPL_DEVICE_ACCELERATOR */
  int32_t index;         /* the device's index in this runtime */
  uint64_t total_memory; /* bytes; 0 if unknown */
  uint64_t free_memory;  /* bytes; 0 if unknown */
} bpl_device_properties;

#define BPL_DEVICE_PROPERTIES_INIT {sizeof(bpl_device_properties), "", 0, 0, 0u, 0u}

/* Number of devices this rank can use. */
BPL_API bpl_status bpl_device_count(const bpl_runtime* runtime, int32_t* count);
/* Errors: INVALID_ARGUMENT (device out of range, NULL). */
BPL_API bpl_status bpl_device_get_properties(const bpl_runtime* runtime, int32_t device,
                                             bpl_device_properties* out);

/* Allocates `bytes` on `device` (64-byte aligned); *ptr is owned by the caller, released with bpl_free.
 * bytes == 0 gives NULL. Errors: INVALID_ARGUMENT, OUT_OF_MEMORY. */
BPL_API bpl_status bpl_malloc(bpl_runtime* runtime, int32_t device, size_t bytes, void** ptr);
/* Releases memory from bpl_malloc of this runtime. Accepts NULL. */
BPL_API bpl_status bpl_free(bpl_runtime* runtime, void* ptr);

typedef int32_t bpl_memcpy_kind;
#define BPL_MEMCPY_HOST_TO_HOST 1
#define BPL_MEMCPY_HOST_TO_DEVICE 2
#define BPL_MEMCPY_DEVICE_TO_HOST 3
#define BPL_MEMCPY_DEVICE_TO_DEVICE 4

/* Copies `bytes` between non-overlapping buffers; complete when it returns. */
BPL_API bpl_status bpl_memcpy(bpl_runtime* runtime, void* dst, const void* src, size_t bytes,
                              bpl_memcpy_kind kind);
/* Waits until all work queued on `device` has finished. */
BPL_API bpl_status bpl_synchronize(bpl_runtime* runtime, int32_t device);

/* ------------------------------------------------------------------------------------------------ */
/* Kernel interface: typed kernels every backend provides, and programs.                            */
/* Buffers are device memory of `device` (host memory on CPU backends). Kernels complete before     */
/* returning on CPU backends; on accelerators, bpl_synchronize(device) waits for them.              */

/* Kernels, as bit positions in bpl_runtime_info.kernels. */
typedef int32_t bpl_kernel;
#define BPL_KERNEL_GEMM 1
#define BPL_KERNEL_ADD 2
#define BPL_KERNEL_SCALE 3
#define BPL_KERNEL_AXPBY 4
#define BPL_KERNEL_CAST 5

/* C = alpha * op(A) * op(B) + beta * C, row-major (as LibTorch and C arrays lay matrices out).
 * op(A) is m×k: A is m×k with lda >= k, or with trans_a A is k×m with lda >= m. op(B) is k×n likewise
 * (ldb >= n, or >= k with trans_b). C is m×n with ldc >= n. With beta == 0, C's contents are ignored
 * (NaN in C does not propagate). dtype: f32, f64, f16, bf16; A, B and C share it. */
typedef struct bpl_gemm_args {
  size_t struct_size; /* sizeof(bpl_gemm_args) */
  int32_t device;
  bpl_dtype dtype;
  int32_t trans_a; /* 0 or 1 */
  int32_t trans_b; /* 0 or 1 */
  int64_t m, n, k; /* >= 0 */
  double alpha, beta;
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  void* c;
  int64_t ldc;
} bpl_gemm_args;

#define BPL_GEMM_ARGS_INIT {sizeof(bpl_gemm_args), 0, BPL_DTYPE_F32, 0, 0, 0, 0, 0, 1.0, 0.0, NULL, 0, NULL, 0, NULL, 0}

/* Errors: INVALID_ARGUMENT naming the field (NULL matrix with non-zero size, negative or overflowing
 * sizes, a leading dimension smaller than its row, an unknown dtype, trans not 0/1), UNSUPPORTED. */
BPL_API bpl_status bpl_gemm(bpl_runtime* runtime, const bpl_gemm_args* args);

/* Elementwise over `count` elements of `dtype` (any bpl_dtype for add; floating dtypes for scale and
 * axpby): add: out = x + y; scale: out = alpha * x; axpby: out = alpha * x + beta * y. out may be x or y. */
typedef struct bpl_elementwise_args {
  size_t struct_size; /* sizeof(bpl_elementwise_args) */
  int32_t device;
  bpl_dtype dtype;
  int64_t count;
  double alpha, beta;
  const void* x;
  const void* y; /* unused by scale */
  void* out;
} bpl_elementwise_args;

#define BPL_ELEMENTWISE_ARGS_INIT {sizeof(bpl_elementwise_args), 0, BPL_DTYPE_F32, 0, 1.0, 1.0, NULL, NULL, NULL}

BPL_API bpl_status bpl_add(bpl_runtime* runtime, const bpl_elementwise_args* args);
BPL_API bpl_status bpl_scale(bpl_runtime* runtime, const bpl_elementwise_args* args);
BPL_API bpl_status bpl_axpby(bpl_runtime* runtime, const bpl_elementwise_args* args);

/* dst = (to) src over `count` elements, rounding to nearest even. Between f32 and bf16/f16 at least;
 * CPU backends convert between any two floating dtypes. src and dst must not overlap. */
typedef struct bpl_cast_args {
  size_t struct_size; /* sizeof(bpl_cast_args) */
  int32_t device;
  bpl_dtype from;
  bpl_dtype to;
  int32_t reserved0; /* zero */
  int64_t count;
  const void* src;
  void* dst;
} bpl_cast_args;

#define BPL_CAST_ARGS_INIT {sizeof(bpl_cast_args), 0, BPL_DTYPE_F32, BPL_DTYPE_BF16, 0, 0, NULL, NULL}

BPL_API bpl_status bpl_cast(bpl_runtime* runtime, const bpl_cast_args* args);

/* Programs: source in a backend format, compiled once through the persistent compile cache (keyed by
 * backend, compiler version, flags and source; see README "Compile cache"), then run many times. */
typedef struct bpl_program bpl_program;

typedef struct bpl_program_options {
  size_t struct_size; /* sizeof(bpl_program_options) */
  const char* format; /* "torchscript" (CPU backends), "neff" or "hlo" (neuron); see program_formats */
  const char* flags;  /* compiler flags, part of the cache key; NULL = none */
  const char* entry;  /* function to run; NULL = "forward" */
  int32_t device;
  int32_t reserved0;  /* zero */
} bpl_program_options;

#define BPL_PROGRAM_OPTIONS_INIT {sizeof(bpl_program_options), NULL, NULL, NULL, 0, 0}

/* Compiles (or takes from the cache) `source` of `source_size` bytes. *out is owned by the caller,
 * released with bpl_program_destroy. Errors: INVALID_ARGUMENT (unknown format: lists the backend's),
 * UNSUPPORTED, and the compiler's failure with its message (status of the failure; a failure recorded
 * in the cache is returned without recompiling unless retry is asked, see README). */
BPL_API bpl_status bpl_program_compile(bpl_runtime* runtime, const void* source, size_t source_size,
                                       const bpl_program_options* options, bpl_program** out);

#define BPL_MAX_DIMS 8

/* A tensor argument of a program: caller-owned memory described by dtype and a row-major shape. */
typedef struct bpl_tensor {
  size_t struct_size; /* sizeof(bpl_tensor) */
  void* data;
  bpl_dtype dtype;
  int32_t ndim; /* 0 .. BPL_MAX_DIMS */
  int64_t shape[BPL_MAX_DIMS];
} bpl_tensor;

#define BPL_TENSOR_INIT {sizeof(bpl_tensor), NULL, BPL_DTYPE_F32, 0, {0, 0, 0, 0, 0, 0, 0, 0}}

/* Runs the program on `inputs`, writing its results into `outputs`, whose dtypes and shapes must match
 * what the program returns (a tuple returns several). Inputs are read in place, never copied.
 * Errors: INVALID_ARGUMENT (a count, dtype or shape that does not match, naming the tensor), and the
 * program's own failure. */
BPL_API bpl_status bpl_program_run(bpl_program* program, const bpl_tensor* inputs, int32_t num_inputs,
                                   bpl_tensor* outputs, int32_t num_outputs);

/* Releases a program. Accepts NULL. */
BPL_API bpl_status bpl_program_destroy(bpl_program* program);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BACKPLANE_DEVICE_H */
