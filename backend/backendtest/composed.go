package backendtest

import (
	"math"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// graphCase is a multi-op graph compared with the reference composed op by
// op in float64.
type graphCase struct {
	name string
	// skip returns a reason not to run with dt ("" to run).
	skip func(dt graph.DType) string
	fn   func(c *ctx)
}

// onlyWide skips narrow dtypes: a graph of many ops rounds every
// intermediate to bfloat16, so its error against an unrounded float64
// reference measures bfloat16, not the backend. Each op is checked in
// bfloat16 on its own by the op cases.
func onlyWide(dt graph.DType) string {
	if dt == graph.Float32 || dt == graph.Float64 {
		return ""
	}
	return "composed graphs are checked in float32 and float64 only"
}

func graphCases() []graphCase {
	return []graphCase{
		{"composed_attention", onlyWide, composedAttention},
		{"model_forward", onlyWide, modelForward},
	}
}

// composedAttention is the pattern the fusion pass rewrites —
// MatMul(Q,Kᵀ) → scale → causal mask → Softmax → MatMul(·,V) — next to the
// FlashAttention op on the same inputs; both must match the naive reference.
func composedAttention(c *ctx) {
	const b, h, s, d = 2, 2, 67, 16
	scale := 1 / math.Sqrt(d)
	q, rq := c.x(b, h, s, d)
	k, rk := c.x(b, h, s, d)
	v, rv := c.x(b, h, s, d)
	mask := c.b.Const("mask", c.dt, graph.Shape{s, s}, graph.CausalMask())
	y := c.b.Attention(q, k, v, scale, mask).Out
	ref, lse := refAttention(rq, rk, rv, scale, true)
	c.expect(y, ref)
	fused := c.opN("FlashAttention", graph.Attrs{"causal": graph.Int(1), "scale": graph.Float(scale)}, q, k, v)
	c.expect(fused[0], ref)
	c.expect(fused[1], lse)
}

// modelForward is a one-layer pre-norm transformer with a cross-entropy
// loss: Gather embedding, LayerNorm from reductions, multi-head causal
// FlashAttention through Reshape/Transpose, a GELU (Erf) MLP, residuals.
func modelForward(c *ctx) {
	const bsz, seq, dm, heads, vocab, ff = 2, 9, 16, 2, 13, 32
	const hd = dm / heads
	dt := c.dt
	tokens, rTok := c.input(graph.Int64, ints(0, vocab), bsz, seq)
	labels, rLab := c.input(graph.Int64, ints(0, vocab), bsz*seq)
	emb, rEmb := c.param("emb", dt, graph.Shape{vocab, dm}, graph.Normal(0.5, 1))
	pos, rPos := c.param("pos", dt, graph.Shape{seq, dm}, graph.Normal(0.1, 2))
	gamma, rGamma := c.param("gamma", dt, graph.Shape{dm}, graph.Normal(1, 3))
	beta, rBeta := c.param("beta", dt, graph.Shape{dm}, graph.Normal(0.1, 4))
	w := func(name string, rows, cols, seed int) (*graph.Value, *arr) {
		return c.param(name, dt, graph.Shape{rows, cols}, graph.Normal(1/math.Sqrt(float64(rows)), seed))
	}
	wq, rWq := w("wq", dm, dm, 5)
	wk, rWk := w("wk", dm, dm, 6)
	wv, rWv := w("wv", dm, dm, 7)
	wo, rWo := w("wo", dm, dm, 8)
	w1, rW1 := w("w1", dm, ff, 9)
	b1, rB1 := c.param("b1", dt, graph.Shape{ff}, graph.Normal(0.1, 10))
	w2, rW2 := w("w2", ff, dm, 11)
	wout, rWout := w("wout", dm, vocab, 12)

	// Graph.
	B := c.b
	x := B.Add(B.Gather(emb, tokens, 0), pos)
	mu := B.ReduceMean(x, true, -1)
	xc := B.Sub(x, mu)
	vr := B.ReduceMean(B.Mul(xc, xc), true, -1)
	hN := B.Div(xc, B.Sqrt(B.Add(vr, B.Scalar(dt, 1e-5))))
	hN = B.Add(B.Mul(hN, gamma), beta)
	split := func(t *graph.Value) *graph.Value {
		return B.Transpose(B.Reshape(t, bsz, seq, heads, hd), 0, 2, 1, 3)
	}
	scale := 1 / math.Sqrt(hd)
	att := c.opN("FlashAttention", graph.Attrs{"causal": graph.Int(1), "scale": graph.Float(scale)},
		split(B.MatMul(hN, wq)), split(B.MatMul(hN, wk)), split(B.MatMul(hN, wv)))[0]
	merged := B.Reshape(B.Transpose(att, 0, 2, 1, 3), bsz, seq, dm)
	x2 := B.Add(x, B.MatMul(merged, wo))
	u := B.Add(B.MatMul(x2, w1), b1)
	gelu := B.Mul(B.Mul(u, B.Scalar(dt, 0.5)),
		B.Add(B.Scalar(dt, 1), B.Op("Erf", nil, B.Div(u, B.Scalar(dt, math.Sqrt2)))))
	x3 := B.Add(x2, B.MatMul(gelu, w2))
	logits := B.MatMul(B.Reshape(x3, bsz*seq, dm), wout)
	loss := B.Op("SoftmaxCrossEntropyLoss", nil, logits, labels)

	// Reference, op by op.
	add := func(a, b *arr) *arr { return refElem("Add", a, b) }
	mul := func(a, b *arr) *arr { return refElem("Mul", a, b) }
	rx := add(refGather(rEmb, rTok, 0), rPos)
	rxc := refElem("Sub", rx, refReduce(rx, []int{-1}, true, "mean"))
	rvar := refReduce(mul(rxc, rxc), []int{-1}, true, "mean")
	rh := refElem("Div", rxc, mapArr(rvar, func(v float64) float64 { return math.Sqrt(v + 1e-5) }))
	rh = add(mul(rh, rGamma), rBeta)
	rsplit := func(t *arr) *arr { return refTranspose(reshaped(t, bsz, seq, heads, hd), []int{0, 2, 1, 3}) }
	ratt, _ := refAttention(rsplit(refMatMul(rh, rWq)), rsplit(refMatMul(rh, rWk)), rsplit(refMatMul(rh, rWv)), scale, true)
	rmerged := reshaped(refTranspose(ratt, []int{0, 2, 1, 3}), bsz, seq, dm)
	rx2 := add(rx, refMatMul(rmerged, rWo))
	ru := add(refMatMul(rx2, rW1), rB1)
	rgelu := mapArr(ru, func(v float64) float64 { return v * 0.5 * (1 + math.Erf(v/math.Sqrt2)) })
	rx3 := add(rx2, refMatMul(rgelu, rW2))
	rlogits := refMatMul(reshaped(rx3, bsz*seq, dm), rWout)
	c.expect(logits, rlogits)
	c.expect(loss, refSCE(rlogits, rLab, "mean"))
}

// trainingStep runs three steps of a softmax classifier trained with AdamW,
// its new weights and moments kept in the executable through
// Options.Updates, and checks each step's loss and state against the
// reference applied to the state read back with Initializer.
func trainingStep(t *testing.T, be backend.Backend, tol Tolerances) {
	for _, dt := range tol.floatDTypes() {
		if onlyWide(dt) != "" {
			continue
		}
		t.Run(dt.String(), func(t *testing.T) {
			const n, din, classes = 12, 7, 5
			c := &ctx{t: t, dt: dt, b: graph.NewBuilder("train"), feeds: map[string]*graph.Tensor{}, tol: tol[dt]}
			c.rng = newRand("training_step", dt)
			x, rx := c.x(n, din)
			labels, rLab := c.input(graph.Int64, ints(0, classes), n)
			stepV := c.b.Input("step", graph.Float64)
			w, _ := c.param("w", dt, graph.Shape{din, classes}, graph.Normal(0.3, 21))
			m, _ := c.param("m", dt, graph.Shape{din, classes}, graph.Zeros())
			v, _ := c.param("v", dt, graph.Shape{din, classes}, graph.Zeros())
			lr := c.b.Const("lr", graph.Float32, graph.Shape{}, graph.Fill(0.05))
			B := c.b
			logits := B.MatMul(x, w)
			loss := B.Op("SoftmaxCrossEntropyLoss", nil, logits, labels)
			dlogits := B.Op("SoftmaxCrossEntropyLossGrad", nil, B.Scalar(dt, 1), logits, labels)
			dw := B.MatMul(B.Transpose(x, 1, 0), dlogits)
			upd := c.opN("AdamW", graph.Attrs{"weight_decay": graph.Float(0.1)}, w, dw, m, v, lr, stepV)
			B.Output(loss, upd[0], upd[1], upd[2])
			g, err := B.Build()
			if err != nil {
				t.Fatal(err)
			}
			exe, err := be.Compile(g, backend.Options{PoisonOutputs: true,
				Updates: map[string]string{upd[0].Name: "w", upd[1].Name: "m", upd[2].Name: "v"}})
			if err != nil {
				t.Fatal(err)
			}
			defer exe.Close()
			state := func(name string) *arr {
				tt, err := exe.Initializer(name)
				if err != nil {
					t.Fatal(err)
				}
				return fromTensor(tt)
			}
			for step := 1; step <= 3; step++ {
				rw, rm, rv := state("w"), state("m"), state("v")
				feeds := map[string]*graph.Tensor{"step": tensorFrom(graph.Float64, &arr{shape: []int{}, data: []float64{float64(step)}})}
				for k, f := range c.feeds {
					feeds[k] = f
				}
				out, err := exe.Run(feeds)
				if err != nil {
					t.Fatal(err)
				}
				if len(out) != 1 {
					t.Errorf("Run returned %d outputs, want only the loss (updates stay inside)", len(out))
				}
				rlogits := refMatMul(rx, rw)
				compare(t, "loss", out[loss.Name], loss.Type, refSCE(rlogits, rLab, "mean"), c.tol)
				rdw := refMatMul(refTranspose(rx, []int{1, 0}), refSCEGrad(1, rlogits, rLab, "mean"))
				pw, pm, pv := refAdamW(rw, rdw, rm, rv, float64(float32(0.05)), float64(step), 0.9, 0.95, 1e-8, 0.1)
				for _, s := range []struct {
					name string
					ref  *arr
				}{{"w", pw}, {"m", pm}, {"v", pv}} {
					got, err := exe.Initializer(s.name)
					if err != nil {
						t.Fatal(err)
					}
					compare(t, s.name, got, got.Type(), s.ref, c.tol)
				}
			}
		})
	}
}
