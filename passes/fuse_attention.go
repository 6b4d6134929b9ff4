package passes

import (
	"fmt"
	"math"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// fuse_attention rewrites, on canonical forms (see canonicalize.go),
//
//	s = MatMul(Q, Kᵀ) [→ Mul(·, c)] [→ Add(·, M) | Where(B, ·, F)] [→ Mul(·, c')]
//	p = Softmax(s, axis -1)
//	o = MatMul(p, V)
//
// to o = flashgraph.FlashAttention(Q, K, V){causal, scale = c·c'}. Its first
// output takes o's place (and name); its logsumexp output is left unused
// (autodiff uses it in training graphs). Kᵀ may be Transpose(K) by any perm:
// K is that transpose with the last two perm entries swapped (no node at
// all for the usual [0,1,3,2], a [0,2,1,3] for GPT-2's [0,2,3,1]); Kᵀ fed
// already transposed (a value laid out [.., D, S]) gets a Transpose inserted.
//
// The rules are rooted at o's MatMul and match upwards from it, so no user
// of the Softmax is searched for; their log lines are about the Softmax.
// The rules refuse, with the reason, whatever would change the meaning: a
// mask that is not exactly causal, probs or scores read by anything else,
// softmax over another axis, a scale that is not a constant scalar,
// anything (dropout) between Softmax and the second MatMul, shapes that
// broadcast.

// MaskThreshold is the criterion for a finite mask value standing for −∞:
// m qualifies when m ≤ MaskThreshold (after any scale applied to it).
//
// Why: the fused kernel masks with a true −∞, i.e. a masked weight of
// exactly 0. A finite m gives the weight exp(m + s_ij − max_i), which is
// exactly 0 in float64 (and so in every narrower type, whose exp underflows
// sooner) when m + (s_ij − max_i) < ln(smallest subnormal) ≈ −744.4. With
// m ≤ −1e4 that holds unless a masked score exceeds its row's visible
// maximum by more than ~9255, far beyond what real scores do (a spread of
// ~40 already puts a weight below float64's epsilon). It admits what
// exporters use: −1e4 (GPT-2's masked_bias), −1e9, float32's lowest (HF's
// finfo.min), −65504 (float16's lowest) and −inf; it rejects −100 or −1000,
// which scores of a few hundred can overcome, and −1e4 scaled by 1/√d after
// the mask, which is no longer −1e4.
const MaskThreshold = -1e4

// FuseAttention returns the attention fusion pass. Every Softmax of the
// graph gets a log line: the firing, or the first refusal's reason.
func FuseAttention() Pass {
	return &RulePass{
		PassName: PassFuseAttention, Rules: attentionRules,
		ExplainOp: "Softmax", Unreached: []Cond{{Name: "softmax over the last axis", Check: softmaxLastAxis}, probsUnreached},
	}
}

// Captures shared by the rules:
//
//	q, kt          the operands of the scores MatMul
//	scores         MatMul(q, kt)
//	scale, scaled  an optional Mul by a constant before the mask, and its output
//	mask | cond, fill  the additive mask, or Where's condition and fill value
//	masked         the mask's output
//	post_scale, post_scaled  an optional Mul by a constant after the mask
//	probs          the Softmax output (what the log lines are about)
//	v              the right operand of the root MatMul(probs, V)
func qkScaled() *Pattern {
	return Maybe("Mul", Op("MatMul", Any("q"), Any("kt")).As("scores"), Any("scale")).As("scaled")
}

// probsTimesV is the root of every attention rule: MatMul(Softmax(x), V)
// with x the scores after masked (an optional Mul by a constant).
func probsTimesV(masked *Pattern) *Pattern {
	return Op("MatMul", softmaxOf(Maybe("Mul", masked.As("masked"), Any("post_scale")).As("post_scaled")), Any("v"))
}

func softmaxOf(x *Pattern) *Pattern { return Op("Softmax", x).As("probs") }

// attentionRules: tried in order at every MatMul; the first whose pattern
// matches and whose conditions hold fires. Their log lines are about the
// Softmax; a Softmax no MatMul(probs, V) matched through is explained by
// matching its part of the patterns (FuseAttention's Unreached).
var attentionRules = []Rule{
	{
		Name: "attention_add_mask", Root: "MatMul", Report: "probs",
		Pattern: probsTimesV(Op("Add", qkScaled(), Any("mask"))),
		Where:   attentionConds(additiveMask),
		Rewrite: fuseAttention,
	},
	{
		// Where(keep, scores, fill): true keeps a score.
		Name: "attention_where_keep", Root: "MatMul", Report: "probs",
		Pattern: probsTimesV(Op("Where", Any("cond"), qkScaled(), Any("fill"))),
		Where:   attentionConds(whereMask(true)),
		Rewrite: fuseAttention,
	},
	{
		// Where(masked_out, fill, scores): true fills.
		Name: "attention_where_fill", Root: "MatMul", Report: "probs",
		Pattern: probsTimesV(Op("Where", Any("cond"), Any("fill"), qkScaled())),
		Where:   attentionConds(whereMask(false)),
		Rewrite: fuseAttention,
	},
	{
		Name: "attention_no_mask", Root: "MatMul", Report: "probs",
		Pattern: Op("MatMul", softmaxOf(qkScaled()), Any("v")),
		Where:   attentionConds(Cond{Name: "no mask", Check: func(m *Match) string { m.Set("causal", false); return "" }}),
		Rewrite: fuseAttention,
	},
}

// attentionConds is the conditions every attention rule checks, in the
// order their reasons are reported, with the rule's mask check last.
func attentionConds(mask Cond) []Cond {
	return []Cond{
		{Name: "softmax over the last axis", Check: softmaxLastAxis},
		{Name: "probs feed only MatMul(probs, V)", Check: probsFeedPV},
		{Name: "scores feed only the softmax", Check: chainPrivate},
		{Name: "scales are constant scalars", Check: constantScales},
		{Name: "shapes fit FlashAttention", Check: attentionShapes},
		mask,
	}
}

func softmaxLastAxis(m *Match) string {
	axis := m.Node("probs").Attrs.Int("axis", -1)
	r := m.Value("probs").Type.Shape.Rank()
	a, err := graph.NormAxis(int(axis), r)
	if err != nil {
		return err.Error()
	}
	if a != r-1 {
		return fmt.Sprintf("softmax axis is %d, not the last axis (%d)", axis, r-1)
	}
	return ""
}

// probsFeedPV: the root MatMul(probs, V) must be the only reader of probs.
func probsFeedPV(m *Match) string {
	p := m.Value("probs")
	if m.IsOutput(p) {
		return "probs are a graph output"
	}
	if m.Value("v") == p {
		return fmt.Sprintf("probs are the right operand of node %s, want MatMul(probs, V)", m.Root.Name)
	}
	for _, u := range m.Users(p) {
		if u != m.Root {
			return fmt.Sprintf("probs also used by node %s", u.Name)
		}
	}
	return ""
}

// probsUnreached says why no MatMul(probs, V) matched through a Softmax
// whose part of the pattern matches: nothing reads probs that way.
var probsUnreached = Cond{
	Name: "probs feed MatMul(probs, V)",
	Check: func(m *Match) string {
		p := m.Value("probs")
		if m.IsOutput(p) {
			return "probs are a graph output"
		}
		users := m.Users(p)
		if len(users) == 0 {
			return "probs are unused"
		}
		u := users[0]
		if u.Op == "MatMul" {
			return fmt.Sprintf("probs are the right operand of node %s, want MatMul(probs, V)", u.Name)
		}
		return fmt.Sprintf("probs feed node %s (%s), not MatMul(probs, V): dropout or any other op between Softmax and the second MatMul is not fused", u.Name, u.Op)
	},
}

// chainPrivate: the fused kernel never materialises the scores, so a
// score tensor someone else reads would have to be computed anyway (and a
// fusion that keeps the N×N tensor alive gains nothing).
func chainPrivate(m *Match) string {
	for _, c := range []struct{ name, what string }{
		{"scores", "scores"}, {"scaled", "scaled scores"}, {"masked", "masked scores"}, {"post_scaled", "scaled scores"},
	} {
		v := m.Value(c.name)
		if v == nil {
			continue
		}
		if m.IsOutput(v) {
			return fmt.Sprintf("%s %s are a graph output", c.what, v.Name)
		}
		for _, u := range m.Users(v) {
			if u != consumerIn(m, c.name) {
				return fmt.Sprintf("%s %s also used by node %s", c.what, v.Name, u.Name)
			}
		}
		if len(m.Users(v)) > 1 {
			return fmt.Sprintf("%s %s are read twice by node %s", c.what, v.Name, m.Users(v)[0].Name)
		}
	}
	return ""
}

// consumerIn returns the chain node that reads the value captured as name:
// the next present stage of scores → scaled → masked → post_scaled → probs.
func consumerIn(m *Match, name string) *graph.Node {
	stages := []string{"scores", "scaled", "masked", "post_scaled", "probs"}
	seen := false
	for _, s := range stages {
		if seen && m.Has(s) {
			return m.Node(s)
		}
		seen = seen || s == name
	}
	return nil
}

func constantScales(m *Match) string {
	scale := 1.0
	for _, c := range []struct{ name, what string }{{"scale", "scale"}, {"post_scale", "scale after the mask"}} {
		if !m.Has(c.name) {
			continue
		}
		v, why := m.Scalar(m.Value(c.name))
		if why != "" {
			return c.what + " " + why
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Sprintf("%s %s is %v", c.what, m.Value(c.name).Name, v)
		}
		if c.name == "post_scale" && m.Has("masked") && !(v > 0) {
			return fmt.Sprintf("%s %s is %v: a scale that is not positive turns the mask's −inf around", c.what, m.Value(c.name).Name, v)
		}
		m.Set(c.name, v)
		scale *= v
	}
	m.Set("attn_scale", scale)
	m.Set("post_mult", 1.0)
	if m.Has("post_scale") {
		m.Set("post_mult", m.Get("post_scale").(float64))
	}
	return ""
}

func attentionShapes(m *Match) string {
	q, kt, scores := m.Value("q"), m.Value("kt"), m.Value("scores")
	pv := m.Root
	v := m.Value("v")
	r := q.Type.Shape.Rank()
	if r != 3 && r != 4 {
		return fmt.Sprintf("Q %s is rank %d: FlashAttention takes [B,H,S,D] or [BH,S,D]", q.Name, r)
	}
	if kt.Type.Shape.Rank() != r || v.Type.Shape.Rank() != r {
		return fmt.Sprintf("Q, Kᵀ, V ranks differ (%v, %v, %v): broadcasting MatMuls are not fused", q.Type.Shape, kt.Type.Shape, v.Type.Shape)
	}
	if !q.Type.Shape[:r-2].Equal(kt.Type.Shape[:r-2]) || !q.Type.Shape[:r-2].Equal(v.Type.Shape[:r-2]) {
		return fmt.Sprintf("Q, Kᵀ, V batch dims differ (%v, %v, %v): broadcasting MatMuls are not fused", q.Type.Shape, kt.Type.Shape, v.Type.Shape)
	}
	for _, name := range []string{"scaled", "masked", "post_scaled"} {
		if x := m.Value(name); x != nil && !x.Type.Equal(scores.Type) {
			return fmt.Sprintf("%s changes the scores from %v to %v (broadcasting)", describe(x), scores.Type, x.Type)
		}
	}
	if dq, dv := q.Type.Shape[r-1], v.Type.Shape[r-1]; dq != dv {
		return fmt.Sprintf("V head dim %d differs from Q's %d: FlashAttention needs equal head dims", dv, dq)
	}
	kShape := kt.Type.Shape.Clone()
	kShape[r-2], kShape[r-1] = kShape[r-1], kShape[r-2]
	k := &graph.Value{Name: "K", Type: graph.TensorType{DType: kt.Type.DType, Shape: kShape}}
	_, types, err := graph.InferNode("FlashAttention", []*graph.Value{q, k, v}, graph.Attrs{"scale": graph.Float(1)})
	if err != nil {
		return err.Error()
	}
	if out := pv.Outputs[0]; !types[0].Equal(out.Type) {
		return fmt.Sprintf("FlashAttention would give %v where %s is %v", types[0], out.Name, out.Type)
	}
	return ""
}

// maskKey memoises mask verdicts: every layer shares the mask, so it is
// checked once however many layers there are.
type maskKey struct {
	kind       string
	a, b       *graph.Value
	mult       float64
	sq, sk     int
	keepIfTrue bool
}

// maskVerdict is a checked mask: causal, no mask at all (zeros), or why not.
type maskVerdict struct {
	causal bool
	why    string
}

func scoresDims(m *Match) (sq, sk int) {
	s := m.Value("scores").Type.Shape
	return s[s.Rank()-2], s[s.Rank()-1]
}

var additiveMask = Cond{
	Name: "mask is causal",
	Check: func(m *Match) string {
		mask := m.Value("mask")
		sq, sk := scoresDims(m)
		mult := m.Get("post_mult").(float64)
		key := maskKey{kind: "add", a: mask, mult: mult, sq: sq, sk: sk}
		vd := m.Memo(key, func() any { return checkAdditiveMask(m, mask, mult, sq, sk) }).(maskVerdict)
		if vd.why != "" {
			return vd.why
		}
		m.Set("causal", vd.causal)
		return ""
	},
}

func checkAdditiveMask(m *Match, mask *graph.Value, mult float64, sq, sk int) maskVerdict {
	// The model's recipes need no materialising.
	if mask.Kind == graph.Const && mask.Init != nil && mult > 0 {
		switch mask.Init.Fn {
		case "causal_mask":
			if mask.Type.Shape.Equal(graph.Shape{sq, sk}) {
				return maskVerdict{causal: true}
			}
		case "zeros":
			return maskVerdict{}
		}
	}
	t, err := m.Const(mask)
	if err != nil {
		if why := runtimeMask("mask", mask, sk); why != "" {
			return maskVerdict{why: why}
		}
		return maskVerdict{why: "mask " + err.Error()}
	}
	return scanMask([]*graph.Tensor{t}, sq, sk, func(x []float64) float64 { return x[0] * mult })
}

func whereMask(keepIfTrue bool) Cond {
	return Cond{
		Name: "mask is causal",
		Check: func(m *Match) string {
			cond, fill := m.Value("cond"), m.Value("fill")
			sq, sk := scoresDims(m)
			mult := m.Get("post_mult").(float64)
			key := maskKey{kind: "where", a: cond, b: fill, mult: mult, sq: sq, sk: sk, keepIfTrue: keepIfTrue}
			vd := m.Memo(key, func() any {
				c, err := m.Const(cond)
				if err != nil {
					if why := runtimeMask("mask condition", cond, sk); why != "" {
						return maskVerdict{why: why}
					}
					return maskVerdict{why: "mask condition " + err.Error()}
				}
				f, err := m.Const(fill)
				if err != nil {
					return maskVerdict{why: "mask fill value " + err.Error()}
				}
				return scanMask([]*graph.Tensor{c, f}, sq, sk, func(x []float64) float64 {
					if (x[0] != 0) == keepIfTrue {
						return 0 // the score is kept: as if 0 were added
					}
					return x[1] * mult
				})
			}).(maskVerdict)
			if vd.why != "" {
				return vd.why
			}
			m.Set("causal", vd.causal)
			return ""
		},
	}
}

// maskView reads an additive mask given as eff(elements of ts) as the
// [sq, sk] matrices of its broadcast (broadcast rows and columns are read at
// stride 0, so a [S] or [1, S] mask is checked as the matrix it broadcasts
// to).
type maskView struct {
	ts      []*graph.Tensor
	strides [][]int
	lead    graph.Shape // the broadcast's dims before the last two
	sq, sk  int
	eff     func(x []float64) float64
}

func newMaskView(ts []*graph.Tensor, sq, sk int, eff func(x []float64) float64) (*maskView, string) {
	shapes := make([]graph.Shape, len(ts))
	for i, t := range ts {
		shapes[i] = t.Shape
	}
	view, err := graph.Broadcast(shapes...)
	if err != nil {
		return nil, "mask " + err.Error()
	}
	for view.Rank() < 2 {
		view = append(graph.Shape{1}, view...)
	}
	r := view.Rank()
	if (view[r-2] != 1 && view[r-2] != sq) || (view[r-1] != 1 && view[r-1] != sk) {
		return nil, fmt.Sprintf("mask shape %v does not fit scores [.., %d, %d]", view, sq, sk)
	}
	view = view.Clone()
	view[r-2], view[r-1] = sq, sk
	mv := &maskView{ts: ts, strides: make([][]int, len(ts)), lead: view[:r-2], sq: sq, sk: sk, eff: eff}
	for i, t := range ts {
		if mv.strides[i], err = broadcastStrides(t.Shape, view); err != nil {
			return nil, "mask " + err.Error()
		}
	}
	return mv, ""
}

// each calls f with every [sq, sk] matrix of effective mask values (row
// major), stopping at the first non-empty reason f returns, which it returns.
func (mv *maskView) each(f func(e []float64) string) string {
	r := len(mv.lead) + 2
	e := make([]float64, mv.sq*mv.sk)
	base := make([]int, len(mv.ts))
	x := make([]float64, len(mv.ts))
	idx := make([]int, len(mv.lead))
	for range mv.lead.Numel() {
		for t := range mv.ts {
			base[t] = 0
			for d := range mv.lead {
				base[t] += idx[d] * mv.strides[t][d]
			}
		}
		for i := range mv.sq {
			for j := range mv.sk {
				for t, tt := range mv.ts {
					x[t] = tt.At(base[t] + i*mv.strides[t][r-2] + j*mv.strides[t][r-1])
				}
				e[i*mv.sk+j] = mv.eff(x)
			}
		}
		if why := f(e); why != "" {
			return why
		}
		for d := len(idx) - 1; d >= 0; d-- {
			if idx[d]++; idx[d] < mv.lead[d] {
				break
			}
			idx[d] = 0
		}
	}
	return ""
}

// isMaskValue: v stands for −inf (−inf included, NaN not).
func isMaskValue(v float64) bool { return v <= MaskThreshold }

// scanMask checks an additive mask given as eff(elements of ts) over every
// [.., sq, sk] slice of its broadcast. Positions j > i (strictly above the
// diagonal, top-left aligned as FlashAttention's causal flag) must all be
// masked values or all be 0; every other position must be exactly 0.
func scanMask(ts []*graph.Tensor, sq, sk int, eff func(x []float64) float64) maskVerdict {
	mv, why := newMaskView(ts, sq, sk, eff)
	if why != "" {
		return maskVerdict{why: why}
	}
	masked, zero := 0, 0
	var zeroAt [2]int
	below := [2]int{-1, -1} // the first masked position on or below the diagonal
	why = mv.each(func(e []float64) string {
		for i := range sq {
			for j := range sk {
				v := e[i*sk+j]
				switch {
				case math.IsNaN(v):
					return fmt.Sprintf("mask has NaN at [%d,%d]", i, j)
				case j > i && isMaskValue(v):
					masked++
				case j > i && v == 0:
					if zero == 0 {
						zeroAt = [2]int{i, j}
					}
					zero++
				case j > i:
					return fmt.Sprintf("mask value %s at [%d,%d] does not stand for −inf (causal masks need −inf or ≤ %g)", graph.FormatFloat(v), i, j, MaskThreshold)
				case isMaskValue(v):
					below = [2]int{i, j}
					return "masks on or below the diagonal"
				case v != 0:
					return fmt.Sprintf("mask is not causal: it adds %s at [%d,%d] (a bias, not a mask)", graph.FormatFloat(v), i, j)
				}
			}
		}
		return ""
	})
	if below[0] >= 0 {
		return maskVerdict{why: mv.notCausal(below[0], below[1])}
	}
	if why != "" {
		return maskVerdict{why: why}
	}
	if masked > 0 && zero > 0 {
		return maskVerdict{why: fmt.Sprintf("mask is not causal: [%d,%d] above the diagonal is not masked", zeroAt[0], zeroAt[1])}
	}
	return maskVerdict{causal: masked > 0}
}

// notCausal says what a mask that masks [i0,j0], on or below the diagonal
// (the first such position), is instead, when it is one of the masks models
// use that FlashAttention's causal flag cannot express: a sliding window
// (Mistral: each query sees only its last w keys) or a padding mask (the
// same keys masked for every query). Fusing either as causal would let
// queries see keys the model hides.
func (mv *maskView) notCausal(i0, j0 int) string {
	// Row-major, a window of w keys first masks [w, 0].
	if w := i0 - j0; j0 == 0 && w >= 1 && mv.matches(func(i, j int) bool { return j > i || i-j >= w }) {
		return fmt.Sprintf("mask is a sliding window of %d keys, not causal: query i sees keys i-%d..i only ([%d,%d] is masked); FlashAttention's causal flag has no window", w, w-1, i0, j0)
	}
	var keys []int // masked keys of the first matrix
	first := true
	perKey := mv.each(func(e []float64) string {
		for j := range mv.sk {
			col := isMaskValue(e[j])
			for i := range mv.sq {
				if v := e[i*mv.sk+j]; isMaskValue(v) != col || (!col && v != 0) {
					return "differs between queries"
				}
			}
			if first && col {
				keys = append(keys, j)
			}
		}
		first = false
		return ""
	}) == ""
	if perKey {
		return fmt.Sprintf("mask is a padding mask, not causal: it masks the same keys for every query (keys %s of the first [%d,%d] matrix); FlashAttention takes no mask input, only a causal flag", fmtKeys(keys), mv.sq, mv.sk)
	}
	return fmt.Sprintf("mask is not causal: it masks [%d,%d], on or below the diagonal", i0, j0)
}

// fmtKeys lists key indices, the first 8 of a long list.
func fmtKeys(keys []int) string {
	if len(keys) > 8 {
		return fmt.Sprintf("%v … (%d in all)", keys[:8], len(keys))
	}
	return fmt.Sprint(keys)
}

// matches reports whether every matrix of the mask masks exactly where
// masked(i, j) says and is 0 everywhere else.
func (mv *maskView) matches(masked func(i, j int) bool) bool {
	return mv.each(func(e []float64) string {
		for i := range mv.sq {
			for j := range mv.sk {
				v := e[i*mv.sk+j]
				if isMaskValue(v) != masked(i, j) || (!masked(i, j) && v != 0) {
					return "differs"
				}
			}
		}
		return ""
	}) == ""
}

// runtimeMask says why a mask read from graph inputs is not fused: it is a
// padding mask (one value per key: [.., 1, Sk] or [Sk]) or another mask
// computed at run time, and FlashAttention has only its causal flag. It is
// "" when the mask reads no graph input (another reason applies).
func runtimeMask(what string, mask *graph.Value, sk int) string {
	ins := graphInputsOf(mask)
	if len(ins) == 0 {
		return ""
	}
	kind := "a mask computed at run time"
	s := mask.Type.Shape
	if r := s.Rank(); sk > 1 && r >= 1 && s[r-1] == sk && (r == 1 || s[r-2] == 1) {
		kind = "a padding mask (one value per key)"
	}
	return fmt.Sprintf("%s %s %v is %s, read from graph input %s: FlashAttention takes no mask input, only a causal flag", what, mask.Name, s, kind, strings.Join(ins, ", "))
}

// graphInputsOf lists the graph inputs v is computed from, in the order
// found (bounded: masks are a few ops deep).
func graphInputsOf(v *graph.Value) []string {
	var out []string
	seen := map[*graph.Value]bool{}
	stack := []*graph.Value{v}
	for len(stack) > 0 && len(seen) < 256 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if x == nil || seen[x] {
			continue
		}
		seen[x] = true
		if x.Kind == graph.Input {
			out = append(out, x.Name)
		}
		if x.Producer != nil {
			stack = append(stack, x.Producer.Inputs...)
		}
	}
	return out
}

