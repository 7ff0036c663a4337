// ShmGroup's segment (names, creation, mapping, layout) and its step protocol (publishing a step, waiting
// for peers within a deadline, failure records, telling ranks that call differently apart).
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

size_t ShmGroup::header_bytes() {
  static_assert(sizeof(Progress) % kLine == 0, "progress records keep cache lines apart");
  return round_up(sizeof(Header), kLine);
}

size_t ShmGroup::buffers_offset(int size) {
  return round_up(header_bytes() + sizeof(Progress) * static_cast<size_t>(size), 4096);
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

size_t ShmGroup::staging_offset(int size) {
  static_assert(sizeof(Mailbox) % kLine == 0, "mailboxes keep cache lines apart");
  return mailboxes_offset(size) + sizeof(Mailbox) * static_cast<size_t>(size) * static_cast<size_t>(size);
}

size_t ShmGroup::staged_send_bytes(int size) {
  if (size < 2) return 0;  // no peer to send to
  const size_t share = std::min(kStagedSendMaxBytes, kStagingBytesPerRank / static_cast<size_t>(size)) / kLine * kLine;
  return share > kInlineSendBytes ? share : 0;
}

size_t ShmGroup::segment_bytes(int size) {
  return staging_offset(size) + staged_send_bytes(size) * static_cast<size_t>(size) * static_cast<size_t>(size);
}

ShmGroup::Mailbox& ShmGroup::mailbox(int from, int to) const {
  auto* first = reinterpret_cast<Mailbox*>(static_cast<char*>(base_) + mailboxes_offset(size_));
  return first[static_cast<size_t>(from) * static_cast<size_t>(size_) + static_cast<size_t>(to)];
}

char* ShmGroup::staging(int from, int to) const {
  const size_t pair = static_cast<size_t>(from) * static_cast<size_t>(size_) + static_cast<size_t>(to);
  return static_cast<char*>(base_) + staging_offset(size_) + staged_send_bytes(size_) * pair;
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
      pending_recvs_(static_cast<size_t>(size)),
      long_spin_us_(static_cast<uint32_t>(kLongSpin.count())) {}

ShmGroup::~ShmGroup() {
  withdraw_from_receiving();
  ::munmap(base_, bytes_);
}

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
  for (int r = 0; r < size; ++r) new (static_cast<char*>(base) + header_bytes() + sizeof(Progress) * static_cast<size_t>(r)) Progress();
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

void ShmGroup::set_call(const Fingerprint& call) {
  call_hash_ = call_hash(call);
  call_words_ = encode(call);
}

uint32_t ShmGroup::publish(uint32_t kind, uint64_t bytes) {
  const uint32_t step = ++steps_;
  Progress& mine = progress_[rank_];
  mine.kind[step % 2] = kind;
  mine.bytes[step % 2] = bytes;
  mine.call[step % 2] = call_hash_;
  if (words_published_[step % 2] != call_hash_) {  // a call's first step of this parity: its fingerprint
    mine.call_words[step % 2] = call_words_;
    words_published_[step % 2] = call_hash_;
  }
  mine.step.store(step, std::memory_order_seq_cst);  // releases the slot's data and the record above
  if (header_->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&mine.step);
  return step;
}

void ShmGroup::fail(bpl_status status, const std::string& reason, int late_rank) {
  uint32_t none = 0;
  if (header_->failed_by.load(std::memory_order_acquire) == 0) {
    // Claim the record with a placeholder rank first, so that nobody reads a half-written reason.
    if (header_->failed_by.compare_exchange_strong(none, UINT32_MAX)) {
      const size_t n = std::min(reason.size(), sizeof(header_->reason) - 1);
      std::memcpy(header_->reason, reason.data(), n);
      header_->reason[n] = '\0';
      header_->status = status;
      header_->late_rank = late_rank;
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

bool ShmGroup::failed_by_another_rank() const {
  const uint32_t by = header_->failed_by.load(std::memory_order_acquire);
  return by != 0 && by != 1 + static_cast<uint32_t>(rank_);
}

void ShmGroup::mark_left() { progress_[rank_].left.store(1, std::memory_order_seq_cst); }

bool ShmGroup::has_left(int index) const { return progress_[index].left.load(std::memory_order_seq_cst) != 0; }

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
  const std::string seen_by = " [the communicator's first failure, seen by rank " + std::to_string(rank_name(by_rank)) + "]";
  const int late_rank = header_->late_rank;
  if (late_rank < 0) throw plugin::Error(status, header_->reason + seen_by);
  // Rank `by_rank` gave up waiting for rank `late_rank`. Where it has ended since (it left at finalize,
  // say), its end is what fails this rank's call; and to the late rank itself the record is news of
  // rank `by_rank`, not of itself.
  const pid_t pid = peer_pid(by_rank);
  const plugin::ProcessState state = pid != 0 ? plugin::process_state(pid) : plugin::ProcessState::kRunning;
  if (late_rank != rank_ && state != plugin::ProcessState::kEnded) throw plugin::Error(status, header_->reason + seen_by);
  const std::string gave_up = "gave up waiting for " +
                              (late_rank == rank_ ? std::string("this rank") : "rank " + std::to_string(rank_name(late_rank))) +
                              " at its timeout (" + header_->reason + ")";
  if (state == plugin::ProcessState::kEnded) {
    throw plugin::Error(BPL_ERR_REMOTE, "shared memory: " + plugin::local_peer_description(rank_name(by_rank), pid, state) +
                                            ", after it " + gave_up + seen_by);
  }
  throw plugin::Error(status, "shared memory: rank " + std::to_string(rank_name(by_rank)) + " of this communicator " +
                                  gave_up + seen_by);
}

void ShmGroup::wait_for(int peer, uint32_t step, const Deadline& deadline) {
  std::atomic<uint32_t>& counter = progress_[peer].step;
  wait_until(peer, counter, [&] { return static_cast<int32_t>(counter.load(std::memory_order_acquire) - step) >= 0; },
             deadline, [&] { return "rank " + std::to_string(rank_name(peer)) + " did not arrive in time"; });
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
    if (theirs.kind[step % 2] != mine.kind[step % 2] || theirs.bytes[step % 2] != mine.bytes[step % 2] ||
        theirs.call[step % 2] != mine.call[step % 2]) {
      // A rank that failed goes on to its next call (a barrier at finalize, say): the failure, not the
      // call it then makes, is what went wrong.
      if (header_->failed_by.load(std::memory_order_acquire) != 0) throw_failure_record();
      throw plugin::Error(BPL_ERR_MISMATCH, "shared memory: ranks disagree: " + disagreement_at(step));
    }
  }
}

// What each rank calls at `step`, grouped (fingerprint.h): the collectives as the ranks called them,
// or, where those agree, the steps they took (one rank's alltoall in place against another's not); the
// ranks that have not reached the step within a moment (one that is stopped, or still on its way) are
// left out.
std::string ShmGroup::disagreement_at(uint32_t step) const {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  std::vector<std::pair<int, std::string>> calls, steps;
  for (int r = 0; r < size_; ++r) {
    const Progress& theirs = progress_[r];
    auto reached = [&] { return static_cast<int32_t>(theirs.step.load(std::memory_order_acquire) - step) >= 0; };
    while (!reached() && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!reached()) continue;
    const std::optional<Fingerprint> call =
        theirs.call[step % 2] != 0 ? decode(theirs.call_words[step % 2]) : std::nullopt;
    calls.emplace_back(rank_name(r), call ? describe(*call) : "a step of no collective");
    // An alltoallv's ranks have no size in common to compare (agree_on_counts checks its counts).
    const uint32_t published = theirs.kind[step % 2];
    const int root = root_of(published);
    steps.emplace_back(rank_name(r), std::string(kind_name(kind_of(published))) +
                                         (root >= 0 ? " with root " + std::to_string(rank_name(root)) : "") +
                                         (kind_of(published) == kAlltoallv
                                              ? ""
                                              : " of " + std::to_string(theirs.bytes[step % 2]) + " bytes"));
  }
  const std::string by_call = disagreement(calls);
  return by_call.empty() ? disagreement(steps) : by_call;
}

}  // namespace backplane::gloo_plugin
