package cpu

import (
	"fmt"
	"sync"

	"github.com/flashgraph/flashgraph/graph"
)

// fusedRows runs a body with a row reduction (over the last axis, keepdims)
// or with index steps on the last axis over chunks of whole rows: every
// step and input is seen as [rows, last] (last = its own last dimension, 1
// for a reduced value), so the elementwise steps broadcast as they would on
// whole tensors, a Slice or Concat moves values within each row, and the
// reduction sums each row in the order the whole-tensor kernel does. The
// result is the same bit for bit, and no step is materialised at full size.
// It reports false, doing nothing, when the body does not have that form.
func fusedRows(n *graph.Node, steps []graph.FusedStep, types []graph.TensorType, outIdx []int64, in, out []*graph.Tensor) (bool, error) {
	if len(out) == 0 {
		return false, nil
	}
	// A Transpose of a step that keeps the last axis and that only the
	// outputs read writes that step's rows to the output at permuted
	// offsets: the body walks the rows of the step it transposes.
	written := make([]bool, len(steps))
	readBy := make([]int, len(steps))
	for _, s := range steps {
		for _, a := range s.Args {
			if a.Step {
				readBy[a.Index]++
			}
		}
	}
	full := out[0].Shape
	for k, s := range steps {
		if s.Op == "Transpose" && s.Args[0].Step && readBy[k] == 0 {
			written[k] = true
			full = types[s.Args[0].Index].Shape
		}
	}
	for _, s := range steps {
		if graph.FusibleReduce[s.Op] {
			a := s.Args[0]
			full = types[a.Index].Shape
			if !a.Step {
				full = in[a.Index].Shape
			}
		}
	}
	r := full.Rank()
	if r < 1 {
		return false, nil
	}
	lead := full[:r-1]
	if axes := n.Attrs["axes"].Ints; len(axes) > 0 && (len(axes) != 1 || (axes[0] != -1 && axes[0] != int64(r-1)) || n.Attrs.Int("keepdims", 1) == 0) {
		return false, nil
	}
	// lastOf is a shape's last dimension when its leading ones are lead's.
	lastOf := func(s graph.Shape) (int, bool) {
		if s.Rank() != r || !s[:r-1].Equal(lead) {
			return 0, false
		}
		return s[r-1], true
	}
	stepLast := make([]int, len(steps))
	maxLast := 1
	// A Transpose of an input that keeps the last axis in place is that
	// input's rows gathered in another order (row strides permuted); other
	// Transposes move values between rows.
	transposed := make([][]int, len(steps)) // step -> the input's row strides
	scattered := make([][]int, len(steps))  // step -> the output's row strides
	for k, s := range steps {
		if written[k] {
			if scattered[k] = scatteredRowStrides(s, types[k].Shape, types[s.Args[0].Index].Shape, lead); scattered[k] == nil {
				return false, nil
			}
			stepLast[k] = full[r-1]
			continue
		}
		if s.Op == "Transpose" {
			if transposed[k] = transposedRowStrides(s, in); transposed[k] == nil {
				return false, nil
			}
		} else if _, index := graph.FusibleIndex[s.Op]; index && s.Params[0] != int64(r-1) && s.Params[0] != -1 {
			return false, nil
		}
		l, ok := lastOf(types[k].Shape)
		if !ok {
			return false, nil
		}
		stepLast[k] = l
		maxLast = max(maxLast, l)
	}
	// Inputs read only through Transposes are gathered by those steps.
	viaTranspose := make([]bool, len(in))
	for k := range steps {
		if transposed[k] != nil {
			viaTranspose[steps[k].Args[0].Index] = true
		}
	}
	for k, s := range steps {
		for _, a := range s.Args {
			if !a.Step && transposed[k] == nil {
				viaTranspose[a.Index] = false
			}
		}
	}
	// Other inputs, padded to rank r, broadcast over the leading axes.
	inLast := make([]int, len(in))
	inStr := make([][]int, len(in))
	inFull := make([]bool, len(in))
	for i, t := range in {
		if viaTranspose[i] {
			continue
		}
		if t.Shape.Rank() > r {
			return false, nil
		}
		p := make(graph.Shape, r)
		for j := range p {
			p[j] = 1
		}
		copy(p[r-t.Shape.Rank():], t.Shape)
		for j := range r - 1 {
			if p[j] != 1 && p[j] != lead[j] {
				return false, nil
			}
		}
		inLast[i] = p[r-1]
		inFull[i] = p[:r-1].Equal(lead)
		inStr[i] = broadcastStrides(p[:r-1], lead)
		for j := range inStr[i] {
			inStr[i][j] *= inLast[i]
		}
		maxLast = max(maxLast, inLast[i])
	}
	outOf, err := outputSlots(outIdx, len(steps))
	if err != nil {
		return false, err
	}
	// Each step's operands and attributes, on [rows, last] tensors.
	stepNodes := make([]*graph.Node, len(steps))
	extras := make([][]*graph.Tensor, len(steps))
	for k, s := range steps {
		stepNodes[k] = n
		switch {
		case graph.FusibleReduce[s.Op]:
			stepNodes[k] = &graph.Node{Name: n.Name, Op: s.Op, Attrs: graph.Attrs{"keepdims": graph.Int(1)}}
			extras[k] = []*graph.Tensor{ints64(-1)}
		case s.Op == "Slice":
			extras[k] = []*graph.Tensor{ints64(s.Params[1]), ints64(s.Params[2]), ints64(-1)}
		case s.Op == "Concat":
			stepNodes[k] = &graph.Node{Name: n.Name, Op: s.Op, Attrs: graph.Attrs{"axis": graph.Int(-1)}}
		case s.Attrs != nil: // an elementwise step with attributes of its own
			stepNodes[k] = &graph.Node{Name: n.Name, Op: s.Op, Attrs: s.Attrs}
		}
	}
	rows := lead.Numel()
	chunkRows := max(1, fusedChunk/maxLast)
	nChunks := (rows + chunkRows - 1) / chunkRows
	var firstErr error
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	parallelFor(nChunks, 1, func(c0, c1 int) {
		scratch := make([]*graph.Tensor, len(steps))
		gathered := make([]*graph.Tensor, len(in))
		for c := c0; c < c1; c++ {
			r0 := c * chunkRows
			m := min(chunkRows, rows-r0)
			rowsOf := func(t *graph.Tensor, last int) *graph.Tensor {
				v := sliceView(t, r0*last, m*last)
				v.Shape = graph.Shape{m, last}
				return v
			}
			ins := make([]*graph.Tensor, len(in))
			for i, t := range in {
				switch {
				case viaTranspose[i]:
				case t.Len() == 1:
					ins[i] = &graph.Tensor{DType: t.DType, Shape: graph.Shape{}, F32: t.F32, F64: t.F64, I64: t.I64, B: t.B}
				case inFull[i]:
					ins[i] = rowsOf(t, inLast[i])
				default:
					if gathered[i] == nil || gathered[i].Len() != m*inLast[i] {
						gathered[i] = graph.NewTensor(t.DType, graph.Shape{m, inLast[i]})
					}
					gatherRows(gathered[i], t, inStr[i], lead, r0, m, inLast[i])
					ins[i] = gathered[i]
				}
			}
			res := make([]*graph.Tensor, len(steps))
			for k, s := range steps {
				if scattered[k] != nil {
					for slot, o := range outIdx {
						if o == int64(k) {
							scatterRows(out[slot], res[s.Args[0].Index], scattered[k], lead, r0, m, stepLast[k])
						}
					}
					continue
				}
				if transposed[k] != nil {
					var t *graph.Tensor
					if o, ok := outOf[int64(k)]; ok {
						t = rowsOf(out[o], stepLast[k])
					} else {
						if scratch[k] == nil || scratch[k].Len() != m*stepLast[k] {
							scratch[k] = graph.NewTensor(types[k].DType, graph.Shape{m, stepLast[k]})
						}
						t = scratch[k]
					}
					gatherRows(t, in[s.Args[0].Index], transposed[k], lead, r0, m, stepLast[k])
					res[k] = t
					continue
				}
				args := make([]*graph.Tensor, 0, len(s.Args)+3)
				for _, op := range s.Args {
					if op.Step {
						args = append(args, res[op.Index])
					} else {
						args = append(args, ins[op.Index])
					}
				}
				var t *graph.Tensor
				if o, ok := outOf[int64(k)]; ok {
					t = rowsOf(out[o], stepLast[k])
				} else {
					if scratch[k] == nil || scratch[k].Len() != m*stepLast[k] {
						scratch[k] = graph.NewTensor(types[k].DType, graph.Shape{m, stepLast[k]})
					}
					t = scratch[k]
				}
				if err := kernels[s.Op](stepNodes[k], append(args, extras[k]...), []*graph.Tensor{t}); err != nil {
					fail(fmt.Errorf("step %d (%s): %w", k, s.Op, err))
					return
				}
				roundNarrow(t)
				res[k] = t
			}
			for k, o := range outIdx {
				if outOf[o] != k && scattered[o] == nil {
					copyTensor(rowsOf(out[k], stepLast[o]), res[o])
				}
			}
		}
	})
	return true, firstErr
}

