#include "compile_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/crc.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "environment.h"
#include "error.h"
#include "log.h"

namespace backplane {

namespace fs = std::filesystem;

namespace {

std::atomic<uint64_t> compiles_in_process{0};

constexpr uint64_t kMaxCacheSize = uint64_t(1) << 60;

// CRC-64/XZ over bytes: the program's part of the entry name.
uint64_t crc64(const void* data, size_t size) {
  boost::crc_optimal<64, 0x42F0E1EBA9EA3693ull, ~0ull, ~0ull, true, true> crc;
  crc.process_bytes(data, size);
  return crc.checksum();
}

uint32_t crc32(const void* data, size_t size) {
  boost::crc_32_type crc;
  crc.process_bytes(data, size);
  return crc.checksum();
}

std::string hex(uint64_t value, int digits) {
  char text[17];
  std::snprintf(text, sizeof(text), "%0*llx", digits, static_cast<unsigned long long>(value));
  return text;
}

// "--name=value" / "--name value" / "--flag" tokens of a NEURON_CC_FLAGS-style string. Cache options
// are taken out into `config`; everything else stays a compiler flag.
void apply_flags(const std::string& text, const char* origin, const std::string& backend, CacheConfig& config) {
  std::istringstream stream(text);
  std::vector<std::string> tokens;
  for (std::string token; stream >> token;) tokens.push_back(token);
  std::string kept;
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string name = tokens[i], value;
    const bool takes_value = name.rfind("--cache_dir", 0) == 0 || name.rfind("--cache_size", 0) == 0 ||
                             name.rfind("--cache_ttl", 0) == 0 || name.rfind("--log_level", 0) == 0;
    if (takes_value) {
      std::string::size_type eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else if (i + 1 < tokens.size()) {
        value = tokens[++i];
      }
      if (value.empty()) {
        throw Error(BPL_ERR_INVALID_ARGUMENT, std::string(origin) + ": " + name + " needs a value");
      }
    }
    auto integer = [&](int64_t min, int64_t max) {
      std::optional<int64_t> number = parse_integer(value);
      if (!number || *number < min || *number > max) {
        throw Error(BPL_ERR_INVALID_ARGUMENT, std::string(origin) + ": " + name + "=" + value +
                                                  " is not valid: expected an integer in [" + std::to_string(min) +
                                                  ", " + std::to_string(max) + "]");
      }
      return *number;
    };
    if (name == "--cache_dir") {
      config.root = value + "/" + backend + "-compile-cache";
    } else if (name == "--cache_size") {
      config.size_limit = static_cast<uint64_t>(integer(0, static_cast<int64_t>(kMaxCacheSize)));
    } else if (name == "--cache_ttl") {
      config.ttl_days = integer(0, 100000);
    } else if (name == "--log_level") {
      config.log_level = value;
    } else if (name == "--no_cache") {
      config.disabled = true;
    } else if (name == "--retry_failed_compilation") {
      config.retry_failed = true;
    } else {
      kept += (kept.empty() ? "" : " ") + tokens[i];
    }
  }
  if (!kept.empty()) config.compiler_flags += (config.compiler_flags.empty() ? "" : " ") + kept;
}

// The key=value lines of a marker file, or nothing when it cannot be opened (`error` says why).
std::optional<std::map<std::string, std::string>> read_marker(const fs::path& path, std::string* error = nullptr) {
  std::ifstream in(path);
  if (!in) {
    if (error != nullptr) *error = "cannot read " + path.string() + ": " + std::strerror(errno);
    return std::nullopt;
  }
  std::map<std::string, std::string> fields;
  for (std::string line; std::getline(in, line);) {
    std::string::size_type eq = line.find('=');
    if (eq != std::string::npos) fields[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return fields;
}

// A done marker as written by get_or_compile: every field there, the numbers numbers.
bool well_formed(const std::map<std::string, std::string>& marker) {
  for (const char* field : {"size", "crc32", "source_size", "source_crc32"}) {
    const auto it = marker.find(field);
    if (it == marker.end() || it->second.empty()) return false;
  }
  return parse_integer(marker.at("size")).has_value() && parse_integer(marker.at("source_size")).has_value() &&
         marker.at("crc32").size() == 8 && marker.at("source_crc32").size() == 8;
}

// Writes `bytes` to `path` through a temporary name in the same folder, flushed, then renamed: readers
// see the old file or the whole new one, never a part.
void write_atomically(const fs::path& path, const void* bytes, size_t size) {
  const fs::path temporary = path.string() + ".tmp." + std::to_string(::getpid()) + "." +
                             std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()));
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(BPL_ERR_IO, "cannot create " + temporary.string() + ": " + std::strerror(errno));
  const char* at = static_cast<const char*>(bytes);
  size_t left = size;
  while (left > 0) {
    ssize_t n = ::write(fd, at, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int error = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      throw Error(BPL_ERR_IO, "cannot write " + temporary.string() + ": " + std::strerror(error));
    }
    at += n;
    left -= static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    int error = errno;
    ::unlink(temporary.c_str());
    throw Error(BPL_ERR_IO, "cannot rename " + temporary.string() + " to " + path.string() + ": " + std::strerror(error));
  }
}

void write_text_atomically(const fs::path& path, const std::string& text) { write_atomically(path, text.data(), text.size()); }

// Appends one byte: a counter that many processes can bump without a lock.
void bump(const fs::path& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;  // counters are informative; never fail a compile over one
  const char one = '.';
  if (::write(fd, &one, 1) < 0) {
    // nothing to do: see above
  }
  ::close(fd);
}

uint64_t file_size_or_zero(const fs::path& path) {
  std::error_code error;
  uintmax_t size = fs::file_size(path, error);
  return error ? 0 : static_cast<uint64_t>(size);
}

// An exclusive flock on the entry's lock file, waited for with a bound.
class EntryLock {
 public:
  EntryLock(const fs::path& path, std::chrono::milliseconds timeout) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      error_ = "cannot open " + path.string() + ": " + std::strerror(errno);
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        ::close(fd_);
        fd_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    held_ = true;
  }
  ~EntryLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  bool held() const { return held_; }
  // Why the lock file could not be opened ("" when it was, held or not).
  const std::string& error() const { return error_; }

