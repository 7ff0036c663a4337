// What the real-process tests' files share: where the programs are, and how a result is described.
#pragma once

#include <gtest/gtest.h>
#include <sched.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backplane/backplane.h"
#include "support/process.h"

namespace backplane::test::processes {

using backplane::test::ProcessResult;
using backplane::test::run_process;

inline std::string self_path;  // this binary, set by main: the rank program
inline const std::string kBin = BPL_BIN_DIR;
inline const std::string bpl_run = kBin + "/bpl-run";
inline const std::string embed = kBin + "/embed";

inline std::string describe(const ProcessResult& r) {
  return "exit " + std::to_string(r.exit_code) + ", signal " + std::to_string(r.signal) +
         (r.timed_out ? ", TIMED OUT" : "") + ", output:\n" + r.output;
}

inline size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace backplane::test::processes
