"""torch.distributed's backend "backplane": importing this package registers it (for the device "cpu").

    import torch.distributed as dist
    dist.init_process_group("backplane")   # plugin chosen by BPL_BACKEND, NXD_CPU_MODE, or auto

A pip-installed backplane registers the backend when torch is imported (torch's "torch.backends" entry
points), so the import is then optional. The C++ backend (the module _C) is built against one torch
version; under another this import raises ImportError naming both, and how to rebuild it.
"""

import os
import sys

import torch

from ._build import NOT_BUILT, TORCH_VERSION, VERSION

__version__ = VERSION


def _check_torch():
    if NOT_BUILT:
        raise ImportError(f"backplane_torch {VERSION} was installed without its torch backend: {NOT_BUILT}. Install "
                          "torch first, then backplane again (pip builds against the torch of the environment it "
                          "installs into)")
    running = torch.__version__.split("+")[0]
    if running != TORCH_VERSION:
        raise ImportError(
            f"backplane_torch {VERSION} was built for torch {TORCH_VERSION}, and this Python ({sys.executable}) has "
            f"torch {running} ({os.path.dirname(torch.__file__)}). Rebuild backplane against this torch: "
            "`pip install --force-reinstall --no-deps --no-cache-dir <backplane's source>` in this environment, "
            "or configure a CMake build with this Python (-DBPL_PYTHON=...) and build it again")


_check_torch()

from ._C import BackendBackplane, _time_c_abi_allreduce, _time_process_group_allreduce, create_backend, describe  # noqa: E402,F401
from backplane import _torch_registration  # noqa: E402

_torch_registration.register()
