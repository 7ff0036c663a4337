# backplane's version, the one place it is written: CMakeLists.txt and pip's metadata (pyproject.toml)
# read it here. major.minor follow the C ABI's (BPL_ABI_MAJOR, BPL_ABI_MINOR; tests/core/abi checks both).
__version__ = "1.10.0"
