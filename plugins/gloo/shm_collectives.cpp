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

void ShmGroup::reduce_in_rank_order(void* out, const std::vector<const char*>& inputs, size_t count, size_t element,
                                    plugin::ReduceFn reduce, plugin::ReduceFn streamed) {
  const size_t last = inputs.size() - 1;
  if (streamed == nullptr || last == 1) {
    (streamed != nullptr ? streamed : reduce)(out, inputs[0], inputs[1], count);
    for (size_t q = 2; q <= last; ++q) reduce(out, out, inputs[q], count);
    return;
  }
  // Streamed on more than 2 ranks: a pass that read `out` back after streaming it would read memory.
  partial_.resize(std::max(partial_.size(), count * element));
  void* partial = partial_.data();
  reduce(partial, inputs[0], inputs[1], count);
  for (size_t q = 2; q < last; ++q) reduce(partial, partial, inputs[q], count);
  streamed(out, partial, inputs[last], count);
}

const char* ShmGroup::own_operand(const char* own, const char* result, size_t bytes) {
  if (rank_ < 2 || own != result) return own;
  // In place, the first reduction (of ranks 0 and 1) would overwrite this operand before it is read.
  scratch_.assign(own, own + bytes);
  return scratch_.data();
}

void ShmGroup::allreduce(const void* send, void* recv, size_t count, bpl_dtype acc, bpl_reduce_op op,
                         std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  const size_t element = plugin::dtype_size(acc);
  const plugin::ReduceFn reduce = plugin::reduce_function(acc, op);
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
    reduce_in_rank_order(out, inputs, count, element, reduce);
    return;
  }
  const CopyFn copy_out = output_copy(total);
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
      // Through the cache at every size: the result is read again at once, into the segment (streamed
      // variants measured no faster: bench/results/xeon/README.md#2026-11-26-raw-speed-4).
      reduce_in_rank_order(result, inputs, mine_n, element, reduce);
      copy_to_peers(slot(reduce_step, rank_) + mine * element, result, mine_n * element);
    }
    publish(kAllreduce, total);
    wait_for_all(reduce_step, deadline);
    for (int q = 0; q < size_; ++q) {
      const size_t begin = share_begin(q), end = share_begin(q + 1);
      if (q != rank_) copy_out(out + (first + begin) * element, slot(reduce_step, q) + begin * element, (end - begin) * element);
    }
  }
}

void ShmGroup::broadcast(void* buf, size_t bytes, int root, std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  auto* data = static_cast<char*>(buf);
  const uint32_t kind = with_root(kBroadcast, root);
  if (takes_single_copy(BPL_COLL_BROADCAST, bytes)) {
    // The root, which would only wait, writes the last share of every peer's buffer while each peer
    // reads the rest from the root's: every rank copies (size - 1) / size of the message.
    const uint32_t buffers = publish_buffers(kind, bytes, buf, buf, deadline);
    const size_t pushed = bytes / static_cast<size_t>(size_) / kLine * kLine;
    const size_t pulled = bytes - pushed;
    if (rank_ == root) {
      for (int q = 0; q < size_ && pushed > 0; ++q) {
        if (q != root) write_peer(q, progress_[q].recv_address[buffers % 2] + pulled, data + pulled, pushed);
      }
    } else {
      read_peer(root, data, progress_[root].send_address[buffers % 2], pulled);
    }
    return finish_single_copy(kind, bytes, deadline);
  }
  const CopyFn copy_out = output_copy(bytes);
  for (size_t first = 0; first < bytes; first += kSlotBytes) {
    const size_t n = std::min(kSlotBytes, bytes - first);
    const uint32_t step = next_step();
    if (rank_ == root) copy_to_peers(slot(step, root), data + first, n);
    publish(kind, bytes);
    wait_for_all(step, deadline);
    if (rank_ != root) copy_out(data + first, slot(step, root), n);
  }
}

void ShmGroup::allgather(const void* send, void* recv, size_t block_bytes, std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  if (takes_single_copy(BPL_COLL_ALLGATHER, block_bytes * static_cast<size_t>(size_))) {
    const uint32_t buffers = publish_buffers(kAllgather, block_bytes, send, recv, deadline);
    for (int q = 0; q < size_; ++q) {
      char* target = out + block_bytes * static_cast<size_t>(q);
      if (q != rank_) read_peer(q, target, progress_[q].send_address[buffers % 2], block_bytes);
      else if (target != in) copy_bytes(target, in, block_bytes);
    }
    return finish_single_copy(kAllgather, block_bytes, deadline);
  }
  const CopyFn copy_out = output_copy(block_bytes * static_cast<size_t>(size_));
  for (size_t first = 0; first < block_bytes; first += kSlotBytes) {
    const size_t n = std::min(kSlotBytes, block_bytes - first);
    const uint32_t step = next_step();
    copy_to_peers(slot(step, rank_), in + first, n);
    publish(kAllgather, block_bytes);
    char* own = out + block_bytes * static_cast<size_t>(rank_) + first;
    if (own != in + first) copy_out(own, in + first, n);  // while the peers catch up
    wait_for_all(step, deadline);
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) copy_out(out + block_bytes * static_cast<size_t>(q) + first, slot(step, q), n);
    }
  }
}

