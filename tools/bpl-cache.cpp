// bpl-cache: look after a backend's persistent compile cache.
//
//   bpl-cache [--backend NAME] list     entries (compiler, module, size, last use, hits, status) and total
//   bpl-cache [--backend NAME] total    total size in bytes
//   bpl-cache [--backend NAME] prune    evict by the configured size limit and TTL
//   bpl-cache [--backend NAME] clear    remove every entry
//
// The cache and its limits come from the same settings bpl_program_compile uses (BPL_CACHE_*,
// NEURON_CC_FLAGS); the backend defaults to the one the environment selects.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>

#include "backplane/backplane.h"
#include "compile_cache.h"

namespace {

std::string local_time(std::chrono::system_clock::time_point when) {
  std::time_t t = std::chrono::system_clock::to_time_t(when);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend, command;
  CLI::App app{"Looks after a backend's persistent compile cache (its settings: BPL_CACHE_*, NEURON_CC_FLAGS).", "bpl-cache"};
  app.set_version_flag("--version", std::string("bpl-cache (backplane) ") + BPL_VERSION);
  app.add_option("--backend", backend, "the backend whose cache (default: the one the environment selects)");
  app.add_option("command", command, "list: entries and total; total: size in bytes; prune: evict by the size "
                                      "limit and TTL; clear: remove every entry")
      ->required()
      ->check(CLI::IsMember({"list", "total", "prune", "clear"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a bad flag, command or value: 2
  }
  try {
    if (backend.empty()) {
      bpl_selection selection = BPL_SELECTION_INIT;
      bpl_select_backend(nullptr, &selection);  // the name is filled even when no plugin file is found
      backend = selection.backend;
    }
    backplane::CompileCache cache(backplane::cache_config(backend, backplane::process_environment(), ""),
                                  std::chrono::seconds(0));
    const backplane::CacheConfig& config = cache.config();
    if (command == "list") {
      std::printf("%s compile cache %s (limit %llu bytes, TTL %lld days)\n", backend.c_str(), config.root.c_str(),
                  static_cast<unsigned long long>(config.size_limit), static_cast<long long>(config.ttl_days));
      std::printf("%-22s %-42s %12s  %-19s %6s  %s\n", "COMPILER", "MODULE", "BYTES", "LAST USE", "HITS", "STATUS");
      uint64_t total = 0;
      auto entries = cache.list();
      for (const auto& entry : entries) {
        std::printf("%-22s %-42s %12llu  %-19s %6llu  %s\n", entry.compiler.c_str(), entry.module.c_str(),
                    static_cast<unsigned long long>(entry.size), local_time(entry.last_use).c_str(),
                    static_cast<unsigned long long>(entry.hits), entry.failed ? "failed" : "ok");
        total += entry.size;
      }
      std::printf("total %llu bytes in %zu entries\n", static_cast<unsigned long long>(total), entries.size());
    } else if (command == "total") {
      std::printf("%llu\n", static_cast<unsigned long long>(cache.total_size()));
    } else if (command == "prune") {
      std::printf("freed %llu bytes; %llu bytes remain in %s\n", static_cast<unsigned long long>(cache.prune()),
                  static_cast<unsigned long long>(cache.total_size()), config.root.c_str());
    } else {
      cache.clear();
      std::printf("cleared %s\n", config.root.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bpl-cache: %s\n", e.what());
    return 1;
  }
  return 0;
}
