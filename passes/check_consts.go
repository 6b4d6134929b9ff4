package passes

import (
	"fmt"
	"math"

	"github.com/flashgraph/flashgraph/graph"
)

// CheckConsts checks every const initializer without changing the graph:
// its recipe materialises, int64 and bool literals hold integers (a literal
// 2.5 in an int64 const would be silently truncated), and float consts hold
// no NaN (legal, so a warning: a NaN mask or scale poisons every result).
// Params are weights, checked by whoever loads them.
type CheckConsts struct{}

// Name is "check_consts".
func (CheckConsts) Name() string { return PassCheckConsts }

// Run returns g itself, or an error naming the first bad const.
func (CheckConsts) Run(g *graph.Graph, log *Log) (*graph.Graph, error) {
	if g == nil {
		return nil, errNilGraph
	}
	for _, c := range g.Consts {
		if c.Init == nil {
			return nil, fmt.Errorf("const %s has no recipe", c.Name)
		}
		if c.Init.Fn == "literal" && c.Type.DType == graph.String {
			if _, err := c.Init.Materialize(c.Type); err != nil {
				return nil, fmt.Errorf("const %s: %w", c.Name, err)
			}
			continue
		}
		if c.Init.Fn == "literal" {
			if len(c.Init.Data) != c.Type.Shape.Numel() {
				return nil, fmt.Errorf("const %s: %d literal values for %v", c.Name, len(c.Init.Data), c.Type)
			}
			for i, d := range c.Init.Data {
				switch {
				case (c.Type.DType == graph.Int64 || c.Type.DType == graph.Bool) && (d != math.Trunc(d) || math.IsInf(d, 0)):
					return nil, fmt.Errorf("const %s (%v): value %d is %v, not an integer", c.Name, c.Type.DType, i, d)
				case c.Type.DType == graph.Bool && d != 0 && d != 1:
					return nil, fmt.Errorf("const %s (bool): value %d is %v, not 0 or 1", c.Name, i, d)
				case math.IsNaN(d):
					log.Add(Event{Pass: PassCheckConsts, Kind: Warning, Node: c.Name, Reason: fmt.Sprintf("value %d is NaN", i)})
				}
			}
			continue
		}
		// Recipes other than literals are computed; materialise the ones of
		// reasonable size to make sure they can be (a causal mask of the
		// wrong rank, an odd RoPE head dim).
		if c.Type.Shape.Numel() <= maxConstElems {
			if _, err := c.Init.Materialize(c.Type); err != nil {
				return nil, fmt.Errorf("const %s: %w", c.Name, err)
			}
		}
	}
	return g, nil
}
