#include "shm_group.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/uio.h>
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
#include <thread>

#include "fingerprint.h"
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

// kAlltoallInPlace: an alltoall in place at a size where one not in place reads the peers' buffers,
// so that ranks disagreeing on it (each must call the same way) find out instead of reading stale
// addresses.
enum Kind : uint32_t { kAllreduce = 1, kBroadcast, kAllgather, kReduceScatter, kAlltoall, kBarrier, kProbe, kAlltoallInPlace };

const char* kind_name(uint32_t kind) {
  switch (kind) {
    case kAllreduce: return "allreduce or reduce";  // a reduce runs as an allreduce here
    case kBroadcast: return "broadcast";
    case kAllgather: return "allgather";
    case kReduceScatter: return "reduce_scatter";
    case kAlltoall: return "alltoall";
    case kBarrier: return "barrier";
    case kProbe: return "the single-copy check";
    case kAlltoallInPlace: return "alltoall in place";
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

#if defined(__SSE2__)
// Copies a line (kLine bytes) at a time with 16-byte vector moves, ordinary or streaming stores, until
// less than a line is left; advances the pointers and `n` past what it copied.
template <bool streaming>
void copy_whole_lines(char*& dst, const char*& src, size_t& n) {
  for (; n >= kLine; n -= kLine, src += kLine, dst += kLine) {
    __m128i line[4];
    for (int i = 0; i < 4; ++i) line[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * i));
    for (int i = 0; i < 4; ++i) {
      if constexpr (streaming) {
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16 * i), line[i]);
      } else {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16 * i), line[i]);
      }
    }
  }
}
#endif

// Copies between a caller's buffer and the segment: memcpy, except on AMD. glibc 2.36 copies a few
// KiB and more with `rep movsb`, which on AMD Zen runs 4-7x slower when source and destination lie a
// few bytes apart modulo 4096 (page aliasing, glibc bug 30994), and that is the common case here: a
// buffer from malloc starts 16 bytes into a page, a slot at a page's start. Measured with 2 ranks on an
// EPYC VM: allreduce of 256 KiB-64 MiB at ~1.15 GB/s from a buffer at page offset 16, against 4.7-8
// GB/s at offset 0 or 64; a loop of 16-byte vector moves does not care where the buffers lie. On
// Intel, `rep movsb` is the faster (no read for ownership of the destination): allreduce of 4 MiB
// 830 -> 705 us on 2 ranks of a Xeon VM, against the loop.
void copy_bytes(void* to, const void* from, size_t n) {
#if defined(__SSE2__)
  static const bool avoid_rep_movsb = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("amd") != 0;
  }();
  if (avoid_rep_movsb) {
    auto* dst = static_cast<char*>(to);
    const auto* src = static_cast<const char*>(from);
    copy_whole_lines</*streaming=*/false>(dst, src, n);
    std::memcpy(dst, src, n);
    return;
  }
#endif
  std::memcpy(to, from, n);
}

// From this many bytes, copy_to_peers streams. Below it, one line's ordinary transfer costs less than
// draining a write-combining buffer (allreduce of 1 KiB on 2 ranks: 0.8 us ordinary, 1.0 streamed; 4
// KiB: 2.0 and 1.7).
constexpr size_t kStreamingCopyBytes = 2048;

// Copies data into this rank's part of the segment, for its peers to read. A peer that read the slot
// last time still holds its lines, and an ordinary store must take each line back from that peer's
// cache first: 5-6 GB/s on an EPYC VM, where streaming (non-temporal) stores, which write whole lines
// without reading them, run at 25-38 GB/s, and the peer then reads the data as fast as before (23-25
// GB/s). Allreduce of 1 MiB on 2 ranks went from 220 to 80 us in a stand-alone test. Not for data this
// rank reads back soon: streamed lines leave its cache.
void copy_to_peers(void* to, const void* from, size_t n) {
#if defined(__SSE2__)
  if (n >= kStreamingCopyBytes) {
    auto* dst = static_cast<char*>(to);
    const auto* src = static_cast<const char*>(from);
    const size_t head = (kLine - reinterpret_cast<std::uintptr_t>(dst) % kLine) % kLine;  // to a line's start
    copy_bytes(dst, src, head);
    dst += head, src += head, n -= head;
    copy_whole_lines</*streaming=*/true>(dst, src, n);  // dst is at a line's start: whole lines streamed
    copy_bytes(dst, src, n);
    _mm_sfence();  // streamed stores are weakly ordered: all of them land before the step is published
    return;
  }
#endif
  copy_bytes(to, from, n);
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
  // Single copy: where this rank's buffers lie in its address space, for its peers to read from.
  uint64_t send_address[2];
  uint64_t recv_address[2];
};

