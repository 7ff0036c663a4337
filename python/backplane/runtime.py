"""The Runtime (a loaded backend, its world, device memory, kernels) and its compiled Programs."""

import ctypes
from typing import Any, Dict, List, Optional, Sequence

from ._abi import (_DEVICE_KINDS, _DTYPES, _MEMCPY_KIND, _CastArgs, _DeviceProperties, _ElementwiseArgs, _GemmArgs,
                   _InitOptions, _ProgramOptions, _RuntimeInfo, _Tensor, _api, _check, binds, operation)
from ._buffers import BufferLike, TensorLike, _Buffer, _tensor
from .comm import Comm
from .device_memory import DeviceMemory, _Handle


class Program(_Handle):
    """A compiled program (Runtime.compile, bpl_program_compile). Destroyed by destroy(), on leaving its
    `with` block, or, if still held, when its Runtime closes."""

    _what = "program"

    def __init__(self, runtime: "Runtime", handle: int):
        self._runtime = runtime
        self._handle = ctypes.c_void_p(handle)

    def run(self, inputs: Sequence[TensorLike], outputs: Sequence[TensorLike]) -> None:
        """Runs it on `inputs`, writing its results into `outputs`, whose dtypes and shapes must be what
        it returns (a tuple returns several)."""
        ins = [_tensor(spec, False, "inputs[%d]" % i) for i, spec in enumerate(inputs)]
        outs = [_tensor(spec, True, "outputs[%d]" % i) for i, spec in enumerate(outputs)]
        in_array = (_Tensor * max(len(ins), 1))(*[t for t, _ in ins])
        out_array = (_Tensor * max(len(outs), 1))(*[t for t, _ in outs])
        _check(_api().bpl_program_run(self._live(), in_array, len(ins), out_array, len(outs)))

    def destroy(self) -> None:
        """bpl_program_destroy; a no-op the second time."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            _check(_api().bpl_program_destroy(handle))


class Runtime:
    """A loaded backend (bpl_init); a context manager that closes on exit. Arguments left None come
    from the environment, as bpl_init's options."""

    def __init__(self, backend: Optional[str] = None, rank: Optional[int] = None, world_size: Optional[int] = None,
                 local_rank: Optional[int] = None, local_world_size: Optional[int] = None,
                 master_addr: Optional[str] = None, master_port: Optional[int] = None,
                 timeout_ms: Optional[int] = None):
        options = _InitOptions(ctypes.sizeof(_InitOptions), backend.encode() if backend else None,
                               -1 if rank is None else rank, -1 if world_size is None else world_size,
                               -1 if local_rank is None else local_rank,
                               -1 if local_world_size is None else local_world_size,
                               master_addr.encode() if master_addr else None,
                               -1 if master_port is None else master_port, -1 if timeout_ms is None else timeout_ms)
        handle = ctypes.c_void_p()
        _check(_api().bpl_init(ctypes.byref(options), ctypes.byref(handle)))
        self._handle = handle
        self._made: List[Any] = []  # splits, device memory and programs: close() destroys those left
        world = ctypes.c_void_p()
        _check(_api().bpl_comm_world(self._handle, ctypes.byref(world)))
        self.world = Comm(world.value, owned=False, runtime=self)

    @binds("bpl_comm_join", [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)], since_minor=8)
    def join(self) -> Comm:
        """In a process started with BPL_JOIN=1 to join a running job: waits until its members admit it
        (Comm.grow) and returns their communicator."""
        out = ctypes.c_void_p()
        _check(operation("bpl_comm_join")(self._live(), ctypes.byref(out)))
        return self._adopt(Comm(out.value, owned=True, runtime=self))

    def describe(self) -> Dict[str, Any]:
        """bpl_runtime_describe as a dict (strings decoded)."""
        info = _RuntimeInfo()
        info.struct_size = ctypes.sizeof(_RuntimeInfo)
        _check(_api().bpl_runtime_describe(self._live(), ctypes.byref(info)))
        result = {}
        for name, kind in _RuntimeInfo._fields_:
            if name == "struct_size":
                continue
            value = getattr(info, name)
            result[name] = value.decode("utf-8", "replace") if kind is ctypes.c_char_p and value is not None else value
        return result

    # -- devices (on CPU backends, one: the host) --

    def device_count(self) -> int:
        count = ctypes.c_int32()
        _check(_api().bpl_device_count(self._live(), ctypes.byref(count)))
        return count.value

    def device_properties(self, device: int = 0) -> Dict[str, Any]:
        """bpl_device_get_properties as a dict: name, kind ("host" or "accelerator"), index, total_memory
        and free_memory (bytes; 0 if unknown)."""
        props = _DeviceProperties()
        props.struct_size = ctypes.sizeof(_DeviceProperties)
        _check(_api().bpl_device_get_properties(self._live(), device, ctypes.byref(props)))
        return {"name": props.name.decode("utf-8", "replace"), "kind": _DEVICE_KINDS.get(props.kind, props.kind),
                "index": props.index, "total_memory": props.total_memory, "free_memory": props.free_memory}

    def malloc(self, nbytes: int, device: int = 0, dtype: Optional[str] = None) -> DeviceMemory:
        """`nbytes` of `device`'s memory (64-byte aligned), seen as elements of `dtype` where used."""
        if dtype is not None and dtype not in _DTYPES:
            raise ValueError("dtype=%r: expected one of %s" % (dtype, sorted(_DTYPES)))
        if nbytes < 0:
            raise ValueError("nbytes = %d: expected >= 0" % nbytes)
        address = ctypes.c_void_p()
        _check(_api().bpl_malloc(self._live(), device, nbytes, ctypes.byref(address)))
        return self._adopt(DeviceMemory(self, address.value or 0, nbytes, device, dtype))

    def memcpy(self, dst: BufferLike, src: BufferLike, nbytes: Optional[int] = None) -> None:
        """Copies `nbytes` (None: all of src) between a host buffer or DeviceMemory and another; the
        direction follows from which are device memory. Complete when it returns."""
        d = _Buffer(dst, "u8", True, "dst")
        s = _Buffer(src, "u8", False, "src")
        nbytes = s.nbytes if nbytes is None else nbytes
        if nbytes < 0 or nbytes > s.nbytes or nbytes > d.nbytes:
            raise ValueError("nbytes = %d: expected 0 to %d (src holds %d bytes, dst %d)" % (
                nbytes, min(s.nbytes, d.nbytes), s.nbytes, d.nbytes))
        kind = _MEMCPY_KIND[(isinstance(dst, DeviceMemory), isinstance(src, DeviceMemory))]
        _check(_api().bpl_memcpy(self._live(), d.address, s.address, nbytes, kind))

    def synchronize(self, device: int = 0) -> None:
        """Waits until the work queued on `device` has finished (kernels on accelerators)."""
        _check(_api().bpl_synchronize(self._live(), device))

    # -- kernels (buffers: host buffers on CPU backends, DeviceMemory anywhere) --

    def gemm(self, a: BufferLike, b: BufferLike, c: BufferLike, m: int, n: int, k: int, alpha: float = 1.0,
             beta: float = 0.0, trans_a: bool = False, trans_b: bool = False, lda: Optional[int] = None,
             ldb: Optional[int] = None, ldc: Optional[int] = None, dtype: Optional[str] = None,
             device: int = 0) -> None:
        """c = alpha * op(a) @ op(b) + beta * c, row-major: op(a) is m x k (a is k x m with trans_a), op(b)
        k x n, c m x n; leading dimensions default to the rows' lengths. f32, f64, f16, bf16."""
        A = _Buffer(a, dtype, False, "a")
        B = _Buffer(b, A.dtype_name, False, "b")
        C = _Buffer(c, A.dtype_name, True, "c")
        lda = (m if trans_a else k) if lda is None else lda
        ldb = (k if trans_b else n) if ldb is None else ldb
        ldc = n if ldc is None else ldc
        for name, buf, rows, cols, ld in (("a", A, k if trans_a else m, m if trans_a else k, lda),
                                          ("b", B, n if trans_b else k, k if trans_b else n, ldb),
                                          ("c", C, m, n, ldc)):
            needed = (rows - 1) * ld + cols if rows > 0 and cols > 0 else 0
            if buf.count < needed:
                raise ValueError("%s holds %d elements: a %d x %d matrix with leading dimension %d needs %d" % (
                    name, buf.count, rows, cols, ld, needed))
        args = _GemmArgs(ctypes.sizeof(_GemmArgs), device, A.dtype, int(trans_a), int(trans_b), m, n, k, alpha, beta,
                         A.address, lda, B.address, ldb, C.address, ldc)
        _check(_api().bpl_gemm(self._live(), ctypes.byref(args)))

    def add(self, x: BufferLike, y: BufferLike, out: Optional[BufferLike] = None, dtype: Optional[str] = None,
            device: int = 0) -> None:
        """out = x + y (out None: into x). Any dtype."""
        self._elementwise("bpl_add", x, y, out, 1.0, 1.0, dtype, device)

    def scale(self, x: BufferLike, alpha: float, out: Optional[BufferLike] = None, dtype: Optional[str] = None,
              device: int = 0) -> None:
        """out = alpha * x (out None: into x). Floating dtypes."""
        self._elementwise("bpl_scale", x, None, out, alpha, 1.0, dtype, device)

    def axpby(self, x: BufferLike, y: BufferLike, alpha: float, beta: float, out: Optional[BufferLike] = None,
              dtype: Optional[str] = None, device: int = 0) -> None:
        """out = alpha * x + beta * y (out None: into y). Floating dtypes."""
        self._elementwise("bpl_axpby", x, y, y if out is None else out, alpha, beta, dtype, device)

    def cast(self, src: BufferLike, dst: BufferLike, src_dtype: Optional[str] = None, dst_dtype: Optional[str] = None,
             device: int = 0) -> None:
        """dst = src converted to dst's dtype, rounding to nearest even (bf16 in 16-bit integers:
        dst_dtype="bf16")."""
        S = _Buffer(src, src_dtype, False, "src")
        D = _Buffer(dst, dst_dtype, True, "dst")
        if D.count != S.count:
            raise ValueError("dst holds %d elements: expected %d, as src" % (D.count, S.count))
        args = _CastArgs(ctypes.sizeof(_CastArgs), device, S.dtype, D.dtype, 0, S.count, S.address, D.address)
        _check(_api().bpl_cast(self._live(), ctypes.byref(args)))

    # -- programs --

    def compile(self, source: Any, format: str = "torchscript", flags: Optional[str] = None,
                entry: Optional[str] = None, device: int = 0) -> Program:
        """Compiles `source` (str or bytes; a format of describe()["program_formats"]) through the compile
        cache, for `entry` (None: "forward")."""
        data = source.encode() if isinstance(source, str) else bytes(source)
        options = _ProgramOptions(ctypes.sizeof(_ProgramOptions), format.encode(), flags.encode() if flags else None,
                                  entry.encode() if entry else None, device, 0)
        handle = ctypes.c_void_p()
        _check(_api().bpl_program_compile(self._live(), data, len(data), ctypes.byref(options), ctypes.byref(handle)))
        return self._adopt(Program(self, handle.value))

    def close(self) -> None:
        """Destroys the communicators split from it, the device memory and the programs it made that
        are still alive, then leaves the job (bpl_finalize). The second call is a no-op."""
        if self._handle is None:
            return
        made, self._made = self._made, []
        for thing in made:
            thing.destroy()
        handle, self._handle = self._handle, None
        self.world._handle = None
        _check(_api().bpl_finalize(handle))

    finalize = close

    def _live(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise ValueError("this Runtime was closed")
        return self._handle

    def _adopt(self, thing):
        """Keeps `thing` (a Comm, DeviceMemory or Program) for close(), forgetting those gone already."""
        self._made[:] = [t for t in self._made if t._handle is not None] + [thing]
        return thing

    def _elementwise(self, function: str, x, y, out, alpha: float, beta: float, dtype: Optional[str], device: int):
        X = _Buffer(x, dtype, out is None, "x")
        Y = _Buffer(y, X.dtype_name, False, "y") if y is not None else None
        O = X if out is None else _Buffer(out, X.dtype_name, True, "out")
        for name, buf in (("y", Y), ("out", O)):
            if buf is not None and buf.count != X.count:
                raise ValueError("%s holds %d elements: expected %d, as x" % (name, buf.count, X.count))
        args = _ElementwiseArgs(ctypes.sizeof(_ElementwiseArgs), device, X.dtype, X.count, alpha, beta, X.address,
                                Y.address if Y else None, O.address)
        _check(getattr(_api(), function)(self._live(), ctypes.byref(args)))

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False
