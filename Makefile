# specd: two commands on a fresh Debian/Ubuntu machine.
#
#   make run    set up, build, and answer "What is the capital of France?"
#   make test   set up, build, and run every test (Rust and Python)
#
# Every step is idempotent and cheap when already done. Set-up installs:
#   - Debian packages: libopenblas-dev libopenblas0-pthread (MLX's matmul on
#     OpenBLAS), clang lld wasi-libc libclang-rt-14-dev-wasm32 (C policy
#     plugins), cmake g++ (pip compiles llama-cpp-python); python3-venv when
#     `python3 -m venv` does not work
#   - rustup target wasm32-wasip2 and the wit-bindgen CLI
#     (scripts/build-plugins.sh --install-tools)
#   - .venv with tests/py/requirements.txt (mlx, mlx-lm, llama-cpp-python,
#     gguf, numpy, pytest, ...): llama-cpp-python compiles llama.cpp once
#     (LLAMA_CPP_CMAKE_ARGS below; minutes on 2 cores, then pip's wheel cache)
#   - componentize-py (pinned) in plugins/target/componentize-py, for the
#     Python policies (scripts/build-python-plugins.sh)
#   - componentize-js (pinned by plugins/js/package-lock.json, npm ci) in
#     plugins/target/componentize-js, for the JavaScript policies
#     (scripts/build-js-plugins.sh); Debian nodejs npm when node is missing
#   - MLX (the pinned mlx-cpu wheel, by the build) and the default model
#     (`specd pull`), both under $SPECD_HOME (default ~/.cache/specd)
#
# Knobs: CARGO_TARGET_DIR (one shared target dir, default ./target),
# PYTHON (default python3), PYTEST_ARGS, PROMPT, ANCHORS_ARGS.
#
#   make bench-anchors   our decode/prefill speed next to mlx-lm and llama.cpp
#   make bench-llama-server   `specd serve` against llama-server, five architectures

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := run

ROOT       := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
TARGET_DIR := $(abspath $(or $(CARGO_TARGET_DIR),$(ROOT)/target))
export CARGO_TARGET_DIR := $(TARGET_DIR)
SPECD      := $(TARGET_DIR)/release/specd
VENV       := $(ROOT)/.venv
PYTHON     ?= python3
STAMPS     := $(TARGET_DIR)/.make
PROMPT     ?= What is the capital of France?
PYTEST_ARGS ?=
ANCHORS_ARGS ?=

# pip (for the MLX wheel and `specd pull`) comes from the venv when present.
export PATH := $(VENV)/bin:$(HOME)/.cargo/bin:$(PATH)

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := libopenblas-dev libopenblas0-pthread clang lld wasi-libc libclang-rt-14-dev-wasm32 chromium cmake g++

# llama-cpp-python (the llama.cpp anchor and the independent Gemma tokenizer
# in the tests) is a source package: pip compiles llama.cpp with cmake and
# g++. Only the library the Python package loads: no llama.cpp tools,
# examples, tests, server, libcurl or multimodal library. pip caches the
# wheel it builds, so only the first install compiles.
LLAMA_CPP_CMAKE_ARGS := -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF

.PHONY: run test setup apt rust tools venv build head pull python-plugins js-plugins lint test-rust test-py bench-anchors llama-server bench-llama-server clean-stamps

run: head
	$(SPECD) generate --chat "$(PROMPT)"

test: build venv pull python-plugins js-plugins lint test-rust test-py

setup: tools venv

# ---- system packages ---------------------------------------------------------
apt:
	@missing=""; \
	for p in $(APT_PACKAGES); do \
	    dpkg-query -W -f='$${Status}' "$$p" 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if ! $(PYTHON) -m venv --help >/dev/null 2>&1 || ! $(PYTHON) -c 'import ensurepip' >/dev/null 2>&1; then \
	    missing="$$missing python3-venv"; \
	fi; \
	command -v node >/dev/null && command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ]; then \
	    echo "make: installing Debian packages:$$missing"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    $(SUDO) apt-get install -y --no-install-recommends $$missing \
	        || { $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends $$missing; }; \
	fi

# ---- Rust toolchain, wasm target, wit-bindgen ----------------------------------
rust:
	@command -v cargo >/dev/null || { \
	    echo "make: no cargo found: install a Rust toolchain (rustup, Rust >= 1.95) first" >&2; exit 1; }

$(STAMPS)/tools: scripts/build-plugins.sh | rust apt
	bash scripts/build-plugins.sh --install-tools
	@mkdir -p $(STAMPS) && touch $@

tools: $(STAMPS)/tools

# ---- Python venv ---------------------------------------------------------------
# The bare venv gives pip to the MLX fetch (build) and `specd pull` (on PATH
# as python3); the tests need the requirements too.
$(VENV)/bin/python: | apt
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: tests/py/requirements.txt | $(VENV)/bin/python
	$(VENV)/bin/python -m pip install -q --upgrade pip
	CMAKE_ARGS="$(LLAMA_CPP_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
	    $(VENV)/bin/python -m pip install -q -r tests/py/requirements.txt
	touch $@

venv: $(VENV)/.installed

# ---- build ----------------------------------------------------------------------
# Cargo decides what is stale; a no-op build takes a second.
build: tools | $(VENV)/bin/python
	cargo build --release --workspace