func fuseAttention(m *Match, e *Edit) error {
	pv := m.Root
	// Q and K are defined before the softmax, V before the root MatMul: the
	// new nodes go right before the root (the Edit's default place).
	k, err := e.untranspose(m.Value("kt"))
	if err != nil {
		return err
	}
	causal := int64(0)
	if m.Get("causal").(bool) {
		causal = 1
	}
	scale := m.Get("attn_scale").(float64)
	// Grouped-query attention: K and V from before their repeat (fuse_gqa.go).
	k, v, group, note, err := e.unrepeatKV(k, m.Value("v"))
	if err != nil {
		return err
	}
	fa, err := e.OpN("FlashAttention", graph.Attrs{"causal": graph.Int(causal), "scale": graph.Float(scale)}, m.Value("q"), k, v)
	if err != nil {
		return err
	}
	e.Replace(pv.Outputs[0], fa.Outputs[0])
	detail := fmt.Sprintf("{causal=%d, scale=%s}", causal, graph.FormatFloat(scale))
	if group > 1 {
		detail = fmt.Sprintf("{causal=%d, scale=%s, group=%d}", causal, graph.FormatFloat(scale), group)
	}
	if note != "" {
		detail += "; " + note
	}
	e.Describe(fa.Name, detail)
	return nil
}

