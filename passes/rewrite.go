package passes

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// The rewrite engine. A rule is data:
//
//	Rule{Name, Root op, Pattern (a small tree of op patterns with captures),
//	     Where (conditions, each saying why it fails), Rewrite}
//
// A RulePass walks the graph in order; at each node whose op is a rule's
// Root it tries the rules in order and the first whose pattern matches and
// whose conditions all hold fires (first match wins). A pattern that matches
// but whose conditions fail is a refusal, logged with the condition's reason:
// that log is what -explain prints. Sweeps repeat until nothing fires, so
// one rule's result can be the next rule's input (canonicalisation chains).
//
// Patterns only look upwards (at producers); conditions look at anything,
// e.g. who else uses a matched value. Rewrites never edit nodes in place:
// they add new nodes and redirect the uses of old values, and nodes left
// without uses are removed. That keeps every intermediate state a valid SSA
// graph and makes an aborted rewrite free.

// Pattern matches a value by the node that produced it.
type Pattern struct {
	// Op is the op of the producing node; "" matches any value (a leaf).
	Op string
	// Args are the patterns of the node's inputs (all of them, in order);
	// nil leaves the inputs unexamined. For the commutative ops (Add, Mul,
	// Equal) both operand orders are tried.
	Args []*Pattern
	// Bind captures the matched value under this name (see Match.Value).
	// A name bound twice in one pattern must bind the same value.
	Bind string
	// Optional marks a node that may be absent: then Args[0] is matched
	// against the value itself (e.g. an optional scale Mul).
	Optional bool
}

// Any matches any value and captures it as bind.
func Any(bind string) *Pattern { return &Pattern{Bind: bind} }

// Op matches a value made by an op node whose inputs match args.
func Op(op string, args ...*Pattern) *Pattern { return &Pattern{Op: op, Args: args} }

// Maybe matches an optional op node: either op(through, others...) or,
// when the value was not made by such a node, through itself.
func Maybe(op string, through *Pattern, others ...*Pattern) *Pattern {
	return &Pattern{Op: op, Args: append([]*Pattern{through}, others...), Optional: true}
}

// As returns a copy of p that captures its value as bind.
func (p *Pattern) As(bind string) *Pattern {
	c := *p
	c.Bind = bind
	return &c
}

func (p *Pattern) String() string {
	if p.Op == "" {
		if p.Bind == "" {
			return "_"
		}
		return p.Bind
	}
	args := make([]string, len(p.Args))
	for i, a := range p.Args {
		args[i] = a.String()
	}
	s := p.Op + "(" + strings.Join(args, ", ") + ")"
	if p.Optional {
		s = "[" + s + "]"
	}
	if p.Bind != "" {
		s += ":" + p.Bind
	}
	return s
}

// commutative ops have their two operands matched in both orders.
var commutative = map[string]bool{"Add": true, "Mul": true, "Equal": true}

// Cond is one condition of a rule. Check returns "" when it holds, else
// the reason the rule refuses (which -explain shows).
type Cond struct {
	Name  string
	Check func(m *Match) string
}

// Rule is one rewrite.
type Rule struct {
	Name    string
	Root    string   // op of the node the pattern is rooted at
	Pattern *Pattern // its Op must be Root
	Where   []Cond
	// Rewrite builds the replacement through e. An error refuses the
	// rewrite (nothing is applied) with the error as the reason.
	Rewrite func(m *Match, e *Edit) error
	// Report, when set, names the capture whose producing node the log
	// lines are about instead of the root (fuse_attention is rooted at the
	// P·V MatMul but explains each Softmax).
	Report string
}

// reportPattern returns the sub-pattern of r that captures r.Report (nil
// when r reports at its root).
func (r *Rule) reportPattern() *Pattern {
	if r.Report == "" {
		return nil
	}
	var find func(p *Pattern) *Pattern
	find = func(p *Pattern) *Pattern {
		if p.Bind == r.Report && p.Op != "" && !p.Optional {
			return p
		}
		for _, a := range p.Args {
			if f := find(a); f != nil {
				return f
			}
		}
		return nil
	}
	return find(r.Pattern)
}

