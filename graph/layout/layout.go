// Package layout places the nodes of a directed acyclic graph in layers,
// top to bottom, for drawing (a Sugiyama-style layout): every node gets a
// rank, every edge goes from a lower rank to a higher one, long edges pass
// through one bend point per rank they cross. It knows nothing of what the
// nodes mean; graph/picture draws flashgraph's diagrams with it.
//
// Each phase is linear or n·log n in the size of the graph plus its bend
// points, and the iterative phases run a fixed number of times, so a
// training graph of thousands of nodes lays out in well under a second, and
// the same input always gives the same output.
package layout

import (
	"fmt"
)

// A Node is a box to place, by its size.
type Node struct{ W, H float64 }

// An Edge goes from node Src to node Dst (indices into the nodes).
type Edge struct{ Src, Dst int }

// A Point is a position; Y grows downward.
type Point struct{ X, Y float64 }

// Options tune the spacing and the work spent ordering.
type Options struct {
	NodeSep float64 // horizontal gap between boxes of one rank
	RankSep float64 // vertical gap between ranks
	Sweeps  int     // barycenter ordering passes (each one down and one up)
}

// DefaultOptions are what graph/picture uses.
var DefaultOptions = Options{NodeSep: 16, RankSep: 36, Sweeps: 8}

// Result is a layout: each node's centre and rank, each edge's polyline
// from the bottom of its source to the top of its destination, and the size
// of the whole (every box lies within [0,Width]×[0,Height]).
type Result struct {
	Centers   []Point
	Ranks     []int
	Edges     [][]Point
	Width     float64
	Height    float64
	Crossings int // edge crossings between adjacent ranks of the order chosen
}

// Layout places nodes and routes edges. It refuses an edge that names a
// missing node, a self loop and a cycle.
func Layout(nodes []Node, edges []Edge, opt Options) (*Result, error) {
	n := len(nodes)
	for i, e := range edges {
		if e.Src < 0 || e.Src >= n || e.Dst < 0 || e.Dst >= n {
			return nil, fmt.Errorf("layout: edge %d (%d→%d) names a node out of range [0,%d)", i, e.Src, e.Dst, n)
		}
		if e.Src == e.Dst {
			return nil, fmt.Errorf("layout: edge %d is a loop on node %d", i, e.Src)
		}
	}
	out := adjacency(n, edges, func(e Edge) (int, int) { return e.Src, e.Dst })
	in := adjacency(n, edges, func(e Edge) (int, int) { return e.Dst, e.Src })
	order, err := topoOrder(n, edges, out)
	if err != nil {
		return nil, err
	}
	rank := assignRanks(n, order, edges, in, out)

	l := newLayers(nodes, edges, rank, order, out)
	l.crossings = l.orderSweeps(opt.Sweeps)
	l.placeX(opt.NodeSep)
	ys := l.placeY(opt.RankSep)

	res := &Result{Centers: make([]Point, n), Ranks: rank, Edges: make([][]Point, len(edges)), Crossings: l.crossings}
	for v := range n {
		res.Centers[v] = Point{l.x[v], ys[rank[v]]}
	}
	for i, e := range edges {
		pts := []Point{{l.x[e.Src], ys[rank[e.Src]] + nodes[e.Src].H/2}}
		for _, d := range l.chains[i] {
			pts = append(pts, Point{l.x[d], ys[l.rank[d]]})
		}
		pts = append(pts, Point{l.x[e.Dst], ys[rank[e.Dst]] - nodes[e.Dst].H/2})
		res.Edges[i] = pts
	}
	for v := range l.x {
		res.Width = max(res.Width, l.x[v]+l.w[v]/2)
	}
	if len(ys) > 0 {
		res.Height = ys[len(ys)-1] + l.rankH[len(ys)-1]/2
	}
	return res, nil
}

// adjacency lists, for each node, the edges (by index) leaving it as key
// says, in edge order.
func adjacency(n int, edges []Edge, key func(Edge) (int, int)) [][]int {
	adj := make([][]int, n)
	for i, e := range edges {
		k, _ := key(e)
		adj[k] = append(adj[k], i)
	}
	return adj
}

// topoOrder is Kahn's algorithm, lowest index first among the ready.
func topoOrder(n int, edges []Edge, out [][]int) ([]int, error) {
	indeg := make([]int, n)
	for _, e := range edges {
		indeg[e.Dst]++
	}
	var order, ready []int
	for v := n - 1; v >= 0; v-- {
		if indeg[v] == 0 {
			ready = append(ready, v)
		}
	}
	// ready is a stack kept in decreasing index order at push time; a
	// node freed later goes on top: depth-first, which keeps chains together.
	for len(ready) > 0 {
		v := ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		order = append(order, v)
		outs := out[v]
		for k := len(outs) - 1; k >= 0; k-- {
			d := edges[outs[k]].Dst
			if indeg[d]--; indeg[d] == 0 {
				ready = append(ready, d)
			}
		}
	}
	if len(order) != n {
		return nil, fmt.Errorf("layout: the graph has a cycle (%d of %d nodes ordered)", len(order), n)
	}
	return order, nil
}

// assignRanks gives each node the longest path to it from a source, then
// moves a node down toward its successors where that shortens the edges:
// those with more edges out than in (a weight feeding one op deep in the
// graph sits just above it, not in the first rank). The result starts at 0.
func assignRanks(n int, order []int, edges []Edge, in, out [][]int) []int {
	rank := make([]int, n)
	for _, v := range order {
		for _, i := range in[v] {
			rank[v] = max(rank[v], rank[edges[i].Src]+1)
		}
	}
	for k := len(order) - 1; k >= 0; k-- {
		v := order[k]
		if len(out[v]) == 0 || len(out[v]) <= len(in[v]) {
			continue
		}
		lo := -1
		for _, i := range out[v] {
			if r := rank[edges[i].Dst] - 1; lo < 0 || r < lo {
				lo = r
			}
		}
		rank[v] = max(rank[v], lo)
	}
	low := 0
	for v := range n {
		if v == 0 || rank[v] < low {
			low = rank[v]
		}
	}
	for v := range rank {
		rank[v] -= low
	}
	return rank
}
