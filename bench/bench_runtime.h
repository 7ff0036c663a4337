// What every benchmark binary here starts from: the gloo backend as a world of one rank, so that the
// figures measure the ABI and the kernels, not a network.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "backplane/backplane.h"

namespace backplane::bench {

// Starts the runtime or ends the process with the reason.
inline bpl_runtime* start_world_of_one() {
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.backend = "gloo";
  options.rank = 0;
  options.world_size = 1;
  bpl_runtime* runtime = nullptr;
  if (bpl_init(&options, &runtime) != BPL_OK) {
    std::fprintf(stderr, "bpl_init: %s\n", bpl_last_error());
    std::exit(1);
  }
  return runtime;
}

}  // namespace backplane::bench
