"""Binary framing shared by parent and child: JSON metadata plus raw array buffers.

Layout of one frame:

    MAGIC (8 bytes) | header length (uint32 LE) | header JSON (utf-8) | pad | buffers

The header is `{"meta": <json>, "arrays": [{"dtype", "shape", "offset", "nbytes"}]}`;
inside `meta` an array appears as `{"__array__": index}`. Buffers start on
64-byte boundaries so decode can hand out `np.frombuffer` views without copying.
No base64, no pickle, no lossy image codec. Stdlib + numpy only: every scorer env
imports this module through the import root the parent gives it. numpy is imported only where
an array is met: a child that scores text (math_verify) answers its float64 scores as stdlib
`array("d")` buffers and never imports it (0.12 CPU-s and 20 MiB of its start).
"""

from __future__ import annotations

import json
import math
import struct
import sys
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scorers.base import numpy_if_imported

if TYPE_CHECKING:
    import numpy as np

    Buffer = np.ndarray | array  # an array on the wire: numpy's, or stdlib float64s (typecode "d")

MAGIC = b"MSWIRE1\x00"
CONTENT_TYPE = "application/x-managed-scorers-frame"
ALIGN = 64
_LEN = struct.Struct("<I")
_PREFIX = len(MAGIC) + _LEN.size
ARRAY_KEY = "__array__"
ALLOWED_DTYPES = frozenset(
    ["|b1", "|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8"]
)
MAX_HEADER_BYTES = 64 * 1024 * 1024
MAX_NDIM = 8
MAX_DIM = 2**62  # well inside intp; larger dims cannot name a real buffer
# The error kind a child answers when a per-call wake or sleep of its scorer failed (a lifecycle
# failure: the parent never treats it as an optional term's loss).
RESIDENCY_FAILED = "residency_failed"
# The kinds a child answers when its scorer is wedged (scorers.base.ScorerWedged: a call left work
# running past its deadline on a thread it cannot stop): its managed parent kills it and restarts it
# under the restart policy. WEDGED: this call timed out; WEDGED_QUEUED: this call never started.
WEDGED = "wedged"
WEDGED_QUEUED = "wedged_queued"
RESTART_KINDS = (WEDGED, WEDGED_QUEUED)
# A served scorer's failure that is its server's, not the request's (scorers.base.ServerFault): a
# 503 another server of the same identity may not have.
SERVER_FAULT = "server_fault"
# A model's close() raised, but it was released (scorers.base.CloseFailed): offloaded all the same.
CLOSE_FAILED = "close_failed"


class WireError(ValueError):
    """A frame is malformed; the message names what is wrong and where."""


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _lift_arrays(obj: Any, arrays: list[Buffer], ndarray: Any) -> Any:
    """Replace every array in `obj` by a reference, collecting the arrays (`ndarray`: numpy's type,
    None where numpy was never imported, so that no object can be one)."""
    if ndarray is not None and isinstance(obj, ndarray):
        import numpy as np

        arr = obj if obj.dtype.byteorder != ">" else obj.astype(obj.dtype.newbyteorder("<"))
        if arr.dtype.str not in ALLOWED_DTYPES:
            raise WireError(f"array dtype {arr.dtype} is not supported on the wire")
        arrays.append(np.ascontiguousarray(arr).reshape(arr.shape))
        return {ARRAY_KEY: len(arrays) - 1}
    if isinstance(obj, array):
        if obj.typecode != "d":
            raise WireError(
                f"a stdlib array travels as float64 (typecode 'd'), got {obj.typecode!r}"
            )
        if sys.byteorder == "big":
            obj = array("d", obj)
            obj.byteswap()
        arrays.append(obj)
        return {ARRAY_KEY: len(arrays) - 1}
    if isinstance(obj, dict):
        if ARRAY_KEY in obj:
            raise WireError(f"key {ARRAY_KEY!r} is reserved")
        return {str(k): _lift_arrays(v, arrays, ndarray) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_lift_arrays(v, arrays, ndarray) for v in obj]
    return obj


def _described(arr: Buffer) -> tuple[str, list[int], int]:
    """dtype, shape and size in bytes of an array on the wire."""
    if isinstance(arr, array):
        return "<f8", [len(arr)], len(arr) * arr.itemsize
    return arr.dtype.str, list(arr.shape), arr.nbytes