# The default model (fetched when missing), and its shipped MTP draft head
# (heads/smollm2-135m, made by `specd drafter train`; docs/drafter.md)
# beside the model file, where `--drafter mtp` finds it.
head: build
	m="$$($(SPECD) pull --path smollm2:135m)" && mkdir -p "$$m.mtp" && \
	    cp heads/smollm2-135m/head.safetensors heads/smollm2-135m/config.json "$$m.mtp/"

pull: head
	$(SPECD) pull gemma3:270m

# The Python policies (plugins/python -> plugins/target/python/*.wasm) for the
# tests: componentize-py (pinned, pip, its own venv) builds them; loaded at
# run time, not part of `cargo build`.  The script skips what is up to date.
python-plugins: | apt
	PYTHON=$(PYTHON) bash scripts/build-python-plugins.sh

# The JavaScript policies (plugins/js -> plugins/target/js/*.wasm), the same
# way: componentize-js (pinned by plugins/js/package-lock.json, npm ci).
js-plugins: | apt
	bash scripts/build-js-plugins.sh

# ---- tests ----------------------------------------------------------------------
# Formatting and clippy are part of the test command (CI checks them).
lint: build
	cargo fmt --all --check
	cargo clippy --release --workspace --all-targets -- -D warnings

# The kernel tests run again at the lower SIMD levels: an AVX-512 machine
# otherwise never runs the AVX2 kernels (8-bit activations, grouped
# attention) that AVX2-only machines serve with, and no x86 machine the
# scalar ones that other CPUs run (seconds each). `--workspace` keeps the
# workspace's feature set, so the test binary built above is reused (with
# `-p specd-mlx` cargo rebuilt its dependencies: 1.5 min cold).
test-rust: build pull python-plugins js-plugins
	cargo test --release --workspace
	if grep -qw avx2 /proc/cpuinfo 2>/dev/null; then \
	    SPECD_KERNEL_ISA=avx2 cargo test --release --workspace --test kernels; fi
	SPECD_KERNEL_ISA=scalar cargo test --release --workspace --test kernels
	cargo test --release --manifest-path plugins/Cargo.toml -p specd-policy-logic --tests

# pytest exits 5 when it collects no tests: that is a broken test setup, not a pass.
test-py: build venv pull python-plugins js-plugins
	@set +e; cd $(ROOT) && SPECD_BIN=$(SPECD) $(VENV)/bin/python -m pytest -p no:cacheprovider --durations=10 tests/py $(PYTEST_ARGS); rc=$$?; set -e; \
	if [ $$rc -eq 5 ]; then echo "make: pytest collected no tests under tests/py (exit 5): failing" >&2; exit 1; fi; \
	exit $$rc

# ---- anchors ----------------------------------------------------------------------
# `specd bench anchors`: ours, mlx-lm and llama.cpp side by side (both anchors
# come with the venv: tests/py/requirements.txt).
bench-anchors: build venv pull
	SPECD_PYTHON=$(VENV)/bin/python $(SPECD) bench anchors $(ANCHORS_ARGS)

# ---- llama-server -------------------------------------------------------------------
# llama.cpp's own server and perplexity tool, from the llama.cpp source that
# the llama-cpp-python sdist vendors (the version tests/py/requirements.txt
# pins, so the server and the Python anchor are one llama.cpp). Not part of
# `make test`: about 10 minutes on 2 cores, once; skipped when built.
# Outputs: $(LLAMA_BUILD)/bin/llama-server and llama-perplexity.
LLAMA_CPP_VERSION := $(shell sed -n 's/^llama-cpp-python==//p' $(ROOT)/tests/py/requirements.txt)
LLAMA_SRC   := $(ROOT)/build/llama-cpp-python-$(LLAMA_CPP_VERSION)
LLAMA_BUILD := $(LLAMA_SRC)/vendor/llama.cpp/build
LLAMA_SERVER := $(LLAMA_BUILD)/bin/llama-server

llama-server: $(LLAMA_SERVER)

$(LLAMA_SERVER): | $(VENV)/bin/python
	mkdir -p $(ROOT)/build
	[ -f $(LLAMA_SRC)/vendor/llama.cpp/CMakeLists.txt ] || { \
	    $(VENV)/bin/python -m pip download -q --no-deps --no-binary llama-cpp-python \
	        -d $(ROOT)/build "llama-cpp-python==$(LLAMA_CPP_VERSION)" && \
	    tar -xzf $(ROOT)/build/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz -C $(ROOT)/build && \
	    mv $(ROOT)/build/llama_cpp_python-$(LLAMA_CPP_VERSION) $(LLAMA_SRC); }
	cmake -S $(LLAMA_SRC)/vendor/llama.cpp -B $(LLAMA_BUILD) \
	    -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release
	cmake --build $(LLAMA_BUILD) --target llama-server llama-perplexity -j$(or $(LLAMA_JOBS),2)

# `specd serve` against `llama-server -np 8` on one random Q4_1 GGUF per
# architecture, 1 and 8 closed-loop clients (scripts/bench_llama_server.py;
# BENCH_LLAMA_ARGS passes flags, e.g. --requests 8).
BENCH_LLAMA_ARGS ?=
bench-llama-server: build venv llama-server
	SPECD_BIN=$(SPECD) $(VENV)/bin/python scripts/bench_llama_server.py \
	    --llama-server $(LLAMA_SERVER) $(BENCH_LLAMA_ARGS)

clean-stamps:
	rm -rf $(STAMPS) $(VENV)/.installed