struct alignas(kLine) ShmGroup::Header {
  uint64_t magic;
  uint32_t size;
  alignas(kLine) std::atomic<uint32_t> failed_by;  // 0, or 1 + the rank whose record follows
  int32_t status;
  char reason[512];
  alignas(kLine) std::atomic<uint32_t> sleepers;  // waiters in futex_wait: publishers wake only then
};

// A send announced in a mailbox: what rank `from` offers rank `to`, and what became of it.
struct ShmGroup::Announcement {
  std::atomic<uint32_t> posted;  // 1 + the sequence number of the send announced here (0: never used)
  std::atomic<uint32_t> done;    // equals `posted` once the receiver has read it, or refused it
  int32_t tag;
  int32_t status;                // BPL_OK, or BPL_ERR_MISMATCH when the recv had another size
  uint64_t bytes;
  uint64_t address;              // of the send buffer, in the sender's address space
  uint64_t received_bytes;       // the size the recv asked for (for the sender's message)
  char data[kInlineSendBytes];   // a small send's bytes, when `address` is 0
};

struct alignas(kLine) ShmGroup::Mailbox {
  std::atomic<uint32_t> posted;  // announcements so far: a receiver waiting for one sleeps on it
  std::atomic<uint32_t> done;    // announcements read: a sender waiting for its recv sleeps on it
  alignas(kLine) Announcement slots[kMailboxSlots];
};

// An announcement a recv may match, taken out of the mailbox in sequence order.
struct ShmGroup::Arrival {
  uint32_t sequence;
  int32_t tag;
  uint64_t bytes;
  uint64_t address;
};

