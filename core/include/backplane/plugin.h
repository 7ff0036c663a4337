/*
 * plugin.h — the plugin ABI of backplane (ABI 1.10; what each minor added: core/ABI_CHANGELOG.md):
 * what a backend plugin exports and what the core passes in. A plugin includes only this header (and
 * backplane.h, which it includes).
 *
 * A plugin is a shared object that exports exactly one symbol, bpl_plugin_open_v1. The core calls it
 * once per load with the host API and receives a static function table. The table starts with
 * struct_size, the plugin's ABI version, name and version; the core accepts a plugin of the same ABI
 * major and any minor, and refuses others with BPL_ERR_ABI_MISMATCH.
 *
 * Contract for every function in the table:
 *  - it never lets a C++ exception, abort() or longjmp cross the boundary; on failure it returns a
 *    bpl_status and calls host->set_error with a message (the core prefixes nothing: name the backend);
 *  - the core validates handles and arguments first (counts >= 0 and in range, known dtype/op supported
 *    per the plugin's capabilities, root/peer in range, non-NULL buffers for non-zero counts, in-place
 *    layout as documented in backplane.h), so the plugin may trust them;
 *  - functions marked "optional" may be NULL; the core then answers BPL_ERR_UNSUPPORTED.
 */
#ifndef BACKPLANE_PLUGIN_H
#define BACKPLANE_PLUGIN_H

#include "backplane/backplane.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The plugin's handles: opaque to the core, defined by each plugin. */
typedef struct bpl_plugin_runtime bpl_plugin_runtime;
typedef struct bpl_plugin_comm bpl_plugin_comm;
typedef struct bpl_plugin_request bpl_plugin_request;
typedef struct bpl_plugin_program bpl_plugin_program;

/* Log levels (BPL_LOG_ERROR ... BPL_LOG_DEBUG) are backplane.h's. */

/* Where this process sits in the job, resolved by the core from options and the launch environment
 * (see bpl_init_options). Strings are owned by the core and valid until runtime_destroy returns. */
typedef struct bpl_launch_info {
  size_t struct_size;
  int32_t rank;
  int32_t world_size;
  int32_t local_rank;
  int32_t local_world_size;
  const char* master_addr; /* "" if unknown */
  const char* launcher;    /* "options", "torchrun", "openmpi", "slurm", "none" */
  int32_t master_port;     /* -1 if unknown */
  int32_t reserved0;       /* zero */
  int64_t timeout_ms;      /* > 0: the bound of every wait, rendezvous included */
  /* ABI 1.2 (read only when struct_size covers it): the caller's store (bpl_init_options.store), valid
   * until runtime_destroy returns; NULL: meet at master_addr:master_port. */
  const bpl_store* store;
  /* ABI 1.4 (read only when struct_size covers it): the caller's own communicator for the world
   * (bpl_init_options.native_comm), valid during runtime_create; NULL otherwise. Given one, rank,
   * world_size, local_rank and local_world_size are -1 (the communicator's own are the world's), and a
   * plugin that cannot take one fails with INVALID_ARGUMENT. */
  const void* native_comm;
} bpl_launch_info;

/* ABI 1.10: an operation as the core numbered and described it, the same on every rank that makes the
 * same call, so that every plugin tags its messages and explains a stall alike. Collectives are
 * numbered 1, 2, … on their communicator (the core's own exchanges included: the finalize barrier,
 * the split that finds the local ranks of a caller's communicator); sends and receives have sequence
 * 0. -1 marks a field the operation does not have. */
typedef struct bpl_operation_identity {
  size_t struct_size;
  uint64_t sequence;
  uint64_t hash;     /* of the sequence and every field below but pairing: ranks whose calls differ get
                        different hashes (a plugin's message tags derive from it) */
  int32_t kind;      /* bpl_collective, or BPL_OPERATION_FINALIZE, BPL_OPERATION_FINGERPRINT_CHECK */
  int32_t dtype;     /* bpl_dtype */
  int64_t count;     /* a v-collective's total (allgatherv) or -1 (alltoallv) */
  int32_t root;
  int32_t reduce_op; /* bpl_reduce_op */
  /* allgatherv and alltoallv: this rank's share of a sum over the ranks that is 0 exactly when each
   * rank's count for a peer is that peer's count for it; 0 elsewhere. */
  int64_t pairing;
} bpl_operation_identity;

/* bpl_operation_identity.kind of the core's own exchanges, which are no collectives of the ABI: the
 * barrier bpl_finalize makes, and BPL_DEBUG=detail's allgather of fingerprints (8 int64 per rank) before
 * collective `sequence`, which it shares. */
#define BPL_OPERATION_FINALIZE 1000
#define BPL_OPERATION_FINGERPRINT_CHECK 1001

