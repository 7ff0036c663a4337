/* A plugin as it was written for ABI 1.0, compiled against the 1.0 snapshot of the headers
 * (tests/core/abi/1.0): a world of one rank with blocking allreduce and barrier. The current core must load
 * it and run it, and answer the functions added since (ABI 1.1's comm_set_timeout) with UNSUPPORTED. */
#include <backplane/plugin.h>
#include <string.h>

struct bpl_plugin_runtime {
  int unused;
};
struct bpl_plugin_comm {
  int unused;
};

static struct bpl_plugin_runtime the_runtime;
static struct bpl_plugin_comm the_world;

static bpl_status runtime_create(const bpl_launch_info* launch, bpl_plugin_runtime** out) {
  if (launch->world_size != 1) return BPL_ERR_UNSUPPORTED;
  *out = &the_runtime;
  return BPL_OK;
}
static bpl_status runtime_destroy(bpl_plugin_runtime* rt) { (void)rt; return BPL_OK; }
static bpl_status runtime_describe(bpl_plugin_runtime* rt, bpl_plugin_caps* out) {
  (void)rt;
  out->collectives = BPL_BIT(BPL_COLL_ALLREDUCE) | BPL_BIT(BPL_COLL_BARRIER);
  out->dtypes = BPL_BIT(BPL_DTYPE_F32);
  out->reduce_ops = BPL_BIT(BPL_OP_SUM);
  out->details = "abi=1.0 snapshot";
  return BPL_OK;
}
static bpl_status comm_world(bpl_plugin_runtime* rt, bpl_plugin_comm** out) { (void)rt; *out = &the_world; return BPL_OK; }
static bpl_status comm_destroy(bpl_plugin_comm* comm) { (void)comm; return BPL_OK; }
static bpl_status comm_rank_size(bpl_plugin_comm* comm, int32_t* rank, int32_t* size) {
  (void)comm;
  *rank = 0;
  *size = 1;
  return BPL_OK;
}
static bpl_status allreduce(bpl_plugin_comm* comm, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                            bpl_reduce_op op, bpl_plugin_request** req) {
  (void)comm; (void)dtype; (void)op;
  if (req != NULL) return BPL_ERR_UNSUPPORTED;
  if (send != recv && count > 0) memcpy(recv, send, (size_t)count * sizeof(float));
  return BPL_OK;
}
static bpl_status barrier(bpl_plugin_comm* comm, bpl_plugin_request** req) { (void)comm; return req ? BPL_ERR_UNSUPPORTED : BPL_OK; }
static bpl_status request_test(bpl_plugin_request* req, int32_t* done) { (void)req; *done = 1; return BPL_OK; }
static bpl_status request_wait(bpl_plugin_request* req, int64_t timeout_ms) { (void)req; (void)timeout_ms; return BPL_OK; }
static bpl_status request_free(bpl_plugin_request* req) { (void)req; return BPL_OK; }

static const bpl_plugin_api table = {
    .struct_size = sizeof(bpl_plugin_api), .abi_major = BPL_ABI_MAJOR, .abi_minor = BPL_ABI_MINOR,
    .name = "abi-1.0", .version = "1.0.0", .runtime_create = runtime_create, .runtime_destroy = runtime_destroy,
    .runtime_describe = runtime_describe, .comm_world = comm_world, .comm_destroy = comm_destroy,
    .comm_rank_size = comm_rank_size, .allreduce = allreduce, .barrier = barrier, .request_test = request_test,
    .request_wait = request_wait, .request_free = request_free};

__attribute__((visibility("default"))) bpl_status bpl_plugin_open_v1(const bpl_host_api* host,
                                                                     const bpl_plugin_api** out) {
  (void)host;
  *out = &table;
  return BPL_OK;
}
