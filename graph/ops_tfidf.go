package graph

import (
	"fmt"
	"slices"
)

// TfIdfVectorizer (ONNX opset 9, integer input): each row of X is scanned
// for the n-grams of a pool given as attributes, contiguous or with up to
// max_skip_count elements skipped between items, and each pool n-gram's
// count (TF), weight where it occurs (IDF), or count × weight (TFIDF) is
// written to its output column.

func init() {
	register(&OpSpec{
		Name: "TfIdfVectorizer", Doc: "per row of X, the count (TF), weight (IDF) or both (TFIDF) of each pool n-gram, contiguous or with skips",
		Inputs: []string{"X"}, Outputs: []string{"Y"}, Eval: evalTfIdf,
		Attrs: []AttrSpec{
			{Name: "max_gram_length", Kind: AttrInt, Required: true},
			{Name: "min_gram_length", Kind: AttrInt, Required: true},
			{Name: "max_skip_count", Kind: AttrInt, Required: true},
			{Name: "mode", Kind: AttrString, Required: true, Enum: []string{"TF", "IDF", "TFIDF"}},
			{Name: "ngram_counts", Kind: AttrInts, Required: true},
			{Name: "ngram_indexes", Kind: AttrInts, Required: true},
			{Name: "pool_int64s", Kind: AttrInts, Required: true},
			{Name: "weights", Kind: AttrFloats},
		},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			x := in[0]
			if x.DType != Int64 || (x.Shape.Rank() != 1 && x.Shape.Rank() != 2) {
				return nil, fmt.Errorf("X %v: want int64 [C] or [N, C]", *x)
			}
			p, err := newNgramPool(a)
			if err != nil {
				return nil, err
			}
			if x.Shape.Rank() == 1 {
				return []TensorType{{Float32, Shape{p.width}}}, nil
			}
			return []TensorType{{Float32, Shape{x.Shape[0], p.width}}}, nil
		},
	})
}

// ngramPool indexes the pool: for each n, its n-grams (keyed by their
// items) and the output column of each.
type ngramPool struct {
	column   map[string]int // "n:item,item,..." -> output column
	width    int
	min, max int
	skip     int
}

func ngramKey(items []int64) string { return fmt.Sprint(len(items), items) }

func newNgramPool(a Attrs) (*ngramPool, error) {
	pool, counts, idx := a.IntList("pool_int64s"), a.IntList("ngram_counts"), a.IntList("ngram_indexes")
	p := &ngramPool{column: map[string]int{}, min: int(a.Int("min_gram_length", 0)), max: int(a.Int("max_gram_length", 0)), skip: int(a.Int("max_skip_count", 0))}
	if p.min < 1 || p.max < p.min || p.skip < 0 || len(counts) > p.max {
		return nil, fmt.Errorf("gram lengths %d..%d, skip %d, ngram_counts %v: want 1 ≤ min ≤ max ≥ len(ngram_counts)", p.min, p.max, p.skip, counts)
	}
	k := 0 // the index of the next n-gram in the pool
	for i, start := range counts {
		end := int64(len(pool))
		if i+1 < len(counts) {
			end = counts[i+1]
		}
		n := int64(i + 1)
		if start < 0 || end < start || end > int64(len(pool)) || (end-start)%n != 0 {
			return nil, fmt.Errorf("ngram_counts %v do not split a pool of %d into %d-grams", counts, len(pool), n)
		}
		for s := start; s < end; s += n {
			if k >= len(idx) || idx[k] < 0 {
				return nil, fmt.Errorf("ngram_indexes %v: want a non-negative column for n-gram %d", idx, k)
			}
			p.column[ngramKey(pool[s:s+n])] = int(idx[k])
			k++
		}
	}
	if k != len(idx) {
		return nil, fmt.Errorf("ngram_indexes has %d entries for %d n-grams", len(idx), k)
	}
	if w := a["weights"]; w.Kind == AttrFloats && len(w.Floats) != len(idx) {
		return nil, fmt.Errorf("weights has %d entries for %d n-grams", len(w.Floats), len(idx))
	}
	if len(idx) > 0 {
		p.width = int(slices.Max(idx)) + 1
	}
	return p, nil
}

