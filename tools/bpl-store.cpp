// bpl-store: serves backplane's TCP store (plugins/gloo/tcp_store.h) for a job, in a process of its own
// that bpl-run starts beside the ranks, as torchrun's agent hosts the store of its workers. The store
// then outlives any rank: the survivors of a rank's failure, rank 0's included, still meet there to agree
// and go on (docs/faults.md), and a rank that cannot reach it knows it is cut off from the job.
//
// It says "listening on port P" on stdout once it serves, and ends on SIGTERM or SIGINT, or when the
// process that started it ends, however it ends (the kernel tells it: PR_SET_PDEATHSIG).
#include <CLI/CLI.hpp>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>

#include "tcp_store.h"

int main(int argc, char** argv) {
  int port = 0;
  CLI::App app{"Serves backplane's store for a job until the process that started it ends, or it is told to stop.",
               "bpl-store"};
  app.set_version_flag("--version", std::string("bpl-store (backplane) ") + BPL_VERSION);
  app.add_option("--port", port, "the TCP port to serve on, every interface")->required()->check(CLI::Range(1, 65535));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  // Blocked before the server's thread starts, so that only sigwait takes them; the launcher's end is
  // one of them.
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  const pid_t launcher = getppid();
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != launcher) return 0;  // it ended before the request took effect
  try {
    backplane::gloo_plugin::TcpStoreServer server(static_cast<uint16_t>(port));
    std::printf("bpl-store: listening on port %d\n", port);
    std::fflush(stdout);
    int signal_number = 0;
    sigwait(&stop, &signal_number);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bpl-store: %s\n", e.what());
    return 1;
  }
  return 0;
}