// check validates a rule table entry.
func (r *Rule) check() error {
	if r.Name == "" || r.Root == "" || r.Pattern == nil || r.Rewrite == nil {
		return fmt.Errorf("rule %q: name, root, pattern and rewrite are required", r.Name)
	}
	if r.Pattern.Op != r.Root || r.Pattern.Optional {
		return fmt.Errorf("rule %s: pattern %v is not rooted at a %s node", r.Name, r.Pattern, r.Root)
	}
	var walk func(p *Pattern) error
	walk = func(p *Pattern) error {
		if p.Op != "" {
			if _, ok := graph.LookupOp(p.Op); !ok {
				return fmt.Errorf("rule %s: unknown op %s", r.Name, p.Op)
			}
		}
		if p.Optional && len(p.Args) == 0 {
			return fmt.Errorf("rule %s: optional %s needs the pattern it stands in for", r.Name, p.Op)
		}
		for _, a := range p.Args {
			if err := walk(a); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(r.Pattern); err != nil {
		return err
	}
	if r.Report != "" && r.reportPattern() == nil {
		return fmt.Errorf("rule %s: pattern %v captures no op node as %s", r.Name, r.Pattern, r.Report)
	}
	return nil
}

// maxMatchesPerRule bounds how many pattern matches (operand orders,
// optional nodes present or not) one rule tries at one root. Patterns are
// small; the bound keeps a pathological graph linear.
const maxMatchesPerRule = 64

// RulePass applies a rule table as a pass.
type RulePass struct {
	PassName string
	Rules    []Rule
	// Scope, when set, is computed at the start of every sweep; rules are
	// tried only at nodes it accepts (nodes outside are not refusals).
	Scope func(g *graph.Graph) func(*graph.Node) bool
	// ExplainOp: every node of this op gets a log line even when no rule's
	// pattern matched it (fuse_attention: every Softmax is explained). A
	// node that no match reached is matched against the rules' Report
	// sub-patterns: their deepest miss is the reason, or, when one matches,
	// the first reason Unreached gives (why no root above it matched).
	ExplainOp string
	Unreached []Cond
	// MaxSweeps bounds the fixpoint iteration (0: 16); reaching it is an
	// error, since it means two rules undo each other.
	MaxSweeps int
}

// Name is the pass name.
func (p *RulePass) Name() string { return p.PassName }

// Run rewrites a clone of g to a fixpoint of the rules.
func (p *RulePass) Run(g *graph.Graph, log *Log) (out *graph.Graph, err error) {
	if g == nil {
		return nil, errNilGraph
	}
	// A rule that panics on a graph it did not foresee is a bug, but the
	// compile reports it instead of crashing; g itself is never modified.
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("%s: internal error: %v", p.PassName, r)
		}
	}()
	byRoot := map[string][]*Rule{}
	for i := range p.Rules {
		r := &p.Rules[i]
		if err := r.check(); err != nil {
			return nil, err
		}
		byRoot[r.Root] = append(byRoot[r.Root], r)
	}
	maxSweeps := p.MaxSweeps
	if maxSweeps == 0 {
		maxSweeps = 16
	}
	// Most graphs have no node any rule could fire at; say so without
	// cloning (and return g itself: byte-identical by construction).
	if !p.anyRoot(g, byRoot) {
		return g, nil
	}
	// Probe g read-only: matching and conditions never modify the graph,
	// so if no rule would fire, g's refusals are final and no clone is made.
	probe := newRewriteState(g)
	probe.probe = true
	probe.log = log
	if refusals := probe.sweep(p, byRoot); !probe.wouldFire {
		for _, e := range refusals {
			log.Add(e)
		}
		return g, nil
	}
	st := newRewriteState(g.Clone())
	st.log = log
	for sweep := 0; ; sweep++ {
		if sweep == maxSweeps {
			return nil, fmt.Errorf("%s: no fixpoint after %d sweeps (rules undo each other?)", p.PassName, maxSweeps)
		}
		refusals := st.sweep(p, byRoot)
		if !st.dirty {
			// Refusals are logged from the last sweep only: it sees the final
			// graph, and earlier sweeps would repeat them.
			for _, e := range refusals {
				log.Add(e)
			}
			break
		}
		st.rebuild()
	}
	if !st.committed { // the probe's match was refused by its rewrite
		return g, nil
	}
	if err := checkOrder(st.g); err != nil {
		return nil, fmt.Errorf("%s: %w", p.PassName, err)
	}
	return st.g, nil
}

