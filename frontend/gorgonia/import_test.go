package gorgonia

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// An MLP with gorgonia's activations: biases added with BroadcastAdd,
// Rectify, LeakyRelu, Tanh, Sigmoid, and a Mean over the features.
func TestMLP(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	const N, In, Hid, Out = 5, 6, 8, 3
	g := G.NewGraph()
	param := func(name string, shape ...int) *G.Node {
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := dense(shape, randData(rng, n, 0.7))
		if len(shape) == 1 {
			return G.NewVector(g, G.Float64, G.WithShape(shape...), G.WithName(name), G.WithValue(v))
		}
		return G.NewMatrix(g, G.Float64, G.WithShape(shape...), G.WithName(name), G.WithValue(v))
	}
	x := G.NewMatrix(g, G.Float64, G.WithShape(N, In), G.WithName("x"),
		G.WithValue(dense([]int{N, In}, randData(rng, N*In, 1))))
	w1, b1 := param("w1", In, Hid), param("b1", Hid)
	w2, b2 := param("w2", Hid, Hid), param("b2", Hid)
	w3 := param("w3", Hid, Out)

	h1 := must(G.Rectify(must(G.BroadcastAdd(must(G.Mul(x, w1)), b1, nil, []byte{0}))))
	h2 := must(G.LeakyRelu(must(G.BroadcastAdd(must(G.Mul(h1, w2)), b2, nil, []byte{0})), 0.1))
	h3 := must(G.Tanh(h2))
	y := must(G.Sigmoid(must(G.Mul(h3, w3))))
	m := must(G.Mean(y, 1))

	// x has a value bound (gorgonia needs it to run); Options.Inputs makes
	// it the graph input all the same.
	fg := checkAgainstGorgonia(t, g, []*G.Node{y, m}, Options{Inputs: []*G.Node{x}}, rtol64)
	c := fg.CountOps()
	// Relu: one for Rectify, two for LeakyRelu (x ⊙ (x ≥ 0) and −Relu(−x)).
	if c["Relu"] != 3 || c["Neg"] != 2 || c["Sigmoid"] != 1 || c["Tanh"] != 1 || c["Expand"] != 0 || c["ReduceSum"] != 1 || c["Div"] != 1 {
		t.Fatalf("ops %v:\n%s", c, graph.Format(fg))
	}
	if len(fg.Inputs) != 1 || len(fg.Params) != 5 {
		t.Fatalf("inputs %d, params %d; want 1 and 5", len(fg.Inputs), len(fg.Params))
	}
	for _, p := range fg.Params {
		if p.Init.Fn != "literal" {
			t.Fatalf("param %s has recipe %s, want literal", p.Name, p.Init.Fn)
		}
	}
}

// opCase builds a small gorgonia graph and returns the nodes to compare.
type opCase struct {
	name  string
	build func(g *G.ExprGraph, rng *rand.Rand) []*G.Node
	// ops must appear in the import (a check that the intended translation
	// was taken, not merely an equivalent one).
	ops []string
}

func mat(g *G.ExprGraph, rng *rand.Rand, name string, pos bool, shape ...int) *G.Node {
	n := 1
	for _, d := range shape {
		n *= d
	}
	data := randData(rng, n, 1)
	if pos {
		for i := range data {
			data[i] = 0.5 + math.Abs(data[i])
		}
	}
	v := dense(shape, data)
	switch len(shape) {
	case 0:
		return G.NewScalar(g, G.Float64, G.WithName(name), G.WithValue(data[0]))
	case 1:
		return G.NewVector(g, G.Float64, G.WithShape(shape...), G.WithName(name), G.WithValue(v))
	case 2:
		return G.NewMatrix(g, G.Float64, G.WithShape(shape...), G.WithName(name), G.WithValue(v))
	}
	return G.NewTensor(g, G.Float64, len(shape), G.WithShape(shape...), G.WithName(name), G.WithValue(v))
}

