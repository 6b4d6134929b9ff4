package cpu

import (
	"fmt"
	"math"
	"sync"

	"github.com/flashgraph/flashgraph/graph"
)

// Elementwise kernels come from the op table's expressions (graph.Expr): an
// op's expression is compiled once into a program of block loops, one per
// primitive, that runs over blocks of exprBlock elements held in float64.
// Every op is then float64 arithmetic rounded once to the output's storage,
// which is what its definition (graph.MapFunc) computes; for + − × ÷ and √
// of float32 operands that is also bit for bit float32 arithmetic.
//
// Int64 and bool data (shape arithmetic, masks) run the op table's int64
// form element by element: it is rare and small.

// exprBlock is how many elements one pass of a program covers: a few KiB
// per intermediate, so they stay in L1.
const exprBlock = 512

// exprProg is a compiled expression: instructions in dependency order over
// numbered slots (the operands first, then one per instruction), with
// common subexpressions computed once.
type exprProg struct {
	nIn    int
	code   []exprInstr
	result int // slot of the value
	// direct, when set, is the one primitive of an expression p(x0, x1,
	// ...) that is exact in the storage type (+ − × ÷, negation, select):
	// it runs as a typed loop without the float64 staging.
	direct graph.Prim
	// frames keeps frames between runs: a fused body calls its steps'
	// kernels once per chunk, and a frame is several KiB per slot.
	frames sync.Pool
}

type exprInstr struct {
	prim  graph.Prim
	konst float64
	args  []int
}

// compileExpr builds e's program over nIn operands.
func compileExpr(e *graph.Expr, nIn int) *exprProg {
	p := &exprProg{nIn: nIn}
	seen := map[string]int{}
	var slot func(e *graph.Expr) int
	slot = func(e *graph.Expr) int {
		if e.Prim == graph.PrimVar {
			return e.Var
		}
		key := e.String()
		if s, ok := seen[key]; ok {
			return s
		}
		in := exprInstr{prim: e.Prim, konst: e.Const}
		for _, a := range e.Args {
			in.args = append(in.args, slot(a))
		}
		p.code = append(p.code, in)
		s := nIn + len(p.code) - 1
		seen[key] = s
		return s
	}
	p.result = slot(e)
	onVars := true
	for i, a := range e.Args {
		onVars = onVars && a.Prim == graph.PrimVar && a.Var == i
	}
	switch e.Prim {
	case graph.PrimAdd, graph.PrimSub, graph.PrimMul, graph.PrimDiv, graph.PrimNeg, graph.PrimSelect:
		if onVars {
			p.direct = e.Prim
		}
	}
	return p
}

// exprFrame is one goroutine's state for running a program: a block buffer
// per slot and one closure per instruction bound to them.
type exprFrame struct {
	slots [][]float64
	run   []func(n int)
}

func (p *exprProg) newFrame() *exprFrame {
	f := &exprFrame{slots: make([][]float64, p.nIn+len(p.code))}
	for i := range f.slots {
		f.slots[i] = make([]float64, exprBlock)
	}
	for k, in := range p.code {
		dst := f.slots[p.nIn+k]
		args := make([][]float64, len(in.args))
		for j, a := range in.args {
			args[j] = f.slots[a]
		}
		if in.prim == graph.PrimConst {
			for i := range dst {
				dst[i] = in.konst
			}
			continue // filled once: no instruction to run
		}
		f.run = append(f.run, blockLoop(in.prim, dst, args))
	}
	return f
}