/* What the core offers a plugin. Valid from bpl_plugin_open_v1 until the plugin is unloaded. */
typedef struct bpl_host_api {
  size_t struct_size;
  int32_t abi_major;
  int32_t abi_minor;
  int32_t log_level; /* BPL_LOG_*: messages above it are dropped; check before formatting */
  int32_t reserved0; /* zero */
  /* Writes a log line (the core adds the time, rank and `source`). Thread-safe. */
  void (*log)(int32_t level, const char* source, const char* message);
  /* getenv that returns NULL for path-like variables in setuid/secure-execution processes. */
  const char* (*get_env)(const char* name);
  /* Sets the calling thread's bpl_last_error() message (copied). */
  void (*set_error)(const char* message);
  /* ABI 1.10: the operation the calling thread is starting, for the duration of the plugin call that
   * starts it (a collective, send or recv, comm_split, and runtime_destroy's finalize barrier); NULL
   * in any other call. A plugin that queues the operation copies it. */
  const bpl_operation_identity* (*current_operation)(void);
} bpl_host_api;

/* What a plugin reports about itself at run time. Strings owned by the plugin runtime. */
typedef struct bpl_plugin_caps {
  size_t struct_size;
  uint64_t collectives; /* BPL_BIT(BPL_COLL_*) */
  uint32_t dtypes;      /* BPL_BIT(BPL_DTYPE_*) */
  uint32_t reduce_ops;  /* BPL_BIT(BPL_OP_*) */
  const char* details;  /* "key=value; …", shown by bpl-info */
  uint32_t kernels;     /* BPL_BIT(BPL_KERNEL_*) */
  int32_t reserved0;    /* zero */
  const char* program_formats; /* space-separated, e.g. "torchscript"; "" if none */
} bpl_plugin_caps;