 private:
  int fd_ = -1;
  bool held_ = false;
  std::string error_;
};

// The bytes of `path`, or nothing when it cannot be opened (`error` says why).
std::optional<std::vector<char>> read_file(const fs::path& path, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "cannot read " + path.string() + ": " + std::strerror(errno);
    return std::nullopt;
  }
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

CacheConfig cache_config(const std::string& backend, const EnvLookup& env, const std::string& program_flags) {
  CacheConfig config;
  config.root = "/var/tmp/" + backend + "-compile-cache";
  if (auto flags = env("NEURON_CC_FLAGS")) apply_flags(*flags, "NEURON_CC_FLAGS", backend, config);
  if (!program_flags.empty()) apply_flags(program_flags, "program flags", backend, config);
  if (auto dir = env("BPL_CACHE_DIR")) config.root = *dir;
  if (auto size = env_integer(env, "BPL_CACHE_SIZE", 0, static_cast<int64_t>(kMaxCacheSize))) {
    config.size_limit = static_cast<uint64_t>(*size);
  }
  if (auto ttl = env_integer(env, "BPL_CACHE_TTL_DAYS", 0, 100000)) config.ttl_days = *ttl;
  if (auto disable = env_integer(env, "BPL_CACHE_DISABLE", 0, 1)) config.disabled = *disable == 1;
  return config;
}

CompileCache::CompileCache(CacheConfig config, std::chrono::milliseconds lock_timeout)
    : config_(std::move(config)), lock_timeout_(lock_timeout) {}

uint64_t CompileCache::compile_count() { return compiles_in_process.load(); }

std::string CompileCache::entry_path(const Key& key) const {
  const uint64_t program = crc64(key.source, key.source_size);
  const uint32_t flags = crc32(key.flags.data(), key.flags.size());
  return config_.root + "/" + key.compiler + "/MODULE_" + hex(program, 16) + "+" + hex(flags, 8);
}

