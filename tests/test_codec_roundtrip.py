"""The message codec round-trips exactly: decode(encode(x)) is x, type for type and bit for bit.

Pure in-process: the out-of-band buffers are copied into fresh ``bytearray``s,
as a transport's receive does, so nothing aliases the sender's memory.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlinf.scheduler.transports import codec


def roundtrip(obj):
    header, buffers = codec.encode(obj)
    return codec.decode(header, [bytearray(b) for b in buffers])


# -- exact comparison -----------------------------------------------------------
def _tensor_bits(t: torch.Tensor) -> bytes:
    t = t.detach().as_subclass(torch.Tensor).resolve_conj().resolve_neg()
    if t.numel() == 0:
        return b""
    fresh = torch.empty(t.shape, dtype=t.dtype).copy_(t)  # default strides, also for size-1 dims
    return fresh.reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_exact(got, want, path="x"):
    assert type(got) is type(want), f"{path}: type {type(got)} != {type(want)}"
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype, f"{path}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{path}: shape {got.shape} != {want.shape}"
        assert got.device == want.device, path
        assert got.requires_grad == want.requires_grad, f"{path}: requires_grad"
        assert got.is_leaf, f"{path}: arrives as a leaf"
        assert _tensor_bits(got) == _tensor_bits(want), f"{path}: bits differ"
        assert got.__dict__ == want.__dict__, f"{path}: attributes"
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.dtype.str == want.dtype.str, f"{path}: dtype {got.dtype!r} != {want.dtype!r}"
        assert got.dtype.names == want.dtype.names and got.dtype.metadata == want.dtype.metadata, f"{path}: fields"
        assert got.shape == want.shape, f"{path}: shape {got.shape} != {want.shape}"
        if want.dtype.hasobject:
            assert_exact(got.tolist(), want.tolist(), path)
        elif want.dtype.names:  # field by field: padding bytes between fields are not data
            for name in want.dtype.names:
                assert_exact(got[name], want[name], f"{path}[{name!r}]")
        else:
            assert got.tobytes() == want.tobytes(), f"{path}: bits differ"
    elif isinstance(want, dict):
        assert list(got) == list(want), f"{path}: keys"
        for k in want:
            assert_exact(got[k], want[k], f"{path}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{path}: length"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_exact(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        assert struct.pack("<d", got) == struct.pack("<d", want), f"{path}: {got!r} != {want!r} bitwise"
    elif isinstance(want, complex):
        assert struct.pack("<dd", got.real, got.imag) == struct.pack("<dd", want.real, want.imag), path
    elif isinstance(want, np.generic):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), path
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


# -- strategies -------------------------------------------------------------------
_SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
_NP_DTYPES = st.one_of(
    hnp.scalar_dtypes(),  # bool, ints, uints, floats, complex, datetime64, timedelta64
    hnp.byte_string_dtypes(min_len=1, max_len=4),
    hnp.unicode_string_dtypes(min_len=1, max_len=3),
    hnp.nested_dtypes(max_itemsize=64),  # structured, with sub-arrays
    st.sampled_from([np.dtype("V3"), np.dtype(">f4"), np.dtype(">i8"), np.dtype("<M8[ms]"), np.dtype("float16"),
                     np.dtype(np.longdouble), np.dtype([("a", "<i2"), ("b", ">f8", (2,))], align=True)]),
)


@st.composite
def np_arrays(draw):
    """Arrays filled with arbitrary bits (NaN payloads, odd datetimes), then maybe viewed non-contiguously."""
    dtype = draw(_NP_DTYPES)
    shape = draw(_SHAPES)
    n = int(np.prod(shape)) * dtype.itemsize
    raw = draw(st.binary(min_size=n, max_size=n))
    if dtype.kind == "b" or any(dtype[f].kind == "b" for f in (dtype.names or ())):
        raw = bytes(b & 1 for b in raw)
    arr = np.frombuffer(raw, dtype=np.uint8).copy().view(dtype).reshape(shape) if n else np.zeros(shape, dtype)
    return draw(_view_of(arr))


@st.composite
def _view_of(draw, arr):
    how = draw(st.sampled_from(["as is", "transpose", "step", "reverse"]))
    if arr.ndim == 0 or how == "as is":
        return arr
    if how == "transpose":
        return arr.T
    if how == "step":
        return arr[..., ::2]
    return arr[::-1]


_TORCH_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128,
] + [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu") if hasattr(torch, n)]
_GRAD_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128}


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(_TORCH_DTYPES))
    shape = draw(_SHAPES)
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = int(np.prod(shape)) * itemsize
    raw = bytearray(draw(st.binary(min_size=n, max_size=n)))
    if dtype == torch.bool:
        raw = bytearray(b & 1 for b in raw)
    t = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape).clone() if n else torch.empty(shape, dtype=dtype)
    how = draw(st.sampled_from(["as is", "transpose", "step"]))
    if t.dim() >= 2 and how == "transpose":
        t = t.transpose(0, -1)
    elif t.dim() >= 1 and how == "step":
        t = t[..., ::2]
    grad = dtype in _GRAD_DTYPES and draw(st.booleans())
    if draw(st.booleans()):
        return torch.nn.Parameter(t, requires_grad=grad)
    return t.requires_grad_(grad)


_floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                    st.binary(min_size=8, max_size=8).map(lambda b: struct.unpack("<d", b)[0]))  # any NaN payload
_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-2**70, 2**70), _floats,
    st.complex_numbers(allow_nan=True), st.text(max_size=20), st.binary(max_size=40),
    np_arrays(), tensors(), hnp.from_dtype(np.dtype("float32")).map(np.float32),
)
_objects = st.recursive(
    _leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.lists(children, max_size=5).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), children, max_size=5),
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_objects)
def test_roundtrip_is_exact(obj):
    assert_exact(roundtrip(obj), obj)


# -- the two known bugs, pinned ---------------------------------------------------
def test_structured_array_keeps_its_fields():
    dt = np.dtype([("pos", "<f4", (3,)), ("id", "<i8"), ("name", "U4"), ("ok", "?")])
    arr = np.zeros(5, dtype=dt)
    arr["pos"] = np.arange(15, dtype=np.float32).reshape(5, 3)
    arr["id"] = [7, 8, 9, 10, 11]
    arr["name"] = ["a", "bb", "ccc", "dddd", ""]
    arr["ok"] = [True, False, True, False, True]
    got = roundtrip({"batch": arr})["batch"]
    assert got.dtype == dt and got.dtype.names == ("pos", "id", "name", "ok")
    assert got["name"].tolist() == ["a", "bb", "ccc", "dddd", ""] and got["id"].tolist() == [7, 8, 9, 10, 11]
    assert np.array_equal(got["pos"], arr["pos"])
    rec = roundtrip(arr.view(np.recarray))  # an ndarray subclass: numpy's own pickling, still exact
    assert type(rec) is np.recarray and rec.name.tolist() == arr["name"].tolist()


def test_parameter_stays_a_parameter():
    p = torch.nn.Parameter(torch.randn(3, 4))
    frozen = torch.nn.Parameter(torch.arange(4), requires_grad=False)
    got, got_frozen = roundtrip([p, frozen])
    assert type(got) is torch.nn.Parameter and got.requires_grad and got.is_leaf
    assert torch.equal(got.detach(), p.detach())
    assert type(got_frozen) is torch.nn.Parameter and not got_frozen.requires_grad and got_frozen.dtype == torch.int64
    model = torch.nn.Linear(3, 2)
    state = roundtrip(dict(model.named_parameters()))
    assert all(type(v) is torch.nn.Parameter and v.requires_grad for v in state.values())


# -- explicit cases ------------------------------------------------------------------
_ALL_NP_DTYPES = [
    "?", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", ">i4", "f2", "f4", "f8", ">f8", "g", "c8", "c16", "G",
    "M8[ns]", "M8[D]", "m8[us]", "S5", "U3", ">U3", "V6", np.dtype([("x", "i1"), ("y", "f8")], align=True),
    np.dtype("f8", metadata={"unit": "m"}),
]


@pytest.mark.parametrize("dtype", _ALL_NP_DTYPES, ids=str)
def test_every_numpy_dtype(dtype):
    dtype = np.dtype(dtype)
    raw = np.random.default_rng(0).integers(0, 256, size=6 * dtype.itemsize, dtype=np.uint8)
    if dtype.kind == "b":
        raw &= 1
    arr = raw.view(dtype).reshape(2, 3)
    for x in (arr, arr.T, arr[:, ::-1], arr[:0], arr[0, 0:1].reshape(())):
        assert_exact(roundtrip(x), x)


def test_object_and_string_arrays_use_numpys_pickling():
    obj = np.array([1, "two", None, {"three": 3}], dtype=object)
    assert roundtrip(obj).tolist() == obj.tolist() and roundtrip(obj).dtype == object
    if hasattr(np.dtypes, "StringDType"):
        s = np.array(["a", "much longer string than sixteen bytes"], dtype=np.dtypes.StringDType())
        got = roundtrip(s)
        assert got.dtype == s.dtype and got.tolist() == s.tolist()


@pytest.mark.parametrize("dtype", _TORCH_DTYPES, ids=str)
def test_every_torch_dtype(dtype):
    raw = torch.randint(0, 256 if dtype != torch.bool else 2, (24 * torch.empty((), dtype=dtype).element_size(),),
                        dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    t = raw.view(dtype).reshape(2, 3, 4)
    for x in (t, t.transpose(0, 2), t[..., ::3], t[:0], t[0, 0, 0], torch.empty((0, 5), dtype=dtype)):
        assert_exact(roundtrip(x), x)


def test_nan_payloads_survive():
    bits = np.array([0x7FF8000000000001, 0xFFF0000000000F00, 0x7FF4000000000000], dtype=np.uint64)
    arr = bits.view(np.float64)
    got_arr, got_t, got_f = roundtrip([arr, torch.from_numpy(arr.copy()), float(arr[0])])
    assert got_arr.view(np.uint64).tolist() == bits.tolist()
    assert got_t.numpy().view(np.uint64).tolist() == bits.tolist()
    assert struct.pack("<d", got_f) == struct.pack("<d", float(arr[0])) and math.isnan(got_f)


def test_layouts_documented_in_the_codec():
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    fortran = np.asfortranarray(base)
    assert roundtrip(fortran).flags.f_contiguous  # Fortran order is kept
    neg = base[::-1, ::-2]
    got = roundtrip(neg)
    assert got.flags.c_contiguous and np.array_equal(got, neg)  # values kept, layout compacted
    t = torch.arange(12.0).reshape(3, 4)
    a, b = roundtrip([t[:, 1], t[1]])  # two views of one base: independent, each exact
    assert torch.equal(a, t[:, 1]) and torch.equal(b, t[1])
    same = roundtrip([t, t])
    assert same[0] is same[1]  # one object sent twice arrives as one object
    conj = torch.tensor([1 + 2j, 3 - 4j]).conj()
    assert torch.equal(roundtrip(conj), conj.resolve_conj()) and not roundtrip(conj).is_conj()
    neg_view = torch._neg_view(torch.tensor([1.0, -2.0]))
    assert torch.equal(roundtrip(neg_view), torch.tensor([-1.0, 2.0]))


def test_autograd_state():
    leaf = torch.randn(3, requires_grad=True)
    nonleaf = leaf * 2
    got_leaf, got_nonleaf = roundtrip((leaf, nonleaf))
    assert got_leaf.requires_grad and got_leaf.is_leaf
    assert got_nonleaf.requires_grad and got_nonleaf.is_leaf and got_nonleaf.grad_fn is None  # history stays behind
    assert torch.equal(got_nonleaf.detach(), nonleaf.detach())
    scalar = torch.tensor(3.5, dtype=torch.bfloat16)
    assert_exact(roundtrip(scalar), scalar)


class _Tagged(torch.Tensor):
    pass


def test_tensor_subclasses_and_attributes():
    t = torch.ones(2)
    t.tag = "obs"
    got = roundtrip(t)
    assert type(got) is torch.Tensor and got.tag == "obs"
    tagged = torch.zeros(3).as_subclass(_Tagged)
    assert type(roundtrip(tagged)) is _Tagged
    if hasattr(torch.nn, "Buffer"):
        buf = torch.nn.Buffer(torch.zeros(2), persistent=False)
        got = roundtrip(buf)
        assert isinstance(got, torch.nn.Buffer) and got.persistent is False  # a tensor marked by attributes
    sparse = torch.eye(3).to_sparse()
    assert torch.equal(roundtrip(sparse).to_dense(), torch.eye(3))


def test_small_plain_messages_take_the_fast_path():
    header, buffers = codec.encode({"step": 1, "loss": 0.25, "tag": "x", "ids": [1, 2, 3]})
    assert buffers == [] and codec.decode(header, []) == {"step": 1, "loss": 0.25, "tag": "x", "ids": [1, 2, 3]}
    header, buffers = codec.encode({"t": torch.zeros(1000)})
    assert len(buffers) == 1 and memoryview(buffers[0]).nbytes == 4000 and len(header) < 200  # bytes out of band