void ShmGroup::reduce_scatter(const void* send, void* recv, size_t count, bpl_dtype acc, bpl_reduce_op op,
                              std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  const size_t element = plugin::dtype_size(acc);
  const plugin::ReduceFn reduce = plugin::reduce_function(acc, op);
  // The result is written once and not read here again: streamed when larger than the cache.
  const plugin::ReduceFn streamed =
      streams_output(count * element) ? plugin::reduce_function(acc, op, plugin::Stores::kStreamed) : nullptr;
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
    // Streamed, `result` is written only by the last pass, after every operand was read.
    const char* own_input = in + (count * static_cast<size_t>(rank_) + first) * element;
    const char* own = streamed != nullptr ? own_input : own_operand(own_input, result, n * element);
    wait_for_all(step, deadline);
    for (int q = 0; q < size_; ++q) inputs[static_cast<size_t>(q)] = slot(step, q) + n * element * static_cast<size_t>(rank_);
    inputs[static_cast<size_t>(rank_)] = own;
    reduce_in_rank_order(result, inputs, n, element, reduce, streamed);
  }
}

void ShmGroup::alltoall(const void* send, void* recv, size_t block_bytes, std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  const auto ranks = static_cast<size_t>(size_);
  const bool single_copy_size = takes_single_copy(BPL_COLL_ALLTOALL, block_bytes * ranks);
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
  // Each step carries the same `n` bytes of every block a peer reads, packed in the slot in rank
  // order; every rank has copied that range of all its blocks in before any rank writes it out. Not in
  // place, this rank's own block goes straight from send to recv while the peers catch up, and the
  // slot holds only the peers' blocks: fewer, larger steps. In place, the own block is staged too (a
  // peer may call the other way only at its peril: the layouts differ, hence the kinds).
  const bool in_place = send == recv;
  const size_t own = block_bytes * static_cast<size_t>(rank_);
  const size_t pieces = std::max<size_t>(1, in_place ? ranks : ranks - 1);
  auto piece_for = [&](size_t reader, size_t writer) { return in_place || reader < writer ? reader : reader - 1; };
  const size_t chunk = std::max<size_t>(1, kSlotBytes / pieces);
  const CopyFn copy_out = output_copy(block_bytes * ranks);
  for (size_t first = 0; first < block_bytes; first += chunk) {
    const size_t n = std::min(chunk, block_bytes - first);
    const uint32_t step = next_step();
    char* mine = slot(step, rank_);
    const auto me = static_cast<size_t>(rank_);
    for (size_t q = 0; q < ranks; ++q) {
      if (q != me) copy_to_peers(mine + n * piece_for(q, me), in + block_bytes * q + first, n);
      else if (in_place) copy_bytes(mine + n * q, in + own + first, n);  // read by this rank only
    }
    publish(in_place ? kAlltoallInPlace : kAlltoall, block_bytes);
    if (!in_place) copy_out(out + own + first, in + own + first, n);
    wait_for_all(step, deadline);
    for (size_t q = 0; q < ranks; ++q) {
      if (q != me || in_place) copy_out(out + block_bytes * q + first, slot(step, static_cast<int>(q)) + n * piece_for(me, q), n);
    }
  }
}

void ShmGroup::gather(const void* send, void* recv, size_t block_bytes, int root, std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  const uint32_t kind = with_root(kGather, root);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);  // NULL on the others, as may be `send` of a scatter
  char* own = rank_ == root ? out + block_bytes * static_cast<size_t>(rank_) : nullptr;
  if (takes_single_copy(BPL_COLL_GATHER, block_bytes * static_cast<size_t>(size_))) {
    // Each rank writes its block into the root's buffer, all at once: the root, which would otherwise
    // read every block itself, copies only its own.
    const uint32_t buffers = publish_buffers(kind, block_bytes, send, recv, deadline);
    if (rank_ != root) {
      write_peer(root, progress_[root].recv_address[buffers % 2] + block_bytes * static_cast<size_t>(rank_), in, block_bytes);
    } else if (own != in) {
      copy_bytes(own, in, block_bytes);
    }
    return finish_single_copy(kind, block_bytes, deadline);
  }
  // As allgather, only the root copying out.
  const CopyFn copy_out = output_copy(block_bytes * static_cast<size_t>(size_));
  for (size_t first = 0; first < block_bytes; first += kSlotBytes) {
    const size_t n = std::min(kSlotBytes, block_bytes - first);
    const uint32_t step = next_step();
    if (rank_ != root) copy_to_peers(slot(step, rank_), in + first, n);
    publish(kind, block_bytes);
    if (rank_ == root && own != in) copy_out(own + first, in + first, n);  // while the peers catch up
    wait_for_all(step, deadline);
    if (rank_ != root) continue;
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) copy_out(out + block_bytes * static_cast<size_t>(q) + first, slot(step, q), n);
    }
  }
}

