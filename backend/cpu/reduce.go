package cpu

import (
	"fmt"
	"math"
	"slices"

	"github.com/flashgraph/flashgraph/graph"
)

type redOp uint8

const (
	redSum redOp = iota
	redMean
	redMax
)

// reduceKernel: ReduceSum/Mean/Max over the axes input (opset 18), with
// keepdims and noop_with_empty_axes. Sums accumulate in float64 and round
// once; each output element is reduced by one goroutine in index order.
func reduceKernel(op redOp) kernel {
	return func(n *graph.Node, in, out []*graph.Tensor) error {
		x, y := in[0], out[0]
		axes, err := shapeInts(optIn(in, 1), "axes")
		if err != nil {
			return err
		}
		ax, err := graph.ReduceAxes(x.Shape, axes, n.Attrs.Int("noop_with_empty_axes", 0) != 0)
		if err != nil {
			return err
		}
		if want := graph.ReducedShape(x.Shape, ax, n.Attrs.Int("keepdims", 1) != 0); !want.Equal(y.Shape) {
			return fmt.Errorf("reducing %v over %v gives %v, output is %v", x.Shape, ax, want, y.Shape)
		}
		// Kept dims index the output; reduced dims are walked per output.
		var keptDims, keptStr, redDims, redStr []int
		st := x.Shape.Strides()
		for i, d := range x.Shape {
			if slices.Contains(ax, i) {
				redDims, redStr = append(redDims, d), append(redStr, st[i])
			} else {
				keptDims, keptStr = append(keptDims, d), append(keptStr, st[i])
			}
		}
		switch storageOf(x.DType) {
		case stF32:
			reduce(op, y.F32, x.F32, keptDims, keptStr, redDims, redStr)
		case stF64:
			reduce(op, y.F64, x.F64, keptDims, keptStr, redDims, redStr)
		default:
			return errDType(x.DType)
		}
		return nil
	}
}

func reduce[T float](op redOp, y, x []T, keptDims, keptStr, redDims, redStr []int) {
	count := 1
	for _, d := range redDims {
		count *= d
	}
	parallelFor(len(y), max(1, grain/max(count, 1)), func(lo, hi int) {
		idx := make([]int, len(redDims))
		for o := lo; o < hi; o++ {
			base, rem := 0, o
			for i := len(keptDims) - 1; i >= 0; i-- {
				base += (rem % keptDims[i]) * keptStr[i]
				rem /= keptDims[i]
			}
			clear(idx)
			acc := 0.0
			if op == redMax {
				acc = math.Inf(-1)
			}
			off := base
			for range count {
				v := float64(x[off])
				switch {
				case op != redMax:
					acc += v
				case v > acc || v != v:
					acc = v
				}
				if acc != acc && op == redMax {
					break // NaN is the max of anything
				}
				// Odometer over the reduced dims.
				for i := len(idx) - 1; i >= 0; i-- {
					idx[i]++
					off += redStr[i]
					if idx[i] < redDims[i] {
						break
					}
					off -= idx[i] * redStr[i]
					idx[i] = 0
				}
			}
			if op == redMean {
				acc /= float64(count)
			}
			y[o] = T(acc)
		}
	})
}

// axisSplit views a shape as [outer, n, inner] around axis.
func axisSplit(s graph.Shape, axis int64) (outer, n, inner int, err error) {
	ax, err := graph.NormAxis(int(axis), s.Rank())
	if err != nil {
		return 0, 0, 0, err
	}
	outer, inner = s[:ax].Numel(), s[ax+1:].Numel()
	return outer, s[ax], inner, nil
}

// softmaxKernel: Softmax / LogSoftmax along one axis (opset 13: the axis
// alone, not the flattened tail). The max is subtracted first; arithmetic is
// in the data's type except the denominator, which accumulates in float64.
func softmaxKernel(log bool) kernel {
	return func(n *graph.Node, in, out []*graph.Tensor) error {
		outer, m, inner, err := axisSplit(in[0].Shape, n.Attrs.Int("axis", -1))
		if err != nil {
			return err
		}
		switch storageOf(in[0].DType) {
		case stF32:
			softmax(out[0].F32, in[0].F32, outer, m, inner, log)
		case stF64:
			softmax(out[0].F64, in[0].F64, outer, m, inner, log)
		default:
			return errDType(in[0].DType)
		}
		return nil
	}
}

