/* Deliberately broken plugins for the loader's negative tests, one per TEST_PLUGIN_* variant.
 * Built only for tests; each misbehaves in exactly one way the core must refuse. */
#include <backplane/plugin.h>
#include <stddef.h>

#if defined(TEST_PLUGIN_NO_ENTRY)
/* A shared object that is not a plugin: it exports something else. */
__attribute__((visibility("default"))) int not_a_plugin(void) { return 42; }
#else

static bpl_status create(const bpl_launch_info* launch, bpl_plugin_runtime** out) {
  (void)launch;
  *out = NULL;
  return BPL_ERR_INTERNAL;
}
static bpl_status destroy(bpl_plugin_runtime* rt) { (void)rt; return BPL_OK; }

static bpl_plugin_api table __attribute__((unused)) = {
    .struct_size = sizeof(bpl_plugin_api), .abi_major = BPL_ABI_MAJOR, .abi_minor = BPL_ABI_MINOR,
    .name = "test", .version = "0.0.1", .runtime_create = create, .runtime_destroy = destroy};

__attribute__((visibility("default"))) bpl_status bpl_plugin_open_v1(const bpl_host_api* host,
                                                                     const bpl_plugin_api** out) {
#if defined(TEST_PLUGIN_WRONG_ABI)
  (void)host;
  table.abi_major = BPL_ABI_MAJOR + 1;
  table.abi_minor = 3;
  *out = &table;
  return BPL_OK;
#elif defined(TEST_PLUGIN_OPEN_FAILS)
  host->set_error("test: the runtime library libfake.so.1 is not installed");
  *out = NULL;
  return BPL_ERR_UNAVAILABLE;
#elif defined(TEST_PLUGIN_BAD_SIZE)
  (void)host;
  table.struct_size = 8;
  *out = &table;
  return BPL_OK;
#elif defined(TEST_PLUGIN_MISSING_FUNCTION)
  (void)host;
  *out = &table; /* comm_world and the request functions are NULL */
  return BPL_OK;
#elif defined(TEST_PLUGIN_UNRESOLVED_SYMBOL)
  /* Linked against nothing that defines it: a loader binding lazily would find out only here. */
  extern int bpl_test_symbol_no_library_defines(void);
  (void)host;
  *out = &table;
  return bpl_test_symbol_no_library_defines() == 0 ? BPL_OK : BPL_ERR_INTERNAL;
#else
#error "define one TEST_PLUGIN_* variant"
#endif
}
#endif
