/*
 * backplane.h — the embedder's C API of backplane (ABI 1.9; what each minor version added is in
 * core/ABI_CHANGELOG.md).
 *
 * One program written against this header runs on any backend plugin (Gloo CPU mode, MPI, Neuron);
 * the backend is chosen at run time (see bpl_init). The header is C99 and compiles as C and C++. It
 * declares the types, statuses and the runtime, and includes the rest by interface: communication.h
 * (communicators, collectives, point to point, requests) and device.h (device memory, kernels,
 * programs).
 *
 * ABI rules (docs/abi.md):
 *  - Every function returns a bpl_status; BPL_OK is 0. On failure, bpl_last_error() returns a message
 *    for the calling thread that names the backend and the bad value.
 *  - Every in/out struct starts with `size_t struct_size` and has an *_INIT initializer. Structs only
 *    grow at the end. A callee given a smaller struct (an older caller) uses defaults for the missing
 *    input fields and leaves missing output fields unwritten.
 *  - Handles are opaque. Each function documents who owns what it returns. Destroy functions accept NULL.
 *  - Collectives take `bpl_request** req`: NULL means blocking; otherwise the call returns at once and
 *    *req must be completed with bpl_request_wait or bpl_request_test and released with bpl_request_free.
 *    Every wait has a timeout; no call waits forever.
 */
#ifndef BACKPLANE_BACKPLANE_H
#define BACKPLANE_BACKPLANE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BPL_ABI_MAJOR 1
#define BPL_ABI_MINOR 10

#if defined(__GNUC__)
#define BPL_API __attribute__((visibility("default")))
#else
#define BPL_API
#endif

/* ------------------------------------------------------------------------------------------------ */
/* Status codes (fixed numeric values).                                                             */

typedef int32_t bpl_status;
#define BPL_OK 0
#define BPL_ERR_INVALID_ARGUMENT 1 /* a parameter is NULL, out of range or inconsistent */
#define BPL_ERR_NOT_FOUND 2        /* a backend, plugin file or symbol does not exist */
#define BPL_ERR_UNSUPPORTED 3      /* the backend does not provide this operation, dtype or op */
#define BPL_ERR_UNAVAILABLE 4      /* the backend's runtime or hardware is absent */
#define BPL_ERR_ABI_MISMATCH 5     /* a plugin was built for another ABI major */
#define BPL_ERR_TIMEOUT 6          /* a wait ran past its timeout */
#define BPL_ERR_REMOTE 7           /* a peer failed or went away */
#define BPL_ERR_MISMATCH 8         /* ranks disagree (op, count, dtype, root, world size) */
#define BPL_ERR_OUT_OF_MEMORY 9
#define BPL_ERR_IO 10 /* a file or socket operation failed */
#define BPL_ERR_INTERNAL 11
#define BPL_ERR_ABORTED 12 /* ABI 1.1: the communicator was aborted (bpl_comm_abort) */
#define BPL_ERR_REVOKED 13 /* ABI 1.8: a member revoked the communicator (bpl_comm_revoke) */

/* The message for the last failure on the calling thread ("" if none). Owned by the library; valid
 * until the next backplane call on this thread. Never NULL. */
BPL_API const char* bpl_last_error(void);

/* The symbolic name of a status ("BPL_ERR_TIMEOUT"), or "BPL_ERR_UNKNOWN". Static storage. */
BPL_API const char* bpl_status_name(bpl_status status);

/* The ABI version of the loaded libbackplane (may be newer than BPL_ABI_MINOR of the caller). */
BPL_API void bpl_abi_version(int32_t* major, int32_t* minor);

/* ------------------------------------------------------------------------------------------------ */
/* Element types, reduce operations and operation kinds.                                            */

typedef int32_t bpl_dtype;
#define BPL_DTYPE_F32 1
#define BPL_DTYPE_F64 2
#define BPL_DTYPE_F16 3
#define BPL_DTYPE_BF16 4
#define BPL_DTYPE_I8 5
#define BPL_DTYPE_U8 6
#define BPL_DTYPE_I32 7
#define BPL_DTYPE_I64 8

