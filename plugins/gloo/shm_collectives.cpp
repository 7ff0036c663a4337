// ShmGroup's collectives through the segment's slots (or, large, in a single copy from the peers' buffers).
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>
#include <thread>
#include <vector>

#include "fingerprint.h"
#include "local_process.h"
#include "plugin_support.h"
#include "shm_internal.h"

namespace backplane::gloo_plugin {

namespace {

// out = a[0] op a[1] op ... in rank order, so that every rank computes bit-identical results.
void reduce_in_rank_order(void* out, const std::vector<const char*>& inputs, size_t count, plugin::ReduceFn reduce) {
  reduce(out, inputs[0], inputs[1], count);
  for (size_t q = 2; q < inputs.size(); ++q) reduce(out, out, inputs[q], count);
}

}  // namespace

const char* ShmGroup::own_operand(const char* own, const char* result, size_t bytes) {
  if (rank_ < 2 || own != result) return own;
  // In place, the first reduction (of ranks 0 and 1) would overwrite this operand before it is read.
  scratch_.assign(own, own + bytes);
  return scratch_.data();
}

void ShmGroup::allreduce(const void* send, void* recv, size_t count, bpl_dtype acc, plugin::ReduceFn reduce,
                         std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  const size_t element = plugin::dtype_size(acc);
  const size_t total = count * element;
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  std::vector<const char*>& inputs = inputs_;
  if (total <= kFlatAllreduceBytes) {
    // One step: everyone's data in, every rank reduces all of it.
    const uint32_t step = next_step();
    copy_to_peers(slot(step, rank_), in, total);
    publish(kAllreduce, total);
    wait_for_all(step, deadline);
    for (int q = 0; q < size_; ++q) inputs[static_cast<size_t>(q)] = slot(step, q);
    reduce_in_rank_order(out, inputs, count, reduce);
    return;
  }
  // Chunks of one slot: step 1 copies in the peers' shares of the chunk; in step 2 each rank reduces its
  // share (its own operand read straight from `send`) into `recv` and copies the result into its slot of
  // the other buffer; then every rank copies the others' shares out.
  const size_t chunk_elements = kSlotBytes / element;
  for (size_t first = 0; first < count; first += chunk_elements) {
    const size_t n = std::min(chunk_elements, count - first);
    auto share_begin = [&](int q) { return n * static_cast<size_t>(q) / static_cast<size_t>(size_); };
    const size_t mine = share_begin(rank_), mine_n = share_begin(rank_ + 1) - mine;
    const uint32_t copy_step = next_step();
    for (int q = 0; q < size_; ++q) {
      const size_t begin = share_begin(q), end = share_begin(q + 1);
      if (q != rank_) copy_to_peers(slot(copy_step, rank_) + begin * element, in + (first + begin) * element, (end - begin) * element);
    }
    publish(kAllreduce, total);
    wait_for_all(copy_step, deadline);
    char* result = out + (first + mine) * element;
    const char* own = own_operand(in + (first + mine) * element, result, mine_n * element);
    for (int q = 0; q < size_; ++q) inputs[static_cast<size_t>(q)] = slot(copy_step, q) + mine * element;
    inputs[static_cast<size_t>(rank_)] = own;
    const uint32_t reduce_step = next_step();
    if (mine_n > 0) {
      reduce_in_rank_order(result, inputs, mine_n, reduce);
      copy_to_peers(slot(reduce_step, rank_) + mine * element, result, mine_n * element);
    }
    publish(kAllreduce, total);
    wait_for_all(reduce_step, deadline);
    for (int q = 0; q < size_; ++q) {
      const size_t begin = share_begin(q), end = share_begin(q + 1);
      if (q != rank_) copy_bytes(out + (first + begin) * element, slot(reduce_step, q) + begin * element, (end - begin) * element);
    }
  }
}

void ShmGroup::broadcast(void* buf, size_t bytes, int root, std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  auto* data = static_cast<char*>(buf);
  if (takes_single_copy(bytes, kSingleCopyBroadcastMaxBytes)) {
    const uint32_t buffers = publish_buffers(kBroadcast, bytes, buf, buf, deadline);
    if (rank_ != root) read_peer(root, data, progress_[root].send_address[buffers % 2], bytes);
    return finish_single_copy(kBroadcast, bytes, deadline);
  }
  for (size_t first = 0; first < bytes; first += kSlotBytes) {
    const size_t n = std::min(kSlotBytes, bytes - first);
    const uint32_t step = next_step();
    if (rank_ == root) copy_to_peers(slot(step, root), data + first, n);
    publish(kBroadcast, bytes);
    wait_for_all(step, deadline);
    if (rank_ != root) copy_bytes(data + first, slot(step, root), n);
  }
}

void ShmGroup::allgather(const void* send, void* recv, size_t block_bytes, std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  if (takes_single_copy(block_bytes * static_cast<size_t>(size_))) {
    const uint32_t buffers = publish_buffers(kAllgather, block_bytes, send, recv, deadline);
    for (int q = 0; q < size_; ++q) {
      char* target = out + block_bytes * static_cast<size_t>(q);
      if (q != rank_) read_peer(q, target, progress_[q].send_address[buffers % 2], block_bytes);
      else if (target != in) copy_bytes(target, in, block_bytes);
    }
    return finish_single_copy(kAllgather, block_bytes, deadline);
  }
  for (size_t first = 0; first < block_bytes; first += kSlotBytes) {
    const size_t n = std::min(kSlotBytes, block_bytes - first);
    const uint32_t step = next_step();
    copy_to_peers(slot(step, rank_), in + first, n);
    publish(kAllgather, block_bytes);
    char* own = out + block_bytes * static_cast<size_t>(rank_) + first;
    if (own != in + first) copy_bytes(own, in + first, n);  // while the peers catch up
    wait_for_all(step, deadline);
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) copy_bytes(out + block_bytes * static_cast<size_t>(q) + first, slot(step, q), n);
    }
  }
}

