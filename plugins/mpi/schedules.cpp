#include "schedules.h"

#include <algorithm>
#include <utility>

namespace backplane::mpi_plugin {

namespace {

// The first element of block b of `count` elements split over `size` blocks (the first ones one larger).
size_t block_begin(size_t count, int size, int b) {
  const size_t n = static_cast<size_t>(size), i = static_cast<size_t>(b);
  return count / n * i + std::min(i, count % n);
}

Transfer send(const void* buffer, size_t bytes, int peer) { return {true, const_cast<void*>(buffer), bytes, peer}; }
Transfer receive(void* buffer, size_t bytes, int peer) { return {false, buffer, bytes, peer}; }

void recursive_doubling(Schedule& schedule, char* data, char* scratch, size_t count, size_t element, int rank, int size) {
  const size_t bytes = count * element;
  const Fold fold_in{data, scratch, count};
  int power = 1;
  while (power * 2 <= size) power *= 2;
  const int extra = size - power;  // ranks 0, 2, .., 2*extra-2 hand their data to the next odd rank
  if (rank < 2 * extra) {
    if (rank % 2 == 0) {
      schedule.add(send(data, bytes, rank + 1));
      schedule.end_round();
      schedule.add(receive(data, bytes, rank + 1));  // the result, at the end
      schedule.end_round();
      return;
    }
    schedule.add(receive(scratch, bytes, rank - 1));
    schedule.end_round(fold_in);
  }
  // Ranks of the power-of-two exchange: odd ranks below 2*extra, then every rank from 2*extra.
  const int virtual_rank = rank < 2 * extra ? rank / 2 : rank - extra;
  auto real_rank = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  for (int mask = 1; mask < power; mask *= 2) {
    const int peer = real_rank(virtual_rank ^ mask);
    schedule.add(receive(scratch, bytes, peer));
    schedule.add(send(data, bytes, peer));
    schedule.end_round(fold_in);
  }
  if (rank < 2 * extra) {
    schedule.add(send(data, bytes, rank - 1));
    schedule.end_round();
  }
}

void ring(Schedule& schedule, char* data, char* scratch, size_t count, size_t element, int rank, int size) {
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  auto block = [&](int b) {
    b = ((b % size) + size) % size;
    const size_t begin = block_begin(count, size, b), end = block_begin(count, size, b + 1);
    return std::pair<char*, size_t>(data + begin * element, end - begin);
  };
  // Reduce-scatter: in step s this rank sends block rank - s (its partial sum) and folds block
  // rank - s - 1 from the previous rank into its own; after size - 1 steps it holds block rank + 1 whole.
  for (int s = 0; s < size - 1; ++s) {
    const auto [out, out_n] = block(rank - s);
    const auto [in, in_n] = block(rank - s - 1);
    schedule.add(receive(scratch, in_n * element, prev));
    schedule.add(send(out, out_n * element, next));
    schedule.end_round({in, scratch, in_n});
  }
  // Allgather: in step s this rank passes on block rank + 1 - s and receives block rank - s in place.
  for (int s = 0; s < size - 1; ++s) {
    const auto [out, out_n] = block(rank + 1 - s);
    const auto [in, in_n] = block(rank - s);
    schedule.add(receive(in, in_n * element, prev));
    schedule.add(send(out, out_n * element, next));
    schedule.end_round();
  }
}

// Gather (`to_root`) or scatter in one round: the root exchanges with every other rank its block of
// `blocks` in `root_buffer`; the others send or receive `own`.
void rooted_round(Schedule& schedule, char* root_buffer, char* own, const Blocks& blocks, int root, int rank, int size,
                  bool to_root) {
  if (rank != root) {
    schedule.add({to_root, own, blocks.bytes[static_cast<size_t>(rank)], root});
  } else {
    for (int q = 0; q < size; ++q) {
      const auto i = static_cast<size_t>(q);
      if (q != root) schedule.add({!to_root, root_buffer + blocks.offsets[i], blocks.bytes[i], q});
    }
  }
  schedule.end_round();
}

}  // namespace

size_t allreduce_scratch_bytes(size_t count, size_t element, int size, bool ring) {
  return ring ? (count / static_cast<size_t>(size) + 1) * element : count * element;
}

void allreduce_rounds(Schedule& schedule, char* data, char* scratch, size_t count, size_t element, int rank, int size,
                      bool ring_form) {
  if (size == 1) return;
  if (ring_form) {
    ring(schedule, data, scratch, count, element, rank, size);
  } else {
    recursive_doubling(schedule, data, scratch, count, element, rank, size);
  }
}

void allgather_rounds(Schedule& schedule, char* data, const char* own, const Blocks& blocks, int rank, int size) {
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  for (int s = 0; s < size - 1; ++s) {
    const auto out = static_cast<size_t>((rank - s + size) % size), in = static_cast<size_t>((rank - s - 1 + size) % size);
    const char* from = s == 0 ? own : data + blocks.offsets[out];
    schedule.add(receive(data + blocks.offsets[in], blocks.bytes[in], prev));
    schedule.add(send(from, blocks.bytes[out], next));
    schedule.end_round();
  }
}

void alltoall_rounds(Schedule& schedule, const char* send_buffer, const Blocks& send_blocks, char* recv,
                     const Blocks& recv_blocks, int rank, int size) {
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    const auto i = static_cast<size_t>(q);
    schedule.add(receive(recv + recv_blocks.offsets[i], recv_blocks.bytes[i], q));
    schedule.add(send(send_buffer + send_blocks.offsets[i], send_blocks.bytes[i], q));
  }
  schedule.end_round();
}

