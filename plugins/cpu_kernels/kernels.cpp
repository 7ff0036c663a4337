#include <ATen/ATen.h>

#include "aten_types.h"
#include "cpu_kernels.h"
#include "plugin_support.h"

namespace backplane::cpu_kernels {
namespace {

bpl_status classify(const std::exception&) { return BPL_ERR_INTERNAL; }

template <typename Body>
bpl_status guarded(Body&& body) noexcept {
  return plugin::guarded(plugin::name(), classify, std::forward<Body>(body));
}

// A rows×cols row-major matrix at `data` whose rows are `ld` elements apart: the caller's memory.
at::Tensor matrix(const void* data, int64_t rows, int64_t cols, int64_t ld, bpl_dtype dtype) {
  return at::from_blob(const_cast<void*>(data), {rows, cols}, {ld, 1}, at::TensorOptions().dtype(scalar_type(dtype)));
}

at::Tensor vector(const void* data, int64_t count, bpl_dtype dtype) {
  return at::from_blob(const_cast<void*>(data), {count}, at::TensorOptions().dtype(scalar_type(dtype)));
}

}  // namespace

bpl_status gemm(bpl_plugin_runtime*, const bpl_gemm_args* args) {
  return guarded([&] {
    const bpl_gemm_args& g = *args;
    if (g.m == 0 || g.n == 0) return BPL_OK;
    at::Tensor a = g.trans_a ? matrix(g.a, g.k, g.m, g.lda, g.dtype).t() : matrix(g.a, g.m, g.k, g.lda, g.dtype);
    at::Tensor b = g.trans_b ? matrix(g.b, g.n, g.k, g.ldb, g.dtype).t() : matrix(g.b, g.k, g.n, g.ldb, g.dtype);
    at::Tensor c = matrix(g.c, g.m, g.n, g.ldc, g.dtype);
    if (g.dtype == BPL_DTYPE_F16) {
      // LibTorch 1.13 has no f16 matrix product on CPU: compute in f32, round once into C.
      at::Tensor wide = g.beta == 0 ? at::empty({g.m, g.n}, at::kFloat) : c.to(at::kFloat);
      at::addmm_out(wide, wide, a.to(at::kFloat), b.to(at::kFloat), g.beta, g.alpha);
      c.copy_(wide);
    } else {
      // beta == 0 ignores C entirely (no NaN from uninitialised memory), as BLAS does.
      at::addmm_out(c, c, a, b, g.beta, g.alpha);
    }
    return BPL_OK;
  });
}

bpl_status elementwise(bpl_plugin_runtime*, bpl_kernel kernel, const bpl_elementwise_args* args) {
  return guarded([&] {
    const bpl_elementwise_args& e = *args;
    if (e.count == 0) return BPL_OK;
    at::Tensor x = vector(e.x, e.count, e.dtype);
    at::Tensor out = vector(e.out, e.count, e.dtype);
    switch (kernel) {
      case BPL_KERNEL_ADD:
        at::add_out(out, x, vector(e.y, e.count, e.dtype));
        break;
      case BPL_KERNEL_SCALE:
        at::mul_out(out, x, at::Scalar(e.alpha));
        break;
      default: {  // BPL_KERNEL_AXPBY; out may alias x or y, so never overwrite y before reading it
        at::Tensor y = vector(e.y, e.count, e.dtype);
        if (e.out == e.y) {
          out.mul_(e.beta).add_(x, e.alpha);
        } else {
          at::mul_out(out, x, at::Scalar(e.alpha));
          out.add_(y, e.beta);
        }
      }
    }
    return BPL_OK;
  });
}

bpl_status cast(bpl_plugin_runtime*, const bpl_cast_args* args) {
  return guarded([&] {
    if (args->count == 0) return BPL_OK;
    vector(args->dst, args->count, args->to).copy_(vector(args->src, args->count, args->from));
    return BPL_OK;
  });
}

}  // namespace backplane::cpu_kernels