/* Size in bytes of one element of `dtype`, or 0 for an unknown dtype. */
BPL_API size_t bpl_dtype_size(bpl_dtype dtype);
/* "f32", "bf16", …, or "unknown". Static storage. */
BPL_API const char* bpl_dtype_name(bpl_dtype dtype);

/* Reductions. f16/bf16 accumulate in f32 and round once; integer SUM/PROD wrap around (two's
 * complement); integer AVG is the exact sum divided by the group size, truncated toward zero. The
 * bitwise ones (ABI 1.9) take integer dtypes only (INVALID_ARGUMENT otherwise). */
typedef int32_t bpl_reduce_op;
#define BPL_OP_SUM 1
#define BPL_OP_PROD 2
#define BPL_OP_MIN 3
#define BPL_OP_MAX 4
#define BPL_OP_AVG 5
#define BPL_OP_BAND 6 /* ABI 1.9: bitwise and */
#define BPL_OP_BOR 7  /* ABI 1.9: bitwise or */
#define BPL_OP_BXOR 8 /* ABI 1.9: bitwise exclusive or */

/* "sum", "prod", …, or "unknown". Static storage. */
BPL_API const char* bpl_reduce_op_name(bpl_reduce_op op);

/* Operation kinds, as bit positions in bpl_runtime_info.collectives. */
typedef int32_t bpl_collective;
#define BPL_COLL_ALLREDUCE 1
#define BPL_COLL_BROADCAST 2
#define BPL_COLL_REDUCE 3
#define BPL_COLL_ALLGATHER 4
#define BPL_COLL_REDUCE_SCATTER 5
#define BPL_COLL_ALLTOALL 6
#define BPL_COLL_BARRIER 7
#define BPL_COLL_SEND 8
#define BPL_COLL_RECV 9
#define BPL_COLL_COMM_SPLIT 10
#define BPL_COLL_GATHER 11     /* ABI 1.3 */
#define BPL_COLL_SCATTER 12    /* ABI 1.3 */
#define BPL_COLL_ALLGATHERV 13 /* ABI 1.3 */
#define BPL_COLL_ALLTOALLV 14  /* ABI 1.3 */
#define BPL_COLL_RECV_ANY 15   /* ABI 1.6 */

/* Every operation kind above, once, in order, one row each: its BPL_COLL_ value, its name (the text of
 * bpl_collective_name, and its entry in the plugins' table, plugin.h), the ABI minor version that added
 * it, and its entry's form (OPERATION: starts an operation on a communicator; COMM: makes one). Every
 * list of kinds is derived from it, as BPL_FOR_EACH_COLLECTIVE below; a new kind is one more row here
 * (docs/adding-a-collective.md). R(X, code, name, minor, form) is called for each row with the `X`
 * given. A macro only: no symbol. */
#define BPL_OPERATION_KINDS(R, X)                        \
  R(X, BPL_COLL_ALLREDUCE, allreduce, 0, OPERATION)      \
  R(X, BPL_COLL_BROADCAST, broadcast, 0, OPERATION)      \
  R(X, BPL_COLL_REDUCE, reduce, 0, OPERATION)            \
  R(X, BPL_COLL_ALLGATHER, allgather, 0, OPERATION)      \
  R(X, BPL_COLL_REDUCE_SCATTER, reduce_scatter, 0, OPERATION) \
  R(X, BPL_COLL_ALLTOALL, alltoall, 0, OPERATION)        \
  R(X, BPL_COLL_BARRIER, barrier, 0, OPERATION)          \
  R(X, BPL_COLL_SEND, send, 0, OPERATION)                \
  R(X, BPL_COLL_RECV, recv, 0, OPERATION)                \
  R(X, BPL_COLL_COMM_SPLIT, comm_split, 0, COMM)         \
  R(X, BPL_COLL_GATHER, gather, 3, OPERATION)            \
  R(X, BPL_COLL_SCATTER, scatter, 3, OPERATION)          \
  R(X, BPL_COLL_ALLGATHERV, allgatherv, 3, OPERATION)    \
  R(X, BPL_COLL_ALLTOALLV, alltoallv, 3, OPERATION)      \
  R(X, BPL_COLL_RECV_ANY, recv_any, 6, OPERATION)