func evalTfIdf(in []*Tensor, a Attrs, out []*Tensor) error {
	x, y := in[0], out[0]
	p, err := newNgramPool(a)
	if err != nil {
		return err
	}
	rows, cols := 1, x.Shape[x.Shape.Rank()-1]
	if x.Shape.Rank() == 2 {
		rows = x.Shape[0]
	}
	weight := func(col int) float64 { return 1 }
	if w := a["weights"]; w.Kind == AttrFloats {
		byCol := map[int]float64{}
		for k, c := range a.IntList("ngram_indexes") {
			byCol[int(c)] = w.Floats[k]
		}
		weight = func(col int) float64 { return byCol[col] }
	}
	mode := a.String("mode", "TF")
	items := make([]int64, 0, min(p.max, cols)) // an n-gram never outgrows its row
	for r := range rows {
		row := x.I64[r*cols : (r+1)*cols]
		counts := make([]int, p.width)
		for i := range row {
			// Every start and gap; a 1-gram has no gap and is counted once.
			// A gap past the row reaches no second item.
			for gap := 1; gap <= min(p.skip+1, max(cols-1, 1)); gap++ {
				items = items[:0]
				for n := 1; n <= p.max && i+(n-1)*gap < cols; n++ {
					items = append(items, row[i+(n-1)*gap])
					if n < p.min || (n == 1 && gap > 1) {
						continue
					}
					if col, ok := p.column[ngramKey(items)]; ok {
						counts[col]++
					}
				}
			}
		}
		for col, n := range counts {
			var v float64
			switch mode {
			case "TF":
				v = float64(n)
			case "IDF":
				if n > 0 {
					v = weight(col)
				}
			default:
				v = float64(n) * weight(col)
			}
			y.Set(r*p.width+col, v)
		}
	}
	return nil
}

// TfIdfTable is TfIdfVectorizer's pool resolved for a backend that
// computes the op itself: each distinct pool n-gram with the output column
// it counts in (the one evalTfIdf's map holds: a repeated n-gram's last),
// in column order; the weight of each column (0 where no n-gram has it; nil
// without weights, each 1); and the output width, gram lengths and skips.
type TfIdfTable struct {
	Grams              [][]int64
	Column             []int
	Weight             []float64
	Width              int
	Min, Max, MaxSkips int
}

// NewTfIdfTable checks and resolves TfIdfVectorizer's attributes.
func NewTfIdfTable(a Attrs) (*TfIdfTable, error) {
	p, err := newNgramPool(a)
	if err != nil {
		return nil, err
	}
	t := &TfIdfTable{Width: p.width, Min: p.min, Max: p.max, MaxSkips: p.skip}
	pool, counts := a.IntList("pool_int64s"), a.IntList("ngram_counts")
	seen := map[string]bool{}
	for i, start := range counts {
		end := int64(len(pool))
		if i+1 < len(counts) {
			end = counts[i+1]
		}
		n := int64(i + 1)
		for s := start; s < end; s += n {
			key := ngramKey(pool[s : s+n])
			if seen[key] {
				continue
			}
			seen[key] = true
			t.Grams = append(t.Grams, pool[s:s+n])
			t.Column = append(t.Column, p.column[key])
		}
	}
	order := make([]int, len(t.Grams))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int { return t.Column[i] - t.Column[j] })
	grams, cols := make([][]int64, len(order)), make([]int, len(order))
	for k, i := range order {
		grams[k], cols[k] = t.Grams[i], t.Column[i]
	}
	t.Grams, t.Column = grams, cols
	if w := a["weights"]; w.Kind == AttrFloats {
		t.Weight = make([]float64, p.width)
		for k, c := range a.IntList("ngram_indexes") {
			t.Weight[c] = w.Floats[k]
		}
	}
	return t, nil
}
