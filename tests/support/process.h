// Running real processes from tests: start a program with extra environment variables, collect its
// output and exit status, and kill it if it outlives a deadline (a test never hangs).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace backplane::test {

struct ProcessResult {
  int exit_code = -1;    // valid when !signaled
  int signal = 0;        // the signal that ended it, if any
  bool timed_out = false;
  std::string output;    // stdout and stderr, interleaved
  double seconds = 0;
};

// The lines of a job's output as its ranks wrote them: bpl-run's rank prefix ("[rank3]:") removed.
inline std::vector<std::string> rank_output_lines(const std::string& output) {
  std::vector<std::string> lines;
  std::istringstream stream(output);
  for (std::string line; std::getline(stream, line);) {
    if (line.rfind("[rank", 0) == 0 && line.find("]:") != std::string::npos) line.erase(0, line.find("]:") + 2);
    lines.push_back(line);
  }
  return lines;
}

struct Process {
  pid_t pid = -1;
  int output_fd = -1;
};

// Starts argv[0] with `env` added to (or overriding) the current environment; "" removes a variable.
inline Process start_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return {};
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipe_fds[1], 1);
    dup2(pipe_fds[1], 2);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    for (const auto& [name, value] : env) {
      if (value.empty()) {
        unsetenv(name.c_str());
      } else {
        setenv(name.c_str(), value.c_str(), 1);
      }
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "cannot exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(pipe_fds[1]);
  return {pid, pipe_fds[0]};
}

// Collects output until the process ends; past `timeout` it is killed (SIGKILL) and timed_out is set.
inline ProcessResult finish_process(Process process, std::chrono::milliseconds timeout) {
  ProcessResult result;
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  char buffer[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      kill(process.pid, SIGKILL);
      break;
    }
    pollfd fd{process.output_fd, POLLIN, 0};
    if (poll(&fd, 1, static_cast<int>(std::min<int64_t>(left.count(), 200))) > 0) {
      ssize_t n = read(process.output_fd, buffer, sizeof(buffer));
      if (n <= 0) break;  // every writer closed: the process (and its children) ended
      result.output.append(buffer, static_cast<size_t>(n));
    }
  }
  close(process.output_fd);
  int status = 0;
  // Output closed; the process may still be exiting. Wait for it, still within the deadline.
  while (waitpid(process.pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      result.timed_out = true;
      kill(process.pid, SIGKILL);
      waitpid(process.pid, &status, 0);
      break;
    }
    usleep(10000);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  } else if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  }
  return result;
}

// Reads the process's output into `output` until it contains `needle` (true), or the output ends or
// `timeout` passes (false). The process keeps running; finish_process collects the rest.
inline bool wait_for_output(Process& process, std::string& output, const std::string& needle,
                            std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buffer[4096];
  while (output.find(needle) == std::string::npos) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd fd{process.output_fd, POLLIN, 0};
    if (poll(&fd, 1, static_cast<int>(std::min<int64_t>(left.count(), 200))) > 0) {
      ssize_t n = read(process.output_fd, buffer, sizeof(buffer));
      if (n <= 0) return false;
      output.append(buffer, static_cast<size_t>(n));
    }
  }
  return true;
}

inline ProcessResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  return finish_process(start_process(argv, env), timeout);
}

// A TCP port free on loopback right now, with the one after it free too (the neuron backend takes
// MASTER_PORT + 1), chosen as bpl-run chooses: below the kernel's ephemeral range, since a port from it
// may be taken by another test's outgoing connection before the ranks listen on it.
inline int free_port() {
  int floor = 32768;
  if (FILE* range = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(range, "%d", &floor) != 1) floor = 32768;
    std::fclose(range);
  }
  auto bind_loopback = [](int fd, int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    return bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  };
  std::mt19937 chooser(std::random_device{}());
  for (int attempt = 0; attempt < 200 && floor > 10001; ++attempt) {
    const int port = std::uniform_int_distribution<int>(10000, floor - 2)(chooser);
    const int first = socket(AF_INET, SOCK_STREAM, 0), second = socket(AF_INET, SOCK_STREAM, 0);
    const bool free = bind_loopback(first, port) && bind_loopback(second, port + 1);
    close(first);
    close(second);
    if (free) return port;
  }
  const int fd = socket(AF_INET, SOCK_STREAM, 0);  // no room below the range: the kernel's choice
  bind_loopback(fd, 0);
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// The environment of rank `rank` of `world` ranks on this host, as a launcher sets it.
inline std::map<std::string, std::string> rank_env(int rank, int world, int port) {
  return {{"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", std::to_string(port)}};
}

// Open MPI's mpirun as found at configure time, or "" where the MPI backend is not built: a test
// that needs it is then skipped with kNoMpi as the reason.
#ifdef BPL_MPIEXEC
constexpr const char* kMpiexec = BPL_MPIEXEC;
#else
constexpr const char* kMpiexec = "";
#endif
constexpr const char* kNoMpi = "the MPI backend is not built (no Open MPI found at configure time)";
inline bool mpi_backend_built() { return *kMpiexec != '\0'; }

// `program` on `ranks` ranks under Open MPI's mpirun.
inline std::vector<std::string> mpirun(int ranks, std::vector<std::string> program) {
  std::vector<std::string> argv = {kMpiexec, "--oversubscribe", "-np", std::to_string(ranks)};
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

// `extra` plus what Open MPI needs here: it refuses to start as root unless told, and CI runs as root.
// Under sanitizers, processes running Open MPI skip the leak check (tests/CMakeLists.txt says why).
inline std::map<std::string, std::string> mpi_env(std::map<std::string, std::string> extra) {
  extra["OMPI_ALLOW_RUN_AS_ROOT"] = "1";
  extra["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1";
#ifdef BPL_SANITIZER_BUILD
  extra["ASAN_OPTIONS"] = "detect_leaks=0";
#endif
  return extra;
}

}  // namespace backplane::test
