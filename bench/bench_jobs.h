// What the benchmarks that time whole jobs share (bpl-bench-startup, bpl-bench-recovery): finding the
// launcher and the programs beside them, starting a process with extra variables and reading what it
// wrote, a free port, and their defaults of Google Benchmark's flags.
#pragma once

#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace backplane::bench {

inline std::string bin_dir() {
  char path[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  std::string self(path, n > 0 ? static_cast<size_t>(n) : 0);
  return self.substr(0, self.rfind('/'));
}

// The launcher: beside this program in the build tree, in bin/ of an installed tree (this program is in
// its libexec/backplane/), else on PATH.
inline std::string bpl_run() {
  for (const std::string& path : {bin_dir() + "/bpl-run", bin_dir() + "/../../bin/bpl-run"}) {
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return "bpl-run";
}

// A free TCP port of this host, for a job started without a launcher.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

struct Started {
  pid_t pid;
  int out;  // the read end of its stdout and stderr
};

inline Started start(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipe_fds[1], 1);
    ::dup2(pipe_fds[1], 2);
    for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  return {pid, pipe_fds[0]};
}

// Reads what the process wrote until it ends; throws when it failed.
inline std::string finish(const Started& process) {
  std::string output;
  char chunk[4096];
  ssize_t n;
  while ((n = ::read(process.out, chunk, sizeof(chunk))) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) output.append(chunk, static_cast<size_t>(n));
  }
  ::close(process.out);
  int status = 0;
  ::waitpid(process.pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error("the job failed:\n" + output);
  return output;
}

inline double min_of(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
inline double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

// A benchmark whose every repetition is one job, timed by the job itself (SetIterationTime), with the
// min and max of the repetitions beside Google Benchmark's mean and median.
inline benchmark::internal::Benchmark* one_job_per_repetition(benchmark::internal::Benchmark* b) {
  return b->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond)
      ->ComputeStatistics("min", min_of)
      ->ComputeStatistics("max", max_of);
}

// Runs the registered benchmarks with each of `defaults` ("--flag=value") added where the command line
// does not give that flag; the exit status (2: a flag Google Benchmark does not know).
inline int run_with_defaults(int argc, char** argv, std::vector<std::string> defaults) {
  std::vector<char*> args(argv, argv + argc);
  for (std::string& flag : defaults) {
    const std::string name = flag.substr(0, flag.find('='));
    bool given = false;
    for (char* a : args) given = given || std::strncmp(a, name.c_str(), name.size()) == 0;
    if (!given) args.push_back(flag.data());
  }
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace backplane::bench