// transposedRowStrides returns, for a Transpose step of an input that keeps
// the last axis in place, the input's element offset per leading axis of the
// step's result (nil when the step is not of that form).
func transposedRowStrides(s graph.FusedStep, in []*graph.Tensor) []int {
	a := s.Args[0]
	if a.Step {
		return nil
	}
	shape := in[a.Index].Shape
	r := shape.Rank()
	if r < 1 || len(s.Params) != r || s.Params[r-1] != int64(r-1) {
		return nil
	}
	st := shape.Strides()
	rows := make([]int, r-1)
	for j := range rows {
		p := s.Params[j]
		if p < 0 || p >= int64(r) {
			return nil
		}
		rows[j] = st[p]
	}
	return rows
}

// scatteredRowStrides returns, for a Transpose step (result shape out) of
// a step of shape x whose leading axes are lead that keeps the last axis in
// place, the result's element offset per leading axis of x (nil when the
// step is not of that form).
func scatteredRowStrides(s graph.FusedStep, out, x, lead graph.Shape) []int {
	r := x.Rank()
	if r < 1 || len(s.Params) != r || s.Params[r-1] != int64(r-1) || !x[:r-1].Equal(lead) {
		return nil
	}
	st := out.Strides()
	// Result axis i is x's axis perm[i]: x's axis perm[i] steps st[i].
	rows := make([]int, r-1)
	for i := range r - 1 {
		p := s.Params[i]
		if p < 0 || p >= int64(r-1) {
			return nil
		}
		rows[p] = st[i]
	}
	return rows
}

