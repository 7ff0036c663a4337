#include "shm_group.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>

#include "local_process.h"
#include "plugin_support.h"

namespace backplane::gloo_plugin {

namespace {

constexpr uint64_t kMagic = 0x62706c73686d3031;  // "bplshm01"
constexpr size_t kLine = 64;                     // one cache line per counter: no false sharing
constexpr auto kSpin = std::chrono::microseconds(20);  // a peer a step behind arrives within this
constexpr int kYields = 200;  // then yields: with more ranks than cores, the peer needs this core
constexpr auto kSleepSlice = std::chrono::milliseconds(5);
constexpr auto kLivenessInterval = std::chrono::milliseconds(10);

static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free,
              "a futex word is a lock-free 32-bit atomic");

enum Kind : uint32_t { kAllreduce = 1, kBroadcast, kAllgather, kReduceScatter, kAlltoall, kBarrier };

const char* kind_name(uint32_t kind) {
  switch (kind) {
    case kAllreduce: return "allreduce";
    case kBroadcast: return "broadcast";
    case kAllgather: return "allgather";
    case kReduceScatter: return "reduce_scatter";
    case kAlltoall: return "alltoall";
    case kBarrier: return "barrier";
    default: return "?";
  }
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Copies between a caller's buffer and the segment. Not memcpy: glibc 2.36 copies a few KiB and more
// with `rep movsb`, which on AMD Zen runs 4-7x slower when source and destination lie a few bytes
// apart modulo 4096 (page aliasing), and that is the common case here: a buffer from malloc starts 16
// bytes into a page, a slot at a page's start. Measured with 2 ranks on an EPYC VM: allreduce of
// 256 KiB-64 MiB at ~1.15 GB/s from a buffer at page offset 16, against 4.7-8 GB/s at offset 0 or 64.
// A loop of 16-byte vector moves does not care where the buffers lie.
void copy_bytes(void* to, const void* from, size_t n) {
#if defined(__SSE2__)
  auto* dst = static_cast<char*>(to);
  const auto* src = static_cast<const char*>(from);
  for (; n >= 64; n -= 64, src += 64, dst += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 32), c);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 48), d);
  }
  std::memcpy(dst, src, n);
#else
  std::memcpy(to, from, n);
#endif
}

std::string system_error(const std::string& what, const std::string& name) {
  return "shared memory: " + what + " of segment " + name + " failed: " + std::strerror(errno);
}

}  // namespace

// A rank's published step, and what it does in the last two steps (by step % 2: a peer is at most one
// step ahead), so that ranks calling different collectives or sizes find out at once instead of
// reading each other's data wrongly.
struct alignas(kLine) ShmGroup::Progress {
  std::atomic<uint32_t> step;
  uint32_t kind[2];
  uint64_t bytes[2];
};

struct alignas(kLine) ShmGroup::Header {
  uint64_t magic;
  uint32_t size;
  alignas(kLine) std::atomic<uint32_t> failed_by;  // 0, or 1 + the rank whose record follows
  int32_t status;
  char reason[512];
  alignas(kLine) std::atomic<uint32_t> sleepers;  // waiters in futex_wait: publishers wake only then
};

size_t ShmGroup::header_bytes() {
  static_assert(sizeof(Progress) == kLine, "one progress record per cache line");
  return round_up(sizeof(Header), kLine);
}

size_t ShmGroup::buffers_offset(int size) {
  return round_up(header_bytes() + kLine * static_cast<size_t>(size), 4096);
}

namespace {

constexpr char kNamePrefix[] = "backplane-";

// The digits of this process's pid namespace ("pid:[4026531836]" -> "4026531836").
std::string pid_namespace_number() {
  std::string digits;
  for (char c : plugin::pid_namespace()) {
    if (c >= '0' && c <= '9') digits += c;
  }
  return digits.empty() ? "0" : digits;
}

}  // namespace

std::string ShmGroup::new_segment_name(pid_t creator) {
  std::random_device random;
  char suffix[17];
  std::snprintf(suffix, sizeof(suffix), "%08x%08x", random(), random());
  return "/" + std::string(kNamePrefix) + std::to_string(creator != 0 ? creator : ::getpid()) + "-" +
         pid_namespace_number() + "-" + suffix;
}

