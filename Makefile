# The NPU's entry points. `make test` is what CI runs; `make sim` is the demo.
# Every target bootstraps the virtual environment (.venv) first.

PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
NPU     := $(VENV)/bin/npu
CONFIG  ?= 8x8
DEVICE  ?= LFE5U-85F
BOARD   ?= ulx3s-85f
# make fpga-report: the whole NPU on every seed, the array alone on the first, FPGA_JOBS runs
# at a time (the defaults of `python -m fpga report`: fpga/report.py). Runs measured on a
# 2-core machine, two at a time (2026-12-07, router1 with --tmg-ripup, synthesis included):
# whole NPU 4x4 4-5 min, 8x8 9-22 (one that does not route runs to FPGA_PNR_MINUTES);
# array 4x4 0.2, 8x8 0.9, 12x12 3.3. So about 80 minutes of runs: the last report took 41
# on two workers alone (largest first); with the default limit of 60, up to about 90. Left out for
# time: the whole 10x10 (35 min a seed with router1, 45+ with the rip-up) and the 16x16 array
# (42.5 min); FPGA_CONFIGS=4x4,8x8,10x10 or FPGA_ARRAY_CONFIGS=4x4,8x8,12x12,16x16 add them.
# A place and route still running after FPGA_PNR_MINUTES is stopped and named on the page as
# a failed run (a router may not converge on some seeds, and then runs on for hours).
FPGA_CONFIGS ?= 4x4,8x8
FPGA_ARRAY_CONFIGS ?= 4x4,8x8,12x12
FPGA_SEEDS ?= 1,2,3,4
FPGA_JOBS ?= 2
FPGA_PNR_MINUTES ?= 60
JOBS    ?= auto
STAMP   := $(VENV)/.installed

BOARD_SIM_CONFIG ?= 4x4

.PHONY: all venv icarus litex-sim-deps sim demo test test-full coverage formal bench verilog lint trace fpga fpga-report fpga-board fpga-board-harness board-sim clean distclean help

all: test

help:
	@echo "make sim                 demo GEMM 64x100x100 on 8x8 under Verilator"
	@echo "make test                the regression (unit, software and RTL tests)"
	@echo "make test-full           the regression plus the broader RTL sweep"
	@echo "make verilog CONFIG=RxC  write build/npu_RxC.v"
	@echo "make lint CONFIG=RxC     verilator --lint-only -Wall on that Verilog (waivers: sim/lint.vlt)"
	@echo "make trace               the seeds' 2x2 trace, simulated"
	@echo "make demo                the digits CNN on the NPU under Verilator -> docs/demo.md"
	@echo "make bench               utilization sweep and simulator speed -> docs/performance.md"
	@echo "make stack               the seeds' optimization stack (FP32, INT8, fusion, memory planning, NPU) on the digits CNN, SqueezeNet and ResNet-50 -> docs/stack.md"
	@echo "make coverage            line and toggle coverage of hw/ from the Verilator RTL tests -> docs/verification.md"
	@echo "make formal              bounded formal proofs of PE, array, DMA and the instruction queue (formal/)"
	@echo "make fpga CONFIG=RxC DEVICE=LFE5U-85F [SEED=N]   ECP5 synthesis + place and route -> build/fpga/*/report.json"
	@echo "make fpga-report         the ECP5 flow for FPGA_CONFIGS ($(FPGA_CONFIGS)) on FPGA_SEEDS ($(FPGA_SEEDS)) -> docs/fpga.md"
	@echo "make board-sim [BOARD_SIM_CONFIG=4x4]   a GEMM, a quantized conv and an ONNX model through the whole simulated LiteX SoC (UART bridge, LiteDRAM, NPU)"
	@echo "make fpga-board BOARD=ulx3s-85f CONFIG=RxC [SEED=N]   the LiteX SoC's bitstream for the ULX3S (soc/ulx3s.py) -> build/board/; docs/board.md"
	@echo "make fpga-board-harness BOARD=ulx3s-85f CONFIG=RxC [CLOCK_MHZ=F] [SEED=N]   the NPU alone behind a scan chain (the out-of-context timing vehicle)"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

venv: $(STAMP) icarus litex-sim-deps

