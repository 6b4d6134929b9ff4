// Package passes rewrites graphs: the Pass and Pipeline abstractions, a
// rewrite engine whose rules are data (rewrite.go), the cleanup passes
// (dce, canonicalize, check_consts), the attention fusion (fuse_attention),
// the elementwise fusions and recompute. Gradients and the training graph
// are package autodiff.
//
// A pass never mutates its input graph: it rewrites a clone and returns it,
// or returns its input unchanged when it has nothing to do. That is what
// keeps "fusion off" byte-identical to the graph as built, and lets tools
// keep the before and after graphs side by side.
package passes

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/flashgraph/flashgraph/graph"
)

// Pass is one named graph transformation.
type Pass interface {
	Name() string
	// Run returns the transformed graph. It must not modify g; it may return
	// g itself when it changes nothing. Rules, refusals and summaries go to
	// log, which may be nil.
	Run(g *graph.Graph, log *Log) (*graph.Graph, error)
}

// errNilGraph is what every pass of this package returns for a nil graph.
var errNilGraph = errors.New("passes: nil graph")

// Pass names of this package.
const (
	PassCheckConsts   = "check_consts"
	PassCanonicalize  = "canonicalize"
	PassFuseAttention = "fuse_attention"
	PassDCE           = "dce"
)

// registry maps pass names to constructors, for -passes. Order lists the
// names in pipeline order, for help texts.
var (
	registry = map[string]func() Pass{}
	order    []string
)

// Register makes a pass selectable by name (Select, -passes). Packages and
// files that add passes call it from init; a duplicate name is a programming
// error.
func Register(name string, ctor func() Pass) {
	if _, dup := registry[name]; dup {
		panic("passes: pass registered twice: " + name)
	}
	registry[name] = ctor
	order = append(order, name)
}

func init() {
	Register(PassCheckConsts, func() Pass { return CheckConsts{} })
	Register(PassCanonicalize, Canonicalize)
	Register(PassFuseAttention, FuseAttention)
	Register(PassDCE, func() Pass { return DCE{} })
	// Not in Default: off until the GPU shows it pays (fuse_qkv.go).
	Register(PassFuseQKV, FuseQKV)
	// Not in Default: these run on finished training steps (recompute reads
	// autodiff's scopes; fused nodes have no gradient rules), recompute first.
	Register(PassRecompute, func() Pass { return Recompute{} })
	Register(PassFuseElementwise, func() Pass { return FuseElementwise{} })
	// On training steps whose forward went through fuse_qkv.
	Register(PassDisjointSums, DisjointSums)
}

// Names returns the registered pass names in registration order.
func Names() []string { return slices.Clone(order) }

// Lookup returns a new instance of the registered pass called name.
func Lookup(name string) (Pass, error) {
	ctor, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("passes: unknown pass %q (known: %s)", name, strings.Join(order, ", "))
	}
	return ctor(), nil
}

// Pipeline is an ordered list of passes.
type Pipeline struct {
	Name   string
	Passes []Pass
	// Verify runs graph.Verify on the input and on the result of every
	// pass (tests turn it on; it costs about as much as the whole fusion
	// pipeline, so compiles leave it off).
	Verify bool
	// DumpAfter names the passes after which Dump is called; "all" (or "*")
	// dumps after every pass.
	DumpAfter []string
	Dump      Dumper
}

// Default is the compile pipeline. With fuse it canonicalises, fuses
// attention and removes what the rewrites left dead. Without fuse it only
// runs checks that never rewrite, so the graph comes out byte-identical.
func Default(fuse bool) Pipeline {
	if !fuse {
		return Pipeline{Name: "nofuse", Passes: []Pass{CheckConsts{}}}
	}
	return Pipeline{Name: "fuse", Passes: []Pass{CheckConsts{}, Canonicalize(), FuseAttention(), DCE{}}}
}

