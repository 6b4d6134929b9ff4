package units

import "testing"

func TestBytes(t *testing.T) {
	cases := []struct {
		n        int64
		decimals []int
		want     string
	}{
		{0, []int{1, 2, 2}, "0 B"},
		{-5, []int{1, 2, 2}, "-5 B"},
		{1023, []int{1, 2, 2}, "1023 B"},
		{1024, []int{1, 2, 2}, "1.0 KiB"},
		{64 << 10, []int{1, 2, 2}, "64.0 KiB"},
		{1<<20 - 1, []int{1, 2, 2}, "1024.0 KiB"},
		{1 << 20, []int{1, 2, 2}, "1.00 MiB"},
		{729432883, []int{1, 2, 2}, "695.64 MiB"},
		{1<<30 - 1, []int{1, 1, 2}, "1024.0 MiB"},
		{4209067950, []int{1, 2, 2}, "3.92 GiB"},
		{5 << 40, []int{1, 2, 2}, "5120.00 GiB"}, // no TiB listed: GiB takes the rest
		{5 << 40, []int{2, 2, 2, 2}, "5.00 TiB"},
		{5 << 50, []int{2, 2, 2, 2}, "5120.00 TiB"},
		{1536, []int{2}, "1.50 KiB"},
		{3 << 20, []int{2}, "3072.00 KiB"},
		{3 << 20, nil, "3145728 B"},
		{3 << 20, []int{0, 3, 0, 0, 9}, "3.000 MiB"},
	}
	for _, c := range cases {
		if got := Bytes(c.n, c.decimals...); got != c.want {
			t.Errorf("Bytes(%d, %v) = %q, want %q", c.n, c.decimals, got, c.want)
		}
	}
}
