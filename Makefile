# kvdepot front door. `make test` and `make demo` work on a fresh Debian 12
# machine: they install what is missing (scripts/install-deps.sh), configure,
# build and run. Build trees live under build/<preset>.
#
#   make test            deps, format check, build (-Werror), every ctest test,
#                        then the address+undefined and thread sanitizer suites
#   make build           configure and build the default (dev) tree
#   make test-vllm       vLLM's real scheduler drives the connector (PyPI vLLM)
#   make test-trtllm     the TensorRT-LLM connector tests with PyPI tensorrt-llm
#                        (needs pypi.nvidia.com; not make test)
#   make test-hf         kvdepot.hf on tiny transformers models (PyPI torch and
#                        transformers in build/hf-venv; .ci/run runs it)
#   make wheel           dist/kvdepot-*.whl with libkvdepot.so inside (release
#                        build; needs Debian's libraries, DEBIAN_DEPENDS)
#   make wheel-manylinux dist/kvdepot-*-manylinux_2_34_x86_64.whl: the wheel
#                        with its Debian libraries inside (auditwheel, PyPI),
#                        for other distributions (the vLLM image)
#   make deb             dist/kvdepot_<version>_<arch>.deb (CPack; the daemon,
#                        CLI, library, unit, sysusers/tmpfiles, /etc config)
#   make image           dist/kvdepotd_<version>_oci.tar: the .deb in a minbase
#                        Debian 12 root (mmdebstrap), imported by podman
#   make test-package    the .deb installed into a clean Debian root, the image
#                        run by podman, the manylinux wheel in a root without
#                        kvdepot's libraries (root; .ci/run runs it)
#   make chart           dist/kvdepot-<version>.tgz: the Helm chart, built
#                        from deploy/k8s (deploy/helm/build_chart.py)
#   make demo            the persistence round-trip demo (DEMO_ARGS=... passes
#                        options, e.g. DEMO_ARGS="--prompt-tokens 4000")
#   make demo-rag        chunk reuse: shuffled documents, each seam repair
#   make demo-gate       the recompute-vs-fetch gate on a slowed NVMe tier
#   make bench NAME=x    run one benchmark from bench/ (make bench lists them)
#   make bench-curves    benchmarks swept over a parameter, drawn as PNGs in
#                        docs/perf/ (bench/curves.py; not make test)
#   make dashboard-png   the Grafana dashboard's panels on a loaded local
#                        cluster, through a real Prometheus, as
#                        docs/perf/dashboard.png (not make test)
#   make bench-peers     kvdepot against LMCache, Mooncake and NIXL in one run
#                        (PyPI peers in a venv under build/; not make test)
#   make bench-all       every benchmark, demo, curve and peer in one sitting
#                        (about 20 min), outputs in docs/perf/sitting/, the
#                        tables of docs/performance.md rewritten from them
#   make soak            32 client processes against one kvdepotd for 10 min
#                        (SOAK_SECONDS, SOAK_CLIENTS); not part of make test
#   make fuzz NAME=x     run one libFuzzer target for FUZZ_SECONDS (clang)
#   make fuzz-all        every target for FUZZ_SECONDS, with a summary
#   make fmt / lint      clang-format in place / format check + clang-tidy
#   make check-sizes     the size rule alone (part of format-check and lint)
#   make install PREFIX=/usr/local
#
# Size rule: every product C file (git ls-files '*.c' outside tests/) has at
# most 1,200 lines and every function in it at most 120, counted from the
# line of its name to its closing brace. scripts/check-sizes.py enforces it
# in format-check (so in `make test`) and lint, naming file:line and the
# size of what is over; scripts/size-exceptions.txt lists what is still
# over while it is being split, each entry capped at its size today.

SHELL := /bin/bash
JOBS ?= $(shell nproc)
PREFIX ?= /usr/local
FUZZ_SECONDS ?= 60
CTEST := ctest --output-on-failure -j $(JOBS)
SOURCES = $(shell git ls-files '*.c' '*.h' '*.cu' '*.cuh' 2>/dev/null)

.PHONY: all deps build test test-ci test-asan test-tsan test-vllm test-trtllm test-hf demo demo-rag demo-gate wheel bench bench-peers bench-all soak \
        deb image test-deb test-image test-package chart bench-curves \
        wheel-manylinux test-wheel-manylinux dashboard-png \
        fuzz fuzz-all fmt \
        format-check check-sizes lint install clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake --preset dev >/dev/null
	@cmake --build --preset dev -j $(JOBS)

test: deps format-check test-ci test-asan test-tsan
	@echo "make test: all suites passed"

test-ci:
	@cmake --preset ci >/dev/null
	@cmake --build --preset ci -j $(JOBS)
	@$(CTEST) --test-dir build/ci