int ShmGroup::remove_abandoned_segments() {
  DIR* folder = ::opendir("/dev/shm");  // where glibc's shm_open keeps the names
  if (folder == nullptr) return 0;
  const std::string own_namespace = "-" + pid_namespace_number() + "-";
  int removed = 0;
  while (const dirent* entry = ::readdir(folder)) {
    const std::string name = entry->d_name;
    if (name.compare(0, sizeof(kNamePrefix) - 1, kNamePrefix) != 0) continue;
    // "<pid>-<namespace>-<random>" after the prefix; anything else is not ours to judge.
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + sizeof(kNamePrefix) - 1, &end, 10);
    if (pid <= 0 || std::string(end).compare(0, own_namespace.size(), own_namespace) != 0) continue;
    struct stat info {};
    if (::fstatat(::dirfd(folder), name.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0 || info.st_uid != ::geteuid()) continue;
    if (plugin::process_state(static_cast<pid_t>(pid)) != plugin::ProcessState::kEnded) continue;
    if (::shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  ::closedir(folder);
  return removed;
}

size_t ShmGroup::segment_bytes(int size) { return buffers_offset(size) + 2 * kSlotBytes * static_cast<size_t>(size); }

ShmGroup::ShmGroup(void* base, size_t bytes, int rank, int size)
    : base_(base),
      bytes_(bytes),
      rank_(rank),
      size_(size),
      header_(static_cast<Header*>(base)),
      progress_(reinterpret_cast<Progress*>(static_cast<char*>(base) + header_bytes())),
      inputs_(static_cast<size_t>(size)) {}

ShmGroup::~ShmGroup() { ::munmap(base_, bytes_); }

std::unique_ptr<ShmGroup> ShmGroup::create(const std::string& name, int size) {
  const size_t bytes = segment_bytes(size);
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw plugin::Error(BPL_ERR_IO, system_error("creation", name));
  // Reserve the pages now: a full /dev/shm is an error here, not a SIGBUS at the first write.
  const int reserved = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  void* base = reserved == 0 ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (reserved != 0) errno = reserved;
  const int saved_errno = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    errno = saved_errno;
    throw plugin::Error(BPL_ERR_IO, system_error(reserved != 0 ? "reserving " + std::to_string(bytes) + " bytes" : "mapping", name));
  }
  auto* header = new (base) Header();
  header->size = static_cast<uint32_t>(size);
  for (int r = 0; r < size; ++r) new (static_cast<char*>(base) + header_bytes() + kLine * static_cast<size_t>(r)) Progress();
  std::atomic_thread_fence(std::memory_order_release);
  header->magic = kMagic;
  return std::unique_ptr<ShmGroup>(new ShmGroup(base, bytes, 0, size));
}

std::unique_ptr<ShmGroup> ShmGroup::open(const std::string& name, int rank, int size) {
  const size_t bytes = segment_bytes(size);
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) throw plugin::Error(BPL_ERR_IO, system_error("opening", name));
  struct stat info {};
  if (::fstat(fd, &info) != 0 || static_cast<size_t>(info.st_size) != bytes) {
    ::close(fd);
    throw plugin::Error(BPL_ERR_IO, "shared memory: segment " + name + " has " + std::to_string(info.st_size) +
                                        " bytes, expected " + std::to_string(bytes));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) throw plugin::Error(BPL_ERR_IO, system_error("mapping", name));
  auto group = std::unique_ptr<ShmGroup>(new ShmGroup(base, bytes, rank, size));
  if (group->header_->magic != kMagic || group->header_->size != static_cast<uint32_t>(size)) {
    throw plugin::Error(BPL_ERR_IO, "shared memory: segment " + name + " is not a backplane segment for " +
                                        std::to_string(size) + " ranks");
  }
  return group;
}

char* ShmGroup::slot(uint32_t step, int rank) const {
  const size_t buffer = step % 2;
  return static_cast<char*>(base_) + buffers_offset(size_) +
         kSlotBytes * (buffer * static_cast<size_t>(size_) + static_cast<size_t>(rank));
}

