// The libraries a shared object names as needed (its DT_NEEDED entries), read from its file without
// loading it: the loader decides from them how to open a plugin (loader.cpp).
#pragma once

#include <string>
#include <vector>

namespace backplane {

// "libgloo.so", "libc.so.6", ...; empty where the file is no 64-bit ELF object or cannot be read.
std::vector<std::string> elf_needed_libraries(const std::string& path);

}  // namespace backplane
