# flashgraph: the two commands a new user types are `make run` and `make test`.
GO ?= go
export CGO_ENABLED ?= 0
FUZZTIME ?= 10s

.PHONY: run test fmt vet unit fuzz fuzz-long build gpu clean

# The main job on the CPU with the embedded defaults: build the tiny model,
# compile it with the attention fusion, write text + DOT, train a short run.
run:
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
	$(GO) test ./graph -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s
	$(GO) test ./onnx -run '^$$' -fuzz '^FuzzImport$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s
	$(GO) test ./onnx/onnxpb -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s
	$(GO) test ./train -run '^$$' -fuzz '^FuzzReadSafetensors$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s

# Not in CI (hours on a small machine): every parser fuzzed to FUZZ_LONG_EXECS
# executions (10^6), each line giving its executions per second, then the
# training run killed 50 times. Logs in out/fuzz-long/. See docs/RELIABILITY.md.
FUZZ_LONG_EXECS ?= 1000000
FUZZ_LONG_TARGETS = ./graph:FuzzParse ./onnx:FuzzImport ./onnx/onnxpb:FuzzDecode \
	./train:FuzzReadSafetensors ./train:FuzzRestoreCheckpoint ./tools/flashgraph:FuzzBenchLists
fuzz-long:
	@mkdir -p out/fuzz-long
	@for t in $(FUZZ_LONG_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; log=out/fuzz-long/$$fn.log; start=$$(date +%s); \
		$(GO) test $$pkg -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZ_LONG_EXECS)x -fuzzminimizetime 2s >$$log 2>&1 \
			|| { tail -40 $$log; echo "$$fn FAILED (log: $$log)"; exit 1; }; \
		secs=$$(( $$(date +%s) - start )); \
		execs=$$(grep -o 'execs: [0-9]*' $$log | tail -1 | cut -d' ' -f2); \
		echo "$$fn: $$execs executions in $$secs s, $$(( execs / (secs > 0 ? secs : 1) )) execs/s, 0 crashes"; \
	done
	FLASHGRAPH_STRESS_KILLS=50 $(GO) test ./train -run '^TestTrainKillStress$$' -count=1 -v

build:
	$(GO) build -o flashgraph ./tools/flashgraph

# Everything the GPU machine runs, built here (it has no Go): see GPU.md.
gpu:
	mkdir -p .gpu
	$(GO) build -o .gpu/flashgraph ./tools/flashgraph
	$(GO) test -c -o .gpu/cuda.test ./backend/cuda

clean:
	rm -rf flashgraph .gpu out
