// The C API of collectives and point-to-point transfers: arguments checked, then run as operations.
#include <string>

#include "backplane/backplane.h"
#include "backplane/plugin.h"
#include "error.h"
#include "handles.h"
#include "operation.h"
#include "validation.h"

using namespace backplane;

extern "C" {

/* ---- collectives ---- */

bpl_status bpl_allreduce(bpl_comm* comm, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                         bpl_reduce_op op, bpl_request** req) {
  return guarded("bpl_allreduce", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective<BPL_COLL_ALLREDUCE>(c);
    size_t bytes = check_count(count, check_dtype(c, dtype), 1, "count");
    check_op(c, op, dtype);
    check_buffer(send, bytes, "send");
    check_buffer(recv, bytes, "recv");
    REQUIRE(send == recv || !overlap(send, bytes, recv, bytes), "send and recv overlap without being equal (in place)");
    return run_operation("bpl_allreduce", c, fingerprint_of(BPL_COLL_ALLREDUCE, dtype, count, -1, op),
                         Traced{BPL_COLL_ALLREDUCE, bytes, dtype}, req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, send, recv, count, dtype, op, preq); });
  });
}

bpl_status bpl_broadcast(bpl_comm* comm, void* buf, int64_t count, bpl_dtype dtype, int32_t root, bpl_request** req) {
  return guarded("bpl_broadcast", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective<BPL_COLL_BROADCAST>(c);
    size_t bytes = check_count(count, check_dtype(c, dtype), 1, "count");
    check_buffer(buf, bytes, "buf");
    check_rank(c, root, "root");
    return run_operation("bpl_broadcast", c, fingerprint_of(BPL_COLL_BROADCAST, dtype, count, root),
                         Traced{BPL_COLL_BROADCAST, bytes, dtype}, req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, buf, count, dtype, root, preq); });
  });
}

bpl_status bpl_reduce(bpl_comm* comm, const void* send, void* recv, int64_t count, bpl_dtype dtype, bpl_reduce_op op,
                      int32_t root, bpl_request** req) {
  return guarded("bpl_reduce", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective<BPL_COLL_REDUCE>(c);
    size_t bytes = check_count(count, check_dtype(c, dtype), 1, "count");
    check_op(c, op, dtype);
    check_rank(c, root, "root");
    check_buffer(send, bytes, "send");
    if (c->rank == root) {
      check_buffer(recv, bytes, "recv");
      REQUIRE(send == recv || !overlap(send, bytes, recv, bytes), "send and recv overlap without being equal (in place)");
    }
    return run_operation("bpl_reduce", c, fingerprint_of(BPL_COLL_REDUCE, dtype, count, root, op),
                         Traced{BPL_COLL_REDUCE, bytes, dtype}, req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, send, recv, count, dtype, op, root, preq); });
  });
}

bpl_status bpl_allgather(bpl_comm* comm, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                         bpl_request** req) {
  return guarded("bpl_allgather", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective<BPL_COLL_ALLGATHER>(c);
    size_t element = check_dtype(c, dtype);
    size_t total = check_count(count, element, c->size, "count");
    size_t block = total / static_cast<size_t>(c->size);
    check_buffer(send, block, "send");
    check_buffer(recv, total, "recv");
    const void* own_block = static_cast<const char*>(recv) + block * static_cast<size_t>(c->rank);
    REQUIRE(send == own_block || !overlap(send, block, recv, total),
            "send overlaps recv but is not recv + rank*count elements (in place)");
    return run_operation("bpl_allgather", c, fingerprint_of(BPL_COLL_ALLGATHER, dtype, count),
                         Traced{BPL_COLL_ALLGATHER, total, dtype}, req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, send, recv, count, dtype, preq); });
  });
}

bpl_status bpl_reduce_scatter(bpl_comm* comm, const void* send, void* recv, int64_t recvcount, bpl_dtype dtype,
                              bpl_reduce_op op, bpl_request** req) {
  return guarded("bpl_reduce_scatter", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective<BPL_COLL_REDUCE_SCATTER>(c);
    size_t element = check_dtype(c, dtype);
    size_t total = check_count(recvcount, element, c->size, "recvcount");
    size_t block = total / static_cast<size_t>(c->size);
    check_op(c, op, dtype);
    check_buffer(send, total, "send");
    check_buffer(recv, block, "recv");
    const void* own_block = static_cast<const char*>(send) + block * static_cast<size_t>(c->rank);
    REQUIRE(recv == own_block || !overlap(send, total, recv, block),
            "recv overlaps send but is not send + rank*recvcount elements (in place)");
    return run_operation("bpl_reduce_scatter", c, fingerprint_of(BPL_COLL_REDUCE_SCATTER, dtype, recvcount, -1, op),
                         Traced{BPL_COLL_REDUCE_SCATTER, total, dtype}, req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, send, recv, recvcount, dtype, op, preq); });
  });
}

