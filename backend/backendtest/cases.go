package backendtest

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/flashgraph/flashgraph/graph"
)

var (
	onlyInt64 = []graph.DType{graph.Int64}
	onlyBool  = []graph.DType{graph.Bool}
)

func shapeName(s []int) string { return graph.Shape(s).String() }

func constGen(v float64) gen { return func(*rand.Rand) float64 { return v } }

// withZeros is normal·3 with a third of the values exactly 0 (Cast to bool).
func withZeros(r *rand.Rand) float64 {
	if r.IntN(3) == 0 {
		return 0
	}
	return 3 * r.NormFloat64()
}

// opCases lists the cases of every op. The coverage subtest fails for an op
// of the op table with none.
func opCases() []opCase {
	var cs []opCase
	add := func(op, name string, fn func(c *ctx)) { cs = append(cs, opCase{op: op, name: name, fn: fn}) }
	addDT := func(op, name string, dts []graph.DType, fn func(c *ctx)) {
		cs = append(cs, opCase{op: op, name: name, dts: dts, fn: fn})
	}

	// Binary elementwise, broadcasting.
	binShapes := [][2][]int{
		{{3, 4}, {3, 4}}, {{2, 3, 5}, {5}}, {{2, 1, 4}, {3, 1}}, {{}, {2, 3}},
		{{7}, {1}}, {{2, 3, 1, 5}, {1, 4, 1}}, {{1, 1, 3}, {2, 5, 1}},
	}
	binOps := []struct {
		op   string
		a, b gen
	}{
		{"Add", normal, normal}, {"Sub", normal, normal}, {"Mul", normal, normal},
		{"Div", normal, awayFromZero}, {"Pow", positive, normal},
	}
	for _, bo := range binOps {
		for _, sh := range binShapes {
			add(bo.op, shapeName(sh[0])+"_"+shapeName(sh[1]), func(c *ctx) {
				a, ra := c.input(c.dt, bo.a, sh[0]...)
				b, rb := c.input(c.dt, bo.b, sh[1]...)
				c.expect(c.op(bo.op, nil, a, b), refElem(bo.op, ra, rb))
			})
		}
	}
	add("Pow", "negative_base_integer_exponent", func(c *ctx) {
		a, ra := c.input(c.dt, normal, 3, 4)
		b, rb := c.input(c.dt, ints(0, 4), 4)
		c.expect(c.op("Pow", nil, a, b), refElem("Pow", ra, rb))
	})

	// Unary elementwise, on inputs from each op's domain.
	unOps := []struct {
		op string
		g  gen
	}{
		{"Neg", normal}, {"Sqrt", positive}, {"Reciprocal", awayFromZero}, {"Exp", scaled(3, normal)},
		{"Log", positive}, {"Sigmoid", scaled(5, normal)}, {"Tanh", scaled(3, normal)}, {"Relu", normal},
		{"Erf", scaled(2, normal)}, {"Abs", normal},
		{"Softplus", scaled(30, normal)}, // both branches, and e^x past float32's range
		{"Asin", inUnit}, {"Acos", inUnit}, {"Atanh", inUnit}, {"Acosh", atLeastOne},
		{"Tan", scaled(1.4, inUnit)}, {"Not", coin}, // Not: bool, in activationCases
	}
	// Every other one-operand op defined by an expression (an activation
	// added to the table) is covered on scaled normal values: an op defined
	// only on part of the line gets a row above, with its domain.
	listed := map[string]bool{}
	for _, uo := range unOps {
		listed[uo.op] = true
	}
	for _, s := range graph.ExprOps() {
		if !listed[s.Name] && len(s.Inputs) == 1 {
			unOps = append(unOps, struct {
				op string
				g  gen
			}{s.Name, scaled(5, normal)})
		}
	}
	for _, uo := range unOps {
		if uo.op == "Not" {
			continue
		}
		for _, sh := range [][]int{{17}, {3, 5, 7}, {2, 3, 4, 5}, {}} {
			add(uo.op, shapeName(sh), func(c *ctx) {
				x, rx := c.input(c.dt, uo.g, sh...)
				c.expect(c.op(uo.op, nil, x), refElem(uo.op, rx))
			})
		}
	}

	cs = append(cs, activationCases()...)

	// Identity, any dtype.
	identity := func(g gen, shape ...int) func(c *ctx) {
		return func(c *ctx) {
			x, rx := c.input(c.dt, g, shape...)
			c.expect(c.op("Identity", nil, x), rx)
		}
	}
	add("Identity", "float", identity(normal, 3, 4))
	// AllReduce on one rank (world 1, the default): the mean over one rank
	// is x. Jobs of several ranks are tested by package dist's collectives.
	add("AllReduce", "one_rank", func(c *ctx) {
		x, rx := c.x(3, 4)
		c.expect(c.op("AllReduce", nil, x), rx)
	})
	// ReduceScatter and AllGather on one rank: the flat concatenation of
	// the bucket, and the identity.
	add("ReduceScatter", "one_rank", func(c *ctx) {
		x, rx := c.x(3, 4)
		y, ry := c.x(5)
		flat := &arr{shape: []int{17}, data: append(append([]float64(nil), rx.data...), ry.data...)}
		c.expect(c.op("ReduceScatter", graph.Attrs{"offsets": graph.Ints(0, 17)}, x, y), flat)
	})
	add("AllGather", "one_rank", func(c *ctx) {
		x, rx := c.x(6)
		c.expect(c.op("AllGather", graph.Attrs{"offsets": graph.Ints(0, 6)}, x), rx)
	})
	addDT("Identity", "int64", onlyInt64, identity(ints(-9, 9), 5))
	addDT("Identity", "bool", onlyBool, identity(coin, 2, 3))

	// Where: bool condition, three-way broadcasting, any dtype of X/Y.
	whereCase := func(g gen, cs, xs, ys []int) func(c *ctx) {
		return func(c *ctx) {
			cond, rc := c.input(graph.Bool, coin, cs...)
			x, rx := c.input(c.dt, g, xs...)
			y, ry := c.input(c.dt, g, ys...)
			ref := ref("Where", nil, tensorFrom(graph.Bool, rc), f64(rx), f64(ry))
			c.expect(c.op("Where", nil, cond, x, y), ref)
		}
	}
	add("Where", "c[3,1]_x[4]_y[1,4]", whereCase(normal, []int{3, 1}, []int{4}, []int{1, 4}))
	add("Where", "c[2,3,4]_x[2,3,4]_y[]", whereCase(normal, []int{2, 3, 4}, []int{2, 3, 4}, nil))
	add("Where", "c[5]_x[2,1]_y[2,5]", whereCase(normal, []int{5}, []int{2, 1}, []int{2, 5}))
	addDT("Where", "int64", onlyInt64, whereCase(ints(-5, 5), []int{2, 1}, []int{2, 3}, []int{3}))
	addDT("Where", "bool", onlyBool, whereCase(coin, []int{4}, []int{3, 4}, []int{1}))

	// Comparisons, any dtype, bool result.
	for _, op := range []string{"Equal", "Greater"} {
		cmp := func(g gen, as, bs []int) func(c *ctx) {
			return func(c *ctx) {
				a, ra := c.input(c.dt, g, as...)
				b, rb := c.input(c.dt, g, bs...)
				c.expect(c.op(op, nil, a, b), refElem(op, ra, rb))
			}
		}
		add(op, "[3,4]_[4]", cmp(fewValues, []int{3, 4}, []int{4}))
		add(op, "[2,1,3]_[2,3]", cmp(fewValues, []int{2, 1, 3}, []int{2, 3}))
		addDT(op, "int64", onlyInt64, cmp(ints(0, 3), []int{4, 5}, []int{5}))
		addDT(op, "bool", onlyBool, cmp(coin, []int{3, 4}, []int{3, 1}))
	}

	// Cast between every pair; float to int64 truncates toward zero.
	for _, to := range []graph.DType{graph.Float32, graph.Float64, graph.BFloat16, graph.Float16, graph.Int64, graph.Bool} {
		add("Cast", "to_"+to.String(), func(c *ctx) {
			x, rx := c.input(c.dt, withZeros, 4, 7)
			c.expect(c.op("Cast", graph.Attrs{"to": graph.Str(to.String())}, x), refCast(to, rx))
		})
		addDT("Cast", "from_int64_to_"+to.String(), onlyInt64, func(c *ctx) {
			x, rx := c.input(graph.Int64, ints(-50, 50), 3, 5)
			c.expect(c.op("Cast", graph.Attrs{"to": graph.Str(to.String())}, x), refCast(to, rx))
		})
		addDT("Cast", "from_bool_to_"+to.String(), onlyBool, func(c *ctx) {
			x, rx := c.input(graph.Bool, coin, 6)
			c.expect(c.op("Cast", graph.Attrs{"to": graph.Str(to.String())}, x), refCast(to, rx))
		})
	}
	add("Cast", "to_case_dtype_from_float64", func(c *ctx) {
		x, rx := c.input(graph.Float64, scaled(3, normal), 5, 3)
		c.expect(c.op("Cast", graph.Attrs{"to": graph.Str(c.dt.String())}, x), refCast(c.dt, rx))
	})

	// MatMul: numpy batching and broadcasting, rank-1 promotion, odd sizes.
	for _, sh := range [][2][]int{
		{{3, 5}, {5, 4}}, {{7}, {7, 3}}, {{2, 3, 7}, {7}}, {{5}, {5}},
		{{2, 1, 3, 5}, {4, 5, 6}}, {{1, 4, 5}, {3, 5, 2}}, {{33, 65}, {65, 17}},
		{{2, 2, 1, 9}, {2, 9, 70}}, {{3, 1, 4}, {4, 1}},
	} {
		add("MatMul", shapeName(sh[0])+"@"+shapeName(sh[1]), func(c *ctx) {
			a, ra := c.x(sh[0]...)
			b, rb := c.x(sh[1]...)
			c.expect(c.b.MatMul(a, b), refMatMul(ra, rb))
		})
	}

	// Gemm.
	gemmCases := []struct {
		name          string
		tA, tB        bool
		alpha, beta   float64
		cShape        []int
		noC           bool
		m, k, n       int
		alphaBetaSets bool
	}{
		{name: "C[n]", m: 4, k: 6, n: 5, cShape: []int{5}, alpha: 1, beta: 1},
		{name: "transA_C[m,1]", tA: true, m: 4, k: 6, n: 5, cShape: []int{4, 1}, alpha: 0.5, beta: 2},
		{name: "transB_C[]", tB: true, m: 3, k: 7, n: 2, cShape: []int{}, alpha: 1, beta: -1},
		{name: "transAB_C[m,n]", tA: true, tB: true, m: 5, k: 3, n: 4, cShape: []int{5, 4}, alpha: 1.5, beta: 0.25},
		{name: "noC", m: 6, k: 9, n: 7, noC: true, alpha: 2, beta: 1},
	}
	for _, gc := range gemmCases {
		add("Gemm", gc.name, func(c *ctx) {
			as, bs := []int{gc.m, gc.k}, []int{gc.k, gc.n}
			if gc.tA {
				as = []int{gc.k, gc.m}
			}
			if gc.tB {
				bs = []int{gc.n, gc.k}
			}
			a, ra := c.x(as...)
			b, rb := c.x(bs...)
			attrs := graph.Attrs{"alpha": graph.Float(gc.alpha), "beta": graph.Float(gc.beta),
				"transA": graph.Int(b2i(gc.tA)), "transB": graph.Int(b2i(gc.tB))}
			// An omitted C is passed as a nil input: graph's Gemm inference
			// indexes in[2] and panics when given only two inputs (reported
			// to the graph owner).
			ins := []*graph.Value{a, b, nil}
			var rc *arr
			if !gc.noC {
				ins = ins[:2]
				var cv *graph.Value
				cv, rc = c.x(gc.cShape...)
				ins = append(ins, cv)
			}
			c.expect(c.op("Gemm", attrs, ins...), refGemm(ra, rb, rc, gc.alpha, gc.beta, gc.tA, gc.tB))
		})
	}

	// Reductions.
	redCases := []struct {
		name     string
		shape    []int
		axes     []int // nil: the axes input is omitted
		keepdims bool
		noop     bool
	}{
		{"axis1_keep", []int{3, 4, 5}, []int{1}, true, false},
		{"axis-1", []int{3, 4, 5}, []int{-1}, false, false},
		{"axes0,2_keep", []int{3, 4, 5}, []int{0, 2}, true, false},
		{"all", []int{3, 4, 5}, nil, false, false},
		{"all_keep", []int{2, 3}, nil, true, false},
		{"rank1", []int{7}, []int{0}, false, false},
		{"rank4_axes-3,-1", []int{2, 3, 4, 5}, []int{-3, -1}, false, false},
		{"noop_empty_axes", []int{3, 4}, nil, true, true},
	}
	for _, kind := range []struct{ op, ref string }{{"ReduceSum", "sum"}, {"ReduceMean", "mean"}, {"ReduceMax", "max"}} {
		for _, rc := range redCases {
			add(kind.op, rc.name, func(c *ctx) {
				x, rx := c.x(rc.shape...)
				attrs := graph.Attrs{"keepdims": graph.Int(b2i(rc.keepdims))}
				if rc.noop {
					attrs["noop_with_empty_axes"] = graph.Int(1)
				}
				ins := []*graph.Value{x}
				if rc.axes != nil {
					ins = append(ins, c.b.Ints(rc.axes...))
				}
				ref := rx
				if !rc.noop {
					ref = refReduce(rx, rc.axes, rc.keepdims, kind.ref)
				}
				c.expect(c.op(kind.op, attrs, ins...), ref)
			})
		}
	}

	// Softmax and LogSoftmax on one axis (opset 13).
	smCases := []struct {
		name  string
		shape []int
		axis  int
		g     gen
	}{
		{"axis-1", []int{3, 4, 5}, -1, scaled(2, normal)},
		{"axis0", []int{3, 4, 5}, 0, scaled(2, normal)},
		{"axis1", []int{3, 4, 5}, 1, scaled(2, normal)},
		{"rank1", []int{9}, 0, scaled(2, normal)},
		{"rank4_axis-2", []int{2, 3, 4, 5}, -2, scaled(2, normal)},
		{"large_values", []int{4, 6}, -1, func(r *rand.Rand) float64 { return 50 + 10*r.NormFloat64() }},
	}
	for _, log := range []bool{false, true} {
		op := "Softmax"
		if log {
			op = "LogSoftmax"
		}
		for _, sc := range smCases {
			add(op, sc.name, func(c *ctx) {
				x, rx := c.input(c.dt, sc.g, sc.shape...)
				c.expect(c.op(op, graph.Attrs{"axis": graph.Int(int64(sc.axis))}, x), refSoftmax(rx, sc.axis, log))
			})
		}
	}
	for _, sc := range []struct {
		shape []int
		axis  int
	}{{[]int{3, 4, 5}, -1}, {[]int{3, 4, 5}, 1}, {[]int{6}, 0}} {
		add("SoftmaxGrad", fmt.Sprintf("%v_axis%d", sc.shape, sc.axis), func(c *ctx) {
			rs := c.rand(c.dt, normal, sc.shape...) // logits: only their softmax is fed
			y, ry := c.feed(c.dt, refSoftmax(rs, sc.axis, false))
			dy, rdy := c.x(sc.shape...)
			c.expect(c.op("SoftmaxGrad", graph.Attrs{"axis": graph.Int(int64(sc.axis))}, y, dy), refSoftmaxGrad(ry, rdy, sc.axis))
		})
	}

	// Cross-entropy and its gradient.
	for _, red := range []string{"mean", "sum"} {
		for _, sh := range [][2]int{{6, 5}, {1, 7}, {13, 3}} {
			n, cl := sh[0], sh[1]
			name := fmt.Sprintf("%s_[%d,%d]", red, n, cl)
			add("SoftmaxCrossEntropyLoss", name, func(c *ctx) {
				s, rs := c.input(c.dt, scaled(2, normal), n, cl)
				l, rl := c.input(graph.Int64, ints(0, cl), n)
				c.expect(c.op("SoftmaxCrossEntropyLoss", graph.Attrs{"reduction": graph.Str(red)}, s, l), refSCE(rs, rl, red))
			})
			add("SoftmaxCrossEntropyLossGrad", name, func(c *ctx) {
				d, rd := c.input(c.dt, normal, []int{}...)
				s, rs := c.input(c.dt, scaled(2, normal), n, cl)
				l, rl := c.input(graph.Int64, ints(0, cl), n)
				c.expect(c.op("SoftmaxCrossEntropyLossGrad", graph.Attrs{"reduction": graph.Str(red)}, d, s, l),
					refSCEGrad(rd.data[0], rs, rl, red))
			})
		}
	}

	// Transpose.
	for _, tc := range []struct {
		shape []int
		perm  []int // nil: default (reverse)
	}{
		{[]int{3, 4}, nil}, {[]int{2, 3, 4}, []int{1, 0, 2}}, {[]int{2, 3, 4, 5}, []int{3, 1, 0, 2}},
		{[]int{2, 3, 4}, nil}, {[]int{5}, []int{0}}, {[]int{2, 1, 3, 4}, []int{0, 2, 1, 3}},
	} {
		tr := func(c *ctx, x *graph.Value) *graph.Value {
			if tc.perm == nil {
				return c.op("Transpose", nil, x)
			}
			return c.b.Transpose(x, i64s(tc.perm)...)
		}
		perm := tc.perm
		if perm == nil {
			for i := len(tc.shape) - 1; i >= 0; i-- {
				perm = append(perm, i)
			}
		}
		name := fmt.Sprintf("%v_perm%v", tc.shape, tc.perm)
		add("Transpose", name, func(c *ctx) {
			x, rx := c.x(tc.shape...)
			c.expect(tr(c, x), refTranspose(rx, perm))
		})
		addDT("Transpose", name, onlyInt64, func(c *ctx) {
			x, rx := c.input(graph.Int64, ints(-100, 100), tc.shape...)
			c.expect(tr(c, x), refTranspose(rx, perm))
		})
	}
	addDT("Transpose", "bool", onlyBool, func(c *ctx) {
		x, rx := c.input(graph.Bool, coin, 2, 3, 4)
		c.expect(c.b.Transpose(x, 2, 0, 1), refTranspose(rx, []int{2, 0, 1}))
	})

	// Reshape (0 copies a dim, -1 infers one), Squeeze, Unsqueeze.
	for _, rc := range []struct {
		target, out []int
	}{{[]int{0, -1}, []int{2, 12}}, {[]int{6, 4}, []int{6, 4}}, {[]int{24}, []int{24}}, {[]int{-1, 2, 2}, []int{6, 2, 2}}} {
		add("Reshape", fmt.Sprint(rc.target), func(c *ctx) {
			x, rx := c.x(2, 3, 4)
			c.expect(c.b.Reshape(x, rc.target...), reshaped(rx, rc.out...))
		})
	}
	addDT("Reshape", "int64", onlyInt64, func(c *ctx) {
		x, rx := c.input(graph.Int64, ints(0, 100), 3, 4)
		c.expect(c.b.Reshape(x, 2, -1, 3), reshaped(rx, 2, 2, 3))
	})
	for _, uc := range []struct {
		in, axes, out []int
	}{{[]int{3, 4}, []int{0}, []int{1, 3, 4}}, {[]int{3, 4}, []int{-1}, []int{3, 4, 1}}, {[]int{3, 4}, []int{1, 3}, []int{3, 1, 4, 1}}} {
		add("Unsqueeze", fmt.Sprint(uc.axes), func(c *ctx) {
			x, rx := c.x(uc.in...)
			c.expect(c.op("Unsqueeze", nil, x, c.b.Ints(uc.axes...)), reshaped(rx, uc.out...))
		})
	}
	addDT("Unsqueeze", "bool", onlyBool, func(c *ctx) {
		x, rx := c.input(graph.Bool, coin, 5)
		c.expect(c.op("Unsqueeze", nil, x, c.b.Ints(0)), reshaped(rx, 1, 5))
	})
	for _, sc := range []struct {
		axes, out []int
	}{{[]int{0, 2}, []int{3, 4}}, {nil, []int{3, 4}}, {[]int{-2}, []int{1, 3, 4}}} {
		add("Squeeze", fmt.Sprint(sc.axes), func(c *ctx) {
			x, rx := c.x(1, 3, 1, 4)
			ins := []*graph.Value{x}
			if sc.axes != nil {
				ins = append(ins, c.b.Ints(sc.axes...))
			}
			c.expect(c.op("Squeeze", nil, ins...), reshaped(rx, sc.out...))
		})
	}
	addDT("Squeeze", "int64", onlyInt64, func(c *ctx) {
		x, rx := c.input(graph.Int64, ints(0, 9), 2, 1)
		c.expect(c.op("Squeeze", nil, x), reshaped(rx, 2))
	})

	// Concat.
	concat := func(dt graph.DType, g gen, axis int, shapes ...[]int) func(c *ctx) {
		return func(c *ctx) {
			if dt == graph.InvalidDType {
				dt = c.dt
			}
			var vs []*graph.Value
			var rs []*arr
			for _, s := range shapes {
				v, r := c.input(dt, g, s...)
				vs, rs = append(vs, v), append(rs, r)
			}
			c.expect(c.b.Concat(int64(axis), vs...), refConcat(axis, rs...))
		}
	}
	add("Concat", "axis0", concat(0, normal, 0, []int{2, 3}, []int{4, 3}))
	add("Concat", "axis-1_three", concat(0, normal, -1, []int{2, 3, 1}, []int{2, 3, 4}, []int{2, 3, 2}))
	add("Concat", "axis1_rank4", concat(0, normal, 1, []int{2, 1, 3, 2}, []int{2, 2, 3, 2}))
	add("Concat", "one_input", concat(0, normal, 0, []int{3}))
	addDT("Concat", "int64", onlyInt64, concat(graph.Int64, ints(-9, 9), 0, []int{2}, []int{3}))
	addDT("Concat", "bool", onlyBool, concat(graph.Bool, coin, 1, []int{2, 2}, []int{2, 3}))

	// Slice: negative and clamped indices, steps, omitted axes, empty result.
	sliceCases := []struct {
		name                      string
		starts, ends, axes, steps []int
	}{
		{"simple", []int{1}, []int{4}, []int{0}, nil},
		{"negative_clamped_step2", []int{-3, 0}, []int{1000, -1}, []int{1, -1}, []int{2, 1}},
		{"reverse_step-2", []int{-1}, []int{-1000}, []int{1}, []int{-2}},
		{"reverse_two_axes", []int{4, 6}, []int{0, -8}, []int{0, 1}, []int{-1, -3}},
		{"axes_omitted", []int{0, 1}, []int{3, 5}, nil, nil},
		{"empty", []int{3}, []int{1}, []int{0}, nil},
		{"start_past_end_clamped", []int{10}, []int{20}, []int{2}, nil},
	}
	for _, sc := range sliceCases {
		build := func(c *ctx, x *graph.Value) *graph.Value {
			ins := []*graph.Value{x, c.b.Ints(sc.starts...), c.b.Ints(sc.ends...)}
			if sc.axes != nil {
				ins = append(ins, c.b.Ints(sc.axes...))
				if sc.steps != nil {
					ins = append(ins, c.b.Ints(sc.steps...))
				}
			}
			return c.op("Slice", nil, ins...)
		}
		add("Slice", sc.name, func(c *ctx) {
			x, rx := c.x(5, 7, 4)
			c.expect(build(c, x), refSlice(rx, sc.starts, sc.ends, sc.axes, sc.steps))
		})
		addDT("Slice", sc.name, onlyInt64, func(c *ctx) {
			x, rx := c.input(graph.Int64, ints(-100, 100), 5, 7, 4)
			c.expect(build(c, x), refSlice(rx, sc.starts, sc.ends, sc.axes, sc.steps))
		})
	}

	// Expand.
	for _, ec := range []struct{ in, shape []int }{
		{[]int{3, 1}, []int{2, 3, 4}}, {[]int{4}, []int{3, 1}}, {[]int{1}, []int{2, 2}}, {[]int{2, 1, 3}, []int{1, 5, 1}},
	} {
		add("Expand", shapeName(ec.in)+"_to_"+shapeName(ec.shape), func(c *ctx) {
			x, rx := c.x(ec.in...)
			c.expect(c.op("Expand", nil, x, c.b.Ints(ec.shape...)), refExpand(rx, ec.shape))
		})
	}
	addDT("Expand", "int64", onlyInt64, func(c *ctx) {
		x, rx := c.input(graph.Int64, ints(0, 50), 1, 3)
		c.expect(c.op("Expand", nil, x, c.b.Ints(2, 3)), refExpand(rx, []int{2, 3}))
	})

	// Gather and its gradient.
	gatherCases := []struct {
		name      string
		data, idx []int
		axis      int
	}{
		{"axis0", []int{5, 4}, []int{3}, 0},
		{"axis1_idx2d", []int{3, 5, 2}, []int{2, 2}, 1},
		{"axis-1", []int{3, 4, 6}, []int{5}, -1},
		{"scalar_index", []int{4, 3}, []int{}, 0},
		{"embedding", []int{11, 8}, []int{2, 7}, 0},
		// Over 256 indices (the CUDA gradient's chunk) hitting few rows,
		// rows wider than one block: the many-matches path of gather_grad.
		{"embedding_hot_rows", []int{7, 300}, []int{2, 300}, 0},
	}
	for _, gc := range gatherCases {
		dim := gc.data[normAxis(gc.axis, len(gc.data))]
		add("Gather", gc.name, func(c *ctx) {
			x, rx := c.x(gc.data...)
			idx, ri := c.input(graph.Int64, ints(-dim, dim), gc.idx...)
			c.expect(c.b.Gather(x, idx, int64(gc.axis)), refGather(rx, ri, gc.axis))
		})
		add("GatherGrad", gc.name, func(c *ctx) {
			// Indices from a narrow range repeat, exercising accumulation.
			idx, ri := c.input(graph.Int64, ints(-min(dim, 3), min(dim, 3)), gc.idx...)
			ax := normAxis(gc.axis, len(gc.data))
			dys := append(append(append([]int{}, gc.data[:ax]...), gc.idx...), gc.data[ax+1:]...)
			dy, rdy := c.x(dys...)
			attrs := graph.Attrs{"axis": graph.Int(int64(gc.axis)), "shape": graph.Ints(i64s(gc.data)...)}
			c.expect(c.op("GatherGrad", attrs, dy, idx), refGatherGrad(rdy, ri, gc.axis, gc.data))
		})
	}
	addDT("Gather", "int64_data", onlyInt64, func(c *ctx) {
		x, rx := c.input(graph.Int64, ints(-1000, 1000), 6, 2)
		idx, ri := c.input(graph.Int64, ints(-6, 6), 4)
		c.expect(c.b.Gather(x, idx, 0), refGather(rx, ri, 0))
	})
	addDT("Gather", "bool_data", onlyBool, func(c *ctx) {
		x, rx := c.input(graph.Bool, coin, 3, 5)
		idx, ri := c.input(graph.Int64, ints(0, 5), 2)
		c.expect(c.b.Gather(x, idx, 1), refGather(rx, ri, 1))
	})

	// Trilu.
	for _, tc := range []struct {
		name  string
		shape []int
		k     *int
		upper bool
	}{
		{"upper_default_k", []int{4, 5}, nil, true},
		{"lower_k-1", []int{4, 5}, ptr(-1), false},
		{"upper_k2", []int{5, 4}, ptr(2), true},
		{"lower_rank3_k0", []int{2, 3, 4}, ptr(0), false},
		{"upper_k-10", []int{3, 3}, ptr(-10), true},
	} {
		build := func(c *ctx, x *graph.Value) *graph.Value {
			ins := []*graph.Value{x}
			if tc.k != nil {
				ins = append(ins, c.b.Scalar(graph.Int64, float64(*tc.k)))
			}
			return c.op("Trilu", graph.Attrs{"upper": graph.Int(b2i(tc.upper))}, ins...)
		}
		k := 0
		if tc.k != nil {
			k = *tc.k
		}
		add("Trilu", tc.name, func(c *ctx) {
			x, rx := c.x(tc.shape...)
			c.expect(build(c, x), refTrilu(rx, k, tc.upper))
		})
		addDT("Trilu", tc.name, onlyInt64, func(c *ctx) {
			x, rx := c.input(graph.Int64, ints(1, 9), tc.shape...)
			c.expect(build(c, x), refTrilu(rx, k, tc.upper))
		})
	}

	cs = append(cs, attentionCases()...)
	cs = append(cs, fusedCases()...)

	// AdamW.
	for _, ac := range []struct {
		name  string
		attrs graph.Attrs
		step  float64
		lrF64 bool
	}{
		{"defaults_step1", nil, 1, false},
		{"custom_step7", graph.Attrs{"beta1": graph.Float(0.8), "beta2": graph.Float(0.99), "eps": graph.Float(1e-6),
			"weight_decay": graph.Float(0.1)}, 7, false},
		{"lr_float64_step30", graph.Attrs{"weight_decay": graph.Float(0.01)}, 30, true},
	} {
		add("AdamW", ac.name, func(c *ctx) {
			p, rp := c.x(5, 3)
			g, rg := c.x(5, 3)
			m, rm := c.input(c.dt, scaled(0.1, normal), 5, 3)
			v, rv := c.input(c.dt, scaled(0.01, positive), 5, 3)
			lrDT := graph.Float32
			if ac.lrF64 || c.dt == graph.Float64 {
				lrDT = graph.Float64
			}
			lr, rlr := c.input(lrDT, constGen(3e-2), []int{}...)
			step, rstep := c.input(graph.Float64, constGen(ac.step), []int{}...)
			outs := c.opN("AdamW", ac.attrs, p, g, m, v, lr, step)
			a := func(name string, def float64) float64 {
				if at, ok := ac.attrs[name]; ok {
					return at.F
				}
				return def
			}
			po, mo, vo := refAdamW(rp, rg, rm, rv, rlr.data[0], rstep.data[0],
				a("beta1", 0.9), a("beta2", 0.95), a("eps", 1e-8), a("weight_decay", 0))
			c.expect(outs[0], po)
			c.expect(outs[1], mo)
			c.expect(outs[2], vo)
		})
	}
	cs = append(cs, conformCases()...)
	cs = append(cs, trainingCases()...)
	stringCases(add, addDT)
	return cs
}

