"""backplane's log lines (the core's and its plugins'), to a Python callable instead of stderr (ABI 1.7)."""

import ctypes
from typing import Callable, Optional

from ._abi import binds, operation

_LEVELS = {0: "error", 1: "warn", 2: "info", 3: "debug"}
_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p)
_installed = None  # the C callback now installed: kept alive while the library may call it


@binds("bpl_set_log_callback", [_CALLBACK, ctypes.c_void_p], since_minor=7)
def set_log_callback(callback: Optional[Callable[[str, str, str], None]]) -> None:
    """From now on, for the whole process, each log line that BPL_LOG_LEVEL lets through is
    callback(level, source, message), level one of "error", "warn", "info", "debug" and source the part
    that wrote it ("core", "gloo", ...); None sends the lines to stderr again. The callback runs on
    whichever thread of backplane writes the line and must not call backplane; what it raises is lost."""
    global _installed
    if callback is None:
        operation("bpl_set_log_callback")(_CALLBACK(), None)
        _installed = None
        return

    def deliver(level, source, message, _user_data):
        try:
            callback(_LEVELS.get(level, str(level)), source.decode("utf-8", "replace"),
                     message.decode("utf-8", "replace"))
        except Exception:  # an exception cannot cross the C boundary
            pass

    installed = _CALLBACK(deliver)
    operation("bpl_set_log_callback")(installed, None)
    _installed = installed