uint32_t ShmGroup::publish(uint32_t kind, uint64_t bytes) {
  const uint32_t step = ++steps_;
  Progress& mine = progress_[rank_];
  mine.kind[step % 2] = kind;
  mine.bytes[step % 2] = bytes;
  mine.step.store(step, std::memory_order_seq_cst);  // releases the slot's data and the record above
  if (header_->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&mine.step);
  return step;
}

void ShmGroup::fail(bpl_status status, const std::string& reason) {
  uint32_t none = 0;
  if (header_->failed_by.load(std::memory_order_acquire) == 0) {
    // Claim the record with a placeholder rank first, so that nobody reads a half-written reason.
    if (header_->failed_by.compare_exchange_strong(none, UINT32_MAX)) {
      const size_t n = std::min(reason.size(), sizeof(header_->reason) - 1);
      std::memcpy(header_->reason, reason.data(), n);
      header_->reason[n] = '\0';
      header_->status = status;
      header_->failed_by.store(1 + static_cast<uint32_t>(rank_), std::memory_order_release);
    }
  }
  for (int r = 0; r < size_; ++r) futex_wake_all(&progress_[r].step);
}

void ShmGroup::throw_failure_record() {
  uint32_t by = header_->failed_by.load(std::memory_order_acquire);
  while (by == UINT32_MAX) {  // being written: a few instructions away
    cpu_relax();
    by = header_->failed_by.load(std::memory_order_acquire);
  }
  const int by_rank = static_cast<int>(by - 1);
  auto status = static_cast<bpl_status>(header_->status);
  if (by_rank == rank_) throw plugin::Error(status, header_->reason);
  if (status == BPL_ERR_ABORTED) status = BPL_ERR_REMOTE;  // for the peers, a rank went away
  throw plugin::Error(status, std::string(header_->reason) + " [the communicator's first failure, seen by rank " +
                                  std::to_string(rank_name(by_rank)) + "]");
}

void ShmGroup::wait_for(int peer, uint32_t step, std::chrono::steady_clock::time_point deadline) {
  std::atomic<uint32_t>& counter = progress_[peer].step;
  auto reached = [&] { return static_cast<int32_t>(counter.load(std::memory_order_acquire) - step) >= 0; };
  auto failed = [&] { return header_->failed_by.load(std::memory_order_acquire) != 0; };
  const auto spin_until = std::chrono::steady_clock::now() + kSpin;
  for (uint32_t i = 1;; ++i) {
    if (reached()) return;
    if ((i & 63) == 0) {
      if (failed()) throw_failure_record();
      if (std::chrono::steady_clock::now() >= spin_until) break;
    }
    cpu_relax();
  }
  for (int i = 0; i < kYields; ++i) {
    if (reached()) return;
    ::sched_yield();
  }
  const pid_t pid = peer_pids_.size() > static_cast<size_t>(peer) ? peer_pids_[static_cast<size_t>(peer)] : 0;
  auto next_liveness_check = std::chrono::steady_clock::now();
  for (;;) {
    if (reached()) return;
    if (failed()) throw_failure_record();
    const auto now = std::chrono::steady_clock::now();
    if (pid != 0 && now >= next_liveness_check) {
      if (plugin::process_state(pid) == plugin::ProcessState::kEnded) {
        const std::string reason = "shared memory: " + plugin::local_peer_description(rank_name(peer), pid, plugin::ProcessState::kEnded);
        fail(BPL_ERR_REMOTE, reason);
        throw plugin::Error(BPL_ERR_REMOTE, reason);
      }
      next_liveness_check = now + kLivenessInterval;
    }
    if (now >= deadline) {
      std::string reason = "shared memory: rank " + std::to_string(rank_name(peer)) + " did not arrive in time";
      if (pid != 0 && plugin::process_state(pid) == plugin::ProcessState::kStopped) {
        reason += " (" + plugin::local_peer_description(rank_name(peer), pid, plugin::ProcessState::kStopped) + ")";
      }
      fail(BPL_ERR_TIMEOUT, reason);
      throw plugin::Error(BPL_ERR_TIMEOUT, reason);
    }
    header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = counter.load(std::memory_order_seq_cst);
    if (static_cast<int32_t>(seen - step) < 0 && !failed()) {
      futex_wait(&counter, seen, std::min<std::chrono::nanoseconds>(kSleepSlice, deadline - now));
    }
    header_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void ShmGroup::wait_for_all(uint32_t step, std::chrono::steady_clock::time_point deadline) {
  const Progress& mine = progress_[rank_];
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    wait_for(r, step, deadline);
    const Progress& theirs = progress_[r];
    if (theirs.kind[step % 2] != mine.kind[step % 2] || theirs.bytes[step % 2] != mine.bytes[step % 2]) {
      throw plugin::Error(BPL_ERR_MISMATCH,
                          "shared memory: ranks disagree: rank " + std::to_string(rank_name(r)) + " calls " +
                              kind_name(theirs.kind[step % 2]) + " of " + std::to_string(theirs.bytes[step % 2]) +
                              " bytes, this rank " + kind_name(mine.kind[step % 2]) + " of " +
                              std::to_string(mine.bytes[step % 2]) + " bytes");
    }
  }
  // A step every rank reached still fails once the group has failed: a rank that aborted or timed out
  // does not see this operation through, so no peer may report it as done.
  if (header_->failed_by.load(std::memory_order_acquire) != 0) throw_failure_record();
}

namespace {

std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  return std::chrono::steady_clock::now() + timeout;
}

// out = a[0] op a[1] op ... in rank order, so that every rank computes bit-identical results.
void reduce_in_rank_order(void* out, const std::vector<const char*>& inputs, size_t count, plugin::ReduceFn reduce) {
  reduce(out, inputs[0], inputs[1], count);
  for (size_t q = 2; q < inputs.size(); ++q) reduce(out, out, inputs[q], count);
}

}  // namespace

