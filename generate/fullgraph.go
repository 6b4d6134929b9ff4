package generate

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/passes"
)

// FullGraph is a model given as one forward graph that maps token ids
// [B, S] to logits [B, S, V]: a model trained from a graph FILE. It has no
// prefill and decode graphs and so no KV cache: GenerateGraph runs the whole
// forward over the context for every new token.
type FullGraph struct {
	Graph  *graph.Graph // the forward, with the trained weights and its other inputs constant
	Tokens string       // the token input, int64 [B, S]
	Logits string       // the logits output, [B, S, V] ("": the one float [B, S, V] output)
}

// Prepared is a FullGraph ready to generate with.
type Prepared struct {
	// Graph is the forward cut down to the logits (a loss and its targets
	// input dropped), its attention fused: what runs for every token.
	Graph  *graph.Graph
	Tokens string
	Logits string
	Seq    int // the context: the token input's seq
	Vocab  int // the logits' last axis
}

// Prepare checks the model's form and cuts its graph down to what
// generating runs; every problem is an error naming what is needed.
func (m FullGraph) Prepare() (*Prepared, error) {
	g, logits, S, V, err := m.prepare()
	if err != nil {
		return nil, err
	}
	return &Prepared{Graph: g, Tokens: m.Tokens, Logits: logits, Seq: S, Vocab: V}, nil
}

func (m FullGraph) prepare() (g *graph.Graph, logits string, S, V int, err error) {
	fail := func(format string, args ...any) (*graph.Graph, string, int, int, error) {
		return nil, "", 0, 0, fmt.Errorf("generate: %s: %s", m.Graph.Name, fmt.Sprintf(format, args...))
	}
	tv := m.Graph.Value(m.Tokens)
	if tv == nil || tv.Kind != graph.Input || tv.Type.DType != graph.Int64 || tv.Type.Shape.Rank() != 2 {
		return fail("generating needs a token input int64 [batch, seq]; %q is not one", m.Tokens)
	}
	B, S := tv.Type.Shape[0], tv.Type.Shape[1]
	var lv *graph.Value
	var outs []string
	for _, o := range m.Graph.Outputs {
		outs = append(outs, fmt.Sprintf("%s %v", o.Name, o.Type))
		if m.Logits != "" {
			if o.Name == m.Logits {
				lv = o
			}
			continue
		}
		if o.Type.DType.IsFloat() && o.Type.Shape.Rank() == 3 && o.Type.Shape[0] == B && o.Type.Shape[1] == S {
			if lv != nil && lv.Name != "logits" && o.Name != "logits" {
				return fail("generating needs one output of logits [%d, %d, vocab] (or one called logits); outputs: %s", B, S, strings.Join(outs, ", "))
			}
			if lv == nil || o.Name == "logits" {
				lv = o
			}
		}
	}
	if lv == nil || !lv.Type.DType.IsFloat() || lv.Type.Shape.Rank() != 3 || lv.Type.Shape[0] != B || lv.Type.Shape[1] != S {
		return fail("generating needs an output of logits [%d, %d, vocab] for the tokens [%d, %d]; outputs: %s", B, S, B, S, strings.Join(outs, ", "))
	}
	c := m.Graph.Clone()
	c.Outputs = []*graph.Value{c.Value(lv.Name)}
	if c, err = (passes.DCE{}).Run(c, nil); err != nil {
		return nil, "", 0, 0, err
	}
	read := map[*graph.Value]bool{}
	for _, n := range c.Nodes {
		for _, in := range n.Inputs {
			read[in] = true
		}
	}
	var ins []*graph.Value
	for _, in := range c.Inputs {
		switch {
		case in.Name == m.Tokens:
			ins = append(ins, in)
		case read[in]:
			return fail("the logits read input %s (%v), which is neither the tokens nor bound to a value", in.Name, in.Type)
		}
	}
	c.Inputs = ins
	if c, err = passes.Default(true).Run(c, nil); err != nil {
		return nil, "", 0, 0, fmt.Errorf("generate: %s: %w", m.Graph.Name, err)
	}
	return c, lv.Name, S, lv.Type.Shape[2], nil
}

