"""python -m backplane [--prefix | --includedir | --libdir | --cmakedir | --pkgconfigdir | --version]

Where the installed backplane keeps what programs built against it use, as pybind11's `python -m
pybind11 --cmakedir` tells. A C program built against a pip install:

    cc embed.c $(PKG_CONFIG_PATH=$(python -m backplane --pkgconfigdir) pkg-config --cflags --libs backplane)

and a CMake project: cmake -DCMAKE_PREFIX_PATH=$(python -m backplane --prefix) ...
"""

import argparse
import sys

from . import _tree
from ._version import __version__


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m backplane", description=__doc__.split("\n\n")[1],
                                     allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"backplane {__version__}")
    group = parser.add_mutually_exclusive_group(required=True)
    for name in ("prefix", "includedir", "libdir", "cmakedir", "pkgconfigdir"):
        group.add_argument(f"--{name}", dest="folder", action="store_const", const=name)
    args = parser.parse_args(argv)
    folders = _tree.folders()
    if not folders:
        sys.exit(f"python -m backplane: this backplane ({_tree._HERE}) is not an installed one: install it with "
                 "pip or cmake --install")
    print(folders[args.folder])


if __name__ == "__main__":
    main()