// blockLoop is one primitive over the first n elements of its operands'
// blocks. Each primitive is its own loop, so the primitive is chosen once
// per block rather than per element.
func blockLoop(p graph.Prim, d []float64, x [][]float64) func(n int) {
	var a, b, c []float64
	a = x[0]
	if len(x) > 1 {
		b = x[1]
	}
	if len(x) > 2 {
		c = x[2]
	}
	unary := func(f func(float64) float64) func(n int) {
		return func(n int) {
			for i, v := range a[:n] {
				d[i] = f(v)
			}
		}
	}
	switch p {
	case graph.PrimAdd:
		return func(n int) {
			for i := range d[:n] {
				d[i] = a[i] + b[i]
			}
		}
	case graph.PrimSub:
		return func(n int) {
			for i := range d[:n] {
				d[i] = a[i] - b[i]
			}
		}
	case graph.PrimMul:
		return func(n int) {
			for i := range d[:n] {
				d[i] = a[i] * b[i]
			}
		}
	case graph.PrimDiv:
		return func(n int) {
			for i := range d[:n] {
				d[i] = a[i] / b[i]
			}
		}
	case graph.PrimPow:
		return func(n int) {
			for i := range d[:n] {
				d[i] = math.Pow(a[i], b[i])
			}
		}
	case graph.PrimNeg:
		return func(n int) {
			for i, v := range a[:n] {
				d[i] = -v
			}
		}
	case graph.PrimAbs:
		return unary(math.Abs)
	case graph.PrimExp:
		return unary(math.Exp)
	case graph.PrimLog:
		return unary(math.Log)
	case graph.PrimLog1p:
		return unary(math.Log1p)
	case graph.PrimSqrt:
		return unary(math.Sqrt)
	case graph.PrimTanh:
		return unary(math.Tanh)
	case graph.PrimSigmoid:
		return unary(graph.Sigmoid)
	case graph.PrimErf:
		return unary(math.Erf)
	case graph.PrimMax:
		return func(n int) {
			for i := range d[:n] {
				d[i] = math.Max(a[i], b[i])
			}
		}
	case graph.PrimGreater:
		return func(n int) {
			for i := range d[:n] {
				d[i] = b2f(a[i] > b[i])
			}
		}
	case graph.PrimEqual:
		return func(n int) {
			for i := range d[:n] {
				d[i] = b2f(a[i] == b[i])
			}
		}
	case graph.PrimSelect:
		return func(n int) {
			for i := range d[:n] {
				if a[i] != 0 {
					d[i] = b[i]
				} else {
					d[i] = c[i]
				}
			}
		}
	case graph.PrimMin:
		return func(n int) {
			for i := range d[:n] {
				d[i] = math.Min(a[i], b[i])
			}
		}
	case graph.PrimFmod:
		return func(n int) {
			for i := range d[:n] {
				d[i] = math.Mod(a[i], b[i])
			}
		}
	case graph.PrimFloor:
		return unary(math.Floor)
	case graph.PrimCeil:
		return unary(math.Ceil)
	case graph.PrimRound:
		return unary(math.RoundToEven)
	case graph.PrimIsNaN:
		return unary(func(v float64) float64 { return b2f(math.IsNaN(v)) })
	case graph.PrimIsInf:
		return unary(func(v float64) float64 { return b2f(math.IsInf(v, 0)) })
	case graph.PrimSin:
		return unary(math.Sin)
	case graph.PrimCos:
		return unary(math.Cos)
	case graph.PrimTan:
		return unary(math.Tan)
	case graph.PrimAsin:
		return unary(math.Asin)
	case graph.PrimAcos:
		return unary(math.Acos)
	case graph.PrimAtan:
		return unary(math.Atan)
	case graph.PrimSinh:
		return unary(math.Sinh)
	case graph.PrimCosh:
		return unary(math.Cosh)
	case graph.PrimAsinh:
		return unary(math.Asinh)
	case graph.PrimAcosh:
		return unary(math.Acosh)
	case graph.PrimAtanh:
		return unary(math.Atanh)
	}
	// Every primitive has a loop above; TestExprKernelsCoverPrims checks.
	panic(fmt.Sprintf("cpu: no block loop for primitive %v", p))
}

// exprKernel is the CPU kernel of an op defined by an expression. An op
// whose expression reads attributes compiles it at each node's values
// (graph.OpSpec.ExprFor), once per set of values.
func exprKernel(op string) kernel {
	spec, ok := graph.LookupOp(op)
	if !ok || spec.Expr == nil {
		return func(*graph.Node, []*graph.Tensor, []*graph.Tensor) error {
			return fmt.Errorf("%s has no expression in the op table", op)
		}
	}
	if !spec.HasExprAttrs() {
		return exprKernelOf(spec, compileExpr(spec.Expr, len(spec.Inputs)), spec.Map)
	}
	var bound sync.Map // attribute key -> kernel
	return func(n *graph.Node, in, out []*graph.Tensor) error {
		_, key, err := spec.ExprAttrValues(n.Attrs)
		if err != nil {
			return err
		}
		k, ok := bound.Load(key)
		if !ok {
			e, err := spec.ExprFor(n.Attrs)
			if err != nil {
				return err
			}
			m, _ := spec.MapFor(n.Attrs)
			k, _ = bound.LoadOrStore(key, exprKernelOf(spec, compileExpr(e, len(spec.Inputs)), m))
		}
		return k.(kernel)(n, in, out)
	}
}

// exprKernelOf runs prog (float data) or m's int64 form.
func exprKernelOf(spec *graph.OpSpec, prog *exprProg, m *graph.MapFunc) kernel {
	return func(n *graph.Node, in, out []*graph.Tensor) error {
		o := out[0]
		float := storageOf(o.DType) == stF32 || storageOf(o.DType) == stF64
		shapes := make([]graph.Shape, len(in))
		for i, t := range in {
			shapes[i] = t.Shape
			st := storageOf(t.DType)
			float = float || st == stF32 || st == stF64
			if st == stNone {
				return errDType(t.DType)
			}
		}
		if storageOf(o.DType) == stNone {
			return errDType(o.DType)
		}
		p := newBPlan(o.Shape, shapes...)
		if !float {
			return exprInt(spec.Name, m, o, in, p)
		}
		if prog.runDirect(o, in, p) {
			return nil
		}
		prog.runFloat(o, in, p)
		return nil
	}
}