void gather_rounds(Schedule& schedule, const char* send_buffer, char* recv, const Blocks& blocks, int root, int rank,
                   int size) {
  rooted_round(schedule, recv, const_cast<char*>(send_buffer), blocks, root, rank, size, /*to_root=*/true);
}

void scatter_rounds(Schedule& schedule, const char* send_buffer, char* recv, const Blocks& blocks, int root, int rank,
                    int size) {
  rooted_round(schedule, const_cast<char*>(send_buffer), recv, blocks, root, rank, size, /*to_root=*/false);
}

void reduce_scatter_rounds(Schedule& schedule, const char* send_buffer, char* recv, char* scratch, size_t block_count,
                           size_t element, int rank, int size) {
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  const size_t block_bytes = block_count * element;
  auto own = [&](int b) { return send_buffer + static_cast<size_t>(((b % size) + size) % size) * block_bytes; };
  char* partial[2] = {scratch, scratch + block_bytes};  // received in round s, sent on in round s + 1
  for (int s = 0; s < size - 1; ++s) {
    const char* out = s == 0 ? own(rank - 1) : partial[(s + 1) % 2];
    char* in = partial[s % 2];
    char* into = s == size - 2 ? recv : in;
    schedule.add(receive(in, block_bytes, prev));
    schedule.add(send(out, block_bytes, next));
    schedule.end_round({into, in, block_count, own(rank - s - 2)});
  }
}

void reduce_rounds(Schedule& schedule, const char* send_buffer, char* result, char* work, char* scratch, size_t count,
                   size_t element, int root, int rank, int size) {
  // Ranks relative to the root: v receives from v + 2^k while bit k of v is clear, then sends its
  // partial sum to v - 2^k at its lowest set bit.
  const int v = (rank - root + size) % size;
  auto real = [&](int relative) { return (relative + root) % size; };
  const size_t bytes = count * element;
  char* sum = rank == root ? result : work;
  const char* partial = send_buffer;  // until the first fold
  for (int mask = 1; mask < size; mask *= 2) {
    if ((v & mask) != 0) {
      schedule.add(send(partial, bytes, real(v - mask)));
      schedule.end_round();
      break;
    }
    if (v + mask < size) {
      schedule.add(receive(scratch, bytes, real(v + mask)));
      schedule.end_round({sum, scratch, count, partial});
      partial = sum;
    }
  }
}

void broadcast_rounds(Schedule& schedule, char* data, size_t bytes, int root, int rank, int size) {
  // Ranks relative to the root: v's parent is v without its lowest set bit, its children v + 2^k for
  // every 2^k below that bit (the root: below size).
  const int v = (rank - root + size) % size;
  auto real = [&](int relative) { return (relative + root) % size; };
  int low = 1;
  while (low < size && (v & low) == 0) low *= 2;
  if (v != 0) {
    schedule.add(receive(data, bytes, real(v - low)));
    schedule.end_round();
  }
  bool children = false;  // the root's lowest set bit lies beyond every rank: all powers of two are its children
  for (int k = low / 2; k >= 1; k /= 2) {
    if (v + k < size) {
      schedule.add(send(data, bytes, real(v + k)));
      children = true;
    }
  }
  if (children) schedule.end_round();
}

void barrier_rounds(Schedule& schedule, int rank, int size) {
  for (int distance = 1; distance < size; distance *= 2) {
    schedule.add(receive(nullptr, 0, (rank - distance + size) % size));
    schedule.add(send(nullptr, 0, (rank + distance) % size));
    schedule.end_round();
  }
}

}  // namespace backplane::mpi_plugin