bpl_status bpl_alltoall(bpl_comm* comm, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                        bpl_request** req) {
  return guarded("bpl_alltoall", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective<BPL_COLL_ALLTOALL>(c);
    size_t total = check_count(count, check_dtype(c, dtype), c->size, "count");
    check_buffer(send, total, "send");
    check_buffer(recv, total, "recv");
    REQUIRE(send == recv || !overlap(send, total, recv, total), "send and recv overlap without being equal (in place)");
    return run_operation("bpl_alltoall", c, fingerprint_of(BPL_COLL_ALLTOALL, dtype, count),
                         Traced{BPL_COLL_ALLTOALL, total, dtype}, req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, send, recv, count, dtype, preq); });
  });
}

bpl_status bpl_barrier(bpl_comm* comm, bpl_request** req) {
  return guarded("bpl_barrier", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective<BPL_COLL_BARRIER>(c);
    return run_operation("bpl_barrier", c, fingerprint_of(BPL_COLL_BARRIER), Traced{BPL_COLL_BARRIER, 0, 0}, req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, preq); });
  });
}

bpl_status bpl_gather(bpl_comm* comm, const void* send, void* recv, int64_t count, bpl_dtype dtype, int32_t root,
                      bpl_request** req) {
  return guarded("bpl_gather", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective<BPL_COLL_GATHER>(c);
    const size_t total = check_count(count, check_dtype(c, dtype), c->size, "count");
    const size_t block = total / static_cast<size_t>(c->size);
    check_rank(c, root, "root");
    check_buffer(send, block, "send");
    if (c->rank == root) {
      check_buffer(recv, total, "recv");
      const void* own_block = static_cast<const char*>(recv) + block * static_cast<size_t>(root);
      REQUIRE(send == own_block || !overlap(send, block, recv, total),
              "send overlaps recv but is not recv + root*count elements (in place)");
    }
    return run_operation("bpl_gather", c, fingerprint_of(BPL_COLL_GATHER, dtype, count, root),
                         Traced{BPL_COLL_GATHER, total, dtype}, req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, send, recv, count, dtype, root, preq); });
  });
}

bpl_status bpl_scatter(bpl_comm* comm, const void* send, void* recv, int64_t count, bpl_dtype dtype, int32_t root,
                       bpl_request** req) {
  return guarded("bpl_scatter", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective<BPL_COLL_SCATTER>(c);
    const size_t total = check_count(count, check_dtype(c, dtype), c->size, "count");
    const size_t block = total / static_cast<size_t>(c->size);
    check_rank(c, root, "root");
    check_buffer(recv, block, "recv");
    if (c->rank == root) {
      check_buffer(send, total, "send");
      const void* own_block = static_cast<const char*>(send) + block * static_cast<size_t>(root);
      REQUIRE(recv == own_block || !overlap(send, total, recv, block),
              "recv overlaps send but is not send + root*count elements (in place)");
    }
    return run_operation("bpl_scatter", c, fingerprint_of(BPL_COLL_SCATTER, dtype, count, root),
                         Traced{BPL_COLL_SCATTER, total, dtype}, req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, send, recv, count, dtype, root, preq); });
  });
}

bpl_status bpl_allgatherv(bpl_comm* comm, const void* send, int64_t sendcount, void* recv, const int64_t* recvcounts,
                          const int64_t* displs, bpl_dtype dtype, bpl_request** req) {
  return guarded("bpl_allgatherv", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective<BPL_COLL_ALLGATHERV>(c);
    const size_t element = check_dtype(c, dtype);
    const size_t bytes = check_count(sendcount, element, 1, "sendcount");
    check_buffer(send, bytes, "send");
    const size_t extent = check_layout(recvcounts, displs, c->size, element, recv, "recvcounts", "displs", "recv");
    REQUIRE(recvcounts[c->rank] == sendcount, "sendcount = " + std::to_string(sendcount) + " but recvcounts[" +
                                                  std::to_string(c->rank) + "] = " + std::to_string(recvcounts[c->rank]) +
                                                  ": a rank's entry is its sendcount");
    const void* own_block = static_cast<const char*>(recv) + static_cast<size_t>(displs[c->rank]) * element;
    REQUIRE(send == own_block || !overlap(send, bytes, recv, extent),
            "send overlaps recv but is not recv + displs[rank] elements (in place)");
    int64_t total = 0;
    for (int32_t r = 0; r < c->size; ++r) total += recvcounts[r];
    Fingerprint fingerprint = fingerprint_of(BPL_COLL_ALLGATHERV, dtype, total);
    fingerprint.pairing = pairing_share(c->rank, c->size, [&](int) { return sendcount; },
                                        [&](int q) { return recvcounts[q]; });
    return run_operation("bpl_allgatherv", c, fingerprint,
                         Traced{BPL_COLL_ALLGATHERV, extent, dtype}, req,
                         [&](bpl_plugin_request** preq) {
                           return fn(c->impl, send, sendcount, recv, recvcounts, displs, dtype, preq);
                         });
  });
}