void ShmGroup::allreduce(const void* send, void* recv, size_t count, bpl_dtype acc, plugin::ReduceFn reduce,
                         std::chrono::milliseconds timeout) {
  const auto deadline = deadline_after(timeout);
  const size_t element = plugin::dtype_size(acc);
  const size_t total = count * element;
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  std::vector<const char*>& inputs = inputs_;
  if (total <= kFlatAllreduceBytes) {
    // One step: everyone's data in, every rank reduces all of it.
    const uint32_t step = next_step();
    copy_bytes(slot(step, rank_), in, total);
    publish(kAllreduce, total);
    wait_for_all(step, deadline);
    for (int q = 0; q < size_; ++q) inputs[static_cast<size_t>(q)] = slot(step, q);
    reduce_in_rank_order(out, inputs, count, reduce);
    return;
  }
  // Chunks of one slot: step 1 copies the chunk in; in step 2 each rank reduces its share of the chunk
  // into its slot of the other buffer; then every rank copies all shares out.
  const size_t chunk_elements = kSlotBytes / element;
  for (size_t first = 0; first < count; first += chunk_elements) {
    const size_t n = std::min(chunk_elements, count - first);
    const uint32_t copy_step = next_step();
    copy_bytes(slot(copy_step, rank_), in + first * element, n * element);
    publish(kAllreduce, total);
    wait_for_all(copy_step, deadline);
    auto share_begin = [&](int q) { return n * static_cast<size_t>(q) / static_cast<size_t>(size_); };
    const size_t mine = share_begin(rank_), mine_n = share_begin(rank_ + 1) - mine;
    for (int q = 0; q < size_; ++q) inputs[static_cast<size_t>(q)] = slot(copy_step, q) + mine * element;
    const uint32_t reduce_step = next_step();
    if (mine_n > 0) reduce_in_rank_order(slot(reduce_step, rank_) + mine * element, inputs, mine_n, reduce);
    publish(kAllreduce, total);
    wait_for_all(reduce_step, deadline);
    for (int q = 0; q < size_; ++q) {
      const size_t begin = share_begin(q), end = share_begin(q + 1);
      copy_bytes(out + (first + begin) * element, slot(reduce_step, q) + begin * element, (end - begin) * element);
    }
  }
}

