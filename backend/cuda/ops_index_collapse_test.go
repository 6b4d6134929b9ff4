package cuda

import "testing"

// TestCollapseGatherDims checks the merged dims against a direct walk: every
// index position must reach the same data offset through the merged dims as
// through the original ones (the axis coordinate replaced by a fixed value).
func TestCollapseGatherDims(t *testing.T) {
	strides := func(d []int64) []int64 {
		s := make([]int64, len(d))
		acc := int64(1)
		for i := len(d) - 1; i >= 0; i-- {
			s[i] = acc
			acc *= d[i]
		}
		return s
	}
	offset := func(o int64, id, xs []int64, ax int, c int64) int64 {
		off := int64(0)
		for k := len(id) - 1; k >= 0; k-- {
			v := o % id[k]
			o /= id[k]
			if k == ax {
				v = c
			}
			off += v * xs[k]
		}
		return off
	}
	for _, tc := range []struct {
		id, xd   []int64
		ax, rank int
	}{
		{[]int64{2, 1, 3, 2, 2, 2, 2}, []int64{2, 4, 3, 2, 2, 2, 2}, 1, 3}, // NLL over [N, C, d1..d5]
		{[]int64{3, 2}, []int64{3, 5}, 1, 2},
		{[]int64{4, 3, 2}, []int64{4, 3, 2}, 0, 2},
		{[]int64{2, 2, 3}, []int64{2, 3, 3}, 2, 3}, // dim 1 differs: nothing before the axis merges
		{[]int64{2, 3, 4, 5}, []int64{2, 3, 4, 5}, 3, 2},
	} {
		xs := strides(tc.xd)
		dims, st, ax := collapseGatherDims(tc.id, tc.xd, xs, tc.ax)
		if len(dims) != tc.rank || ax < 0 || dims[ax] != tc.id[tc.ax] {
			t.Errorf("%v/%v axis %d: merged to %v (axis %d), want rank %d", tc.id, tc.xd, tc.ax, dims, ax, tc.rank)
			continue
		}
		n := int64(1)
		for _, d := range tc.id {
			n *= d
		}
		m := int64(1)
		for _, d := range dims {
			m *= d
		}
		if m != n {
			t.Errorf("%v: merged dims %v hold %d elements, want %d", tc.id, dims, m, n)
		}
		for o := int64(0); o < n; o++ {
			c := o % tc.xd[tc.ax]
			if got, want := offset(o, dims, st, ax, c), offset(o, tc.id, xs, tc.ax, c); got != want {
				t.Fatalf("%v/%v axis %d: element %d at %d through %v/%v, want %d", tc.id, tc.xd, tc.ax, o, got, dims, st, want)
			}
		}
	}
}
