"""Block files read whole straight into a host pool's blocks by the C kernels
(engine/ops/csrc/frame_read.c), off the GIL: engine/kv/pool_read.py's DirectReader. Each
reader thread hands its share of a session's files to one call; what their headers say is
checked after, in Python (engine/kv_files/block_reads.py).

None where the kernels are not built, or built without xxHash's header (libxxhash-dev):
the files are then read block by block in Python, as before (a float16 session ~1.4x
slower; bench.restore_readers)."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine.kv_files.kv_frame import HEAD_READ, PREFIX, FrameRead
from engine.ops import native

OK = 0  # wf_read_frames' status of a frame read whole (1: missing, unreadable or wrong)


class FrameReads:
    """wf_read_frames: files read whole into given addresses, their checksums taken."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        self._fn = lib.wf_read_frames
        self._fn.argtypes = [i64, p, p, ctypes.c_uint32, p, i64, p, p, i64, i64, p, p]
        self._fn.restype = None

    def read(
        self,
        paths: Sequence[Path],
        addresses: np.ndarray,
        piece_bytes: int,
        magic: bytes,
        version: int,
    ) -> list[FrameRead | None]:
        """Each file of `paths`, a frame of `magic` and `version`, read into its row of
        `addresses` (int64 [files, pieces], each piece `piece_bytes`): its prefix and
        header, payload size and checksum; None where it was missing or found wrong."""
        n, pieces = addresses.shape
        names = (ctypes.c_char_p * n)(*(str(path).encode() for path in paths))
        heads = np.empty((n, HEAD_READ), np.uint8)
        lengths, sums = np.zeros(n, np.int64), np.zeros(n, np.uint64)
        status = np.ones(n, np.int32)
        addresses = np.ascontiguousarray(addresses, np.int64)
        self._fn(
            n,
            ctypes.addressof(names),
            magic,
            version,
            heads.ctypes.data,
            HEAD_READ,
            lengths.ctypes.data,
            addresses.ctypes.data,
            pieces,
            piece_bytes,
            sums.ctypes.data,
            status.ctypes.data,
        )
        prefix, payload = PREFIX.size, pieces * piece_bytes
        return [
            FrameRead(heads[i, : prefix + lengths[i]].tobytes(), payload, f"{sums[i]:016x}")
            if status[i] == OK
            else None
            for i in range(n)
        ]


@functools.cache
def frame_reads() -> FrameReads | None:
    """The C reader, or None where this build has none."""
    lib = native.library()
    return FrameReads(lib) if lib is not None and lib.wf_frame_reader() else None
