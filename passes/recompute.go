package passes

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// PassRecompute names the activation recomputation.
const PassRecompute = "recompute"

// Scopes the recomputation reads from node names: the model builds layer i's
// forward under "layers.i/", and autodiff names the nodes of the backward
// "grad/<forward scope>/...".
const (
	recomputeLayerScope = "layers."
	recomputeGradScope  = "grad/"
	recomputeCloneScope = "recompute/"
)

// Recompute trades compute for memory in a training step (autodiff.TrainingGraph
// output): per transformer layer, the backward recomputes the layer's forward
// from the layer's input instead of reading the activations the forward
// saved, so those activations die at the end of the layer's forward instead
// of living until its backward.
//
// For each layer (the nodes scoped "layers.i/"), a value the layer computes is
// recomputable unless a node outside the layer's forward and outside the
// backward reads it (the layer's output, which the next layer reads anyway)
// or it is a graph output. The nodes that compute the recomputable values the
// backward reads, and whatever recomputable values those need, are cloned
// (names prefixed "recompute/") and placed right before the first backward
// node that reads any of them; every backward reader is rewired to the
// clones. Clones read the originals for everything else: parameters,
// constants, the layer's input and values kept as above.
//
// The clones are the same ops on the same inputs, so where kernels are
// deterministic (the CPU, FlashAttention included) the step computes the
// same bits. Nodes are kept in topological order: a clone reads only values
// computed before the first backward reader, and what it replaces is read
// only from that reader on.
//
// Mode RecomputeCheap recomputes only the ops of recomputeCheapOps (norms,
// elementwise, reshapes): the outputs of MatMul, Gemm, FlashAttention and any
// other op outside the table stay saved, so the GEMMs' backward reads them
// as without recomputation and only the cheap values are computed again.
type Recompute struct{ Mode RecomputeMode }

// RecomputeMode says which forward values Recompute recomputes.
type RecomputeMode int

const (
	// RecomputeFull recomputes each layer's whole forward.
	RecomputeFull RecomputeMode = iota
	// RecomputeCheap recomputes only the ops in recomputeCheapOps.
	RecomputeCheap
)

// recomputeCheapOps is the rule table of RecomputeCheap: ops that cost little
// next to the GEMMs and attention, whose outputs are recomputed rather than
// saved.
var recomputeCheapOps = map[string]bool{
	"SimplifiedLayerNormalization": true, "RMSNormalization": true, "LayerNormalization": true,
	"Add": true, "Sub": true, "Mul": true, "Div": true, "Neg": true, "Pow": true, "Sqrt": true,
	"Sigmoid": true, "Cast": true, "ReduceMean": true, "Where": true,
	"Reshape": true, "Transpose": true, "Unsqueeze": true, "Squeeze": true, "Expand": true,
	"Concat": true, "Slice": true, "Split": true, "FusedElementwise": true,
}

// Name is "recompute".
func (Recompute) Name() string { return PassRecompute }

// recomputeLayer parses the layer index of a forward node name
// ("layers.3/attn/MatMul_0" is 3); ok is false for any other name.
func recomputeLayer(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, recomputeLayerScope)
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(rest, "/")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(num)
	if err != nil || i < 0 || strconv.Itoa(i) != num {
		return 0, false
	}
	return i, true
}

