// What a shared object's dynamic section says, read from its file without loading it: the libraries it
// needs (DT_NEEDED: the core's loader decides from them how to open a plugin, loader.cpp) and where it
// looks for them (DT_RUNPATH: a plugin asks whether its LibTorch module would find LibTorch,
// plugins/common/torch_library.cpp). Shared by the core and the plugins (the static library bpl_elf).
#pragma once

#include <string>
#include <vector>

namespace backplane {

struct ElfDynamic {
  std::vector<std::string> needed;   // "libgloo.so", "libc.so.6", ...
  std::vector<std::string> runpath;  // its folders as written ("$ORIGIN/../lib"), DT_RPATH's where no DT_RUNPATH
};

// Empty where the file is no 64-bit ELF object or cannot be read.
ElfDynamic elf_dynamic(const std::string& path);

}  // namespace backplane