typedef struct bpl_plugin_api {
  size_t struct_size; /* sizeof(bpl_plugin_api) as the plugin was compiled */
  int32_t abi_major;  /* BPL_ABI_MAJOR */
  int32_t abi_minor;  /* BPL_ABI_MINOR */
  const char* name;   /* "gloo", "mpi", "neuron", … */
  const char* version;

  /* --- runtime (required) --- */
  /* Joins the job described by `launch`; *out is owned by the core until runtime_destroy. */
  bpl_status (*runtime_create)(const bpl_launch_info* launch, bpl_plugin_runtime** out);
  /* Leaves the job; every communicator but the world one has been destroyed. */
  bpl_status (*runtime_destroy)(bpl_plugin_runtime* rt);
  bpl_status (*runtime_describe)(bpl_plugin_runtime* rt, bpl_plugin_caps* out);

  /* --- device (optional) --- */
  bpl_status (*device_count)(bpl_plugin_runtime* rt, int32_t* count);
  bpl_status (*device_properties)(bpl_plugin_runtime* rt, int32_t device, bpl_device_properties* out);
  bpl_status (*mem_alloc)(bpl_plugin_runtime* rt, int32_t device, size_t bytes, void** ptr);
  bpl_status (*mem_free)(bpl_plugin_runtime* rt, void* ptr);
  bpl_status (*mem_copy)(bpl_plugin_runtime* rt, void* dst, const void* src, size_t bytes,
                         bpl_memcpy_kind kind);
  bpl_status (*synchronize)(bpl_plugin_runtime* rt, int32_t device);

  /* --- communicators (required but comm_split) --- */
  /* The world communicator, owned by the plugin runtime (the core never destroys it). */
  bpl_status (*comm_world)(bpl_plugin_runtime* rt, bpl_plugin_comm** out);
  /* As bpl_comm_split; *out owned by the core until comm_destroy. Optional. */
  bpl_status (*comm_split)(bpl_plugin_comm* parent, int32_t color, int32_t key, bpl_plugin_comm** out);
  bpl_status (*comm_destroy)(bpl_plugin_comm* comm);
  bpl_status (*comm_rank_size)(bpl_plugin_comm* comm, int32_t* rank, int32_t* size);

  /* --- collectives (optional; as in backplane.h, counts already validated) --- */
  /* `req` NULL: complete before returning. Otherwise return at once with *req in flight, owned by the
   * core until request_free. */
  bpl_status (*allreduce)(bpl_plugin_comm* comm, const void* send, void* recv, int64_t count,
                          bpl_dtype dtype, bpl_reduce_op op, bpl_plugin_request** req);
  bpl_status (*broadcast)(bpl_plugin_comm* comm, void* buf, int64_t count, bpl_dtype dtype, int32_t root,
                          bpl_plugin_request** req);
  bpl_status (*reduce)(bpl_plugin_comm* comm, const void* send, void* recv, int64_t count,
                       bpl_dtype dtype, bpl_reduce_op op, int32_t root, bpl_plugin_request** req);
  bpl_status (*allgather)(bpl_plugin_comm* comm, const void* send, void* recv, int64_t count,
                          bpl_dtype dtype, bpl_plugin_request** req);
  bpl_status (*reduce_scatter)(bpl_plugin_comm* comm, const void* send, void* recv, int64_t recvcount,
                               bpl_dtype dtype, bpl_reduce_op op, bpl_plugin_request** req);
  bpl_status (*alltoall)(bpl_plugin_comm* comm, const void* send, void* recv, int64_t count,
                         bpl_dtype dtype, bpl_plugin_request** req);
  bpl_status (*barrier)(bpl_plugin_comm* comm, bpl_plugin_request** req);
  bpl_status (*send)(bpl_plugin_comm* comm, const void* buf, int64_t count, bpl_dtype dtype, int32_t peer,
                     int32_t tag, bpl_plugin_request** req);
  bpl_status (*recv)(bpl_plugin_comm* comm, void* buf, int64_t count, bpl_dtype dtype, int32_t peer,
                     int32_t tag, bpl_plugin_request** req);

  /* --- requests (required if any collective is provided) --- */
  bpl_status (*request_test)(bpl_plugin_request* req, int32_t* done);
  /* timeout_ms > 0 always (the core resolves BPL_TIMEOUT_DEFAULT). */
  bpl_status (*request_wait)(bpl_plugin_request* req, int64_t timeout_ms);
  /* Waits for an in-flight operation to end (bounded by the communicator's timeout), then frees. */
  bpl_status (*request_free)(bpl_plugin_request* req);

  /* --- kernels (optional; arguments validated by the core) --- */
  bpl_status (*gemm)(bpl_plugin_runtime* rt, const bpl_gemm_args* args);
  /* kernel: BPL_KERNEL_ADD, BPL_KERNEL_SCALE or BPL_KERNEL_AXPBY */
  bpl_status (*elementwise)(bpl_plugin_runtime* rt, bpl_kernel kernel, const bpl_elementwise_args* args);
  bpl_status (*cast)(bpl_plugin_runtime* rt, const bpl_cast_args* args);

  /* --- programs (optional). The core runs program_compile only on a compile-cache miss and hands
   *     program_load either the fresh artifact or the cached one. --- */
  /* Identifies the compiler of `format` for the cache key, e.g. "torchscript-1.13.1"; static storage. */
  bpl_status (*program_compiler)(bpl_plugin_runtime* rt, const char* format, const char** compiler);
  /* Compiles source into an artifact the plugin allocates; released with artifact_free. */
  bpl_status (*program_compile)(bpl_plugin_runtime* rt, const char* format, const void* source, size_t source_size,
                                const char* flags, void** artifact, size_t* artifact_size);
  void (*artifact_free)(void* artifact);
  /* Loads an artifact (copied as needed: the buffer is released after the call). */
  bpl_status (*program_load)(bpl_plugin_runtime* rt, const char* format, const void* artifact, size_t artifact_size,
                             const bpl_program_options* options, bpl_plugin_program** out);
  bpl_status (*program_run)(bpl_plugin_program* program, const bpl_tensor* inputs, int32_t num_inputs,
                            bpl_tensor* outputs, int32_t num_outputs);
  bpl_status (*program_destroy)(bpl_plugin_program* program);

  /* --- ABI 1.1 (optional; the core reads them only from a table whose struct_size covers them) --- */
  /* Bounds the operations started on `comm` from now on (timeout_ms > 0). A comm_split child starts
   * with its parent's current timeout. */
  bpl_status (*comm_set_timeout)(bpl_plugin_comm* comm, int64_t timeout_ms);
  /* The core has marked `comm` aborted (no new operation reaches the plugin). Make the operations in
   * flight end soon, as errors, and let the peers know where the backend can. Must not block; may run
   * on another thread than one blocked in an operation of `comm`. A plugin that provides it must also
   * end a request_wait on `comm` when it runs: the core then hands a wait as long as the communicator's
   * timeout to request_wait whole (it slices the waits of other plugins to check for an abort). */
  bpl_status (*comm_abort)(bpl_plugin_comm* comm);

  /* --- ABI 1.2 (optional, as above) --- */
  /* As bpl_comm_create_from_store: only the members call it, each with its rank in the new
   * communicator; `store` (validated by the core) stays valid until comm_destroy. `timeout_ms` bounds
   * the call and is the new communicator's timeout. *out owned by the core until comm_destroy. */
  bpl_status (*comm_create_from_store)(bpl_plugin_runtime* rt, const bpl_store* store, int32_t rank, int32_t size,
                                       int64_t timeout_ms, bpl_plugin_comm** out);

  /* --- ABI 1.3 (optional, as above; arguments validated by the core). The arrays of counts and
   *     displacements are valid only during the call: a plugin copies what it needs later. --- */
  bpl_status (*gather)(bpl_plugin_comm* comm, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                       int32_t root, bpl_plugin_request** req);
  bpl_status (*scatter)(bpl_plugin_comm* comm, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                        int32_t root, bpl_plugin_request** req);
  bpl_status (*allgatherv)(bpl_plugin_comm* comm, const void* send, int64_t sendcount, void* recv,
                           const int64_t* recvcounts, const int64_t* displs, bpl_dtype dtype, bpl_plugin_request** req);
  bpl_status (*alltoallv)(bpl_plugin_comm* comm, const void* send, const int64_t* sendcounts, const int64_t* sdispls,
                          void* recv, const int64_t* recvcounts, const int64_t* rdispls, bpl_dtype dtype,
                          bpl_plugin_request** req);
  /* How `comm` moves an operation `op` (BPL_COLL_*) of `bytes`, in a few words that BPL_TRACE records:
   * "shared memory", "shared memory, single copy", "tcp", "hierarchical", "mpi". *path is static. */
  bpl_status (*comm_path)(bpl_plugin_comm* comm, bpl_collective op, uint64_t bytes, const char** path);

  /* --- ABI 1.6 (optional, as above) --- */
  /* As bpl_recv_any: *source (never NULL) is written before the recv reports done, by return or by
   * its request. */
  bpl_status (*recv_any)(bpl_plugin_comm* comm, void* buf, int64_t count, bpl_dtype dtype, int32_t tag,
                         int32_t* source, bpl_plugin_request** req);

  /* --- ABI 1.8 (optional, as above): fault tolerance. Each runs on a communicator that failed, was
   *     aborted or revoked too. --- */
  /* The core has marked `comm` revoked here: end its operations in flight on every member with
   * BPL_ERR_REVOKED naming this rank, and make the members' later ones fail so. Must not block. */
  bpl_status (*comm_revoke)(bpl_plugin_comm* comm);
  /* As bpl_comm_agree; `failed` (never NULL) holds the communicator's size; bounded by its timeout. */
  bpl_status (*comm_agree)(bpl_plugin_comm* comm, int32_t* flags, int32_t* failed, int32_t* num_failed);
  /* As bpl_comm_shrink (`failed` as above); *out owned by the core until comm_destroy. */
  bpl_status (*comm_shrink)(bpl_plugin_comm* comm, int32_t* failed, int32_t* num_failed, bpl_plugin_comm** out);
  /* As bpl_comm_grow (joiners >= 1) and bpl_comm_join (timeout_ms > 0 bounds it and is the new
   * communicator's); *out owned by the core until comm_destroy. */
  bpl_status (*comm_grow)(bpl_plugin_comm* comm, int32_t joiners, bpl_plugin_comm** out);
  bpl_status (*comm_join)(bpl_plugin_runtime* rt, int64_t timeout_ms, bpl_plugin_comm** out);
} bpl_plugin_api;