// attentionCases: FlashAttention and FlashAttentionGrad against the naive
// S×S reference, 3-D and 4-D, causal or not, lengths not a multiple of 64,
// K/V with as many heads as Q or fewer (grouped-query).
func attentionCases() []opCase {
	type shape struct {
		name   string
		q, k   []int
		causal bool
		scale  float64 // 0: 1/√D
	}
	shapes := []shape{
		{"3d_S67_causal", []int{3, 67, 16}, []int{3, 67, 16}, true, 0},
		{"3d_S67", []int{3, 67, 16}, []int{3, 67, 16}, false, 0},
		{"4d_S70_causal", []int{2, 2, 70, 8}, []int{2, 2, 70, 8}, true, 0},
		{"4d_S5_scale0.3", []int{1, 3, 5, 12}, []int{1, 3, 5, 12}, false, 0.3},
		{"3d_Sq5_Sk70", []int{2, 5, 8}, []int{2, 70, 8}, false, 0},
		{"3d_Sq20_Sk67_causal", []int{2, 20, 8}, []int{2, 67, 8}, true, 0},
		{"4d_S130_causal", []int{1, 2, 130, 4}, []int{1, 2, 130, 4}, true, 0},
		// Grouped-query: K and V with fewer heads (query head h reads K/V
		// head h/(H/H_kv); dK, dV sum each group), multi-query (one K/V head).
		{"4d_gqa_H4_Hkv2_S70_causal", []int{2, 4, 70, 8}, []int{2, 2, 70, 8}, true, 0},
		{"4d_mqa_H4_Hkv1_S67", []int{1, 4, 67, 16}, []int{1, 1, 67, 16}, false, 0},
		{"3d_gqa_BH6_BHkv2_Sq20_Sk67_causal", []int{6, 20, 8}, []int{2, 67, 8}, true, 0},
	}
	var cs []opCase
	for _, sh := range shapes {
		scale := sh.scale
		if scale == 0 {
			scale = 1 / math.Sqrt(float64(sh.q[len(sh.q)-1]))
		}
		attrs := graph.Attrs{"causal": graph.Int(b2i(sh.causal)), "scale": graph.Float(scale)}
		cs = append(cs, opCase{op: "FlashAttention", name: sh.name, fn: func(c *ctx) {
			q, rq := c.x(sh.q...)
			k, rk := c.x(sh.k...)
			v, rv := c.x(sh.k...)
			outs := c.opN("FlashAttention", attrs, q, k, v)
			y, lse := refAttention(rq, rk, rv, scale, sh.causal)
			c.expect(outs[0], y)
			c.expect(outs[1], lse)
		}})
		cs = append(cs, opCase{op: "FlashAttentionGrad", name: sh.name, fn: func(c *ctx) {
			// Y and L are the forward pass of these Q, K, V, by the
			// reference, fed in the graph's dtypes.
			rq, rk, rv := c.rand(c.dt, normal, sh.q...), c.rand(c.dt, normal, sh.k...), c.rand(c.dt, normal, sh.k...)
			y0, l0 := refAttention(rq, rk, rv, scale, sh.causal)
			q, rq := c.feed(c.dt, rq)
			k, rk := c.feed(c.dt, rk)
			v, rv := c.feed(c.dt, rv)
			y, ry := c.feed(c.dt, y0)
			l, rl := c.feed(graph.LSEType(c.dt), l0)
			dy, rdy := c.x(sh.q...)
			outs := c.opN("FlashAttentionGrad", attrs, q, k, v, y, l, dy)
			dq, dk, dv := refAttentionGradFrom(rq, rk, rv, ry, rl, rdy, scale, sh.causal)
			c.expect(outs[0], dq)
			c.expect(outs[1], dk)
			c.expect(outs[2], dv)
		}})
	}
	return cs
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func i64s(v []int) []int64 {
	out := make([]int64, len(v))
	for i, x := range v {
		out[i] = int64(x)
	}
	return out
}

func ptr(v int) *int { return &v }
