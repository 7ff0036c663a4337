#include "selection.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <stdexcept>
#include <boost/dll/runtime_symbol_info.hpp>

#include "cpu_mode.h"
#include "error.h"

#ifndef BPL_PLUGIN_SUBDIR
#define BPL_PLUGIN_SUBDIR "backplane/plugins"
#endif

namespace backplane {

const char* const kKnownBackends[3] = {"gloo", "mpi", "neuron"};

namespace {

std::string known_backends_text() {
  return "known backends: gloo, mpi, neuron, or a path to a plugin .so";
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_plain_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

boost::dll::fs::path canonical_or_as_is(const boost::dll::fs::path& path) {
  boost::dll::fs::error_code error;
  boost::dll::fs::path canonical = boost::dll::fs::canonical(path, error);
  return error ? path : canonical;
}

// The plugin folder of this copy of the core, which lies where the installer put it: beside
// libbackplane.so (<its folder>/backplane/plugins). A program that links the core's objects itself (the
// unit tests, bpl-cache) has its own folder in a tree that mirrors the installed one: bin/ beside lib/.
std::string own_plugin_dir() {
  boost::dll::fs::error_code error;
  const boost::dll::fs::path self = boost::dll::this_line_location(error);
  if (error) return "";
  const boost::dll::fs::path code = canonical_or_as_is(self);
  const boost::dll::fs::path program = canonical_or_as_is(boost::dll::program_location(error));
  const boost::dll::fs::path lib_dir = !error && code == program ? code.parent_path().parent_path() / "lib"
                                                                 : code.parent_path();
  return (lib_dir / BPL_PLUGIN_SUBDIR).string();
}

}  // namespace

MachineProbe probe_machine() {
  MachineProbe machine;
  glob_t found{};
  if (glob("/dev/neuron[0-9]*", 0, nullptr, &found) == 0) machine.neuron_device_present = found.gl_pathc > 0;
  globfree(&found);
  return machine;
}

Selection select_backend(const char* backend, const EnvLookup& env, const MachineProbe& machine) {
  Selection selection;
  selection.explicit_choice = true;
  if (backend != nullptr && *backend != '\0') {
    selection.candidates.push_back({backend, std::string("bpl_init option backend=") + backend});
    return selection;
  }
  if (auto name = env("BPL_BACKEND")) {
    selection.candidates.push_back({*name, "BPL_BACKEND=" + *name});
    return selection;
  }
  if (auto cpu_mode = env("NXD_CPU_MODE")) {
    bool cpu = false;
    try {
      cpu = settings::cpu_mode_from(*cpu_mode);
    } catch (const std::invalid_argument& e) {
      throw Error(BPL_ERR_INVALID_ARGUMENT, e.what());
    }
    selection.candidates.push_back({cpu ? "gloo" : "neuron", "NXD_CPU_MODE=" + *cpu_mode});
    return selection;
  }

  selection.explicit_choice = false;
  if (machine.neuron_device_present) {
    selection.candidates.push_back({"neuron", "auto: a Neuron device is present"});
  }
  std::string not_neuron = machine.neuron_device_present ? "" : "no Neuron device";
  if (launched_by_mpi(env)) {
    selection.candidates.push_back(
        {"mpi", "auto: " + (not_neuron.empty() ? std::string() : not_neuron + ", ") + "launched by an MPI launcher"});
  }
  selection.candidates.push_back(
      {"gloo", "auto: " + (not_neuron.empty() ? std::string() : not_neuron + ", ") +
                   (launched_by_mpi(env) ? "CPU fallback" : "not launched by an MPI launcher")});
  return selection;
}

std::string plugin_file_name(const std::string& name) { return "libbackplane-" + name + ".so"; }

std::vector<std::string> plugin_search_dirs(const EnvLookup& env) {
  std::vector<std::string> dirs;
  auto add = [&dirs](const std::string& dir) {
    if (!dir.empty() && std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(dir);
  };
  if (auto path = env("BPL_PLUGIN_PATH")) {
    for (const std::string& dir : split_path_list(*path)) add(dir);
  }
  add(own_plugin_dir());
  return dirs;
}

std::string find_plugin(const std::string& backend, const std::vector<std::string>& dirs,
                        const std::string& launcher_mpi_abi) {
  if (backend.find('/') != std::string::npos) {
    if (is_regular_file(backend)) return backend;
    throw Error(BPL_ERR_NOT_FOUND, "plugin file '" + backend + "' does not exist or is not a file");
  }
  if (!is_plain_name(backend)) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "backend name '" + backend +
                                              "' is not valid (expected lower-case letters, digits, '-' or '_'); " +
                                              known_backends_text());
  }
  // mpi: first the plugin built for the launcher's MPI ABI, in any folder, then the system MPI's.
  std::vector<std::string> names;
  if (backend == "mpi" && !launcher_mpi_abi.empty()) names.push_back(plugin_file_name("mpi-" + launcher_mpi_abi));
  names.push_back(plugin_file_name(backend));
  std::string tried;
  for (const std::string& name : names) {
    for (const std::string& dir : dirs) {
      std::string path = dir + "/" + name;
      if (is_regular_file(path)) return path;
      tried += (tried.empty() ? "" : ", ") + path;
    }
  }
  bool known = std::find_if(std::begin(kKnownBackends), std::end(kKnownBackends),
                            [&](const char* k) { return backend == k; }) != std::end(kKnownBackends);
  std::string what = known ? "plugin for backend '" + backend + "' not found"
                           : "unknown backend '" + backend + "'";
  throw Error(BPL_ERR_NOT_FOUND, what + " (tried: " + (tried.empty() ? "no folders" : tried) +
                                     "; set BPL_PLUGIN_PATH to add folders); " + known_backends_text());
}

}  // namespace backplane
