#include "elf_dynamic.h"

#include <elf.h>

#include <algorithm>
#include <fstream>

namespace backplane {

namespace {

template <typename T>
bool read_at(std::ifstream& file, uint64_t offset, T* out, size_t count = 1) {
  file.seekg(static_cast<std::streamoff>(offset));
  file.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(sizeof(T) * count));
  return static_cast<bool>(file);
}

}  // namespace

ElfDynamic elf_dynamic(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  Elf64_Ehdr header{};
  if (!read_at(file, 0, &header) || std::string(reinterpret_cast<const char*>(header.e_ident), 4) != ELFMAG ||
      header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_shentsize != sizeof(Elf64_Shdr)) {
    return {};
  }
  std::vector<Elf64_Shdr> sections(header.e_shnum);
  if (sections.empty() || !read_at(file, header.e_shoff, sections.data(), sections.size())) return {};
  ElfDynamic found;
  std::string runpath, rpath;
  for (const Elf64_Shdr& dynamic : sections) {
    // The dynamic section's entries, and the string table its sh_link names, which holds their names.
    if (dynamic.sh_type != SHT_DYNAMIC || dynamic.sh_link >= sections.size()) continue;
    const Elf64_Shdr& names = sections[dynamic.sh_link];
    std::vector<Elf64_Dyn> entries(dynamic.sh_size / sizeof(Elf64_Dyn));
    std::string text(names.sh_size, '\0');
    if (!read_at(file, dynamic.sh_offset, entries.data(), entries.size()) || !read_at(file, names.sh_offset, text.data(), text.size())) {
      return {};
    }
    for (const Elf64_Dyn& entry : entries) {
      if (entry.d_tag == DT_NULL) break;
      if (entry.d_un.d_val >= text.size()) continue;
      const char* value = text.c_str() + entry.d_un.d_val;
      if (entry.d_tag == DT_NEEDED) found.needed.emplace_back(value);
      if (entry.d_tag == DT_RUNPATH) runpath = value;
      if (entry.d_tag == DT_RPATH) rpath = value;
    }
  }
  // The dynamic loader ignores DT_RPATH where DT_RUNPATH is present.
  const std::string& folders = runpath.empty() ? rpath : runpath;
  for (size_t start = 0; start < folders.size();) {
    const size_t colon = std::min(folders.find(':', start), folders.size());
    if (colon > start) found.runpath.push_back(folders.substr(start, colon - start));
    start = colon + 1;
  }
  return found;
}

}  // namespace backplane
