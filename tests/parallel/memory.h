// Resident memory of this process, for the tests that measure what a feature saves.
#pragma once

#include <malloc.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

namespace backplane::test {

// A field of /proc/self/status in bytes ("VmRSS": resident now, "VmHWM": the peak since the last
// reset_peak_memory()), or -1.
inline int64_t memory_status(const char* field) {
  std::ifstream status("/proc/self/status");
  const std::string text((std::istreambuf_iterator<char>(status)), std::istreambuf_iterator<char>());
  std::smatch match;
  if (!std::regex_search(text, match, std::regex(std::string(field) + R"(:\s+(\d+) kB)"))) return -1;
  return std::stoll(match[1]) * 1024;
}

// Starts a new peak (Linux: writing 5 to clear_refs); false where this process may not.
inline bool reset_peak_memory() { return static_cast<bool>(std::ofstream("/proc/self/clear_refs") << "5" << std::flush); }

// Makes resident memory follow what is alive: tensors above 128 KiB get pages of their own, given back
// when freed. False (with the reason in `why`) where the peak cannot be measured here.
inline bool measurable_memory(std::string& why) {
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  if (reset_peak_memory() && memory_status("VmHWM") >= 0) return true;
  why = "cannot reset the peak of resident memory here (/proc/self/clear_refs)";
  return false;
}

}  // namespace backplane::test
