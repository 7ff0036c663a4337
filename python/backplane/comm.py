"""Communicators (Comm) and the requests of their operations started with async_op=True (Request)."""

import array
import ctypes
from typing import Any, List, Optional, Sequence, Tuple

from . import _abi
from ._abi import _COLOR_UNDEFINED, _ERR_TIMEOUT, _TIMEOUT_DEFAULT, BackplaneError, _api, _check, binds, operation
from ._buffers import BufferLike, _Buffer, _end_to_end, _extent, _int64_array, _of_send, _op
from .device_memory import _Handle

_P, _I32, _I64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64  # C arguments: pointers and handles, integers
_COUNTS = ctypes.POINTER(ctypes.c_int64)  # one count per rank


class Request:
    """An operation started with async_op=True. wait() or test() tell its end; the buffers it uses are
    referenced here until then. A request that is never waited for is released (bpl_request_free,
    which first lets the operation end, bounded by its communicator's timeout) when it is collected."""

    def __init__(self, handle: ctypes.c_void_p, keep: Tuple[Any, ...], what: str):
        self._handle = handle
        self._keep = keep
        self.what = what

    def test(self) -> bool:
        """True once the operation has ended (raising BackplaneError if it failed); never blocks."""
        if self._handle is None:
            return True
        done = ctypes.c_int32()
        status = _api().bpl_request_test(self._handle, ctypes.byref(done))
        if status != 0 or done.value:
            self._release(status)
        return done.value != 0

    def wait(self, timeout_ms: Optional[int] = None) -> None:
        """Waits for the end, at most timeout_ms (None: the communicator's timeout). A wait that runs out
        first raises BackplaneError BPL_ERR_TIMEOUT and leaves the operation in flight, to be waited for
        again; the operation's own failure (its timeout included) raises and ends the request."""
        if self._handle is None:
            return
        status = _api().bpl_request_wait(self._handle, _TIMEOUT_DEFAULT if timeout_ms is None else timeout_ms)
        if status == _ERR_TIMEOUT and timeout_ms is not None:
            message = (_api().bpl_last_error() or b"").decode("utf-8", "replace")
            done = ctypes.c_int32()
            tested = _api().bpl_request_test(self._handle, ctypes.byref(done))
            if tested == 0 and not done.value:
                raise BackplaneError(status, "%s has not ended within %d ms; it is still in flight and may be waited "
                                             "for again (%s)" % (self.what, timeout_ms, message))
            status = tested  # it ended meanwhile: its own result
        self._release(status)

    def _release(self, status: int) -> None:
        message = (_api().bpl_last_error() or b"").decode("utf-8", "replace") if status != 0 else ""
        handle, self._handle, self._keep = self._handle, None, ()
        _api().bpl_request_free(handle)
        if status != 0:
            raise BackplaneError(status, message)

    def __del__(self):
        if getattr(self, "_handle", None) is not None and _abi.loaded() is not None:
            _abi.loaded().bpl_request_free(self._handle)