// sweep tries the rules once at every node in order, logging firings to
// st.log and returning the refusals, ordered by the node they are about.
func (st *rewriteState) sweep(p *RulePass, byRoot map[string][]*Rule) []Event {
	var inScope func(*graph.Node) bool
	if p.Scope != nil {
		inScope = p.Scope(st.g)
	}
	// reported: the nodes some root's firing or refusal was about; a later
	// root's refusals about the same node are dropped (one report a node).
	reported := map[*graph.Node]bool{}
	var refusals []reportEvent
	for _, n := range st.g.Nodes {
		if st.removed[n] {
			continue
		}
		rules := byRoot[n.Op]
		if len(rules) == 0 {
			continue
		}
		if inScope != nil && !inScope(n) {
			continue
		}
		ev, refused := st.apply(p, n, rules)
		if st.wouldFire && st.probe {
			return nil
		}
		if ev != nil {
			st.log.Add(ev.Event)
			reported[ev.about] = true
		}
		seen := map[*graph.Node]bool{}
		for _, r := range refused {
			if reported[r.about] && !seen[r.about] {
				continue
			}
			seen[r.about] = true
			refusals = append(refusals, r)
		}
		for a := range seen {
			reported[a] = true
		}
	}
	if p.ExplainOp != "" {
		for _, n := range st.g.Nodes {
			if n.Op == p.ExplainOp && !st.removed[n] && !reported[n] {
				refusals = append(refusals, st.explain(p, n)...)
			}
		}
	}
	// Refusals in the order of the nodes they are about.
	pos := make(map[*graph.Node]int, len(st.g.Nodes))
	for i, n := range st.g.Nodes {
		pos[n] = i
	}
	slices.SortStableFunc(refusals, func(a, b reportEvent) int { return pos[a.about] - pos[b.about] })
	out := make([]Event, len(refusals))
	for i, r := range refusals {
		out[i] = r.Event
	}
	return out
}

// anyRoot reports whether some node of g is in scope and is a rule's root
// (or is explained).
func (p *RulePass) anyRoot(g *graph.Graph, byRoot map[string][]*Rule) bool {
	var inScope func(*graph.Node) bool
	if p.Scope != nil {
		inScope = p.Scope(g)
	}
	for _, n := range g.Nodes {
		if p.ExplainOp != "" && n.Op == p.ExplainOp {
			return true
		}
		if len(byRoot[n.Op]) > 0 && (inScope == nil || inScope(n)) {
			return true
		}
	}
	return false
}

// checkOrder makes sure every node reads only values defined before it (the
// rewrite anchors guarantee it; this catches a rule that anchors wrongly).
func checkOrder(g *graph.Graph) error {
	defined := map[*graph.Value]bool{}
	for _, v := range g.Inputs {
		defined[v] = true
	}
	for _, v := range g.Params {
		defined[v] = true
	}
	for _, v := range g.Consts {
		defined[v] = true
	}
	for _, n := range g.Nodes {
		for _, in := range n.Inputs {
			if in != nil && !defined[in] {
				return fmt.Errorf("node %s reads %s before it is defined", n.Name, in.Name)
			}
		}
		for _, o := range n.Outputs {
			defined[o] = true
		}
	}
	return nil
}

// reportEvent is an event and the node it is about.
type reportEvent struct {
	Event
	about *graph.Node
}

// apply tries rules at n: it returns the firing event, or the refusals.
func (st *rewriteState) apply(p *RulePass, n *graph.Node, rules []*Rule) (*reportEvent, []reportEvent) {
	var refusals []reportEvent
	best := missInfo{depth: -1}
	for _, r := range rules {
		res := st.try(r, n)
		if res.fired != nil {
			res.fired.Pass = p.PassName
			return res.fired, nil
		}
		if res.refusal != "" {
			refusals = append(refusals, reportEvent{Event{Pass: p.PassName, Kind: Refused, Rule: r.Name, Node: res.about.Name, Op: res.about.Op, Reason: res.refusal}, res.about})
		} else {
			best.merge(res.miss)
		}
	}
	if len(refusals) == 0 && n.Op == p.ExplainOp {
		refusals = append(refusals, noRuleMatched(p, n, best))
	}
	return nil, refusals
}

