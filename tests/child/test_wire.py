"""The wire codec: exact round trips, zero-copy aligned views, and a typed error for every bad
frame."""

from __future__ import annotations

import json
import random
import struct

import numpy as np
import pytest

from child_runtime.protocol import wire
from child_runtime.protocol.wire import ALIGN, MAGIC, WireError, decode, encode, prepare

PREFIX = len(MAGIC) + 4


# -- helpers ---------------------------------------------------------------------------------
def raw_frame(header: object, body: bytes = b"", header_bytes: bytes | None = None) -> bytes:
    """A frame built by hand (bypassing `encode`), padded like encode pads it."""
    text = header_bytes if header_bytes is not None else json.dumps(header).encode()
    head = MAGIC + struct.pack("<I", len(text)) + text
    return head + b"\0" * (-len(head) % ALIGN) + body


def one_array(desc: dict, body: bytes = b"\0" * 64, meta: object = None) -> bytes:
    return raw_frame(
        {"meta": {"x": {"__array__": 0}} if meta is None else meta, "arrays": [desc]}, body
    )


def good_desc(**overrides) -> dict:
    desc = {"dtype": "<f4", "shape": [2, 3], "offset": 0, "nbytes": 24}
    desc.update(overrides)
    return desc


def address(arr_or_bytes) -> int:
    if isinstance(arr_or_bytes, np.ndarray):
        return arr_or_bytes.__array_interface__["data"][0]
    return np.frombuffer(arr_or_bytes, dtype=np.uint8).__array_interface__["data"][0]


def header_of(frame: bytes) -> dict:
    (n,) = struct.unpack_from("<I", frame, len(MAGIC))
    return json.loads(frame[PREFIX : PREFIX + n])


def sample_meta() -> dict:
    rng = np.random.default_rng(0)
    return {
        "items": [
            {"id": "a", "image": rng.integers(0, 256, (5, 7, 3), dtype=np.uint8), "score": 0.5},
            {
                "id": "b",
                "video": rng.integers(0, 256, (2, 3, 4, 4), dtype=np.uint8),
                "tags": ["x", None, True],
            },
        ],
        "terms": {
            "f64": rng.standard_normal(9),
            "f32": rng.standard_normal((3, 1)).astype(np.float32),
            "f16": np.array([1.5, -2.0, 65504.0], dtype=np.float16),
            "i64": np.array([-(2**63), 2**63 - 1, 0], dtype=np.int64),
            "u16": np.arange(11, dtype=np.uint16),
            "i8": np.array([-128, 127], dtype=np.int8),
            "bool": np.array([[True, False], [False, True]]),
            "empty": np.zeros((0, 4), dtype=np.float64),
            "empty_u8": np.zeros((3, 0, 2), dtype=np.uint8),
        },
        "nested": [[{"deep": np.array([7], dtype=np.uint32)}]],
        "plain": {"int": 3, "float": 1.25, "str": "ünïcödé", "none": None, "list": [1, 2.5, "x"]},
    }