class Comm(_Handle):
    """A communicator. The world belongs to its Runtime; one from split() is destroyed by destroy(), on
    leaving its `with` block, or with its Runtime when that closes first."""

    _what = "communicator"

    def __init__(self, handle: int, owned: bool, runtime: "Runtime"):
        self._handle = ctypes.c_void_p(handle)
        self._owned = owned
        self._runtime = runtime
        rank, size = ctypes.c_int32(), ctypes.c_int32()
        _check(_api().bpl_comm_rank(self._handle, ctypes.byref(rank)))
        _check(_api().bpl_comm_size(self._handle, ctypes.byref(size)))
        self.rank, self.size = rank.value, size.value

    # -- lifetime, timeouts, abort --

    def split(self, color: Optional[int], key: int = 0) -> Optional["Comm"]:
        """MPI_Comm_split: a Comm of the ranks passing the same color, ordered by key; None for color None."""
        out = ctypes.c_void_p()
        _check(_api().bpl_comm_split(self._live(), _COLOR_UNDEFINED if color is None else color, key, ctypes.byref(out)))
        if not out.value:
            return None
        return self._runtime._adopt(Comm(out.value, owned=True, runtime=self._runtime))

    def destroy(self) -> None:
        """Destroys a communicator from split (after its operations end); a no-op for the world and the
        second time."""
        if self._owned and self._handle is not None:
            handle, self._handle = self._handle, None
            _check(_api().bpl_comm_destroy(handle))

    def set_timeout(self, timeout_ms: int) -> None:
        """Bounds the operations started from now on (and is the default of Request.wait)."""
        _check(_api().bpl_comm_set_timeout(self._live(), timeout_ms))

    def get_timeout(self) -> int:
        timeout = ctypes.c_int64()
        _check(_api().bpl_comm_get_timeout(self._live(), ctypes.byref(timeout)))
        return timeout.value

    def abort(self) -> None:
        """Ends the communicator's use on this rank: later operations raise BPL_ERR_ABORTED at once, and
        a wait in another thread returns with it."""
        _check(_api().bpl_comm_abort(self._live()))

    # -- going on after a failure (ABI 1.8; ULFM's revoke, agree and shrink) --

    @binds("bpl_comm_revoke", [_P], since_minor=8)
    def revoke(self) -> None:
        """Revokes the communicator for every member: their operations on it, in flight and later, raise
        BPL_ERR_REVOKED naming this rank; agree() and shrink() still work on it."""
        _check(operation("bpl_comm_revoke")(self._live()))

    @binds("bpl_comm_agree", [_P, ctypes.POINTER(_I32), ctypes.POINTER(_I32), ctypes.POINTER(_I32)], since_minor=8)
    def agree(self, flags: int = ~0) -> Tuple[int, List[int]]:
        """The members alive agree: every one gets the same (AND of the members' flags, failed ranks)."""
        value, failed, count = _I32(flags), (_I32 * self.size)(), _I32()
        _check(operation("bpl_comm_agree")(self._live(), ctypes.byref(value), failed, ctypes.byref(count)))
        return value.value, list(failed[:count.value])

    @binds("bpl_comm_shrink", [_P, ctypes.POINTER(_I32), ctypes.POINTER(_I32), ctypes.POINTER(_P)], since_minor=8)
    def shrink(self) -> Tuple["Comm", List[int]]:
        """The survivors' communicator (destroyed as a split's is), and the ranks here that failed."""
        out, failed, count = _P(), (_I32 * self.size)(), _I32()
        _check(operation("bpl_comm_shrink")(self._live(), failed, ctypes.byref(count), ctypes.byref(out)))
        return self._runtime._adopt(Comm(out.value, owned=True, runtime=self._runtime)), list(failed[:count.value])

    @binds("bpl_comm_grow", [_P, _I32, ctypes.POINTER(_P)], since_minor=8)
    def grow(self, joiners: int) -> "Comm":
        """The members and `joiners` newcomers (Runtime.join in processes started with BPL_JOIN=1), the
        newcomers after the members (destroyed as a split's is)."""
        out = _P()
        _check(operation("bpl_comm_grow")(self._live(), joiners, ctypes.byref(out)))
        return self._runtime._adopt(Comm(out.value, owned=True, runtime=self._runtime))

    # -- collectives: blocking, or a Request with async_op=True --

    @binds("bpl_allreduce", [_P, _P, _P, _I64, _I32, _I32, _P])
    def allreduce(self, send: BufferLike, recv: Optional[BufferLike] = None, op: str = "sum",
                  dtype: Optional[str] = None, async_op: bool = False) -> Optional[Request]:
        """recv = op over ranks of send (in place when recv is None)."""
        s = _Buffer(send, dtype, recv is None, "send")
        r = s if recv is None else _of_send(s, recv, dtype, s.count, "as many as send")
        return self._start("allreduce", (s, r), lambda req: _api().bpl_allreduce(
            self._live(), s.address, r.address, s.count, s.dtype, _op(op), req), async_op)

    @binds("bpl_broadcast", [_P, _P, _I64, _I32, _I32, _P])
    def broadcast(self, buf: BufferLike, root: int = 0, dtype: Optional[str] = None,
                  async_op: bool = False) -> Optional[Request]:
        b = _Buffer(buf, dtype, True, "buf")
        return self._start("broadcast", (b,), lambda req: _api().bpl_broadcast(
            self._live(), b.address, b.count, b.dtype, root, req), async_op)

    @binds("bpl_reduce", [_P, _P, _P, _I64, _I32, _I32, _I32, _P])
    def reduce(self, send: BufferLike, recv: Optional[BufferLike] = None, root: int = 0, op: str = "sum",
               dtype: Optional[str] = None, async_op: bool = False) -> Optional[Request]:
        """recv on root = op over ranks of send (in place when recv is None); other ranks' recv unused."""
        s = _Buffer(send, dtype, recv is None, "send")
        r = s if recv is None else _of_send(s, recv, dtype, s.count if self.rank == root else None, "as many as send")
        return self._start("reduce", (s, r), lambda req: _api().bpl_reduce(
            self._live(), s.address, r.address, s.count, s.dtype, _op(op), root, req), async_op)

    @binds("bpl_allgather", [_P, _P, _P, _I64, _I32, _P])
    def allgather(self, send: BufferLike, recv: BufferLike, dtype: Optional[str] = None,
                  async_op: bool = False) -> Optional[Request]:
        """recv (size times send's elements) = every rank's send, in rank order."""
        s = _Buffer(send, dtype, False, "send")
        r = _of_send(s, recv, dtype, s.count * self.size, "size %d x %d" % (self.size, s.count))
        return self._start("allgather", (s, r), lambda req: _api().bpl_allgather(
            self._live(), s.address, r.address, s.count, s.dtype, req), async_op)

    @binds("bpl_reduce_scatter", [_P, _P, _P, _I64, _I32, _I32, _P])
    def reduce_scatter(self, send: BufferLike, recv: BufferLike, op: str = "sum", dtype: Optional[str] = None,
                       async_op: bool = False) -> Optional[Request]:
        """recv = block `rank` of the reduction of send (size blocks of recv's elements)."""
        s = _Buffer(send, dtype, False, "send")
        r = _of_send(s, recv, dtype, None, "")
        if s.count != r.count * self.size:
            raise ValueError("send holds %d elements: expected %d (size %d x %d)" % (s.count, r.count * self.size, self.size, r.count))
        return self._start("reduce_scatter", (s, r), lambda req: _api().bpl_reduce_scatter(
            self._live(), s.address, r.address, r.count, r.dtype, _op(op), req), async_op)

    @binds("bpl_alltoall", [_P, _P, _P, _I64, _I32, _P])
    def alltoall(self, send: BufferLike, recv: BufferLike, dtype: Optional[str] = None,
                 async_op: bool = False) -> Optional[Request]:
        """recv block r = send block `rank` of rank r (size equal blocks each)."""
        s = _Buffer(send, dtype, False, "send")
        r = _of_send(s, recv, dtype, None, "")
        if s.count != r.count or s.count % self.size:
            raise ValueError("send and recv must hold the same number of elements, a multiple of size %d" % self.size)
        return self._start("alltoall", (s, r), lambda req: _api().bpl_alltoall(
            self._live(), s.address, r.address, s.count // self.size, s.dtype, req), async_op)

    @binds("bpl_gather", [_P, _P, _P, _I64, _I32, _I32, _P], since_minor=3)
    def gather(self, send: BufferLike, recv: Optional[BufferLike] = None, root: int = 0, dtype: Optional[str] = None,
               async_op: bool = False) -> Optional[Request]:
        """recv on root (size times send's elements) = every rank's send, in rank order; recv is not
        given on the other ranks."""
        s = _Buffer(send, dtype, False, "send")
        r = _of_send(s, recv, dtype, None, "") if recv is not None else None
        if self.rank == root and (r is None or r.count != s.count * self.size):
            raise ValueError("the root's recv must hold %d elements (size %d x %d)" % (s.count * self.size, self.size, s.count))
        return self._start("gather", (s, r), lambda req: operation("bpl_gather")(
            self._live(), s.address, r.address if r else None, s.count, s.dtype, root, req), async_op)

    @binds("bpl_scatter", [_P, _P, _P, _I64, _I32, _I32, _P], since_minor=3)
    def scatter(self, send: Optional[BufferLike], recv: BufferLike, root: int = 0, dtype: Optional[str] = None,
                async_op: bool = False) -> Optional[Request]:
        """recv = block `rank` of send on root (size blocks of recv's elements); send is None elsewhere."""
        r = _Buffer(recv, dtype, True, "recv")
        s = _Buffer(send, dtype, False, "send") if send is not None else None
        if s is not None and s.dtype != r.dtype:
            raise ValueError("send holds %s elements and recv %s: both must hold one dtype" % (s.dtype_name, r.dtype_name))
        if self.rank == root and (s is None or s.count != r.count * self.size):
            raise ValueError("the root's send must hold %d elements (size %d x %d)" % (r.count * self.size, self.size, r.count))
        return self._start("scatter", (s, r), lambda req: operation("bpl_scatter")(
            self._live(), s.address if s else None, r.address, r.count, r.dtype, root, req), async_op)

    @binds("bpl_allgatherv", [_P, _P, _I64, _P, _COUNTS, _COUNTS, _I32, _P], since_minor=3)
    def allgatherv(self, send: BufferLike, recv: BufferLike, counts: Sequence[int],
                   displs: Optional[Sequence[int]] = None, dtype: Optional[str] = None,
                   async_op: bool = False) -> Optional[Request]:
        """Rank r's send (counts[r] elements) lands at recv + displs[r] on every rank (displs None: the
        blocks end to end in rank order)."""
        s = _Buffer(send, dtype, False, "send")
        r = _of_send(s, recv, dtype, None, "")
        c = _int64_array(counts, self.size, "counts")
        d = _int64_array(_end_to_end(counts) if displs is None else displs, self.size, "displs")
        _extent("recv", r, c, d)
        return self._start("allgatherv", (s, r), lambda req: operation("bpl_allgatherv")(
            self._live(), s.address, s.count, r.address, c, d, s.dtype, req), async_op)

    @binds("bpl_alltoallv", [_P, _P, _COUNTS, _COUNTS, _P, _COUNTS, _COUNTS, _I32, _P], since_minor=3)
    def alltoallv(self, send: BufferLike, sendcounts: Sequence[int], recv: BufferLike, recvcounts: Sequence[int],
                  sdispls: Optional[Sequence[int]] = None, rdispls: Optional[Sequence[int]] = None,
                  dtype: Optional[str] = None, async_op: bool = False) -> Optional[Request]:
        """This rank sends sendcounts[r] elements from send + sdispls[r] to rank r, and receives
        recvcounts[r] from rank r at recv + rdispls[r] (displacements None: blocks end to end)."""
        s = _Buffer(send, dtype, False, "send")
        r = _of_send(s, recv, dtype, None, "")
        arrays = [_int64_array(values, self.size, name) for values, name in (
            (sendcounts, "sendcounts"), (_end_to_end(sendcounts) if sdispls is None else sdispls, "sdispls"),
            (recvcounts, "recvcounts"), (_end_to_end(recvcounts) if rdispls is None else rdispls, "rdispls"))]
        _extent("send", s, arrays[0], arrays[1])
        _extent("recv", r, arrays[2], arrays[3])
        return self._start("alltoallv", (s, r), lambda req: operation("bpl_alltoallv")(
            self._live(), s.address, arrays[0], arrays[1], r.address, arrays[2], arrays[3], s.dtype, req), async_op)

    @binds("bpl_barrier", [_P, _P])
    def barrier(self, async_op: bool = False) -> Optional[Request]:
        return self._start("barrier", (), lambda req: _api().bpl_barrier(self._live(), req), async_op)

    # -- byte strings of any length (two collectives each: the lengths, then the bytes) --

    def broadcast_bytes(self, data: Optional[bytes], root: int = 0) -> bytes:
        """The root's bytes on every rank (`data` is ignored elsewhere and may be None)."""
        length = array.array("q", [len(data) if self.rank == root and data is not None else 0])
        self.broadcast(length, root)
        buf = bytearray(data if self.rank == root and data is not None else length[0])
        self.broadcast(buf, root, dtype="u8")
        return bytes(buf)

    def allgather_bytes(self, data: bytes) -> List[bytes]:
        """Every rank's bytes, in rank order."""
        lengths = array.array("q", [0] * self.size)
        self.allgather(array.array("q", [len(data)]), lengths)
        buf = bytearray(sum(lengths))
        self.allgatherv(bytearray(data), buf, list(lengths), dtype="u8")
        displs = _end_to_end(lengths)
        return [bytes(buf[d:d + n]) for d, n in zip(displs, lengths)]

    # -- point to point --

    @binds("bpl_send", [_P, _P, _I64, _I32, _I32, _I32, _P])
    def send(self, buf: BufferLike, peer: int, tag: int = 0, dtype: Optional[str] = None,
             async_op: bool = False) -> Optional[Request]:
        """Sends buf to rank `peer`, matched by a recv of the same tag (>= 0), in order. A blocking send
        may wait for the receiver: to exchange, start one side with async_op=True."""
        b = _Buffer(buf, dtype, False, "buf")
        return self._start("send", (b,), lambda req: _api().bpl_send(
            self._live(), b.address, b.count, b.dtype, peer, tag, req), async_op)

    @binds("bpl_recv", [_P, _P, _I64, _I32, _I32, _I32, _P])
    def recv(self, buf: BufferLike, peer: int, tag: int = 0, dtype: Optional[str] = None,
             async_op: bool = False) -> Optional[Request]:
        """Receives into buf from rank `peer` the send of the same tag; the sizes must agree."""
        b = _Buffer(buf, dtype, True, "buf")
        return self._start("recv", (b,), lambda req: _api().bpl_recv(
            self._live(), b.address, b.count, b.dtype, peer, tag, req), async_op)

    @binds("bpl_recv_any", [_P, _P, _I64, _I32, _I32, ctypes.POINTER(_I32), _P], since_minor=6)
    def recv_any(self, buf: BufferLike, tag: int = 0, dtype: Optional[str] = None) -> int:
        """Receives into buf the send of this tag from whichever rank sends first; returns that rank."""
        b = _Buffer(buf, dtype, True, "buf")
        source = ctypes.c_int32(-1)
        self._start("recv_any", (b,), lambda req: operation("bpl_recv_any")(
            self._live(), b.address, b.count, b.dtype, tag, ctypes.byref(source), req), False)
        return source.value

    # -- internals --

    @staticmethod
    def _start(what: str, keep: Tuple[Any, ...], call, async_op: bool) -> Optional[Request]:
        if not async_op:
            _check(call(None))
            return None
        handle = ctypes.c_void_p()
        _check(call(ctypes.byref(handle)))
        return Request(handle, keep, what)