var opCases = []opCase{
	{"arith", func(g *G.ExprGraph, r *rand.Rand) []*G.Node {
		a, b := mat(g, r, "a", false, 3, 4), mat(g, r, "b", true, 3, 4)
		return []*G.Node{must(G.Add(a, b)), must(G.Sub(a, b)), must(G.HadamardProd(a, b)), must(G.HadamardDiv(a, b))}
	}, []string{"Add", "Sub", "Mul", "Div"}},
	{"scalar_tensor", func(g *G.ExprGraph, r *rand.Rand) []*G.Node {
		a, s := mat(g, r, "a", true, 2, 3), mat(g, r, "s", false)
		c := G.NewConstant(2.5)
		return []*G.Node{must(G.Mul(s, a)), must(G.Sub(c, a)), must(G.Div(a, s)), must(G.Pow(a, c)), must(G.Add(s, c))}
	}, []string{"Mul", "Sub", "Div", "Pow", "Add"}},
	{"vector_shapes", func(g *G.ExprGraph, r *rand.Rand) []*G.Node {
		// gorgonia pairs (4) with (1, 4) and (4, 1) element by element.
		v, row, col := mat(g, r, "v", false, 4), mat(g, r, "row", false, 1, 4), mat(g, r, "col", false, 4, 1)
		return []*G.Node{must(G.Add(v, row)), must(G.HadamardProd(col, v))}
	}, []string{"Reshape", "Add", "Mul"}},
	{"unary", func(g *G.ExprGraph, r *rand.Rand) []*G.Node {
		a, p := mat(g, r, "a", false, 3, 5), mat(g, r, "p", true, 3, 5)
		return []*G.Node{
			must(G.Exp(a)), must(G.Log(p)), must(G.Neg(a)), must(G.Sqrt(p)), must(G.Square(a)),
			must(G.Inverse(p)), must(G.InverseSqrt(p)), must(G.Cube(a)), must(G.Abs(a)),
			must(G.Tanh(a)), must(G.Sigmoid(a)),
			// gorgonia builds log(sigmoid(x)) as −softplus(−x).
			must(G.Log(must(G.Sigmoid(p)))),
		}
	}, []string{"Exp", "Log", "Neg", "Sqrt", "Mul", "Reciprocal", "Abs", "Tanh", "Sigmoid", "Softplus"}},
	// Rectify and LeakyRelu of one tensor cannot share a graph here:
	// gorgonia hash-conses Rectify's x ⊙ (x ≥ 0) into LeakyRelu's, and its
	// TapeMachine then overwrites that output in place with LeakyRelu's sum.
	{"rectify", func(g *G.ExprGraph, r *rand.Rand) []*G.Node {
		return []*G.Node{must(G.Rectify(mat(g, r, "a", false, 4, 6)))}
	}, []string{"Relu"}},
	{"leaky_relu", func(g *G.ExprGraph, r *rand.Rand) []*G.Node {
		return []*G.Node{must(G.LeakyRelu(mat(g, r, "a", false, 4, 6), 0.2))}
	}, []string{"Relu", "Neg"}},
	{"reductions", func(g *G.ExprGraph, r *rand.Rand) []*G.Node {
		a := mat(g, r, "a", false, 2, 3, 4)
		return []*G.Node{must(G.Sum(a, 1)), must(G.Sum(a, 0, 2)), must(G.Sum(a)), must(G.Mean(a, 2)), must(G.Mean(a, 0, 1)), must(G.Mean(a)), must(G.Max(a, 1))}
	}, []string{"ReduceSum", "ReduceMax", "Div"}},
	{"softmax", func(g *G.ExprGraph, r *rand.Rand) []*G.Node {
		a, c, t3 := mat(g, r, "a", false, 3, 5), mat(g, r, "c", false, 5, 1), mat(g, r, "t", false, 2, 3, 4)
		return []*G.Node{
			must(G.SoftMax(a)),        // last axis
			must(G.SoftMax(c)),        // a column vector: axis 0
			must(G.SoftMax(t3, 1)),    // explicit axis
			must(G.SoftMax(t3, -2)),   // negative axis
			must(G.LogSoftMax(a)),     // log
			must(G.LogSoftMax(t3, 0)), // log, inner axis
		}
	}, []string{"Softmax", "LogSoftmax"}},
	{"shape", func(g *G.ExprGraph, r *rand.Rand) []*G.Node {
		a := mat(g, r, "a", false, 2, 3, 4)
		return []*G.Node{must(G.Transpose(a, 2, 0, 1)), must(G.Transpose(must(G.Reshape(a, tensor.Shape{6, 4})))), must(G.Reshape(a, tensor.Shape{4, -1}))}
	}, []string{"Transpose", "Reshape"}},
	{"linalg", func(g *G.ExprGraph, r *rand.Rand) []*G.Node {
		a, b := mat(g, r, "a", false, 3, 4), mat(g, r, "b", false, 4, 5)
		v, u := mat(g, r, "v", false, 4), mat(g, r, "u", false, 3)
		return []*G.Node{
			must(G.Mul(a, b)),       // matmul
			must(G.Mul(a, v)),       // matrix · vector
			must(G.Mul(u, a)),       // vector · matrix: Aᵀ·u
			must(G.Mul(v, v)),       // dot
			must(G.OuterProd(u, v)), // outer
			must(G.Mul(must(G.Transpose(b)), must(G.Transpose(a)))),
		}
	}, []string{"MatMul", "Transpose", "Reshape"}},
	{"batched_matmul", func(g *G.ExprGraph, r *rand.Rand) []*G.Node {
		a, b := mat(g, r, "a", false, 2, 3, 4), mat(g, r, "b", false, 2, 4, 5)
		at, bt := mat(g, r, "at", false, 2, 4, 3), mat(g, r, "bt", false, 2, 5, 4)
		return []*G.Node{
			must(G.BatchedMatMul(a, b)),
			must(G.BatchedMatMul(at, b, true)),
			must(G.BatchedMatMul(a, bt, false, true)),
			must(G.BatchedMatMul(at, bt, true, true)),
		}
	}, []string{"MatMul", "Transpose"}},
	{"broadcast", func(g *G.ExprGraph, r *rand.Rand) []*G.Node {
		a, row, col := mat(g, r, "a", false, 3, 4), mat(g, r, "row", true, 4), mat(g, r, "col", true, 3)
		t3, m := mat(g, r, "t", false, 2, 3, 4), mat(g, r, "m", true, 3, 4)
		rb, _, err := G.Broadcast(row, a, G.NewBroadcastPattern([]byte{0}, nil))
		if err != nil {
			panic(err)
		}
		// Broadcasting along an axis longer than 1 is numpy's repeat: each
		// row of p three times (a's first dimension).
		p := mat(g, r, "p", false, 2, 3)
		_, rp, err := G.Broadcast(a, p, G.NewBroadcastPattern(nil, []byte{0}))
		if err != nil {
			panic(err)
		}
		return []*G.Node{
			must(G.BroadcastAdd(a, row, nil, []byte{0})),         // bias over rows
			must(G.BroadcastSub(col, a, []byte{1}, nil)),         // left operand broadcast
			must(G.BroadcastHadamardProd(t3, m, nil, []byte{0})), // [3,4] over a batch
			must(G.BroadcastHadamardDiv(a, col, nil, []byte{1})), // col (3) → (3, 1), broadcast
			must(G.BroadcastPow(m, row, nil, []byte{0})),         // pow
			rb, // the repeated tensor itself: Expand
			rp, // [2, 3] → [6, 3]
		}
	}, []string{"Add", "Sub", "Mul", "Div", "Pow", "Expand"}},
	{"concat_slice", func(g *G.ExprGraph, r *rand.Rand) []*G.Node {
		a, b := mat(g, r, "a", false, 3, 4), mat(g, r, "b", false, 3, 2)
		t3 := mat(g, r, "t", false, 2, 3, 4)
		return []*G.Node{
			must(G.Concat(1, a, b, a)),
			must(G.Slice(a, nil, G.S(1, 3))),
			must(G.Slice(t3, nil, G.S(1))),            // one index: the axis is dropped
			must(G.Slice(t3, nil, nil, G.S(0, 4, 2))), // strided
		}
	}, []string{"Concat", "Slice", "Reshape"}},
}