func noRuleMatched(p *RulePass, n *graph.Node, best missInfo) reportEvent {
	why := best.String()
	if why == "" {
		why = "no rule for this node"
	}
	return reportEvent{Event{Pass: p.PassName, Kind: Refused, Node: n.Name, Op: n.Op, Reason: why}, n}
}

// explain says why no match reached n (an ExplainOp node): the deepest
// miss of the rules' Report sub-patterns at n, or, for each rule whose
// sub-pattern matches, the first reason p.Unreached gives.
func (st *rewriteState) explain(p *RulePass, n *graph.Node) []reportEvent {
	var refusals []reportEvent
	best := missInfo{depth: -1}
	for i := range p.Rules {
		r := &p.Rules[i]
		sub := r.reportPattern()
		if sub == nil || sub.Op != n.Op {
			continue
		}
		mt := &matcher{binds: map[string]*graph.Value{}, miss: missInfo{depth: -1}}
		why := ""
		matched := mt.match(sub, n.Outputs[0], 0, func() bool {
			m := &Match{Rule: r, Root: n, vals: maps.Clone(mt.binds), st: st, notes: map[string]any{}}
			for _, c := range p.Unreached {
				if why = c.Check(m); why != "" {
					return true
				}
			}
			why = "no " + r.Root + " above it matched " + r.Pattern.String()
			return true
		})
		if matched {
			refusals = append(refusals, reportEvent{Event{Pass: p.PassName, Kind: Refused, Rule: r.Name, Node: n.Name, Op: n.Op, Reason: why}, n})
		} else {
			best.merge(mt.miss)
		}
	}
	if len(refusals) == 0 {
		refusals = append(refusals, noRuleMatched(p, n, best))
	}
	return refusals
}

type tryResult struct {
	fired   *reportEvent
	refusal string      // the first refusal reason when the pattern matched
	about   *graph.Node // the node the first refusal is about
	miss    missInfo
}

// try enumerates the matches of r at root until one passes every condition
// and rewrites.
func (st *rewriteState) try(r *Rule, root *graph.Node) tryResult {
	var res tryResult
	mt := &matcher{binds: map[string]*graph.Value{}, miss: missInfo{depth: -1}}
	tries := 0
	mt.match(r.Pattern, root.Outputs[0], 0, func() bool {
		tries++
		m := &Match{Rule: r, Root: root, vals: maps.Clone(mt.binds), st: st, notes: map[string]any{}}
		about := root
		if r.Report != "" {
			about = m.Node(r.Report)
		}
		refuse := func(why string) bool {
			if res.refusal == "" {
				res.refusal, res.about = why, about
			}
			return tries >= maxMatchesPerRule
		}
		for _, c := range r.Where {
			if why := c.Check(m); why != "" {
				return refuse(why)
			}
		}
		if st.probe {
			st.wouldFire = true
			return true
		}
		e := &Edit{st: st, m: m, at: root}
		if err := r.Rewrite(m, e); err != nil {
			return refuse(err.Error())
		}
		if why := e.validate(); why != "" {
			return refuse(why)
		}
		e.commit()
		res.fired = &reportEvent{Event{Kind: Fired, Rule: r.Name, Node: about.Name, Op: about.Op, Result: e.result, Detail: e.detail}, about}
		return true
	})
	res.miss = mt.miss
	return res
}

// missInfo is the deepest place patterns failed, for "no rule matched":
// the value found there and every op that rules (and optional nodes) would
// have accepted, or a message for other kinds of mismatch.
type missInfo struct {
	depth int
	v     *graph.Value
	wants []string
	msg   string
}

func (mi *missInfo) add(depth int, v *graph.Value, want, msg string) {
	if depth > mi.depth {
		*mi = missInfo{depth: depth, v: v, msg: msg}
	}
	if depth != mi.depth || v != mi.v || want == "" || slices.Contains(mi.wants, want) {
		return
	}
	mi.wants = append(mi.wants, want)
}

