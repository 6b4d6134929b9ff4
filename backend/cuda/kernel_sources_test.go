package cuda

// The generated CUDA C of whole training steps, rendered on the CPU: a
// sha256 per kernel, compared with testdata/kernel_sources.golden. It pins
// the code generator's output, so that moving or restructuring the
// generator is shown to change no kernel without a GPU at hand.

import (
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/train"
)

var updateSources = flag.Bool("update", false, "rewrite testdata/kernel_sources.golden")

// renderKernels lowers g as Compile does, on a Backend without a device
// (Backend.render): buffers get made-up addresses laid out as the arena
// and cuMemAlloc would lay them out (256-byte aligned), every generated
// kernel's source is hashed instead of compiled. A lowering that needs the
// device itself (cuBLAS, the fused attention kernels) fails or panics; the
// line says so and the rendering goes on with the next node.
func renderKernels(t *testing.T, g *graph.Graph, opts PlanOptions) []string {
	t.Helper()
	lines, _ := renderKernelsWith(t, g, opts, renderHooks{})
	return lines
}

// renderHooks see what the lowerings do without a device (Backend.launched
// and Backend.uploaded; nil: nothing).
type renderHooks struct {
	launched func(entry string, args []any)
	uploaded func(data []byte) DevicePtr
}

// renderKernelsWith is renderKernels with the hooks; it returns the made-up
// buffers too.
func renderKernelsWith(t *testing.T, g *graph.Graph, opts PlanOptions, hooks renderHooks) ([]string, map[*graph.Value]buffer) {
	t.Helper()
	plan, err := PlanMemoryWith(g, opts)
	if err != nil {
		t.Fatal(err)
	}
	var cur []string
	b := &Backend{opts: Options{Compute: opts.Compute}, render: func(entry, src string) {
		cur = append(cur, fmt.Sprintf("%s %x", entry, sha256.Sum256([]byte(src))))
	}, launched: hooks.launched, uploaded: hooks.uploaded}
	x := &executable{b: b, g: g, opts: backend.Options{Updates: opts.Updates}, plan: plan, bufs: map[*graph.Value]buffer{},
		inits: map[string]*graph.Value{}, shapeOperands: map[*graph.Value]bool{}, sharedZeros: map[*graph.Value]bool{}}
	x.flag = 1 << 32
	x.arena = 1 << 33
	next := x.arena.Offset(int(plan.PeakBytes+255) &^ 255)
	own := func(v *graph.Value) {
		buf := buffer{ptr: next, dt: v.Type.DType, n: v.Type.Shape.Numel()}
		next = next.Offset((buf.bytes() + 255) &^ 255)
		x.bufs[v] = buf
	}
	for _, v := range g.Inputs {
		own(v)
	}
	for _, v := range g.Initializers() {
		own(v)
		x.inits[v.Name] = v
	}
	for _, n := range g.Nodes {
		for _, v := range n.Outputs {
			vp := plan.values[v]
			buf := buffer{dt: vp.storage, n: v.Type.Shape.Numel()}
			switch vp.kind {
			case placeArena:
				buf.ptr = x.arena.Offset(int(plan.Tensors[vp.tensor].Offset))
			case placeAlias, placeFolded:
				buf.ptr = x.bufs[vp.root].ptr
			}
			x.bufs[v] = buf
		}
	}
	var lines []string
	for i, n := range g.Nodes {
		lower, ok := lowerings[n.Op]
		if !ok {
			t.Fatalf("node %s: op %s has no lowering", n.Name, n.Op)
		}
		c := &lowerCtx{x: x, n: n, index: i}
		for _, ti := range plan.scratch[i] {
			pt := plan.Tensors[ti]
			c.scratch = append(c.scratch, buffer{ptr: x.arena.Offset(int(pt.Offset)), dt: pt.DType, n: pt.Shape.Numel()})
		}
		cur = nil
		ok = func() (ok bool) {
			defer func() {
				if recover() != nil {
					ok = false
				}
			}()
			_, err := lower.lower(c)
			return err == nil
		}()
		for _, k := range cur {
			lines = append(lines, fmt.Sprintf("%d %s %s", i, n.Op, k))
		}
		if !ok {
			lines = append(lines, fmt.Sprintf("%d %s (lowering needs a device)", i, n.Op))
		}
	}
	return lines, x.bufs
}

func TestGeneratedKernelSources(t *testing.T) {
	var out strings.Builder
	total := 0
	for _, name := range []string{"tiny", "small"} {
		cfg, err := model.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		gs, err := train.BuildGraphs(cfg, true, train.Hyper{})
		if err != nil {
			t.Fatal(err)
		}
		for _, compute := range []graph.DType{graph.Float32, graph.BFloat16} {
			lines := renderKernels(t, gs.Step.Graph, PlanOptions{Compute: compute, Updates: gs.Step.Updates})
			kernels := 0
			for _, l := range lines {
				if !strings.HasSuffix(l, ")") {
					kernels++
				}
			}
			if kernels == 0 {
				t.Errorf("%s %v: no generated kernel rendered", name, compute)
			}
			total += kernels
			fmt.Fprintf(&out, "# %s training step, %v compute: %d nodes, %d generated kernels\n", name, compute, len(gs.Step.Graph.Nodes), kernels)
			for _, l := range lines {
				out.WriteString(l + "\n")
			}
		}
	}
	t.Logf("%d generated kernels rendered", total)
	path := filepath.Join("testdata", "kernel_sources.golden")
	if *updateSources {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run TestGeneratedKernelSources -update to write it)", err)
	}
	if got := out.String(); got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("generated kernel sources differ from %s at line %d:\n got %s\nwant %s", path, i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("generated kernel sources differ from %s: %d lines, want %d", path, len(gl), len(wl))
	}
}
