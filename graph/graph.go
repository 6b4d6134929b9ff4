// Package graph is flashgraph's IR: typed SSA values, nodes from one op table,
// static shapes, a builder, a verifier, the canonical text format (the identity
// of a graph: its sha256 is the graph's hash) and DOT output.
package graph

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
)

// ValueKind says where a value comes from.
type ValueKind uint8

// Value kinds. Params are trainable initializers; Consts are fixed ones
// (masks, RoPE tables, shape operands, scalars).
const (
	Intermediate ValueKind = iota
	Input
	Param
	Const
)

var valueKindNames = [...]string{"value", "input", "param", "const"}

func (k ValueKind) String() string {
	if int(k) < len(valueKindNames) {
		return valueKindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Value is an SSA value: produced once (by a node, or as a graph input or
// initializer), used any number of times.
type Value struct {
	Name     string
	Type     TensorType
	Kind     ValueKind
	Producer *Node // nil unless Kind == Intermediate
	Init     *Init // recipe for Param and Const
}

// IsInitializer reports whether v is a param or a const.
func (v *Value) IsInitializer() bool { return v.Kind == Param || v.Kind == Const }

// Node applies one op of the op table.
type Node struct {
	Name    string
	Op      string   // op type; the op table gives its domain
	Inputs  []*Value // nil entries are omitted optional inputs
	Outputs []*Value
	Attrs   Attrs
}

// Spec returns the node's op table entry (nil for an unknown op).
func (n *Node) Spec() *OpSpec { return ops[n.Op] }

// Graph is a static dataflow graph. Nodes are kept in topological order.
type Graph struct {
	Name    string
	Inputs  []*Value
	Params  []*Value
	Consts  []*Value
	Nodes   []*Node
	Outputs []*Value
	// ElemTypes records, by value name, the element type a graph input or
	// output was declared with where that type is a narrow integer the IR
	// holds as Int64 ("int32", "uint8"; see NarrowIntRange): the value is fed
	// and read as int64, within that type's range. Importers set it; exporters
	// write the declared type back. It is not part of the canonical text.
	ElemTypes map[string]string
}

// Hash is the sha256 of the canonical text, in hex: the graph's identity.
func (g *Graph) Hash() string {
	sum := sha256.Sum256([]byte(Format(g)))
	return hex.EncodeToString(sum[:])
}

// Initializers returns params then consts.
func (g *Graph) Initializers() []*Value {
	return append(append([]*Value{}, g.Params...), g.Consts...)
}

// Value finds a value by name (linear scan; use Values for many lookups).
func (g *Graph) Value(name string) *Value { return g.Values()[name] }

// Values indexes every value of the graph by name.
func (g *Graph) Values() map[string]*Value {
	m := map[string]*Value{}
	for _, v := range g.Inputs {
		m[v.Name] = v
	}
	for _, v := range g.Initializers() {
		m[v.Name] = v
	}
	for _, n := range g.Nodes {
		for _, v := range n.Outputs {
			m[v.Name] = v
		}
	}
	return m
}

// Uses maps each value to the nodes that read it, in node order; a node that
// reads a value twice appears twice.
func (g *Graph) Uses() map[*Value][]*Node {
	m := map[*Value][]*Node{}
	for _, n := range g.Nodes {
		for _, v := range n.Inputs {
			if v != nil {
				m[v] = append(m[v], n)
			}
		}
	}
	return m
}

// IsOutput reports whether v is a graph output.
func (g *Graph) IsOutput(v *Value) bool {
	for _, o := range g.Outputs {
		if o == v {
			return true
		}
	}
	return false
}

// CountOps returns how many nodes of each op type the graph has.
func (g *Graph) CountOps() map[string]int {
	m := map[string]int{}
	for _, n := range g.Nodes {
		m[n.Op]++
	}
	return m
}

// Clone deep-copies the graph: passes rewrite a clone, never the original,
// so that "pass off" keeps the graph as built byte for byte.
func (g *Graph) Clone() *Graph {
	vm := map[*Value]*Value{}
	cp := func(v *Value) *Value {
		if v == nil {
			return nil
		}
		if c, ok := vm[v]; ok {
			return c
		}
		c := &Value{Name: v.Name, Type: TensorType{v.Type.DType, v.Type.Shape.Clone()}, Kind: v.Kind}
		if v.Init != nil {
			in := *v.Init
			in.Data = append([]float64(nil), v.Init.Data...)
			if v.Init.Strings != nil {
				in.Strings = append([]string{}, v.Init.Strings...)
			}
			if v.Init.Args != nil {
				in.Args = map[string]float64{}
				for k, a := range v.Init.Args {
					in.Args[k] = a
				}
			}
			c.Init = &in
		}
		vm[v] = c
		return c
	}
	out := &Graph{Name: g.Name}
	for _, v := range g.Inputs {
		out.Inputs = append(out.Inputs, cp(v))
	}
	for _, v := range g.Params {
		out.Params = append(out.Params, cp(v))
	}
	for _, v := range g.Consts {
		out.Consts = append(out.Consts, cp(v))
	}
	for _, n := range g.Nodes {
		c := &Node{Name: n.Name, Op: n.Op, Attrs: n.Attrs.Clone()}
		for _, v := range n.Inputs {
			c.Inputs = append(c.Inputs, cp(v))
		}
		for _, v := range n.Outputs {
			o := cp(v)
			o.Producer = c
			c.Outputs = append(c.Outputs, o)
		}
		out.Nodes = append(out.Nodes, c)
	}
	for _, v := range g.Outputs {
		out.Outputs = append(out.Outputs, cp(v))
	}
	if g.ElemTypes != nil {
		out.ElemTypes = maps.Clone(g.ElemTypes)
	}
	return out
}
