"""LightLLM's own prefix caches and infer loop, run on CPU from a source checkout, probed for kvwatch.

``kvwatch gate --engine lightllm-cache --lightllm-src DIR`` imports the
LightLLM checkout at DIR unmodified (nothing of LightLLM is kept in this
repository), with stand-ins for the GPU, the model and the router, and runs
its default backend's infer loop one iteration at a time over its own
``RadixCache`` or ``LinearAttPagedRadixCache`` (``--lightllm-cache radix|linear``),
memory and request managers. A probe reads LightLLM's pools, ref counts and
tree into kvwatch's ``ProbeReport`` after every iteration; kvwatch's
recorder and detectors judge the run. The target itself is
``kvwatch.targets.lightllm.target``.

Stubs (``kvwatch.targets.stand_ins``), the units' audit (``unit_audit``), the
per-step probe's memory (``driver.step_probe``) and the container walk
(``object_walk``) are shared with ``kvwatch.targets.sglang``; the driver
process per run (``driver.process``) with ``kvwatch.targets.vllm.scheduler_target``.

Modules, in the order data flows::

    checkout_check    --lightllm-src DIR: a LightLLM checkout? its commit; has the linear cache?
    target            LightllmCacheTarget: a driver process per run, its record read back
    run_driver        the driver process: plan in, record and progress lines out
    recording         one workload on the checkout through driver.drive; where LightLLM broke
    host_stand_ins    stand-ins with behaviour: triton, the rank, shared memory, custom_cat, easydict
    source_hooks      the import hook: LightLLM's modules from DIR, stand-ins, stubs
    cpu_torch         torch on CPU: pin_memory dropped, "cuda" -> cpu, .cpu()/.cuda() copy
    infer_records     the router's side: shared-memory request records, the IO buffer, start args
    forward_stand_in  the model (what a forward writes to the pools) and the sampler
    infer_build       LightLLM's managers, cache and ChunkedPrefillBackend from its own classes
    loop              InferLoop: the EngineLoop; one iteration of the shipped infer_loop a step
    workloads         Workload; the profiles prefix-share, chunked, aborts, pressure (seeded)
    state_read        who holds which unit of lightllm.kv / .req / .state / .small_state
    tree_read         node refs against live anchors, the tree's counters, the eviction sets
    slot_audit        pure checks: orphan, double_owned, free_and_owned, ref_mismatch, tree
    object_sizes      the size of every container LightLLM's objects hold
    probe             InferProbe: ProbeReport, per-iteration watching
"""
