#include "collectives_settings.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "backplane/backplane.h"

namespace backplane::bench {
namespace {

int64_t parse_bytes(const std::string& flag, const std::string& text) {
  size_t end = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  std::string suffix = text.substr(end);
  int shift = suffix == "K" ? 10 : suffix == "M" ? 20 : suffix == "G" ? 30 : suffix.empty() ? 0 : -1;
  if (end == 0 || shift < 0 || value < 1) refuse(flag + "=" + text + ": expected a positive size such as 4, 64K or 64M");
  return value << shift;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) items.push_back(item);
  return items;
}

}  // namespace

std::vector<std::string> all_operations() {
  std::vector<std::string> ops;
#define BPL_MEASURED(code, name, minor)                                                                        \
  if (code != BPL_COLL_SEND && code != BPL_COLL_RECV && code != BPL_COLL_RECV_ANY && code != BPL_COLL_COMM_SPLIT) \
    ops.push_back(name);
  BPL_FOR_EACH_COLLECTIVE(BPL_MEASURED)
#undef BPL_MEASURED
  ops.push_back("pingpong");
  ops.push_back("copy");
  return ops;
}

[[noreturn]] void refuse(const std::string& message) {
  std::fprintf(stderr, "bpl-bench-collectives: %s\n", message.c_str());
  std::exit(2);
}

Settings parse_settings(int& argc, char** argv) {
  Settings settings;
  std::string min_bytes = "4", max_bytes = "64M", step_factor = "4", dtypes = "f32,bf16", ops;
  bool list_operations = false;
  CLI::App app{"Collectives through backplane and through the raw library underneath, side by side in one run.",
               "bpl-bench-collectives"};
  app.footer("Sizes take K, M and G suffixes (powers of 1024). Google Benchmark's own flags (--benchmark_filter=, "
             "--benchmark_out=, ...) pass through.");
  app.allow_extras();
  app.add_option("--min-bytes", min_bytes, "the smallest size")->capture_default_str();
  app.add_option("--max-bytes", max_bytes, "the largest size")->capture_default_str();
  app.add_option("--step-factor", step_factor, "each size this many times the last (>= 2)")->capture_default_str();
  app.add_option("--dtypes", dtypes, "f32, bf16 or both, comma-separated")->capture_default_str();
  app.add_option("--ops", ops, "the operations, comma-separated (default: all; --list-operations)");
  app.add_flag("--list-operations", list_operations, "print the operations measured, one a line, and exit");
  app.add_option("--repetitions", settings.repetitions, "repetitions of each point")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--max-iterations", settings.max_iterations, "the most iterations of a repetition")->capture_default_str()
      ->check(CLI::Range(1, 1000000000));
  app.add_option("--buffer-offset", settings.buffer_offset, "where every buffer starts, in bytes past a page boundary")
      ->capture_default_str()
      ->check(CLI::Range(0, 4095));
  app.add_flag("--no-raw", [&](int64_t) { settings.raw = false; }, "measure backplane alone");
  app.add_flag("--async", settings.async, "post every operation with a request and wait for it (the raw library's "
                                          "non-blocking form, where it has one)");
  app.add_flag("--interleave", settings.interleave, "alternate each point's repetitions between backplane and the raw "
                                                    "library, instead of running them in a row");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);  // --help: 0; a bad flag or value: 2
  }
  if (list_operations) {
    for (const std::string& op : all_operations()) std::printf("%s\n", op.c_str());
    std::exit(0);
  }
  // What CLI11 did not take, in argv's order, for Google Benchmark.
  const std::vector<std::string> rest = app.remaining();
  int kept = 1;
  for (int i = 1, next = 0; i < argc; ++i) {
    if (next < static_cast<int>(rest.size()) && rest[static_cast<size_t>(next)] == argv[i]) {
      argv[kept++] = argv[i];
      ++next;
    }
  }
  argc = kept;
  settings.min_bytes = parse_bytes("--min-bytes", min_bytes);
  settings.max_bytes = parse_bytes("--max-bytes", max_bytes);
  settings.step_factor = parse_bytes("--step-factor", step_factor);
  if (settings.step_factor < 2) refuse("--step-factor must be >= 2");
  settings.dtypes = split_list(dtypes);
  for (const std::string& d : settings.dtypes) {
    if (d != "f32" && d != "bf16") refuse("--dtypes: '" + d + "' is not one of f32, bf16");
  }
  if (!ops.empty()) {
    settings.ops = split_list(ops);
    const std::vector<std::string> known = all_operations();
    for (const std::string& op : settings.ops) {
      if (std::find(known.begin(), known.end(), op) == known.end()) refuse("--ops: unknown operation '" + op + "' (--list-operations lists them)");
    }
  }
  return settings;
}

}  // namespace backplane::bench