/* Every kind, as X(code, name, minor) with its name as a string ("allreduce"): the names, capability
 * masks, the benchmark's operations and the test suites' rows. */
#define BPL_COLLECTIVE_ROW_(X, code, name, minor, form) X(code, #name, minor)
#define BPL_FOR_EACH_COLLECTIVE(X) BPL_OPERATION_KINDS(BPL_COLLECTIVE_ROW_, X)

/* "allreduce", "comm_split", …, or "unknown". Static storage. */
BPL_API const char* bpl_collective_name(bpl_collective op);

/* Bit of a dtype, reduce op or collective in the capability masks of bpl_runtime_info. */
#define BPL_BIT(value) (1ull << (unsigned)(value))

/* ------------------------------------------------------------------------------------------------ */
/* Opaque handles.                                                                                  */

typedef struct bpl_runtime bpl_runtime; /* a loaded backend, one per bpl_init */
typedef struct bpl_comm bpl_comm;       /* a communicator: an ordered group of ranks */
typedef struct bpl_request bpl_request; /* an operation in flight */

/* ------------------------------------------------------------------------------------------------ */
/* Runtime: selection, initialisation and description.                                             */

/* A key-value store the caller already has (ABI 1.2): torch.distributed's c10d::Store, a launcher's or a
 * scheduler's service. Given to bpl_init, the ranks meet through it instead of at
 * MASTER_ADDR:MASTER_PORT; given to bpl_comm_create_from_store, the members of a new communicator do.
 * backplane puts its keys under prefixes of its own, so one store can serve several runtimes and
 * communicators. The callbacks may run on any thread of backplane, also at the same time, for as long as
 * the runtime (bpl_init) or the communicator (bpl_comm_create_from_store) lives. Each returns BPL_OK or
 * a status (BPL_ERR_TIMEOUT when a wait ran out; BPL_ERR_IO, BPL_ERR_REMOTE when the store cannot be
 * reached); backplane adds the callback's last_error() text, if given, to its own message. */
typedef struct bpl_store {
  size_t struct_size; /* sizeof(bpl_store) */
  void* context;      /* handed to every callback */
  /* Sets `key` to the `size` bytes at `value` (NULL when size is 0: an empty value). */
  bpl_status (*set)(void* context, const char* key, const void* value, size_t size);
  /* Waits up to timeout_ms (> 0) for `key` to be set, copies up to `capacity` bytes of its value to
   * `value` (NULL when capacity is 0: backplane only waits) and sets *size to the value's full size
   * (backplane calls again with a buffer that large when it was larger). BPL_ERR_TIMEOUT if the key
   * is not set in time. */
  bpl_status (*get)(void* context, const char* key, int64_t timeout_ms, void* value, size_t capacity,
                    size_t* size);
  /* Adds `delta` to the integer stored under `key` (absent: 0) and sets *result to the new value. */
  bpl_status (*add)(void* context, const char* key, int64_t delta, int64_t* result);
  /* *found = 1 if `key` is set, else 0, at once. */
  bpl_status (*check)(void* context, const char* key, int32_t* found);
  /* Optional (may be NULL): a message for the last failed call on the calling thread. */
  const char* (*last_error)(void* context);
} bpl_store;

#define BPL_STORE_INIT {sizeof(bpl_store), NULL, NULL, NULL, NULL, NULL, NULL}

/* Options of bpl_init. Every field left at its *_INIT value is taken from the environment:
 *   backend           explicit backend > BPL_BACKEND > NXD_CPU_MODE (1 → gloo, 0 → neuron) > auto
 *                     (neuron if a Neuron device is present, mpi if launched by mpirun, else gloo).
 *                     A name ("gloo", "mpi", "neuron") or a path to a plugin .so.
 *   rank, world_size, local_rank, local_world_size
 *                     explicit > torchrun's RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE > Open MPI's
 *                     OMPI_COMM_WORLD_* > Slurm's SLURM_PROCID/SLURM_NTASKS > rank 0 of 1.
 *   master_addr, master_port
 *                     rendezvous address for backends that need one: explicit > MASTER_ADDR/MASTER_PORT.
 *   timeout_ms        every wait's default bound: explicit > BPL_TIMEOUT_MS > 300000 (5 minutes).
 *   store             ABI 1.2: the ranks meet through this store (copied; its context and callbacks must
 *                     stay valid until bpl_finalize) instead of at master_addr:master_port. rank and
 *                     world_size must then be known (options or environment). A backend whose ranks
 *                     need no meeting (mpi under mpirun) ignores it; a plugin older than ABI 1.2 is
 *                     refused (UNSUPPORTED). */