func TestOps(t *testing.T) {
	for i, c := range opCases {
		t.Run(c.name, func(t *testing.T) {
			g := G.NewGraph()
			outs := c.build(g, rand.New(rand.NewPCG(uint64(i), 3)))
			fg := checkAgainstGorgonia(t, g, outs, Options{}, rtol64)
			counts := fg.CountOps()
			for _, op := range c.ops {
				if counts[op] == 0 {
					t.Errorf("no %s in the import:\n%s", op, graph.Format(fg))
				}
			}
		})
	}
}

// Float32 graphs import as float32 and compute in float32 on both sides.
func TestFloat32(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	g := G.NewGraph()
	x := G.NewMatrix(g, G.Float32, G.WithShape(4, 5), G.WithName("x"), G.WithValue(dense32([]int{4, 5}, randData(rng, 20, 1))))
	w := G.NewMatrix(g, G.Float32, G.WithShape(5, 3), G.WithName("w"), G.WithValue(dense32([]int{5, 3}, randData(rng, 15, 1))))
	y := must(G.SoftMax(must(G.Add(must(G.Mul(x, w)), must(G.Mul(x, w))))))
	fg := checkAgainstGorgonia(t, g, []*G.Node{y}, Options{Inputs: []*G.Node{x}}, 1e-6)
	if fg.Outputs[0].Type.DType != graph.Float32 {
		t.Fatalf("output type %v", fg.Outputs[0].Type)
	}
}

