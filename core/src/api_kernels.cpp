// The C API of kernels and programs (compiled through the compile cache).
#include <string>

#include "backplane/backplane.h"
#include "backplane/plugin.h"
#include "error.h"
#include "handles.h"
#include "operation.h"
#include "validation.h"
#include "compile_cache.h"
#include "environment.h"
#include "log.h"

using namespace backplane;

namespace {

// add, scale and axpby: `name` is the kernel's ("add"), `function` the API's ("bpl_add").
bpl_status elementwise(const char* function, const char* name, bpl_runtime* runtime, const bpl_elementwise_args* args,
                       bpl_kernel kernel) {
  bpl_runtime* rt = check_runtime(runtime);
  const RuntimeCall in_progress(rt);
  REQUIRE(args != nullptr, "args is NULL");
  const bpl_elementwise_args defaults = BPL_ELEMENTWISE_ARGS_INIT;
  const bpl_elementwise_args e = read_input(args, defaults, "args");
  auto fn = require_kernel(rt, &bpl_plugin_api::elementwise, kernel, name);
  check_device(rt, e.device);
  const size_t element = check_known_dtype(e.dtype, "args->dtype");
  if (kernel != BPL_KERNEL_ADD && !is_floating(e.dtype)) {
    throw Error(BPL_ERR_UNSUPPORTED, std::string(name) + " of dtype " + bpl_dtype_name(e.dtype) +
                                         " is not provided (floating dtypes only)");
  }
  const size_t bytes = check_count(e.count, element, 1, "args->count");
  check_buffer(e.x, bytes, "args->x");
  check_buffer(e.out, bytes, "args->out");
  REQUIRE(e.out == e.x || !overlap(e.out, bytes, e.x, bytes), "args->out overlaps args->x without being equal");
  if (kernel != BPL_KERNEL_SCALE) {
    check_buffer(e.y, bytes, "args->y");
    REQUIRE(e.out == e.y || !overlap(e.out, bytes, e.y, bytes), "args->out overlaps args->y without being equal");
  }
  return forward(function, rt, fn(rt->impl, kernel, &e));
}


}  // namespace

extern "C" {

/* ---- kernels ---- */

bpl_status bpl_gemm(bpl_runtime* runtime, const bpl_gemm_args* args) {
  return guarded("bpl_gemm", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    const RuntimeCall in_progress(rt);
    REQUIRE(args != nullptr, "args is NULL");
    const bpl_gemm_args defaults = BPL_GEMM_ARGS_INIT;
    const bpl_gemm_args g = read_input(args, defaults, "args");
    auto fn = require_kernel(rt, &bpl_plugin_api::gemm, BPL_KERNEL_GEMM, "gemm");
    check_device(rt, g.device);
    const size_t element = check_known_dtype(g.dtype, "args->dtype");
    if (!is_floating(g.dtype)) {
      throw Error(BPL_ERR_UNSUPPORTED, std::string("gemm of dtype ") + bpl_dtype_name(g.dtype) +
                                           " is not provided (f32, f64, f16, bf16)");
    }
    REQUIRE(g.trans_a == 0 || g.trans_a == 1, "args->trans_a = " + std::to_string(g.trans_a) + ": expected 0 or 1");
    REQUIRE(g.trans_b == 0 || g.trans_b == 1, "args->trans_b = " + std::to_string(g.trans_b) + ": expected 0 or 1");
    REQUIRE(g.m >= 0, "args->m = " + std::to_string(g.m) + ": expected >= 0");
    REQUIRE(g.n >= 0, "args->n = " + std::to_string(g.n) + ": expected >= 0");
    REQUIRE(g.k >= 0, "args->k = " + std::to_string(g.k) + ": expected >= 0");
    const size_t a_bytes = g.trans_a ? check_matrix(g.a, g.k, g.m, g.lda, element, "args->a", "args->lda")
                                     : check_matrix(g.a, g.m, g.k, g.lda, element, "args->a", "args->lda");
    const size_t b_bytes = g.trans_b ? check_matrix(g.b, g.n, g.k, g.ldb, element, "args->b", "args->ldb")
                                     : check_matrix(g.b, g.k, g.n, g.ldb, element, "args->b", "args->ldb");
    const size_t c_bytes = check_matrix(g.c, g.m, g.n, g.ldc, element, "args->c", "args->ldc");
    REQUIRE(!overlap(g.c, c_bytes, g.a, a_bytes) && !overlap(g.c, c_bytes, g.b, b_bytes),
            "args->c overlaps args->a or args->b");
    return forward("bpl_gemm", rt, fn(rt->impl, &g));
  });
}

bpl_status bpl_add(bpl_runtime* runtime, const bpl_elementwise_args* args) {
  return guarded("bpl_add", [&] { return elementwise("bpl_add", "add", runtime, args, BPL_KERNEL_ADD); });
}

bpl_status bpl_scale(bpl_runtime* runtime, const bpl_elementwise_args* args) {
  return guarded("bpl_scale", [&] { return elementwise("bpl_scale", "scale", runtime, args, BPL_KERNEL_SCALE); });
}

bpl_status bpl_axpby(bpl_runtime* runtime, const bpl_elementwise_args* args) {
  return guarded("bpl_axpby", [&] { return elementwise("bpl_axpby", "axpby", runtime, args, BPL_KERNEL_AXPBY); });
}

