"""A real torchrun (Debian's torch.distributed.run, torch 1.13) with its one fault on Python 3.11 mended.

On 3.11, iterating an IntFlag no longer yields its zero member, so Std.from_str("0") (the default of
--redirects and --tee) finds no member and returns None, and starting the workers fails in to_map. This
wrapper gives Std.from_str the same meaning through Std(int(value)) and then runs torchrun unchanged:

    /usr/bin/python3 tests/support/torchrun.py --nproc_per_node 2 script.py
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api
from torch.distributed.run import main


def _from_str(vm):
    if re.fullmatch(r"[0-3]", vm):
        return api.Std(int(vm))
    if re.fullmatch(r"([0-9]+:[0-3],)*[0-9]+:[0-3]", vm):
        return {int(i): api.Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match: <0..3> or <local_rank:0..3>,...")


api.Std.from_str = staticmethod(_from_str)

if __name__ == "__main__":
    sys.exit(main())