// Unary operators the op table defines by name (sin, cos, sign, ceil,
// floor) import as those ops and agree with gorgonia.
func TestTableUnaryOps(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	for _, c := range []struct {
		name string
		f    func(*G.Node) (*G.Node, error)
	}{{"Sin", G.Sin}, {"Cos", G.Cos}, {"Sign", G.Sign}, {"Ceil", G.Ceil}, {"Floor", G.Floor}} {
		g := G.NewGraph()
		a := mat(g, rng, "a", false, 3, 4)
		y := must(c.f(a))
		fg := checkAgainstGorgonia(t, g, []*G.Node{y}, Options{Inputs: []*G.Node{a}}, rtol64)
		if ops := fg.CountOps(); ops[c.name] != 1 {
			t.Errorf("%s imported as %v", c.name, ops)
		}
	}
}

func TestUnsupportedOps(t *testing.T) {
	cases := []struct {
		name  string
		build func(g *G.ExprGraph, a *G.Node) *G.Node
		op    string // the op as the error must name it
	}{
		{"expm1", func(g *G.ExprGraph, a *G.Node) *G.Node { return must(G.Expm1(a)) }, "expm1"},
		{"comparison", func(g *G.ExprGraph, a *G.Node) *G.Node { return must(G.Gt(a, must(G.Neg(a)), true)) }, "> true"},
		// gorgonia rewrites log(1+x) to log1p(x) when it builds the node.
		{"log1p", func(g *G.ExprGraph, a *G.Node) *G.Node { return must(G.Log1p(a)) }, "log1p"},
		{"dropout", func(g *G.ExprGraph, a *G.Node) *G.Node { return must(G.Dropout(a, 0.5)) }, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := G.NewGraph()
			a := G.NewMatrix(g, G.Float64, G.WithShape(2, 3), G.WithName("a"))
			out := must(G.Exp(c.build(g, a)))
			_, err := Import(g, []*G.Node{out}, Options{})
			var ue *UnsupportedOpError
			if !errors.As(err, &ue) {
				t.Fatalf("err = %v, want an UnsupportedOpError", err)
			}
			if !strings.Contains(err.Error(), "gorgonia op "+ue.Op+" (node ") || !strings.Contains(err.Error(), ") is not supported") {
				t.Fatalf("error %q does not name the op", err)
			}
			if c.op != "" && ue.Op != c.op {
				t.Fatalf("op %q, want %q (error: %v)", ue.Op, c.op, err)
			}
			t.Log(err)
		})
	}
}