void ShmGroup::scatter(const void* send, void* recv, size_t block_bytes, int root, std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  const uint32_t kind = with_root(kScatter, root);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  const auto me = static_cast<size_t>(rank_);
  const char* own = rank_ == root ? in + block_bytes * me : nullptr;
  if (takes_single_copy(BPL_COLL_SCATTER, block_bytes * static_cast<size_t>(size_))) {
    const uint32_t buffers = publish_buffers(kind, block_bytes, send, recv, deadline);
    if (rank_ != root) read_peer(root, out, progress_[root].send_address[buffers % 2] + block_bytes * me, block_bytes);
    else if (own != out) copy_bytes(out, own, block_bytes);
    return finish_single_copy(kind, block_bytes, deadline);
  }
  // The root's slot carries a piece of every other rank's block (at its index among them); the root
  // copies its own block meanwhile.
  const size_t pieces = std::max(1, size_ - 1);
  const size_t chunk = kSlotBytes / pieces;
  const auto root_index = static_cast<size_t>(root);
  auto place = [&](size_t reader) { return chunk * (reader < root_index ? reader : reader - 1); };
  const CopyFn copy_out = output_copy(block_bytes);
  for (size_t first = 0; first < block_bytes; first += chunk) {
    const size_t n = std::min(chunk, block_bytes - first);
    const uint32_t step = next_step();
    if (rank_ == root) {
      for (size_t q = 0; q < static_cast<size_t>(size_); ++q) {
        if (q != me) copy_to_peers(slot(step, rank_) + place(q), in + block_bytes * q + first, n);
      }
    }
    publish(kind, block_bytes);
    if (rank_ == root && own != out) copy_out(out + first, own + first, n);  // while the peers catch up
    wait_for_all(step, deadline);
    if (rank_ != root) copy_out(out + first, slot(step, root) + place(me), n);
  }
}

uint32_t ShmGroup::agree_on_counts(uint32_t kind, uint64_t bytes, int64_t pairing_share, size_t largest_sent,
                                   const std::vector<uint64_t>& slot_words, const Deadline& deadline, size_t* largest) {
  const uint32_t step = next_step();
  Progress& mine = progress_[rank_];
  mine.send_address[step % 2] = largest_sent;
  mine.recv_address[step % 2] = static_cast<uint64_t>(pairing_share);
  if (!slot_words.empty()) std::memcpy(slot(step, rank_), slot_words.data(), slot_words.size() * sizeof(uint64_t));
  publish(kind, bytes);
  wait_for_all(step, deadline);
  uint64_t sum = 0;  // wraps, as the shares do
  *largest = 0;
  for (int q = 0; q < size_; ++q) {
    sum += progress_[q].recv_address[step % 2];
    *largest = std::max<size_t>(*largest, progress_[q].send_address[step % 2]);
  }
  if (sum != 0) {
    throw plugin::Error(BPL_ERR_MISMATCH, std::string("shared memory: ranks disagree: the counts of ") + kind_name(kind) +
                                              " do not pair up (what a rank sends to a peer is not what that peer "
                                              "receives from it)");
  }
  return step;
}

void ShmGroup::allgatherv(const void* send, size_t send_bytes, void* recv, const plugin::Counts& bytes,
                          const plugin::Counts& offsets, int64_t pairing_share, std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  uint64_t total = 0;
  for (size_t b : bytes) total += b;
  size_t largest = 0;
  agree_on_counts(kAllgatherv, total, pairing_share, size_ > 1 ? send_bytes : 0, {}, deadline, &largest);
  char* own = total == 0 ? out : out + offsets[static_cast<size_t>(rank_)];  // no output: `out` may be NULL
  if (takes_single_copy(BPL_COLL_ALLGATHERV, largest * static_cast<size_t>(size_))) {
    const uint32_t buffers = publish_buffers(kAllgatherv, total, send, recv, deadline);
    for (int q = 0; q < size_; ++q) {
      const auto i = static_cast<size_t>(q);
      if (q != rank_) read_peer(q, out + offsets[i], progress_[q].send_address[buffers % 2], bytes[i]);
    }
    if (own != in) copy_bytes(own, in, send_bytes);
    return finish_single_copy(kAllgatherv, total, deadline);
  }
  // Step by step as allgather, each rank's block as long as it lasts.
  auto piece = [&](size_t block, size_t first) { return block > first ? std::min(kSlotBytes, block - first) : 0; };
  const CopyFn copy_out = output_copy(total);
  for (size_t first = 0; first < largest; first += kSlotBytes) {
    const uint32_t step = next_step();
    const size_t n = piece(send_bytes, first);
    if (n > 0) copy_to_peers(slot(step, rank_), in + first, n);
    publish(kAllgatherv, total);
    if (n > 0 && own != in) copy_out(own + first, in + first, n);  // while the peers catch up
    wait_for_all(step, deadline);
    for (int q = 0; q < size_; ++q) {
      const size_t theirs = piece(bytes[static_cast<size_t>(q)], first);
      if (q != rank_ && theirs > 0) copy_out(out + offsets[static_cast<size_t>(q)] + first, slot(step, q), theirs);
    }
  }
  if (largest == 0 && own != in) copy_bytes(own, in, send_bytes);  // a world of one
}

