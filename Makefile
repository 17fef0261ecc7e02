# Trireme: the two commands of the README.
#   make demo   install what is missing, build, train the reference GPT on 2 ranks
#   make test   install what is missing, build, run the whole suite through ctest
# Other targets: deps, build, bench, clean.
BUILD   ?= build
JOBS    ?= $(shell nproc)
DEMO_OUT ?= runs/demo
# ccache and precompiled headers together need this sloppiness.
export CCACHE_SLOPPINESS := pch_defines,time_macros,include_file_mtime,include_file_ctime

.PHONY: deps build demo test bench clean

deps:
	@bash scripts/install-deps

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# (The demo's own folder starts over each time: trireme train refuses an earlier run's --out.)
demo: build
	rm -rf $(DEMO_OUT)
	$(BUILD)/trireme train gpt --nproc-per-node 2 --dp 2 \
	  --layers 4 --dim 256 --heads 4 --seq 128 --batch 16 --steps 400 \
	  --lr 3e-3 --out $(DEMO_OUT)

test: build
	ctest --test-dir $(BUILD) -j $(JOBS) --output-on-failure --timeout 900

bench: build
	bench/ddp_vs_pytorch

clean:
	rm -rf $(BUILD)
