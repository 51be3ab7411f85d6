"""``kvwatch`` stops on SIGINT even when started with SIGINT ignored, as a
shell starts a background job (``cmd &`` in a script)."""

from __future__ import annotations

import signal
import subprocess
import sys


def test_a_kvwatch_started_with_sigint_ignored_still_handles_it():
    code = (
        "import signal, sys\n"
        "from kvwatch.cli import main\n"
        "sys.argv = ['kvwatch', 'faults']\n"
        "before = signal.getsignal(signal.SIGINT)\n"
        "main()\n"
        "print(before is signal.SIG_IGN, signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    ).stdout
    assert out.splitlines()[-1] == "True True", out[-500:]
