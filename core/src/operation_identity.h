// The operation a thread is starting, as the core numbered and described it, handed to the plugin
// through bpl_host_api::current_operation for the duration of the plugin call that starts it.
#pragma once

#include "backplane/plugin.h"
#include "fingerprint.h"

namespace backplane {

// The calling thread's operation; NULL outside one.
const bpl_operation_identity* current_operation();

// Makes `fingerprint` the calling thread's operation while it lives (scopes nest: BPL_DEBUG=detail's
// check runs inside the operation it checks).
class OperationScope {
 public:
  explicit OperationScope(const Fingerprint& fingerprint);
  ~OperationScope();
  OperationScope(const OperationScope&) = delete;
  OperationScope& operator=(const OperationScope&) = delete;

 private:
  bpl_operation_identity identity_;
  const bpl_operation_identity* outer_;
};

}  // namespace backplane
