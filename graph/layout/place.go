package layout

// placeX gives each node its horizontal centre: rows packed left to right,
// then moved toward the mean position of their neighbours above, below,
// and both, a fixed number of times. Each move keeps the row's order and
// gaps and is the least-squares best such placement (pool adjacent
// violators), so long edges straighten without boxes overlapping.
func (l *layers) placeX(sep float64) {
	gap := func(a, b int) float64 {
		s := sep
		if a >= l.real || b >= l.real {
			s = sep / 2
		}
		return (l.w[a]+l.w[b])/2 + s
	}
	for _, row := range l.rows {
		for i, v := range row {
			if i == 0 {
				l.x[v] = l.w[v] / 2
			} else {
				l.x[v] = l.x[row[i-1]] + gap(row[i-1], v)
			}
		}
	}
	var want, off, wt []float64
	fit := func(row []int, nbrs ...[][]int) {
		want, off, wt = want[:0], off[:0], wt[:0]
		for i, v := range row {
			s, k := 0.0, 0
			for _, ns := range nbrs {
				for _, u := range ns[v] {
					s += l.x[u]
					k++
				}
			}
			o := 0.0
			if i > 0 {
				o = off[i-1] + gap(row[i-1], v)
			}
			off = append(off, o)
			if k == 0 {
				want, wt = append(want, l.x[v]-o), append(wt, 0.01) // no pull: stay, weakly
				continue
			}
			want, wt = append(want, s/float64(k)-o), append(wt, float64(k))
		}
		y := isotonic(want, wt)
		for i, v := range row {
			l.x[v] = y[i] + off[i]
		}
	}
	for range 4 {
		for r := 1; r < len(l.rows); r++ {
			fit(l.rows[r], l.up)
		}
		for r := len(l.rows) - 2; r >= 0; r-- {
			fit(l.rows[r], l.down)
		}
	}
	for _, row := range l.rows {
		fit(row, l.up, l.down)
	}
	left := 0.0
	for v := range l.x {
		if v == 0 || l.x[v]-l.w[v]/2 < left {
			left = l.x[v] - l.w[v]/2
		}
	}
	for v := range l.x {
		l.x[v] -= left
	}
}

// isotonic returns the non-decreasing sequence closest to want in weighted
// least squares (pool adjacent violators).
func isotonic(want, wt []float64) []float64 {
	type block struct {
		sum, w float64
		n      int
	}
	var st []block
	for i, t := range want {
		b := block{t * wt[i], wt[i], 1}
		for len(st) > 0 && st[len(st)-1].sum/st[len(st)-1].w >= b.sum/b.w {
			p := st[len(st)-1]
			st = st[:len(st)-1]
			b = block{p.sum + b.sum, p.w + b.w, p.n + b.n}
		}
		st = append(st, b)
	}
	out := make([]float64, 0, len(want))
	for _, b := range st {
		m := b.sum / b.w
		for range b.n {
			out = append(out, m)
		}
	}
	return out
}

// placeY puts each rank's centre line below the one above, a rank's height
// being that of its tallest box.
func (l *layers) placeY(rankSep float64) []float64 {
	l.rankH = make([]float64, len(l.rows))
	for v, r := range l.rank {
		l.rankH[r] = max(l.rankH[r], l.h[v])
	}
	ys := make([]float64, len(l.rows))
	for r := range ys {
		if r == 0 {
			ys[r] = l.rankH[0] / 2
			continue
		}
		ys[r] = ys[r-1] + l.rankH[r-1]/2 + rankSep + l.rankH[r]/2
	}
	return ys
}
