"""What CPU-only torch refuses of LightLLM's code, stood in for this process only.

LightLLM allocates its pools and request tables on the GPU and pins host
buffers; ``patch()`` makes that run on CPU:

* ``pin_memory=True`` is dropped (pinning is a transfer-speed hint) and
  ``device="cuda"`` becomes the CPU, in ``torch.zeros/empty/arange/ones/
  full/tensor``;
* ``Tensor.cuda()`` and ``Tensor.cpu()`` return a *copy*. On a GPU they are
  device/host copies, and LightLLM relies on that: a request's tokens go
  into the tree as ``req_to_token_indexs[idx][:n].detach().cpu()``; CPU
  torch's ``.cpu()`` returns the same storage, so the tree would alias the
  request's row and change when the row is reused;
* ``torch.cuda.Stream/Event/current_stream/stream/set_device`` are inert.

Invariant: only ever called in a driver process of its own
(``run_driver.py``): these are global changes to torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kvwatch.targets.stand_ins import Stub

CONSTRUCTORS = ("zeros", "empty", "arange", "ones", "full", "tensor")
_patched = False


def _on_cpu(original: Callable[..., Any]) -> Callable[..., Any]:
    def constructor(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("pin_memory", None)
        if kwargs.get("device") == "cuda":
            kwargs["device"] = "cpu"
        return original(*args, **kwargs)

    return constructor


def _copy(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return self.clone()


def patch() -> None:
    """Once per process."""
    global _patched
    if _patched:
        return
    _patched = True
    for name in CONSTRUCTORS:
        setattr(torch, name, _on_cpu(getattr(torch, name)))
    torch.Tensor.cuda = _copy
    torch.Tensor.cpu = _copy
    torch.cuda.Stream = lambda *a, **k: Stub("cuda.Stream")
    torch.cuda.Event = lambda *a, **k: Stub("cuda.Event")
    torch.cuda.current_stream = lambda *a, **k: Stub("cuda.current_stream")
    torch.cuda.stream = lambda *a, **k: Stub("cuda.stream")
    torch.cuda.set_device = lambda *a, **k: None
