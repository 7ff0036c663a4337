// The other ranks of this process's MPI job that run on this machine, found without MPI: their
// launcher's job id in /proc/<pid>/environ (PMIx's namespace, or Open MPI's job id) and their rank
// there. Before MPI_Init_thread returns there is no communicator to ask, yet a rank stopped on this
// machine can still be named to the ranks that wait for it.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "local_process.h"

namespace backplane::mpi_plugin {

// The value of `name` in a NUL-separated environment block, or "".
inline std::string environment_value(const std::string& block, const std::string& name) {
  const std::string wanted = name + "=";
  for (size_t at = 0; at < block.size();) {
    const size_t end = block.find('\0', at);
    const std::string entry = block.substr(at, end == std::string::npos ? std::string::npos : end - at);
    if (entry.compare(0, wanted.size(), wanted) == 0) return entry.substr(wanted.size());
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return "";
}

// The environment process `pid` started with, or "" where it cannot be read (another user's).
inline std::string environment_of(pid_t pid) {
  const int fd = ::open(("/proc/" + std::to_string(pid) + "/environ").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string block;
  char chunk[4096];
  for (ssize_t n; (n = ::read(fd, chunk, sizeof(chunk))) > 0;) block.append(chunk, static_cast<size_t>(n));
  ::close(fd);
  return block;
}

// "; rank 1 of the job, process 4242 on this machine, is stopped": this job's other ranks on this
// machine that are stopped or have ended, or "" (none, or no launcher's job id to find them by).
inline std::string stopped_job_siblings_note() {
  static const char* const kJobIds[] = {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"};
  static const char* const kRanks[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK"};
  std::string id_name, id;
  for (const char* name : kJobIds) {
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') {
      id_name = name;
      id = value;
      break;
    }
  }
  if (id.empty()) return "";
  std::string note;
  DIR* processes = ::opendir("/proc");
  if (processes == nullptr) return "";
  while (const dirent* entry = ::readdir(processes)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
    if (pid <= 0 || pid == ::getpid()) continue;
    const std::string block = environment_of(pid);
    if (block.empty() || environment_value(block, id_name) != id) continue;
    const plugin::ProcessState state = plugin::process_state(pid);
    if (state == plugin::ProcessState::kRunning) continue;
    std::string rank = "?";
    for (const char* name : kRanks) {
      if (const std::string value = environment_value(block, name); !value.empty()) {
        rank = value;
        break;
      }
    }
    note += "; rank " + rank + " of the job, process " + std::to_string(pid) + " on this machine, " +
            (state == plugin::ProcessState::kStopped ? "is stopped" : "has ended");
  }
  ::closedir(processes);
  return note;
}

}  // namespace backplane::mpi_plugin
