// Backend selection and plugin lookup (docs/environment.md, docs/backends.md).
#pragma once

#include <string>
#include <vector>

#include "environment.h"
#include "error.h"
#include "log.h"

namespace backplane {

// The backends this project ships; others load by path or from BPL_PLUGIN_PATH.
extern const char* const kKnownBackends[3];

// One backend to try. An explicit choice gives one candidate whose failure is an error; auto selection
// gives several, tried in order, each skipped with a recorded reason when it cannot load.
struct Candidate {
  std::string backend;  // a name ("gloo") or a path ("/opt/x/libbackplane-foo.so")
  std::string reason;   // why it is a candidate: "BPL_BACKEND=gloo", "auto: launched by mpirun", …
};

struct Selection {
  bool explicit_choice = false;
  std::vector<Candidate> candidates;
};

// What auto selection looks at besides variables, so tests can give any machine.
struct MachineProbe {
  bool neuron_device_present = false;
};
MachineProbe probe_machine();  // looks for /dev/neuron*

// Highest first: explicit `backend` > BPL_BACKEND > NXD_CPU_MODE (>0 → gloo, 0 → neuron) > auto
// (neuron if a Neuron device is present, mpi if launched by an MPI launcher, then gloo).
// Throws Error(INVALID_ARGUMENT) for an NXD_CPU_MODE that is not an integer >= 0, or a malformed backend name.
Selection select_backend(const char* backend, const EnvLookup& env, const MachineProbe& machine);

// Where a plugin file is looked for, in order: BPL_PLUGIN_PATH (colon-separated), then the plugin folder
// installed beside libbackplane.so (<its folder>/backplane/plugins), and nowhere else: never a folder
// of the tree it was built in.
std::vector<std::string> plugin_search_dirs(const EnvLookup& env);

// The file name of backend `name`: libbackplane-<name>.so.
std::string plugin_file_name(const std::string& name);

// Resolves a candidate to an existing file. A value containing '/' is a path. For mpi, the plugin built
// for the MPI ABI of the launcher (mpi_launcher_abi: libbackplane-mpi-mpich.so under MPICH's or Intel
// MPI's mpiexec) comes before libbackplane-mpi.so, the system MPI's. Throws Error(NOT_FOUND) naming the
// value, every path tried and the known backends.
std::string find_plugin(const std::string& backend, const std::vector<std::string>& dirs,
                        const std::string& launcher_mpi_abi = "");

// Tries the candidates in order: returns what `use(candidate, reason)` returns for the first one for
// which it does not throw Error, `reason` being the candidate's own followed by every candidate
// skipped before it. An explicit choice that fails is an error naming it; in auto selection a failing
// candidate is skipped (logged, and recorded in the reasons), and NOT_FOUND lists them all when none
// can be used.
template <typename Use>
auto use_first_candidate(const Selection& selection, Use&& use) {
  std::string skipped;
  for (const Candidate& candidate : selection.candidates) {
    try {
      return use(candidate, candidate.reason + skipped);
    } catch (const Error& e) {
      if (selection.explicit_choice) {
        throw Error(e.status(), "backend '" + candidate.backend + "' selected by " + candidate.reason +
                                    " cannot be used: " + e.what());
      }
      skipped += "; skipped " + candidate.backend + ": " + e.what();
      log(BPL_LOG_INFO, "core", "auto selection skipped " + candidate.backend + ": " + e.what());
    }
  }
  throw Error(BPL_ERR_NOT_FOUND, "no backend could be used" + skipped);
}

}  // namespace backplane