func (mi *missInfo) merge(o missInfo) {
	if o.depth > mi.depth {
		*mi = missInfo{depth: o.depth, v: o.v, msg: o.msg}
	}
	for _, w := range o.wants {
		mi.add(o.depth, o.v, w, o.msg)
	}
}

func (mi missInfo) String() string {
	switch {
	case mi.depth < 0:
		return ""
	case len(mi.wants) > 0:
		w := mi.wants[len(mi.wants)-1]
		if len(mi.wants) > 1 {
			w = strings.Join(mi.wants[:len(mi.wants)-1], ", ") + " or " + w
		}
		return fmt.Sprintf("%s where %s was expected", describe(mi.v), w)
	}
	return mi.msg
}

type matcher struct {
	binds map[string]*graph.Value
	miss  missInfo
}

// match calls k for every way p matches v (with the captures bound) until k
// returns true; it reports whether some k did.
func (mt *matcher) match(p *Pattern, v *graph.Value, depth int, k func() bool) bool {
	if v == nil {
		mt.miss.add(depth, nil, "", fmt.Sprintf("an omitted optional input where %v was expected", p))
		return false
	}
	if p.Optional {
		if mt.matchNode(p, v, depth, k) {
			return true
		}
		return mt.match(p.Args[0], v, depth, k)
	}
	return mt.matchNode(p, v, depth, k)
}

func (mt *matcher) matchNode(p *Pattern, v *graph.Value, depth int, k func() bool) bool {
	var n *graph.Node
	if p.Op != "" {
		n = v.Producer
		if n == nil || n.Op != p.Op {
			mt.miss.add(depth, v, p.Op, "")
			return false
		}
		if p.Args != nil && len(p.Args) != len(n.Inputs) {
			mt.miss.add(depth, v, "", fmt.Sprintf("%s has %d inputs, the pattern %d", describe(v), len(n.Inputs), len(p.Args)))
			return false
		}
	}
	return mt.bind(p.Bind, v, depth, func() bool {
		if n == nil || p.Args == nil {
			return k()
		}
		if mt.args(p.Args, n.Inputs, false, 0, depth+1, k) {
			return true
		}
		return commutative[p.Op] && len(p.Args) == 2 && mt.args(p.Args, n.Inputs, true, 0, depth+1, k)
	})
}

func (mt *matcher) args(ps []*Pattern, vs []*graph.Value, swap bool, i, depth int, k func() bool) bool {
	if i == len(ps) {
		return k()
	}
	j := i
	if swap {
		j = 1 - i
	}
	return mt.match(ps[i], vs[j], depth, func() bool { return mt.args(ps, vs, swap, i+1, depth, k) })
}

func (mt *matcher) bind(name string, v *graph.Value, depth int, k func() bool) bool {
	if name == "" {
		return k()
	}
	if old, ok := mt.binds[name]; ok {
		if old != v {
			mt.miss.add(depth, v, "", fmt.Sprintf("%s and %s should be the same value (%s)", old.Name, v.Name, name))
			return false
		}
		return k()
	}
	mt.binds[name] = v
	ok := k()
	delete(mt.binds, name)
	return ok
}

// describe names a value for a log line: "node X (Op)" for node outputs.
func describe(v *graph.Value) string {
	if v == nil {
		return "nothing"
	}
	if v.Producer != nil {
		if v.Producer.Name == v.Name {
			return fmt.Sprintf("node %s (%s)", v.Name, v.Producer.Op)
		}
		return fmt.Sprintf("%s (node %s, %s)", v.Name, v.Producer.Name, v.Producer.Op)
	}
	return fmt.Sprintf("%s %s", v.Kind, v.Name)
}

// Match is one match of a rule: its captures and views of the graph that
// conditions need.
type Match struct {
	Rule  *Rule
	Root  *graph.Node
	vals  map[string]*graph.Value
	st    *rewriteState
	notes map[string]any
}

// Value returns the value captured as name (nil when an optional part of
// the pattern was absent).
func (m *Match) Value(name string) *graph.Value { return m.vals[name] }

// Has reports whether name was captured.
func (m *Match) Has(name string) bool { return m.vals[name] != nil }