func TestNamesAndOptions(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	g := G.NewGraph()
	x := G.NewMatrix(g, G.Float64, G.WithShape(2, 3), G.WithName("x"))
	// Two variables share the name "w" (with different shapes: gorgonia
	// merges identical nodes): neither keeps it. One variable takes a name
	// the generator would use ("MatMul_0"): it keeps it, and the generated
	// names go around it.
	w1 := G.NewMatrix(g, G.Float64, G.WithShape(3, 3), G.WithName("w"), G.WithValue(dense([]int{3, 3}, randData(rng, 9, 1))))
	w2 := G.NewMatrix(g, G.Float64, G.WithShape(3, 4), G.WithName("w"), G.WithValue(dense([]int{3, 4}, randData(rng, 12, 1))))
	w3 := G.NewMatrix(g, G.Float64, G.WithShape(4, 4), G.WithName("MatMul_0"), G.WithValue(dense([]int{4, 4}, randData(rng, 16, 1))))
	y := must(G.Mul(must(G.Mul(must(G.Mul(x, w1)), w2)), w3))

	fg, names, err := ImportWithNames(g, []*G.Node{y}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if names[x] != "x" || names[w3] != "MatMul_0" || names[w1] == "w" || names[w2] == "w" || names[w1] == names[w2] {
		t.Fatalf("names: x=%q w1=%q w2=%q w3=%q", names[x], names[w1], names[w2], names[w3])
	}
	if len(fg.Params) != 3 || len(fg.Consts) != 0 {
		t.Fatalf("params %d consts %d, want 3 and 0", len(fg.Params), len(fg.Consts))
	}
	values := fg.Values()
	for _, n := range []*G.Node{x, w1, w2, w3, y} {
		if values[names[n]] == nil {
			t.Fatalf("names[%s] = %q is not a value of the graph", n.Name(), names[n])
		}
	}

	// Consts and Freeze move bound variables to consts.
	fg, err = Import(g, []*G.Node{y}, Options{Consts: []*G.Node{w2}})
	if err != nil {
		t.Fatal(err)
	}
	if len(fg.Params) != 2 || len(fg.Consts) != 1 {
		t.Fatalf("Consts: params %d consts %d, want 2 and 1", len(fg.Params), len(fg.Consts))
	}
	fg, err = Import(g, []*G.Node{y}, Options{Freeze: true, Name: "frozen"})
	if err != nil {
		t.Fatal(err)
	}
	if len(fg.Params) != 0 || len(fg.Consts) != 3 || len(fg.Inputs) != 1 || fg.Name != "frozen" {
		t.Fatalf("Freeze: inputs %d params %d consts %d name %q", len(fg.Inputs), len(fg.Params), len(fg.Consts), fg.Name)
	}

	// An unbound variable cannot be a const.
	if _, err := Import(g, []*G.Node{y}, Options{Consts: []*G.Node{x}}); err == nil {
		t.Fatal("an unbound variable became a const")
	}
	// Outputs must belong to the graph.
	other := G.NewGraph()
	z := G.NewMatrix(other, G.Float64, G.WithShape(2, 2), G.WithName("z"))
	if _, err := Import(g, []*G.Node{z}, Options{}); err == nil {
		t.Fatal("a node of another graph was imported")
	}
	if _, err := Import(g, nil, Options{}); err == nil {
		t.Fatal("no outputs accepted")
	}
}

// Only what the outputs depend on is imported.
func TestSubgraph(t *testing.T) {
	g := G.NewGraph()
	x := G.NewMatrix(g, G.Float64, G.WithShape(2, 2), G.WithName("x"))
	u := G.NewMatrix(g, G.Float64, G.WithShape(2, 2), G.WithName("unused"))
	_ = must(G.Expm1(u)) // unsupported, but not reached
	y := must(G.Exp(x))
	fg, err := Import(g, []*G.Node{y}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(fg.Inputs) != 1 || len(fg.Nodes) != 1 {
		t.Fatalf("import has %d inputs and %d nodes, want 1 and 1:\n%s", len(fg.Inputs), len(fg.Nodes), graph.Format(fg))
	}
}

// Options.Inputs can cut the graph at an op node: here, past an op that has
// no translation. The cut node's value (computed by gorgonia) is the feed.
func TestCutAtOpNode(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	g := G.NewGraph()
	a := mat(g, rng, "a", false, 3, 4)
	s := must(G.Expm1(a))
	y := must(G.Tanh(must(G.Exp(s))))
	if _, err := Import(g, []*G.Node{y}, Options{}); err == nil {
		t.Fatal("expm1 was imported")
	}
	fg, names, err := ImportWithNames(g, []*G.Node{y}, Options{Inputs: []*G.Node{s}})
	if err != nil {
		t.Fatal(err)
	}
	if len(fg.Inputs) != 1 || fg.Inputs[0].Name != names[s] || len(fg.Params) != 0 || len(fg.Nodes) != 2 {
		t.Fatalf("cut import:\n%s", graph.Format(fg))
	}
	want := runGorgonia(t, g, []*G.Node{y})
	feeds, err := Feeds(fg, names)
	if err != nil {
		t.Fatal(err)
	}
	assertClose(t, "tanh(exp(expm1))", runCPU(t, fg, feeds)[0], want[0], rtol64)
}
