package onnx

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// An initializer recipe in metadata: "normal(seed=1, std=0.02)", "ones()",
// "literal(1e-05)". Export writes it when the stored data alone would lose it;
// import uses it when it reproduces the stored data exactly.

func formatRecipe(in graph.Init) string {
	var parts []string
	if in.Fn == "literal" {
		for _, v := range in.Data {
			parts = append(parts, graph.FormatFloat(v))
		}
	} else {
		keys := make([]string, 0, len(in.Args))
		for k := range in.Args {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			parts = append(parts, k+"="+graph.FormatFloat(in.Args[k]))
		}
	}
	return in.Fn + "(" + strings.Join(parts, ", ") + ")"
}

func parseRecipe(s string) (graph.Init, error) {
	open := strings.IndexByte(s, '(')
	if open <= 0 || !strings.HasSuffix(s, ")") {
		return graph.Init{}, fmt.Errorf("bad recipe %q", s)
	}
	in := graph.Init{Fn: s[:open]}
	body := strings.TrimSpace(s[open+1 : len(s)-1])
	if body == "" {
		return in, nil
	}
	for _, part := range strings.Split(body, ",") {
		part = strings.TrimSpace(part)
		if in.Fn == "literal" {
			v, err := graph.ParseFloatLit(part)
			if err != nil {
				return graph.Init{}, err
			}
			in.Data = append(in.Data, v)
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return graph.Init{}, fmt.Errorf("bad recipe argument %q", part)
		}
		f, err := graph.ParseFloatLit(v)
		if err != nil {
			return graph.Init{}, err
		}
		if in.Args == nil {
			in.Args = map[string]float64{}
		}
		in.Args[k] = f
	}
	return in, nil
}

// needsRecipe reports whether the stored data would not give the recipe back:
// any recipe but a literal, or a literal whose values the element type rounds.
func needsRecipe(in graph.Init, t *graph.Tensor) bool {
	if in.Fn != "literal" {
		return true
	}
	for k, v := range in.Data {
		if math.Float64bits(t.At(k)) != math.Float64bits(v) {
			return true
		}
	}
	return false
}