typedef struct bpl_init_options {
  size_t struct_size;      /* sizeof(bpl_init_options) */
  const char* backend;     /* NULL: from the environment */
  int32_t rank;            /* -1: from the environment */
  int32_t world_size;      /* -1: from the environment */
  int32_t local_rank;      /* -1: from the environment */
  int32_t local_world_size;/* -1: from the environment */
  const char* master_addr; /* NULL: from the environment */
  int32_t master_port;     /* -1: from the environment */
  int64_t timeout_ms;      /* -1: from the environment */
  const bpl_store* store;  /* ABI 1.2. NULL: meet at master_addr:master_port */
  /* ABI 1.4. The world as a communicator the caller already has, of the backend's own library, instead
   * of joining a job: for "mpi", the address of an MPI_Comm (for example a sub-communicator of
   * MPI_COMM_WORLD) of an MPI the caller initialised and finalizes after bpl_finalize. Collective over
   * that communicator; backplane works on a duplicate of it. Rank and world size are the
   * communicator's (rank, world_size, local_rank and local_world_size stay -1; the local ones are
   * found among its ranks on this machine). A backend that cannot take one refuses it with
   * INVALID_ARGUMENT. NULL: join the job as above. */
  const void* native_comm;
} bpl_init_options;

#define BPL_INIT_OPTIONS_INIT {sizeof(bpl_init_options), NULL, -1, -1, -1, -1, NULL, -1, -1, NULL, NULL}

/* Loads the selected backend plugin and joins the job (for multi-rank backends this is a rendezvous
 * bounded by the timeout). `options` may be NULL (everything from the environment).
 * On success *out is a runtime owned by the caller, released with bpl_finalize.
 * Errors: INVALID_ARGUMENT (bad option or environment value, named in the message), NOT_FOUND (unknown
 * backend or missing plugin file; the message lists the paths tried and the known backends),
 * ABI_MISMATCH, UNAVAILABLE (runtime/hardware absent), TIMEOUT (rendezvous), REMOTE, IO. */
BPL_API bpl_status bpl_init(const bpl_init_options* options, bpl_runtime** out);

/* Leaves the job and unloads the plugin. Communicators split from the world must have been destroyed
 * (any left are destroyed here). Accepts NULL. After it returns, `runtime` is invalid. */
BPL_API bpl_status bpl_finalize(bpl_runtime* runtime);

/* What a runtime is and what it can do. Strings are owned by the runtime, valid until bpl_finalize. */
typedef struct bpl_runtime_info {
  size_t struct_size;           /* sizeof(bpl_runtime_info) */
  const char* backend;          /* plugin's name: "gloo", "mpi", "neuron", … */
  const char* plugin_path;      /* absolute path of the loaded .so */
  const char* plugin_version;   /* plugin's own version string */
  const char* selection_reason; /* why this backend was chosen, e.g. "NXD_CPU_MODE=1" */
  const char* launcher;         /* where rank/world came from: "options", "torchrun", "openmpi", "slurm", "none" */
  const char* details;          /* backend-specific facts (transport, library versions), "key=value; …" */
  int32_t plugin_abi_major;
  int32_t plugin_abi_minor;
  int32_t rank;
  int32_t world_size;
  int32_t local_rank;
  int32_t local_world_size;
  int32_t device_count;
  uint32_t dtypes;     /* BPL_BIT(BPL_DTYPE_*) of the dtypes the collectives accept */
  uint64_t collectives;/* BPL_BIT(BPL_COLL_*) of the operations provided */
  uint32_t reduce_ops; /* BPL_BIT(BPL_OP_*) of the reduce ops provided */
  uint32_t kernels;    /* BPL_BIT(BPL_KERNEL_*) of the typed kernels provided */
  int64_t timeout_ms;  /* the default bound of every wait */
  const char* program_formats; /* space-separated formats bpl_program_compile accepts, e.g. "torchscript" */
} bpl_runtime_info;

