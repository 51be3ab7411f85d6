"""What a release's own ``Scheduler`` talks to on a CPU host: ours, small, and inert.

* ``Clock``: a virtual clock; the scheduler's modules read ``time`` through
  ``Clock.module()``, and one scheduler iteration is one second, so
  ``SGLANG_REQ_WAITING_TIMEOUT=4`` means four iterations;
* ``InQueue`` / ``OutSink``: the ZMQ sockets the release's own socket setup
  asks for (``get_zmq_socket``): a receiving socket is a queue whose
  non-blocking receive raises ``zmq.ZMQError`` when empty (what ends the
  scheduler's receive loop), a sending one keeps everything sent;
* ``TokenizerStandIn``: token ids only (requests come tokenized);
* ``PortArgsStandIn``: every IPC name an in-process one;
* ``ModelConfigStandIn``: the model facts the scheduler reads, a plain
  decoder-only text model; a field not listed raises, so a new read shows;
* ``server_args``: the release's own ``ServerArgs`` dataclass with its
  declared defaults, ``__post_init__`` skipped (it resolves a model path, a
  device and GPU memory), and the run's settings over them;
* ``release_function``: a function of the release's source compiled by name
  (``get_worker_info``, ``compute_dp_attention_world_info``), for a stand-in
  to run the release's own body on itself.

Invariant: nothing here decides what the scheduler admits, runs, retracts,
aborts or frees; the values given are the ones a single-GPU, single-rank
server with this run's settings would have.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import textwrap
import time
import types
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kvwatch.targets.sglang.scheduler_imports import ZMQError

EOS = 2
VOCAB = 32000


class Clock:
    """A virtual clock: +1 s per scheduler iteration (``advance``)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def advance(self, seconds: float = 1.0) -> None:
        self.now += seconds

    def module(self) -> types.ModuleType:
        """A ``time`` module whose clocks read ``now``; the rest is the real one."""
        clock = types.ModuleType("time")
        clock.__dict__.update({k: getattr(time, k) for k in dir(time) if not k.startswith("__")})
        for name in ("perf_counter", "time", "monotonic"):
            setattr(clock, name, lambda: self.now)
            setattr(clock, f"{name}_ns", lambda: int(self.now * 1e9))
        return clock


class InQueue:
    """The receiving end of a PULL / DEALER socket."""

    def __init__(self) -> None:
        self.messages: collections.deque = collections.deque()

    def recv_pyobj(self, flags: int = 0) -> Any:
        if not self.messages:
            raise ZMQError("empty")
        return self.messages.popleft()

    def send_pyobj(self, obj: Any, *_: Any, **__: Any) -> None:
        pass  # an RPC reply: nobody listens


class OutSink:
    """The sending end of a PUSH socket: keeps every object sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send_pyobj(self, obj: Any, *_: Any, **__: Any) -> None:
        self.sent.append(obj)


class TokenizerStandIn:
    vocab_size = VOCAB
    bos_token_id = None
    eos_token_id = EOS
    additional_stop_token_ids = None

    def decode(self, ids: Any, *_: Any, **__: Any) -> str:
        return " ".join(map(str, ids))

    def encode(self, text: str, *_: Any, **__: Any) -> list[int]:
        return []


class PortArgsStandIn(SimpleNamespace):
    def __getattr__(self, name: str) -> str:
        if name.startswith("__"):
            raise AttributeError(name)
        return f"inproc://{name}"


class ModelConfigStandIn(SimpleNamespace):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"the model config stand-in has no {name!r}")


def model_config(context_len: int) -> ModelConfigStandIn:
    import torch

    return ModelConfigStandIn(
        is_generation=True,
        is_multimodal=False,
        is_multimodal_gen=False,
        is_image_gen=False,
        is_audio_model=False,
        context_len=context_len,
        vocab_size=VOCAB,
        hf_eos_token_id={EOS},
        hf_config=SimpleNamespace(architectures=["StandIn"]),
        hf_text_config=SimpleNamespace(),
        num_key_value_heads=1,
        num_attention_heads=1,
        is_encoder_decoder=False,
        use_ngram_embedding=False,
        think_end_id=None,
        attention_arch=None,
        dtype=torch.float32,
        is_hybrid_swa=False,
        is_local_attention_model=False,
        is_hybrid_gdn=False,
        model_impl="auto",
        # reasoning-model markers (0.5.22+): a plain model has none
        self_opened_think_start_ids=None,
        think_end_ids=None,
        request_selectable_think_end_id_sequences=None,
        spec_hidden_size=16,
        is_matryoshka=False,
    )


def server_args(cls: type, **settings: Any) -> Any:
    """An instance of the release's ``ServerArgs`` dataclass: its declared defaults
    (``__post_init__`` skipped), then ``settings`` (those it declares)."""
    obj = object.__new__(cls)
    declared = {f.name: f for f in dataclasses.fields(cls)}
    for name, f in declared.items():
        value = None
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        object.__setattr__(obj, name, value)
    for name, value in settings.items():
        if name in declared:
            object.__setattr__(obj, name, value)
    return obj


def release_literal(root: Path, relpath: str, name: str) -> Any:
    """The literal a module-level ``name = ...`` of the release's file ``relpath``
    binds (``CHUNK_SIZE = 64``), or None when the file or the assignment is not there."""
    path = root / relpath
    if not path.is_file():
        return None
    for node in ast.parse(path.read_text()).body:
        targets = [getattr(t, "id", None) for t in getattr(node, "targets", ())]
        if isinstance(node, ast.Assign) and targets == [name]:
            return ast.literal_eval(node.value)
    return None


def release_function(
    root: Path, relpath: str, name: str, namespace: dict[str, Any] | None = None
) -> Callable:
    """The function (or method) ``name`` of the release's file ``relpath``,
    compiled alone from its source, its globals ``namespace`` (the names its
    module imports, where the module itself is a stand-in)."""
    source = (root / relpath).read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            scope: dict[str, Any] = dict(namespace or {})
            exec(textwrap.dedent(ast.get_source_segment(source, node)), scope)
            return scope[name]
    raise LookupError(f"{relpath} has no function {name}")
