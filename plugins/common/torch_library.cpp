#include "torch_library.h"

#include <dlfcn.h>
#include <glob.h>
#include <sys/stat.h>

#include "elf_dynamic.h"
#include "plugin_support.h"

namespace backplane::plugin {
namespace {

constexpr const char* kTorchLibrary = "libtorch_cpu.so";

bool holds_torch(const std::string& folder) {
  struct stat st {};
  return !folder.empty() && ::stat((folder + "/" + kTorchLibrary).c_str(), &st) == 0;
}

std::string folder_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// An environment's torch: <env>/lib/python3.*/site-packages/torch/lib (dist-packages for Debian's).
std::string environment_torch(const std::string& environment) {
  for (const char* packages : {"site-packages", "dist-packages"}) {
    glob_t matches{};
    const std::string pattern = environment + "/lib/python3*/" + packages + "/torch/lib";
    if (::glob(pattern.c_str(), 0, nullptr, &matches) == 0) {
      const std::string folder = matches.gl_pathv[0];
      ::globfree(&matches);
      if (holds_torch(folder)) return folder;
    } else {
      ::globfree(&matches);
    }
  }
  return "";
}

}  // namespace

TorchLibrary find_torch_library(const std::string& module) {
  TorchLibrary found;
  if (void* loaded = ::dlopen(kTorchLibrary, RTLD_LAZY | RTLD_NOLOAD)) {
    ::dlclose(loaded);
    found.how = "the process's own LibTorch";
    return found;
  }
  auto take = [&](const std::string& folder, const std::string& how) {
    found.looked += (found.looked.empty() ? "" : ", ") + how + (folder.empty() ? "" : " (" + folder + ")");
    if (!holds_torch(folder)) return false;
    found.folder = folder;
    found.how = how;
    return true;
  };
  if (const char* dir = env("BPL_TORCH_DIR")) {
    const std::string given = dir;
    if (take(given, "BPL_TORCH_DIR") || take(given + "/lib", "BPL_TORCH_DIR")) return found;
  }
  for (std::string folder : elf_dynamic(module).runpath) {
    if (folder.rfind("$ORIGIN", 0) == 0) folder = folder_of(module) + folder.substr(7);
    if (take(folder, "the module's run path")) {
      found.folder.clear();  // the dynamic loader finds it there by itself
      return found;
    }
  }
  for (const char* variable : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
    const char* environment = env(variable);
    const std::string folder = environment != nullptr ? environment_torch(environment) : "";
    if (!folder.empty() && take(folder, variable)) return found;
    found.looked += std::string(found.looked.empty() ? "" : ", ") + variable +
                    (environment == nullptr ? " (unset)" : " (" + std::string(environment) + ", which has no torch)");
  }
  return found;
}

std::string preload_torch_library(const TorchLibrary& found) {
  if (found.folder.empty()) return "";
  // Global, so that the module's own references to LibTorch resolve to these copies.
  for (const char* library : {"libc10.so", kTorchLibrary}) {
    if (::dlopen((found.folder + "/" + library).c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      const char* why = ::dlerror();
      return std::string("LibTorch in ") + found.folder + " (" + found.how + ") could not be loaded: " +
             (why != nullptr ? why : "unknown error");
    }
  }
  return "";
}

}  // namespace backplane::plugin
