"""Inert stand-ins for the LightLLM modules and packages a CPU process does not need.

``source_hooks.py`` serves every ``lightllm`` module the caches and the
infer loop do not need, and the GPU and server packages they import at
module level, as a ``StubModule``; this module only holds the machinery:

* ``Stub``: an inert value. Falsy, empty, callable (a call returns another
  ``Stub``), a no-op context manager, and a decorator that hands back what
  it decorates. The same attribute read twice is the same object;
* ``stub_class(name)``: a real class (``StubMeta``) that ``isinstance`` and
  subclassing accept, falsy as a value; calling it returns a ``Stub``, and a
  real class derived from it (``StubBase``) reads missing attributes as
  stubs;
* ``StubModule``: any attribute read from it is a stub class.

Invariant: a stand-in never holds data LightLLM's code reads back as data:
what the caches and the loop read (token ids, pool indices, hashes) comes
from LightLLM's own classes or from ``infer_records.py``. ``TOUCHED`` names
every stub LightLLM's code read, for debugging.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

TOUCHED: set[str] = set()


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _decorated(args: tuple, kwargs: dict) -> bool:
    """Whether a call is a decorator's: one routine (or real class), nothing else."""
    if len(args) != 1 or kwargs:
        return False
    only = args[0]
    return inspect.isroutine(only) or (isinstance(only, type) and not only.__dict__.get("_stub"))


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
        return args[0] if _decorated(args, kwargs) else Stub(f"{self._name}()")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (stub_class(self._name),)

    def __bool__(self) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def __iter__(self):
        return iter(())

    def __getitem__(self, key: Any) -> Stub:
        return self

    def __enter__(self) -> Stub:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<stub {self._name}>"


class StubBase:
    """The base of every stub class: a real class derived from one reads what it
    lacks as stubs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__()

    def __getattr__(self, attr: str) -> Any:
        if _dunder(attr):
            raise AttributeError(attr)
        TOUCHED.add(f"{type(self).__name__}.{attr}")
        return Stub(f"{type(self).__name__}.{attr}")


class StubMeta(type):
    def __getattr__(cls, attr: str) -> Any:
        if _dunder(attr):
            raise AttributeError(attr)
        value = Stub(f"{cls.__name__}.{attr}")
        setattr(cls, attr, value)
        return value

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if not cls.__dict__.get("_stub"):  # a real class derived from a stub class
            return super().__call__(*args, **kwargs)
        if _decorated(args, kwargs):
            return args[0]
        TOUCHED.add(f"{cls.__name__}()")
        return Stub(f"{cls.__name__}()")

    def __bool__(cls) -> bool:
        return not cls.__dict__.get("_stub")


def stub_class(name: str) -> type:
    return StubMeta(name.rsplit(".", 1)[-1], (StubBase,), {"_stub": True})


class StubModule(types.ModuleType):
    """A module whose every missing attribute is a stub class."""

    def __init__(self, name: str, values: dict | None = None, *, package: bool = False) -> None:
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