// Run rewrites a clone of g; a graph without layers whose activations the
// backward reads comes back as it is. Layers are the nodes scoped
// "layers.i/" (the built-in model); in a graph without such scopes (an
// imported one), the layers structuralLayers finds.
func (p Recompute) Run(g *graph.Graph, log *Log) (*graph.Graph, error) {
	if g == nil {
		return nil, errNilGraph
	}
	c := g.Clone()

	// Node names and value names are separate namespaces (a node and its
	// first output often share a name).
	names, nodeNames := map[string]bool{}, map[string]bool{}
	for _, v := range c.Inputs {
		names[v.Name] = true
	}
	for _, v := range c.Initializers() {
		names[v.Name] = true
	}
	pos := map[*graph.Node]int{}
	readers := map[*graph.Value][]*graph.Node{}
	layerNodes := map[int][]*graph.Node{}
	layerOf := map[*graph.Node]int{}
	for i, n := range c.Nodes {
		pos[n] = i
		nodeNames[n.Name] = true
		for _, o := range n.Outputs {
			names[o.Name] = true
		}
		for _, in := range n.Inputs {
			if in != nil && !slices.Contains(readers[in], n) {
				readers[in] = append(readers[in], n)
			}
		}
		if l, ok := recomputeLayer(n.Name); ok {
			layerNodes[l] = append(layerNodes[l], n)
			layerOf[n] = l
		}
	}
	isOutput := map[*graph.Value]bool{}
	for _, v := range c.Outputs {
		isOutput[v] = true
	}
	isGrad := func(n *graph.Node) bool { return strings.HasPrefix(n.Name, recomputeGradScope) }
	label := func(l int) string { return fmt.Sprintf("layers.%d", l) }
	if len(layerNodes) == 0 {
		// No scopes (an imported graph): find the layers by structure.
		layerNodes = structuralLayers(c, isGrad, isOutput)
		for l, ns := range layerNodes {
			for _, n := range ns {
				layerOf[n] = l
			}
		}
		label = func(l int) string {
			ns := layerNodes[l]
			return fmt.Sprintf("layer %d (%s … %s, found by structure)", l, ns[0].Name, ns[len(ns)-1].Name)
		}
	}

	layers := make([]int, 0, len(layerNodes))
	for l := range layerNodes {
		layers = append(layers, l)
	}
	sort.Ints(layers)

	insertBefore := map[int][]*graph.Node{} // node index -> clones placed before it
	done := 0
	for _, l := range layers {
		fwd := layerNodes[l]
		inLayer := func(n *graph.Node) bool { li, ok := layerOf[n]; return ok && li == l }
		// recomputable: computed in the layer, read only inside it and by
		// the backward.
		recomputable := map[*graph.Value]bool{}
		for _, n := range fwd {
			for _, o := range n.Outputs {
				keep := isOutput[o]
				for _, r := range readers[o] {
					if !inLayer(r) && !isGrad(r) {
						keep = true
					}
				}
				if p.Mode == RecomputeCheap && !recomputeCheapOps[n.Op] {
					keep = true
				}
				if !keep {
					recomputable[o] = true
				}
			}
		}
		// The backward's reads of recomputable values, and the first of them.
		var bwdReaders []*graph.Node
		first := -1
		need := map[*graph.Node]bool{}
		var stack []*graph.Node
		for _, n := range fwd {
			for _, o := range n.Outputs {
				if !recomputable[o] {
					continue
				}
				for _, r := range readers[o] {
					if !isGrad(r) {
						continue
					}
					if !slices.Contains(bwdReaders, r) {
						bwdReaders = append(bwdReaders, r)
					}
					if first < 0 || pos[r] < first {
						first = pos[r]
					}
					if !need[n] {
						need[n] = true
						stack = append(stack, n)
					}
				}
			}
		}
		if first < 0 {
			continue
		}
		// Everything recomputable the needed nodes read is needed too.
		for len(stack) > 0 {
			n := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for _, in := range n.Inputs {
				if in != nil && recomputable[in] && in.Producer != nil && !need[in.Producer] {
					need[in.Producer] = true
					stack = append(stack, in.Producer)
				}
			}
		}
		// Clone in forward order, so the clones are in topological order.
		clones := map[*graph.Value]*graph.Value{}
		var cloned []*graph.Node
		savedBytes := int64(0)
		for _, n := range fwd {
			if !need[n] {
				continue
			}
			if pos[n] >= first {
				return nil, fmt.Errorf("recompute: %s: forward node %s comes after the backward node %s that reads it", label(l), n.Name, c.Nodes[first].Name)
			}
			cn := &graph.Node{Name: recomputeCloneScope + n.Name, Op: n.Op, Attrs: n.Attrs.Clone()}
			if nodeNames[cn.Name] {
				return nil, fmt.Errorf("recompute: %s: node name %q is taken", label(l), cn.Name)
			}
			nodeNames[cn.Name] = true
			for _, in := range n.Inputs {
				if cv, ok := clones[in]; ok {
					in = cv
				}
				cn.Inputs = append(cn.Inputs, in)
			}
			for _, o := range n.Outputs {
				cv := &graph.Value{Name: recomputeCloneScope + o.Name, Type: graph.TensorType{DType: o.Type.DType, Shape: o.Type.Shape.Clone()}, Kind: graph.Intermediate, Producer: cn}
				if names[cv.Name] {
					return nil, fmt.Errorf("recompute: %s: value name %q is taken", label(l), cv.Name)
				}
				names[cv.Name] = true
				clones[o] = cv
				cn.Outputs = append(cn.Outputs, cv)
				savedBytes += int64(o.Type.Shape.Numel()) * int64(o.Type.DType.Size())
			}
			cloned = append(cloned, cn)
		}
		rewired := 0
		for _, r := range bwdReaders {
			for k, in := range r.Inputs {
				if cv, ok := clones[in]; ok && recomputable[in] {
					r.Inputs[k] = cv
					rewired++
				}
			}
		}
		insertBefore[first] = append(insertBefore[first], cloned...)
		done++
		log.Infof(PassRecompute, "%s: recomputes %d of its %d forward nodes (their values: %d bytes at graph dtypes) before %s; %d backward reads rewired",
			label(l), len(cloned), len(fwd), savedBytes, c.Nodes[first].Name, rewired)
	}
	if done == 0 {
		return g, nil
	}
	nodes := make([]*graph.Node, 0, len(c.Nodes))
	for i, n := range c.Nodes {
		nodes = append(nodes, insertBefore[i]...)
		nodes = append(nodes, n)
	}
	c.Nodes = nodes
	return c, nil
}