// Generate continues prompt by up to maxNew tokens with the model on be,
// like GenerateUntil. The prompt and the new tokens must fit in the graph's
// sequence length S (its context). Every new token runs the forward over
// all S positions: the context so far in row 0, padded with token 0, the
// next token read from the logits at the last position of the context. That
// is right only for a causal model (logits at a position see no later
// token), which is checked on the first forward by running it again with
// other padding. Stats.Prefill is the first forward, Stats.Decode the rest.
func (m *Prepared) Generate(be backend.Backend, prompt []int64, maxNew int, s Sampling, onToken func(int64) bool) ([]int64, Stats, error) {
	st := Stats{PromptTokens: len(prompt), NewTokens: maxNew}
	g, logitsName, S, V := m.Graph, m.Logits, m.Seq, m.Vocab
	if len(prompt) == 0 {
		return nil, st, fmt.Errorf("generate: empty prompt: give at least one token")
	}
	if maxNew < 1 {
		return nil, st, fmt.Errorf("generate: want at least 1 new token, got %d", maxNew)
	}
	if n := len(prompt) + maxNew - 1; n > S {
		return nil, st, fmt.Errorf("generate: a %d-token prompt and %d new tokens need %d positions; the graph's context (its token input's seq) is %d", len(prompt), maxNew, n+1, S)
	}
	for i, t := range prompt {
		if t < 0 || t >= int64(V) {
			return nil, st, fmt.Errorf("generate: prompt token %d is %d, outside the vocabulary [0, %d)", i, t, V)
		}
	}
	if err := s.Validate(); err != nil {
		return nil, st, err
	}
	t0 := time.Now()
	exe, err := be.Compile(g, backend.Options{})
	if err != nil {
		return nil, st, fmt.Errorf("generate: compiling %s on %s: %w", g.Name, be.Name(), err)
	}
	defer exe.Close()
	st.Compile = time.Since(t0)

	tv := g.Value(m.Tokens)
	B := tv.Type.Shape[0]
	tokens := graph.NewTensor(graph.Int64, tv.Type.Shape)
	// forward runs the context ctx (padded with pad) and returns the logits
	// [1, V] at its last position.
	forward := func(ctx []int64, pad int64) (*graph.Tensor, error) {
		for b := range B {
			row := tokens.I64[b*S : (b+1)*S]
			for i := range row {
				row[i] = pad
			}
			copy(row, ctx)
		}
		res, err := exe.Run(map[string]*graph.Tensor{m.Tokens: tokens})
		if err != nil {
			return nil, err
		}
		all := res[logitsName]
		row := graph.NewTensor(all.DType, graph.Shape{1, V})
		at := (len(ctx) - 1) * V
		for i := range V {
			row.Set(i, all.At(at+i))
		}
		for i := range V {
			if v := row.At(i); math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("generate: the logits at position %d are not finite (token %d: %v): the model's weights are damaged (a diverged checkpoint?)", len(ctx), i, v)
			}
		}
		return row, nil
	}

	r := rand.New(rand.NewPCG(s.Seed, 0x9e3779b97f4a7c15))
	ctx := append([]int64(nil), prompt...)
	var out []int64
	more := true
	t1 := time.Now()
	for more && len(out) < maxNew {
		logits, err := forward(ctx, 0)
		if err != nil {
			return nil, st, fmt.Errorf("generate: forward at position %d: %w", len(ctx), err)
		}
		if len(out) == 0 {
			st.Prefill = time.Since(t1)
			if len(ctx) < S {
				other, err := forward(ctx, int64(min(1, V-1)))
				if err != nil {
					return nil, st, fmt.Errorf("generate: forward at position %d: %w", len(ctx), err)
				}
				for i := range V {
					if other.At(i) != logits.At(i) {
						return nil, st, fmt.Errorf("generate: %s is not causal: its logits at position %d change with the tokens after it (token %d: %v, then %v); generating from a graph FILE needs logits that read only earlier tokens", g.Name, len(ctx), i, logits.At(i), other.At(i))
					}
				}
			}
			t1 = time.Now()
		}
		t := pick(logits, s, r)
		out = append(out, t)
		ctx = append(ctx, t)
		if onToken != nil {
			more = onToken(t)
		}
	}
	if len(out) > 1 {
		st.Decode = time.Since(t1)
	}
	st.NewTokens = len(out)
	return out, st, nil
}
