#include "trace.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "environment.h"
#include "error.h"
#include "log.h"

namespace backplane {

namespace {

// The traces alive in this process. Never destroyed: the exit handler runs while static objects end.
struct LiveTraces {
  std::mutex mutex;
  std::set<Trace*> traces;
};
LiveTraces& live_traces() {
  static LiveTraces* live = new LiveTraces;
  return *live;
}

}  // namespace

void Trace::write_those_alive_at_exit() {
  LiveTraces& live = live_traces();
  std::lock_guard<std::mutex> lock(live.mutex);
  for (Trace* trace : live.traces) {
    if (trace->process_ == ::getpid()) trace->write();
  }
}

std::unique_ptr<Trace> Trace::from_environment(const EnvLookup& env, int32_t rank, int32_t world_size,
                                               const std::string& backend) {
  const std::optional<std::string> dir = env("BPL_TRACE");
  if (!dir) return nullptr;
  const int64_t events = env_integer(env, "BPL_TRACE_EVENTS", 1, int64_t{1} << 30).value_or(kDefaultEvents);
  std::error_code error;
  std::filesystem::create_directories(*dir, error);
  if (error) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "BPL_TRACE='" + *dir + "': cannot create the folder (" + error.message() + ")");
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
      process_(::getpid()),
      ring_(capacity) {
  static const bool registered = std::atexit(write_those_alive_at_exit) == 0;
  if (!registered) log(BPL_LOG_WARN, "core", "BPL_TRACE: cannot have the trace written at exit (atexit failed)");
  LiveTraces& live = live_traces();
  std::lock_guard<std::mutex> lock(live.mutex);
  live.traces.insert(this);
}

Trace::~Trace() {
  LiveTraces& live = live_traces();
  std::lock_guard<std::mutex> lock(live.mutex);
  live.traces.erase(this);
}

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
  // Chrome's trace event format (what chrome://tracing and Perfetto open), one file per rank.
  using Json = nlohmann::ordered_json;
  Json events = Json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t kept = std::min<uint64_t>(begun_, ring_.size());
    for (uint64_t ticket = begun_ - kept; ticket < begun_; ++ticket) {
      const Event& e = ring_[ticket % ring_.size()];
      const int64_t end = e.end_us >= 0 ? e.end_us : now_us();
      events.push_back({{"name", e.op},
                        {"cat", e.comm},
                        {"ph", "X"},
                        {"pid", rank_},
                        {"tid", e.comm},
                        {"ts", e.start_us},
                        {"dur", end - e.start_us},
                        {"args",
                         {{"seq", e.sequence},
                          {"comm", e.comm},
                          {"bytes", e.bytes},
                          {"dtype", e.dtype > 0 ? bpl_dtype_name(e.dtype) : ""},
                          {"path", e.path},
                          {"status", e.end_us >= 0 ? bpl_status_name(e.status) : "in flight"}}}});
    }
  }
  const Json trace = {{"traceEvents", std::move(events)},
                      {"displayTimeUnit", "ms"},
                      {"otherData",
                       {{"rank", rank_},
                        {"world_size", world_size_},
                        {"backend", backend_},
                        {"clock", "wall clock, microseconds since the epoch"}}}};
  // A communicator's name is the caller's text: bytes that are not UTF-8 are written replaced.
  const std::string json = trace.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
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
