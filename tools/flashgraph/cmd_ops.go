package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

func init() {
	register(&command{name: "ops", summary: "list the op table: inputs, outputs, attributes, meaning", run: runOps})
}

func runOps(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("ops", "", "Prints every op of the op table, the one list of ops the verifier, passes and backends share.", stderr)
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	for _, s := range graph.Ops() {
		var attrs []string
		for _, a := range s.Attrs {
			attrs = append(attrs, a.Name+":"+a.Kind.String())
		}
		fmt.Fprintf(stdout, "%-32s (%s) -> (%s)", s.QualifiedName(), strings.Join(s.Inputs, ", "), strings.Join(s.Outputs, ", "))
		if len(attrs) > 0 {
			fmt.Fprintf(stdout, " {%s}", strings.Join(attrs, ", "))
		}
		fmt.Fprintf(stdout, "\n    %s\n", s.Doc)
	}
	return nil
}