// Node returns the producer of the value captured as name.
func (m *Match) Node(name string) *graph.Node {
	if v := m.vals[name]; v != nil {
		return v.Producer
	}
	return nil
}

// Users returns the nodes that read v (a node reading it twice is listed twice).
func (m *Match) Users(v *graph.Value) []*graph.Node { return m.st.uses[v] }

// IsOutput reports whether v is a graph output.
func (m *Match) IsOutput(v *graph.Value) bool { return m.st.outputs[v] > 0 }

// Set and Get pass results from conditions to the rewrite.
func (m *Match) Set(key string, v any) { m.notes[key] = v }

// Get returns what a condition Set.
func (m *Match) Get(key string) any { return m.notes[key] }

// Memo caches an analysis for the whole pass run (e.g. a mask shared by every
// layer is checked once), keyed by any comparable key.
func (m *Match) Memo(key any, f func() any) any {
	if v, ok := m.st.memo[key]; ok {
		return v
	}
	v := f()
	m.st.memo[key] = v
	return v
}

// Const evaluates a constant value: a const initializer, or an expression of
// consts (Sqrt(64), Trilu(ones), Where(tril, 0, -inf), Slice of a buffer...).
func (m *Match) Const(v *graph.Value) (*graph.Tensor, error) { return m.st.consts.eval(v) }

// Scalar returns the value of a constant with one element, or why it is not
// one ("" when it is).
func (m *Match) Scalar(v *graph.Value) (float64, string) {
	if v.Type.Shape.Numel() != 1 {
		return 0, fmt.Sprintf("%s is not a scalar (shape %v)", describe(v), v.Type.Shape)
	}
	t, err := m.Const(v)
	if err != nil {
		return 0, err.Error()
	}
	return t.At(0), ""
}

// rewriteState is the graph being rewritten plus the indexes rules need,
// kept up to date as edits commit.
type rewriteState struct {
	g       *graph.Graph
	uses    map[*graph.Value][]*graph.Node
	outputs map[*graph.Value]int
	removed map[*graph.Node]bool
	// before holds the nodes inserted this sweep, by the node they precede.
	before     map[*graph.Node][]*graph.Node
	deadConsts map[*graph.Value]bool
	namer      *graph.Namer // made on the first new name: most nodes never fire
	consts     *constEval
	literals   map[string]*graph.Value
	memo       map[any]any
	dirty      bool
	log        *Log
	// probe: the state is over the pass's input, which must not change;
	// the first match whose conditions hold sets wouldFire instead.
	probe, wouldFire bool
	committed        bool
}

func newRewriteState(g *graph.Graph) *rewriteState {
	st := &rewriteState{
		g: g, uses: g.Uses(), outputs: map[*graph.Value]int{}, removed: map[*graph.Node]bool{},
		before: map[*graph.Node][]*graph.Node{}, deadConsts: map[*graph.Value]bool{},
		consts: newConstEval(), memo: map[any]any{},
	}
	for _, o := range g.Outputs {
		st.outputs[o]++
	}
	return st
}

func (st *rewriteState) names() *graph.Namer {
	if st.namer == nil {
		st.namer = graph.NewNamer(st.g)
	}
	return st.namer
}

func (st *rewriteState) isUsed(v *graph.Value) bool { return len(st.uses[v]) > 0 || st.outputs[v] > 0 }

func (st *rewriteState) replaceUses(old, nw *graph.Value) {
	for _, n := range st.uses[old] {
		for i, in := range n.Inputs {
			if in == old {
				n.Inputs[i] = nw
			}
		}
	}
	st.uses[nw] = append(st.uses[nw], st.uses[old]...)
	delete(st.uses, old)
	if c := st.outputs[old]; c > 0 {
		for i, o := range st.g.Outputs {
			if o == old {
				st.g.Outputs[i] = nw
			}
		}
		st.outputs[nw] += c
		delete(st.outputs, old)
	}
}

func (st *rewriteState) dropUse(v *graph.Value, n *graph.Node) {
	us := st.uses[v]
	for i := len(us) - 1; i >= 0; i-- {
		if us[i] == n {
			st.uses[v] = append(us[:i], us[i+1:]...)
			return
		}
	}
}