void ShmGroup::broadcast(void* buf, size_t bytes, int root, std::chrono::milliseconds timeout) {
  const auto deadline = deadline_after(timeout);
  auto* data = static_cast<char*>(buf);
  for (size_t first = 0; first < bytes; first += kSlotBytes) {
    const size_t n = std::min(kSlotBytes, bytes - first);
    const uint32_t step = next_step();
    if (rank_ == root) copy_bytes(slot(step, root), data + first, n);
    publish(kBroadcast, bytes);
    wait_for_all(step, deadline);
    if (rank_ != root) copy_bytes(data + first, slot(step, root), n);
  }
}

void ShmGroup::allgather(const void* send, void* recv, size_t block_bytes, std::chrono::milliseconds timeout) {
  const auto deadline = deadline_after(timeout);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  for (size_t first = 0; first < block_bytes; first += kSlotBytes) {
    const size_t n = std::min(kSlotBytes, block_bytes - first);
    const uint32_t step = next_step();
    copy_bytes(slot(step, rank_), in + first, n);
    publish(kAllgather, block_bytes);
    wait_for_all(step, deadline);
    for (int q = 0; q < size_; ++q) {
      char* target = out + block_bytes * static_cast<size_t>(q) + first;
      if (q != rank_ || target != in + first) copy_bytes(target, slot(step, q), n);
    }
  }
}

void ShmGroup::reduce_scatter(const void* send, void* recv, size_t count, bpl_dtype acc, plugin::ReduceFn reduce,
                              std::chrono::milliseconds timeout) {
  const auto deadline = deadline_after(timeout);
  const size_t element = plugin::dtype_size(acc);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  // Each step carries the same `n` elements of every block; rank r reduces block r's piece.
  const size_t chunk_elements = std::max<size_t>(1, kSlotBytes / (element * static_cast<size_t>(size_)));
  std::vector<const char*>& inputs = inputs_;
  for (size_t first = 0; first < count; first += chunk_elements) {
    const size_t n = std::min(chunk_elements, count - first);
    const uint32_t step = next_step();
    char* mine = slot(step, rank_);
    for (int b = 0; b < size_; ++b) {
      copy_bytes(mine + n * element * static_cast<size_t>(b), in + (count * static_cast<size_t>(b) + first) * element,
                  n * element);
    }
    publish(kReduceScatter, count * element);
    wait_for_all(step, deadline);
    for (int q = 0; q < size_; ++q) inputs[static_cast<size_t>(q)] = slot(step, q) + n * element * static_cast<size_t>(rank_);
    reduce_in_rank_order(out + first * element, inputs, n, reduce);
  }
}

void ShmGroup::alltoall(const void* send, void* recv, size_t block_bytes, std::chrono::milliseconds timeout) {
  const auto deadline = deadline_after(timeout);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  const auto ranks = static_cast<size_t>(size_);
  // Each step carries the same `n` bytes of every block, block q at q * n in the slot; every rank has
  // copied that range of all its blocks in before any rank writes it out, so send may equal recv.
  const size_t chunk = std::max<size_t>(1, kSlotBytes / ranks);
  for (size_t first = 0; first < block_bytes; first += chunk) {
    const size_t n = std::min(chunk, block_bytes - first);
    const uint32_t step = next_step();
    char* mine = slot(step, rank_);
    for (size_t q = 0; q < ranks; ++q) copy_bytes(mine + n * q, in + block_bytes * q + first, n);
    publish(kAlltoall, block_bytes);
    wait_for_all(step, deadline);
    for (size_t q = 0; q < ranks; ++q) {
      copy_bytes(out + block_bytes * q + first, slot(step, static_cast<int>(q)) + n * static_cast<size_t>(rank_), n);
    }
  }
}

void ShmGroup::barrier(std::chrono::milliseconds timeout) {
  const uint32_t step = publish(kBarrier, 0);
  wait_for_all(step, deadline_after(timeout));
}

}  // namespace backplane::gloo_plugin
