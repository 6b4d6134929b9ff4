package layout

import (
	"cmp"
	"slices"
)

// layers holds the graph the ordering and placement work on: the nodes
// followed by the dummies that carry long edges through the ranks they
// cross, so that every edge of it joins adjacent ranks.
type layers struct {
	real      int       // nodes [0,real) are the caller's, the rest dummies
	w, h      []float64 // box sizes (dummies: 0×0)
	rank      []int
	rows      [][]int // rows[r]: the nodes of rank r, left to right
	pos       []int   // a node's index in its row
	up, down  [][]int // neighbours in the rank above and below (with repeats)
	x         []float64
	rankH     []float64
	chains    [][]int // chains[e]: edge e's dummies, top to bottom
	crossings int
}

// newLayers adds the dummies and makes the first order: nodes in
// topological order (depth first), each followed in the rows below by the
// dummies of its long edges, so that a chain starts near its source.
func newLayers(nodes []Node, edges []Edge, rank, order []int, out [][]int) *layers {
	l := &layers{real: len(nodes), chains: make([][]int, len(edges))}
	top := 0
	for _, r := range rank {
		top = max(top, r)
	}
	l.rows = make([][]int, top+1)
	add := func(w, h float64, r int) int {
		l.w, l.h, l.rank = append(l.w, w), append(l.h, h), append(l.rank, r)
		l.up, l.down = append(l.up, nil), append(l.down, nil)
		return len(l.w) - 1
	}
	for v, nd := range nodes {
		add(nd.W, nd.H, rank[v])
	}
	link := func(a, b int) {
		l.down[a] = append(l.down[a], b)
		l.up[b] = append(l.up[b], a)
	}
	for _, v := range order {
		l.rows[rank[v]] = append(l.rows[rank[v]], v)
	}
	for _, v := range order {
		// One chain of dummies per node, as deep as its farthest edge: edges
		// from one source share it and leave it above their destinations.
		// (A param read in the forward, the backward and its update is one
		// line down the picture, not three.)
		far := rank[v]
		for _, i := range out[v] {
			far = max(far, rank[edges[i].Dst])
		}
		var chain []int
		prev := v
		for r := rank[v] + 1; r < far; r++ {
			d := add(0, 0, r)
			l.rows[r] = append(l.rows[r], d)
			chain = append(chain, d)
			link(prev, d)
			prev = d
		}
		for _, i := range out[v] {
			e := edges[i]
			l.chains[i] = chain[:rank[e.Dst]-rank[v]-1]
			last := v
			if len(l.chains[i]) > 0 {
				last = l.chains[i][len(l.chains[i])-1]
			}
			link(last, e.Dst)
		}
	}
	l.pos = make([]int, len(l.w))
	l.x = make([]float64, len(l.w))
	l.renumber()
	return l
}

func (l *layers) renumber() {
	for _, row := range l.rows {
		for i, v := range row {
			l.pos[v] = i
		}
	}
}

// orderSweeps reorders each row by the barycenter of its neighbours'
// positions in the row above (a downward sweep), then below (upward), sweeps
// times, and keeps the order with the fewest crossings seen. It returns that
// count.
func (l *layers) orderSweeps(sweeps int) int {
	best := l.countCrossings()
	saved := l.snapshot()
	type item struct {
		key float64
		pos int
		v   int
	}
	var items []item
	sortRow := func(r int, nbrs [][]int) {
		row := l.rows[r]
		items = items[:0]
		for _, v := range row {
			k := float64(l.pos[v])
			if ns := nbrs[v]; len(ns) > 0 {
				s := 0
				for _, u := range ns {
					s += l.pos[u]
				}
				k = float64(s) / float64(len(ns))
			}
			items = append(items, item{k, l.pos[v], v})
		}
		// Ties keep their order: the sort is stable by the old position.
		slices.SortFunc(items, func(a, b item) int {
			if c := cmp.Compare(a.key, b.key); c != 0 {
				return c
			}
			return cmp.Compare(a.pos, b.pos)
		})
		for i, it := range items {
			row[i] = it.v
			l.pos[it.v] = i
		}
	}
	for range sweeps {
		if best == 0 {
			break
		}
		for r := 1; r < len(l.rows); r++ {
			sortRow(r, l.up)
		}
		for r := len(l.rows) - 2; r >= 0; r-- {
			sortRow(r, l.down)
		}
		if c := l.countCrossings(); c < best {
			best, saved = c, l.snapshot()
		}
	}
	for r, row := range saved {
		copy(l.rows[r], row)
	}
	l.renumber()
	return best
}

func (l *layers) snapshot() [][]int {
	s := make([][]int, len(l.rows))
	for r, row := range l.rows {
		s[r] = slices.Clone(row)
	}
	return s
}

// countCrossings counts the pairs of edges that cross between adjacent
// rows: the inversions of the lower ends, edges sorted by their upper ends,
// counted with a Fenwick tree (O(E log V)).
func (l *layers) countCrossings() int {
	total := 0
	var ends []int
	var tree []int
	for r := 0; r+1 < len(l.rows); r++ {
		ends = ends[:0]
		for _, u := range l.rows[r] { // the row order is the upper ends' order
			start := len(ends)
			for _, v := range l.down[u] {
				ends = append(ends, l.pos[v])
			}
			slices.Sort(ends[start:])
		}
		n := len(l.rows[r+1])
		tree = slices.Grow(tree[:0], n+1)[:n+1]
		clear(tree)
		for seen, p := range ends {
			// edges already seen whose lower end is right of p cross this one
			le := 0
			for i := p + 1; i > 0; i -= i & -i {
				le += tree[i]
			}
			total += seen - le
			for i := p + 1; i <= n; i += i & -i {
				tree[i]++
			}
		}
	}
	return total
}
