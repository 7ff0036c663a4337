"""The C ABI (backplane.h, ABI 1.x) as ctypes sees it: the values and layouts, which are fixed, every
function's signature, the library's loading, and its errors as BackplaneError."""

import ctypes
import ctypes.util
import os

from . import _tree
from ._integers import CheckedStructure, calling, checked

_STATUS_NAMES = {
    0: "BPL_OK", 1: "BPL_ERR_INVALID_ARGUMENT", 2: "BPL_ERR_NOT_FOUND", 3: "BPL_ERR_UNSUPPORTED",
    4: "BPL_ERR_UNAVAILABLE", 5: "BPL_ERR_ABI_MISMATCH", 6: "BPL_ERR_TIMEOUT", 7: "BPL_ERR_REMOTE",
    8: "BPL_ERR_MISMATCH", 9: "BPL_ERR_OUT_OF_MEMORY", 10: "BPL_ERR_IO", 11: "BPL_ERR_INTERNAL",
    12: "BPL_ERR_ABORTED",
    13: "BPL_ERR_REVOKED",
}
_DTYPES = {"f32": 1, "f64": 2, "f16": 3, "bf16": 4, "i8": 5, "u8": 6, "i32": 7, "i64": 8}
_SIZES = {1: 4, 2: 8, 3: 2, 4: 2, 5: 1, 6: 1, 7: 4, 8: 8}
_DTYPE_NAMES = {code: name for name, code in _DTYPES.items()}
_OPS = {"sum": 1, "prod": 2, "min": 3, "max": 4, "avg": 5, "band": 6, "bor": 7, "bxor": 8}  # bitwise: ABI 1.9
_COLOR_UNDEFINED = -1
_TIMEOUT_DEFAULT = -1
_ERR_TIMEOUT = 6


class _InitOptions(CheckedStructure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("backend", ctypes.c_char_p), ("rank", ctypes.c_int32),
                ("world_size", ctypes.c_int32), ("local_rank", ctypes.c_int32),
                ("local_world_size", ctypes.c_int32), ("master_addr", ctypes.c_char_p),
                ("master_port", ctypes.c_int32), ("timeout_ms", ctypes.c_int64)]


class _RuntimeInfo(CheckedStructure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("backend", ctypes.c_char_p), ("plugin_path", ctypes.c_char_p),
                ("plugin_version", ctypes.c_char_p), ("selection_reason", ctypes.c_char_p),
                ("launcher", ctypes.c_char_p), ("details", ctypes.c_char_p), ("plugin_abi_major", ctypes.c_int32),
                ("plugin_abi_minor", ctypes.c_int32), ("rank", ctypes.c_int32), ("world_size", ctypes.c_int32),
                ("local_rank", ctypes.c_int32), ("local_world_size", ctypes.c_int32),
                ("device_count", ctypes.c_int32), ("dtypes", ctypes.c_uint32), ("collectives", ctypes.c_uint64),
                ("reduce_ops", ctypes.c_uint32), ("kernels", ctypes.c_uint32), ("timeout_ms", ctypes.c_int64),
                ("program_formats", ctypes.c_char_p)]


class _DeviceProperties(CheckedStructure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("name", ctypes.c_char * 64), ("kind", ctypes.c_int32),
                ("index", ctypes.c_int32), ("total_memory", ctypes.c_uint64), ("free_memory", ctypes.c_uint64)]


class _GemmArgs(CheckedStructure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("device", ctypes.c_int32), ("dtype", ctypes.c_int32),
                ("trans_a", ctypes.c_int32), ("trans_b", ctypes.c_int32), ("m", ctypes.c_int64),
                ("n", ctypes.c_int64), ("k", ctypes.c_int64), ("alpha", ctypes.c_double), ("beta", ctypes.c_double),
                ("a", ctypes.c_void_p), ("lda", ctypes.c_int64), ("b", ctypes.c_void_p), ("ldb", ctypes.c_int64),
                ("c", ctypes.c_void_p), ("ldc", ctypes.c_int64)]


