package graph

import (
	"fmt"
	"strconv"
)

// NewNode type-checks an op application and makes the node with fresh output
// values (named name for one output, name#i for more). It does not insert the
// node into g; passes and the builder decide where it goes.
func NewNode(name, op string, attrs Attrs, inputs ...*Value) (*Node, error) {
	na, types, err := InferNode(op, inputs, attrs)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	n := &Node{Name: name, Op: op, Inputs: inputs, Attrs: na}
	for i, t := range types {
		vn := name
		if len(types) > 1 {
			vn = name + "#" + strconv.Itoa(i)
		}
		n.Outputs = append(n.Outputs, &Value{Name: vn, Type: t, Producer: n})
	}
	return n, nil
}

// Namer hands out names not yet used in a graph.
type Namer struct {
	used map[string]bool
	next map[string]int
}

// NewNamer returns a Namer that avoids every node and value name of g (g may be nil).
func NewNamer(g *Graph) *Namer {
	nm := &Namer{used: map[string]bool{}, next: map[string]int{}}
	if g != nil {
		for name := range g.Values() {
			nm.used[name] = true
		}
		for _, n := range g.Nodes {
			nm.used[n.Name] = true
		}
	}
	return nm
}

// Reserve marks a name as taken; it reports false if it already was.
func (nm *Namer) Reserve(name string) bool {
	if nm.used[name] {
		return false
	}
	nm.used[name] = true
	return true
}

// Fresh returns prefix_N for the smallest unused N (counting per prefix), and
// reserves it and its "#i" output names.
func (nm *Namer) Fresh(prefix string) string {
	for {
		i := nm.next[prefix]
		nm.next[prefix] = i + 1
		name := prefix + "_" + strconv.Itoa(i)
		if !nm.used[name] {
			nm.used[name] = true
			return name
		}
	}
}
