// Names and sizes of the ABI's enumerations.
#include "backplane/backplane.h"

extern "C" {

const char* bpl_status_name(bpl_status status) {
  switch (status) {
    case BPL_OK: return "BPL_OK";
    case BPL_ERR_INVALID_ARGUMENT: return "BPL_ERR_INVALID_ARGUMENT";
    case BPL_ERR_NOT_FOUND: return "BPL_ERR_NOT_FOUND";
    case BPL_ERR_UNSUPPORTED: return "BPL_ERR_UNSUPPORTED";
    case BPL_ERR_UNAVAILABLE: return "BPL_ERR_UNAVAILABLE";
    case BPL_ERR_ABI_MISMATCH: return "BPL_ERR_ABI_MISMATCH";
    case BPL_ERR_TIMEOUT: return "BPL_ERR_TIMEOUT";
    case BPL_ERR_REMOTE: return "BPL_ERR_REMOTE";
    case BPL_ERR_MISMATCH: return "BPL_ERR_MISMATCH";
    case BPL_ERR_OUT_OF_MEMORY: return "BPL_ERR_OUT_OF_MEMORY";
    case BPL_ERR_IO: return "BPL_ERR_IO";
    case BPL_ERR_INTERNAL: return "BPL_ERR_INTERNAL";
    case BPL_ERR_ABORTED: return "BPL_ERR_ABORTED";
    case BPL_ERR_REVOKED: return "BPL_ERR_REVOKED";
    default: return "BPL_ERR_UNKNOWN";
  }
}

void bpl_abi_version(int32_t* major, int32_t* minor) {
  if (major != nullptr) *major = BPL_ABI_MAJOR;
  if (minor != nullptr) *minor = BPL_ABI_MINOR;
}

size_t bpl_dtype_size(bpl_dtype dtype) {
  switch (dtype) {
    case BPL_DTYPE_F64: case BPL_DTYPE_I64: return 8;
    case BPL_DTYPE_F32: case BPL_DTYPE_I32: return 4;
    case BPL_DTYPE_F16: case BPL_DTYPE_BF16: return 2;
    case BPL_DTYPE_I8: case BPL_DTYPE_U8: return 1;
    default: return 0;
  }
}

const char* bpl_dtype_name(bpl_dtype dtype) {
  switch (dtype) {
    case BPL_DTYPE_F32: return "f32";
    case BPL_DTYPE_F64: return "f64";
    case BPL_DTYPE_F16: return "f16";
    case BPL_DTYPE_BF16: return "bf16";
    case BPL_DTYPE_I8: return "i8";
    case BPL_DTYPE_U8: return "u8";
    case BPL_DTYPE_I32: return "i32";
    case BPL_DTYPE_I64: return "i64";
    default: return "unknown";
  }
}

const char* bpl_reduce_op_name(bpl_reduce_op op) {
  switch (op) {
    case BPL_OP_SUM: return "sum";
    case BPL_OP_PROD: return "prod";
    case BPL_OP_MIN: return "min";
    case BPL_OP_MAX: return "max";
    case BPL_OP_AVG: return "avg";
    case BPL_OP_BAND: return "band";
    case BPL_OP_BOR: return "bor";
    case BPL_OP_BXOR: return "bxor";
    default: return "unknown";
  }
}

const char* bpl_collective_name(bpl_collective op) {
#define BPL_NAME_OF(code, name, minor) \
  case code: return name;
  switch (op) {
    BPL_FOR_EACH_COLLECTIVE(BPL_NAME_OF)
    default: return "unknown";
  }
#undef BPL_NAME_OF
}

}  // extern "C"
