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

std::vector<Round> recursive_doubling(char* data, char* scratch, size_t count, size_t element, int rank, int size) {
  const size_t bytes = count * element;
  const Fold fold_in{data, scratch, count};
  std::vector<Round> rounds;
  int power = 1;
  while (power * 2 <= size) power *= 2;
  const int extra = size - power;  // ranks 0, 2, .., 2*extra-2 hand their data to the next odd rank
  if (rank < 2 * extra) {
    if (rank % 2 == 0) {
      rounds.push_back({{{true, data, bytes, rank + 1}}, {}});
      rounds.push_back({{{false, data, bytes, rank + 1}}, {}});  // the result, at the end
      return rounds;
    }
    rounds.push_back({{{false, scratch, bytes, rank - 1}}, fold_in});
  }
  // Ranks of the power-of-two exchange: odd ranks below 2*extra, then every rank from 2*extra.
  const int virtual_rank = rank < 2 * extra ? rank / 2 : rank - extra;
  auto real_rank = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  for (int mask = 1; mask < power; mask *= 2) {
    const int peer = real_rank(virtual_rank ^ mask);
    rounds.push_back({{{false, scratch, bytes, peer}, {true, data, bytes, peer}}, fold_in});
  }
  if (rank < 2 * extra) rounds.push_back({{{true, data, bytes, rank - 1}}, {}});
  return rounds;
}

std::vector<Round> ring(char* data, char* scratch, size_t count, size_t element, int rank, int size) {
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  auto block = [&](int b) {
    b = ((b % size) + size) % size;
    const size_t begin = block_begin(count, size, b), end = block_begin(count, size, b + 1);
    return std::pair<char*, size_t>(data + begin * element, end - begin);
  };
  std::vector<Round> rounds;
  // Reduce-scatter: in step s this rank sends block rank - s (its partial sum) and folds block
  // rank - s - 1 from the previous rank into its own; after size - 1 steps it holds block rank + 1 whole.
  for (int s = 0; s < size - 1; ++s) {
    const auto [out, out_n] = block(rank - s);
    const auto [in, in_n] = block(rank - s - 1);
    rounds.push_back({{{false, scratch, in_n * element, prev}, {true, out, out_n * element, next}}, {in, scratch, in_n}});
  }
  // Allgather: in step s this rank passes on block rank + 1 - s and receives block rank - s in place.
  for (int s = 0; s < size - 1; ++s) {
    const auto [out, out_n] = block(rank + 1 - s);
    const auto [in, in_n] = block(rank - s);
    rounds.push_back({{{false, in, in_n * element, prev}, {true, out, out_n * element, next}}, {}});
  }
  return rounds;
}

}  // namespace

size_t allreduce_scratch_bytes(size_t count, size_t element, int size, bool ring) {
  return ring ? (count / static_cast<size_t>(size) + 1) * element : count * element;
}

std::vector<Round> allreduce_rounds(char* data, char* scratch, size_t count, size_t element, int rank, int size,
                                    bool ring_form) {
  if (size == 1) return {};
  return ring_form ? ring(data, scratch, count, element, rank, size)
                   : recursive_doubling(data, scratch, count, element, rank, size);
}

std::vector<Round> allgather_rounds(char* data, const char* own, const Blocks& blocks, int rank, int size) {
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  std::vector<Round> rounds;
  for (int s = 0; s < size - 1; ++s) {
    const auto out = static_cast<size_t>((rank - s + size) % size), in = static_cast<size_t>((rank - s - 1 + size) % size);
    char* from = s == 0 ? const_cast<char*>(own) : data + blocks.offsets[out];
    rounds.push_back({{{false, data + blocks.offsets[in], blocks.bytes[in], prev}, {true, from, blocks.bytes[out], next}}, {}});
  }
  return rounds;
}

std::vector<Round> alltoall_rounds(const char* send, const Blocks& send_blocks, char* recv, const Blocks& recv_blocks,
                                   int rank, int size) {
  Round round;
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    const auto i = static_cast<size_t>(q);
    round.transfers.push_back({false, recv + recv_blocks.offsets[i], recv_blocks.bytes[i], q});
    round.transfers.push_back({true, const_cast<char*>(send) + send_blocks.offsets[i], send_blocks.bytes[i], q});
  }
  std::vector<Round> rounds;
  rounds.push_back(std::move(round));
  return rounds;
}

namespace {

// Gather (`to_root`) or scatter in one round: the root exchanges with every other rank its block of
// `blocks` in `root_buffer`; the others send or receive `own`.
std::vector<Round> rooted_round(char* root_buffer, char* own, const Blocks& blocks, int root, int rank, int size,
                                bool to_root) {
  Round round;
  if (rank != root) {
    round.transfers.push_back({to_root, own, blocks.bytes[static_cast<size_t>(rank)], root});
  } else {
    for (int q = 0; q < size; ++q) {
      const auto i = static_cast<size_t>(q);
      if (q != root) round.transfers.push_back({!to_root, root_buffer + blocks.offsets[i], blocks.bytes[i], q});
    }
  }
  std::vector<Round> rounds;
  rounds.push_back(std::move(round));
  return rounds;
}

}  // namespace

std::vector<Round> gather_rounds(const char* send, char* recv, const Blocks& blocks, int root, int rank, int size) {
  return rooted_round(recv, const_cast<char*>(send), blocks, root, rank, size, /*to_root=*/true);
}

std::vector<Round> scatter_rounds(const char* send, char* recv, const Blocks& blocks, int root, int rank, int size) {
  return rooted_round(const_cast<char*>(send), recv, blocks, root, rank, size, /*to_root=*/false);
}

std::vector<Round> broadcast_rounds(char* data, size_t bytes, int root, int rank, int size) {
  // Ranks relative to the root: v's parent is v without its lowest set bit, its children v + 2^k for
  // every 2^k below that bit (the root: below size).
  const int v = (rank - root + size) % size;
  auto real = [&](int relative) { return (relative + root) % size; };
  std::vector<Round> rounds;
  int low = 1;
  while (low < size && (v & low) == 0) low *= 2;
  if (v != 0) rounds.push_back({{{false, data, bytes, real(v - low)}}, {}});
  Round children;  // the root's lowest set bit lies beyond every rank: all powers of two are its children
  for (int k = low / 2; k >= 1; k /= 2) {
    if (v + k < size) children.transfers.push_back({true, data, bytes, real(v + k)});
  }
  if (!children.transfers.empty()) rounds.push_back(std::move(children));
  return rounds;
}

std::vector<Round> barrier_rounds(int rank, int size) {
  std::vector<Round> rounds;
  for (int distance = 1; distance < size; distance *= 2) {
    rounds.push_back({{{false, nullptr, 0, (rank - distance + size) % size}, {true, nullptr, 0, (rank + distance) % size}}, {}});
  }
  return rounds;
}

}  // namespace backplane::mpi_plugin
