package train

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// Source is what a run trains: the built-in model of a config, or a graph
// the user brought (a file in our text format or an ONNX model), prepared
// for training by PrepareGraph.
type Source struct {
	// Config is the built-in model's config. For a graph it holds what the
	// run needs to know of the model, read from the graph: Name (the
	// graph's), Vocab (the logits' last axis, 0 when unknown), Batch and Seq
	// (the token input's shape) and DType (the params'); the other fields
	// are zero.
	Config model.Config
	// Graph is nil for the built-in model.
	Graph *GraphModel
}

// BuiltIn is the source of the built-in model of cfg.
func BuiltIn(cfg model.Config) Source { return Source{Config: cfg} }

// Name is the model's name for messages: the config's, or the graph's with
// its file.
func (s Source) Name() string {
	if s.Graph == nil {
		return s.Config.Name
	}
	return fmt.Sprintf("%s (%s)", s.Config.Name, s.Graph.Spec.File)
}

// names returns the token, target and loss value names of the forward graph.
func (s Source) names() (tokens, targets, loss string) {
	if s.Graph == nil {
		return "tokens", "targets", "loss"
	}
	return s.Graph.Tokens, s.Graph.Targets, s.Graph.Loss
}

// LossNextToken is the GraphSpec.Loss that appends the built-in model's loss:
// the mean cross-entropy of the logits [B, S, V] against the next token.
const LossNextToken = "next-token"

// GraphSpec says how a training graph was made from a file. Checkpoints
// record it (MetaSource), with a copy of the file and of the bound inputs in
// the checkpoint folder (SaveSourceFiles), so that -resume and export
// rebuild exactly the graph that was trained without any flags, and a
// checkpoint of another model is refused.
type GraphSpec struct {
	File   string `json:"file"`   // the file as given (for messages)
	SHA256 string `json:"sha256"` // of the file's bytes: the model's identity
	Format string `json:"format"` // "onnx" or "text"
	// Dims sizes an ONNX model's symbolic dimensions (dim_param → size).
	Dims map[string]int `json:"dims,omitempty"`
	Loss string         `json:"loss"` // a scalar graph output, or LossNextToken
	// Tokens and Targets name the graph inputs fed with the batch ("" in
	// the spec: found by name); Targets is "" when the loss reads no
	// targets from outside.
	Tokens  string `json:"tokens,omitempty"`
	Targets string `json:"targets,omitempty"`
	// Bind maps each input bound to a tensor to the tensor's sha256.
	Bind map[string]string `json:"bind,omitempty"`
	// TrainParams and Freeze are the name patterns (path.Match) that pick
	// the params to train: those matching TrainParams (all when empty) and
	// no Freeze pattern.
	TrainParams []string `json:"train_params,omitempty"`
	Freeze      []string `json:"freeze,omitempty"`
	// Untie gives each reader of a shared uniform param its own copy
	// (UntieShared), before the params are picked.
	Untie bool `json:"untie,omitempty"`
	// Retie reads a param that is another's transpose (or copy) through
	// that param (RetieTransposed), before the params are picked.
	Retie bool `json:"retie,omitempty"`
}

// Equal reports whether two specs make the same training graph.
func (s GraphSpec) Equal(o GraphSpec) bool {
	a, _ := json.Marshal(s.key())
	b, _ := json.Marshal(o.key())
	return string(a) == string(b)
}

// key is the spec without File (a moved file is the same model).
func (s GraphSpec) key() GraphSpec {
	s.File = ""
	if len(s.Bind) == 0 {
		s.Bind = nil
	}
	if len(s.Dims) == 0 {
		s.Dims = nil
	}
	return s
}

// diff says how two specs differ, for refusing a checkpoint.
func (s GraphSpec) diff(now GraphSpec) string {
	var out []string
	if s.SHA256 != now.SHA256 {
		out = append(out, fmt.Sprintf("model file sha256 %.16s… in the checkpoint (%s), %.16s… now (%s)", s.SHA256, s.File, now.SHA256, now.File))
	}
	add := func(what string, a, b any) {
		x, _ := json.Marshal(a)
		y, _ := json.Marshal(b)
		if string(x) != string(y) {
			out = append(out, fmt.Sprintf("%s %s in the checkpoint, %s now", what, x, y))
		}
	}
	add("-loss", s.Loss, now.Loss)
	add("-tokens", s.Tokens, now.Tokens)
	add("-targets", s.Targets, now.Targets)
	add("-bind", s.key().Bind, now.key().Bind)
	add("-dims", s.key().Dims, now.key().Dims)
	add("-train-params", s.TrainParams, now.TrainParams)
	add("-freeze", s.Freeze, now.Freeze)
	add("-untie", s.Untie, now.Untie)
	add("-retie", s.Retie, now.Retie)
	return strings.Join(out, "; ")
}