std::vector<char> CompileCache::get_or_compile(const Key& key, const std::function<std::vector<char>()>& compile) {
  auto compile_counted = [&] {
    ++compiles_in_process;
    return compile();
  };
  if (config_.disabled) return compile_counted();

  const fs::path dir = entry_path(key);
  const fs::path artifact = dir / "model.bin", done = dir / "model.done", failed = dir / "model.failed";
  const std::string source_crc = hex(crc32(key.source, key.source_size), 8);

  // A hit: the done marker names the artifact's size and checksum, and the program it was built from.
  // An entry this process cannot read (its permissions) is left alone: compiled without the cache.
  enum class Lookup { kMiss, kHit, kOtherProgram, kUnreadable };
  std::vector<char> bytes;
  std::string unreadable;
  auto look_up = [&]() {
    std::error_code missing;
    if (!fs::exists(done, missing)) {
      if (!missing) return Lookup::kMiss;
      unreadable = "cannot look at " + done.string() + ": " + missing.message();
      return Lookup::kUnreadable;
    }
    std::optional<std::map<std::string, std::string>> marker = read_marker(done, &unreadable);
    if (!marker) return Lookup::kUnreadable;
    if (!well_formed(*marker)) {
      log(BPL_LOG_WARN, "cache", "entry marker " + done.string() + " is garbled; recompiling the entry");
      std::error_code ignored;
      fs::remove(done, ignored);
      return Lookup::kMiss;
    }
    if ((*marker)["source_size"] != std::to_string(key.source_size) || (*marker)["source_crc32"] != source_crc) {
      log(BPL_LOG_WARN, "cache", "entry " + dir.string() + " belongs to another program (a hash collision: its marker "
                                 "names a source of " + (*marker)["source_size"] + " bytes with CRC-32 " +
                                 (*marker)["source_crc32"] + "); compiling without the cache");
      return Lookup::kOtherProgram;
    }
    std::optional<std::vector<char>> artifact_bytes = read_file(artifact, &unreadable);
    if (!artifact_bytes) return Lookup::kUnreadable;
    bytes = std::move(*artifact_bytes);
    if (std::to_string(bytes.size()) == (*marker)["size"] && hex(crc32(bytes.data(), bytes.size()), 8) == (*marker)["crc32"]) {
      bump(dir / "model.hits");
      return Lookup::kHit;
    }
    log(BPL_LOG_WARN, "cache", "corrupt cache entry " + artifact.string() + " (" + std::to_string(bytes.size()) +
                                   " bytes, expected " + (*marker)["size"] + " with CRC-32 " + (*marker)["crc32"] +
                                   "); recompiling");
    std::error_code ignored;
    fs::remove(done, ignored);
    return Lookup::kMiss;
  };
  auto without_the_cache = [&](const std::string& why) {
    log(BPL_LOG_WARN, "cache", why + "; compiling without the cache");
    return compile_counted();
  };
  auto replay_failure = [&] {
    if (config_.retry_failed || !fs::exists(failed)) return;
    std::map<std::string, std::string> marker = read_marker(failed).value_or(std::map<std::string, std::string>{});
    std::optional<int64_t> status = parse_integer(marker["status"]);
    throw Error(status ? static_cast<bpl_status>(*status) : BPL_ERR_INTERNAL,
                "a cached failed compilation at " + failed.string() + ": " + marker["message"] +
                    " (not recompiling; pass --retry_failed_compilation in NEURON_CC_FLAGS or the program flags to retry)");
  };

  Lookup found = look_up();
  if (found == Lookup::kHit) return bytes;
  if (found == Lookup::kOtherProgram) return compile_counted();  // leave that entry alone
  if (found == Lookup::kUnreadable) return without_the_cache(unreadable);
  replay_failure();

  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return without_the_cache("cannot create " + dir.string() + " (" + error.message() + ")");
  EntryLock lock(dir / "model.lock", lock_timeout_);
  if (!lock.error().empty()) return without_the_cache(lock.error());
  if (!lock.held()) {
    return without_the_cache("another process held " + dir.string() + " for " + std::to_string(lock_timeout_.count()) +
                             " ms");
  }
  // Another process may have finished (or failed) while this one waited for the lock.
  found = look_up();
  if (found == Lookup::kHit) return bytes;
  if (found == Lookup::kOtherProgram) return compile_counted();
  if (found == Lookup::kUnreadable) return without_the_cache(unreadable);
  replay_failure();

  try {
    bytes = compile_counted();
  } catch (const Error& e) {
    std::string message = e.what();
    std::replace(message.begin(), message.end(), '\n', ' ');
    write_text_atomically(failed, "status=" + std::to_string(e.status()) + "\nmessage=" + message + "\n");
    bump(dir / "model.compiles");
    throw;
  }
  bump(dir / "model.compiles");
  write_atomically(artifact, bytes.data(), bytes.size());
  std::ostringstream marker;
  marker << "size=" << bytes.size() << "\ncrc32=" << hex(crc32(bytes.data(), bytes.size()), 8)
         << "\ncompiler=" << key.compiler << "\nflags=" << key.flags << "\nsource_size=" << key.source_size
         << "\nsource_crc32=" << source_crc << "\n";
  fs::remove(failed, error);
  write_text_atomically(done, marker.str());
  bump(dir / "model.hits");  // creates the last-use stamp; the first use is this compilation
  try {
    prune();
  } catch (const std::exception& e) {
    log(BPL_LOG_WARN, "cache", std::string("pruning the cache failed: ") + e.what());
  }
  return bytes;
}

