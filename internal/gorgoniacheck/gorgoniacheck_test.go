package gorgoniacheck

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/flashgraph/flashgraph/autodiff"
	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/passes"
)

// The check: docs/MODEL.md's transformer at a small size, built by
// model.Build and differentiated by autodiff.Gradients (run on the CPU
// backend), against the same model written here from MODEL.md in gorgonia
// and differentiated by gorgonia's symbolic backprop. Nothing is shared but
// the parameter values and the tokens.
//
// Gorgonia is most solid on matrices, so its model is written over the
// B·S token rows as 2-D matrices: the embedding and the targets are one-hot
// matrix products, row broadcasts are outer products with a ones vector,
// rotate_half is a product with a signed permutation matrix, each
// (batch, head) attention block is a slice, and the causal softmax is
// exp(s)·mask / rowsum (scores stay within a few units, since q and k are
// RMS-normalised, so no max subtraction is needed).

// checkConfig is small enough for gorgonia and exercises everything: two
// layers, two heads, vocab, width, FFN and head dim all different, S odd.
var checkConfig = model.Config{
	Name: "gorgoniacheck", Vocab: 11, Dim: 8, Layers: 2, Heads: 2, HeadDim: 4, FFN: 12,
	Seq: 5, Batch: 2, DType: graph.Float64, Seed: 3,
}

// relTol is the agreement required of the loss and of every gradient entry,
// relative to the entry or, for entries far below their tensor's largest,
// to 1e-3 of that largest (sums that cancel carry rounding from their terms).
const relTol = 1e-9

// problem is one random instance: parameter values, tokens and targets.
type problem struct {
	cfg             model.Config
	params          map[string][]float64
	tokens, targets []int64
}

func newProblem(seed uint64) *problem {
	cfg := checkConfig
	rng := rand.New(rand.NewPCG(seed, 17))
	pr := &problem{cfg: cfg, params: map[string][]float64{}}
	for _, p := range cfg.Params() {
		d := make([]float64, p.Shape.Numel())
		for i := range d {
			// Larger than the model's init so that every nonlinearity is
			// exercised away from its linear regime.
			if strings.HasSuffix(p.Name, "norm") {
				d[i] = 1 + 0.3*rng.NormFloat64()
			} else {
				d[i] = 0.5 * rng.NormFloat64()
			}
		}
		pr.params[p.Name] = d
	}
	n := cfg.Batch * cfg.Seq
	pr.tokens, pr.targets = make([]int64, n), make([]int64, n)
	for i := range n {
		pr.tokens[i] = rng.Int64N(int64(cfg.Vocab))
		pr.targets[i] = rng.Int64N(int64(cfg.Vocab))
	}
	return pr
}

