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

// Elements of a piece of at most `piece_bytes` (one at least).
size_t piece_elements(size_t element, size_t piece_bytes) { return std::max<size_t>(1, piece_bytes / element); }

// The pieces `count` elements go in: one at least (an empty transfer still pairs the ranks' rounds).
size_t pieces(size_t count, size_t piece) { return count == 0 ? 1 : (count + piece - 1) / piece; }

// Piece `p` of `count` elements: its first element and its length (0 past the end).
std::pair<size_t, size_t> piece_of(size_t count, size_t piece, size_t p) {
  const size_t begin = std::min(count, p * piece);
  return {begin, std::min(piece, count - begin)};
}

// One step of a reduction: `out_n` elements at `out` go to `to` (none when it is -1) while `in_n`
// elements come from `from` (none when -1) through `scratch`, piece by piece, each folded into `into` (with `with`, or `into` itself, as
// its other operand) once it arrived. A rank's pieces of a block are its neighbour's: their rounds pair.
void exchange_and_fold(Schedule& schedule, const char* out, size_t out_n, int to, char* into, const char* with,
                       size_t in_n, int from, char* scratch, size_t element, size_t piece_bytes) {
  const size_t piece = piece_elements(element, piece_bytes);
  const size_t rounds = std::max(to >= 0 ? pieces(out_n, piece) : 0, from >= 0 ? pieces(in_n, piece) : 0);
  for (size_t p = 0; p < rounds; ++p) {
    Fold fold;
    if (from >= 0 && p < pieces(in_n, piece)) {
      const auto [begin, n] = piece_of(in_n, piece, p);
      schedule.add(receive(scratch, n * element, from));
      fold = {into + begin * element, scratch, n, with != nullptr ? with + begin * element : nullptr};
    }
    if (to >= 0 && p < pieces(out_n, piece)) {
      const auto [begin, n] = piece_of(out_n, piece, p);
      schedule.add(send(out + begin * element, n * element, to));
    }
    schedule.end_round(fold);
  }
}

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

void ring(Schedule& schedule, const char* input, char* data, char* scratch, size_t count, size_t element, int rank,
          int size, size_t piece_bytes) {
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  auto at = [&](auto* base, int b) {
    b = ((b % size) + size) % size;
    const size_t begin = block_begin(count, size, b), end = block_begin(count, size, b + 1);
    return std::make_pair(base + begin * element, end - begin);
  };
  auto block = [&](int b) { return at(data, b); };
  // Reduce-scatter: in step s this rank sends block rank - s (its own input first, then its partial
  // sum) and folds block rank - s - 1 from the previous rank with its own input into `data`; after
  // size - 1 steps it holds block rank + 1 whole. Each block is folded once: the input is read where
  // it lies, never copied into `data`.
  for (int s = 0; s < size - 1; ++s) {
    const auto [out, out_n] = s == 0 ? at(input, rank) : at(static_cast<const char*>(data), rank - s);
    const auto [in, in_n] = block(rank - s - 1);
    const char* own = at(input, rank - s - 1).first;
    exchange_and_fold(schedule, out, out_n, next, in, own == in ? nullptr : own, in_n, prev, scratch, element,
                      piece_bytes);
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
    schedule.add({to_root, own, blocks.bytes(rank), root});
  } else {
    for (int q = 0; q < size; ++q) {
      if (q != root) schedule.add({!to_root, root_buffer + blocks.offset(q), blocks.bytes(q), q});
    }
  }
  schedule.end_round();
}

}  // namespace

size_t allreduce_scratch_bytes(size_t count, size_t element, int size, bool ring, size_t piece_bytes) {
  if (!ring) return count * element;
  return std::min(count / static_cast<size_t>(size) + 1, piece_elements(element, piece_bytes)) * element;
}

size_t reduce_scatter_scratch_bytes(size_t block_count, size_t element, int size, size_t piece_bytes) {
  // Partial sums of whole blocks between steps; the last step's pieces need no more than a piece.
  if (size > 2) return 2 * block_count * element;
  return std::min(block_count, piece_elements(element, piece_bytes)) * element;
}

size_t reduce_scratch_bytes(size_t count, size_t element, size_t piece_bytes) {
  return std::min(count, piece_elements(element, piece_bytes)) * element;
}

void allreduce_rounds(Schedule& schedule, const char* input, char* data, char* scratch, size_t count, size_t element,
                      int rank, int size, bool ring_form, size_t piece_bytes) {
  if (size == 1) return;
  if (ring_form) {
    ring(schedule, input, data, scratch, count, element, rank, size, piece_bytes);
  } else {
    recursive_doubling(schedule, data, scratch, count, element, rank, size);
  }
}

void allgather_rounds(Schedule& schedule, char* data, const char* own, const Blocks& blocks, int rank, int size) {
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  for (int s = 0; s < size - 1; ++s) {
    const int out = (rank - s + size) % size, in = (rank - s - 1 + size) % size;
    const char* from = s == 0 ? own : data + blocks.offset(out);
    schedule.add(receive(data + blocks.offset(in), blocks.bytes(in), prev));
    schedule.add(send(from, blocks.bytes(out), next));
    schedule.end_round();
  }
}

void alltoall_rounds(Schedule& schedule, const char* send_buffer, const Blocks& send_blocks, char* recv,
                     const Blocks& recv_blocks, int rank, int size) {
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    schedule.add(receive(recv + recv_blocks.offset(q), recv_blocks.bytes(q), q));
    schedule.add(send(send_buffer + send_blocks.offset(q), send_blocks.bytes(q), q));
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
                           size_t element, int rank, int size, size_t piece_bytes) {
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  const size_t block_bytes = block_count * element;
  auto own = [&](int b) { return send_buffer + static_cast<size_t>(((b % size) + size) % size) * block_bytes; };
  char* partial[2] = {scratch, scratch + block_bytes};  // received in step s, sent on in step s + 1
  for (int s = 0; s < size - 1; ++s) {
    const char* out = s == 0 ? own(rank - 1) : partial[(s + 1) % 2];
    if (s < size - 2) {
      char* in = partial[s % 2];
      schedule.add(receive(in, block_bytes, prev));
      schedule.add(send(out, block_bytes, next));
      schedule.end_round({in, in, block_count, own(rank - s - 2)});
    } else {  // the last step: this rank's own block, into recv
      exchange_and_fold(schedule, out, block_count, next, recv, own(rank), block_count, prev, partial[s % 2], element,
                        piece_bytes);
    }
  }
}

void reduce_rounds(Schedule& schedule, const char* send_buffer, char* result, char* work, char* scratch, size_t count,
                   size_t element, int root, int rank, int size, size_t piece_bytes) {
  // Ranks relative to the root: v receives from v + 2^k while bit k of v is clear, then sends its
  // partial sum to v - 2^k at its lowest set bit.
  const int v = (rank - root + size) % size;
  auto real = [&](int relative) { return (relative + root) % size; };
  char* sum = rank == root ? result : work;
  const char* partial = send_buffer;  // until the first fold
  for (int mask = 1; mask < size; mask *= 2) {
    if ((v & mask) != 0) {
      exchange_and_fold(schedule, partial, count, real(v - mask), nullptr, nullptr, 0, -1, nullptr, element, piece_bytes);
      break;
    }
    if (v + mask < size) {
      exchange_and_fold(schedule, nullptr, 0, -1, sum, partial, count, real(v + mask), scratch, element, piece_bytes);
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