// sweepDead removes n if nothing reads its outputs, and then whatever only n
// read. Code that was dead before the pass is never reached from here: a
// rewrite only removes what it made dead.
func (st *rewriteState) sweepDead(n *graph.Node) {
	if n == nil || st.removed[n] {
		return
	}
	for _, o := range n.Outputs {
		if st.isUsed(o) {
			return
		}
	}
	st.removed[n] = true
	st.dirty = true
	for _, in := range n.Inputs {
		if in == nil {
			continue
		}
		st.dropUse(in, n)
		if st.isUsed(in) {
			continue
		}
		if in.Producer != nil {
			st.sweepDead(in.Producer)
		} else if in.Kind == graph.Const {
			st.deadConsts[in] = true
		}
	}
}

// rebuild applies the sweep's insertions and removals to the node list.
func (st *rewriteState) rebuild() {
	nodes := make([]*graph.Node, 0, len(st.g.Nodes)+len(st.before))
	var emit func(n *graph.Node)
	emit = func(n *graph.Node) {
		for _, b := range st.before[n] {
			emit(b)
		}
		if !st.removed[n] {
			nodes = append(nodes, n)
		}
	}
	for _, n := range st.g.Nodes {
		emit(n)
	}
	st.g.Nodes = nodes
	if len(st.deadConsts) > 0 {
		keep := st.g.Consts[:0]
		for _, c := range st.g.Consts {
			if st.deadConsts[c] && !st.isUsed(c) {
				for k, v := range st.literals {
					if v == c {
						delete(st.literals, k)
					}
				}
				continue
			}
			keep = append(keep, c)
		}
		st.g.Consts = keep
	}
	st.before = map[*graph.Node][]*graph.Node{}
	st.deadConsts = map[*graph.Value]bool{}
	st.dirty = false
}

// Edit collects one rewrite: new nodes and consts, and which old values the
// new ones replace. Nothing touches the graph until the rule's Rewrite
// returns without error, so a refused rewrite leaves no trace.
type Edit struct {
	st     *rewriteState
	m      *Match
	at     *graph.Node
	nodes  []*graph.Node
	consts []*graph.Value
	zeros  []*graph.Value // zero-filled consts (Zeros), never shared as literals
	repl   [][2]*graph.Value
	result string
	detail string
}

// Before places the new nodes right before n (default: the rule's root).
// Every value they read must be defined before n.
func (e *Edit) Before(n *graph.Node) { e.at = n }

// Describe sets what the firing's log line reports.
func (e *Edit) Describe(result, detail string) { e.result, e.detail = result, detail }

// OpN adds a node applying op (type-checked by the op table), named in the
// root's scope, and returns it.
func (e *Edit) OpN(op string, attrs graph.Attrs, in ...*graph.Value) (*graph.Node, error) {
	scope := ""
	if i := strings.LastIndexByte(e.m.Root.Name, '/'); i >= 0 {
		scope = e.m.Root.Name[:i+1]
	}
	for {
		n, err := graph.NewNode(e.st.names().Fresh(scope+op), op, attrs, in...)
		if err != nil {
			return nil, err
		}
		taken := false
		if len(n.Outputs) > 1 {
			for _, o := range n.Outputs {
				taken = !e.st.names().Reserve(o.Name) || taken
			}
		}
		if !taken {
			e.nodes = append(e.nodes, n)
			return n, nil
		}
	}
}

// Op is OpN returning the node's first output.
func (e *Edit) Op(op string, attrs graph.Attrs, in ...*graph.Value) (*graph.Value, error) {
	n, err := e.OpN(op, attrs, in...)
	if err != nil {
		return nil, err
	}
	return n.Outputs[0], nil
}