bpl_status bpl_alltoallv(bpl_comm* comm, const void* send, const int64_t* sendcounts, const int64_t* sdispls, void* recv,
                         const int64_t* recvcounts, const int64_t* rdispls, bpl_dtype dtype, bpl_request** req) {
  return guarded("bpl_alltoallv", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective<BPL_COLL_ALLTOALLV>(c);
    const size_t element = check_dtype(c, dtype);
    const size_t sent = check_layout(sendcounts, sdispls, c->size, element, send, "sendcounts", "sdispls", "send");
    const size_t received = check_layout(recvcounts, rdispls, c->size, element, recv, "recvcounts", "rdispls", "recv");
    REQUIRE(!overlap(send, sent, recv, received), "send and recv overlap (alltoallv has no in-place form)");
    REQUIRE(sendcounts[c->rank] == recvcounts[c->rank],
            "sendcounts[" + std::to_string(c->rank) + "] = " + std::to_string(sendcounts[c->rank]) + " but recvcounts[" +
                std::to_string(c->rank) + "] = " + std::to_string(recvcounts[c->rank]) + ": what a rank sends itself it receives");
    // Each rank's counts differ from its peers': the fingerprint carries what they share and the
    // rank's share of their pairing.
    Fingerprint fingerprint = fingerprint_of(BPL_COLL_ALLTOALLV, dtype);
    fingerprint.pairing = pairing_share(c->rank, c->size, [&](int q) { return sendcounts[q]; },
                                        [&](int q) { return recvcounts[q]; });
    return run_operation("bpl_alltoallv", c, fingerprint,
                         Traced{BPL_COLL_ALLTOALLV, sent, dtype}, req,
                         [&](bpl_plugin_request** preq) {
                           return fn(c->impl, send, sendcounts, sdispls, recv, recvcounts, rdispls, dtype, preq);
                         });
  });
}

namespace {
// Checks shared by send and recv; the buffer's bytes.
size_t check_transfer(const bpl_comm* c, const void* buf, int64_t count, bpl_dtype dtype, int32_t tag) {
  size_t bytes = check_count(count, check_dtype(c, dtype), 1, "count");
  check_buffer(buf, bytes, "buf");
  REQUIRE(tag >= 0, "tag = " + std::to_string(tag) + ": expected >= 0");
  return bytes;
}

size_t check_point_to_point(const bpl_comm* c, const void* buf, int64_t count, bpl_dtype dtype, int32_t peer,
                            int32_t tag) {
  check_rank(c, peer, "peer");
  REQUIRE(peer != c->rank, "peer = " + std::to_string(peer) + " is the calling rank itself");
  return check_transfer(c, buf, count, dtype, tag);
}
}  // namespace

bpl_status bpl_send(bpl_comm* comm, const void* buf, int64_t count, bpl_dtype dtype, int32_t peer, int32_t tag,
                    bpl_request** req) {
  return guarded("bpl_send", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective<BPL_COLL_SEND>(c);
    const size_t bytes = check_point_to_point(c, buf, count, dtype, peer, tag);
    return run_operation("bpl_send", c, fingerprint_of(BPL_COLL_SEND), Traced{BPL_COLL_SEND, bytes, dtype}, req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, buf, count, dtype, peer, tag, preq); });
  });
}

bpl_status bpl_recv(bpl_comm* comm, void* buf, int64_t count, bpl_dtype dtype, int32_t peer, int32_t tag,
                    bpl_request** req) {
  return guarded("bpl_recv", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective<BPL_COLL_RECV>(c);
    const size_t bytes = check_point_to_point(c, buf, count, dtype, peer, tag);
    return run_operation("bpl_recv", c, fingerprint_of(BPL_COLL_RECV), Traced{BPL_COLL_RECV, bytes, dtype}, req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, buf, count, dtype, peer, tag, preq); });
  });
}

bpl_status bpl_recv_any(bpl_comm* comm, void* buf, int64_t count, bpl_dtype dtype, int32_t tag, int32_t* source,
                        bpl_request** req) {
  return guarded("bpl_recv_any", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective<BPL_COLL_RECV_ANY>(c);
    const size_t bytes = check_transfer(c, buf, count, dtype, tag);
    REQUIRE(source != nullptr, "source is NULL: expected where to write the sender's rank");
    REQUIRE(c->size > 1, "the communicator has one rank: no other rank can send to it");
    return run_operation("bpl_recv_any", c, fingerprint_of(BPL_COLL_RECV_ANY), Traced{BPL_COLL_RECV_ANY, bytes, dtype}, req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, buf, count, dtype, tag, source, preq); });
  });
}
}  // extern "C"