# LiteX's SoC simulation (make board-sim, tb/test_soc.py) links its modules against libevent
# and json-c from Debian; install them when we may, say how when we may not.
litex-sim-deps:
	@if ! [ -f /usr/include/event2/event.h ] || ! [ -f /usr/include/json-c/json.h ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "Installing libevent-dev and libjson-c-dev (LiteX's SoC simulation)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libevent-dev libjson-c-dev) >/dev/null; \
	  else \
	    echo "LiteX's SoC simulation needs libevent and json-c: run 'sudo apt-get install -y libevent-dev libjson-c-dev' and try again." >&2; \
	    exit 1; \
	  fi; \
	fi

# Icarus Verilog comes from Debian; install it when we may, say how when we may not.
icarus:
	@if ! command -v iverilog >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "Installing Icarus Verilog (apt-get install -y iverilog)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iverilog) >/dev/null; \
	  else \
	    echo "Icarus Verilog is missing: run 'sudo apt-get install -y iverilog' and try again." >&2; \
	    exit 1; \
	  fi; \
	fi
	@# ccache is optional: Verilator builds share their runtime library through it.
	@if ! command -v ccache >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "Installing ccache (apt-get install -y ccache)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ccache) >/dev/null || true; \
	fi

sim: venv
	$(NPU) gemm --m 64 --k 100 --n 100 --config $(CONFIG) --sim verilator --seed 1

demo: venv
	$(NPU) demo digits --config $(CONFIG) --sim verilator --out docs/demo.md

test: venv
	$(PY) -m pytest -n $(JOBS) --dist worksteal -q

test-full: venv
	NPU_FULL=1 $(PY) -m pytest -n $(JOBS) --dist worksteal -q

# Line and toggle coverage of hw/ per block from the Verilator RTL tests (sim/coverage.py)
# -> build/coverage/ and the coverage section of docs/verification.md.
coverage: venv
	$(PY) -m sim.coverage --jobs $(JOBS)

formal: venv
	$(PY) -m formal

# The utilization sweep and simulator speeds under Verilator -> docs/performance.md and
# docs/utilization.png (about 3 minutes on 2 cores with the builds cached). `npu bench --quick` for a check.
bench: venv
	$(PY) -m pip install --quiet -e ".[test,bench]"
	$(NPU) bench --out docs/performance.md

# The seeds' optimization stack, step by step, on the digits CNN and two public architectures
# at the zoo's resolution (SqueezeNet 1.1 and ResNet-50 at 32x32): host steps measured with
# onnxruntime on one thread, NPU steps from the cycle model at the config's measured Fmax
# (sw/stack.py) -> docs/stack.md. About 2 minutes on 2 cores with the zoo models cached.
stack: venv
	$(NPU) stack digits squeezenet resnet50 --config $(CONFIG) --markdown docs/stack.md

verilog: venv
	@mkdir -p build
	$(NPU) verilog --config $(CONFIG) -o build/npu_$(CONFIG).v

# -Wall, with every waived warning class and its reason in sim/lint.vlt; any other fails.
lint: verilog
	$(PY) -c "import sim.toolchain as t; t.setup_verilator(); import os, sys; os.execvp('verilator', ['verilator', '--lint-only', '-Wall', 'sim/lint.vlt', 'build/npu_$(CONFIG).v', '--top-module', 'npu_top'])"

fpga: venv
	$(PY) -m fpga run --config $(CONFIG) --device $(DEVICE) $(if $(SEED),--seed $(SEED))

fpga-report: venv
	$(PY) -m fpga report --configs $(FPGA_CONFIGS) --array-configs $(FPGA_ARRAY_CONFIGS) --seeds $(FPGA_SEEDS) --jobs $(FPGA_JOBS) --pnr-minutes $(FPGA_PNR_MINUTES) --device $(DEVICE) --out docs/fpga.md

fpga-board: venv
	$(PY) -m soc.ulx3s --board $(BOARD) --config $(CONFIG) $(if $(SEED),--seed $(SEED))

fpga-board-harness: venv
	$(PY) -m fpga board --config $(CONFIG) --board $(BOARD) $(if $(CLOCK_MHZ),--clock-mhz $(CLOCK_MHZ)) $(if $(SEED),--seed $(SEED))

board-sim: venv
	$(PY) -m sw.board_demo --config $(BOARD_SIM_CONFIG)

trace: venv
	$(NPU) trace

clean:
	rm -rf build sim_build results.xml .pytest_cache

distclean: clean
	rm -rf $(VENV) *.egg-info
