package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/passes"
)

// passFlags choose and observe the pass pipeline.
type passFlags struct {
	fuse      bool
	passList  string
	dumpAfter string
	dumpDir   string
	explain   bool
}

func addPassFlags(fs *flag.FlagSet, withExplain bool) *passFlags {
	p := &passFlags{}
	fs.BoolVar(&p.fuse, "fuse", false, "run the fusion pipeline (canonicalize, fuse_attention, dce); off: the graph stays byte-identical to the graph as built")
	fs.StringVar(&p.passList, "passes", "", "comma-separated passes to run instead of the default pipeline (known: "+joinNames(passes.Names())+"; \"none\" runs none)")
	fs.StringVar(&p.dumpAfter, "dump-after", "", "comma-separated pass names (or \"all\") after which to write the graph's text and DOT into -dump-dir")
	fs.StringVar(&p.dumpDir, "dump-dir", "dump", "directory for -dump-after files")
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
	pl := passes.Default(p.fuse)
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "passes" })
	if set {
		var err error
		if pl, err = passes.Select(passes.ParseList(p.passList)); err != nil {
			return pl, err
		}
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