// structuralLayers finds the layers of a training step whose forward carries
// no layer scopes (a graph imported from ONNX names its nodes as its exporter
// did). The forward is the nodes that are not backward ("grad/...") and read
// nothing the backward computes. In it, a cut is a point of the forward's
// order where exactly one floating activation (a value computed from the
// graph's inputs, not from params and consts alone) is live: in a transformer,
// the residual stream after a residual Add, which everything after reads
// through it. Each attention (Softmax or FlashAttention) must lie between its
// own two cuts; layer k is the nodes after the last cut before attention k up
// to that before attention k+1. The last layer spans as many cuts after its
// start as the layer before it did (one, the attention's sublayer, in a
// one-layer graph). A forward where that does not hold (two attentions
// between cuts, no cut before an attention) has no layers: nil.
//
// Which nodes a layer holds decides only what is recomputed, never whether
// the step is right: Run recomputes a value only where nothing but its layer
// and the backward reads it.
func structuralLayers(c *graph.Graph, isGrad func(*graph.Node) bool, isOutput map[*graph.Value]bool) map[int][]*graph.Node {
	backward := map[*graph.Value]bool{}
	var fwd []*graph.Node
	for _, n := range c.Nodes {
		bwd := isGrad(n)
		for _, in := range n.Inputs {
			bwd = bwd || (in != nil && backward[in])
		}
		if bwd {
			for _, o := range n.Outputs {
				backward[o] = true
			}
			continue
		}
		fwd = append(fwd, n)
	}
	// Activations: computed, by the forward, from a graph input.
	act := map[*graph.Value]bool{}
	for _, v := range c.Inputs {
		act[v] = true
	}
	last := map[*graph.Value]int{} // a float activation's last forward reader
	var attn []int
	for p, n := range fwd {
		from := false
		for _, in := range n.Inputs {
			if in != nil && act[in] {
				from = true
				if _, ok := last[in]; ok {
					last[in] = p
				}
			}
		}
		if n.Op == "Softmax" || n.Op == "FlashAttention" {
			attn = append(attn, p)
		}
		if !from {
			continue
		}
		for _, o := range n.Outputs {
			act[o] = true
			if o.Type.DType.IsFloat() {
				last[o] = p
				if isOutput[o] {
					last[o] = len(fwd)
				}
			}
		}
	}
	if len(attn) == 0 {
		return nil
	}
	// Sweep the forward: the cuts are the positions after which one float
	// activation is live.
	var cuts []int
	live := 0
	for p, n := range fwd {
		for _, o := range n.Outputs {
			if q, ok := last[o]; ok && q > p {
				live++
			}
		}
		seen := map[*graph.Value]bool{}
		for _, in := range n.Inputs {
			if q, ok := last[in]; ok && q == p && !seen[in] {
				seen[in] = true
				live--
			}
		}
		if live == 1 {
			cuts = append(cuts, p)
		}
	}
	starts := make([]int, len(attn))
	for k, a := range attn {
		starts[k] = -1
		for _, q := range cuts {
			if q < a {
				starts[k] = q
			}
		}
		if starts[k] < 0 || (k > 0 && starts[k] < attn[k-1]) {
			return nil
		}
	}
	layers := map[int][]*graph.Node{}
	for k, a := range attn {
		end := -1
		if k+1 < len(attn) {
			end = starts[k+1]
		} else {
			// As many cuts as the layer before spans (one without one).
			span, prev := 0, -1
			if k > 0 {
				prev = starts[k-1]
			}
			for _, q := range cuts {
				if k > 0 && q > prev && q <= starts[k] {
					span++
				}
			}
			span = max(span, 1)
			for _, q := range cuts {
				if q > starts[k] {
					if span--; span == 0 {
						end = q
						break
					}
				}
			}
		}
		if end < a {
			continue
		}
		layers[k] = append([]*graph.Node(nil), fwd[starts[k]+1:end+1]...)
	}
	return layers
}
