package graph

import (
	"fmt"
	"slices"
	"strings"
)

// Einsum: the sum over the labels the output does not keep of the product
// of the operands, each indexed by its labels (numpy's einsum; "..." stands
// for the same leading dims in every operand that has it; a label repeated
// within one operand takes its diagonal).

func init() {
	register(&OpSpec{
		Name: "Einsum", Doc: "sum of products of the operands over the labels the equation's output drops",
		Inputs: []string{"Inputs..."}, Outputs: []string{"Output"}, Eval: evalEinsum,
		Attrs: []AttrSpec{{Name: "equation", Kind: AttrString, Required: true}},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			shapes := make([]Shape, len(in))
			for i, t := range in {
				if !t.DType.IsFloat() || t.DType != in[0].DType {
					return nil, fmt.Errorf("operands must share a float type, got %v and %v", in[0].DType, t.DType)
				}
				shapes[i] = t.Shape
			}
			e, err := parseEinsum(a.String("equation", ""), shapes)
			if err != nil {
				return nil, err
			}
			return []TensorType{{in[0].DType, e.outShape()}}, nil
		},
	})
}

// einsum is a parsed equation: each operand's labels, the output's, and
// each label's size.
type einsum struct {
	ins  [][]rune
	out  []rune
	size map[rune]int
}

func (e *einsum) outShape() Shape {
	s := make(Shape, len(e.out))
	for i, l := range e.out {
		s[i] = e.size[l]
	}
	return s
}

// ellipsisLabel names dim i of the ellipsis (runes no equation letter uses).
func ellipsisLabel(i int) rune { return rune(0x10000 + i) }

func parseEinsum(eq string, shapes []Shape) (*einsum, error) {
	eq = strings.ReplaceAll(eq, " ", "")
	lhs, rhs, explicit := strings.Cut(eq, "->")
	terms := strings.Split(lhs, ",")
	if len(terms) != len(shapes) {
		return nil, fmt.Errorf("equation %q has %d operands, got %d", eq, len(terms), len(shapes))
	}
	e := &einsum{size: map[rune]int{}}
	ell := -1 // the ellipsis rank, -1 if no operand has one
	expand := func(term string, rank int) ([]rune, error) {
		before, after, has := strings.Cut(term, "...")
		letters := []rune(before + after)
		for _, r := range letters {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
				return nil, fmt.Errorf("equation %q: bad label %q", eq, r)
			}
		}
		if !has {
			if rank >= 0 && len(letters) != rank {
				return nil, fmt.Errorf("equation %q: term %q for an operand of rank %d", eq, term, rank)
			}
			return letters, nil
		}
		n := rank - len(letters)
		if rank < 0 {
			n = max(ell, 0)
		}
		if n < 0 {
			return nil, fmt.Errorf("equation %q: term %q for an operand of rank %d", eq, term, rank)
		}
		if rank >= 0 {
			if ell >= 0 && ell != n {
				return nil, fmt.Errorf("equation %q: the ellipsis covers %d dims and %d", eq, ell, n)
			}
			ell = n
		}
		out := []rune(before)
		for i := range n {
			out = append(out, ellipsisLabel(i))
		}
		return append(out, []rune(after)...), nil
	}
	count := map[rune]int{}
	for i, term := range terms {
		labels, err := expand(term, shapes[i].Rank())
		if err != nil {
			return nil, err
		}
		for k, l := range labels {
			d := shapes[i][k]
			if s, ok := e.size[l]; ok && s != d {
				return nil, fmt.Errorf("equation %q: label %q is %d and %d", eq, l, s, d)
			}
			e.size[l] = d
			count[l]++
		}
		e.ins = append(e.ins, labels)
	}
	if explicit {
		out, err := expand(rhs, -1)
		if err != nil {
			return nil, err
		}
		for i, l := range out {
			if _, ok := e.size[l]; !ok || slices.Contains(out[i+1:], l) {
				return nil, fmt.Errorf("equation %q: output label %q is not an input label once", eq, l)
			}
		}
		e.out = out
	} else {
		for i := range max(ell, 0) {
			e.out = append(e.out, ellipsisLabel(i))
		}
		var once []rune
		for l, n := range count {
			if n == 1 && l < 0x10000 {
				once = append(once, l)
			}
		}
		slices.Sort(once)
		e.out = append(e.out, once...)
	}
	return e, nil
}

func evalEinsum(in []*Tensor, a Attrs, out []*Tensor) error {
	shapes := make([]Shape, len(in))
	for i, t := range in {
		shapes[i] = t.Shape
	}
	plan, err := ParseEinsum(a.String("equation", ""), shapes)
	if err != nil {
		return err
	}
	e := &einsum{ins: plan.Ins, out: plan.Out, size: plan.Size}
	summed := plan.Summed
	sumShape := make(Shape, len(summed))
	for i, l := range summed {
		sumShape[i] = e.size[l]
	}
	val := map[rune]int{}
	oi := make([]int, len(e.out))
	si := make([]int, len(summed))
	pos := make([][]int, len(in))
	for k := range in {
		pos[k] = make([]int, len(e.ins[k]))
	}
	oshape := e.outShape()
	for p := range out[0].Len() {
		unravel(p, oshape, oi)
		for i, l := range e.out {
			val[l] = oi[i]
		}
		var s float64
		for q := range sumShape.Numel() {
			unravel(q, sumShape, si)
			for i, l := range summed {
				val[l] = si[i]
			}
			prod := 1.0
			for k, t := range in {
				for j, l := range e.ins[k] {
					pos[k][j] = val[l]
				}
				prod *= t.At(ravel(pos[k], t.Shape))
			}
			s += prod
		}
		out[0].Set(p, s)
	}
	return nil
}

// EinsumPlan is a parsed equation for a backend that computes Einsum
// itself: each operand's labels, the output's, the summed labels in the
// order evalEinsum runs through them (sorted), and each label's size.
type EinsumPlan struct {
	Ins    [][]rune
	Out    []rune
	Summed []rune
	Size   map[rune]int
}

// ParseEinsum parses equation eq for operands of the given shapes.
func ParseEinsum(eq string, shapes []Shape) (*EinsumPlan, error) {
	e, err := parseEinsum(eq, shapes)
	if err != nil {
		return nil, err
	}
	var summed []rune
	for l := range e.size {
		if !slices.Contains(e.out, l) {
			summed = append(summed, l)
		}
	}
	slices.Sort(summed)
	return &EinsumPlan{Ins: e.ins, Out: e.out, Summed: summed, Size: e.size}, nil
}