// Select builds a pipeline of registered passes, in the order given (for
// -passes). An empty list is the empty pipeline, which changes nothing.
func Select(names []string) (Pipeline, error) {
	p := Pipeline{Name: strings.Join(names, ",")}
	for _, n := range names {
		ps, err := Lookup(n)
		if err != nil {
			return Pipeline{}, err
		}
		p.Passes = append(p.Passes, ps)
	}
	return p, nil
}

// ParseList splits a -passes flag value ("canonicalize,fuse_attention,dce")
// into names; "" and "none" give none.
func ParseList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" && f != "none" {
			out = append(out, f)
		}
	}
	return out
}

// Select returns the passes of p called names, in the order of names.
func (p Pipeline) Select(names []string) (Pipeline, error) {
	out := p
	out.Passes = nil
	for _, n := range names {
		i := slices.IndexFunc(p.Passes, func(ps Pass) bool { return ps.Name() == n })
		if i < 0 {
			return Pipeline{}, fmt.Errorf("passes: pipeline %s has no pass %q (has: %s)", p.Name, n, strings.Join(p.PassNames(), ", "))
		}
		out.Passes = append(out.Passes, p.Passes[i])
	}
	return out, nil
}

// PassNames lists the pipeline's passes in order.
func (p Pipeline) PassNames() []string {
	out := make([]string, len(p.Passes))
	for i, ps := range p.Passes {
		out[i] = ps.Name()
	}
	return out
}

func (p Pipeline) dumps(pass string) bool {
	return p.Dump != nil && (slices.Contains(p.DumpAfter, pass) || slices.Contains(p.DumpAfter, "all") || slices.Contains(p.DumpAfter, "*"))
}

// Run applies the passes in order. It never modifies g.
func (p Pipeline) Run(g *graph.Graph, log *Log) (*graph.Graph, error) {
	if g == nil {
		return nil, errNilGraph
	}
	for _, n := range p.DumpAfter {
		if _, known := registry[n]; !known && n != "all" && n != "*" && !slices.Contains(p.PassNames(), n) {
			return nil, fmt.Errorf("passes: -dump-after %q: no such pass", n)
		}
	}
	if p.Verify {
		if err := graph.Verify(g); err != nil {
			return nil, fmt.Errorf("input graph: %w", err)
		}
	}
	cur := g
	for i, ps := range p.Passes {
		t0 := time.Now()
		before := len(cur.Nodes)
		out, err := ps.Run(cur, log)
		if err != nil {
			return nil, fmt.Errorf("pass %s: %w", ps.Name(), err)
		}
		if p.Verify {
			if err := graph.Verify(out); err != nil {
				return nil, fmt.Errorf("after pass %s: %w", ps.Name(), err)
			}
		}
		if out != cur {
			log.Infof(ps.Name(), "%d -> %d nodes in %v", before, len(out.Nodes), time.Since(t0).Round(time.Microsecond))
		}
		if p.dumps(ps.Name()) {
			if err := p.Dump.Dump(i, ps.Name(), out); err != nil {
				return nil, fmt.Errorf("dump after %s: %w", ps.Name(), err)
			}
		}
		cur = out
	}
	return cur, nil
}

// Dumper receives the graph after a pass (-dump-after).
type Dumper interface {
	Dump(step int, pass string, g *graph.Graph) error
}

// DirDumper writes <Dir>/<step>-<pass>.txt (canonical text) and .dot.
type DirDumper struct {
	Dir string
	// DOT renders the diagram; nil means graph.WriteDOT.
	DOT func(*graph.Graph) (string, error)
}

// Dump writes the text and DOT files of g.
func (d DirDumper) Dump(step int, pass string, g *graph.Graph) error {
	if err := os.MkdirAll(d.Dir, 0o755); err != nil {
		return err
	}
	base := filepath.Join(d.Dir, fmt.Sprintf("%02d-%s", step, pass))
	if err := os.WriteFile(base+".txt", []byte(graph.Format(g)), 0o644); err != nil {
		return err
	}
	dot := d.DOT
	if dot == nil {
		dot = graph.WriteDOT
	}
	text, err := dot(g)
	if err != nil {
		return err
	}
	return os.WriteFile(base+".dot", []byte(text), 0o644)
}
