// The persistent compile cache (docs/embedding.md, "The compile cache"; reference: "Persistent cache for
// compiled graphs"). Every backend's bpl_program_compile goes through it, and bpl-cache looks after it
// through this header alone: this folder is the cache's stated interface (the bpl_compile_cache
// library), the rest of the core stays private to libbackplane.
//
// Layout: <root>/<compiler>/MODULE_<program hash>+<flags hash>/ holding
//   model.bin       the artifact, written under a temporary name and renamed;
//   model.done      written last: the artifact's size and CRC-32 and the key's facts (a hit is verified
//                   against it; a corrupt or truncated artifact is recompiled, never trusted);
//   model.failed    a failed compilation's status and message, replayed until retry is asked;
//   model.hits      one byte appended per hit; its modification time is the entry's last use;
//   model.compiles  one byte appended per compilation (how often the entry was built);
//   model.lock      flock(2): one process compiles an entry, the others wait for it (bounded).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "env_lookup.h"

namespace backplane {

struct CacheConfig {
  std::string root;                           // the folder holding the entries
  uint64_t size_limit = 100ull * 1000 * 1000 * 1000;  // bytes (100 GB, the reference's default)
  int64_t ttl_days = 30;                      // entries used more recently are never evicted
  bool disabled = false;                      // --no_cache: compile, write nothing
  bool retry_failed = false;                  // --retry_failed_compilation
  std::string log_level;                      // --log_level, handed to the compiler
  std::string compiler_flags;                 // every other flag: part of the key, handed to the compiler

  // What the compiler is given: its flags, and the log level, which is no part of the key (it changes
  // what the compiler prints, not what it builds).
  std::string flags_for_compiler() const {
    return log_level.empty() ? compiler_flags : compiler_flags + (compiler_flags.empty() ? "" : " ") + "--log_level=" + log_level;
  }
};

// The cache settings for `backend`, highest first: BPL_CACHE_DIR / BPL_CACHE_SIZE / BPL_CACHE_TTL_DAYS /
// BPL_CACHE_DISABLE > NEURON_CC_FLAGS (--cache_dir=<root> means <root>/<backend>-compile-cache,
// --cache_size=<bytes>, --cache_ttl=<days>, --no_cache, --retry_failed_compilation, --log_level=<level>)
// > defaults (/var/tmp/<backend>-compile-cache, 100 GB, 30 days). `program_flags` (bpl_program_options)
// are parsed like NEURON_CC_FLAGS and override it. Throws Error(INVALID_ARGUMENT) naming a bad value.
CacheConfig cache_config(const std::string& backend, const EnvLookup& env, const std::string& program_flags);

class CompileCache {
 public:
  struct Key {
    std::string compiler;  // "torchscript-1.13.1": format and compiler version
    std::string flags;     // compiler flags (CacheConfig::compiler_flags)
    const void* source = nullptr;
    size_t source_size = 0;
  };

  struct Entry {
    std::string path;
    std::string compiler;
    std::string module;  // MODULE_<program hash>+<flags hash>
    uint64_t size = 0;   // artifact bytes
    uint64_t hits = 0;
    uint64_t compiles = 0;
    bool failed = false;
    std::chrono::system_clock::time_point last_use;
  };

  // `lock_timeout` bounds the wait for another process compiling the same entry; past it this
  // process compiles on its own without touching the entry.
  CompileCache(CacheConfig config, std::chrono::milliseconds lock_timeout);

  // The artifact for `key`: a verified cache hit, or `compile()`'s result, stored unless disabled.
  // A failure of `compile` (an Error) is recorded and rethrown; a recorded failure is rethrown without
  // compiling unless retry_failed.
  std::vector<char> get_or_compile(const Key& key, const std::function<std::vector<char>()>& compile);

  std::string entry_path(const Key& key) const;
  std::vector<Entry> list() const;
  uint64_t total_size() const;
  // Evicts least-recently-used entries while the total is above the size limit, never one used within
  // the TTL. Returns the bytes freed.
  uint64_t prune();
  void clear();
  const CacheConfig& config() const { return config_; }

  // Compilations this process has run through any cache (a hit does not count).
  static uint64_t compile_count();

 private:
  CacheConfig config_;
  std::chrono::milliseconds lock_timeout_;
};

}  // namespace backplane
