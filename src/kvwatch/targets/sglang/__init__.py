"""SGLang's own prefix caches, run on CPU in this process and probed for kvwatch.

``kvwatch gate --engine sglang-cache --sglang-version V`` loads the cache
and scheduling modules of SGLang release V unmodified from its PyPI wheel
(downloaded at run time into a cache folder, never kept in this
repository), with stand-ins for the GPU and server parts, and drives them
with a scheduler shim that makes SGLang's scheduler's calls in its order. A
probe reads SGLang's pools, tree and session slots into kvwatch's
``ProbeReport`` after every step; kvwatch's recorder and detectors judge the
run. The target itself is ``kvwatch.targets.sglang.cache_target``.

Modules, in the order data flows::

    wheel_fetch       pip download --no-deps sglang==V -> $KVWATCH_CACHE/sglang/V/src/sglang
    release_layout    roles -> module paths per layout; which modules are imported for real
    stand_ins         Stub, stub classes and modules for everything else
    host_modules      the stand-ins with behaviour: triton, sgl_kernel, platform, utils, ServerArgs
    runtime_settings  sglang.srt.runtime_context (0.5.16+): the run's settings over declared defaults
    draft_decode      EAGLE spec-v2 over-allocation without a draft model
    release_import    the import hook; Release, load(V), release.active()
    scheduler_traits  what the release's scheduler does differently, read from its own files
    kv_pools          the release's req-to-token pool and KV / SWA / mamba allocators on CPU
    tree_caches       the release's tree cache, built as its scheduler builds it
    shim_parts        ShimConfig, the messages SGLang's code reads, Outcome, the loop's bookkeeping
    legacy_shim       LegacyScheduler: the scheduler's calls for 0.5.4.post3 .. 0.5.13.post1
    checkpoint_shim   CheckpointScheduler: the scheduler's calls for 0.5.22+
    shim_choice       which shim plays a release (or Unsupported, with the reason)
    cache_views       read-only views of requests, session slots, tree nodes and locks
    pool_holders      who holds which unit of sglang.kv / sglang.swa / sglang.mamba
    pool_audit        orphans, double and free-and-held units, lock refs, tree counters
    registry_walk     the size of every container SGLang's objects hold
    cache_probe       CacheProbe: ProbeReport, per-step watching, flush
    shim_source       the recorder's probe source over a CacheProbe
    cache_workloads   the profiles: agentic, sessions, aborts, pressure
    recorded_run      one workload on one release -> RunRecord
"""
