package cpu

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
)

// stridedCopy writes out (row-major, shape dims) from src read at offset
// off with per-dim strides: the one loop behind Transpose (permuted
// strides), Slice (offset start, strides times steps) and Expand (stride 0
// on broadcast dims).
func stridedCopy(out, src *graph.Tensor, dims, strides []int, off int) error {
	switch storageOf(out.DType) {
	case stF32:
		strided(out.F32, src.F32, dims, strides, off)
	case stF64:
		strided(out.F64, src.F64, dims, strides, off)
	case stI64:
		strided(out.I64, src.I64, dims, strides, off)
	case stBool:
		strided(out.B, src.B, dims, strides, off)
	default:
		return errDType(out.DType)
	}
	return nil
}

func strided[T any](dst, src []T, dims, strides []int, off int) {
	n := len(dst)
	if n == 0 {
		return
	}
	if len(dims) == 0 {
		dst[0] = src[off]
		return
	}
	r := len(dims)
	last, ls := dims[r-1], strides[r-1]
	rows := n / last
	parallelFor(rows, max(1, grain/max(last, 1)), func(lo, hi int) {
		for row := lo; row < hi; row++ {
			o, rem := off, row
			for i := r - 2; i >= 0; i-- {
				o += (rem % dims[i]) * strides[i]
				rem /= dims[i]
			}
			d := dst[row*last : (row+1)*last]
			if ls == 1 {
				copy(d, src[o:o+last])
				continue
			}
			for j := range d {
				d[j] = src[o]
				o += ls
			}
		}
	})
}

// transposeKernel: out[i0..] = in[i_perm...].
func transposeKernel(n *graph.Node, in, out []*graph.Tensor) error {
	x := in[0]
	perm, err := graph.TransposePerm(n.Attrs, x.Shape.Rank())
	if err != nil {
		return err
	}
	st := x.Shape.Strides()
	dims := make([]int, len(perm))
	strides := make([]int, len(perm))
	for i, p := range perm {
		dims[i], strides[i] = x.Shape[p], st[p]
	}
	return stridedCopy(out[0], x, dims, strides, 0)
}

// sliceKernel: ONNX Slice with negative and clamped starts/ends, any axes,
// positive or negative steps.
func sliceKernel(n *graph.Node, in, out []*graph.Tensor) error {
	x := in[0]
	var ops [4][]int
	for i, what := range []string{"starts", "ends", "axes", "steps"} {
		v, err := shapeInts(optIn(in, i+1), what)
		if err != nil {
			return err
		}
		ops[i] = v
	}
	sp, shape, err := graph.ResolveSlice(x.Shape, ops[0], ops[1], ops[2], ops[3])
	if err != nil {
		return err
	}
	if !shape.Equal(out[0].Shape) {
		return fmt.Errorf("slice of %v gives %v, output is %v", x.Shape, shape, out[0].Shape)
	}
	st := x.Shape.Strides()
	strides := make([]int, len(st))
	off := 0
	for i := range st {
		if shape[i] > 0 {
			off += sp.Start[i] * st[i]
		}
		strides[i] = st[i] * sp.Step[i]
	}
	return stridedCopy(out[0], x, shape, strides, off)
}

// expandKernel broadcasts the input to the output shape.
func expandKernel(n *graph.Node, in, out []*graph.Tensor) error {
	x, y := in[0], out[0]
	r := y.Shape.Rank()
	strides := make([]int, r)
	st := x.Shape.Strides()
	for i := range x.Shape {
		oi := r - x.Shape.Rank() + i
		if x.Shape[i] != 1 {
			strides[oi] = st[i]
		}
	}
	return stridedCopy(y, x, y.Shape, strides, 0)
}

// concatKernel joins inputs along axis: per outer index, each input's
// contiguous block in turn.
func concatKernel(n *graph.Node, in, out []*graph.Tensor) error {
	y := out[0]
	ax, err := graph.NormAxis(int(n.Attrs.Int("axis", 0)), y.Shape.Rank())
	if err != nil {
		return err
	}
	outer, inner := y.Shape[:ax].Numel(), y.Shape[ax+1:].Numel()
	at := 0
	for _, x := range in {
		blk := x.Shape[ax] * inner
		row := y.Shape[ax] * inner
		for o := range outer {
			dst, src := o*row+at, o*blk
			copy(y.F32[min(dst, len(y.F32)):], sliceOr(x.F32, src, blk))
			copy(y.F64[min(dst, len(y.F64)):], sliceOr(x.F64, src, blk))
			copy(y.I64[min(dst, len(y.I64)):], sliceOr(x.I64, src, blk))
			copy(y.B[min(dst, len(y.B)):], sliceOr(x.B, src, blk))
		}
		at += blk
	}
	return nil
}

// sliceOr is s[off:off+n], or nil for the slices a dtype does not use.
func sliceOr[T any](s []T, off, n int) []T {
	if s == nil {
		return nil
	}
	return s[off : off+n]
}

