// Facts about the processes of this machine, read from /proc: which peers share this process space
// and whether a peer's process still runs. A plugin uses them to name the peer behind a failure.
#pragma once

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

namespace backplane::plugin {

// This process's pid namespace, as the kernel names it ("pid:[4026531836]"), or "?".
inline std::string pid_namespace() {
  char name[64] = {};
  if (::readlink("/proc/self/ns/pid", name, sizeof(name) - 1) < 0) return "?";
  return name;
}

// Equal for two processes exactly when each can see the other's pid: the same host name, the same
// boot, the same pid namespace (containers on one host differ in the last).
inline std::string process_space_identity() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  return std::string(host) + " " + boot_id + " " + pid_namespace();
}

enum class ProcessState { kRunning, kStopped, kEnded };

// The state of process `pid` of this process space. A zombie (ended, not yet reaped) counts as ended.
inline ProcessState process_state(pid_t pid) {
  // read(2), not an ifstream: a process reaped between the open and the read fails the read (ESRCH),
  // which libstdc++'s filebuf throws as an exception in place of the failure being explained.
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ProcessState::kEnded;
  char buffer[1024];  // "<pid> (<command of at most 16 bytes>) <state> ...": well under 1 KiB
  const ssize_t got = ::read(fd, buffer, sizeof(buffer));
  ::close(fd);
  if (got <= 0) return ProcessState::kEnded;
  const std::string stat(buffer, static_cast<size_t>(got));
  // "<pid> (<command>) <state> ...": the command may itself hold spaces and parentheses.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return ProcessState::kEnded;
  switch (stat[close + 2]) {
    case 'Z':
    case 'X':
    case 'x':
      return ProcessState::kEnded;
    case 'T':
    case 't':
      return ProcessState::kStopped;
    default:
      return ProcessState::kRunning;
  }
}

// "rank 1 of this communicator, process 4242 on this machine, has ended" (or "is stopped"): how a
// failure names a peer of this machine by its process.
inline std::string local_peer_description(int rank, pid_t pid, ProcessState state) {
  return "rank " + std::to_string(rank) + " of this communicator, process " + std::to_string(pid) +
         " on this machine, " + (state == ProcessState::kEnded ? "has ended" : state == ProcessState::kStopped ? "is stopped" : "runs");
}

// " (rank 1 of this communicator, process 4242 on this machine, has ended; …)": the peers of this machine
// (local_pid_of_rank[r], 0 for a rank elsewhere or this one) whose state `names` accepts, or "".
template <typename Accept>
std::string local_peers_note(const std::vector<pid_t>& local_pid_of_rank, Accept names) {
  std::string note;
  for (size_t r = 0; r < local_pid_of_rank.size(); ++r) {
    const pid_t pid = local_pid_of_rank[r];
    if (pid == 0) continue;
    const ProcessState state = process_state(pid);
    if (!names(state)) continue;
    note += (note.empty() ? " (" : "; ") + local_peer_description(static_cast<int>(r), pid, state);
  }
  return note.empty() ? note : note + ")";
}

}  // namespace backplane::plugin