// untranspose returns K [.., S, D] for the scores operand Kᵀ [.., D, S].
func (e *Edit) untranspose(kt *graph.Value) (*graph.Value, error) {
	r := kt.Type.Shape.Rank()
	if t := kt.Producer; t != nil && t.Op == "Transpose" {
		x := t.Inputs[0]
		p, err := graph.TransposePerm(t.Attrs, r)
		if err != nil {
			return nil, err
		}
		// Kᵀ = Transpose(x, p), so K = Transpose(x, p with its last two
		// entries swapped): no node at all when that is the identity.
		perm := make([]int64, r)
		for i, a := range p {
			perm[i] = int64(a)
		}
		perm[r-2], perm[r-1] = perm[r-1], perm[r-2]
		if isIdentityPerm(perm) {
			return x, nil
		}
		return e.Op("Transpose", graph.Attrs{"perm": graph.Ints(perm...)}, x)
	}
	perm := make([]int64, r)
	for i := range perm {
		perm[i] = int64(i)
	}
	perm[r-2], perm[r-1] = perm[r-1], perm[r-2]
	return e.Op("Transpose", graph.Attrs{"perm": graph.Ints(perm...)}, kt)
}

// broadcastStrides gives, for each axis of out, how far the offset into a
// tensor of shape in moves (0 along broadcast axes).
func broadcastStrides(in, out graph.Shape) ([]int, error) {
	r := out.Rank()
	if in.Rank() > r {
		return nil, fmt.Errorf("shape %v does not broadcast to %v", in, out)
	}
	st := make([]int, r)
	own := in.Strides()
	off := r - in.Rank()
	for d := range in {
		switch in[d] {
		case out[off+d]:
			st[off+d] = own[d]
		case 1:
		default:
			return nil, fmt.Errorf("shape %v does not broadcast to %v", in, out)
		}
	}
	return st, nil
}
