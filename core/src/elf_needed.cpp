#include "elf_needed.h"

#include <elf.h>

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

std::vector<std::string> elf_needed_libraries(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  Elf64_Ehdr header{};
  if (!read_at(file, 0, &header) || std::string(reinterpret_cast<const char*>(header.e_ident), 4) != ELFMAG ||
      header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_shentsize != sizeof(Elf64_Shdr)) {
    return {};
  }
  std::vector<Elf64_Shdr> sections(header.e_shnum);
  if (sections.empty() || !read_at(file, header.e_shoff, sections.data(), sections.size())) return {};
  std::vector<std::string> needed;
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
      if (entry.d_tag == DT_NEEDED && entry.d_un.d_val < text.size()) needed.emplace_back(text.c_str() + entry.d_un.d_val);
    }
  }
  return needed;
}

}  // namespace backplane