def _raw_bytes(arr: Buffer) -> memoryview:
    if isinstance(arr, array):
        return memoryview(arr).cast("B")
    import numpy as np

    return arr.reshape(-1).view(np.uint8).data


class Frame:
    """A request or answer with its arrays lifted out, ready to go in-band or through shared memory.

    `prepare` does all validation (dtype, reserved keys), so a caller can refuse bad input
    before it picks a transport; nothing is copied until a body is built.
    """

    def __init__(self, lifted: Any, arrays: list[Buffer]) -> None:
        self.lifted = lifted
        self.arrays = arrays
        self.descs: list[dict[str, Any]] = []
        offset = 0
        for arr in arrays:
            dtype, shape, nbytes = _described(arr)
            self.descs.append({"dtype": dtype, "shape": shape, "offset": offset, "nbytes": nbytes})
            offset = aligned(offset + nbytes)
        self.array_bytes = offset  # the aligned span the buffers occupy, in-band or in a segment
        self._in_band_header: bytes | None = None

    def _header(self) -> bytes:
        if self._in_band_header is None:
            self._in_band_header = json.dumps(
                {"meta": self.lifted, "arrays": self.descs}, allow_nan=False, separators=(",", ":")
            ).encode()
        return self._in_band_header

    def body_parts(self) -> list[bytes | memoryview]:
        """The in-band frame as buffers for a scatter-gather send (no copy of the arrays)."""
        header = self._header()
        head_len = _PREFIX + len(header)
        parts: list[bytes | memoryview] = [
            MAGIC,
            _LEN.pack(len(header)),
            header,
            bytes(aligned(head_len) - head_len),
        ]
        for arr, desc in zip(self.arrays, self.descs, strict=True):
            parts.append(_raw_bytes(arr))
            parts.append(bytes(aligned(desc["nbytes"]) - desc["nbytes"]))
        return parts

    def body_size(self) -> int:
        return aligned(_PREFIX + len(self._header())) + self.array_bytes

    def shared_body(self, place: Callable[[np.ndarray], int]) -> bytes:
        """The body is the header alone: `place(arr)` puts each array in the shared segment
        (or finds it already there) and returns its offset."""
        import numpy as np

        descs = [
            {
                **desc,
                "offset": place(
                    arr if not isinstance(arr, array) else np.frombuffer(arr, dtype="<f8")
                ),
            }
            for arr, desc in zip(self.arrays, self.descs, strict=True)
        ]
        header = json.dumps(
            {"meta": self.lifted, "arrays": descs, "shared": True},
            allow_nan=False,
            separators=(",", ":"),
        ).encode()
        return MAGIC + _LEN.pack(len(header)) + header


def prepare(meta: Any) -> Frame:
    """Lift every array out of `meta` (JSON-able otherwise); raises WireError on what cannot
    travel."""
    arrays: list[Buffer] = []
    numpy = numpy_if_imported()
    return Frame(_lift_arrays(meta, arrays, None if numpy is None else numpy.ndarray), arrays)


def encode(meta: Any) -> bytes:
    """Serialise `meta` into one in-band frame."""
    return b"".join(prepare(meta).body_parts())  # one allocation, one copy of each buffer


def _reject_constant(name: str) -> Any:
    raise WireError(f"non-finite number {name} in frame header")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise WireError(f"number {text[:40]} in frame header overflows a float")
    return value


def _parse_header(buf: memoryview) -> tuple[dict, int]:
    if len(buf) < _PREFIX or bytes(buf[: len(MAGIC)]) != MAGIC:
        raise WireError("body is not a managed-scorers frame (bad magic)")
    (header_len,) = _LEN.unpack_from(buf, len(MAGIC))
    if header_len > MAX_HEADER_BYTES or _PREFIX + header_len > len(buf):
        raise WireError(f"header length {header_len} exceeds the body ({len(buf)} bytes)")
    try:
        header = json.loads(
            bytes(buf[_PREFIX : _PREFIX + header_len]),
            parse_constant=_reject_constant,
            parse_float=_finite_float,
        )
    except WireError:
        raise
    # JSONDecodeError, UnicodeDecodeError, an int past sys.get_int_max_str_digits()
    except ValueError as exc:
        raise WireError(f"header is not valid JSON: {exc}") from exc
    if (
        not isinstance(header, dict)
        or set(header) - {"shared"} != {"meta", "arrays"}
        or not isinstance(header["arrays"], list)
        or header.get("shared", True) is not True
    ):
        raise WireError(
            "header must be an object with 'meta', 'arrays' (a list) and optionally 'shared': true"
        )
    return header, _PREFIX + header_len