// Literal returns a const holding data (rounded to dt when materialised);
// an identical literal already in the graph is reused.
func (e *Edit) Literal(dt graph.DType, shape graph.Shape, data ...float64) *graph.Value {
	if e.st.literals == nil {
		e.st.literals = map[string]*graph.Value{}
		for _, c := range e.st.g.Consts {
			// A string literal's text is not in its key: never reused.
			if c.Init != nil && c.Init.Fn == "literal" && c.Type.DType != graph.String {
				e.st.literals[literalKey(c.Type, c.Init.Data)] = c
			}
		}
	}
	t := graph.TensorType{DType: dt, Shape: shape.Clone()}
	key := literalKey(t, data)
	if c, ok := e.st.literals[key]; ok {
		return c
	}
	for _, c := range e.consts {
		if literalKey(c.Type, c.Init.Data) == key {
			return c
		}
	}
	init := graph.Literal(data...)
	c := &graph.Value{Name: e.st.names().Fresh("c"), Type: t, Kind: graph.Const, Init: &init}
	e.consts = append(e.consts, c)
	return c
}

// Zeros returns a new zero-filled const of type t.
func (e *Edit) Zeros(t graph.TensorType) *graph.Value {
	init := graph.Zeros()
	c := &graph.Value{Name: e.st.names().Fresh("zeros"), Type: graph.TensorType{DType: t.DType, Shape: t.Shape.Clone()}, Kind: graph.Const, Init: &init}
	e.zeros = append(e.zeros, c)
	return c
}

func literalKey(t graph.TensorType, data []float64) string {
	var b strings.Builder
	b.WriteString(t.String())
	for _, d := range data {
		fmt.Fprintf(&b, ",%x", math.Float64bits(d))
	}
	return b.String()
}

// Replace makes every use of old (and the graph output, if old is one) read
// nw instead. When nw is a new node's output it takes over old's name, so
// downstream names and graph output names do not change.
func (e *Edit) Replace(old, nw *graph.Value) { e.repl = append(e.repl, [2]*graph.Value{old, nw}) }

// validate refuses edits that would break the graph.
func (e *Edit) validate() string {
	if len(e.repl) == 0 {
		return "rewrite replaced nothing"
	}
	fresh := map[*graph.Value]bool{}
	for _, n := range e.nodes {
		for _, o := range n.Outputs {
			fresh[o] = true
		}
	}
	for _, r := range e.repl {
		old, nw := r[0], r[1]
		if old == nil || nw == nil || old == nw {
			return "rewrite replaced a value by itself or by nothing"
		}
		if !old.Type.Equal(nw.Type) {
			return fmt.Sprintf("rewrite would change %s from %v to %v", old.Name, old.Type, nw.Type)
		}
		if !fresh[nw] && e.st.outputs[old] > 0 {
			return fmt.Sprintf("%s is a graph output and would lose its name", old.Name)
		}
		for _, n := range e.nodes {
			for _, in := range n.Inputs {
				if in == old {
					return fmt.Sprintf("new node %s reads %s, which it replaces", n.Name, old.Name)
				}
			}
		}
	}
	return ""
}

func (e *Edit) commit() {
	st := e.st
	for _, c := range e.consts {
		st.g.Consts = append(st.g.Consts, c)
		st.literals[literalKey(c.Type, c.Init.Data)] = c
	}
	st.g.Consts = append(st.g.Consts, e.zeros...)
	st.before[e.at] = append(st.before[e.at], e.nodes...)
	for _, n := range e.nodes {
		for _, in := range n.Inputs {
			if in != nil {
				st.uses[in] = append(st.uses[in], n)
			}
		}
	}
	for _, r := range e.repl {
		st.replaceUses(r[0], r[1])
	}
	renamed := map[*graph.Value]bool{}
	for _, r := range e.repl {
		old, nw := r[0], r[1]
		st.sweepDead(old.Producer)
		if renamed[nw] || !slicesContainsNode(e.nodes, nw.Producer) {
			continue
		}
		name := old.Name
		if old.Producer != nil && !st.removed[old.Producer] {
			// Its node lives on for other outputs; old itself is unread
			// now and gives its name up.
			old.Name = st.names().Fresh(name + "_replaced")
		}
		nw.Name = name
		renamed[nw] = true
	}
	st.committed = true
	if e.result == "" && len(e.nodes) > 0 {
		e.result = e.nodes[len(e.nodes)-1].Name
	}
	st.dirty = true
}

func slicesContainsNode(ns []*graph.Node, n *graph.Node) bool {
	for _, x := range ns {
		if x == n {
			return true
		}
	}
	return false
}
