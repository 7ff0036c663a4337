// What the files of ShmGroup share (shm_group.h is its interface): the segment's layout, its
// protocol's constants, and the copy, futex and naming helpers. Not for other files.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <ctime>
#include <sched.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "fingerprint.h"
#include "local_process.h"
#include "plugin_support.h"
#include "polled_request.h"
#include "shm_group.h"

namespace backplane::gloo_plugin {
namespace shm_detail {

constexpr uint64_t kMagic = 0x62706c73686d3034;  // "bplshm04": the layout's version
constexpr size_t kLine = 64;                     // one cache line per counter: no false sharing
// A wait spins, then sleeps in futex slices. Where this machine's ranks outnumber its cores
// (Backoff::yield_while_spinning), the peer may need this very core: the spin is short and then yields
// it. Elsewhere a yield only hands the core to whatever else runs here, and a short spin makes ranks
// that arrive apart pay a wake-up at every step: waits spin longer, without yielding
// (bench/results/design-choices.md#shared-memory-waits).
constexpr auto kSpin = std::chrono::microseconds(20);         // a peer a step behind arrives within this
constexpr int kYields = 200;                                  // oversubscribed: then yields, for the peer that needs this core
constexpr auto kLongSpin = std::chrono::microseconds(1000);   // otherwise, at most
// The long spin adapts (ShmGroup::long_spin_us_): halved each time it ran out before the peer came (the
// peer has lost its core to something else running here, and this rank's spin keeps a core from it),
// grown by kSpin each time the peer came within it. On a quiet machine peers come within microseconds
// and it stays whole; beside busy processes it shrinks towards kSpin, and waits sleep early, as Gloo's
// blocking reads do (bench/results/epyc/README.md#2026-11-28-torch2-targets).
constexpr auto kSleepSlice = std::chrono::milliseconds(5);
constexpr auto kLivenessInterval = std::chrono::milliseconds(10);

static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free,
              "a futex word is a lock-free 32-bit atomic");

// kAlltoallInPlace: an alltoall in place, which lays out its steps differently from one not in place
// (and at single-copy sizes does not publish its buffers), so that ranks disagreeing on it (each must
// call the same way) find out instead of reading the wrong bytes or stale addresses.
enum Kind : uint32_t {
  kAllreduce = 1, kBroadcast, kAllgather, kReduceScatter, kAlltoall, kBarrier, kProbe, kAlltoallInPlace, kAllgatherv,
  kAlltoallv, kGather, kScatter
};

// What a rank publishes for a rooted collective: its kind, and above the low byte its root + 1, so
// that ranks naming different roots disagree instead of waiting for or reading the wrong rank.
inline uint32_t with_root(uint32_t kind, int root) { return kind | (static_cast<uint32_t>(root) + 1) << 8; }
inline uint32_t kind_of(uint32_t published) { return published & 0xff; }
inline int root_of(uint32_t published) { return static_cast<int>(published >> 8) - 1; }  // -1: none

inline const char* kind_name(uint32_t kind) {
  switch (kind) {
    case kAllreduce: return "allreduce or reduce";  // a reduce runs as an allreduce here
    case kBroadcast: return "broadcast";
    case kAllgather: return "allgather";
    case kReduceScatter: return "reduce_scatter";
    case kAlltoall: return "alltoall";
    case kBarrier: return "barrier";
    case kProbe: return "the single-copy check";
    case kAlltoallInPlace: return "alltoall in place";
    case kAllgatherv: return "allgatherv";
    case kAlltoallv: return "alltoallv";
    case kGather: return "gather";
    case kScatter: return "scatter";
    default: return "?";
  }
}

inline size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

inline std::string system_error(const std::string& what, const std::string& name) {
  return "shared memory: " + what + " of segment " + name + " failed: " + std::strerror(errno);
}

// Copies between a caller's buffer and the segment (shm_copy.cpp says how, and why not always memcpy).
void copy_bytes(void* to, const void* from, size_t n);
// Copies data into this rank's part of the segment, for its peers to read (streaming stores when large).
void copy_to_peers(void* to, const void* from, size_t n);
// Copies with streaming (non-temporal) stores from 2 KiB: lines written, not read first, and not kept.
void copy_streaming(void* to, const void* from, size_t n);
// Whether an operation whose output (this rank's recv) holds `output_bytes` writes it with streaming
// stores: where it is larger than the last-level cache (shm_copy.cpp).
bool streams_output(size_t output_bytes);
// How such an operation copies into its output: copy_streaming where it streams, else copy_bytes.
using CopyFn = void (*)(void* to, const void* from, size_t n);
CopyFn output_copy(size_t output_bytes);

}  // namespace shm_detail