/* The table's entries that start one operation on a communicator (each takes the communicator first and
 * a request last: the OPERATION rows of BPL_OPERATION_KINDS), in table order: what a plugin written in
 * C++ fills from its communicator's members of the same names (plugins/common/plugin_entry.h). A macro:
 * no symbol, no layout. */
#define BPL_FOR_EACH_PLUGIN_OPERATION_ENTRY(X) BPL_OPERATION_KINDS(BPL_PLUGIN_ENTRY_ROW_, X)
#define BPL_PLUGIN_ENTRY_ROW_(X, code, name, minor, form) BPL_PLUGIN_ENTRY_ROW_##form(X, name)
#define BPL_PLUGIN_ENTRY_ROW_OPERATION(X, name) X(name)
#define BPL_PLUGIN_ENTRY_ROW_COMM(X, name)

/* The one symbol a plugin exports. `host` stays valid while the plugin is loaded; *out must point to
 * storage that lives as long (a static table). Return BPL_OK, or an error after host->set_error (for
 * example BPL_ERR_UNAVAILABLE when the backend's runtime library is absent). */
#define BPL_PLUGIN_ENTRY_SYMBOL "bpl_plugin_open_v1"
typedef bpl_status (*bpl_plugin_open_fn)(const bpl_host_api* host, const bpl_plugin_api** out);
BPL_API bpl_status bpl_plugin_open_v1(const bpl_host_api* host, const bpl_plugin_api** out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BACKPLANE_PLUGIN_H */