func softmax[T float](y, x []T, outer, m, inner int, log bool) {
	parallelFor(outer*inner, max(1, grain/max(m, 1)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			base := (r/inner)*m*inner + r%inner
			mx := T(math.Inf(-1))
			for j := range m {
				mx = max(mx, x[base+j*inner])
			}
			if math.IsInf(float64(mx), -1) {
				// Every entry is −Inf (a fully masked row): there is no
				// distribution; NaN, as exp(−Inf − (−Inf)) gives in ONNX.
				mx = 0
			}
			// The shifted exponentials are T values (exp evaluated in
			// float64, rounded once); only their sum is kept in float64.
			var sum float64
			for j := range m {
				i := base + j*inner
				e := T(math.Exp(float64(x[i] - mx)))
				if !log {
					y[i] = e
				}
				sum += float64(e)
			}
			if log {
				ls := T(math.Log(sum))
				for j := range m {
					i := base + j*inner
					y[i] = (x[i] - mx) - ls
				}
			} else {
				s := T(sum)
				for j := range m {
					y[base+j*inner] /= s
				}
			}
		}
	})
}

// softmaxGradKernel: dX = Y·(dY − sum(dY·Y, axis)).
func softmaxGradKernel(n *graph.Node, in, out []*graph.Tensor) error {
	outer, m, inner, err := axisSplit(in[0].Shape, n.Attrs.Int("axis", -1))
	if err != nil {
		return err
	}
	switch storageOf(in[0].DType) {
	case stF32:
		softmaxGrad(out[0].F32, in[0].F32, in[1].F32, outer, m, inner)
	case stF64:
		softmaxGrad(out[0].F64, in[0].F64, in[1].F64, outer, m, inner)
	default:
		return errDType(in[0].DType)
	}
	return nil
}

func softmaxGrad[T float](dx, y, dy []T, outer, m, inner int) {
	parallelFor(outer*inner, max(1, grain/max(m, 1)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			base := (r/inner)*m*inner + r%inner
			var acc float64
			for j := range m {
				i := base + j*inner
				acc += float64(dy[i]) * float64(y[i])
			}
			dot := T(acc)
			for j := range m {
				i := base + j*inner
				dx[i] = y[i] * (dy[i] - dot)
			}
		}
	})
}

// checkLabels refuses labels outside [0, C): the op has no ignore_index, so
// such a label is a data error, not a row to skip.
func checkLabels(labels []int64, c int) error {
	for i, l := range labels {
		if l < 0 || l >= int64(c) {
			return fmt.Errorf("label %d of row %d is out of range [0, %d)", l, i, c)
		}
	}
	return nil
}

// sceLossKernel: mean (or sum) over rows of logsumexp(row) − row[label],
// accumulated in float64.
func sceLossKernel(n *graph.Node, in, out []*graph.Tensor) error {
	s, labels := in[0], in[1].I64
	rows, c := s.Shape[0], s.Shape[1]
	if err := checkLabels(labels, c); err != nil {
		return err
	}
	var total float64
	for r := range rows {
		mx := math.Inf(-1)
		for j := range c {
			mx = max(mx, s.At(r*c+j))
		}
		var sum float64
		for j := range c {
			sum += math.Exp(s.At(r*c+j) - mx)
		}
		total += mx + math.Log(sum) - s.At(r*c+int(labels[r]))
	}
	if n.Attrs.String("reduction", "mean") == "mean" {
		total /= float64(rows)
	}
	out[0].Set(0, total)
	return nil
}

// sceLossGradKernel: dScores = dLoss·(softmax(scores) − onehot(labels)),
// divided by N for the mean reduction.
func sceLossGradKernel(n *graph.Node, in, out []*graph.Tensor) error {
	dl, s, labels := in[0].At(0), in[1], in[2].I64
	rows, c := s.Shape[0], s.Shape[1]
	if len(labels) != rows {
		return fmt.Errorf("labels has %d rows, scores %d", len(labels), rows)
	}
	if err := checkLabels(labels, c); err != nil {
		return err
	}
	switch r := n.Attrs.String("reduction", "mean"); r {
	case "mean":
		dl /= float64(rows)
	case "sum":
	default:
		return fmt.Errorf("reduction %q not supported (mean, sum)", r)
	}
	switch storageOf(s.DType) {
	case stF32:
		sceGrad(out[0].F32, s.F32, labels, rows, c, dl)
	case stF64:
		sceGrad(out[0].F64, s.F64, labels, rows, c, dl)
	default:
		return errDType(s.DType)
	}
	return nil
}

func sceGrad[T float](ds, s []T, labels []int64, rows, c int, dl float64) {
	f := T(dl)
	parallelFor(rows, max(1, grain/max(c, 1)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			row, drow := s[r*c:(r+1)*c], ds[r*c:(r+1)*c]
			mx := T(math.Inf(-1))
			for _, v := range row {
				mx = max(mx, v)
			}
			var sum float64
			for j, v := range row {
				e := T(math.Exp(float64(v - mx)))
				drow[j] = e
				sum += float64(e)
			}
			inv := 1 / T(sum)
			for j := range drow {
				p := drow[j] * inv
				if j == int(labels[r]) {
					p--
				}
				drow[j] = f * p
			}
		}
	})
}
