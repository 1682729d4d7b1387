"""A stand-in for CuPy where there is no GPU, for tests: its arrays (`ndarray`, of module
"cupy", so the engine takes its CUDA paths) hold NumPy arrays and compute with NumPy, and
`RawModule` builds the CUDA source for the CPU (build.py) and runs its kernels there.

What CuPy refuses is refused: a device array taken for a NumPy one (it is not one, and
converts only through .get()), a NumPy array passed to a kernel, to `ascontiguousarray` or
into an operation on device arrays (CuPy copies to the device only through asarray/array);
a kernel argument of another type or element size than the parameter's (CuPy would pass
its bytes as they are), or not contiguous (the kernel would read the wrong elements). A
stream's capture records a graph (graphs.py); dynamic shared memory is not emulated
(NotImplementedError)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import operator
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from tests.cuda_emu import build, graphs
from tests.cuda_emu.graphs import refuse_in_capture, traced

HIDDEN = ("__array_interface__", "__array_struct__", "ctypes")  # NumPy's ways to its memory
READ_BACK = ("item", "tolist", "tobytes")  # methods that give host values


class ndarray(NDArrayOperatorsMixin):  # CuPy's name
    """A device array: a NumPy array inside, NumPy's methods and operators on it; as CuPy's,
    not a NumPy array and not converted to one implicitly."""

    __module__ = "cupy"
    __slots__ = ("_a",)

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def get(self) -> np.ndarray:
        refuse_in_capture("a read back (.get())")
        return self._a.copy()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. "
            "Please use `.get()` to construct a NumPy array explicitly."
        )

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        result = on_gpu(getattr(ufunc, method), inputs, kwargs)
        out = kwargs.get("out")
        return result if out is None else out[0] if len(out) == 1 else out

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return on_gpu(func, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in HIDDEN:
            raise AttributeError(f"a device array has no {name}")
        found = getattr(self._a, name)
        if not callable(found):
            return on_device(found)
        if name in READ_BACK:
            refuse_in_capture(f"a read back (.{name}())")
        return lambda *args, **kwargs: on_gpu(found, args, kwargs)

    def __getitem__(self, key: Any) -> Any:
        return on_device(traced(lambda: self._a[inner(key)]))

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(value, np.ndarray):
            refuse_in_capture("a copy from the host")
        traced(lambda: self._a.__setitem__(inner(key), inner(value)))

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self) -> Iterator[Any]:
        return (on_device(row) for row in self._a)

    def __bool__(self) -> bool:
        refuse_in_capture("a read back (bool())")
        return bool(self._a)

    def __int__(self) -> int:
        refuse_in_capture("a read back (int())")
        return int(self._a)

    def __float__(self) -> float:
        refuse_in_capture("a read back (float())")
        return float(self._a)

    def __index__(self) -> int:
        refuse_in_capture("a read back (an index)")
        return operator.index(self._a)

    def __repr__(self) -> str:
        return f"cupy-stand-in {self._a!r}"


def inner(value: Any) -> Any:
    """`value` with each device array replaced by the NumPy array inside."""
    if isinstance(value, ndarray):
        return value._a
    if isinstance(value, list | tuple):
        return type(value)(inner(v) for v in value)
    if isinstance(value, dict):
        return {k: inner(v) for k, v in value.items()}
    return value


def refuse_host(value: Any) -> None:
    """A TypeError for a NumPy array among `value`: CuPy computes on device arrays only."""
    if isinstance(value, np.ndarray):
        raise TypeError(
            f"a NumPy array {value.shape} {value.dtype} where CuPy takes device arrays only "
            "(copy it with cupy.asarray first)"
        )
    if isinstance(value, list | tuple):
        for v in value:
            refuse_host(v)
    elif isinstance(value, dict):
        for v in value.values():
            refuse_host(v)


def on_gpu(func: Any, args: Any, kwargs: Any) -> Any:
    """func(*args, **kwargs) on the arrays inside (host arrays refused), traced for a
    capture, its arrays returned as device arrays."""
    refuse_host((args, kwargs))
    return on_device(traced(lambda: func(*inner(args), **inner(kwargs))))


def on_device(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ndarray(value)
    if isinstance(value, tuple):
        return tuple(on_device(v) for v in value)
    return value


def asarray(a: Any, dtype: Any = None, order: Any = None) -> ndarray:
    """A device array: a device array as it is (cast if need be), anything else copied."""
    if isinstance(a, ndarray):
        return a if dtype is None else on_gpu(np.asarray, (a,), {"dtype": dtype})
    refuse_in_capture("a copy from the host (cupy.asarray)")
    return ndarray(np.array(a, dtype=dtype, order=order or "K", copy=True))


def array(a: Any, dtype: Any = None, copy: bool = True) -> ndarray:
    if not isinstance(a, ndarray):
        refuse_in_capture("a copy from the host (cupy.array)")
    return ndarray(np.array(inner(a), dtype=dtype, copy=copy))


def ascontiguousarray(a: Any, dtype: Any = None) -> ndarray:
    if not isinstance(a, ndarray):
        raise TypeError(f"Argument 'a' has incorrect type (expected cupy.ndarray, got {type(a)})")
    return on_gpu(np.ascontiguousarray, (a,), {"dtype": dtype})


def asnumpy(a: Any) -> np.ndarray:
    return a.get() if isinstance(a, ndarray) else np.asarray(a)


class RawKernel:
    def __init__(self, lib: ctypes.CDLL, kernel: build.Kernel) -> None:
        self.kernel = kernel
        self.fn = getattr(lib, f"wf_emu_{kernel.name}")
        self.fn.restype = ctypes.c_int
        self.lib = lib

    def __call__(
        self,
        grid: tuple[int, ...],
        block: tuple[int, ...],
        args: tuple[Any, ...],
        shared_mem: int = 0,
        stream: Any = None,
    ) -> None:
        name, params = self.kernel.name, self.kernel.params
        if shared_mem:
            raise NotImplementedError("dynamic shared memory is not emulated")
        if len(args) != len(params):
            raise TypeError(f"{name} takes {len(params)} arguments, {len(args)} given")
        pairs = enumerate(zip(args, params, strict=True))
        values = [_argument(name, i, a, p) for i, (a, p) in pairs]
        dims = (ctypes.c_uint * 6)(*(list(grid) + [1] * 3)[:3], *(list(block) + [1] * 3)[:3])
        # a replay's launch holds the arguments' values and arrays (so their memory)
        traced(functools.partial(self._launch, dims, values, args))

    def _launch(self, dims: Any, values: list[Any], arrays: tuple[Any, ...]) -> None:
        argv = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        if self.fn(dims, argv):
            raise RuntimeError(f"{self.kernel.name}: {self.lib.wf_emu_error().decode()}")


def _argument(name: str, i: int, a: Any, p: build.Param) -> Any:
    where = f"{name} argument {i} ({p.text})"
    if p.pointer:
        if not isinstance(a, ndarray):
            raise TypeError(f"{where}: a {type(a).__name__}, not a device array")
        if not a._a.flags.c_contiguous:
            raise ValueError(f"{where}: an array that is not contiguous")
        if p.dtype is not None and a.dtype.itemsize != p.dtype.itemsize:
            raise TypeError(f"{where}: an array of {a.dtype}")
        return ctypes.c_void_p(a._a.ctypes.data)
    assert p.dtype is not None  # a scalar parameter's type is one of build.SCALARS
    given = np.dtype(type(a)) if isinstance(a, bool | int | float) else getattr(a, "dtype", None)
    if isinstance(a, np.ndarray | ndarray) or given != p.dtype:  # a 0-d array: a pointer
        raise TypeError(f"{where}: a {type(a).__name__} ({given}), not a {p.dtype} scalar")
    value = a.item() if isinstance(a, np.generic) else a
    return np.ctypeslib.as_ctypes_type(p.dtype)(value)


class RawModule:
    def __init__(self, code: str, options: tuple[str, ...] = (), name: str = "module.cu") -> None:
        self.code, self.name = code, name

    def get_function(self, name: str) -> RawKernel:
        lib, found = build.library(self.code, self.name)
        if name not in found:
            raise RuntimeError(f"CUDA_ERROR_NOT_FOUND: named symbol not found: {name}")
        return RawKernel(lib, found[name])


@contextlib.contextmanager
def _allocator(malloc: Any) -> Iterator[None]:
    yield


def _numpy_function(name: str) -> Any:
    """NumPy's `name`, refusing host arrays and returning device ones (creation functions'
    included)."""
    found = getattr(np, name)
    if isinstance(found, type) or not callable(found):
        return found

    @functools.wraps(found)
    def call(*args: Any, **kwargs: Any) -> Any:
        return on_gpu(found, args, kwargs)

    return call


def module() -> ModuleType:
    """The stand-in, a module named cupy."""
    m = ModuleType("cupy")
    m.__dict__.update(
        ndarray=ndarray,
        asarray=asarray,
        array=array,
        ascontiguousarray=ascontiguousarray,
        asnumpy=asnumpy,
        RawModule=RawModule,
        RawKernel=RawKernel,
        emulated=True,
        __getattr__=_numpy_function,
        cuda=SimpleNamespace(
            runtime=SimpleNamespace(getDeviceCount=lambda: 1),
            Stream=graphs.Stream,
            get_current_stream=graphs.Stream,
            MemoryPool=lambda: SimpleNamespace(malloc=None),
            using_allocator=_allocator,
        ),
    )
    return m
