"""``kvwatch serve``: compose engine, worker, HTTP app and telemetry, then run uvicorn.

This is the one place the server and the instrumentation meet: the app gets
the Prometheus page as a plain callable, and the instrumentation listens to
the engine's events and polls its stats through the worker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvwatch import streams
from kvwatch.engine import Engine, EngineConfig
from kvwatch.engine.config import CacheConfig, PrefixCacheMode
from kvwatch.engine.faults import faults_from_env, parse_faults
from kvwatch.engine.overrides import apply_overrides
from kvwatch.instrumentation import Telemetry, instrument
from kvwatch.instrumentation.combo_counter import CombinationCounter
from kvwatch.instrumentation.coverage import merge
from kvwatch.instrumentation.lifecycle import LifecycleCounter
from kvwatch.instrumentation.prefill_ledger import PrefillLedger
from kvwatch.server import EngineWorker, ServerSettings, create_app
from kvwatch.server.uvicorn_settings import uvicorn_settings
from kvwatch.sockets import listen_socket, socket_url

STATS_TIMEOUT_S = 10.0
# One engine read serves every gauge of a scrape: each scrape expires the last
# read first, so a reader at a turn barrier sees the engine as it is now; a
# scrape's callbacks run within milliseconds, well inside this age.
STATS_MAX_AGE_S = 0.05
# The exit code after SIGINT stopped the server: 128 + 2, as a shell reports it.
INTERRUPTED = 130


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    prefix_cache: str | None = None  # None: the config's (radix by default)
    device: str = "cpu"
    faults: tuple[str, ...] = ()
    settings: ServerSettings = field(default_factory=ServerSettings)
    run_dir: Path | None = None
    log_level: str = "warning"
    overrides: Mapping[str, Any] = field(default_factory=dict)  # ``--config FILE``


def engine_config(options: ServeOptions, base: EngineConfig | None = None) -> EngineConfig:
    """The engine config the flags describe: the overrides file first, then the
    flags on top. Unknown fields, modes and faults raise ValueError."""
    base = apply_overrides(base or EngineConfig(), options.overrides)
    faults = base.faults | parse_faults(options.faults) | faults_from_env()
    cache: CacheConfig = base.cache
    if options.prefix_cache is not None:
        cache = replace(cache, mode=PrefixCacheMode(options.prefix_cache))
    return replace(base, cache=cache, device=options.device, faults=faults)


def build(
    options: ServeOptions,
    config: EngineConfig | None = None,
    on_ready: Callable[[], None] | None = None,
):
    """The ASGI app, its worker and its telemetry (nothing runs until the app starts;
    ``on_ready`` is called once it has started)."""
    engine = Engine(config or engine_config(options))
    worker = EngineWorker(engine)
    telemetry = Telemetry(run_dir=options.run_dir)
    stats = instrument(
        engine.events,
        lambda: worker.call(engine.stats).result(STATS_TIMEOUT_S),
        telemetry,
        stats_max_age=STATS_MAX_AGE_S,
    ).metrics.stats

    def render_metrics() -> tuple[bytes, str]:
        stats.expire()  # one fresh engine read per scrape, after whatever came before it
        return telemetry.render_metrics()

    app = create_app(
        worker,
        options.settings,
        metrics=render_metrics,
        coverage=counted(engine),
        on_ready=on_ready,
        heap_settle=telemetry.write_spans,  # no span batch half-written in a heap snapshot
    )
    return app, worker, telemetry


def counted(engine: Engine) -> Callable[[], dict]:
    """What ``GET /debug/coverage`` answers: the lifecycle transitions and the
    combination and boundary edges taken, per machine, in one mapping; beside them
    the prefill ledger's tokens and evictions by kind (counter truth's figures)."""
    lifecycle = LifecycleCounter(engine.events)
    geometry = engine.config.cache
    combos = CombinationCounter(engine.events, page=geometry.page_size, window=geometry.window)
    ledger = PrefillLedger(engine.events)
    return lambda: merge(lifecycle.taken(), combos.taken(), ledger.taken())


def ready_line(options: ServeOptions, config: EngineConfig) -> str:
    """What ``kvwatch serve`` says once it serves: the model, the cache, the faults."""
    probe = "on" if options.settings.enable_probe else "off"
    faults = ", ".join(sorted(f.value for f in config.faults)) or "none"
    return (
        f"kvwatch serve: ready ({options.settings.model_name} on {config.device}, "
        f"prefix cache {config.cache.mode.value}, probe endpoints {probe}, faults: {faults})"
    )


def uvicorn_options(options: ServeOptions) -> dict[str, Any]:
    """uvicorn's settings for ``options`` (``server/uvicorn_settings.py``): loopback by
    default, a bounded request head, idle keep-alive connections kept a while."""
    return uvicorn_settings(
        options.host, options.port, options.log_level, options.settings.max_header_bytes
    )


def serve(options: ServeOptions) -> int:
    """Run until stopped: ``INTERRUPTED`` after Ctrl-C (SIGINT), with no traceback;
    2 when the engine cannot start (no such device, say) or the address cannot be
    bound. (On SIGTERM uvicorn shuts down and the process ends by the signal.)

    Two lines on stderr tell a script where and when: ``kvwatch serve: listening on
    http://127.0.0.1:8000`` once the socket is bound and listening (the real port,
    also for ``--port 0``; a connection made from then on waits in the backlog
    instead of being refused), and ``kvwatch serve: ready (...)`` from the app's
    startup hook, once the engine runs and ``GET /health`` answers 200. Every
    error before that is one line too.
    """
    import uvicorn

    say = streams.err
    try:
        config = engine_config(options)
        app, _, telemetry = build(
            options, config, on_ready=lambda: say(ready_line(options, config))
        )
    except (RuntimeError, ValueError) as exc:
        say(f"kvwatch serve: cannot start the engine: {exc}")
        return 2
    server_config = uvicorn.Config(app, **uvicorn_options(options))
    try:
        sock = listen_socket(options.host, options.port)
        sock.listen(server_config.backlog)
    except OSError as exc:
        where = f"{options.host}:{options.port}"
        say(f"kvwatch serve: cannot listen on {where}: {exc.strerror or exc}")
        telemetry.shutdown()
        return 2
    say(f"kvwatch serve: listening on {socket_url(sock)}")
    try:
        uvicorn.Server(server_config).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shut down cleanly on SIGINT, then raised it again
        return INTERRUPTED
    finally:
        sock.close()
        telemetry.shutdown()
    return 0
