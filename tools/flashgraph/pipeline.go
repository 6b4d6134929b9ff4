package main

import (
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/passes"
)

// fuseMode is the value of -fuse: off, on, or required. It is a boolean flag
// (-fuse, -fuse=true, -fuse=false) that also takes "require": fuse, and fail
// naming every attention Softmax the fusion left composed, and why.
type fuseMode struct{ on, require bool }

func (f *fuseMode) String() string {
	switch {
	case f == nil || !f.on:
		return "false"
	case f.require:
		return "require"
	}
	return "true"
}

func (f *fuseMode) Set(s string) error {
	if s == "require" {
		f.on, f.require = true, true
		return nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true, false or require")
	}
	f.on, f.require = b, false
	return nil
}

// IsBoolFlag lets -fuse stand alone, like a bool flag.
func (f *fuseMode) IsBoolFlag() bool { return true }

// addFuseFlag adds -fuse with its default and what it does.
func addFuseFlag(fs *flag.FlagSet, def bool, what string) *fuseMode {
	f := &fuseMode{on: def}
	fs.Var(f, "fuse", what+"; -fuse=require: also fail, naming every attention Softmax left unfused and why")
	return f
}

// passFlags choose and observe the pass pipeline.
type passFlags struct {
	fuse      *fuseMode
	passList  string
	dumpAfter string
	dumpDir   string
	explain   bool
	fuseQKV   bool
}

func addPassFlags(fs *flag.FlagSet, withExplain bool) *passFlags {
	p := &passFlags{}
	p.fuse = addFuseFlag(fs, false, "run the fusion pipeline (canonicalize, fuse_attention, dce); off: the graph stays byte-identical to the graph as built")
	fs.StringVar(&p.passList, "passes", "", "comma-separated passes to run instead of the default pipeline (known: "+joinNames(passes.Names())+"; \"none\" runs none)")
	fs.StringVar(&p.dumpAfter, "dump-after", "", "comma-separated pass names (or \"all\") after which to write the graph's text and DOT into -dump-dir")
	fs.StringVar(&p.dumpDir, "dump-dir", "dump", "directory for -dump-after files")
	fs.BoolVar(&p.fuseQKV, "fuse-qkv", false, fuseQKVHelp)
	if withExplain {
		fs.BoolVar(&p.explain, "explain", false, "print, for every Softmax, whether attention was fused and why not (and every rule that fired)")
	}
	return p
}

func joinNames(names []string) string {
	out := ""
	for i, n := range names {
		if i > 0 {
			out += ", "
		}
		out += n
	}
	return out
}

// pipeline returns the pipeline the flags select.
func (p *passFlags) pipeline(fs *flag.FlagSet) (passes.Pipeline, error) {
	pl := passes.Default(p.fuse.on)
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "passes" })
	if set {
		var err error
		if pl, err = passes.Select(passes.ParseList(p.passList)); err != nil {
			return pl, err
		}
	}
	if p.fuseQKV {
		if set {
			return pl, fmt.Errorf("-fuse-qkv with -passes: name %s in -passes instead", passes.PassFuseQKV)
		}
		pl.Name += "+" + passes.PassFuseQKV
		pl.Passes = append(pl.Passes, passes.FuseQKV())
	}
	if p.dumpAfter != "" {
		pl.DumpAfter = passes.ParseList(p.dumpAfter)
		pl.Dump = passes.DirDumper{Dir: p.dumpDir}
	}
	return pl, nil
}

// compileGraph runs the selected pipeline on g, printing -explain output to w.
func (p *passFlags) compileGraph(fs *flag.FlagSet, g *graph.Graph, w io.Writer) (*graph.Graph, error) {
	pl, err := p.pipeline(fs)
	if err != nil {
		return nil, err
	}
	log := &passes.Log{}
	out, err := pl.Run(g, log)
	if err != nil {
		return nil, err
	}
	if p.fuse.require {
		if err := passes.RequireFusedLog(g, log); err != nil {
			return nil, fmt.Errorf("-fuse=require: %w", err)
		}
	}
	if p.explain {
		fmt.Fprintf(w, "pipeline %s: %s\n", pl.Name, joinNames(pl.PassNames()))
		xs := passes.ExplainLog(g, log)
		if len(xs) == 0 {
			fmt.Fprintln(w, "no Softmax in the graph: nothing to fuse")
		}
		for _, x := range xs {
			fmt.Fprintln(w, "  "+x.String())
		}
		if s := log.String(); s != "" {
			fmt.Fprintln(w, "pass log:")
			fmt.Fprint(w, s)
		}
	}
	return out, nil
}

// summary is one line about a graph: name, nodes, attention, hash.
func summary(g *graph.Graph) string {
	c := g.CountOps()
	return fmt.Sprintf("graph %s: %d nodes, %d params, FlashAttention %d, Softmax %d, sha256 %s",
		g.Name, len(g.Nodes), len(g.Params), c["FlashAttention"], c["Softmax"], g.Hash()[:16])
}
