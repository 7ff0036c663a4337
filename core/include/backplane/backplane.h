/*
 * backplane.h — the embedder's C API of backplane (ABI 1.6; what each minor version added is in
 * core/ABI_CHANGELOG.md).
 *
 * One program written against this header runs on any backend plugin (Gloo CPU mode, MPI, Neuron);
 * the backend is chosen at run time (see bpl_init). The header is C99 and compiles as C and C++.
 *
 * ABI rules (docs: DESIGN.md, "The C ABI"):
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
#define BPL_ABI_MINOR 6

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
 * complement); integer AVG is the exact sum divided by the group size, truncated toward zero. */
typedef int32_t bpl_reduce_op;
#define BPL_OP_SUM 1
#define BPL_OP_PROD 2
#define BPL_OP_MIN 3
#define BPL_OP_MAX 4
#define BPL_OP_AVG 5

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

/* Every operation kind above, once, in order: X(code, name, minor) with its BPL_COLL_ value, its
 * bpl_collective_name and the ABI minor version that added it. The names, capability masks, the
 * benchmark's operations and the test suites' rows are derived from it; a new kind is one more line
 * here (docs/adding-a-collective.md). A macro only: no symbol. */
#define BPL_FOR_EACH_COLLECTIVE(X)          \
  X(BPL_COLL_ALLREDUCE, "allreduce", 0)     \
  X(BPL_COLL_BROADCAST, "broadcast", 0)     \
  X(BPL_COLL_REDUCE, "reduce", 0)           \
  X(BPL_COLL_ALLGATHER, "allgather", 0)     \
  X(BPL_COLL_REDUCE_SCATTER, "reduce_scatter", 0) \
  X(BPL_COLL_ALLTOALL, "alltoall", 0)       \
  X(BPL_COLL_BARRIER, "barrier", 0)         \
  X(BPL_COLL_SEND, "send", 0)               \
  X(BPL_COLL_RECV, "recv", 0)               \
  X(BPL_COLL_COMM_SPLIT, "comm_split", 0)   \
  X(BPL_COLL_GATHER, "gather", 3)           \
  X(BPL_COLL_SCATTER, "scatter", 3)         \
  X(BPL_COLL_ALLGATHERV, "allgatherv", 3)   \
  X(BPL_COLL_ALLTOALLV, "alltoallv", 3)     \
  X(BPL_COLL_RECV_ANY, "recv_any", 6)

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
/* Collective interface.                                                                            */

/* The communicator of all ranks. Owned by the runtime: valid until bpl_finalize; do not destroy it. */
BPL_API bpl_status bpl_comm_world(bpl_runtime* runtime, bpl_comm** out);

/* Splits `parent` into groups of the ranks that pass the same `color` (MPI_Comm_split semantics);
 * within a group, ranks are ordered by `key`, then by parent rank. Collective over `parent`: every rank
 * of parent must call it. A rank passing BPL_COLOR_UNDEFINED gets *out = NULL.
 * *out is owned by the caller, released with bpl_comm_destroy.
 * Errors: INVALID_ARGUMENT (color < -1), TIMEOUT, REMOTE. */
#define BPL_COLOR_UNDEFINED (-1)
BPL_API bpl_status bpl_comm_split(bpl_comm* parent, int32_t color, int32_t key, bpl_comm** out);

/* ABI 1.2. A communicator of `size` ranks made by those ranks alone, through `store` (as torch's
 * new_group calls its backend only on the members): each member calls it with its rank in the new
 * communicator (0..size-1, each once) and the same store, which the members share and no other
 * communicator uses with the same keys (a prefix store per group). Ranks outside take no part. The
 * store's context and callbacks must stay valid until the communicator is destroyed (failures are
 * reported through it). The new communicator starts with the runtime's timeout, which also bounds
 * this call. *out is owned by the caller, released with bpl_comm_destroy.
 * Errors: INVALID_ARGUMENT (rank outside 0..size-1, size < 1, a store without set/get/add/check),
 * MISMATCH (members that disagree on the size, or two members with the same rank), TIMEOUT (members
 * missing: named), UNSUPPORTED (the backend cannot, or a plugin older than ABI 1.2). */
BPL_API bpl_status bpl_comm_create_from_store(bpl_runtime* runtime, const bpl_store* store, int32_t rank, int32_t size,
                                              bpl_comm** out);

/* Destroys a communicator from bpl_comm_split or bpl_comm_create_from_store, after its pending
 * operations end. Accepts NULL.
 * Errors: INVALID_ARGUMENT for the world communicator. */
BPL_API bpl_status bpl_comm_destroy(bpl_comm* comm);

/* The calling process's rank in `comm` (0 .. size-1), and the number of ranks in it. Local: no
 * communication. Errors: INVALID_ARGUMENT (NULL or destroyed comm, NULL out-parameter). */
BPL_API bpl_status bpl_comm_rank(const bpl_comm* comm, int32_t* rank);
BPL_API bpl_status bpl_comm_size(const bpl_comm* comm, int32_t* size);