// ours runs flashgraph: Gradients of the (optionally fused) model graph on
// the CPU backend. It returns the loss and each parameter's gradient.
func ours(t *testing.T, pr *problem, fuse bool) (float64, map[string][]float64) {
	t.Helper()
	g, err := model.Build(pr.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if fuse {
		pl := passes.Default(true)
		pl.Verify = true
		if g, err = pl.Run(g, nil); err != nil {
			t.Fatal(err)
		}
		if n := g.CountOps()["FlashAttention"]; n != pr.cfg.Layers {
			t.Fatalf("fused graph has %d FlashAttention nodes, want %d", n, pr.cfg.Layers)
		}
	}
	var names []string
	for _, p := range g.Params {
		names = append(names, p.Name)
	}
	gg, grads, err := autodiff.Gradients(g, "loss", names)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := cpu.New().Compile(gg, backend.Options{PoisonOutputs: true})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	for _, p := range g.Params {
		x := graph.NewTensor(graph.Float64, p.Type.Shape)
		copy(x.F64, pr.params[p.Name])
		if err := exe.SetInitializer(p.Name, x); err != nil {
			t.Fatal(err)
		}
	}
	shape := graph.Shape{pr.cfg.Batch, pr.cfg.Seq}
	tok, tgt := graph.NewTensor(graph.Int64, shape), graph.NewTensor(graph.Int64, shape)
	copy(tok.I64, pr.tokens)
	copy(tgt.I64, pr.targets)
	out, err := exe.Run(map[string]*graph.Tensor{"tokens": tok, "targets": tgt})
	if err != nil {
		t.Fatal(err)
	}
	res := map[string][]float64{}
	for _, name := range names {
		res[name] = out[grads[name]].F64
	}
	return out["loss"].At(0), res
}

// gorgoniaModel builds MODEL.md in gorgonia and runs its backprop.
type gorgoniaModel struct {
	t    *testing.T
	g    *G.ExprGraph
	pr   *problem
	anon int
}

// name returns name, or a fresh one for anonymous constants: gorgonia
// identifies input nodes by name and type, so two unnamed constants of one
// shape would silently become one node.
func (m *gorgoniaModel) name(name string) string {
	if name != "" {
		return name
	}
	m.anon++
	return fmt.Sprintf("const_%d", m.anon)
}

func (m *gorgoniaModel) must(n *G.Node, err error) *G.Node {
	m.t.Helper()
	if err != nil {
		m.t.Fatal(err)
	}
	return n
}

// mat is a matrix node holding data (row-major r×c).
func (m *gorgoniaModel) mat(name string, r, c int, data []float64) *G.Node {
	v := tensor.New(tensor.WithShape(r, c), tensor.WithBacking(append([]float64(nil), data...)))
	return G.NewMatrix(m.g, G.Float64, G.WithShape(r, c), G.WithName(m.name(name)), G.WithValue(v))
}

func (m *gorgoniaModel) scalar(name string, v float64) *G.Node {
	return G.NewScalar(m.g, G.Float64, G.WithName(m.name(name)), G.WithValue(v))
}

func (m *gorgoniaModel) fill(name string, r, c int, v float64) *G.Node {
	d := make([]float64, r*c)
	for i := range d {
		d[i] = v
	}
	return m.mat(name, r, c, d)
}

func (m *gorgoniaModel) mul(a, b *G.Node) *G.Node { return m.must(G.Mul(a, b)) }
func (m *gorgoniaModel) had(a, b *G.Node) *G.Node { return m.must(G.HadamardProd(a, b)) }
func (m *gorgoniaModel) add(a, b *G.Node) *G.Node { return m.must(G.Add(a, b)) }
func (m *gorgoniaModel) sub(a, b *G.Node) *G.Node { return m.must(G.Sub(a, b)) }
func (m *gorgoniaModel) cols(x *G.Node, lo, hi int) *G.Node {
	return m.must(G.Slice(x, nil, G.S(lo, hi)))
}
func (m *gorgoniaModel) rows(x *G.Node, lo, hi int) *G.Node {
	return m.must(G.Slice(x, G.S(lo, hi), nil))
}

// rmsnorm of the rows of x [r, c] with gain w [1, c]:
// x · 1/sqrt(mean(x²) + eps) · w, the row statistic spread by outer products.
func (m *gorgoniaModel) rmsnorm(x, w *G.Node, r, c int) *G.Node {
	ms := m.had(m.mul(m.had(x, x), m.fill("", c, 1, 1)), m.scalar("", 1/float64(c))) // [r, 1]
	inv := m.must(G.Inverse(m.must(G.Sqrt(m.add(ms, m.scalar("", model.NormEps))))))
	xn := m.had(x, m.mul(inv, m.fill("", 1, c, 1)))
	return m.had(xn, m.mul(m.fill("", r, 1, 1), w))
}

// run builds the model and returns the loss and every parameter's gradient.
func (m *gorgoniaModel) run() (float64, map[string][]float64) {
	t, pr := m.t, m.pr
	c := pr.cfg
	B, S, H, D, V := c.Batch, c.Seq, c.Heads, c.HeadDim, c.Vocab
	N := B * S

	params := map[string]*G.Node{}
	var order []string
	var wrt G.Nodes
	for _, p := range c.Params() {
		r, cc := 1, p.Shape[0]
		if p.Shape.Rank() == 2 {
			r, cc = p.Shape[0], p.Shape[1]
		}
		n := m.mat(p.Name, r, cc, pr.params[p.Name])
		params[p.Name] = n
		order = append(order, p.Name)
		wrt = append(wrt, n)
	}
	onehot := func(name string, idx []int64) *G.Node {
		d := make([]float64, N*V)
		for i, k := range idx {
			d[i*V+int(k)] = 1
		}
		return m.mat(name, N, V, d)
	}
	// RoPE tables per token row (position = row mod S), from MODEL.md.
	cosD, sinD := make([]float64, N*D), make([]float64, N*D)
	for row := range N {
		pos := float64(row % S)
		for i := range D / 2 {
			ang := pos * math.Pow(model.RopeTheta, -2*float64(i)/float64(D))
			for _, j := range []int{i, i + D/2} {
				cosD[row*D+j], sinD[row*D+j] = math.Cos(ang), math.Sin(ang)
			}
		}
	}
	cosN, sinN := m.mat("cos", N, D, cosD), m.mat("sin", N, D, sinD)
	// rotate_half(x) = concat(−x[D/2:], x[:D/2]) = x·R.
	rot := make([]float64, D*D)
	for j := range D / 2 {
		rot[(j+D/2)*D+j] = -1
		rot[j*D+j+D/2] = 1
	}
	R := m.mat("rot", D, D, rot)
	causal := make([]float64, S*S)
	for i := range S {
		for j := 0; j <= i; j++ {
			causal[i*S+j] = 1
		}
	}
	mask := m.mat("causal", S, S, causal)
	rope := func(x *G.Node) *G.Node { return m.add(m.had(x, cosN), m.had(m.mul(x, R), sinN)) }
	p := func(i int, name string) *G.Node { return params["layers."+string(rune('0'+i))+"."+name] }

	x := m.mul(onehot("tokens", pr.tokens), params["tok_emb"]) // [N, dim]
	for i := range c.Layers {
		h := m.rmsnorm(x, p(i, "attn_norm"), N, c.Dim)
		q, k, v := m.mul(h, p(i, "wq")), m.mul(h, p(i, "wk")), m.mul(h, p(i, "wv"))
		var heads G.Nodes
		for hd := range H {
			qh := rope(m.rmsnorm(m.cols(q, hd*D, hd*D+D), p(i, "q_norm"), N, D))
			kh := rope(m.rmsnorm(m.cols(k, hd*D, hd*D+D), p(i, "k_norm"), N, D))
			vh := m.cols(v, hd*D, hd*D+D)
			var blocks G.Nodes
			for b := range B {
				qb, kb, vb := m.rows(qh, b*S, b*S+S), m.rows(kh, b*S, b*S+S), m.rows(vh, b*S, b*S+S)
				s := m.had(m.mul(qb, m.must(G.Transpose(kb))), m.scalar("", 1/math.Sqrt(float64(D))))
				e := m.had(m.must(G.Exp(s)), mask)
				den := m.mul(e, m.fill("", S, 1, 1))
				pb := m.had(e, m.mul(m.must(G.Inverse(den)), m.fill("", 1, S, 1)))
				blocks = append(blocks, m.mul(pb, vb))
			}
			heads = append(heads, m.must(G.Concat(0, blocks...)))
		}
		o := m.must(G.Concat(1, heads...)) // [N, H·D], head-major columns
		x = m.add(x, m.mul(o, p(i, "wo")))
		h = m.rmsnorm(x, p(i, "mlp_norm"), N, c.Dim)
		gate := m.mul(h, p(i, "w_gate"))
		act := m.had(gate, m.must(G.Sigmoid(gate)))
		x = m.add(x, m.mul(m.had(act, m.mul(h, p(i, "w_up"))), p(i, "w_down")))
	}
	x = m.rmsnorm(x, params["final_norm"], N, c.Dim)
	logits := m.mul(x, params["lm_head"]) // [N, V]
	// Mean cross-entropy: logsumexp of each row minus the target's logit.
	onesV := m.fill("", V, 1, 1)
	lse := m.must(G.Log(m.mul(m.must(G.Exp(logits)), onesV)))
	picked := m.mul(m.had(logits, onehot("targets", pr.targets)), onesV)
	loss := m.had(m.must(G.Sum(m.sub(lse, picked))), m.scalar("", 1/float64(N)))

	gradNodes, err := G.Grad(loss, wrt...)
	if err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(m.g)
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		t.Fatal(err)
	}
	grads := map[string][]float64{}
	for i, name := range order {
		d, ok := gradNodes[i].Value().Data().([]float64)
		if !ok {
			t.Fatalf("gorgonia gradient of %s is %T", name, gradNodes[i].Value().Data())
		}
		grads[name] = append([]float64(nil), d...)
	}
	return loss.Value().Data().(float64), grads
}

