"""Inert stand-ins for the parts of an engine a CPU process cannot or need not import.

The targets that run an engine's own code in process (``sglang/``,
``lightllm/``) import its cache and scheduling modules as they are; every
other module of the engine they import, and the GPU packages, become a
``StubModule``: any attribute read from one is a stubbed class. What needs
real behaviour is written by each target (``sglang/host_modules.py``,
``lightllm/host_stand_ins.py``); this module only holds the machinery:

* ``Stub``: an inert value. Falsy, empty, zero in arithmetic, callable (a
  call returns another ``Stub``), a no-op context manager, and a decorator
  that hands back what it decorates. The same attribute read twice is the
  same object, so enum-like stubs (``ForwardMode.EXTEND``) compare equal to
  themselves;
* ``stub_class(name)``: a real class (``StubMeta``) that ``isinstance`` and
  subclassing accept, falsy as a value; calling it returns a ``Stub``, and a
  real class derived from it (``StubBase``) reads missing attributes as
  stubs;
* ``StubModule``: a module whose every missing attribute is a stub class;
* ``defines(cls, name)``: whether a real class defines ``name`` (``hasattr``
  cannot tell: a stubbed base answers every name).

Invariant: a stand-in never holds data the engine's code reads back as data
(each target's import hook says where its data comes from). ``TOUCHED``
names every stub the engine's code read, for debugging.
"""

from __future__ import annotations

import abc
import inspect
import types
from typing import Any

TOUCHED: set[str] = set()


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


class Stub:
    """An inert value: falsy, empty, callable, a no-op context manager and decorator."""

    __slots__ = ("_children", "_name")

    def __init__(self, name: str = "stub") -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_children", {})

    def __getattr__(self, attr: str) -> Any:
        if _dunder(attr):
            raise AttributeError(attr)
        children = object.__getattribute__(self, "_children")
        if attr not in children:
            children[attr] = Stub(f"{self._name}.{attr}")
            TOUCHED.add(children[attr]._name)
        return children[attr]

    def __setattr__(self, attr: str, value: Any) -> None:
        self._children[attr] = value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if decorated(args, kwargs):
            return args[0]
        return Stub(f"{self._name}()")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (stub_class(self._name),)

    def __bool__(self) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def __iter__(self):
        return iter(())

    def __contains__(self, item: Any) -> bool:
        return False

    def __getitem__(self, item: Any) -> Stub:
        return self

    def __int__(self) -> int:
        return 0

    __index__ = __int__

    def __float__(self) -> float:
        return 0.0

    def _zero(self, *other: Any) -> int:
        return 0

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _zero
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _zero

    def __enter__(self) -> Stub:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<stub {self._name}>"


def decorated(args: tuple, kwargs: dict) -> bool:
    """A stub called with one function or real class only is used as a decorator."""
    if len(args) != 1 or kwargs:
        return False
    target = args[0]
    return inspect.isroutine(target) or (
        isinstance(target, type) and not target.__dict__.get("_stub_class")
    )


class StubBase:
    """What a real engine class derived from a stubbed one (a GPU or
    disaggregation mixin) inherits: missing attributes read as stubs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __init_subclass__(cls, **kwargs: Any) -> None:  # msgspec.Struct-style class options
        super().__init_subclass__()

    def __getattr__(self, attr: str) -> Any:
        if _dunder(attr):
            raise AttributeError(attr)
        TOUCHED.add(f"{type(self).__name__}.{attr}")
        return Stub(f"{type(self).__name__}.{attr}")


class StubMeta(abc.ABCMeta):
    """The type of a stubbed class: falsy, its call a ``Stub`` (or, as a
    decorator, its argument); a real subclass is constructed for real."""

    def __getattr__(cls, attr: str) -> Any:
        if _dunder(attr):
            raise AttributeError(attr)
        value = Stub(f"{cls.__name__}.{attr}")
        setattr(cls, attr, value)
        return value

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if not cls.__dict__.get("_stub_class"):
            return super().__call__(*args, **kwargs)
        if decorated(args, kwargs):
            return args[0]
        TOUCHED.add(f"{cls.__name__}()")
        return Stub(f"{cls.__name__}()")

    def __bool__(cls) -> bool:
        return not cls.__dict__.get("_stub_class")


def stub_class(name: str) -> type:
    return StubMeta(name.rsplit(".", 1)[-1], (StubBase,), {"_stub_class": True})


def defines(cls: type, name: str) -> bool:
    """Whether ``cls`` or one of its real bases defines ``name``."""
    return any(name in vars(c) for c in cls.__mro__ if not vars(c).get("_stub_class"))


class StubModule(types.ModuleType):
    """A module whose every attribute is a stubbed class, but for ``values``."""

    def __init__(self, name: str, values: dict[str, Any] | None = None, package: bool = False):
        super().__init__(name)
        self.__dict__.update(values or {})
        if package:
            self.__path__ = []

    def __getattr__(self, attr: str) -> Any:
        if _dunder(attr):
            raise AttributeError(attr)
        value = stub_class(f"{self.__name__}.{attr}")
        TOUCHED.add(f"{self.__name__}.{attr}")
        setattr(self, attr, value)
        return value
