// Backend selection and plugin lookup (DESIGN.md, "Selection and launch").
#pragma once

#include <string>
#include <vector>

#include "environment.h"

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
// Throws Error(INVALID_ARGUMENT) for a non-integer NXD_CPU_MODE or a malformed backend name.
Selection select_backend(const char* backend, const EnvLookup& env, const MachineProbe& machine);

// Where a plugin file is looked for, in order: BPL_PLUGIN_PATH (colon-separated), the plugin folder
// installed beside libbackplane.so, then the build tree's plugin folder.
std::vector<std::string> plugin_search_dirs(const EnvLookup& env);

// The file name of backend `name`: libbackplane-<name>.so.
std::string plugin_file_name(const std::string& name);

// Resolves a candidate to an existing file. A value containing '/' is a path. Throws Error(NOT_FOUND)
// naming the value, every path tried and the known backends.
std::string find_plugin(const std::string& backend, const std::vector<std::string>& dirs);

}  // namespace backplane
