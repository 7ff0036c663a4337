// Faults in real processes, for every backend that runs here (gloo: ranks started as a launcher
// would; mpi: under a real mpirun; mpi_mpich and mpi_impi: under MPICH's and Intel MPI's mpiexec): a
// rank killed, stopped or leaving in the middle of a collective, timeouts per call and per
// communicator, abort from another thread, mismatched collectives, and a rendezvous that cannot
// complete. The promise checked everywhere: every surviving rank gets a clear error within its
// timeout, and nothing hangs. One file per kind of fault; this binary's main runs gtest, or, with
// --worker=<name>, one rank of a job (scenarios.h).
#include "system/fault/fault_checks.h"
#include "system/fault/scenarios.h"

namespace backplane::test::faults {

// The backends every Fault test runs on.
INSTANTIATE_TEST_SUITE_P(Backends, Fault, ::testing::Values("gloo", "gloo_tcp", "gloo_machines", "mpi", "mpi_mpich", "mpi_impi"),
                         [](const auto& info) { return info.param; });

}  // namespace backplane::test::faults

int main(int argc, char** argv) {
  using namespace backplane::test::faults;
  return main_with_scenarios(argc, argv, {{"kill_mid_allreduce", kill_mid_allreduce},
                                          {"kill_mid_broadcast", kill_mid_broadcast},
                                          {"kill_mid_alltoallv", kill_mid_alltoallv},
                                          {"stop_mid_allreduce", stop_mid_allreduce},
                                          {"per_call_timeouts", per_call_timeouts},
                                          {"recv_tested_past_its_deadline", recv_tested_past_its_deadline},
                                          {"abort_from_another_thread", abort_from_another_thread},
                                          {"abort_notifies_peers", abort_notifies_peers},
                                          {"abort_blocking_call", abort_blocking_call},
                                          {"huge_values", huge_values},
                                          {"stop_before_finalize", stop_before_finalize},
                                          {"exit_cleanly_mid_allreduce", exit_cleanly_mid_allreduce},
                                          {"mismatched_collectives", mismatched_collectives},
                                          {"kill_mid_exchange", kill_mid_exchange},
                                          {"join_and_leave", join_and_leave},
                                          {"reinit_cycles", reinit_cycles},
                                          {"reinit_after_failure", reinit_after_failure},
                                          {"idle_after_rank0_exits", idle_after_rank0_exits},
                                          {"stop_before_init", stop_before_init}});
}
