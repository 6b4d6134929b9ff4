package graph

import (
	"fmt"
	"strconv"
	"strings"
)

// A Diagram is what a picture of a graph shows, independent of how it is
// drawn: the DOT writer (dot.go) and the pure-Go renderer (graph/picture)
// both draw this model, so their labels, colours and shapes cannot drift.
// Styles are Graphviz attributes (shape, style, fillcolor, color, penwidth,
// fontsize); the renderer reads the same names.
type Diagram struct {
	Title    string
	Clusters []*DiagramCluster
}

// A DiagramCluster is one graph of a diagram: the whole of it for WriteDOT,
// one side of a before/after pair for WriteDOTPair.
type DiagramCluster struct {
	ID    string // "" for a diagram of one graph, else cluster_before/cluster_after
	Title string
	Style map[string]string // Graphviz attributes of the frame (nil without one); shared, never modify
	Nodes []DiagramNode
	Edges []DiagramEdge
}

// A DiagramNode is a leaf (input, param, const), an op node or a graph output.
type DiagramNode struct {
	ID      string            // positional: i<k>, p<k>, c<k>, n<k>, o<k>, with the cluster's prefix
	Style   map[string]string // Graphviz attributes; shared, never modify
	Lines   []string          // the label, one entry a line
	Tooltip string            // what hovering says ("" for none)
}

// A DiagramEdge carries a value from one node to another, by index into the
// cluster's Nodes.
type DiagramEdge struct {
	Src, Dst int
	Label    string
}

// NewDiagram builds the diagram of one graph.
func NewDiagram(g *Graph) (*Diagram, error) {
	if g == nil {
		return nil, fmt.Errorf("diagram: nil graph")
	}
	c, err := diagramCluster("", "", "", g)
	if err != nil {
		return nil, err
	}
	return &Diagram{Title: g.Name, Clusters: []*DiagramCluster{c}}, nil
}

// NewDiagramPair builds the diagram of two graphs side by side, one cluster
// each: the graph before and after a pass.
func NewDiagramPair(before, after *Graph, titleBefore, titleAfter string) (*Diagram, error) {
	if before == nil || after == nil {
		return nil, fmt.Errorf("diagram: nil graph")
	}
	d := &Diagram{Title: titleBefore + " vs " + titleAfter}
	for _, c := range []struct {
		id, title string
		g         *Graph
	}{{"cluster_before", titleBefore, before}, {"cluster_after", titleAfter, after}} {
		dc, err := diagramCluster(c.id, c.title, strings.TrimPrefix(c.id, "cluster_")+"_", c.g)
		if err != nil {
			return nil, err
		}
		d.Clusters = append(d.Clusters, dc)
	}
	return d, nil
}

// diagramCluster lists g's leaves, nodes, outputs and edges, with IDs
// prefixed by prefix.
func diagramCluster(id, title, prefix string, g *Graph) (*DiagramCluster, error) {
	c := &DiagramCluster{ID: id, Title: title}
	if id != "" {
		c.Style = dotClusterStyle
	}
	ids := make(map[*Value]int, len(g.Inputs)+len(g.Params)+len(g.Consts)+len(g.Nodes))
	node := func(id string, style map[string]string, lines []string, tooltip string) int {
		c.Nodes = append(c.Nodes, DiagramNode{ID: id, Style: style, Lines: lines, Tooltip: tooltip})
		return len(c.Nodes) - 1
	}
	leaves := func(vs []*Value, tag string, style map[string]string) {
		for k, v := range vs {
			lines := []string{v.Name, v.Type.String()}
			if v.Init != nil {
				lines = append(lines, dotClip(formatInit(v.Init)))
			}
			ids[v] = node(prefix+tag+strconv.Itoa(k), style, lines, v.Kind.String()+" "+v.Name)
		}
	}
	leaves(g.Inputs, "i", dotInputStyle)
	leaves(g.Params, "p", dotParamStyle)
	leaves(g.Consts, "c", dotConstStyle)

	for k, n := range g.Nodes {
		op, style, doc := n.Op, dotOpStyle, ""
		if s := n.Spec(); s != nil {
			op, doc = s.QualifiedName(), s.QualifiedName()+": "+s.Doc
			if s.Domain != DomainONNX {
				style = dotCustomStyle
			}
		}
		if n.Op == "FlashAttention" || n.Op == "FlashAttentionGrad" {
			style = dotFlashStyle
		}
		lines := []string{op, n.Name}
		if len(n.Attrs) > 0 {
			var parts []string
			for _, a := range n.Attrs.Names() {
				parts = append(parts, a+"="+n.Attrs[a].format())
			}
			lines = append(lines, dotClip(strings.Join(parts, ", ")))
		}
		var types []string
		for _, o := range n.Outputs {
			types = append(types, o.Type.String())
		}
		lines = append(lines, strings.Join(types, ", "))
		dst := node(prefix+"n"+strconv.Itoa(k), style, lines, doc) // hovering an op says what it computes
		for i, v := range n.Inputs {
			if v == nil {
				continue // an omitted optional input
			}
			src, ok := ids[v]
			if !ok {
				return nil, fmt.Errorf("dot: node %s input %d (%s) is not defined before it", n.Name, i, v.Name)
			}
			c.Edges = append(c.Edges, DiagramEdge{Src: src, Dst: dst, Label: dotEdgeLabel(v)})
		}
		for _, o := range n.Outputs {
			ids[o] = dst
		}
	}
	for k, v := range g.Outputs {
		src, ok := ids[v]
		if !ok {
			return nil, fmt.Errorf("dot: output %s is not defined", v.Name)
		}
		dst := node(prefix+"o"+strconv.Itoa(k), dotOutputStyle, []string{"output " + v.Name, v.Type.String()}, "output "+v.Name)
		c.Edges = append(c.Edges, DiagramEdge{Src: src, Dst: dst, Label: dotEdgeLabel(v)})
	}
	return c, nil
}