struct ShmGroup::PendingRecv {
  void* buf;
  size_t bytes;
  int peer;
  int tag;
  bool done = false;  // under p2p_mutex_, as are the two below
  bpl_status status = BPL_OK;
  std::string error;
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

size_t ShmGroup::mailboxes_offset(int size) { return buffers_offset(size) + 2 * kSlotBytes * static_cast<size_t>(size); }

size_t ShmGroup::segment_bytes(int size) {
  static_assert(sizeof(Mailbox) % kLine == 0, "mailboxes keep cache lines apart");
  return mailboxes_offset(size) + sizeof(Mailbox) * static_cast<size_t>(size) * static_cast<size_t>(size);
}

ShmGroup::Mailbox& ShmGroup::mailbox(int from, int to) const {
  auto* first = reinterpret_cast<Mailbox*>(static_cast<char*>(base_) + mailboxes_offset(size_));
  return first[static_cast<size_t>(from) * static_cast<size_t>(size_) + static_cast<size_t>(to)];
}

ShmGroup::ShmGroup(void* base, size_t bytes, int rank, int size)
    : base_(base),
      bytes_(bytes),
      rank_(rank),
      size_(size),
      header_(static_cast<Header*>(base)),
      progress_(reinterpret_cast<Progress*>(static_cast<char*>(base) + header_bytes())),
      inputs_(static_cast<size_t>(size)),
      sends_announced_(static_cast<size_t>(size)),
      arrivals_taken_(static_cast<size_t>(size)),
      arrived_(static_cast<size_t>(size)),
      pending_recvs_(static_cast<size_t>(size)) {}

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
  for (size_t m = 0; m < static_cast<size_t>(size) * static_cast<size_t>(size); ++m) {
    new (static_cast<char*>(base) + mailboxes_offset(size) + sizeof(Mailbox) * m) Mailbox();
  }
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
  for (int from = 0; from < size_; ++from) {
    for (int to = 0; to < size_; ++to) {
      futex_wake_all(&mailbox(from, to).posted);
      futex_wake_all(&mailbox(from, to).done);
    }
  }
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

void ShmGroup::wait_for(int peer, uint32_t step, const Deadline& deadline) {
  std::atomic<uint32_t>& counter = progress_[peer].step;
  wait_until(peer, counter, [&] { return static_cast<int32_t>(counter.load(std::memory_order_acquire) - step) >= 0; },
             deadline, [&] { return "rank " + std::to_string(rank_name(peer)) + " did not arrive in time"; });
}

template <typename Reached, typename Late>
void ShmGroup::wait_until(int peer, std::atomic<uint32_t>& word, Reached reached,
                          const Deadline& deadline, Late late) {
  auto failed = [&] { return header_->failed_by.load(std::memory_order_acquire) != 0; };
  std::chrono::steady_clock::time_point spin_until{};  // the clock is first read after 63 spins
  for (uint32_t i = 1;; ++i) {
    if (reached()) return;
    if ((i & 63) == 0) {
      if (failed()) throw_failure_record();
      const auto now = std::chrono::steady_clock::now();
      if (spin_until == std::chrono::steady_clock::time_point{}) {
        spin_until = now + kSpin;
        deadline.at();  // starts the operation's clock
      } else if (now >= spin_until) {
        break;
      }
    }
    cpu_relax();
  }
  for (int i = 0; i < kYields; ++i) {
    if (reached()) return;
    ::sched_yield();
  }
  const pid_t pid = peer_pid(peer);
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
    if (now >= deadline.at()) {
      std::string reason = "shared memory: " + late();
      if (pid != 0 && plugin::process_state(pid) == plugin::ProcessState::kStopped) {
        reason += " (" + plugin::local_peer_description(rank_name(peer), pid, plugin::ProcessState::kStopped) + ")";
      }
      fail(BPL_ERR_TIMEOUT, reason);
      throw plugin::Error(BPL_ERR_TIMEOUT, reason);
    }
    header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = word.load(std::memory_order_seq_cst);
    if (!reached() && !failed()) {
      futex_wait(&word, seen, std::min<std::chrono::nanoseconds>(kSleepSlice, deadline.at() - now));
    }
    header_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void ShmGroup::wait_for_all(uint32_t step, const Deadline& deadline) {
  wait_for_peers(step, deadline);
  // A step every rank reached still fails once the group has failed: a rank that aborted or timed out
  // does not see this operation through, so no peer may report it as done.
  if (header_->failed_by.load(std::memory_order_acquire) != 0) throw_failure_record();
}

void ShmGroup::wait_for_peers(uint32_t step, const Deadline& deadline) {
  const Progress& mine = progress_[rank_];
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    wait_for(r, step, deadline);
    const Progress& theirs = progress_[r];
    if (theirs.kind[step % 2] != mine.kind[step % 2] || theirs.bytes[step % 2] != mine.bytes[step % 2]) {
      // A rank that failed goes on to its next call (a barrier at finalize, say): the failure, not the
      // call it then makes, is what went wrong.
      if (header_->failed_by.load(std::memory_order_acquire) != 0) throw_failure_record();
      throw plugin::Error(BPL_ERR_MISMATCH, "shared memory: ranks disagree: " + disagreement_at(step));
    }
  }
}

// What each rank calls at `step`, grouped (fingerprint.h): the ranks that have not reached it within a
// moment (one that is stopped, or still on its way) are left out.
std::string ShmGroup::disagreement_at(uint32_t step) const {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  std::vector<std::pair<int, std::string>> calls;
  for (int r = 0; r < size_; ++r) {
    const Progress& theirs = progress_[r];
    auto reached = [&] { return static_cast<int32_t>(theirs.step.load(std::memory_order_acquire) - step) >= 0; };
    while (!reached() && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!reached()) continue;
    calls.emplace_back(rank_name(r), std::string(kind_name(theirs.kind[step % 2])) + " of " +
                                         std::to_string(theirs.bytes[step % 2]) + " bytes");
  }
  return disagreement(calls);
}

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


/* ---- single copy ---- */

std::string ShmGroup::enable_single_copy(bool wanted, std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  Progress& mine = progress_[rank_];
  // Each rank publishes the address of a word that holds that address: a peer that reads the word
  // with process_vm_readv and finds the same value can read this process's memory.
  const uint32_t probe = next_step();
  mine.send_address[probe % 2] = reinterpret_cast<uint64_t>(&mine.send_address[probe % 2]);
  publish(kProbe, 0);
  wait_for_all(probe, deadline);
  uint64_t verdict = wanted ? 0 : 1;  // 0: can read every peer; 1: not wanted; 2 + errno: cannot
  for (int q = 0; q < size_ && verdict == 0; ++q) {
    if (q == rank_) continue;
    const uint64_t address = progress_[q].send_address[probe % 2];
    uint64_t seen = 0;
    iovec local{&seen, sizeof(seen)};
    iovec remote{reinterpret_cast<void*>(address), sizeof(seen)};
    if (::process_vm_readv(peer_pid(q), &local, 1, &remote, 1, 0) != static_cast<ssize_t>(sizeof(seen))) {
      verdict = 2 + static_cast<uint64_t>(errno);
    } else if (seen != address) {
      verdict = 2 + ESRCH;  // another process under that pid
    }
  }
  const uint32_t answer = next_step();
  mine.recv_address[answer % 2] = verdict;
  publish(kProbe, 0);
  // Every rank's verdict is here, so the check is complete: a peer that has returned from it may
  // already have failed the group (an abort right after joining), which this rank's first operation,
  // not its joining, reports.
  wait_for_peers(answer, deadline);
  for (int q = 0; q < size_; ++q) {
    const uint64_t theirs = progress_[q].recv_address[answer % 2];
    if (theirs == 1) return "turned off on rank " + std::to_string(rank_name(q));
    if (theirs >= 2) {
      return "rank " + std::to_string(rank_name(q)) + " may not read its peers' memory (process_vm_readv: " +
             std::strerror(static_cast<int>(theirs - 2)) + ")";
    }
  }
  single_copy_ = true;
  return "";
}

pid_t ShmGroup::peer_pid(int peer) const {
  return peer_pids_.size() > static_cast<size_t>(peer) ? peer_pids_[static_cast<size_t>(peer)] : 0;
}

uint32_t ShmGroup::publish_buffers(uint32_t kind, uint64_t bytes, const void* send, const void* recv,
                                   const Deadline& deadline) {
  const uint32_t step = next_step();
  progress_[rank_].send_address[step % 2] = reinterpret_cast<uint64_t>(send);
  progress_[rank_].recv_address[step % 2] = reinterpret_cast<uint64_t>(recv);
  publish(kind, bytes);
  wait_for_all(step, deadline);
  return step;
}

void ShmGroup::finish_single_copy(uint32_t kind, uint64_t bytes, const Deadline& deadline) {
  // No rank may return, and let its caller touch its buffers, while a peer may still read them.
  const uint32_t done = publish(kind, bytes);
  wait_for_all(done, deadline);
}

void ShmGroup::read_peer(int peer, void* to, uint64_t address, size_t n) {
  auto* into = static_cast<char*>(to);
  while (n > 0) {
    iovec local{into, n};
    iovec remote{reinterpret_cast<void*>(address), n};
    const ssize_t got = ::process_vm_readv(peer_pid(peer), &local, 1, &remote, 1, 0);
    if (got <= 0) {
      const int error = got < 0 ? errno : EIO;
      // A peer that failed first (an abort, say) may have let its caller free the buffer: its record
      // says what happened.
      if (header_->failed_by.load(std::memory_order_acquire) != 0) throw_failure_record();
      // ESRCH: the process is gone, or ending (its memory released before /proc shows it ended).
      const pid_t pid = peer_pid(peer);
      const std::string reason =
          error == ESRCH || plugin::process_state(pid) == plugin::ProcessState::kEnded
              ? "shared memory: " + plugin::local_peer_description(rank_name(peer), pid, plugin::ProcessState::kEnded)
              : "shared memory: reading rank " + std::to_string(rank_name(peer)) + "'s buffer (process_vm_readv) failed: " +
                    std::strerror(error);
      fail(BPL_ERR_REMOTE, reason);
      throw plugin::Error(BPL_ERR_REMOTE, reason);
    }
    into += got;
    address += static_cast<uint64_t>(got);
    n -= static_cast<size_t>(got);
  }
}

/* ---- point to point ---- */

ShmGroup::SendTicket ShmGroup::post_send(const void* buf, size_t bytes, int peer, int tag,
                                         std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  if (header_->failed_by.load(std::memory_order_acquire) != 0) throw_failure_record();
  uint64_t sequence;
  {
    std::lock_guard<std::mutex> lock(p2p_mutex_);  // sequence numbers in call order
    sequence = sends_announced_[static_cast<size_t>(peer)]++;
  }
  Mailbox& box = mailbox(rank_, peer);
  Announcement& slot = box.slots[sequence % kMailboxSlots];
  // The slot's last send, kMailboxSlots ago, must have been read. (The receiver takes announcements in
  // sequence order, so it waits for an earlier send of this rank still waiting for its slot.)
  const bool first_use = sequence < kMailboxSlots;
  const auto last_use = static_cast<uint32_t>(sequence - kMailboxSlots + 1);
  wait_until(peer, box.done, [&] {
               return first_use ? slot.posted.load(std::memory_order_acquire) == 0
                                : slot.done.load(std::memory_order_acquire) == last_use;
             },
             deadline, [&] {
               return "send to rank " + std::to_string(rank_name(peer)) + " (tag " + std::to_string(tag) + "): the " +
                      std::to_string(kMailboxSlots) + " sends to it before this one were not received in time";
             });
  std::lock_guard<std::mutex> lock(p2p_mutex_);  // against wait_sent reading the last send's outcome
  if (!first_use && slot.status != BPL_OK) refused_sends_[{peer, sequence - kMailboxSlots}] = slot.received_bytes;
  slot.tag = tag;
  slot.status = BPL_OK;
  slot.bytes = bytes;
  const bool inline_send = bytes <= kInlineSendBytes;
  if (inline_send && bytes > 0) std::memcpy(slot.data, buf, bytes);
  slot.address = inline_send ? 0 : reinterpret_cast<uint64_t>(buf);
  slot.posted.store(static_cast<uint32_t>(sequence + 1), std::memory_order_release);
  box.posted.fetch_add(1, std::memory_order_seq_cst);
  if (header_->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&box.posted);
  return {peer, tag, bytes, sequence};
}

void ShmGroup::wait_sent(const SendTicket& ticket, std::chrono::milliseconds timeout) {
  if (ticket.bytes <= kInlineSendBytes) return;  // copied into the announcement: the buffer is free
  Mailbox& box = mailbox(rank_, ticket.peer);
  Announcement& slot = box.slots[ticket.sequence % kMailboxSlots];
  const int tag = ticket.tag;
  const uint64_t bytes = ticket.bytes;
  const auto sent = static_cast<uint32_t>(ticket.sequence + 1);
  // Done once the slot's count of reads reaches this send's (a later send may have taken it since).
  wait_until(ticket.peer, box.done, [&] { return static_cast<int32_t>(slot.done.load(std::memory_order_acquire) - sent) >= 0; },
             Deadline(timeout), [&] {
               return "send to rank " + std::to_string(rank_name(ticket.peer)) + " (tag " + std::to_string(tag) +
                      ") was not received in time";
             });
  std::lock_guard<std::mutex> lock(p2p_mutex_);
  uint64_t received = bytes;
  if (slot.posted.load(std::memory_order_relaxed) == sent) {
    if (slot.status != BPL_OK) received = slot.received_bytes;
  } else if (auto refused = refused_sends_.find({ticket.peer, ticket.sequence}); refused != refused_sends_.end()) {
    received = refused->second;
    refused_sends_.erase(refused);
  }
  if (received != bytes) {
    throw plugin::Error(BPL_ERR_MISMATCH, "send of " + std::to_string(bytes) + " bytes to rank " +
                                              std::to_string(rank_name(ticket.peer)) + " (tag " + std::to_string(tag) +
                                              ") met a recv of " + std::to_string(received) + " bytes");
  }
}

std::shared_ptr<ShmGroup::PendingRecv> ShmGroup::post_recv(void* buf, size_t bytes, int peer, int tag) {
  if (header_->failed_by.load(std::memory_order_acquire) != 0) throw_failure_record();
  auto recv = std::make_shared<PendingRecv>();
  recv->buf = buf;
  recv->bytes = bytes;
  recv->peer = peer;
  recv->tag = tag;
  std::lock_guard<std::mutex> lock(p2p_mutex_);
  pending_recvs_[static_cast<size_t>(peer)].push_back(recv);
  match_arrivals(peer);  // a send already announced completes it at once
  return recv;
}

void ShmGroup::wait_received(const std::shared_ptr<PendingRecv>& recv, std::chrono::milliseconds timeout) {
  const int peer = recv->peer;
  try {
    wait_until(peer, mailbox(peer, rank_).posted, [&] {
                 std::lock_guard<std::mutex> lock(p2p_mutex_);
                 match_arrivals(peer);
                 return recv->done;
               },
               Deadline(timeout), [&] {
                 return "recv from rank " + std::to_string(rank_name(peer)) + " (tag " + std::to_string(recv->tag) +
                        "): no matching send in time";
               });
  } catch (...) {
    // Never matched: its buffer is the caller's again.
    std::lock_guard<std::mutex> lock(p2p_mutex_);
    auto& pending = pending_recvs_[static_cast<size_t>(peer)];
    pending.erase(std::remove(pending.begin(), pending.end(), recv), pending.end());
    throw;
  }
  if (recv->status != BPL_OK) throw plugin::Error(recv->status, recv->error);
}

void ShmGroup::match_arrivals(int peer) {
  if (header_->failed_by.load(std::memory_order_acquire) != 0) return;
  Mailbox& box = mailbox(peer, rank_);
  auto& arrived = arrived_[static_cast<size_t>(peer)];
  uint32_t& taken = arrivals_taken_[static_cast<size_t>(peer)];
  for (;;) {
    Announcement& slot = box.slots[taken % kMailboxSlots];
    if (slot.posted.load(std::memory_order_acquire) != taken + 1) break;
    arrived.push_back({taken, slot.tag, slot.bytes, slot.address});
    ++taken;
  }
  auto& pending = pending_recvs_[static_cast<size_t>(peer)];
  for (auto recv = pending.begin(); recv != pending.end();) {
    const auto match = std::find_if(arrived.begin(), arrived.end(), [&](const Arrival& a) { return a.tag == (*recv)->tag; });
    if (match == arrived.end()) {
      ++recv;
      continue;
    }
    const Arrival arrival = *match;
    arrived.erase(match);
    const std::shared_ptr<PendingRecv> matched = *recv;
    PendingRecv& mine = *matched;
    recv = pending.erase(recv);
    Announcement& slot = box.slots[arrival.sequence % kMailboxSlots];
    if (arrival.bytes != mine.bytes) {
      slot.status = BPL_ERR_MISMATCH;
      slot.received_bytes = mine.bytes;
      mine.status = BPL_ERR_MISMATCH;
      mine.error = "recv of " + std::to_string(mine.bytes) + " bytes from rank " + std::to_string(rank_name(peer)) +
                   " (tag " + std::to_string(mine.tag) + ") met a send of " + std::to_string(arrival.bytes) + " bytes";
    } else if (arrival.address == 0) {
      if (arrival.bytes > 0) std::memcpy(mine.buf, slot.data, arrival.bytes);
    } else {
      read_peer(peer, mine.buf, arrival.address, arrival.bytes);
    }
    mine.done = true;
    slot.done.store(arrival.sequence + 1, std::memory_order_release);
    box.done.fetch_add(1, std::memory_order_seq_cst);
    if (header_->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&box.done);
  }
}

}  // namespace backplane::gloo_plugin
