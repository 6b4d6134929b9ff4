// Package gorgonia imports gorgonia (gorgonia.org/gorgonia v0.9.18)
// expression graphs into flashgraph's IR, so that a model written with
// gorgonia can be verified, fused (passes), inspected (text, DOT) and run on
// flashgraph's backends.
//
// Gorgonia's ExprGraph is not used as an IR here: its nodes cannot be safely
// rewritten, its node identities are pointers and its DOT output is not
// deterministic. Import instead walks the sub-graph that reaches the chosen
// outputs, depth first with children in operand order, and writes a
// graph.Graph whose node order and names depend only on the graph's
// structure: gorgonia names where they are set and unique, otherwise names
// generated from per-prefix counters (input_0, param_1, MatMul_2, ...).
//
// Leaves become graph inputs (variables with no value bound, and nodes
// listed in Options.Inputs, which may also cut the graph at an op node),
// params (variables with a bound float value) or consts (gorgonia
// constants, Options.Consts, or every bound variable with Options.Freeze).
// Initializer data is copied into graph.Literal recipes, so the imported
// graph no longer refers to gorgonia memory; a const whose data is exactly a
// causal mask (−Inf above the diagonal, +0 elsewhere) is recorded with the
// equivalent graph.CausalMask recipe, which keeps the text small and lets
// the attention fusion recognise it without reading the data.
//
// Ops (float64 and float32) are translated one by one, keeping gorgonia's
// semantics, quirks included; every translated node is checked to have the
// static type gorgonia gives it:
//
//   - Mul of two matrices is MatMul, of a matrix and a vector MatMul with a
//     rank-1 operand, of two vectors a dot product, of a scalar and anything
//     an elementwise Mul (gorgonia decides this when the node is built; the
//     node's op says which one it chose). OuterProd is a MatMul over an
//     inner dimension of 1.
//   - BatchedMatMul's transA/transB become a Transpose of the last two axes.
//   - Add, Sub, HadamardProd, HadamardDiv, Pow: on tensors of equal size but
//     different vector shapes ((n) and (1, n)) gorgonia pairs the flat data,
//     so the operand is reshaped. Broadcast{Add,Sub,HadamardProd,...} build
//     Reshape + Repeat nodes; where ONNX broadcasting of the operand before
//     them gives the same result, they are left out and the elementwise op
//     broadcasts. A Repeat that remains is Expand (of a size-1 axis) or
//     numpy's repeat (Expand of a new axis, then Reshape).
//   - SoftMax and LogSoftMax with no axis use the last axis, except for a
//     column vector (n, 1), where gorgonia uses axis 0; other axes are taken
//     modulo the rank, as gorgonia does.
//   - Sum and Max drop the reduced axes; Mean is gorgonia's Sum divided by a
//     product of SizeOf nodes, and SizeOf becomes a scalar const (shapes are
//     static).
//   - Exp, Log, Neg, Sqrt, Abs, Tanh, Sigmoid and Softplus (which gorgonia
//     builds log(sigmoid(x)) with) map to the ops of those names, Inverse
//     to Reciprocal, InverseSqrt to Reciprocal(Sqrt), Square and Cube to
//     products (x·x, x·x·x, as gorgonia computes them).
//   - Rectify (x ⊙ (x ≥ 0)) becomes Relu; LeakyRelu's x ⊙ (x < 0) becomes
//     −Relu(−x). The comparisons themselves are not imported.
//   - Transpose (with its pattern), Reshape, Concat, and Slice (one axis per
//     node; an axis gorgonia drops after selecting one index is reshaped
//     away) map to the ONNX ops.
//
// Where gorgonia's numerics depart from the function its op names, the
// import keeps the function: gorgonia's float64 Sigmoid returns exactly 1
// above x = 19 and 0 below −709, Relu(−Inf) is 0 where x·(x ≥ 0) is NaN,
// and gorgonia's last-axis softmax shifts each row by the larger of the
// tensor's first element and the row's other elements instead of the row
// maximum (a row far below that element comes out NaN there, not here).
// Elsewhere results agree to rounding (float64: 1e-12 relative in the tests).
//
// Everything else is refused by name, never guessed at: comparisons on
// their own, log2, log1p, expm1, At,
// Tensordot, convolutions, pooling, dropout, random nodes, gradient ops... Import returns an
// *UnsupportedOpError saying "gorgonia op X (node N) is not supported".
//
// Typical use (the Example runs it), with this package imported as fg and
// gorgonia as G:
//
//	g := G.NewGraph()
//	x := G.NewMatrix(g, G.Float64, G.WithShape(2, 3), G.WithName("x"))
//	w := G.NewMatrix(g, G.Float64, G.WithShape(3, 2), G.WithName("w"), G.WithValue(wT))
//	y := G.Must(G.Rectify(G.Must(G.Mul(x, w))))
//	m, names, err := fg.ImportWithNames(g, []*G.Node{y}, fg.Options{})
//	// m: input x, param w, MatMul_0 = MatMul(x, w), Relu_0 = Relu(MatMul_0);
//	// names[y] == "Relu_0". After G.Let(x, xT), fg.Feeds(m, names) gives
//	// the feeds for an executable of m.
//
// The package is self-contained: it is wired into no command.
package gorgonia