using namespace shm_detail;  // the files of ShmGroup only

// A rank's published step, and what it does in the last two steps (by step % 2: a peer is at most one
// step ahead), so that ranks calling different collectives, or the same one differently, find out at
// once instead of reading each other's data wrongly. Its first line is what every step compares.
struct alignas(kLine) ShmGroup::Progress {
  std::atomic<uint32_t> step;
  uint32_t kind[2];
  // The call the step belongs to (set_call: a hash of its fingerprint, 0 where none was set): ranks
  // that move the same bytes for different dtypes, reduce ops or roots differ here.
  uint64_t call[2];
  uint64_t bytes[2];
  // Single copy: where this rank's buffers lie in its address space, for its peers to read from.
  alignas(kLine) uint64_t send_address[2];
  uint64_t recv_address[2];
  // The call's fingerprint, read only to say how ranks that disagree differ.
  alignas(kLine) FingerprintWords call_words[2];
  alignas(kLine) std::atomic<uint32_t> left;  // 1 once the rank left the group on purpose (mark_left)
};

struct alignas(kLine) ShmGroup::Header {
  uint64_t magic;
  uint32_t size;
  alignas(kLine) std::atomic<uint32_t> failed_by;  // 0, or 1 + the rank whose record follows
  int32_t status;
  int32_t late_rank;  // the rank the record says did not arrive in time, or -1
  char reason[512];
  alignas(kLine) std::atomic<uint32_t> sleepers;  // waiters in futex_wait: publishers wake only then
  alignas(kLine) std::atomic<uint32_t> readers;   // threads of the group in process_vm_readv (read_peer)
};

// A send announced in a mailbox: what rank `from` offers rank `to`, and what became of it.
struct ShmGroup::Announcement {
  std::atomic<uint32_t> posted;  // 1 + the sequence number of the send announced here (0: never used)
  std::atomic<uint32_t> done;    // equals `posted` once the receiver has read it, or refused it
  int32_t tag;
  int32_t status;                // BPL_OK, or BPL_ERR_MISMATCH when the recv had another size
  uint32_t staged;               // 1: the bytes wait in the pair's staging area
  uint64_t bytes;
  uint64_t address;              // of the send buffer, in the sender's address space (0: not read there)
  uint64_t received_bytes;       // the size the recv asked for (for the sender's message)
  char data[kInlineSendBytes];   // a small send's bytes, when `address` is 0
};

struct alignas(kLine) ShmGroup::Mailbox {
  // Announcements so far: a receiver waiting for one sleeps on it. A rank's mailbox to itself, never
  // announced in, counts the announcements to it from every rank instead: a recv from any rank's.
  std::atomic<uint32_t> posted;
  std::atomic<uint32_t> done;    // announcements read: a sender waiting for its recv sleeps on it
  // 0 while the staging area is free, else 1 + the sequence number of the send it holds.
  alignas(kLine) std::atomic<uint32_t> staged_by;
  alignas(kLine) Announcement slots[kMailboxSlots];
};

// An announcement a recv may match, taken out of the mailbox in sequence order.
struct ShmGroup::Arrival {
  uint32_t sequence;
  int32_t tag;
  uint64_t bytes;
  uint64_t address;
  bool staged;
};

struct ShmGroup::PendingRecv {
  void* buf;
  size_t bytes;
  int peer;        // kAnyRank: from whichever rank sends first
  int tag;
  uint64_t order;  // of the recvs this rank posted: the order in which they match
  int source = -1; // the communicator's rank that sent, once done
  bool done = false;  // under p2p_mutex_, as are the two below
  bpl_status status = BPL_OK;
  std::string error;
};

