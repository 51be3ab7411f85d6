"""A saved vLLM history as a script that replays it with vLLM alone (``--export``).

``script(data)`` fills ``standalone_replay.py`` (a template that imports only
vLLM, torch and the standard library) with the history's release, setup and
operations, so a vLLM maintainer runs ``python OUT.py`` in any environment
that has that release, without kvwatch. The template replays the operations as
kvwatch's player does and reports what vLLM alone can show: a raise, or a
scheduler that stalls for good (exit 1). Findings only kvwatch's checks read
(hashes against tokens, the audit) stay with ``kvwatch histories --replay``.

Only the full-attention layout is exported: the template builds one
full-attention group; other layouts raise ``ValueError``.
"""

from __future__ import annotations

import json
import pprint
from importlib import resources
from pathlib import Path
from typing import Any

from kvwatch.targets.vllm.histories import SETUPS

TEMPLATE = "standalone_replay.py"
MARK = "HISTORY: dict | None = None  # filled in when exported"


def script(data: dict[str, Any], source: str) -> str:
    """The standalone replay of ``data`` (a saved history's JSON), ``source`` its name."""
    if not isinstance(data, dict) or data.get("format") != 1 or "history" not in data:
        raise ValueError(f"{source}: not a saved history of format 1")
    target = data.get("target", {})
    if target.get("engine") != "vllm":
        raise ValueError(f"--export replays vLLM histories; {source} is {target.get('engine')}'s")
    setup = SETUPS.get(target.get("setup", ""))
    if setup is None:
        raise ValueError(f"{source}: no vLLM setup {target.get('setup')!r}")
    if setup.layout.groups != ("full",) or setup.layout.prefix_match_unit is not None:
        raise ValueError(
            f"{source}: setup {target['setup']} has layout {setup.layout.label}; --export "
            "builds one full-attention group"
        )
    ops = [{**op, "tokens": list(op["tokens"])} for op in data["history"]["ops"]]
    history = {
        "vllm": target["version"],
        "setup": setup.to_json(),
        "ops": ops,
        "source": f"{source}, failed {', '.join(data.get('failed', ())) or 'nothing'}",
    }
    text = resources.files("kvwatch.targets.vllm").joinpath(TEMPLATE).read_text()
    head, sep, tail = text.partition(MARK)
    if not sep:
        raise RuntimeError(f"{TEMPLATE} lost its HISTORY line")
    filled = "HISTORY: dict | None = " + pprint.pformat(history, width=100, compact=True)
    rest = tail.split("\n", 1)[1]  # the template's HISTORY line ends there
    return f"{head}{filled}  # filled in by kvwatch\n{rest}"


def export(saved: Path, out: Path) -> None:
    """``saved`` (a saved history's file) written to ``out`` as its standalone replay."""
    out.write_text(script(json.loads(saved.read_text()), saved.name))