# Sanitizer trees skip the GPU label: the CUDA runtime is not instrumented.
test-asan:
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS)
	@$(CTEST) --test-dir build/asan -LE 'gpu|python|slow'

test-tsan:
	@cmake --preset tsan >/dev/null
	@cmake --build --preset tsan -j $(JOBS)
	@$(CTEST) --test-dir build/tsan -LE 'gpu|python|fuzz|slow'

# vLLM's real scheduler driving the connector, once per vLLM release of
# VLLM_VERSIONS (PyPI vLLM, one venv per release under build/, reused; not
# part of `make test`). The list is the oldest and the newest release
# kvdepot.vllm supports (kvdepot/_vllm_setup.py VLLM_TESTED, docs/vllm.md).
VLLM_VERSIONS ?= 0.19.1 0.33.0
test-vllm: build
	@set -e; for v in $(VLLM_VERSIONS); do \
	    scripts/install-engines.sh --vllm $$v build/vllm-venv-$$v; \
	    echo "test-vllm: vLLM $$v"; \
	    PYTHONPATH=$(CURDIR)/python KVDEPOT_LIB=$(CURDIR)/build/dev/libkvdepot.so \
	    KVDEPOTD=$(CURDIR)/build/dev/server/kvdepotd \
	    build/vllm-venv-$$v/bin/python -m pytest -q -p no:cacheprovider tests/engines/vllm; \
	done

# The TensorRT-LLM connector's tests with TensorRT-LLM's own base classes
# and MPI helpers imported (PyPI tensorrt-llm, whose wheel comes from
# pypi.nvidia.com; not part of `make test`, which runs the same tests on
# the stand-ins of tests/python/trtllm_standin.py). docs/trtllm.md.
TRTLLM_VERSION ?= 1.2.1
test-trtllm: build
	@scripts/install-engines.sh --trtllm $(TRTLLM_VERSION) build/trtllm-venv-$(TRTLLM_VERSION)
	@PYTHONPATH=$(CURDIR)/python KVDEPOT_LIB=$(CURDIR)/build/dev/libkvdepot.so \
	    KVDEPOTD=$(CURDIR)/build/dev/server/kvdepotd KVDEPOT_NEED_TRTLLM=1 \
	    build/trtllm-venv-$(TRTLLM_VERSION)/bin/python -m pytest -q -p no:cacheprovider \
	    tests/python/test_trtllm_connector.py tests/python/test_trtllm_tp.py

# kvdepot.hf on tiny random-initialised transformers models (PyPI torch and
# transformers in a venv under build/; .ci/run runs it after make test).
test-hf: build
	@scripts/install-engines.sh --hf build/hf-venv
	@PYTHONPATH=$(CURDIR)/python KVDEPOT_LIB=$(CURDIR)/build/dev/libkvdepot.so \
	    KVDEPOTD=$(CURDIR)/build/dev/server/kvdepotd \
	    build/hf-venv/bin/python -m pytest -q -p no:cacheprovider tests/hf

demo: build
	@build/dev/demo/kvdepot-demo $(DEMO_ARGS)

# Non-prefix reuse (docs/chunk-reuse.md): the same documents shuffled behind
# another question, cold, prefix-only and chunk reuse with each seam repair.
demo-rag: build
	@build/dev/demo/kvdepot-demo rag --dir .kvdepot-rag $(DEMO_ARGS)

# The recompute-vs-fetch gate on an NVMe tier made slow by a failpoint
# delay, over a sweep of prefix lengths.
demo-gate: build
	@build/dev/demo/kvdepot-demo gate --dir .kvdepot-gate $(DEMO_ARGS)

# The Python package as a platform wheel carrying the release library.
wheel: deps
	@cmake --preset release >/dev/null
	@cmake --build --preset release -j $(JOBS) --target kvdepot
	@scripts/build-wheel.sh build/release/libkvdepot.so dist

