// The core's logger, also handed to plugins through bpl_host_api::log.
#pragma once

#include <cstdint>
#include <string>

#include "backplane/plugin.h"

namespace backplane {

// BPL_LOG_LEVEL: error|warn|info|debug or 0..3; default warn. Read once per process.
int32_t log_level();
void log(int32_t level, const char* source, const std::string& message);
// bpl_set_log_callback: lines to `callback` from now on; NULL: to stderr.
void set_log_callback(bpl_log_callback callback, void* user_data);

}  // namespace backplane
