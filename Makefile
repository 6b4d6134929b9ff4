# flashgraph: the two commands a new user types are `make run` and `make test`.
GO ?= go
export CGO_ENABLED ?= 0
FUZZTIME ?= 10s

.PHONY: run test fmt vet unit fuzz build gpu clean

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
	$(GO) test ./graph -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s
	$(GO) test ./onnx -run '^$$' -fuzz '^FuzzImport$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s
	$(GO) test ./onnx/onnxpb -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s
	$(GO) test ./train -run '^$$' -fuzz '^FuzzReadSafetensors$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s

build:
	$(GO) build -o flashgraph ./tools/flashgraph

# Everything a GPU machine without Go runs, built here: see docs/GPU.md.
gpu:
	mkdir -p .gpu
	$(GO) build -o .gpu/flashgraph ./tools/flashgraph
	$(GO) test -c -o .gpu/cuda.test ./backend/cuda

clean:
	rm -rf flashgraph .gpu out