void ShmGroup::reduce_scatter(const void* send, void* recv, size_t count, bpl_dtype acc, plugin::ReduceFn reduce,
                              std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  const size_t element = plugin::dtype_size(acc);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  // Each step carries the same `n` elements of every block but this rank's own, which it reads straight
  // from `send`; rank r reduces block r's piece.
  const size_t chunk_elements = std::max<size_t>(1, kSlotBytes / (element * static_cast<size_t>(size_)));
  std::vector<const char*>& inputs = inputs_;
  for (size_t first = 0; first < count; first += chunk_elements) {
    const size_t n = std::min(chunk_elements, count - first);
    const uint32_t step = next_step();
    char* mine = slot(step, rank_);
    for (int b = 0; b < size_; ++b) {
      if (b != rank_) {
        copy_to_peers(mine + n * element * static_cast<size_t>(b), in + (count * static_cast<size_t>(b) + first) * element,
                      n * element);
      }
    }
    publish(kReduceScatter, count * element);
    char* result = out + first * element;
    const char* own = own_operand(in + (count * static_cast<size_t>(rank_) + first) * element, result, n * element);
    wait_for_all(step, deadline);
    for (int q = 0; q < size_; ++q) inputs[static_cast<size_t>(q)] = slot(step, q) + n * element * static_cast<size_t>(rank_);
    inputs[static_cast<size_t>(rank_)] = own;
    reduce_in_rank_order(result, inputs, n, reduce);
  }
}

void ShmGroup::alltoall(const void* send, void* recv, size_t block_bytes, std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  const auto ranks = static_cast<size_t>(size_);
  const bool single_copy_size = takes_single_copy(block_bytes * ranks);
  if (single_copy_size && send != recv) {
    // Block q of recv from block `rank()` of rank q's send. (In place, a peer could still be reading
    // a block this rank overwrites: that goes through the segment.)
    const uint32_t buffers = publish_buffers(kAlltoall, block_bytes, send, recv, deadline);
    for (size_t q = 0; q < ranks; ++q) {
      char* target = out + block_bytes * q;
      const size_t mine = block_bytes * static_cast<size_t>(rank_);
      if (static_cast<int>(q) == rank_) {
        copy_bytes(target, in + mine, block_bytes);
      } else {
        read_peer(static_cast<int>(q), target, progress_[q].send_address[buffers % 2] + mine, block_bytes);
      }
    }
    return finish_single_copy(kAlltoall, block_bytes, deadline);
  }
  // Each step carries the same `n` bytes of every block, block q at q * n in the slot; every rank has
  // copied that range of all its blocks in before any rank writes it out, so send may equal recv.
  const uint32_t kind = single_copy_size ? kAlltoallInPlace : kAlltoall;
  const size_t chunk = std::max<size_t>(1, kSlotBytes / ranks);
  for (size_t first = 0; first < block_bytes; first += chunk) {
    const size_t n = std::min(chunk, block_bytes - first);
    const uint32_t step = next_step();
    char* mine = slot(step, rank_);
    for (size_t q = 0; q < ranks; ++q) {
      if (static_cast<int>(q) != rank_) copy_to_peers(mine + n * q, in + block_bytes * q + first, n);
      else copy_bytes(mine + n * q, in + block_bytes * q + first, n);  // read by this rank only
    }
    publish(kind, block_bytes);
    wait_for_all(step, deadline);
    for (size_t q = 0; q < ranks; ++q) {
      copy_bytes(out + block_bytes * q + first, slot(step, static_cast<int>(q)) + n * static_cast<size_t>(rank_), n);
    }
  }
}

void ShmGroup::barrier(std::chrono::milliseconds timeout) {
  const uint32_t step = publish(kBarrier, 0);
  wait_for_all(step, Deadline(timeout));
}


}  // namespace backplane::gloo_plugin