// GraphModel is a forward graph ready to train: one token input and (unless
// the loss reads none) one target input, both int64 [B, S] and fed with the
// batch; every other input bound to a constant; a float scalar loss.
type GraphModel struct {
	// Forward is the graph trained: the file's graph with its bound inputs
	// made constants and, for LossNextToken, the loss appended. (Export
	// writes the file's graph itself, read again, with the trained weights.)
	Forward *graph.Graph
	// Tokens, Targets and Loss name Forward's two batch inputs (Targets ""
	// when there is none) and its loss value.
	Tokens, Targets, Loss string
	// Logits names the output the next-token loss reads ("" otherwise).
	Logits string
	// Params are the params trained, in graph order; Frozen the float
	// params that are not (picked out by -train-params/-freeze, or
	// unreachable from the loss), with the reason.
	Params []string
	Frozen map[string]string
	// Appended says, one line each, what was added to the graph.
	Appended []string
	Spec     GraphSpec

	// Notes warn of what may not train as the user expects (see
	// sharedUniformNotes), one line each.
	Notes []string
}

// tokenInputNames are the names a token input goes by, in order of
// preference: ours, Hugging Face's, nanoGPT's.
var tokenInputNames = []string{"tokens", "input_ids", "idx"}

// targetInputNames are the names of a target input a graph's own loss reads.
var targetInputNames = []string{"targets", "labels"}

