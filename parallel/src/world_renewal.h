// How the frontend's groups go on after the world shrinks or grows (private to the library): the group
// objects keep their identity, so that layers and optimizers holding them follow.
#pragma once

#include "backplane/parallel/process_group.h"

namespace backplane::parallel::detail {

// The world group takes `fresh`'s communicator, its members renumbered 0 … size-1.
void renew_world(ProcessGroup& fresh);

// The tensor-, data- and pipeline-parallel groups made again over the current world with the same
// sizes (collective over the world); each group object takes its new communicator.
void rebuild_model_parallel();

}  // namespace backplane::parallel::detail