def assert_same(decoded, expected) -> None:
    if isinstance(expected, np.ndarray):
        assert isinstance(decoded, np.ndarray)
        assert decoded.dtype == expected.dtype
        assert decoded.shape == expected.shape
        np.testing.assert_array_equal(decoded, expected)
    elif isinstance(expected, dict):
        assert isinstance(decoded, dict) and set(decoded) == set(expected)
        for key in expected:
            assert_same(decoded[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert isinstance(decoded, list) and len(decoded) == len(expected)
        for a, b in zip(decoded, expected, strict=True):
            assert_same(a, b)
    else:
        assert decoded == expected and type(decoded) is type(expected)


def all_arrays(obj) -> list[np.ndarray]:
    if isinstance(obj, np.ndarray):
        return [obj]
    if isinstance(obj, dict):
        return [a for v in obj.values() for a in all_arrays(v)]
    if isinstance(obj, list):
        return [a for v in obj for a in all_arrays(v)]
    return []


# -- round trips -----------------------------------------------------------------------------
def test_round_trip_nested_meta_with_many_dtypes_and_shapes():
    meta = sample_meta()
    frame = encode(meta)
    assert isinstance(frame, bytes) and frame.startswith(MAGIC)
    decoded = decode(frame)
    assert_same(decoded, meta)
    assert decoded["items"][1]["video"].ndim == 4
    assert decoded["terms"]["empty"].shape == (0, 4)
    assert decoded["terms"]["empty_u8"].shape == (3, 0, 2)
    assert decoded["terms"]["i64"].tolist() == [-(2**63), 2**63 - 1, 0]


def test_header_describes_arrays_in_order_of_appearance():
    meta = {"a": np.zeros((2, 2), np.int16), "b": [np.ones(3, np.float64)]}
    header = header_of(encode(meta))
    assert header["meta"] == {"a": {"__array__": 0}, "b": [{"__array__": 1}]}
    assert header["arrays"] == [
        {"dtype": "<i2", "shape": [2, 2], "offset": 0, "nbytes": 8},
        {"dtype": "<f8", "shape": [3], "offset": 64, "nbytes": 24},
    ]


def test_meta_without_arrays_and_tuples_become_lists():
    assert decode(encode({"a": (1, 2), "b": "s"})) == {"a": [1, 2], "b": "s"}
    assert decode(encode([])) == []
    assert decode(encode(None)) is None


def test_decoded_arrays_are_read_only_zero_copy_views_into_bytes():
    frame = encode(sample_meta())
    backing = np.frombuffer(frame, dtype=np.uint8)
    decoded = decode(frame)
    arrays = [a for a in all_arrays(decoded) if a.nbytes]
    assert len(arrays) == 10
    for arr in arrays:
        assert np.shares_memory(arr, backing)
        assert not arr.flags.writeable
        with pytest.raises(ValueError):
            arr.reshape(-1)[0] = 0
        base = arr
        while isinstance(base, np.ndarray):
            base = base.base
        assert isinstance(base, memoryview) and base.obj is frame


def test_bytearray_body_gives_writable_views_that_alias_it():
    body = bytearray(encode({"x": np.arange(4, dtype=np.int32)}))
    x = decode(body)["x"]
    assert x.flags.writeable
    x[2] = 99
    again = decode(body)["x"]
    assert again.tolist() == [0, 1, 99, 3]


def test_memoryview_body_is_accepted():
    frame = encode({"x": np.arange(3, dtype=np.uint8)})
    assert decode(memoryview(frame))["x"].tolist() == [0, 1, 2]


def test_buffers_are_64_byte_aligned_relative_to_the_body():
    frame = encode(sample_meta())
    header = header_of(frame)
    (header_len,) = struct.unpack_from("<I", frame, len(MAGIC))
    data_start = -(-(PREFIX + header_len) // ALIGN) * ALIGN
    assert data_start % ALIGN == 0
    assert all(desc["offset"] % ALIGN == 0 for desc in header["arrays"])
    decoded = decode(frame)
    start = address(frame)
    for arr in all_arrays(decoded):
        if arr.nbytes:
            assert (address(arr) - start) % ALIGN == 0
    # the frame is exactly as long as the last buffer needs, rounded to ALIGN
    last = header["arrays"][-1]
    assert len(frame) == data_start + -(-(last["offset"] + last["nbytes"]) // ALIGN) * ALIGN


def test_big_endian_and_non_contiguous_inputs_round_trip():
    big = np.array([1.5, -2.25, 1e300], dtype=">f8")
    big_int = np.array([[1, -2], [3, 2**31 - 1]], dtype=">i4")
    fortran = np.asfortranarray(np.arange(12, dtype=np.uint16).reshape(3, 4))
    strided = np.arange(20, dtype=np.float32)[::3]
    transposed = np.arange(24, dtype=np.int64).reshape(2, 3, 4).transpose(2, 0, 1)
    out = decode(
        encode({"big": big, "big_int": big_int, "f": fortran, "s": strided, "t": transposed})
    )
    assert out["big"].dtype == np.dtype("<f8") and out["big"].tolist() == big.tolist()
    assert out["big_int"].dtype == np.dtype("<i4") and out["big_int"].tolist() == big_int.tolist()
    for key, src in (("f", fortran), ("s", strided), ("t", transposed)):
        assert out[key].shape == src.shape and out[key].dtype == src.dtype
        np.testing.assert_array_equal(out[key], src)
    assert [d["dtype"] for d in header_of(encode({"b": big}))["arrays"]] == ["<f8"]


def test_scalar_array_keeps_its_zero_dim_shape():
    out = decode(encode({"s": np.array(3.5)}))["s"]
    assert out.shape == () and float(out) == 3.5


# -- encode refusals -------------------------------------------------------------------------
def test_encode_rejects_reserved_key_in_user_meta():
    with pytest.raises(WireError, match="__array__.*reserved"):
        encode({"items": [{"__array__": 0}]})


@pytest.mark.parametrize(
    "arr",
    [
        np.array([object(), 1], dtype=object),
        np.array([1 + 2j]),
        np.array(["abc"]),
        np.array(["2020-01-01"], dtype="datetime64[D]"),
    ],
    ids=["object", "complex", "unicode", "datetime"],
)
def test_encode_rejects_unsupported_dtypes(arr):
    with pytest.raises(WireError, match="not supported on the wire"):
        encode({"x": [arr]})


def test_encode_rejects_non_finite_json_numbers():
    with pytest.raises(ValueError):
        encode({"x": float("nan")})


# -- decode refusals -------------------------------------------------------------------------
def test_bad_magic():
    frame = bytearray(encode({"a": 1}))
    frame[0] ^= 0xFF
    with pytest.raises(WireError, match="bad magic"):
        decode(bytes(frame))
    with pytest.raises(WireError, match="bad magic"):
        decode(b"")
    with pytest.raises(WireError, match="bad magic"):
        decode(MAGIC + b"\x01")  # shorter than magic + length


def test_header_length_past_the_end():
    frame = encode({"a": 1})
    (n,) = struct.unpack_from("<I", frame, len(MAGIC))
    lying = frame[: len(MAGIC)] + struct.pack("<I", len(frame)) + frame[PREFIX:]
    with pytest.raises(
        WireError, match=rf"header length {len(frame)} exceeds the body \({len(frame)} bytes\)"
    ):
        decode(lying)
    with pytest.raises(WireError, match="header length"):
        decode(frame[: PREFIX + n - 1])
    huge = frame[: len(MAGIC)] + struct.pack("<I", 0xFFFFFFFF) + frame[PREFIX:]
    with pytest.raises(WireError, match="header length 4294967295"):
        decode(huge)


def test_truncated_body():
    frame = encode({"x": np.arange(100, dtype=np.float64)})  # 800 bytes of data, padded to 832
    (n,) = struct.unpack_from("<I", frame, len(MAGIC))
    data_start = -(-(PREFIX + n) // ALIGN) * ALIGN
    # padding is not needed
    assert decode(frame[: data_start + 800])["x"].tolist() == list(range(100))
    with pytest.raises(WireError, match=r"arrays\[0\] \[0, \+800\) lies outside the body"):
        decode(frame[: data_start + 799])
    with pytest.raises(WireError, match=r"arrays\[0\].*outside the body"):
        decode(frame[: PREFIX + n])  # header intact, no buffers at all


@pytest.mark.parametrize(
    "header_bytes",
    [b"{not json", b'{"meta": 1, "arrays": []', b"\xff\xfe\x00garbage", b""],
    ids=["syntax", "unterminated", "not-utf8", "empty"],
)
def test_header_not_json(header_bytes):
    with pytest.raises(WireError, match="header is not valid JSON"):
        decode(raw_frame(None, header_bytes=header_bytes))


@pytest.mark.parametrize(
    "header",
    [
        [1, 2],
        "meta",
        None,
        {"meta": {}},
        {"arrays": []},
        {"meta": {}, "arrays": [], "extra": 1},
        {"meta": {}, "arrays": {}},
        {"meta": {}, "arrays": None},
        {"meta": {}, "arrays": [], "shared": False},
        {"meta": {}, "arrays": [], "shared": 1},
    ],
    ids=[
        "list",
        "string",
        "null",
        "no-arrays",
        "no-meta",
        "extra-key",
        "arrays-dict",
        "arrays-null",
        "shared-false",
        "shared-1",
    ],
)
def test_header_must_be_object_with_exactly_meta_and_arrays(header):
    with pytest.raises(
        WireError, match="'meta', 'arrays' \\(a list\\) and optionally 'shared': true"
    ):
        decode(raw_frame(header))


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_constants_in_header_json(token):
    text = f'{{"meta": {{"v": {token}}}, "arrays": []}}'.encode()
    with pytest.raises(WireError, match=f"non-finite number {token}"):
        decode(raw_frame(None, header_bytes=text))


@pytest.mark.parametrize("dtype", ["|O", "<c16", ">f8", "<U3", "float32", 5, None])
def test_unknown_dtype(dtype):
    with pytest.raises(WireError, match=r"arrays\[0\]\.dtype .* is not one of"):
        decode(one_array(good_desc(dtype=dtype)))


@pytest.mark.parametrize("dtype", [[], {}, ["<f4"]], ids=["list", "object", "list-of-str"])
def test_unhashable_dtype_is_a_wire_error(dtype):
    with pytest.raises(WireError, match=r"arrays\[0\]\.dtype"):
        decode(one_array(good_desc(dtype=dtype)))


@pytest.mark.parametrize(
    "shape",
    [[-1, 3], [True, 3], [2.0, 3], ["2", 3], 6, None, [1] * 9],
    ids=["negative", "bool", "float", "str", "scalar", "null", "too-many-dims"],
)
def test_bad_shape(shape):
    with pytest.raises(WireError, match=r"arrays\[0\]\.shape must be a list"):
        decode(one_array(good_desc(shape=shape)))


@pytest.mark.parametrize("field", ["offset", "nbytes"])
@pytest.mark.parametrize("value", [-64, True, 1.5, "0", None])
def test_offset_and_nbytes_must_be_non_negative_ints(field, value):
    with pytest.raises(WireError, match=rf"arrays\[0\]\.{field} must be a non-negative int"):
        decode(one_array(good_desc(**{field: value})))


@pytest.mark.parametrize("nbytes", [23, 25, 6, 0])
def test_nbytes_mismatch(nbytes):
    with pytest.raises(
        WireError, match=rf"arrays\[0\]\.nbytes {nbytes} does not match shape \[2, 3\] x itemsize 4"
    ):
        decode(one_array(good_desc(nbytes=nbytes)))


@pytest.mark.parametrize("offset", [1, 4, 32, 63])
def test_offset_misaligned(offset):
    with pytest.raises(WireError, match=rf"arrays\[0\]\.offset {offset} is not a multiple of 64"):
        decode(one_array(good_desc(offset=offset), body=b"\0" * 256))


@pytest.mark.parametrize("offset", [64, 128, 2**40])
def test_offset_out_of_bounds(offset):
    with pytest.raises(WireError, match=rf"arrays\[0\] \[{offset}, \+24\) lies outside the body"):
        decode(one_array(good_desc(offset=offset), body=b"\0" * 64))


@pytest.mark.parametrize(
    "desc",
    [
        {"dtype": "<f4", "shape": [2, 3], "offset": 0},
        {"dtype": "<f4", "shape": [2, 3], "offset": 0, "nbytes": 24, "extra": 1},
        [1, 2, 3],
    ],
    ids=["missing-key", "extra-key", "not-object"],
)
def test_array_descriptor_keys(desc):
    with pytest.raises(
        WireError, match=r"arrays\[0\] must have exactly dtype, shape, offset, nbytes"
    ):
        decode(one_array(desc))


def test_error_names_the_failing_array_index():
    header = {"meta": None, "arrays": [good_desc(), good_desc(offset=64, dtype="<c8")]}
    with pytest.raises(WireError, match=r"arrays\[1\]\.dtype '<c8'"):
        decode(raw_frame(header, b"\0" * 128))


@pytest.mark.parametrize(
    "ref",
    [
        {"__array__": 1},
        {"__array__": -1},
        {"__array__": True},
        {"__array__": "0"},
        {"__array__": 0.0},
        {"__array__": 0, "extra": 1},
    ],
    ids=["out-of-range", "negative", "bool", "str", "float", "extra-key"],
)
def test_bad_array_reference(ref):
    with pytest.raises(WireError, match="bad array reference"):
        decode(one_array(good_desc(), meta={"items": [ref]}))


def test_array_reference_without_arrays():
    with pytest.raises(WireError, match="bad array reference"):
        decode(raw_frame({"meta": {"__array__": 0}, "arrays": []}))


def test_trailing_bytes_after_the_last_buffer():
    frame = encode({"x": np.arange(3, dtype=np.uint8)})
    with pytest.raises(WireError, match="64 bytes past the last buffer"):
        decode(frame + b"\0" * 64)
    with pytest.raises(WireError, match="1 bytes past the last buffer"):
        decode(encode({"a": 1}) + b"\0")


def test_valid_hand_built_frame_decodes():
    body = np.arange(6, dtype="<f4").tobytes() + b"\0" * 40
    out = decode(one_array(good_desc(), body=body))
    assert out["x"].shape == (2, 3) and out["x"].tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize("shape", [[2**62, 4], [2**32, 2**32], [2**70], [0, 2**70]])
def test_shape_whose_element_count_overflows_is_a_wire_error(shape):
    with pytest.raises(WireError):
        decode(one_array(good_desc(dtype="|u1", shape=shape, nbytes=0), body=b""))


def test_deeply_nested_header_is_a_wire_error():
    depth = 100_000
    text = b'{"meta": ' + b"[" * depth + b"]" * depth + b', "arrays": []}'
    with pytest.raises(WireError):
        decode(raw_frame(None, header_bytes=text))


# -- fuzz ------------------------------------------------------------------------------------
def _decode_or_wire_error(frame: bytes) -> None:
    try:
        decode(frame)
    except WireError:
        pass


def fuzz_frames() -> list[bytes]:
    nprng = np.random.default_rng(1234)
    return [
        encode(sample_meta()),
        encode(
            {"items": [{"id": "a", "image": nprng.integers(0, 256, (4, 4, 3), dtype=np.uint8)}]}
        ),
        encode({"ids": ["a", "b"], "terms": {"t": np.array([1.0, 2.0])}, "diagnostics": {}}),
    ]


def test_truncations_and_byte_flips_only_ever_raise_wire_error():
    rng = random.Random(1234)
    cases = 0
    for frame in fuzz_frames():
        for cut in sorted(
            {
                0,
                1,
                7,
                8,
                11,
                12,
                13,
                len(frame) - 1,
                *(rng.randrange(len(frame)) for _ in range(60)),
            }
        ):
            _decode_or_wire_error(frame[:cut])
            cases += 1
        (header_len,) = struct.unpack_from("<I", frame, len(MAGIC))
        for _ in range(400):
            mutated = bytearray(frame)
            for _ in range(rng.randint(1, 4)):
                # bias towards the header, where the structure lives
                end = PREFIX + header_len if rng.random() < 0.8 else len(frame)
                pos = rng.randrange(end)
                mutated[pos] = rng.choice(
                    [rng.randrange(256), mutated[pos] ^ (1 << rng.randrange(8))]
                )
            _decode_or_wire_error(bytes(mutated))
            cases += 1
    assert cases > 1000


def test_structured_header_mutations_only_ever_raise_wire_error():
    rng = random.Random(4321)
    values = [
        None,
        -1,
        0,
        1,
        63,
        64,
        2**31,
        2**64,
        True,
        "x",
        [],
        {},
        [1, -1],
        [0],
        [2**62, 4],
        1.5,
        "|O",
        "<c16",
        "<f8",
    ]
    cases = 0
    for frame in fuzz_frames():
        (header_len,) = struct.unpack_from("<I", frame, len(MAGIC))
        data = frame[-(-(PREFIX + header_len) // ALIGN) * ALIGN :]
        header = header_of(frame)
        for _ in range(150):
            h = json.loads(json.dumps(header))
            for _ in range(rng.randint(1, 3)):
                d = rng.choice(h["arrays"])
                d[rng.choice(["dtype", "shape", "offset", "nbytes"])] = rng.choice(values)
            _decode_or_wire_error(raw_frame(h, data))
            cases += 1
    assert cases == 450


def test_module_constants_are_what_the_child_and_parent_agree_on():
    assert wire.MAGIC == b"MSWIRE1\x00" and wire.ALIGN == 64
    assert "|O" not in wire.ALLOWED_DTYPES and "<c16" not in wire.ALLOWED_DTYPES


# -- shared frames: arrays in a segment, the body is the header alone ---------------------


def _segment(size: int):
    """Stand-ins over plain memory: ChildSegment.view, recording what was asked, and a
    `place` that copies arrays in at consecutive aligned offsets."""
    memory = bytearray(size)
    asked: list[int] = []

    def view(nbytes: int) -> memoryview:
        asked.append(nbytes)
        if nbytes > size:
            raise WireError(f"shared frame spans {nbytes} bytes; the segment has {size}")
        return memoryview(memory)

    return memory, view, asked


def _placer(memory: bytearray):
    cursor = [0]

    def place(arr: np.ndarray) -> int:
        offset = cursor[0]
        memory[offset : offset + arr.nbytes] = arr.reshape(-1).view(np.uint8).tobytes()
        cursor[0] = -(-(offset + arr.nbytes) // ALIGN) * ALIGN
        return offset

    return place


def test_shared_round_trip_is_zero_copy_and_exact():
    arrays = {
        "a": np.arange(10, dtype=np.float32),
        "b": np.full((3, 5, 4), 7, np.uint8),
        "c": np.zeros(0, np.int64),
    }
    frame = prepare({"items": [arrays, {"id": "x"}]})
    memory, view, asked = _segment(frame.array_bytes)
    body = frame.shared_body(_placer(memory))
    assert len(body) < 400  # metadata only
    decoded = decode(body, shared=view)
    for name, arr in arrays.items():
        got = decoded["items"][0][name]
        assert got.dtype == arr.dtype and np.array_equal(got, arr)
    assert np.shares_memory(decoded["items"][0]["b"], np.frombuffer(memory, np.uint8))
    assert asked == [max(d["offset"] + d["nbytes"] for d in frame.descs)]


def test_in_band_and_shared_bodies_decode_to_the_same_value():
    meta = {
        "items": [
            {
                "id": "i",
                "image": np.random.default_rng(1).integers(0, 256, (9, 7, 3), dtype=np.uint8),
            }
        ]
    }
    frame = prepare(meta)
    memory, view, _ = _segment(frame.array_bytes)
    in_band = decode(b"".join(frame.body_parts()))
    shared = decode(frame.shared_body(_placer(memory)), shared=view)
    assert np.array_equal(in_band["items"][0]["image"], shared["items"][0]["image"])
    assert frame.body_size() == len(encode(meta))


def test_shared_frame_without_a_segment_or_with_trailing_bytes():
    frame = prepare({"x": np.ones(4, np.uint8)})
    memory, view, _ = _segment(64)
    body = frame.shared_body(_placer(memory))
    with pytest.raises(WireError, match="none was negotiated"):
        decode(body)
    with pytest.raises(WireError, match="3 bytes past its header"):
        decode(body + b"abc", shared=view)


def test_shared_frame_past_the_segment():
    frame = prepare({"x": np.ones(1000, np.uint8)})
    _, view, _ = _segment(512)
    with pytest.raises(WireError, match="the segment has 512"):
        decode(frame.shared_body(_placer(bytearray(frame.array_bytes))), shared=view)


def test_stdlib_float64_arrays_travel_as_float64_ndarrays_and_other_typecodes_are_refused():
    """A text scorer's child answers its scores as array("d") (it never imports numpy): the same
    bytes."""
    from array import array

    scores = array("d", [0.5, float("nan"), -1.0])
    assert encode({"s": scores}) == encode({"s": np.array(scores.tolist())})
    back = decode(encode({"s": scores, "n": [array("d")]}))
    assert back["s"].dtype == np.float64 and back["s"][0] == 0.5 and np.isnan(back["s"][1])
    assert back["n"][0].shape == (0,)
    with pytest.raises(WireError, match="typecode 'd'\\), got 'i'"):
        encode({"s": array("i", [1])})
