#include "trace.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "environment.h"
#include "error.h"
#include "log.h"

namespace backplane {
namespace {

// `text` as a JSON string's contents.
std::string json_escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char code[8];
          std::snprintf(code, sizeof(code), "\\u%04x", c);
          out += code;
        } else {
          out += c;
        }
    }
  }
  return out;
}

// Creates `dir` and its parents as needed; false (errno set) if it cannot.
bool make_dirs(const std::string& dir) {
  for (size_t slash = dir.find('/', 1); ; slash = dir.find('/', slash + 1)) {
    const std::string prefix = dir.substr(0, slash);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) return false;
    if (slash == std::string::npos) return true;
  }
}

}  // namespace

std::unique_ptr<Trace> Trace::from_environment(const EnvLookup& env, int32_t rank, int32_t world_size,
                                               const std::string& backend) {
  const std::optional<std::string> dir = env("BPL_TRACE");
  if (!dir) return nullptr;
  const int64_t events = env_integer(env, "BPL_TRACE_EVENTS", 1, int64_t{1} << 30).value_or(kDefaultEvents);
  if (!make_dirs(*dir)) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "BPL_TRACE='" + *dir + "': cannot create the folder (" + std::strerror(errno) + ")");
  }
  return std::unique_ptr<Trace>(new Trace(*dir, static_cast<size_t>(events), rank, world_size, backend));
}

Trace::Trace(std::string dir, size_t capacity, int32_t rank, int32_t world_size, std::string backend)
    : dir_(std::move(dir)),
      rank_(rank),
      world_size_(world_size),
      backend_(std::move(backend)),
      steady_origin_(std::chrono::steady_clock::now()),
      wall_origin_us_(std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count()),
      ring_(capacity) {}

int64_t Trace::now_us() const {
  return wall_origin_us_ +
         std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - steady_origin_).count();
}

uint64_t Trace::begin(const What& what) {
  const int64_t start = now_us();
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t ticket = begun_++;
  Event& e = ring_[ticket % ring_.size()];
  e.op = what.op;
  e.comm = *what.comm;
  e.sequence = what.sequence;
  e.bytes = what.bytes;
  e.dtype = what.dtype;
  e.path = what.path;
  e.start_us = start;
  e.end_us = -1;
  e.status = BPL_OK;
  return ticket;
}

void Trace::end(uint64_t ticket, bpl_status status) {
  const int64_t end = now_us();
  std::lock_guard<std::mutex> lock(mutex_);
  if (ticket + ring_.size() < begun_) return;  // overwritten by later operations already
  Event& e = ring_[ticket % ring_.size()];
  e.end_us = end;
  e.status = status;
}

void Trace::write() {
  std::string json = "{\"traceEvents\": [\n";
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t kept = std::min<uint64_t>(begun_, ring_.size());
    json += "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(rank_) +
            ", \"args\": {\"name\": \"rank " + std::to_string(rank_) + "\"}}";
    for (uint64_t ticket = begun_ - kept; ticket < begun_; ++ticket) {
      const Event& e = ring_[ticket % ring_.size()];
      const int64_t end = e.end_us >= 0 ? e.end_us : now_us();
      json += ",\n{\"name\": \"" + std::string(e.op) + "\", \"cat\": \"" + json_escaped(e.comm) +
              "\", \"ph\": \"X\", \"pid\": " + std::to_string(rank_) + ", \"tid\": \"" + json_escaped(e.comm) +
              "\", \"ts\": " + std::to_string(e.start_us) + ", \"dur\": " + std::to_string(end - e.start_us) +
              ", \"args\": {\"seq\": " + std::to_string(e.sequence) + ", \"comm\": \"" + json_escaped(e.comm) +
              "\", \"bytes\": " + std::to_string(e.bytes) + ", \"dtype\": \"" +
              (e.dtype > 0 ? bpl_dtype_name(e.dtype) : "") + "\", \"path\": \"" + json_escaped(e.path) +
              "\", \"status\": \"" + (e.end_us >= 0 ? bpl_status_name(e.status) : "in flight") + "\"}}";
    }
  }
  json += "\n],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": {\"rank\": " + std::to_string(rank_) +
          ", \"world_size\": " + std::to_string(world_size_) + ", \"backend\": \"" + json_escaped(backend_) +
          "\", \"clock\": \"wall clock, microseconds since the epoch\"}}\n";
  const std::string path = dir_ + "/rank-" + std::to_string(rank_) + ".json";
  // A temporary of this write's own: two threads whose operations fail at once both write.
  static std::atomic<uint64_t> writes{0};
  const std::string temporary = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(writes++);
  bool written = false;
  if (FILE* file = std::fopen(temporary.c_str(), "w")) {
    written = std::fwrite(json.data(), 1, json.size(), file) == json.size();
    written = std::fclose(file) == 0 && written;
  }
  if (!written || std::rename(temporary.c_str(), path.c_str()) != 0) {
    log(BPL_LOG_WARN, "core", "BPL_TRACE: could not write " + path + ": " + std::strerror(errno));
    std::remove(temporary.c_str());
  }
}

}  // namespace backplane
