// Google Benchmark's command line as every benchmark of backplane starts it.
#pragma once

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

namespace backplane::bench {

// argv with each of `defaults` ("--flag=value") added unless the caller gave that flag, and colour off
// unless stdout is a terminal or the caller chose: Google Benchmark's "auto" looks at TERM alone, so a
// run redirected to a file would carry escape codes. The strings live as long as the program.
inline std::vector<char*> benchmark_arguments(int argc, char** argv, std::initializer_list<const char*> defaults = {}) {
  static std::vector<std::string> added;
  std::vector<char*> args(argv, argv + argc);
  auto given = [&](const std::string& flag) {
    const std::string name = flag.substr(0, flag.find('='));
    for (int i = 1; i < argc; ++i) {
      if (std::strncmp(argv[i], name.c_str(), name.size()) == 0) return true;
    }
    return false;
  };
  std::vector<std::string> wanted(defaults.begin(), defaults.end());
  if (!::isatty(STDOUT_FILENO)) wanted.push_back("--benchmark_color=false");
  added.reserve(added.size() + wanted.size());  // no reallocation: args points into it
  for (const std::string& flag : wanted) {
    if (given(flag)) continue;
    added.push_back(flag);
    args.push_back(added.back().data());
  }
  return args;
}

// What a console reporter made by hand shows, from the arguments before Google Benchmark takes its own
// out of them: --benchmark_color's choice, else colour only on a terminal.
inline benchmark::ConsoleReporter::OutputOptions console_options(const std::vector<char*>& args) {
  bool colour = ::isatty(STDOUT_FILENO) != 0;
  for (const char* arg : args) {
    if (std::strncmp(arg, "--benchmark_color=", 18) != 0) continue;
    const std::string value = arg + 18;
    colour = !(value == "false" || value == "no" || value == "0" || value == "never");
  }
  return colour ? benchmark::ConsoleReporter::OO_ColorTabular : benchmark::ConsoleReporter::OO_Tabular;
}

}  // namespace backplane::bench