// A second thread for reading a peer's memory: process_vm_readv pins each page, then copies it, and two
// threads reading halves come near what memcpy does where one does not
// (bench/results/design-choices.md#reading-a-peers-memory-with-two-threads). Started at the first large read, so that a group that
// never makes one has no thread; a half is a system call that ends whatever the peer does, so the
// reading thread waits for its helper without a deadline.
class ShmGroup::ReadHelper {
 public:
  ReadHelper() : thread_([this] { run(); }) {}
  ~ReadHelper() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  // Starts copying `n` bytes at `address` in process `pid` to `to`.
  void start(pid_t pid, char* to, uint64_t address, size_t n) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = {pid, to, address, n, 0, true};
    }
    wake_.notify_all();
  }
  // Waits for the copy started last; 0, or the errno of the read that failed (EIO: it read nothing).
  int finish() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return !job_.pending; });
    return job_.error;
  }

 private:
  struct Job {
    pid_t pid = 0;
    char* to = nullptr;
    uint64_t address = 0;
    size_t n = 0;
    int error = 0;
    bool pending = false;
  };
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || job_.pending; });
      if (!job_.pending) return;
      Job job = job_;
      lock.unlock();
      job.error = cross_copy(job.pid, job.to, job.address, job.n, CrossCopy::kRead);
      lock.lock();
      job_.error = job.error;
      job_.pending = false;
      done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  Job job_;
  bool stopping_ = false;
  std::thread thread_;
};

// The one wait of the step protocol and the mailboxes (a template: its callers are in several files).
template <typename Reached, typename Late>
void ShmGroup::wait_until(int peer, std::atomic<uint32_t>& word, Reached reached,
                          const Deadline& deadline, Late late) {
  auto failed = [&] { return header_->failed_by.load(std::memory_order_acquire) != 0; };
  const bool yielding = plugin::Backoff::yield_while_spinning().load(std::memory_order_relaxed);
  std::chrono::steady_clock::time_point spin_until{};  // the clock is first read after 63 spins
  const bool long_spin = !yielding;
  const uint32_t long_spin_us = long_spin_us_.load(std::memory_order_relaxed);
  for (uint32_t i = 1;; ++i) {
    if (reached()) {
      if (long_spin && spin_until != std::chrono::steady_clock::time_point{} && long_spin_us < kLongSpin.count()) {
        long_spin_us_.store(long_spin_us + static_cast<uint32_t>(kSpin.count()), std::memory_order_relaxed);
      }
      return;
    }
    if ((i & 63) == 0) {
      if (failed()) throw_failure_record();
      drive_posted_receives();
      const auto now = std::chrono::steady_clock::now();
      if (spin_until == std::chrono::steady_clock::time_point{}) {
        spin_until = now + (long_spin ? std::chrono::microseconds(long_spin_us) : std::chrono::microseconds(kSpin));
        deadline.at();  // starts the operation's clock
      } else if (now >= spin_until) {
        if (long_spin) {
          long_spin_us_.store(std::max<uint32_t>(static_cast<uint32_t>(kSpin.count()), long_spin_us / 2),
                              std::memory_order_relaxed);
        }
        break;
      }
    }
    cpu_relax();
  }
  for (int i = 0; yielding && i < kYields; ++i) {
    if (reached()) return;
    drive_posted_receives();
    ::sched_yield();
  }
  const pid_t pid = peer_pid(peer);
  auto next_liveness_check = std::chrono::steady_clock::now();
  // A stalled collective says, at each quarter of its timeout, which rank it still waits for.
  plugin::WaitReport report(std::max(kSleepSlice, deadline.timeout() / 4));
  for (;;) {
    if (reached()) return;
    if (failed()) throw_failure_record();
    drive_posted_receives();
    const auto now = std::chrono::steady_clock::now();
    if (report.due()) {
      plugin::log(BPL_LOG_INFO, "gloo", "shared memory: still waiting after " + report.waited() + " of the " +
                                            std::to_string(deadline.timeout().count()) + " ms timeout: " + late());
    }
    if (pid != 0 && now >= next_liveness_check) {
      if (plugin::process_state(pid) == plugin::ProcessState::kEnded) {
        const std::string reason = "shared memory: " + plugin::local_peer_description(rank_name(peer), pid, plugin::ProcessState::kEnded);
        fail(BPL_ERR_REMOTE, reason);
        throw plugin::Error(BPL_ERR_REMOTE, reason);
      }
      next_liveness_check = now + kLivenessInterval;
    }
    if (now >= deadline.at()) throw plugin::Error(BPL_ERR_TIMEOUT, give_up(peer, nullptr, late()));
    header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = word.load(std::memory_order_seq_cst);
    if (!reached() && !failed()) {
      futex_wait(&word, seen, std::min<std::chrono::nanoseconds>(kSleepSlice, deadline.at() - now));
    }
    header_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace backplane::gloo_plugin
