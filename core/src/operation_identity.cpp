#include "operation_identity.h"

namespace backplane {
namespace {

thread_local const bpl_operation_identity* running = nullptr;

}  // namespace

const bpl_operation_identity* current_operation() { return running; }

OperationScope::OperationScope(const Fingerprint& fingerprint) : identity_(identity_of(fingerprint)), outer_(running) {
  running = &identity_;
}

OperationScope::~OperationScope() { running = outer_; }

}  // namespace backplane