bpl_status bpl_cast(bpl_runtime* runtime, const bpl_cast_args* args) {
  return guarded("bpl_cast", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    const RuntimeCall in_progress(rt);
    REQUIRE(args != nullptr, "args is NULL");
    const bpl_cast_args defaults = BPL_CAST_ARGS_INIT;
    const bpl_cast_args c = read_input(args, defaults, "args");
    auto fn = require_kernel(rt, &bpl_plugin_api::cast, BPL_KERNEL_CAST, "cast");
    check_device(rt, c.device);
    const size_t from = check_known_dtype(c.from, "args->from");
    const size_t to = check_known_dtype(c.to, "args->to");
    if (!is_floating(c.from) || !is_floating(c.to)) {
      throw Error(BPL_ERR_UNSUPPORTED, std::string("cast from ") + bpl_dtype_name(c.from) + " to " +
                                           bpl_dtype_name(c.to) + " is not provided (floating dtypes only)");
    }
    const size_t src_bytes = check_count(c.count, from, 1, "args->count");
    const size_t dst_bytes = check_count(c.count, to, 1, "args->count");
    check_buffer(c.src, src_bytes, "args->src");
    check_buffer(c.dst, dst_bytes, "args->dst");
    REQUIRE(!overlap(c.src, src_bytes, c.dst, dst_bytes), "args->src and args->dst overlap");
    return forward("bpl_cast", rt, fn(rt->impl, &c));
  });
}

/* ---- programs ---- */

bpl_status bpl_program_compile(bpl_runtime* runtime, const void* source, size_t source_size,
                               const bpl_program_options* options, bpl_program** out) {
  return guarded("bpl_program_compile", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    const RuntimeCall in_progress(rt);
    REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    REQUIRE(source != nullptr && source_size > 0, "source is empty (source_size = " + std::to_string(source_size) + ")");
    const bpl_program_options defaults = BPL_PROGRAM_OPTIONS_INIT;
    const bpl_program_options opts = read_input(options, defaults, "options");
    const Plugin& plugin = *rt->plugin;
    auto compiler_of = plugin.api().program_compiler;
    auto compile = plugin.api().program_compile;
    auto artifact_free = plugin.api().artifact_free;
    auto load = plugin.api().program_load;
    const std::string formats = rt->caps.program_formats != nullptr ? rt->caps.program_formats : "";
    if (!compiler_of || !compile || !artifact_free || !load || !plugin.api().program_run ||
        !plugin.api().program_destroy || formats.empty()) {
      throw Error(BPL_ERR_UNSUPPORTED,
                  std::string("backend '") + rt->backend() + "' does not provide programs" + kernels_note(rt));
    }
    REQUIRE(opts.format != nullptr && lists(formats, opts.format),
            "options->format = " + quoted(opts.format) + ": backend '" + rt->backend() + "' accepts: " + formats);
    check_device(rt, opts.device);

    const char* compiler = nullptr;
    bpl_status status = compiler_of(rt->impl, opts.format, &compiler);
    if (status != BPL_OK) return forward("bpl_program_compile", rt, status);
    CacheConfig config = cache_config(rt->backend(), process_environment(), opts.flags != nullptr ? opts.flags : "");
    CompileCache cache(config, std::chrono::milliseconds(rt->launch.timeout_ms));
    std::vector<char> artifact = cache.get_or_compile(
        {compiler, config.compiler_flags, source, source_size}, [&]() -> std::vector<char> {
          void* bytes = nullptr;
          size_t size = 0;
          clear_last_error();
          bpl_status compiled = compile(rt->impl, opts.format, source, source_size, config.flags_for_compiler().c_str(),
                                        &bytes, &size);
          if (compiled != BPL_OK) throw Error(compiled, last_error().empty() ? "compilation failed" : last_error());
          std::vector<char> copy(static_cast<char*>(bytes), static_cast<char*>(bytes) + size);
          artifact_free(bytes);
          return copy;
        });

    bpl_plugin_program* impl = nullptr;
    clear_last_error();
    status = load(rt->impl, opts.format, artifact.data(), artifact.size(), &opts, &impl);
    if (status != BPL_OK) return forward("bpl_program_compile", rt, status);
    auto program = std::make_unique<bpl_program>();
    program->runtime = rt;
    program->impl = impl;
    {
      std::lock_guard<std::mutex> lock(rt->mutex);
      rt->programs.insert(program.get());
    }
    *out = program.release();
    return BPL_OK;
  });
}

bpl_status bpl_program_run(bpl_program* program, const bpl_tensor* inputs, int32_t num_inputs, bpl_tensor* outputs,
                           int32_t num_outputs) {
  return guarded("bpl_program_run", [&] {
    bpl_program* p = check_program(program);
    const RuntimeCall in_progress(p->runtime);
    check_tensors(inputs, num_inputs, "inputs");
    check_tensors(outputs, num_outputs, "outputs");
    bpl_runtime* rt = p->runtime;
    return forward("bpl_program_run", rt,
                   rt->api().program_run(p->impl, inputs, num_inputs, outputs, num_outputs));
  });
}

bpl_status bpl_program_destroy(bpl_program* program) {
  return guarded("bpl_program_destroy", [&] {
    if (program == nullptr) return BPL_OK;
    bpl_program* p = check_program(program);
    const RuntimeCall in_progress(p->runtime);
    bpl_runtime* rt = p->runtime;
    {
      std::lock_guard<std::mutex> lock(rt->mutex);
      rt->programs.erase(p);
    }
    bpl_status status = rt->api().program_destroy(p->impl);
    p->magic = 0;
    delete p;
    return forward("bpl_program_destroy", rt, status);
  });
}


}  // extern "C"
