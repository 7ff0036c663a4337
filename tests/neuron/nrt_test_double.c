/* A TEST DOUBLE of the Neuron Runtime (libnrt.so.1), built only for backplane's tests: the documented
 * entry points the Neuron plugin resolves, with trivial behaviour. It proves how the plugin finds, loads
 * and checks a runtime; it is not the runtime and talks to no hardware. Built as NRT_TEST_DOUBLE_INCOMPLETE
 * it lacks nrt_barrier, like a runtime too old for the plugin. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef struct {
  uint64_t rt_major, rt_minor, rt_patch, rt_maintenance;
  char rt_detail[128];
  char git_hash[64];
} nrt_version_t;

EXPORT int nrt_get_version(nrt_version_t* version, size_t size) {
  if (size < 160) return 2; /* NRT_INVALID, as the runtime answers a struct that is too small */
  memset(version, 0, size < sizeof(*version) ? size : sizeof(*version));
  version->rt_major = 2;
  version->rt_minor = 99;
  strcpy(version->rt_detail, "backplane test double");
  return 0;
}
EXPORT int nrt_init(int framework, const char* fw_version, const char* fal_version) {
  (void)framework, (void)fw_version, (void)fal_version;
  return 0;
}
EXPORT void nrt_close(void) {}
EXPORT int nrt_get_total_vnc_count(uint32_t* count) { *count = 2; return 0; }
EXPORT int nrt_get_visible_vnc_count(uint32_t* count) { *count = 2; return 0; }
EXPORT int nrt_load(const void* neff, size_t size, int32_t vnc, int32_t count, void** model) {
  (void)neff, (void)size, (void)vnc, (void)count, (void)model;
  return 2;
}
EXPORT int nrt_unload(void* model) { (void)model; return 0; }
EXPORT int nrt_allocate_tensor_set(void** set) { (void)set; return 4; }
EXPORT void nrt_destroy_tensor_set(void** set) { (void)set; }
EXPORT int nrt_add_tensor_to_tensor_set(void* set, const char* name, void* tensor) {
  (void)set, (void)name, (void)tensor;
  return 2;
}
EXPORT int nrt_execute(void* model, const void* in, void* out) { (void)model, (void)in, (void)out; return 2; }
EXPORT int nrt_tensor_allocate(int placement, int vnc, size_t size, const char* name, void** tensor) {
  (void)placement, (void)vnc, (void)size, (void)name, (void)tensor;
  return 4;
}
EXPORT void nrt_tensor_free(void** tensor) { (void)tensor; }
EXPORT int nrt_tensor_read(const void* t, void* buf, size_t off, size_t size) { (void)t, (void)buf, (void)off, (void)size; return 2; }
EXPORT int nrt_tensor_write(void* t, const void* buf, size_t off, size_t size) { (void)t, (void)buf, (void)off, (void)size; return 2; }
EXPORT int nrt_tensor_copy(const void* s, size_t so, void* d, size_t dof, size_t size) {
  (void)s, (void)so, (void)d, (void)dof, (void)size;
  return 2;
}
EXPORT size_t nrt_tensor_get_size(const void* t) { (void)t; return 0; }
#ifndef NRT_TEST_DOUBLE_INCOMPLETE
EXPORT int nrt_barrier(int32_t vnc, uint32_t id, uint32_t count) { (void)vnc, (void)id, (void)count; return 0; }
#endif
