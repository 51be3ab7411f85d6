"""SGLang's own scheduler and prefix caches, run on CPU in this process and probed for kvwatch.

``kvwatch gate --engine sglang-cache --sglang-version V`` loads the
scheduling and cache modules of SGLang release V unmodified from its PyPI
wheel (downloaded at run time into a cache folder, never kept in this
repository), with stand-ins for the GPU, model and server parts, builds the
release's own ``Scheduler`` and steps its own event loop (0.5.4.post3 ..
0.5.13.post1 read ``ServerArgs``; 0.5.16+ read ``runtime_context``). A probe
reads SGLang's pools, tree and session slots into kvwatch's ``ProbeReport``
after every step; kvwatch's recorder and detectors judge the run. The
target itself is ``kvwatch.targets.sglang.target``.

Stubs (``kvwatch.targets.stand_ins``), the units' audit (``unit_audit``), the
per-step probe's memory (``driver.step_probe``) and the container walk
(``object_walk``) are shared with ``kvwatch.targets.lightllm``.

Modules, in the order data flows::

    wheel_fetch         pip download --no-deps sglang==V -> $KVWATCH_CACHE/sglang/V/src/sglang
    release_layout      roles -> module paths per layout; which modules are imported for real
    host_modules        stand-ins with behaviour: triton, sgl_kernel, platform, utils, ServerArgs
    release_import      the import hook; Release, load(V, plan), release.active()
    scheduler_imports   PLAN: what the release's own Scheduler needs imported for real
    runtime_host        0.5.16+: runtime_context published, one-rank groups, worker facts
    kv_pools            the release's req-to-token pool and KV / SWA / mamba allocators on CPU
    loop_parts          PoolConfig, LoopConfig, the statuses a client hears, call_offered
    admission_watch     liveness: requests wait while nothing runs
    scheduler_host      the own scheduler's clock, sockets, tokenizer, config, ServerArgs
    stand_in_worker     the model worker the own scheduler builds: pools, next tokens
    scheduler_setup     the release's Scheduler, built by its own __init__ on CPU
    paced_loop          the release's event loop, one iteration per step
    messages            the tokenizer manager's messages: generate, RequestHandle, ends
    loop                SchedulerLoop: the release's Scheduler as an EngineLoop
    loop_choice         how a release's scheduler is built (or Unsupported, with the reason)
    cache_views         read-only views of requests, session slots, tree nodes and locks
    pool_holders        who holds which unit of sglang.kv / sglang.swa / sglang.mamba
    pool_audit          orphans, double and free-and-held units, lock refs, tree counters
    registry_walk       the size of every container SGLang's objects hold
    probe               CacheProbe: ProbeReport, per-step watching
    workloads           Workload; the profiles agentic, sessions, aborts, pressure
    scheduler_workloads the profiles priority, abort-stages, session-churn, session-pressure
    recording           one workload on one release -> RunRecord (driver.drive)
    target              SglangCacheTarget: the gate's Target
"""