class _ElementwiseArgs(CheckedStructure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("device", ctypes.c_int32), ("dtype", ctypes.c_int32),
                ("count", ctypes.c_int64), ("alpha", ctypes.c_double), ("beta", ctypes.c_double),
                ("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("out", ctypes.c_void_p)]


class _CastArgs(CheckedStructure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("device", ctypes.c_int32), ("from_dtype", ctypes.c_int32),
                ("to_dtype", ctypes.c_int32), ("reserved0", ctypes.c_int32), ("count", ctypes.c_int64),
                ("src", ctypes.c_void_p), ("dst", ctypes.c_void_p)]


class _ProgramOptions(CheckedStructure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("format", ctypes.c_char_p), ("flags", ctypes.c_char_p),
                ("entry", ctypes.c_char_p), ("device", ctypes.c_int32), ("reserved0", ctypes.c_int32)]


_MAX_DIMS = 8


class _Tensor(CheckedStructure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("data", ctypes.c_void_p), ("dtype", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("shape", ctypes.c_int64 * _MAX_DIMS)]


_DEVICE_KINDS = {1: "host", 2: "accelerator"}
_MEMCPY_KIND = {(False, False): 1, (True, False): 2, (False, True): 3, (True, True): 4}  # (to device, from device)


def _find_library():
    """BPL_LIBRARY, else libbackplane.so where this package lies (_tree.library_folder: inside it for a
    pip install, an installed tree's lib/, a build tree's lib/), else the loader's search path."""
    explicit = os.environ.get("BPL_LIBRARY")
    if explicit:
        return explicit
    folder = _tree.library_folder()
    if folder is not None and os.path.exists(os.path.join(folder, "libbackplane.so")):
        return os.path.join(folder, "libbackplane.so")
    return ctypes.util.find_library("backplane") or "libbackplane.so.1"


_P = ctypes.c_void_p  # any pointer or handle
# Every function this module calls: (argument types, result type).
SIGNATURES = {
    "bpl_last_error": ([], ctypes.c_char_p),
    "bpl_collective_name": ([ctypes.c_int32], ctypes.c_char_p),
    "bpl_abi_version": ([ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32)], None),
    "bpl_init": ([ctypes.POINTER(_InitOptions), ctypes.POINTER(_P)], ctypes.c_int32),
    "bpl_finalize": ([_P], ctypes.c_int32),
    "bpl_runtime_describe": ([_P, ctypes.POINTER(_RuntimeInfo)], ctypes.c_int32),
    "bpl_comm_world": ([_P, ctypes.POINTER(_P)], ctypes.c_int32),
    "bpl_comm_split": ([_P, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(_P)], ctypes.c_int32),
    "bpl_comm_destroy": ([_P], ctypes.c_int32),
    "bpl_comm_rank": ([_P, ctypes.POINTER(ctypes.c_int32)], ctypes.c_int32),
    "bpl_comm_size": ([_P, ctypes.POINTER(ctypes.c_int32)], ctypes.c_int32),
    "bpl_comm_set_timeout": ([_P, ctypes.c_int64], ctypes.c_int32),
    "bpl_comm_abort": ([_P], ctypes.c_int32),
    "bpl_comm_get_timeout": ([_P, ctypes.POINTER(ctypes.c_int64)], ctypes.c_int32),
    "bpl_request_test": ([_P, ctypes.POINTER(ctypes.c_int32)], ctypes.c_int32),
    "bpl_request_wait": ([_P, ctypes.c_int64], ctypes.c_int32),
    "bpl_request_free": ([_P], ctypes.c_int32),
    "bpl_device_count": ([_P, ctypes.POINTER(ctypes.c_int32)], ctypes.c_int32),
    "bpl_device_get_properties": ([_P, ctypes.c_int32, ctypes.POINTER(_DeviceProperties)], ctypes.c_int32),
    "bpl_malloc": ([_P, ctypes.c_int32, ctypes.c_size_t, ctypes.POINTER(_P)], ctypes.c_int32),
    "bpl_free": ([_P, _P], ctypes.c_int32),
    "bpl_memcpy": ([_P, _P, _P, ctypes.c_size_t, ctypes.c_int32], ctypes.c_int32),
    "bpl_synchronize": ([_P, ctypes.c_int32], ctypes.c_int32),
    "bpl_gemm": ([_P, ctypes.POINTER(_GemmArgs)], ctypes.c_int32),
    "bpl_add": ([_P, ctypes.POINTER(_ElementwiseArgs)], ctypes.c_int32),
    "bpl_scale": ([_P, ctypes.POINTER(_ElementwiseArgs)], ctypes.c_int32),
    "bpl_axpby": ([_P, ctypes.POINTER(_ElementwiseArgs)], ctypes.c_int32),
    "bpl_cast": ([_P, ctypes.POINTER(_CastArgs)], ctypes.c_int32),
    "bpl_program_compile": ([_P, _P, ctypes.c_size_t, ctypes.POINTER(_ProgramOptions), ctypes.POINTER(_P)],
                            ctypes.c_int32),
    "bpl_program_run": ([_P, ctypes.POINTER(_Tensor), ctypes.c_int32, ctypes.POINTER(_Tensor), ctypes.c_int32],
                        ctypes.c_int32),
    "bpl_program_destroy": ([_P], ctypes.c_int32),
}
# The operations' functions, each declared beside the Comm method that calls it (binds): the minor
# version that added it, and its argument types (each returns a bpl_status).
_OPERATIONS = {}


def binds(name, argtypes, since_minor=0):
    """Declares that the decorated method calls the C function `name`, added in ABI 1.since_minor."""
    _OPERATIONS[name] = (since_minor, argtypes)
    return lambda method: method


def operation(name):
    """The C function `name` (declared with binds), or BackplaneError BPL_ERR_UNSUPPORTED naming the ABI
    version it needs when the loaded library is older."""
    if not hasattr(_api(), name):
        raise BackplaneError(3, "%s needs libbackplane ABI 1.%d; the loaded library is %d.%d"
                             % ((name, _OPERATIONS[name][0]) + abi_version()))
    return getattr(_api(), name)


def _point_at_this_environments_torch():
    """The modules that link LibTorch (the CPU kernels) find it through BPL_TORCH_DIR, among others
    (docs/install.md): from Python, the torch this interpreter would import, found without importing it."""
    torch = _tree.environments_torch() if not os.environ.get("BPL_TORCH_DIR") else None
    if torch is not None:
        os.environ["BPL_TORCH_DIR"] = torch


def _load():
    _point_at_this_environments_torch()
    path = _find_library()
    try:
        lib = ctypes.CDLL(path)
    except OSError as error:
        raise OSError("backplane: cannot load libbackplane (%s). Set BPL_LIBRARY to the library's path (such as "
                      "build/lib/libbackplane.so), or import this package from an installed tree or a build's "
                      "python/ folder, where it finds the library itself" % error) from None
    signatures = dict(SIGNATURES)
    for name, (since_minor, argtypes) in _OPERATIONS.items():
        if since_minor == 0 or hasattr(lib, name):  # a newer operation is absent from an older library
            signatures[name] = (argtypes, ctypes.c_int32)
    for name, (argtypes, restype) in signatures.items():
        function = getattr(lib, name)
        function.argtypes = [checked(argtype) for argtype in argtypes]
        function.restype = restype
        setattr(lib, name, calling(name, function))
    return lib


_lib = None


def _api():
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib


class BackplaneError(Exception):
    """A bpl_status other than BPL_OK: .status (int), .status_name, .message (bpl_last_error())."""

    def __init__(self, status, message):
        self.status = status
        self.status_name = _STATUS_NAMES.get(status, "BPL_ERR_UNKNOWN")
        self.message = message
        super().__init__("%s: %s" % (self.status_name, message))


def _check(status):
    if status != 0:
        raise BackplaneError(status, (_api().bpl_last_error() or b"").decode("utf-8", "replace"))


def abi_version():
    """(major, minor) of the loaded libbackplane."""
    major, minor = ctypes.c_int32(), ctypes.c_int32()
    _api().bpl_abi_version(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value



def loaded():
    """The library, if it was loaded (for finalizers, which must not load it)."""
    return _lib
