package main

import (
	"testing"
)

// FuzzBenchLists: the CLI's own value parsers (the flag package parses the
// rest) return a list of positive values or an error, never panic.
func FuzzBenchLists(f *testing.F) {
	for _, s := range []string{"64,128,256", "128:4,256:2", "both", " 1 , ,2", "0", "-1:3", "", "a:b:c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if v, err := parseInts("seq", s); err == nil {
			if len(v) == 0 {
				t.Fatal("parseInts: an empty list without an error")
			}
			for _, x := range v {
				if x <= 0 {
					t.Fatalf("parseInts(%q) gave %d", s, x)
				}
			}
		}
		if v, err := parseMemShapes(s); err == nil {
			if len(v) == 0 {
				t.Fatal("parseMemShapes: an empty list without an error")
			}
			for _, m := range v {
				if m.S <= 0 || m.B <= 0 {
					t.Fatalf("parseMemShapes(%q) gave %+v", s, m)
				}
			}
		}
		if v, err := parseCausal(s); err == nil && len(v) == 0 {
			t.Fatalf("parseCausal(%q): no values and no error", s)
		}
	})
}
