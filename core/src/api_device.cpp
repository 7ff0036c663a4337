// The C API of devices: counts, properties, memory and copies.
#include <string>

#include "backplane/backplane.h"
#include "backplane/plugin.h"
#include "error.h"
#include "handles.h"
#include "operation.h"
#include "validation.h"

using namespace backplane;

extern "C" {

/* ---- device ---- */

bpl_status bpl_device_count(const bpl_runtime* runtime, int32_t* count) {
  return guarded("bpl_device_count", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    const RuntimeCall in_progress(rt);
    REQUIRE(count != nullptr, "count is NULL");
    auto fn = require_device_fn(rt, rt->api().device_count, "device_count");
    return forward("bpl_device_count", rt, fn(rt->impl, count));
  });
}

bpl_status bpl_device_get_properties(const bpl_runtime* runtime, int32_t device, bpl_device_properties* out) {
  return guarded("bpl_device_get_properties", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    const RuntimeCall in_progress(rt);
    REQUIRE(out != nullptr, "out is NULL");
    check_struct_size(out->struct_size, "out");
    auto fn = require_device_fn(rt, rt->api().device_properties, "device_properties");
    check_device(rt, device);
    bpl_device_properties props{};
    props.struct_size = sizeof(props);
    bpl_status status = forward("bpl_device_get_properties", rt, fn(rt->impl, device, &props));
    if (status == BPL_OK) write_output(props, out, "out");
    return status;
  });
}

bpl_status bpl_malloc(bpl_runtime* runtime, int32_t device, size_t bytes, void** ptr) {
  return guarded("bpl_malloc", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    const RuntimeCall in_progress(rt);
    REQUIRE(ptr != nullptr, "ptr is NULL");
    *ptr = nullptr;
    auto fn = require_device_fn(rt, rt->api().mem_alloc, "malloc");
    check_device(rt, device);
    REQUIRE(bytes <= static_cast<size_t>(std::numeric_limits<int64_t>::max()),
            "bytes = " + std::to_string(bytes) + " exceeds the address space");
    if (bytes == 0) return BPL_OK;
    return forward("bpl_malloc", rt, fn(rt->impl, device, bytes, ptr));
  });
}

bpl_status bpl_free(bpl_runtime* runtime, void* ptr) {
  return guarded("bpl_free", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    const RuntimeCall in_progress(rt);
    if (ptr == nullptr) return BPL_OK;
    auto fn = require_device_fn(rt, rt->api().mem_free, "free");
    return forward("bpl_free", rt, fn(rt->impl, ptr));
  });
}

bpl_status bpl_memcpy(bpl_runtime* runtime, void* dst, const void* src, size_t bytes, bpl_memcpy_kind kind) {
  return guarded("bpl_memcpy", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    const RuntimeCall in_progress(rt);
    REQUIRE(kind >= BPL_MEMCPY_HOST_TO_HOST && kind <= BPL_MEMCPY_DEVICE_TO_DEVICE,
            "kind = " + std::to_string(kind) + ": expected BPL_MEMCPY_HOST_TO_HOST .. BPL_MEMCPY_DEVICE_TO_DEVICE");
    check_buffer(dst, bytes, "dst");
    check_buffer(src, bytes, "src");
    REQUIRE(!overlap(dst, bytes, src, bytes), "dst and src overlap");
    if (bytes == 0) return BPL_OK;
    auto fn = require_device_fn(rt, rt->api().mem_copy, "memcpy");
    return forward("bpl_memcpy", rt, fn(rt->impl, dst, src, bytes, kind));
  });
}

bpl_status bpl_synchronize(bpl_runtime* runtime, int32_t device) {
  return guarded("bpl_synchronize", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    const RuntimeCall in_progress(rt);
    check_device(rt, device);
    if (rt->api().synchronize == nullptr) return BPL_OK;  // nothing queued on a synchronous backend
    return forward("bpl_synchronize", rt, rt->api().synchronize(rt->impl, device));
  });
}


}  // extern "C"
