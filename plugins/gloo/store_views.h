// What the gloo plugin makes of the store its ranks met through (kv_store.h), besides the store Gloo's
// full mesh connects through (gloo_kv_store.h): the failure board, its keys under the job's prefix.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gloo_kv_store.h"
#include "kv_store.h"
#include "rendezvous.h"

namespace backplane::gloo_plugin {

// The failure board on a store connection whose every call gives up soon (the store's host may be the
// rank that failed), keys under `prefix` + "/". Nothing it does throws.
std::shared_ptr<FailureBoard> make_store_board(std::shared_ptr<KvStore> store, std::string prefix);

// A world of one: nobody to tell.
std::shared_ptr<FailureBoard> make_in_process_board();

}  // namespace backplane::gloo_plugin
