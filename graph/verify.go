package graph

import (
	"errors"
	"fmt"
)

// Verify checks a graph: unique names, SSA (each value defined once, before its
// uses), known ops with the right arity and attributes, declared types equal
// to inferred types, initializer recipes valid, outputs defined. Nodes in order
// before their uses also means acyclic. It reports the node and the reason.
func Verify(g *Graph) error {
	if g == nil {
		return errors.New("verify: nil graph")
	}
	defined := map[*Value]bool{}
	names := map[string]string{}
	nodeNames := map[string]bool{}
	claim := func(name, what string) error {
		if !validName(name) {
			return fmt.Errorf("verify: %s: invalid name %q", what, name)
		}
		if prev, ok := names[name]; ok {
			return fmt.Errorf("verify: name %q used twice (%s and %s)", name, prev, what)
		}
		names[name] = what
		return nil
	}
	leaves := func(vs []*Value, kind ValueKind) error {
		for _, v := range vs {
			if v == nil {
				return fmt.Errorf("verify: nil %s", kind)
			}
			if v.Kind != kind || v.Producer != nil {
				return fmt.Errorf("verify: %s %s is listed as a %s", v.Kind, v.Name, kind)
			}
			if err := claim(v.Name, kind.String()+" "+v.Name); err != nil {
				return err
			}
			if v.Type.DType == InvalidDType || (v.Type.DType.Size() == 0 && v.Type.DType != String) {
				return fmt.Errorf("verify: %s %s has invalid dtype", kind, v.Name)
			}
			if kind == Param && v.Type.DType == String {
				// A param is trained and checkpointed as numbers; text is
				// a const or an input.
				return fmt.Errorf("verify: param %s is a string tensor; strings may be consts or inputs, not params", v.Name)
			}
			if err := v.Type.Shape.Check(); err != nil {
				return fmt.Errorf("verify: %s %s: %w", kind, v.Name, err)
			}
			if (kind == Param || kind == Const) != (v.Init != nil) {
				return fmt.Errorf("verify: %s %s: initializers need a recipe, inputs must not have one", kind, v.Name)
			}
			if v.Init != nil {
				if err := v.Init.check(v.Type); err != nil {
					return fmt.Errorf("verify: %s %s: %w", kind, v.Name, err)
				}
			}
			defined[v] = true
		}
		return nil
	}
	if err := leaves(g.Inputs, Input); err != nil {
		return err
	}
	if err := leaves(g.Params, Param); err != nil {
		return err
	}
	if err := leaves(g.Consts, Const); err != nil {
		return err
	}
	for i, n := range g.Nodes {
		if n == nil {
			return fmt.Errorf("verify: node %d is nil", i)
		}
		// Node names are a namespace of their own, as in ONNX (a node and its
		// single output share a name by design).
		if !validName(n.Name) {
			return fmt.Errorf("verify: node %q: invalid name", n.Name)
		}
		if nodeNames[n.Name] {
			return fmt.Errorf("verify: node name %q used twice", n.Name)
		}
		nodeNames[n.Name] = true
		for i, v := range n.Inputs {
			if v == nil {
				continue
			}
			if !defined[v] {
				return fmt.Errorf("verify: node %s (%s): input %d %s is not defined before use", n.Name, n.Op, i, v.Name)
			}
		}
		attrs, types, err := InferNode(n.Op, n.Inputs, n.Attrs)
		if err != nil {
			return fmt.Errorf("verify: node %s: %w", n.Name, err)
		}
		if len(attrs) != len(n.Attrs) {
			return fmt.Errorf("verify: node %s (%s): attributes %v are not canonical (want %v)", n.Name, n.Op, n.Attrs.Names(), attrs.Names())
		}
		for k, a := range attrs {
			if !a.Equal(n.Attrs[k]) {
				return fmt.Errorf("verify: node %s (%s): attribute %s is not canonical", n.Name, n.Op, k)
			}
		}
		if len(types) != len(n.Outputs) {
			return fmt.Errorf("verify: node %s (%s): has %d outputs, the op makes %d", n.Name, n.Op, len(n.Outputs), len(types))
		}
		for i, o := range n.Outputs {
			if o == nil || o.Producer != n || o.Kind != Intermediate {
				return fmt.Errorf("verify: node %s (%s): output %d is not owned by the node", n.Name, n.Op, i)
			}
			if defined[o] {
				return fmt.Errorf("verify: node %s (%s): output %s defined twice", n.Name, n.Op, o.Name)
			}
			if err := claim(o.Name, "value "+o.Name); err != nil {
				return err
			}
			if !o.Type.Equal(types[i]) {
				return fmt.Errorf("verify: node %s (%s): output %s declared %v, inferred %v", n.Name, n.Op, o.Name, o.Type, types[i])
			}
			defined[o] = true
		}
	}
	if len(g.Outputs) == 0 {
		return errors.New("verify: graph has no outputs")
	}
	for _, o := range g.Outputs {
		if o == nil || !defined[o] {
			return fmt.Errorf("verify: graph output %v is not defined", o)
		}
	}
	return nil
}