/* ABI 1.1. The bound of every operation started on `comm` from now on, and the default of
 * bpl_request_wait on its requests: timeout_ms > 0, or BPL_TIMEOUT_DEFAULT (-1) for the runtime's
 * (bpl_init_options.timeout_ms / BPL_TIMEOUT_MS). Operations already in flight keep theirs. A split
 * inherits its parent's timeout. Local: no communication; ranks may differ.
 * Errors: INVALID_ARGUMENT (timeout_ms 0 or < -1), UNSUPPORTED (a plugin older than ABI 1.1). */
BPL_API bpl_status bpl_comm_set_timeout(bpl_comm* comm, int64_t timeout_ms);
/* ABI 1.1. *timeout_ms = the communicator's current timeout. */
BPL_API bpl_status bpl_comm_get_timeout(const bpl_comm* comm, int64_t* timeout_ms);

/* ABI 1.1. Ends the communicator's use on this rank, from any thread:
 *  - every later operation on it fails at once with BPL_ERR_ABORTED, touching no network;
 *  - a bpl_request_wait blocked on one of its requests, in any thread, returns BPL_ERR_ABORTED within
 *    a second (the operation itself may still be in flight: bpl_request_free still waits for it,
 *    bounded by its timeout, so that no buffer is touched after the free);
 *  - where the backend can, operations in flight end early and peers learn of it (gloo closes the
 *    communicator's connections, so peers fail with BPL_ERR_REMOTE naming this rank; MPI cannot
 *    cancel a collective: its operations end at their timeout).
 * A second abort is a no-op (BPL_OK). The communicator must still be destroyed (bpl_comm_destroy) or,
 * for the world, end with bpl_finalize. Errors: INVALID_ARGUMENT (NULL or destroyed comm). */
BPL_API bpl_status bpl_comm_abort(bpl_comm* comm);

/* Common rules of the operations below:
 *  - counts are elements of `dtype` and must be >= 0; count * element size must fit in memory;
 *  - buffers may be NULL only when their count is 0; they must stay valid until the operation ends;
 *  - in-place: allreduce/reduce with send == recv; allgather with send == recv + rank*count elements;
 *    reduce_scatter with recv == send + rank*recvcount elements; alltoall with send == recv.
 *    Other overlaps are INVALID_ARGUMENT;
 *  - every rank of the communicator calls the same collectives in the same order with matching
 *    arguments;
 *  - errors: INVALID_ARGUMENT (names the parameter and value), UNSUPPORTED (dtype/op/operation not
 *    provided by the backend, see bpl_runtime_info), TIMEOUT, REMOTE (a peer failed), MISMATCH (ranks
 *    called different collectives, seen with BPL_DEBUG=detail), ABORTED (bpl_comm_abort);
 *  - messages name the operation and its sequence number on the communicator ("bpl_allreduce #17 on
 *    world (rank 0 of 4)"), the backend and, where the backend knows it, the peer rank and host:port;
 *  - a communicator whose operation failed with TIMEOUT, REMOTE, MISMATCH, IO, INTERNAL or
 *    OUT_OF_MEMORY, or that was aborted, is failed for good on this rank: every later operation on it
 *    fails at once with the first failure's status and message, touching no network. (INVALID_ARGUMENT
 *    and UNSUPPORTED are found before anything is sent and leave it usable.) Other communicators are
 *    unaffected: a split that excludes a dead rank keeps working. */

/* recv[i] = op over ranks of send[i], on every rank. */
BPL_API bpl_status bpl_allreduce(bpl_comm* comm, const void* send, void* recv, int64_t count,
                                 bpl_dtype dtype, bpl_reduce_op op, bpl_request** req);

/* buf on every rank = buf on `root`. */
BPL_API bpl_status bpl_broadcast(bpl_comm* comm, void* buf, int64_t count, bpl_dtype dtype,
                                 int32_t root, bpl_request** req);

/* recv on `root` = op over ranks of send; recv is ignored (may be NULL) on other ranks. */
BPL_API bpl_status bpl_reduce(bpl_comm* comm, const void* send, void* recv, int64_t count,
                              bpl_dtype dtype, bpl_reduce_op op, int32_t root, bpl_request** req);

/* recv[r*count .. (r+1)*count) = send of rank r; recv holds size*count elements. */
BPL_API bpl_status bpl_allgather(bpl_comm* comm, const void* send, void* recv, int64_t count,
                                 bpl_dtype dtype, bpl_request** req);

/* recv = block `rank` of the reduction of send over ranks; send holds size*recvcount elements. */
BPL_API bpl_status bpl_reduce_scatter(bpl_comm* comm, const void* send, void* recv, int64_t recvcount,
                                      bpl_dtype dtype, bpl_reduce_op op, bpl_request** req);