// FileSHA256 is the identity of a model file.
func FileSHA256(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// TensorSHA256 is the identity of a bound tensor: its type and values.
func TensorSHA256(t *graph.Tensor) string {
	h := sha256.New()
	fmt.Fprintf(h, "%v\n", t.Type())
	for i := range t.Len() {
		fmt.Fprintf(h, "%x\n", t.At(i))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// PrepareGraph makes src (a graph read from spec.File, not changed) ready to
// train as spec says, with binds giving the bound inputs' values. Every
// problem is an error naming what is wrong: a graph without float params, a
// token input that cannot be found or is not int64 [B, S], a loss that is
// not a float scalar output, logits whose last axis is not the vocabulary
// (the rows of the table the tokens index), an input left unbound.
func PrepareGraph(src *graph.Graph, spec GraphSpec, binds map[string]*graph.Tensor) (*GraphModel, error) {
	fail := func(format string, args ...any) (*GraphModel, error) {
		return nil, fmt.Errorf("%s: %s", spec.File, fmt.Sprintf(format, args...))
	}
	var floats []string
	for _, p := range src.Params {
		if p.Type.DType.IsFloat() {
			floats = append(floats, p.Name)
		}
	}
	if len(floats) == 0 {
		return fail("graph %s has no float initializers to train (no params: its initializers are all constants)", src.Name)
	}
	g := src.Clone()
	inputs := map[string]*graph.Value{}
	for _, in := range g.Inputs {
		inputs[in.Name] = in
	}

	// The token input.
	tokens := spec.Tokens
	if tokens == "" {
		for _, n := range tokenInputNames {
			if inputs[n] != nil {
				tokens = n
				break
			}
		}
	}
	if tokens == "" {
		var cands []string
		for _, in := range g.Inputs {
			if in.Type.DType == graph.Int64 && in.Type.Shape.Rank() == 2 && binds[in.Name] == nil && !slices.Contains(targetInputNames, in.Name) {
				cands = append(cands, in.Name)
			}
		}
		if len(cands) != 1 {
			return fail("cannot tell which input takes the tokens (none is called %s; int64 [B, S] inputs: %s): name it with -tokens", strings.Join(tokenInputNames, ", "), listOrNone(cands))
		}
		tokens = cands[0]
	}
	tv := inputs[tokens]
	if tv == nil {
		return fail("-tokens %s: no graph input has that name (inputs: %s)", tokens, valueNames(g.Inputs))
	}
	if tv.Type.DType != graph.Int64 || tv.Type.Shape.Rank() != 2 {
		return fail("token input %s is %v; want int64 [batch, seq]", tokens, tv.Type)
	}
	B, S := tv.Type.Shape[0], tv.Type.Shape[1]
	if binds[tokens] != nil {
		return fail("-bind %s: that is the token input, fed with the batch", tokens)
	}
	m := &GraphModel{Tokens: tokens, Frozen: map[string]string{}, Spec: spec}

	vals := g.Values()
	nm := graph.NewNamer(g)
	var lossV *graph.Value
	vocab := embeddingRows(g, tv)
	switch spec.Loss {
	case "":
		return fail("no loss: give -loss NAME (a scalar output) or -loss %s (cross-entropy of the logits against the next token)", LossNextToken)
	case LossNextToken:
		logits, err := findLogits(g, B, S, spec)
		if err != nil {
			return nil, err
		}
		V := logits.Type.Shape[2]
		if vocab > 0 && V != vocab {
			return fail("logits %s is %v: its last axis (%d) is not the vocabulary (%d rows in the table the tokens index)", logits.Name, logits.Type.Shape, V, vocab)
		}
		if spec.Targets != "" {
			return fail("-targets %s: with -loss %s the targets input is appended (the next tokens); -targets is for a graph's own loss", spec.Targets, LossNextToken)
		}
		lv, targets, lines, err := appendNextTokenLoss(g, nm, logits)
		if err != nil {
			return fail("%v", err)
		}
		lossV, m.Targets, m.Logits, m.Appended = lv, targets, logits.Name, lines
	default:
		lossV = vals[spec.Loss]
		if lossV == nil || !g.IsOutput(lossV) {
			var outs []string
			for _, o := range g.Outputs {
				outs = append(outs, fmt.Sprintf("%s %v", o.Name, o.Type))
			}
			return fail("-loss %s: not a graph output (outputs: %s); or -loss %s", spec.Loss, strings.Join(outs, ", "), LossNextToken)
		}
		if !lossV.Type.DType.IsFloat() || lossV.Type.Shape.Numel() != 1 {
			return fail("-loss %s is %v: a loss must be a float scalar", spec.Loss, lossV.Type)
		}
		targets := spec.Targets
		if targets == "" {
			for _, n := range targetInputNames {
				if inputs[n] != nil && binds[n] == nil {
					targets = n
					break
				}
			}
		}
		if targets != "" {
			t := inputs[targets]
			if t == nil {
				return fail("-targets %s: no graph input has that name (inputs: %s)", targets, valueNames(g.Inputs))
			}
			if !t.Type.Equal(tv.Type) {
				return fail("target input %s is %v; want %v like the token input %s", targets, t.Type, tv.Type, tokens)
			}
			if targets == tokens {
				return fail("-targets %s is the token input", targets)
			}
		}
		if binds[targets] != nil {
			return fail("-bind %s: that is the targets input, fed with the next tokens", targets)
		}
		m.Targets = targets
	}
	m.Loss = lossV.Name

	// Bound inputs become constants; anything else left over is an error.
	var unbound []string
	var kept []*graph.Value
	for _, in := range g.Inputs {
		if in.Name == m.Tokens || in.Name == m.Targets {
			kept = append(kept, in)
			continue
		}
		t, ok := binds[in.Name]
		if !ok {
			unbound = append(unbound, fmt.Sprintf("%s %v", in.Name, in.Type))
			continue
		}
		if !t.Type().Equal(in.Type) {
			return fail("-bind %s: the tensor is %v, the input is %v", in.Name, t.Type(), in.Type)
		}
		data := make([]float64, t.Len())
		for i := range data {
			data[i] = t.At(i)
		}
		init := graph.Literal(data...)
		in.Kind, in.Init = graph.Const, &init
		g.Consts = append(g.Consts, in)
	}
	for name := range binds {
		if inputs[name] == nil {
			return fail("-bind %s: no graph input has that name (inputs: %s)", name, valueNames(src.Inputs))
		}
	}
	if len(unbound) > 0 {
		hint := ""
		if spec.Loss != LossNextToken && m.Targets == "" {
			for _, in := range g.Inputs {
				if in.Kind == graph.Input && in.Name != m.Tokens && in.Type.Equal(tv.Type) {
					hint = fmt.Sprintf("; if %s takes the next tokens, -targets %s", in.Name, in.Name)
					break
				}
			}
		}
		if spec.Loss == LossNextToken {
			for _, o := range src.Outputs {
				if o.Type.DType.IsFloat() && o.Type.Shape.Numel() == 1 {
					hint = fmt.Sprintf("; the graph has a scalar output %s: if that is its loss, -loss %s trains it with its own targets input", o.Name, o.Name)
					break
				}
			}
		}
		return fail("input(s) %s are not bound: give each a value with -bind NAME=FILE.safetensors (the token input is %s%s)%s", strings.Join(unbound, ", "), m.Tokens, targetsNote(m.Targets), hint)
	}
	g.Inputs = kept
	if err := graph.Verify(g); err != nil {
		return fail("%v", err)
	}

	var untied []string
	if spec.Untie {
		untied = UntieShared(g)
	}
	if spec.Retie {
		untied = append(untied, RetieTransposed(g)...)
	}
	vals = g.Values() // untied copies are new values, retied ones no longer params

	// The params to train: every float param the loss's gradient reaches,
	// narrowed by -train-params and -freeze.
	reach := graph.GradientReach(g, []*graph.Value{lossV})
	for _, pat := range append(slices.Clone(spec.TrainParams), spec.Freeze...) {
		if _, err := path.Match(pat, ""); err != nil {
			return fail("bad param pattern %q: %v", pat, err)
		}
		if !slices.ContainsFunc(floats, func(n string) bool { ok, _ := path.Match(pat, n); return ok }) {
			return fail("param pattern %q matches no float param (params: %s)", pat, shortList(floats))
		}
	}
	for _, p := range g.Params {
		if !p.Type.DType.IsFloat() {
			continue
		}
		switch {
		case !reach[p]:
			m.Frozen[p.Name] = "the loss does not depend on it"
		case len(spec.TrainParams) > 0 && !matchAny(spec.TrainParams, p.Name):
			m.Frozen[p.Name] = "not picked by -train-params"
		case matchAny(spec.Freeze, p.Name):
			m.Frozen[p.Name] = "frozen by -freeze"
		default:
			m.Params = append(m.Params, p.Name)
		}
	}
	if len(m.Params) == 0 {
		return fail("no param left to train (%d float params, all frozen or not reaching the loss)", len(floats))
	}
	dt := vals[m.Params[0]].Type.DType
	for _, p := range m.Params {
		if d := vals[p].Type.DType; d != dt {
			return fail("params to train have mixed dtypes (%s is %v, %s is %v)", m.Params[0], dt, p, d)
		}
	}
	m.Notes = append(untied, sharedUniformNotes(g, m.Params)...)
	m.Forward = g
	return m, nil
}

// Config is the run-level description of a prepared graph (see Source.Config).
func (m *GraphModel) config() model.Config {
	tv := m.Forward.Value(m.Tokens)
	cfg := model.Config{Name: m.Forward.Name, Batch: tv.Type.Shape[0], Seq: tv.Type.Shape[1]}
	if cfg.Name == "" {
		cfg.Name = "graph"
	}
	if m.Logits != "" {
		cfg.Vocab = m.Forward.Value(m.Logits).Type.Shape[2]
	} else {
		cfg.Vocab = embeddingRows(m.Forward, tv)
	}
	cfg.DType = m.Forward.Value(m.Params[0]).Type.DType
	return cfg
}

// GraphSource is the Source of a prepared graph.
func GraphSource(m *GraphModel) Source { return Source{Config: m.config(), Graph: m} }

// ParamCount is the number of trained parameters.
func (s Source) ParamCount() int64 {
	if s.Graph == nil {
		return model.ParamCount(s.Config)
	}
	vals := s.Graph.Forward.Values()
	var n int64
	for _, p := range s.Graph.Params {
		n += int64(vals[p].Type.Shape.Numel())
	}
	return n
}

// Explain says what preparing the graph did: the inputs fed, the loss (and
// what was appended for it), the params trained and frozen.
func (m *GraphModel) Explain() string {
	var b strings.Builder
	fmt.Fprintf(&b, "train graph %s from %s (sha256 %.16s…)\n", m.Forward.Name, m.Spec.File, m.Spec.SHA256)
	fmt.Fprintf(&b, "  tokens:  input %s %v, fed with the batch\n", m.Tokens, m.Forward.Value(m.Tokens).Type)
	if m.Targets != "" {
		fmt.Fprintf(&b, "  targets: input %s, fed with the next token of each position\n", m.Targets)
	}
	if m.Spec.Loss == LossNextToken {
		fmt.Fprintf(&b, "  loss:    %s, appended (-loss %s): mean cross-entropy of output %s against the next token\n", m.Loss, LossNextToken, m.Logits)
		for _, l := range m.Appended {
			fmt.Fprintf(&b, "           + %s\n", l)
		}
	} else {
		fmt.Fprintf(&b, "  loss:    output %s (-loss %s)\n", m.Loss, m.Spec.Loss)
	}
	var bound []string
	for n := range m.Spec.Bind {
		bound = append(bound, n)
	}
	sort.Strings(bound)
	for _, n := range bound {
		fmt.Fprintf(&b, "  bound:   input %s, a constant now (-bind, sha256 %.16s…)\n", n, m.Spec.Bind[n])
	}
	vals := m.Forward.Values()
	var n int64
	for _, p := range m.Params {
		n += int64(vals[p].Type.Shape.Numel())
	}
	fmt.Fprintf(&b, "  params:  %d trained (%d values): %s\n", len(m.Params), n, shortList(m.Params))
	var frozen []string
	for p := range m.Frozen {
		frozen = append(frozen, p)
	}
	sort.Strings(frozen)
	for _, p := range frozen {
		fmt.Fprintf(&b, "  frozen:  %s (%s)\n", p, m.Frozen[p])
	}
	for _, n := range m.Notes {
		fmt.Fprintf(&b, "  note:    %s\n", n)
	}
	return b.String()
}

// findLogits picks the output the next-token loss reads: a float output
// [B, S, V], the one called "logits" when there are several.
func findLogits(g *graph.Graph, B, S int, spec GraphSpec) (*graph.Value, error) {
	var cands []*graph.Value
	for _, o := range g.Outputs {
		if o.Type.DType.IsFloat() && o.Type.Shape.Rank() == 3 {
			cands = append(cands, o)
		}
	}
	for _, o := range cands {
		if o.Name == "logits" {
			cands = []*graph.Value{o}
			break
		}
	}
	if len(cands) != 1 {
		var outs []string
		for _, o := range g.Outputs {
			outs = append(outs, fmt.Sprintf("%s %v", o.Name, o.Type))
		}
		return nil, fmt.Errorf("%s: -loss %s needs one float output of logits [batch, seq, vocab] (or one called logits); outputs: %s", spec.File, LossNextToken, strings.Join(outs, ", "))
	}
	l := cands[0]
	if l.Type.Shape[0] != B || l.Type.Shape[1] != S {
		return nil, fmt.Errorf("%s: logits %s is %v; the tokens are [%d, %d], so the logits must be [%d, %d, vocab]", spec.File, l.Name, l.Type.Shape, B, S, B, S)
	}
	return l, nil
}

// appendNextTokenLoss adds a targets input (int64 [B, S]) and the built-in
// model's loss: SoftmaxCrossEntropyLoss (mean) of the logits reshaped to
// [B·S, V] against the targets reshaped to [B·S]. The loss becomes the
// first output.
func appendNextTokenLoss(g *graph.Graph, nm *graph.Namer, logits *graph.Value) (loss *graph.Value, targets string, lines []string, err error) {
	B, S, V := logits.Type.Shape[0], logits.Type.Shape[1], logits.Type.Shape[2]
	name := func(want string) string {
		if nm.Reserve(want) {
			return want
		}
		return nm.Fresh(want)
	}
	tv := &graph.Value{Name: name("targets"), Type: graph.TensorType{DType: graph.Int64, Shape: graph.Shape{B, S}}, Kind: graph.Input}
	g.Inputs = append(g.Inputs, tv)
	shape := func(dims ...int) *graph.Value {
		d := make([]float64, len(dims))
		for i, x := range dims {
			d[i] = float64(x)
		}
		init := graph.Literal(d...)
		c := &graph.Value{Name: nm.Fresh("loss/shape"), Type: graph.TensorType{DType: graph.Int64, Shape: graph.Shape{len(dims)}}, Kind: graph.Const, Init: &init}
		g.Consts = append(g.Consts, c)
		return c
	}
	add := func(op string, attrs graph.Attrs, in ...*graph.Value) (*graph.Value, error) {
		n, err := graph.NewNode(nm.Fresh("loss/"+op), op, attrs, in...)
		if err != nil {
			return nil, err
		}
		g.Nodes = append(g.Nodes, n)
		return n.Outputs[0], nil
	}
	flat, err := add("Reshape", nil, logits, shape(B*S, V))
	if err != nil {
		return nil, "", nil, err
	}
	labels, err := add("Reshape", nil, tv, shape(B*S))
	if err != nil {
		return nil, "", nil, err
	}
	l, err := add("SoftmaxCrossEntropyLoss", graph.Attrs{"reduction": graph.Str("mean")}, flat, labels)
	if err != nil {
		return nil, "", nil, err
	}
	ln := name("loss")
	l.Name = ln
	g.Outputs = append([]*graph.Value{l}, g.Outputs...)
	lines = []string{
		fmt.Sprintf("input %s int64 [%d, %d] (the next token of each position)", tv.Name, B, S),
		fmt.Sprintf("%s = Reshape(%s, [%d, %d])", flat.Name, logits.Name, B*S, V),
		fmt.Sprintf("%s = Reshape(%s, [%d])", labels.Name, tv.Name, B*S),
		fmt.Sprintf("%s = SoftmaxCrossEntropyLoss(%s, %s, reduction=mean), the first output", ln, flat.Name, labels.Name),
	}
	return l, tv.Name, lines, nil
}

// embeddingRows is the vocabulary a token input implies: the rows of the
// table a Gather indexes with it (0 when no Gather reads it directly).
func embeddingRows(g *graph.Graph, tokens *graph.Value) int {
	for _, n := range g.Nodes {
		if n.Op == "Gather" && len(n.Inputs) == 2 && n.Inputs[1] == tokens && n.Attrs.Int("axis", 0) == 0 && n.Inputs[0].Type.Shape.Rank() >= 1 {
			return n.Inputs[0].Type.Shape[0]
		}
	}
	return 0
}

func matchAny(pats []string, name string) bool {
	for _, p := range pats {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

func valueNames(vs []*graph.Value) string {
	var out []string
	for _, v := range vs {
		out = append(out, fmt.Sprintf("%s %v", v.Name, v.Type))
	}
	return listOrNone(out)
}

func listOrNone(xs []string) string {
	if len(xs) == 0 {
		return "none"
	}
	return strings.Join(xs, ", ")
}

func shortList(xs []string) string {
	const show = 8
	if len(xs) <= show {
		return strings.Join(xs, ", ")
	}
	return strings.Join(xs[:show], ", ") + fmt.Sprintf(", … (%d in all)", len(xs))
}

func targetsNote(t string) string {
	if t == "" {
		return ""
	}
	return ", the targets input " + t
}

// MetaSource is the checkpoint metadata key of a graph-trained model's
// GraphSpec (JSON); absent for the built-in model.
const MetaSource = "source"

// BuildSourceGraphs is BuildGraphsFor for any source: the built-in model's
// graphs are exactly BuildGraphsFor's.
func BuildSourceGraphs(be backend.Backend, src Source, fuse bool, h Hyper) (*Graphs, error) {
	if src.Graph == nil {
		return BuildGraphsFor(be, src.Config, fuse, h)
	}
	return buildStep(src.Graph.Forward, src.Graph.Loss, src.Graph.Params, fuse, h, be.Name() != "cpu")
}

// checkSource refuses a checkpoint of another model: of the built-in model
// for a graph run and the other way round, or of another graph (file, loss,
// inputs or params).
func (t *Trainer) checkSource(ts *checkpoint.Tensors) error {
	spec, err := sourceSpec(ts.Metadata)
	if err != nil {
		return fmt.Errorf("train: checkpoint: %w", err)
	}
	g := t.Source.Graph
	switch {
	case spec == nil && g == nil:
		return nil
	case spec == nil:
		var cfg model.Config
		_ = json.Unmarshal([]byte(ts.Metadata[checkpoint.MetaConfig]), &cfg)
		return fmt.Errorf("train: the checkpoint is of the built-in model %q, this run trains the graph of %s", cfg.Name, g.Spec.File)
	}
	if g == nil {
		return fmt.Errorf("train: the checkpoint is of a model trained from %s (sha256 %.16s…), this run trains the built-in config %s: train -resume without -config continues it", spec.File, spec.SHA256, t.Config.Name)
	}
	if !spec.Equal(g.Spec) {
		return fmt.Errorf("train: the checkpoint is of another model (%s)", spec.diff(g.Spec))
	}
	return nil
}
