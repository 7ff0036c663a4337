"""Where this package's installed tree lies: the folder that holds lib/ (libbackplane.so, the plugins,
the CMake package and the pkg-config file), include/, bin/ and libexec/. pip installs it inside the
package (site-packages/backplane/), as torch keeps torch/lib; `cmake --install` around it (<prefix>, with
this package in <prefix>/lib/python3.X/site-packages/backplane/)."""

import importlib.util
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def prefix():
    """The tree's root, or None where this package is not installed (a build tree's python/ folder)."""
    for candidate in (_HERE, os.path.normpath(os.path.join(_HERE, "..", "..", "..", ".."))):
        if os.path.exists(os.path.join(candidate, "lib", "pkgconfig", "backplane.pc")):
            return candidate
    return None


def library_folder():
    """The folder of libbackplane.so beside this package: the installed tree's lib/, or a build tree's
    (<build>/python/backplane/ is a link into the sources, so the way up goes by the path's names)."""
    root = prefix()
    if root is not None:
        return os.path.join(root, "lib")
    build_lib = os.path.normpath(os.path.join(_HERE, "..", "..", "lib"))
    return build_lib if os.path.exists(os.path.join(build_lib, "libbackplane.so")) else None


def folders():
    """{name: folder} of what programs built against backplane use; empty where not installed."""
    root = prefix()
    if root is None:
        return {}
    lib = os.path.join(root, "lib")
    return {"prefix": root, "includedir": os.path.join(root, "include"), "libdir": lib,
            "cmakedir": os.path.join(lib, "cmake", "backplane"), "pkgconfigdir": os.path.join(lib, "pkgconfig"),
            "bindir": os.path.join(root, "bin")}


def helper_program(name):
    """A helper program of the tree's (bpl-store): in the installed tree's libexec/backplane/, in a build
    tree's bin/; None where this build has none."""
    root = prefix()
    lib = library_folder()
    folders = [os.path.join(root, "libexec", "backplane")] if root else []
    if lib is not None:
        folders.append(os.path.join(lib, os.pardir, "bin"))
    for folder in folders:
        path = os.path.normpath(os.path.join(folder, name))
        if os.access(path, os.X_OK):
            return path
    return None


def side_module(name):
    """A module of the plugins' folder (libbpl-torch-store.so), or None where this build has none."""
    lib = library_folder()
    path = os.path.join(lib, "backplane", "plugins", name) if lib else None
    return path if path and os.path.exists(path) else None


def environments_torch():
    """The torch this interpreter would import (its package folder), found without importing it, or None:
    where the modules that link LibTorch look for it (BPL_TORCH_DIR, docs/install.md)."""
    spec = importlib.util.find_spec("torch")
    return list(spec.submodule_search_locations)[0] if spec is not None and spec.submodule_search_locations else None
