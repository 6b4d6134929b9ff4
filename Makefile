# flashgraph: the two commands a new user types are `make run` and `make test`.
GO ?= go
export CGO_ENABLED ?= 0
# Each fuzz target of `make test` runs this many executions (a few seconds
# each on a 2-core machine). A count, not a duration: with a duration Go 1.26's
# fuzz coordinator can fail a target with a bare "context deadline exceeded"
# as the time runs out (golang/go#75804, fixed in Go 1.27), which made CI red
# now and then with nothing found. FUZZTIME=10s still works.
FUZZTIME ?= 50000x

.PHONY: run test fmt vet unit fuzz fuzz-long build gpu clean

# The main job on the CPU with the embedded defaults: build the tiny model,
# compile it with the attention fusion, write text + DOT, train a short run.
# The first build downloads the modules and compiles for about a minute.
run:
	@echo "make run: building flashgraph (the first time takes about a minute), then training tiny on the CPU"
	$(GO) run ./tools/flashgraph train -out out

# gofmt check, go vet, every unit test, and a short run of each fuzz target.
test: fmt vet unit fuzz

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

unit:
	$(GO) test ./...

fuzz:
	$(GO) test ./graph -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 100x
	$(GO) test ./onnx -run '^$$' -fuzz '^FuzzImport$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 100x
	$(GO) test ./onnx/onnxpb -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 100x
	$(GO) test ./checkpoint -run '^$$' -fuzz '^FuzzReadSafetensors$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 100x
	$(GO) test ./backend/cpu -run '^$$' -fuzz '^FuzzFusedBody$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 100x
	$(GO) test ./train -run '^$$' -fuzz '^FuzzReadTokens$$' -fuzztime 2000x -fuzzminimizetime 100x

# Not in CI: every parser fuzzed for FUZZ_LONG (10^6 executions; a time such
# as 60s also works), each line giving the executions per second over the
# fuzzing time, then the training run killed 50 times. Logs in out/fuzz-long/.
# See docs/RELIABILITY.md.
FUZZ_LONG ?= 1000000x
FUZZ_LONG_TARGETS = ./graph:FuzzParse ./onnx:FuzzImport ./onnx/onnxpb:FuzzDecode \
	./checkpoint:FuzzReadSafetensors ./train:FuzzRestoreCheckpoint ./tools/flashgraph:FuzzBenchLists \
	./backend/cpu:FuzzFusedBody ./train:FuzzReadTokens
fuzz-long:
	@mkdir -p out/fuzz-long
	@for t in $(FUZZ_LONG_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; log=out/fuzz-long/$$fn.log; \
		$(GO) test $$pkg -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZ_LONG) -fuzzminimizetime 100x >$$log 2>&1 \
			|| { tail -40 $$log; echo "$$fn FAILED (log: $$log)"; exit 1; }; \
		grep 'execs:' $$log | tail -1 | awk -v fn=$$fn '{ \
			e = $$3; sub(",", "", e); t = 0; \
			if (match(e, /[0-9]+h/)) t += substr(e, RSTART, RLENGTH-1) * 3600; \
			if (match(e, /[0-9]+m/)) t += substr(e, RSTART, RLENGTH-1) * 60; \
			if (match(e, /[0-9]+s/)) t += substr(e, RSTART, RLENGTH-1); \
			n = $$5; sub(",", "", n); \
			printf "%-22s %9d executions in %6d s: %6.0f execs/s, 0 crashes\n", fn, n, t, n / (t > 0 ? t : 1) }'; \
	done
	FLASHGRAPH_STRESS_KILLS=50 $(GO) test ./train -run '^TestTrainKillStress$$' -count=1 -v

build:
	$(GO) build -o flashgraph ./tools/flashgraph

# Everything a GPU machine without Go runs, built here: see docs/GPU.md.
gpu:
	mkdir -p .gpu
	$(GO) build -o .gpu/flashgraph ./tools/flashgraph
	$(GO) test -c -o .gpu/driver.test ./backend/cuda/driver
	$(GO) test -c -o .gpu/attention.test ./backend/cuda/attention
	$(GO) test -c -o .gpu/cuda.test ./backend/cuda
	$(GO) test -c -o .gpu/onnx.test ./onnx
	printf '%s\n' '#!/bin/sh' \
		'# The attention kernels under compute-sanitizer (memcheck, then racecheck); run on the GPU machine from the repository root.' \
		'set -e' \
		'S=$${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer' \
		'T="TestFlashAttentionGPU|TestFlashSM90GPU|TestFlashSM90Backward|TestFlashDecodeGPU"' \
		'for tool in memcheck racecheck; do "$$S" --tool $$tool --error-exitcode 3 ./.gpu/attention.test -test.run "$$T" -test.count=1; done' \
		> .gpu/sanitize.sh
	chmod +x .gpu/sanitize.sh

clean:
	rm -rf flashgraph .gpu out
