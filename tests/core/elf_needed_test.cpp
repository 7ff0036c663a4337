// The libraries a shared object needs, as the loader reads them from its file (elf_needed.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "elf_needed.h"

namespace backplane {
namespace {

bool has(const std::vector<std::string>& libraries, const std::string& prefix) {
  return std::any_of(libraries.begin(), libraries.end(), [&](const std::string& l) { return l.rfind(prefix, 0) == 0; });
}

TEST(ElfNeeded, ReadsWhatAPluginLinks) {
  const std::vector<std::string> gloo = elf_needed_libraries(BPL_PLUGINS "/libbackplane-gloo.so");
  EXPECT_TRUE(has(gloo, "libgloo")) << "the gloo plugin links Gloo";
  EXPECT_TRUE(has(gloo, "libc.so"));
  EXPECT_FALSE(has(elf_needed_libraries(BPL_PLUGINS "/libbackplane-neuron.so"), "libgloo"));
}

TEST(ElfNeeded, AnythingElseNeedsNothing) {
  EXPECT_TRUE(elf_needed_libraries("/nonexistent/libnothing.so").empty());
  EXPECT_TRUE(elf_needed_libraries(__FILE__).empty());  // not an ELF object
}

}  // namespace
}  // namespace backplane