// scatterRows writes rows [r0, r0+m) of src [m, last], one per leading
// index of lead, to dst at the element offsets rowStrides give per leading
// axis: the inverse of gatherRows.
func scatterRows(dst, src *graph.Tensor, rowStrides []int, lead graph.Shape, r0, m, last int) {
	walkRows(rowStrides, lead, r0, m, func(row, off int) { copyElems(dst, off, src, row*last, last) })
}

func ints64(v ...int64) *graph.Tensor {
	t := graph.NewTensor(graph.Int64, graph.Shape{len(v)})
	copy(t.I64, v)
	return t
}

// gatherRows copies rows [r0, r0+m) of src, broadcast over the leading
// axes lead (rowStrides: element offset of each leading index), into dst
// [m, last].
func gatherRows(dst, src *graph.Tensor, rowStrides []int, lead graph.Shape, r0, m, last int) {
	walkRows(rowStrides, lead, r0, m, func(row, off int) { copyElems(dst, row*last, src, off, last) })
}

// walkRows calls f for rows [r0, r0+m) of the leading shape lead, in order,
// with the row's index from r0 and its element offset (the sum of its
// leading indices times rowStrides).
func walkRows(rowStrides []int, lead graph.Shape, r0, m int, f func(row, off int)) {
	idx := make([]int, lead.Rank())
	rem := r0
	for d := lead.Rank() - 1; d >= 0; d-- {
		idx[d] = rem % lead[d]
		rem /= lead[d]
	}
	off := 0
	for d, i := range idx {
		off += i * rowStrides[d]
	}
	for row := range m {
		f(row, off)
		for d := lead.Rank() - 1; d >= 0; d-- {
			idx[d]++
			off += rowStrides[d]
			if idx[d] < lead[d] {
				break
			}
			off -= idx[d] * rowStrides[d]
			idx[d] = 0
		}
	}
}

// copyElems copies n elements of src from sOff to dst at dOff (one dtype).
func copyElems(dst *graph.Tensor, dOff int, src *graph.Tensor, sOff, n int) {
	switch {
	case dst.F32 != nil:
		copy(dst.F32[dOff:dOff+n], src.F32[sOff:sOff+n])
	case dst.F64 != nil:
		copy(dst.F64[dOff:dOff+n], src.F64[sOff:sOff+n])
	case dst.I64 != nil:
		copy(dst.I64[dOff:dOff+n], src.I64[sOff:sOff+n])
	case dst.B != nil:
		copy(dst.B[dOff:dOff+n], src.B[sOff:sOff+n])
	}
}
