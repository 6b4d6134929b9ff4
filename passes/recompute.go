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
type Recompute struct{}

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
// backward reads comes back as it is.
func (Recompute) Run(g *graph.Graph, log *Log) (*graph.Graph, error) {
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
				return nil, fmt.Errorf("recompute: layer %d: forward node %s comes after the backward node %s that reads it", l, n.Name, c.Nodes[first].Name)
			}
			cn := &graph.Node{Name: recomputeCloneScope + n.Name, Op: n.Op, Attrs: n.Attrs.Clone()}
			if nodeNames[cn.Name] {
				return nil, fmt.Errorf("recompute: layer %d: node name %q is taken", l, cn.Name)
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
					return nil, fmt.Errorf("recompute: layer %d: value name %q is taken", l, cv.Name)
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
		log.Infof(PassRecompute, "layers.%d: recomputes %d of its %d forward nodes (their values: %d bytes at graph dtypes) before %s; %d backward reads rewired",
			l, len(cloned), len(fwd), savedBytes, c.Nodes[first].Name, rewired)
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