// compare asserts the two gradients agree entry by entry and returns the
// worst relative error.
func compare(t *testing.T, what string, got, want []float64) float64 {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d entries, gorgonia has %d", what, len(got), len(want))
	}
	scale := 0.0
	for _, w := range want {
		scale = math.Max(scale, math.Abs(w))
	}
	worst, bad := 0.0, 0
	for i := range got {
		den := math.Max(math.Abs(want[i]), 1e-3*scale)
		e := math.Abs(got[i]-want[i]) / den
		if den == 0 {
			e = math.Abs(got[i])
		}
		worst = math.Max(worst, e)
		if !(e <= relTol) {
			if bad++; bad <= 5 {
				t.Errorf("%s[%d]: flashgraph %.15g, gorgonia %.15g (relative error %.2g)", what, i, got[i], want[i], e)
			}
		}
	}
	return worst
}

func checkAgainstGorgonia(t *testing.T, fuse bool) {
	for _, seed := range []uint64{1, 2} {
		pr := newProblem(seed)
		m := &gorgoniaModel{t: t, g: G.NewGraph(), pr: pr}
		wantLoss, want := m.run()
		gotLoss, got := ours(t, pr, fuse)
		if e := math.Abs(gotLoss-wantLoss) / math.Abs(wantLoss); !(e <= relTol) {
			t.Errorf("seed %d: loss %.15g, gorgonia %.15g (relative error %.2g)", seed, gotLoss, wantLoss, e)
		}
		worst := 0.0
		for _, p := range pr.cfg.Params() {
			worst = math.Max(worst, compare(t, p.Name, got[p.Name], want[p.Name]))
		}
		t.Logf("seed %d: loss %.12f (gorgonia %.12f); %d parameter gradients, worst relative error %.2g",
			seed, gotLoss, wantLoss, len(want), worst)
	}
}

func TestGradientsMatchGorgonia(t *testing.T) { checkAgainstGorgonia(t, false) }

func TestFusedGradientsMatchGorgonia(t *testing.T) { checkAgainstGorgonia(t, true) }