def _check_desc(index: int, desc: Any) -> tuple[str, list[int], int, int]:
    where = f"arrays[{index}]"
    if not isinstance(desc, dict) or set(desc) != {"dtype", "shape", "offset", "nbytes"}:
        raise WireError(f"{where} must have exactly dtype, shape, offset, nbytes")
    dtype, shape, offset, nbytes = desc["dtype"], desc["shape"], desc["offset"], desc["nbytes"]
    if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:
        raise WireError(f"{where}.dtype {dtype!r} is not one of {sorted(ALLOWED_DTYPES)}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_NDIM
        or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIM for d in shape
        )
    ):
        raise WireError(f"{where}.shape must be a list of at most {MAX_NDIM} non-negative ints")
    for name, value in (("offset", offset), ("nbytes", nbytes)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise WireError(f"{where}.{name} must be a non-negative int")
    itemsize = int(dtype[2:])  # every allowed dtype is "<kind><bytes>"
    if nbytes != itemsize * math.prod(shape):
        raise WireError(
            f"{where}.nbytes {nbytes} does not match shape {shape} x itemsize {itemsize}"
        )
    if offset % ALIGN:
        raise WireError(f"{where}.offset {offset} is not a multiple of {ALIGN}")
    return dtype, shape, offset, nbytes


def _array_view(
    buf: memoryview,
    data_start: int,
    index: int,
    checked: tuple[str, list[int], int, int],
    place: str,
) -> np.ndarray:
    import numpy as np

    dtype, shape, offset, nbytes = checked
    start = data_start + offset
    if start + nbytes > len(buf):
        raise WireError(f"arrays[{index}] [{offset}, +{nbytes}) lies outside the {place}")
    try:
        return np.frombuffer(
            buf, dtype=dtype, count=nbytes // int(dtype[2:]), offset=start
        ).reshape(shape)
    except ValueError as exc:  # e.g. a 0-size array whose other dims exceed numpy's limits
        raise WireError(f"arrays[{index}].shape {shape} cannot be represented: {exc}") from exc


def _resolve(obj: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(obj, dict):
        if ARRAY_KEY in obj:
            ref = obj[ARRAY_KEY]
            if (
                len(obj) != 1
                or not isinstance(ref, int)
                or isinstance(ref, bool)
                or not 0 <= ref < len(arrays)
            ):
                raise WireError(f"bad array reference {obj!r}")
            return arrays[ref]
        return {k: _resolve(v, arrays) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_resolve(v, arrays) for v in obj]
    return obj


SharedView = Callable[[int], memoryview]


def decode(body: bytes | bytearray | memoryview, shared: SharedView | None = None) -> Any:
    """Parse a frame; arrays are zero-copy views into `body`, or into the shared segment.

    `shared(n)` returns a view of the negotiated segment at least `n` bytes long (or
    raises WireError); a frame marked shared is refused when there is none.
    """
    buf = memoryview(body).cast("B")
    try:
        header, header_end = _parse_header(buf)
    except RecursionError as exc:
        raise WireError("frame header nests too deeply") from exc
    checked = [_check_desc(i, d) for i, d in enumerate(header["arrays"])]
    ends = [offset + nbytes for _, _, offset, nbytes in checked]
    if header.get("shared"):
        if shared is None:
            raise WireError(
                "frame names a shared segment, but none was negotiated with this server"
            )
        if len(buf) != header_end:
            raise WireError(f"shared frame has {len(buf) - header_end} bytes past its header")
        source, data_start, place = shared(max(ends, default=0)), 0, "shared segment"
    else:
        data_start = aligned(header_end)
        end = data_start + aligned(max(ends, default=0))
        if len(buf) > end:
            raise WireError(f"body has {len(buf) - end} bytes past the last buffer")
        source, place = buf, "body"
    arrays = [_array_view(source, data_start, i, c, place) for i, c in enumerate(checked)]
    try:
        return _resolve(header["meta"], arrays)
    except RecursionError as exc:
        raise WireError("frame header nests too deeply") from exc