void ShmGroup::alltoallv(const void* send, const plugin::Counts& send_bytes, const plugin::Counts& send_offsets,
                         void* recv, const plugin::Counts& recv_bytes, const plugin::Counts& recv_offsets,
                         int64_t pairing_share, std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  const auto me = static_cast<size_t>(rank_);
  const auto ranks = static_cast<size_t>(size_);
  size_t largest_sent = 0;
  for (size_t q = 0; q < ranks; ++q) {
    if (q != me) largest_sent = std::max(largest_sent, send_bytes[q]);
  }
  // For single copy, each rank leaves in its slot where in its send buffer each peer's block starts.
  std::vector<uint64_t> starts(ranks);
  for (size_t q = 0; q < ranks; ++q) starts[q] = reinterpret_cast<uint64_t>(in) + send_offsets[q];  // `in` may be NULL
  size_t largest = 0;
  const uint32_t agreed = agree_on_counts(kAlltoallv, 0, pairing_share, largest_sent, starts, deadline, &largest);
  size_t received = 0;
  for (size_t b : recv_bytes) received += b;
  const CopyFn copy_out = output_copy(received);
  auto copy_own = [&](size_t first, size_t n) {
    if (n > 0) copy_out(out + recv_offsets[me] + first, in + send_offsets[me] + first, n);  // else buffers may be NULL
  };
  if (takes_single_copy(BPL_COLL_ALLTOALLV, largest * ranks)) {
    // The starts stay in the slots: the next step that writes that buffer comes after finish_single_copy.
    publish_buffers(kAlltoallv, 0, send, recv, deadline);
    for (size_t q = 0; q < ranks; ++q) {
      if (q == me || recv_bytes[q] == 0) continue;
      uint64_t start = 0;
      std::memcpy(&start, slot(agreed, static_cast<int>(q)) + me * sizeof(uint64_t), sizeof(start));
      read_peer(static_cast<int>(q), out + recv_offsets[q], start, recv_bytes[q]);
    }
    copy_own(0, send_bytes[me]);
    return finish_single_copy(kAlltoallv, 0, deadline);
  }
  // Step by step as alltoall: the block for peer q at a fixed place in the slot (its index among this
  // rank's peers), as long as it lasts.
  const size_t chunk = ranks > 1 ? kSlotBytes / (ranks - 1) : kSlotBytes;
  auto piece = [&](size_t block, size_t first) { return block > first ? std::min(chunk, block - first) : 0; };
  auto place = [&](size_t reader, size_t writer) { return chunk * (reader < writer ? reader : reader - 1); };
  for (size_t first = 0; first < largest; first += chunk) {
    const uint32_t step = next_step();
    char* mine = slot(step, rank_);
    for (size_t q = 0; q < ranks; ++q) {
      const size_t n = piece(send_bytes[q], first);
      if (q != me && n > 0) copy_to_peers(mine + place(q, me), in + send_offsets[q] + first, n);
    }
    publish(kAlltoallv, 0);
    copy_own(first, piece(send_bytes[me], first));
    wait_for_all(step, deadline);
    for (size_t q = 0; q < ranks; ++q) {
      const size_t n = piece(recv_bytes[q], first);
      if (q != me && n > 0) copy_out(out + recv_offsets[q] + first, slot(step, static_cast<int>(q)) + place(me, q), n);
    }
  }
  // What is left of the own block (all of it in a world of one).
  const size_t own_done = largest == 0 ? 0 : (largest + chunk - 1) / chunk * chunk;
  if (send_bytes[me] > own_done) copy_own(own_done, send_bytes[me] - own_done);
}

void ShmGroup::barrier(std::chrono::milliseconds timeout) {
  const uint32_t step = publish(kBarrier, 0);
  wait_for_all(step, Deadline(timeout));
}


}  // namespace backplane::gloo_plugin
