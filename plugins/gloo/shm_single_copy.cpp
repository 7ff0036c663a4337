// ShmGroup's single copy: reading the peers' buffers directly (process_vm_readv) where every rank may.
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

bool ShmGroup::takes_single_copy(bpl_collective op, size_t bytes) const {
  size_t max_bytes = 0;  // allreduce, reduce, reduce_scatter and barrier: always through the segment
  switch (op) {
    case BPL_COLL_BROADCAST: max_bytes = kSingleCopyBroadcastMaxBytes; break;
    case BPL_COLL_SCATTER: max_bytes = kSingleCopyScatterMaxBytes; break;
    case BPL_COLL_ALLGATHER:
    case BPL_COLL_ALLTOALL:
    case BPL_COLL_GATHER:
    case BPL_COLL_ALLGATHERV:
    case BPL_COLL_ALLTOALLV: max_bytes = kSingleCopyMaxBytes; break;
    default: break;
  }
  return single_copy_ && bytes >= kSingleCopyMinBytes && bytes <= max_bytes;
}

const char* ShmGroup::path_of(bpl_collective op, uint64_t bytes) const {
  // A receiver reads a larger send from the sender's buffer; the v-forms: as this rank sees it (the
  // ranks' largest block decides).
  const bool direct = through_mailboxes(op) ? single_copy_ && bytes > kInlineSendBytes : takes_single_copy(op, bytes);
  return direct ? "shared memory, single copy" : "shared memory";
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

int ShmGroup::cross_copy(pid_t pid, char* local, uint64_t address, size_t n, CrossCopy direction) {
  while (n > 0) {
    iovec here{local, n};
    iovec there{reinterpret_cast<void*>(address), n};
    const ssize_t done = direction == CrossCopy::kRead ? ::process_vm_readv(pid, &here, 1, &there, 1, 0)
                                                       : ::process_vm_writev(pid, &here, 1, &there, 1, 0);
    if (done <= 0) return done < 0 ? errno : EIO;
    local += done;
    address += static_cast<uint64_t>(done);
    n -= static_cast<size_t>(done);
  }
  return 0;
}

void ShmGroup::read_peer(int peer, void* to, uint64_t address, size_t n, bool two_threads) {
  auto* into = static_cast<char*>(to);
  const pid_t pid = peer_pid(peer);
  static const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  // A second thread only where it finds a core idle: not while the peers read too (an allgatherv's
  // ranks all read at once, and more threads than cores only take turns).
  uint32_t threads = 1;
  const uint32_t reading = header_->readers.fetch_add(1, std::memory_order_relaxed) + 1;
  if (two_threads && n >= kTwoThreadReadBytes && reading < static_cast<uint32_t>(cores)) {
    header_->readers.fetch_add(1, std::memory_order_relaxed);
    threads = 2;
  }
  int error = 0;
  if (threads == 2) {
    if (!read_helper_) read_helper_ = std::make_unique<ReadHelper>();
    const size_t first_half = n / 2 / kLine * kLine;
    read_helper_->start(pid, into + first_half, address + first_half, n - first_half);
    error = cross_copy(pid, into, address, first_half, CrossCopy::kRead);
    const int helper_error = read_helper_->finish();
    if (error == 0) error = helper_error;
  } else {
    error = cross_copy(pid, into, address, n, CrossCopy::kRead);
  }
  header_->readers.fetch_sub(threads, std::memory_order_relaxed);
  if (error != 0) fail_cross_copy(peer, error, CrossCopy::kRead);
}

void ShmGroup::write_peer(int peer, uint64_t address, const void* from, size_t n) {
  header_->readers.fetch_add(1, std::memory_order_relaxed);  // a core busy copying, as a reader's
  const int error = cross_copy(peer_pid(peer), const_cast<char*>(static_cast<const char*>(from)), address, n, CrossCopy::kWrite);
  header_->readers.fetch_sub(1, std::memory_order_relaxed);
  if (error != 0) fail_cross_copy(peer, error, CrossCopy::kWrite);
}

void ShmGroup::fail_cross_copy(int peer, int error, CrossCopy direction) {
  // A peer that failed first (an abort, say) may have let its caller free the buffer: its record
  // says what happened.
  if (header_->failed_by.load(std::memory_order_acquire) != 0) throw_failure_record();
  // ESRCH: the process is gone, or ending (its memory released before /proc shows it ended).
  const pid_t pid = peer_pid(peer);
  std::string reason;
  if (error == ESRCH || plugin::process_state(pid) == plugin::ProcessState::kEnded) {
    reason = "shared memory: " + plugin::local_peer_description(rank_name(peer), pid, plugin::ProcessState::kEnded);
  } else {
    const std::string buffer = "rank " + std::to_string(rank_name(peer)) + "'s buffer";
    reason = "shared memory: " +
             (direction == CrossCopy::kRead ? "reading " + buffer + " (process_vm_readv)"
                                            : "writing into " + buffer + " (process_vm_writev)") +
             " failed: " + std::strerror(error);
  }
  fail(BPL_ERR_REMOTE, reason);
  throw plugin::Error(BPL_ERR_REMOTE, reason);
}

}  // namespace backplane::gloo_plugin
