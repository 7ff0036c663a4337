// Where a module that links LibTorch (the CPU kernels, the torch store client: side_module.h) finds it,
// without a run path that names one environment: the installed tree moves, and the torch is the user's.
// In order:
//   1. the LibTorch already in the process (a Python program that imported torch);
//   2. BPL_TORCH_DIR: a torch installation (the torch package's folder, or its lib/);
//   3. the module's run path: the torch of the Python environment the tree is installed in (its
//      site-packages' torch), or the build's torch in a build tree;
//   4. the active Python environment's torch: VIRTUAL_ENV, then CONDA_PREFIX.
#pragma once

#include <string>

namespace backplane::plugin {

struct TorchLibrary {
  std::string folder;  // holds libtorch_cpu.so; empty where LibTorch is already loaded, or not found
  std::string how;     // which of the four found it; empty where none did
  std::string looked;  // where it looked, for a failure's message
  bool found() const { return !how.empty(); }
};

// Finds the LibTorch that `module` (a path) would link, loading nothing.
TorchLibrary find_torch_library(const std::string& module);

// Makes LibTorch in `found.folder` (when 2 or 4 found it) the one the process resolves libtorch_cpu.so
// and libc10.so to: "" once done, else the loader's reason.
std::string preload_torch_library(const TorchLibrary& found);

}  // namespace backplane::plugin
