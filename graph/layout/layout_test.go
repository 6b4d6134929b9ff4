package layout

import (
	"math/rand/v2"
	"reflect"
	"testing"
)

// randomDAG is a graph with edges only from lower to higher index, of
// mixed box sizes, some edges long and some repeated.
func randomDAG(seed uint64, n, m int) ([]Node, []Edge) {
	rng := rand.New(rand.NewPCG(seed, 1))
	nodes := make([]Node, n)
	for i := range nodes {
		nodes[i] = Node{W: 20 + float64(rng.IntN(200)), H: 20 + float64(rng.IntN(60))}
	}
	edges := make([]Edge, m)
	for i := range edges {
		a := rng.IntN(n - 1)
		b := a + 1 + rng.IntN(min(n-a-1, 1+rng.IntN(40)))
		edges[i] = Edge{a, b}
	}
	return nodes, edges
}

// checkLayout: no two boxes overlap, every box is inside the picture, every
// edge goes down the ranks and its polyline strictly down the page from the
// bottom of its source to the top of its destination.
func checkLayout(t *testing.T, nodes []Node, edges []Edge, r *Result) {
	t.Helper()
	const eps = 1e-6
	for i, a := range nodes {
		ca := r.Centers[i]
		if ca.X-a.W/2 < -eps || ca.X+a.W/2 > r.Width+eps || ca.Y-a.H/2 < -eps || ca.Y+a.H/2 > r.Height+eps {
			t.Fatalf("node %d at %v (%gx%g) is outside %gx%g", i, ca, a.W, a.H, r.Width, r.Height)
		}
		for j := i + 1; j < len(nodes); j++ {
			b, cb := nodes[j], r.Centers[j]
			if ca.X-a.W/2 < cb.X+b.W/2-eps && cb.X-b.W/2 < ca.X+a.W/2-eps &&
				ca.Y-a.H/2 < cb.Y+b.H/2-eps && cb.Y-b.H/2 < ca.Y+a.H/2-eps {
				t.Fatalf("nodes %d at %v and %d at %v overlap", i, ca, j, cb)
			}
		}
	}
	for i, e := range edges {
		if r.Ranks[e.Dst] <= r.Ranks[e.Src] {
			t.Fatalf("edge %d: %d (rank %d) → %d (rank %d) does not go down", i, e.Src, r.Ranks[e.Src], e.Dst, r.Ranks[e.Dst])
		}
		pts := r.Edges[i]
		if len(pts) != r.Ranks[e.Dst]-r.Ranks[e.Src]+1 {
			t.Fatalf("edge %d spans %d ranks with %d points", i, r.Ranks[e.Dst]-r.Ranks[e.Src], len(pts))
		}
		for k := 1; k < len(pts); k++ {
			if pts[k].Y <= pts[k-1].Y {
				t.Fatalf("edge %d goes up at point %d: %v", i, k, pts)
			}
		}
		s, d := r.Centers[e.Src], r.Centers[e.Dst]
		if pts[0] != (Point{s.X, s.Y + nodes[e.Src].H/2}) || pts[len(pts)-1] != (Point{d.X, d.Y - nodes[e.Dst].H/2}) {
			t.Fatalf("edge %d does not join its boxes: %v, boxes at %v and %v", i, pts, s, d)
		}
	}
}

func TestLayoutRandomDAGs(t *testing.T) {
	for seed := range uint64(20) {
		nodes, edges := randomDAG(seed, 10+int(seed)*15, 30+int(seed)*40)
		r, err := Layout(nodes, edges, DefaultOptions)
		if err != nil {
			t.Fatal(err)
		}
		checkLayout(t, nodes, edges, r)
	}
}

func TestLayoutDeterministic(t *testing.T) {
	nodes, edges := randomDAG(7, 300, 900)
	a, err := Layout(nodes, edges, DefaultOptions)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Layout(nodes, edges, DefaultOptions)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Error("two layouts of one graph differ")
	}
}

// TestLayoutSweepsReduceCrossings: the ordering keeps the best order it
// sees, so more sweeps never give more crossings, and on a graph with many
// crossings in its first order they give fewer.
func TestLayoutSweepsReduceCrossings(t *testing.T) {
	nodes, edges := randomDAG(3, 400, 1200)
	none, err := Layout(nodes, edges, Options{NodeSep: 10, RankSep: 10, Sweeps: 0})
	if err != nil {
		t.Fatal(err)
	}
	some, err := Layout(nodes, edges, DefaultOptions)
	if err != nil {
		t.Fatal(err)
	}
	if some.Crossings >= none.Crossings {
		t.Errorf("%d crossings after %d sweeps, %d before", some.Crossings, DefaultOptions.Sweeps, none.Crossings)
	}
	t.Logf("crossings: %d unordered, %d after %d sweeps", none.Crossings, some.Crossings, DefaultOptions.Sweeps)
}

// TestLayoutCrossingCount checks the counter on a case worked by hand: two
// sources above two sinks, wired across.
func TestLayoutCrossingCount(t *testing.T) {
	l := &layers{rows: [][]int{{0, 1}, {2, 3}}, pos: []int{0, 1, 0, 1}, down: [][]int{{3}, {2}, nil, nil}}
	if c := l.countCrossings(); c != 1 {
		t.Errorf("crossed pair: %d crossings, want 1", c)
	}
	l.down = [][]int{{2, 3}, {2, 3}, nil, nil}
	if c := l.countCrossings(); c != 1 {
		t.Errorf("K2,2: %d crossings, want 1", c)
	}
	l.down = [][]int{{2}, {3}, nil, nil}
	if c := l.countCrossings(); c != 0 {
		t.Errorf("parallel pair: %d crossings, want 0", c)
	}
}

// TestLayoutRanks: a source feeding only a deep node sits just above it
// (not in the first rank), and a chain takes one rank a node.
func TestLayoutRanks(t *testing.T) {
	nodes := make([]Node, 6)
	for i := range nodes {
		nodes[i] = Node{W: 10, H: 10}
	}
	// 0→1→2→3→4, and 5→4 (a weight read at the end)
	edges := []Edge{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {5, 4}}
	r, err := Layout(nodes, edges, DefaultOptions)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{0, 1, 2, 3, 4, 3}; !reflect.DeepEqual(r.Ranks, want) {
		t.Errorf("ranks %v, want %v", r.Ranks, want)
	}
	checkLayout(t, nodes, edges, r)
}

func TestLayoutErrors(t *testing.T) {
	nodes := []Node{{10, 10}, {10, 10}, {10, 10}}
	for name, edges := range map[string][]Edge{
		"cycle":        {{0, 1}, {1, 2}, {2, 0}},
		"loop":         {{1, 1}},
		"out of range": {{0, 3}},
		"negative":     {{-1, 0}},
	} {
		if _, err := Layout(nodes, edges, DefaultOptions); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if r, err := Layout(nil, nil, DefaultOptions); err != nil || len(r.Centers) != 0 {
		t.Errorf("empty graph: %v, %v", r, err)
	}
}