# The .deb and the daemon's image (deploy/README.md). Both are made from
# the `package` tree (release, prefix /usr) and need root for their tests.
VERSION := $(shell sed -n '/^project/s/.*VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
DEB_ARCH := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
DEB := dist/kvdepot_$(VERSION)_$(DEB_ARCH).deb
IMAGE := dist/kvdepotd_$(VERSION)_oci.tar
deb:
	@scripts/install-deps.sh package
	@cmake --preset package >/dev/null
	@cmake --build --preset package -j $(JOBS)
	@cpack --config build/package/CPackConfig.cmake -B dist >/dev/null
	@rm -rf dist/_CPack_Packages
	@echo "deb: $(DEB)"

image: deb
	@scripts/build-image.sh $(DEB) $(IMAGE)

test-deb: deb
	@tests/packaging/test_deb.sh $(DEB)

test-image: image
	@tests/packaging/test_image.sh $(IMAGE) build/package/cli/kvdepot

test-package: test-deb test-image test-wheel-manylinux

# The wheel with its libraries inside, and its test where they are absent.
wheel-manylinux: wheel
	@scripts/repair-wheel.sh $$(ls dist/kvdepot-*-py3-none-linux_*.whl) dist

test-wheel-manylinux: wheel-manylinux
	@tests/packaging/test_wheel_manylinux.sh $$(ls dist/kvdepot-*-manylinux_*.whl)

chart:
	@python3 deploy/helm/build_chart.py dist

bench-curves: build
	@scripts/install-deps.sh bench
	@/usr/bin/python3 bench/curves.py --build build/dev --out docs/perf

dashboard-png: build
	@scripts/install-deps.sh bench
	@KVDEPOTD=$(CURDIR)/build/dev/server/kvdepotd KVDEPOT_CLI=$(CURDIR)/build/dev/cli/kvdepot \
	    /usr/bin/python3 deploy/monitoring/render_dashboard.py docs/perf/dashboard.png

# The peers come from PyPI into build/peers-venv (scripts/install-peers.sh).
bench-peers: build
	@scripts/install-peers.sh build/peers-venv
	@build/peers-venv/bin/python bench/peers/run.py

# One sitting of everything above (bench/all.py; BENCH_ALL_ARGS, e.g.
# --only store,daemon or --no-doc).
bench-all: build
	@scripts/install-deps.sh bench
	@scripts/install-peers.sh build/peers-venv
	@scripts/install-engines.sh --hf build/hf-venv
	@/usr/bin/python3 bench/all.py $(BENCH_ALL_ARGS)

SOAK_SECONDS ?= 600
SOAK_CLIENTS ?= 32
soak: build
	@scripts/soak.sh $(SOAK_SECONDS) $(SOAK_CLIENTS) build/dev

bench: build
	@if [ -z "$(NAME)" ]; then \
	    echo "benchmarks:"; ls build/dev/bench 2>/dev/null | sed -n 's/^bench_/  /p'; \
	    ls bench/*.py 2>/dev/null | sed 's|bench/\(.*\)\.py|  \1|'; \
	    echo "usage: make bench NAME=<name>"; exit 2; \
	fi
	@if [ -f bench/$(NAME).py ]; then \
	    py=/usr/bin/python3; \
	    if [ "$(NAME)" = ttft_hf ] && [ -x build/hf-venv/bin/python ]; then \
	        py=build/hf-venv/bin/python; fi; \
	    PYTHONPATH=$(CURDIR)/python KVDEPOTD=$(CURDIR)/build/dev/server/kvdepotd \
	    KVDEPOT_LIB=$(CURDIR)/build/dev/libkvdepot.so $$py bench/$(NAME).py; \
	elif [ -x build/dev/bench/bench_$(NAME) ]; then \
	    build/dev/bench/bench_$(NAME); \
	else \
	    echo "no benchmark named '$(NAME)'"; exit 2; \
	fi

fuzz: deps
	@test -n "$(NAME)" || { echo "usage: make fuzz NAME=<target>"; \
	    ls tests/fuzz | sed -n 's/^fuzz_\(.*\)\.c$$/  \1/p'; exit 2; }
	@cmake --preset fuzz >/dev/null
	@cmake --build --preset fuzz -j $(JOBS) --target fuzz_$(NAME)_libfuzzer
	@mkdir -p build/fuzz/corpus/$(NAME)
	@build/fuzz/tests/fuzz/fuzz_$(NAME)_libfuzzer -max_total_time=$(FUZZ_SECONDS) \
	    build/fuzz/corpus/$(NAME) tests/fuzz/corpus/$(NAME)

# Every fuzz target for FUZZ_SECONDS each, with a summary table.
fuzz-all: deps
	@scripts/fuzz-all.sh $(FUZZ_SECONDS)

fmt:
	@clang-format -i $(SOURCES)

format-check: check-sizes
	@clang-format --dry-run -Werror $(SOURCES)

check-sizes:
	@scripts/check-sizes.py

lint: format-check check-sizes
	@cmake --preset dev >/dev/null
	@clang-tidy -p build/dev --quiet $(filter %.c,$(SOURCES)) 2>/dev/null

# The release build (no failpoints), with only the build profile's packages
# installed first (not the test suite's torch, redis or etcd).
install:
	@scripts/install-deps.sh build
	@cmake --preset release >/dev/null
	@cmake --build --preset release -j $(JOBS)
	@cmake --install build/release --prefix $(PREFIX)

clean:
	@rm -rf build