// gatherKernel: out[pre, idx..., post] = data[pre, indices[idx...], post].
// Negative indices count from the end; out-of-range ones are an error.
func gatherKernel(n *graph.Node, in, out []*graph.Tensor) error {
	x, idx, y := in[0], in[1].I64, out[0]
	ax, err := graph.NormAxis(int(n.Attrs.Int("axis", 0)), x.Shape.Rank())
	if err != nil {
		return err
	}
	outer, dim, inner := x.Shape[:ax].Numel(), x.Shape[ax], x.Shape[ax+1:].Numel()
	pos, err := resolveIndices(idx, dim)
	if err != nil {
		return err
	}
	switch storageOf(x.DType) {
	case stF32:
		gather(y.F32, x.F32, pos, outer, dim, inner)
	case stF64:
		gather(y.F64, x.F64, pos, outer, dim, inner)
	case stI64:
		gather(y.I64, x.I64, pos, outer, dim, inner)
	case stBool:
		gather(y.B, x.B, pos, outer, dim, inner)
	default:
		return errDType(x.DType)
	}
	return nil
}

func resolveIndices(idx []int64, dim int) ([]int, error) {
	pos := make([]int, len(idx))
	for i, v := range idx {
		if v < -int64(dim) || v >= int64(dim) {
			return nil, fmt.Errorf("index %d (at %d) is out of range for axis of size %d", v, i, dim)
		}
		if v < 0 {
			v += int64(dim)
		}
		pos[i] = int(v)
	}
	return pos, nil
}

func gather[T any](y, x []T, pos []int, outer, dim, inner int) {
	ni := len(pos)
	parallelFor(outer*ni, max(1, grain/max(inner, 1)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			o, i := r/ni, r%ni
			copy(y[r*inner:(r+1)*inner], x[(o*dim+pos[i])*inner:(o*dim+pos[i]+1)*inner])
		}
	})
}

// gatherGradKernel is Gather's adjoint: zeros of the data shape with dY's
// slices added at their indices. Repeated indices accumulate, in index
// order, so the result is deterministic; each outer slice is independent.
func gatherGradKernel(n *graph.Node, in, out []*graph.Tensor) error {
	dy, idx, dx := in[0], in[1].I64, out[0]
	ax, err := graph.NormAxis(int(n.Attrs.Int("axis", 0)), dx.Shape.Rank())
	if err != nil {
		return err
	}
	outer, dim, inner := dx.Shape[:ax].Numel(), dx.Shape[ax], dx.Shape[ax+1:].Numel()
	pos, err := resolveIndices(idx, dim)
	if err != nil {
		return err
	}
	switch storageOf(dx.DType) {
	case stF32:
		scatterAdd(dx.F32, dy.F32, pos, outer, dim, inner)
	case stF64:
		scatterAdd(dx.F64, dy.F64, pos, outer, dim, inner)
	default:
		return errDType(dx.DType)
	}
	return nil
}

func scatterAdd[T float](dx, dy []T, pos []int, outer, dim, inner int) {
	ni := len(pos)
	parallelFor(outer, max(1, grain/max(ni*inner, 1)), func(lo, hi int) {
		for o := lo; o < hi; o++ {
			clear(dx[o*dim*inner : (o+1)*dim*inner])
			for i, p := range pos {
				d := dx[(o*dim+p)*inner : (o*dim+p+1)*inner]
				s := dy[(o*ni+i)*inner : (o*ni+i+1)*inner]
				for j := range d {
					d[j] += s[j]
				}
			}
		}
	})
}

// triluKernel keeps the upper (j − i >= k) or lower (j − i <= k) triangle of
// each matrix of the last two axes and zeroes the rest, for any dtype.
func triluKernel(n *graph.Node, in, out []*graph.Tensor) error {
	x, y := in[0], out[0]
	k := 0
	if kt := optIn(in, 1); kt != nil {
		ks, err := shapeInts(kt, "k")
		if err != nil {
			return err
		}
		if len(ks) != 1 {
			return fmt.Errorf("k must hold one value, got %d", len(ks))
		}
		k = ks[0]
	}
	upper := n.Attrs.Int("upper", 1) != 0
	r := x.Shape.Rank()
	rows, cols := x.Shape[r-2], x.Shape[r-1]
	keep := func(i, j int) bool {
		if upper {
			return j-i >= k
		}
		return j-i <= k
	}
	switch storageOf(x.DType) {
	case stF32:
		trilu(y.F32, x.F32, rows, cols, keep)
	case stF64:
		trilu(y.F64, x.F64, rows, cols, keep)
	case stI64:
		trilu(y.I64, x.I64, rows, cols, keep)
	case stBool:
		trilu(y.B, x.B, rows, cols, keep)
	default:
		return errDType(x.DType)
	}
	return nil
}

func trilu[T any](y, x []T, rows, cols int, keep func(i, j int) bool) {
	var zero T
	for at := range y {
		j := at % cols
		i := (at / cols) % rows
		if keep(i, j) {
			y[at] = x[at]
		} else {
			y[at] = zero
		}
	}
}