#define BPL_RUNTIME_INFO_INIT \
  {sizeof(bpl_runtime_info), NULL, NULL, NULL, NULL, NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0u, 0u, 0u, 0u, 0, NULL}

/* Fills *out (up to out->struct_size bytes). Errors: INVALID_ARGUMENT (NULL, struct_size too small). */
BPL_API bpl_status bpl_runtime_describe(const bpl_runtime* runtime, bpl_runtime_info* out);

/* Which backend the given options and the current environment select, and why, without loading it.
 * Character arrays are NUL-terminated, truncated if longer.
 *
 * A backend given by name ("gloo") is the file libbackplane-<name>.so, looked for in these folders, in
 * order, and nowhere else: each folder of BPL_PLUGIN_PATH (colon-separated; ignored in setuid
 * programs), then the plugin folder installed beside libbackplane.so (<its folder>/backplane/plugins).
 * A value with a '/' is the path of the plugin file itself. A plugin's own modules (the CPU backends'
 * kernels, libbpl-cpu-kernels.so) lie beside the plugin. */
typedef struct bpl_selection {
  size_t struct_size;     /* sizeof(bpl_selection) */
  char backend[64];       /* the name, or the path given */
  char reason[512];       /* e.g. "BPL_BACKEND=mpi" or "auto: no Neuron device, not under mpirun" */
  char plugin_path[4096]; /* the file that would be loaded; "" if none was found */
  char plugin_folders[4096]; /* ABI 1.5: the folders a name is looked for in, in order, colon-separated */
} bpl_selection;

#define BPL_SELECTION_INIT {sizeof(bpl_selection), "", "", "", ""}

/* Errors: INVALID_ARGUMENT (bad variable value, named), NOT_FOUND (no plugin file: backend and reason
 * are still filled; the message lists the paths tried). */
BPL_API bpl_status bpl_select_backend(const bpl_init_options* options, bpl_selection* out);

/* A plugin's identity, read by loading it without starting it. */
typedef struct bpl_plugin_info {
  size_t struct_size; /* sizeof(bpl_plugin_info) */
  char name[64];
  char version[64];
  char path[4096];
  int32_t abi_major;
  int32_t abi_minor;
} bpl_plugin_info;

#define BPL_PLUGIN_INFO_INIT {sizeof(bpl_plugin_info), "", "", "", 0, 0}

/* Loads the plugin `backend` (a name or a path), reads its identity, unloads it.
 * Errors: as bpl_init's loading step (NOT_FOUND, ABI_MISMATCH, INVALID_ARGUMENT). */
BPL_API bpl_status bpl_plugin_probe(const char* backend, bpl_plugin_info* out);

/* ------------------------------------------------------------------------------------------------ */
/* The log.                                                                                         */

/* Levels of backplane's log lines (the core's and its plugins'); BPL_LOG_LEVEL names the most verbose
 * one written (error, warn, info, debug or 0-3; default warn). */
#define BPL_LOG_ERROR 0
#define BPL_LOG_WARN 1
#define BPL_LOG_INFO 2
#define BPL_LOG_DEBUG 3

/* Receives one log line: its level, the part that wrote it ("core", "gloo", "mpi", ...) and its text,
 * without a newline, both valid during the call. Called one line at a time, from whichever thread of
 * backplane writes it; it must not call backplane. */
typedef void (*bpl_log_callback)(int32_t level, const char* source, const char* message, void* user_data);

/* ABI 1.7: from now on, for the whole process, backplane's log lines go to `callback` (with
 * `user_data`) instead of stderr; NULL restores stderr. The lines are those BPL_LOG_LEVEL lets through.
 * Returns BPL_OK. */
BPL_API bpl_status bpl_set_log_callback(bpl_log_callback callback, void* user_data);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* The rest of the API, by interface. */
#include "communication.h" /* communicators, collectives, point to point, requests */
#include "device.h"        /* device memory, kernels, programs */

#endif /* BACKPLANE_BACKPLANE_H */
