#include "log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "environment.h"

namespace backplane {
namespace {

// Read once, when the first message may be printed; bpl_init refuses a bad value (log_level_setting),
// but a message may come before it, so here a bad value is said once and warn used.
int32_t read_log_level() {
  const char* text = std::getenv("BPL_LOG_LEVEL");
  if (text == nullptr || *text == '\0') return BPL_LOG_WARN;
  if (std::optional<int32_t> level = parse_log_level(text)) return *level;
  std::fprintf(stderr, "[backplane] WARN: BPL_LOG_LEVEL='%s' is not one of error, warn, info, debug, 0-3; using warn\n",
               text);
  return BPL_LOG_WARN;
}

}  // namespace

int32_t log_level() {
  static const int32_t level = read_log_level();
  return level;
}

namespace {

// Where lines go: stderr, or the embedder's callback (bpl_set_log_callback). Under one lock with the
// writing, so that a line never reaches a callback that was just replaced, and lines never interleave.
std::mutex log_mutex;
bpl_log_callback log_callback = nullptr;
void* log_user_data = nullptr;

}  // namespace

void log(int32_t level, const char* source, const std::string& message) {
  if (level > log_level()) return;
  static const char* const tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  const char* from = source != nullptr ? source : "core";
  std::lock_guard<std::mutex> lock(log_mutex);
  if (log_callback != nullptr) return log_callback(level, from, message.c_str(), log_user_data);
  std::fprintf(stderr, "[backplane:%s] %s: %s\n", from, tags[level < 0 ? 0 : level > 3 ? 3 : level], message.c_str());
}

void set_log_callback(bpl_log_callback callback, void* user_data) {
  std::lock_guard<std::mutex> lock(log_mutex);
  log_callback = callback;
  log_user_data = callback != nullptr ? user_data : nullptr;
}

}  // namespace backplane
