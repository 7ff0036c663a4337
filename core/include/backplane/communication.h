/*
 * backplane/communication.h — communicators, collectives, point-to-point transfers and their requests.
 * Part of backplane.h, which includes it: include <backplane/backplane.h>, not this file.
 */
#ifndef BACKPLANE_COMMUNICATION_H
#define BACKPLANE_COMMUNICATION_H

#ifndef BACKPLANE_BACKPLANE_H
#error "include <backplane/backplane.h>, which includes this file"
#endif

#ifdef __cplusplus
extern "C" {
#endif

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

/* ABI 1.8: going on after a member fails, with ULFM's semantics (MPI's MPIX_Comm_revoke, _agree and
 * _shrink; NCCL's ncclCommRevoke and ncclCommShrink). A backend that cannot (mpi on an MPI without
 * ULFM, neuron) answers UNSUPPORTED. The agreement goes through the job's store: a member that cannot
 * reach it fails with BPL_ERR_REMOTE saying it is cut off, so that in a network partition only the side
 * that reaches the store goes on (docs/faults.md). */

/* Revokes `comm` for every member: its operations in flight, on every member, end at once with
 * BPL_ERR_REVOKED naming the rank that revoked it (a member blocked in one is released), and every later
 * operation on it fails so at once, but bpl_comm_agree and bpl_comm_shrink, which are what a revoked
 * communicator is for. The members learn of it without calling anything. Returns without waiting for
 * them. A second revoke, or one of a communicator another member revoked, is BPL_OK.
 * Errors: INVALID_ARGUMENT (NULL or destroyed comm), UNSUPPORTED. */
BPL_API bpl_status bpl_comm_revoke(bpl_comm* comm);

/* Agreement among the members of `comm` that are alive, whether it failed, was revoked or neither: each
 * passes *flags; every member that returns BPL_OK returns the same *flags, the bitwise AND of the flags of
 * the members that took part, and the same failed members, *num_failed of them in ascending order in
 * failed[0 .. *num_failed) (`failed` holds comm's size; it and num_failed may be NULL). A member counts as
 * failed when its process ended, or when it did not take part within the communicator's timeout (a
 * stopped one); the outcome stands when a member fails during the call. The members call bpl_comm_agree
 * and bpl_comm_shrink in the same order.
 * Errors: REMOTE (the others counted this member as failed, as it came after their timeout; or the job's
 * store cannot be reached: this rank is cut off from the job), INVALID_ARGUMENT, UNSUPPORTED. */
BPL_API bpl_status bpl_comm_agree(bpl_comm* comm, int32_t* flags, int32_t* failed, int32_t* num_failed);

/* The members of `comm` that are alive agree, as bpl_comm_agree does, on which failed, and make a
 * communicator of themselves in *out, numbered in their order in `comm`. `failed` and `num_failed` are
 * as bpl_comm_agree's. `comm` is left as it is (destroy it, or for the world, end with bpl_finalize).
 * *out is owned by the caller, released with bpl_comm_destroy, and starts with comm's timeout.
 * A member that fails during the call is survived: the survivors then agree again without it, until
 * every one of them has the same new communicator. Errors: as bpl_comm_agree's. */
BPL_API bpl_status bpl_comm_shrink(bpl_comm* comm, int32_t* failed, int32_t* num_failed, bpl_comm** out);

/* The members of `comm` admit `joiners` new processes, each calling bpl_comm_join, into a communicator
 * of comm's size + joiners in *out (NCCL's ncclCommGrow): the members keep their ranks; the newcomers
 * get the next ones, in the order they came. Every member calls it with the same `joiners`; it waits for
 * the newcomers up to comm's timeout, and the members agree, as bpl_comm_agree does, that every newcomer
 * came and every member is still here before admitting any, so that it ends alike on every member;
 * newcomers not admitted wait for the next grow. *out is owned by the caller (bpl_comm_destroy) and
 * starts with comm's timeout. Errors: INVALID_ARGUMENT (joiners < 1), TIMEOUT (fewer newcomers came,
 * named), REMOTE (a member failed meanwhile, named; or the store cannot be reached), UNSUPPORTED. */
BPL_API bpl_status bpl_comm_grow(bpl_comm* comm, int32_t joiners, bpl_comm** out);

/* In a process started to join a running job (a replacement): it was initialised with BPL_JOIN=1 and
 * the job's MASTER_ADDR and BPL_STORE_PORT, the port of a store that outlives the ranks (bpl-run's
 * bpl-store), and BPL_STORE_SECRET where the job has one (bpl-run --replace sets them all), and is a
 * world of its own until this call. Waits, up to the runtime's timeout, until the job's members admit
 * it (bpl_comm_grow); *out is then their communicator, this process's rank in it by bpl_comm_rank.
 * *out is owned by the caller (bpl_comm_destroy). Errors: INVALID_ARGUMENT (not started to join),
 * TIMEOUT (no member admitted it), REMOTE, UNSUPPORTED. */
BPL_API bpl_status bpl_comm_join(bpl_runtime* runtime, bpl_comm** out);

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
 *    called different collectives, seen with BPL_DEBUG=detail), ABORTED (bpl_comm_abort), REVOKED
 *    (bpl_comm_revoke on a member);
 *  - messages name the operation and its sequence number on the communicator ("bpl_allreduce #17 on
 *    world (rank 0 of 4)"), the backend and, where the backend knows it, the peer rank and host:port;
 *  - a communicator whose operation failed with TIMEOUT, REMOTE, MISMATCH, IO, INTERNAL or
 *    OUT_OF_MEMORY, or that was aborted or revoked, is failed for good on this rank: every later operation on it
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

#endif /* BACKPLANE_COMMUNICATION_H */
