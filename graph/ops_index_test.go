package graph

import "testing"

// TestScatterCombine gives each ScatterElements reduction's value by hand,
// for float and int64 data.
func TestScatterCombine(t *testing.T) {
	for _, c := range []struct {
		red  string
		want float64
	}{{"none", 3}, {"add", 5}, {"mul", 6}, {"max", 3}, {"min", 2}} {
		if got := scatterCombine(c.red, 2.0, 3.0); got != c.want {
			t.Errorf("float %s: %v, want %v", c.red, got, c.want)
		}
		if got := scatterCombine(c.red, int64(2), int64(3)); got != int64(c.want) {
			t.Errorf("int64 %s: %v, want %v", c.red, got, c.want)
		}
	}
}