// runDirect runs a direct program as a typed loop when the operands have
// the output's storage (a select's condition: bool), and reports whether
// it did.
func (prog *exprProg) runDirect(o *graph.Tensor, in []*graph.Tensor, p *bplan) bool {
	st := storageOf(o.DType)
	for k, t := range in {
		if prog.direct == graph.PrimSelect && k == 0 {
			if t.DType != graph.Bool {
				return false
			}
		} else if t.DType != o.DType {
			return false
		}
	}
	switch {
	case prog.direct == 0:
		return false
	case prog.direct == graph.PrimSelect && st == stF32:
		where(o.F32, in[0].B, in[1].F32, in[2].F32, p)
	case prog.direct == graph.PrimSelect && st == stF64:
		where(o.F64, in[0].B, in[1].F64, in[2].F64, p)
	case prog.direct == graph.PrimNeg && st == stF32:
		negate(o.F32, in[0].F32)
	case prog.direct == graph.PrimNeg && st == stF64:
		negate(o.F64, in[0].F64)
	case prog.direct == graph.PrimSelect || prog.direct == graph.PrimNeg:
		return false
	case st == stF32:
		binaryFloat(prog.direct, o.F32, in[0].F32, in[1].F32, p)
	case st == stF64:
		binaryFloat(prog.direct, o.F64, in[0].F64, in[1].F64, p)
	default:
		return false
	}
	return true
}

func negate[T float](y, x []T) {
	parallelFor(len(y), grain, func(lo, hi int) {
		for i, v := range x[lo:hi] {
			y[lo+i] = -v
		}
	})
}

func where[T float](o []T, c []bool, x, y []T, p *bplan) {
	sc, sx, sy := p.inner(0), p.inner(1), p.inner(2)
	parallelFor(p.n, grain, func(lo, hi int) {
		p.walk(lo, hi, func(at, cnt int, offs []int) {
			ic, ix, iy := offs[0], offs[1], offs[2]
			for i := range cnt {
				if c[ic] {
					o[at+i] = x[ix]
				} else {
					o[at+i] = y[iy]
				}
				ic, ix, iy = ic+sc, ix+sx, iy+sy
			}
		})
	})
}

// runFloat evaluates the program at every output element: each run of
// consecutive outputs is gathered into the operand blocks (converted to
// float64, bool as 0/1), computed, and stored rounded to the output.
func (prog *exprProg) runFloat(o *graph.Tensor, in []*graph.Tensor, p *bplan) {
	parallelFor(p.n, grain, func(lo, hi int) {
		f, _ := prog.frames.Get().(*exprFrame)
		if f == nil {
			f = prog.newFrame()
		}
		defer prog.frames.Put(f)
		res := f.slots[prog.result]
		p.walk(lo, hi, func(at, cnt int, offs []int) {
			for done := 0; done < cnt; done += exprBlock {
				m := min(exprBlock, cnt-done)
				for k, t := range in {
					gatherF64(f.slots[k][:m], t, offs[k]+done*p.inner(k), p.inner(k))
				}
				for _, r := range f.run {
					r(m)
				}
				storeF64(o, at+done, res[:m])
			}
		})
	})
}

// gatherF64 reads len(dst) elements of t from off with stride s.
func gatherF64(dst []float64, t *graph.Tensor, off, s int) {
	switch storageOf(t.DType) {
	case stF32:
		for i := range dst {
			dst[i] = float64(t.F32[off])
			off += s
		}
	case stF64:
		if s == 1 {
			copy(dst, t.F64[off:])
			return
		}
		for i := range dst {
			dst[i] = t.F64[off]
			off += s
		}
	case stI64:
		for i := range dst {
			dst[i] = float64(t.I64[off])
			off += s
		}
	case stBool:
		for i := range dst {
			dst[i] = b2f(t.B[off])
			off += s
		}
	}
}

// storeF64 writes v at o[at:], rounded to o's storage (bool: v != 0).
func storeF64(o *graph.Tensor, at int, v []float64) {
	switch storageOf(o.DType) {
	case stF32:
		d := o.F32[at : at+len(v)]
		for i, x := range v {
			d[i] = float32(x)
		}
	case stF64:
		copy(o.F64[at:], v)
	case stBool:
		d := o.B[at : at+len(v)]
		for i, x := range v {
			d[i] = x != 0
		}
	}
}

// exprInt runs the op table's int64 form over int64 and bool operands
// (bool read as 0/1; a bool output is v != 0). An op without one (a float
// function) refuses integer data; its type inference already does.
func exprInt(op string, m *graph.MapFunc, o *graph.Tensor, in []*graph.Tensor, p *bplan) error {
	if m == nil || m.Int == nil {
		return fmt.Errorf("%s has no int64 form", op)
	}
	x := make([]int64, len(in))
	var err error
	p.walk(0, p.n, func(at, cnt int, offs []int) {
		for i := range cnt {
			for k, t := range in {
				j := offs[k] + i*p.inner(k)
				if t.I64 != nil {
					x[k] = t.I64[j]
				} else {
					x[k] = int64(b2f(t.B[j]))
				}
			}
			v, e := m.Int(x)
			if e != nil && err == nil {
				err = e
			}
			if o.I64 != nil {
				o.I64[at+i] = v
			} else {
				o.B[at+i] = v != 0
			}
		}
	})
	return err
}
