// What a shared object's dynamic section says, as the loader reads it from its file (elf_dynamic.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "elf_dynamic.h"

namespace backplane {
namespace {

bool has(const std::vector<std::string>& libraries, const std::string& prefix) {
  return std::any_of(libraries.begin(), libraries.end(), [&](const std::string& l) { return l.rfind(prefix, 0) == 0; });
}

TEST(ElfDynamic, ReadsWhatAPluginLinks) {
  const std::vector<std::string> gloo = elf_dynamic(BPL_PLUGINS "/libbackplane-gloo.so").needed;
  EXPECT_TRUE(has(gloo, "libgloo")) << "the gloo plugin links Gloo";
  EXPECT_TRUE(has(gloo, "libc.so"));
  EXPECT_FALSE(has(elf_dynamic(BPL_PLUGINS "/libbackplane-neuron.so").needed, "libgloo"));
}

TEST(ElfDynamic, AnythingElseNeedsNothing) {
  EXPECT_TRUE(elf_dynamic("/nonexistent/libnothing.so").needed.empty());
  EXPECT_TRUE(elf_dynamic(__FILE__).needed.empty());  // not an ELF object
  EXPECT_TRUE(elf_dynamic(__FILE__).runpath.empty());
}

// The run path as written, $ORIGIN unexpanded: what links LibTorch names where it is (the build's torch
// in the build tree).
TEST(ElfDynamic, ReadsTheRunPath) {
  if (elf_dynamic(BPL_PLUGINS "/libbpl-cpu-kernels.so").needed.empty()) GTEST_SKIP() << "the kernels module is not built";
  const ElfDynamic kernels = elf_dynamic(BPL_PLUGINS "/libbpl-cpu-kernels.so");
  EXPECT_TRUE(has(kernels.needed, "libtorch_cpu.so"));
  EXPECT_TRUE(std::any_of(kernels.runpath.begin(), kernels.runpath.end(),
                          [](const std::string& folder) { return folder.find("torch/lib") != std::string::npos; }));
}

}  // namespace
}  // namespace backplane