/* recv block r = send block `rank` of rank r; blocks are `count` elements, buffers size*count. */
BPL_API bpl_status bpl_alltoall(bpl_comm* comm, const void* send, void* recv, int64_t count,
                                bpl_dtype dtype, bpl_request** req);

/* Returns when every rank has entered it. */
BPL_API bpl_status bpl_barrier(bpl_comm* comm, bpl_request** req);

/* ABI 1.3: gather, scatter and the variable-size allgatherv and alltoallv, as MPI's. A backend that
 * lacks one reports UNSUPPORTED (its bit in bpl_runtime_info.collectives is clear). The arrays of
 * counts and displacements have one entry per rank of comm, in elements, each >= 0; they are read
 * during the call (the caller may reuse them once it returns). */

/* recv on `root` holds size*count elements: block r = send of rank r. recv is ignored (may be NULL)
 * on other ranks. In place at the root: send == recv + root*count elements. */
BPL_API bpl_status bpl_gather(bpl_comm* comm, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                              int32_t root, bpl_request** req);

/* recv = block `rank` of send on `root`, which holds size*count elements there; send is ignored (may be
 * NULL) on other ranks. In place at the root: recv == send + root*count elements. */
BPL_API bpl_status bpl_scatter(bpl_comm* comm, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                               int32_t root, bpl_request** req);

/* On every rank, the sendcount elements of rank r land at recv + displs[r]; recvcounts[r] is rank r's
 * sendcount, the same array on every rank (so sendcount == recvcounts[rank]). The ranks' blocks in recv
 * must not overlap. In place: send == recv + displs[rank] elements. */
BPL_API bpl_status bpl_allgatherv(bpl_comm* comm, const void* send, int64_t sendcount, void* recv,
                                  const int64_t* recvcounts, const int64_t* displs, bpl_dtype dtype,
                                  bpl_request** req);

/* Rank q sends sendcounts[r] elements from send + sdispls[r] to rank r, which receives them, recvcounts[q]
 * of them, at recv + rdispls[q]: recvcounts[q] on rank r equals sendcounts[r] on rank q (if not, every
 * rank fails with MISMATCH). The blocks in recv must not overlap, and send and recv must not overlap
 * (no in-place form). */
BPL_API bpl_status bpl_alltoallv(bpl_comm* comm, const void* send, const int64_t* sendcounts, const int64_t* sdispls,
                                 void* recv, const int64_t* recvcounts, const int64_t* rdispls, bpl_dtype dtype,
                                 bpl_request** req);

/* Point to point. `peer` is a rank of comm other than the caller; `tag` >= 0 matches a send with a
 * recv of the same tag, in order. A blocking send may wait until the receiver posts its recv: to
 * exchange, post one side asynchronously. */
BPL_API bpl_status bpl_send(bpl_comm* comm, const void* buf, int64_t count, bpl_dtype dtype,
                            int32_t peer, int32_t tag, bpl_request** req);
BPL_API bpl_status bpl_recv(bpl_comm* comm, void* buf, int64_t count, bpl_dtype dtype, int32_t peer,
                            int32_t tag, bpl_request** req);

/* A recv from whichever rank sends first with `tag` (ABI 1.6, as MPI_ANY_SOURCE): *source is set to
 * that rank once the recv is done (before returning, or when its request completes: the int32_t must
 * stay valid until then). Sends to this rank with the tag match it and the recvs from their sender in
 * the order the recvs were posted. */
BPL_API bpl_status bpl_recv_any(bpl_comm* comm, void* buf, int64_t count, bpl_dtype dtype, int32_t tag,
                                int32_t* source, bpl_request** req);

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

/* ------------------------------------------------------------------------------------------------ */
/* Requests.                                                                                        */

/* Pass as timeout_ms to wait up to the communicator's timeout. */
#define BPL_TIMEOUT_DEFAULT (-1)

/* *done = 1 if the operation has ended (its result, success or error, is then returned here and by
 * every later test/wait), else 0 and BPL_OK. Never blocks. */
BPL_API bpl_status bpl_request_test(bpl_request* req, int32_t* done);

/* Waits until the operation ends or `timeout_ms` passes (BPL_TIMEOUT_DEFAULT: the communicator's
 * timeout). Returns the operation's result, or TIMEOUT if it has not ended; a request whose wait timed
 * out is still in flight (bounded by the communicator's timeout when it started) and may be waited on
 * again. A shorter timeout_ms is a poll with a deadline; the operation's own bound is the
 * communicator's timeout, so a longer timeout_ms ends at that bound with TIMEOUT. ABORTED if the
 * communicator is aborted meanwhile. */
BPL_API bpl_status bpl_request_wait(bpl_request* req, int64_t timeout_ms);

/* Releases a request. If the operation is still in flight, first waits for it to end (bounded by the
 * communicator's timeout), so that no buffer is touched after this returns. Accepts NULL. */
BPL_API bpl_status bpl_request_free(bpl_request* req);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BACKPLANE_BACKPLANE_H */