std::vector<CompileCache::Entry> CompileCache::list() const {
  std::vector<Entry> entries;
  std::error_code error;
  if (!fs::is_directory(config_.root, error)) return entries;
  for (const fs::directory_entry& compiler : fs::directory_iterator(config_.root, error)) {
    if (!compiler.is_directory(error)) continue;
    for (const fs::directory_entry& module : fs::directory_iterator(compiler.path(), error)) {
      if (!module.is_directory(error) || module.path().filename().string().rfind("MODULE_", 0) != 0) continue;
      Entry entry;
      entry.path = module.path().string();
      entry.compiler = compiler.path().filename().string();
      entry.module = module.path().filename().string();
      entry.failed = fs::exists(module.path() / "model.failed", error);
      if (!entry.failed && !fs::exists(module.path() / "model.done", error)) continue;  // being written
      entry.size = file_size_or_zero(module.path() / "model.bin");
      entry.compiles = file_size_or_zero(module.path() / "model.compiles");
      const fs::path hits = module.path() / "model.hits";
      const uint64_t hit_bytes = file_size_or_zero(hits);
      entry.hits = hit_bytes > 0 ? hit_bytes - 1 : 0;  // the first byte stamps the compilation
      fs::path stamp = fs::exists(hits, error) ? hits : module.path();
      auto written = fs::last_write_time(stamp, error);
      entry.last_use = std::chrono::system_clock::now() +
                       std::chrono::duration_cast<std::chrono::system_clock::duration>(written - fs::file_time_type::clock::now());
      entries.push_back(entry);
    }
  }
  return entries;
}

uint64_t CompileCache::total_size() const {
  uint64_t total = 0;
  for (const Entry& entry : list()) total += entry.size;
  return total;
}

uint64_t CompileCache::prune() {
  std::vector<Entry> entries = list();
  uint64_t total = 0;
  for (const Entry& entry : entries) total += entry.size;
  if (total <= config_.size_limit) return 0;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; });
  const auto protected_since = std::chrono::system_clock::now() - std::chrono::hours(24) * config_.ttl_days;
  uint64_t freed = 0;
  for (const Entry& entry : entries) {
    if (total <= config_.size_limit) break;
    if (entry.last_use >= protected_since) continue;  // used within the TTL: kept even above the limit
    std::error_code error;
    fs::remove(fs::path(entry.path) / "model.done", error);  // readers stop trusting it first
    fs::remove_all(entry.path, error);
    total -= entry.size;
    freed += entry.size;
    log(BPL_LOG_INFO, "cache", "evicted " + entry.path + " (" + std::to_string(entry.size) + " bytes)");
  }
  return freed;
}

void CompileCache::clear() {
  std::error_code error;
  fs::remove_all(config_.root, error);
  if (error) throw Error(BPL_ERR_IO, "cannot clear " + config_.root + ": " + error.message());
}

}  // namespace backplane
