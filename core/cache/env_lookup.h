// How the core reads a variable of the environment: through an EnvLookup, so that tests can give any
// environment without touching the process's. Part of the compile cache's stated interface
// (compile_cache.h); the rest of the environment contract is the core's own (core/src/environment.h).
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace backplane {

// Returns the variable's value, or nullopt when unset. An empty value counts as unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The process environment. Path-like variables (plugin and cache paths, BPL_BACKEND, which may be a
// path) read through secure_getenv, so a setuid program never loads code a caller points it at.
EnvLookup process_environment();

}  // namespace backplane
