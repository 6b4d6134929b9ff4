package graph

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func f64Tensor(shape Shape, v ...float64) *Tensor {
	t := NewTensor(Float64, shape)
	copy(t.F64, v)
	return t
}

func i64Tensor(shape Shape, v ...int64) *Tensor {
	t := NewTensor(Int64, shape)
	copy(t.I64, v)
	return t
}

// TestCumSumForms works each of CumSum's four forms out by hand on one row
// and on a negative axis of a matrix, and checks int64 sums stay exact past
// 2^53 (where a float64 sum would round).
func TestCumSumForms(t *testing.T) {
	x := f64Tensor(Shape{4}, 1, 2, 3, 4)
	for _, c := range []struct {
		excl, rev int64
		want      []float64
	}{
		{0, 0, []float64{1, 3, 6, 10}},
		{1, 0, []float64{0, 1, 3, 6}},
		{0, 1, []float64{10, 9, 7, 4}},
		{1, 1, []float64{9, 7, 4, 0}},
	} {
		out, err := Eval("CumSum", Attrs{"exclusive": Int(c.excl), "reverse": Int(c.rev)}, x, i64Tensor(Shape{}, 0))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(out[0].F64, c.want) {
			t.Errorf("exclusive=%d reverse=%d: %v, want %v", c.excl, c.rev, out[0].F64, c.want)
		}
	}
	m := f64Tensor(Shape{2, 3}, 1, 2, 3, 4, 5, 6)
	out, err := Eval("CumSum", nil, m, i64Tensor(Shape{1}, -1))
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{1, 3, 6, 4, 9, 15}; !slices.Equal(out[0].F64, want) {
		t.Errorf("axis -1: %v, want %v", out[0].F64, want)
	}
	big := i64Tensor(Shape{2}, 1<<53, 1)
	out, err = Eval("CumSum", nil, big, i64Tensor(Shape{}, 0))
	if err != nil {
		t.Fatal(err)
	}
	if out[0].I64[1] != 1<<53+1 {
		t.Errorf("int64 sum %d, want %d", out[0].I64[1], int64(1<<53+1))
	}
	if _, err := Eval("CumSum", nil, m, i64Tensor(Shape{}, 2)); err == nil || !strings.Contains(err.Error(), "axis") {
		t.Errorf("axis 2 of a matrix: %v, want an axis error", err)
	}
}

// TestGatherScatterND checks GatherND with batch_dims and negative
// coordinates, ScatterND's reductions on a repeated slice, and that an
// out-of-range coordinate is an error.
func TestGatherScatterND(t *testing.T) {
	data := f64Tensor(Shape{2, 2, 2}, 0, 1, 2, 3, 4, 5, 6, 7)
	// batch_dims 1: row 1 of batch 0, row -2 (= 0) of batch 1.
	out, err := Eval("GatherND", Attrs{"batch_dims": Int(1)}, data, i64Tensor(Shape{2, 1}, 1, -2))
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{2, 3, 4, 5}; !slices.Equal(out[0].F64, want) || !out[0].Shape.Equal(Shape{2, 2}) {
		t.Errorf("GatherND batch_dims 1: %v%v, want [2,2]%v", out[0].Shape, out[0].F64, want)
	}
	out, err = Eval("GatherND", nil, data, i64Tensor(Shape{2, 3}, 1, 0, 1, 0, 1, 0))
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{5, 2}; !slices.Equal(out[0].F64, want) {
		t.Errorf("GatherND full coordinates: %v, want %v", out[0].F64, want)
	}
	if _, err := Eval("GatherND", nil, data, i64Tensor(Shape{1, 1}, 2)); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("index 2 of an axis of 2: %v, want out of range", err)
	}
	m := f64Tensor(Shape{3, 2}, 1, 1, 2, 2, 3, 3)
	idx := i64Tensor(Shape{2, 1}, 1, -2) // row 1 twice
	upd := f64Tensor(Shape{2, 2}, 5, 6, 7, 8)
	for red, want := range map[string][]float64{
		"none": {1, 1, 7, 8, 3, 3},
		"add":  {1, 1, 14, 16, 3, 3},
		"mul":  {1, 1, 70, 96, 3, 3},
		"max":  {1, 1, 7, 8, 3, 3},
		"min":  {1, 1, 2, 2, 3, 3},
	} {
		out, err := Eval("ScatterND", Attrs{"reduction": Str(red)}, m, idx, upd)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(out[0].F64, want) {
			t.Errorf("ScatterND %s: %v, want %v", red, out[0].F64, want)
		}
	}
}

// TestReverseSequenceMaxUnpoolLRNDet gives small cases of the other
// tensor ops by hand.
func TestReverseSequenceMaxUnpoolLRNDet(t *testing.T) {
	// [time 3, batch 2]: batch 0 reverses 3 steps, batch 1 only 2.
	x := f64Tensor(Shape{3, 2}, 0, 10, 1, 11, 2, 12)
	out, err := Eval("ReverseSequence", nil, x, i64Tensor(Shape{2}, 3, 2))
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{2, 11, 1, 10, 0, 12}; !slices.Equal(out[0].F64, want) {
		t.Errorf("ReverseSequence: %v, want %v", out[0].F64, want)
	}
	if _, err := Eval("ReverseSequence", nil, x, i64Tensor(Shape{2}, 4, 0)); err == nil {
		t.Error("ReverseSequence with a length past the time axis: no error")
	}

	// A [1,1,2,2] pooled with 2×2 windows, written back into [1,1,4,4], and
	// into a [1,1,5,5] output_shape at the same multi-indices.
	px, pi := f64Tensor(Shape{1, 1, 2, 2}, 5, 6, 7, 8), i64Tensor(Shape{1, 1, 2, 2}, 5, 7, 13, 15)
	un := Attrs{"kernel_shape": Ints(2, 2), "strides": Ints(2, 2)}
	out, err = Eval("MaxUnpool", un, px, pi)
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{0, 0, 0, 0, 0, 5, 0, 6, 0, 0, 0, 0, 0, 7, 0, 8}; !slices.Equal(out[0].F64, want) {
		t.Errorf("MaxUnpool: %v, want %v", out[0].F64, want)
	}
	out, err = Eval("MaxUnpool", un, px, pi, i64Tensor(Shape{4}, 1, 1, 5, 5))
	if err != nil {
		t.Fatal(err)
	}
	if out[0].F64[6] != 5 || out[0].F64[8] != 6 || out[0].F64[16] != 7 || out[0].F64[18] != 8 {
		t.Errorf("MaxUnpool into 5×5: %v", out[0].F64)
	}

	// LRN size 2 over 3 channels: channel c sums c and c+1 (⌊1/2⌋ = 0 before, ⌈1/2⌉ = 1 after).
	lx := f64Tensor(Shape{1, 3}, 1, 2, 3)
	out, err = Eval("LRN", Attrs{"size": Int(2), "alpha": Float(2), "beta": Float(1), "bias": Float(1)}, lx)
	if err != nil {
		t.Fatal(err)
	}
	for c, s := range []float64{1 + 4, 4 + 9, 9} {
		if want := lx.F64[c] / (1 + 2.0/2*s); math.Abs(out[0].F64[c]-want) > 1e-15 {
			t.Errorf("LRN channel %d: %v, want %v", c, out[0].F64[c], want)
		}
	}

	// det [[0,2,0],[3,4,0],[0,0,1]] = −6 (a row swap), a singular one, and a 3×3.
	dx := f64Tensor(Shape{3, 3, 3}, 0, 2, 0, 3, 4, 0, 0, 0, 1, 1, 2, 3, 2, 4, 6, 0, 1, 1, 2, 0, 1, 1, 3, 2, 1, 1, 4)
	out, err = Eval("Det", nil, dx)
	if err != nil {
		t.Fatal(err)
	}
	// The third, [[2,0,1],[1,3,2],[1,1,4]]: 2·(12−2) − 0 + 1·(1−3) = 18.
	for i, want := range []float64{-6, 0, 18} {
		if math.Abs(out[0].F64[i]-want) > 1e-12 {
			t.Errorf("Det[%d] = %v, want %v", i, out[0].F64[i], want)
		}
	}
}

// TestBitShiftInt64 checks BitShift's int64 form, which the graph computes
// on unsigned values: exact past 2^53, 0 from a right shift of 63 or more,
// and a left shift wrapping as a 64-bit shift does.
func TestBitShiftInt64(t *testing.T) {
	x := i64Tensor(Shape{4}, 1<<40+1, 1<<62, 5, 3)
	n := i64Tensor(Shape{4}, 20, 62, 63, 62)
	left, err := Eval("BitShift", Attrs{"direction": Str("LEFT")}, x, n)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{1<<60 + 1<<20, 0, math.MinInt64, -(1 << 62)}; !slices.Equal(left[0].I64, want) {
		t.Errorf("LEFT: %v, want %v", left[0].I64, want)
	}
	right, err := Eval("BitShift", Attrs{"direction": Str("RIGHT")}, x, n)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{1 << 20, 1, 0, 0}; !slices.Equal(right[0].I64, want) {
		t.Errorf("RIGHT: %v, want %v", right[0].I64, want)
	}
	if _, err := Eval("BitShift", Attrs{"direction": Str("UP")}, x, n); err == nil {
		t.Error("direction UP: no error")
	}
}

// TestGridSampleReflect folds points into [lo, hi] by mirroring at the ends,
// an odd number of folds landing from the other end.
func TestGridSampleReflect(t *testing.T) {
	for _, c := range []struct{ v, want float64 }{
		{1.25, 1.25}, {-0.7, -0.3}, {3, 2}, {6.2, 0.2}, {-3.6, 2.4},
	} {
		if got := reflect(c.v, -0.5, 2.5); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("reflect(%v) = %v, want %v", c.v, got, c.want)
		}
	}
	// A 1×1×1×2 image [10, 20]: bilinear at x = 0 (between the two pixel
	// centres with align_corners 0) is their mean; nearest at x = −1 with
	// border padding is the first pixel.
	x := f64Tensor(Shape{1, 1, 1, 2}, 10, 20)
	grid := f64Tensor(Shape{1, 1, 2, 2}, 0, 0, -1, 0)
	out, err := Eval("GridSample", nil, x, grid)
	if err != nil {
		t.Fatal(err)
	}
	if out[0].F64[0] != 15 {
		t.Errorf("bilinear at the centre: %v, want 15", out[0].F64[0])
	}
	out, err = Eval("GridSample", Attrs{"mode": Str("nearest"), "padding_mode": Str("border")}, x, grid)
	if err != nil {
		t.Fatal(err)
	}
	if out[0].F64[1] != 10 {
		t.Errorf("nearest at the left edge: %v, want 10", out[0].F64[1])
	}
}

// TestRoiAlignPixels: a half_pixel ROI over a whole 2×2 image with one
// output bin samples each pixel centre once: avg is the mean, max the
// largest; with output_half_pixel the same ROI samples between pixels.
func TestRoiAlignPixels(t *testing.T) {
	x := f64Tensor(Shape{1, 1, 2, 2}, 1, 2, 3, 4)
	rois := f64Tensor(Shape{1, 4}, 0, 0, 2, 2)
	idx := i64Tensor(Shape{1}, 0)
	for _, c := range []struct {
		attrs Attrs
		want  float64
	}{
		{Attrs{}, 2.5},
		{Attrs{"mode": Str("max")}, 4},
		// Samples at 0.5 and 1.5: the first interpolates all four pixels
		// (2.5), the others are clamped to the last row or column.
		{Attrs{"coordinate_transformation_mode": Str("output_half_pixel")}, (2.5 + 3 + 3.5 + 4) / 4},
	} {
		out, err := Eval("RoiAlign", c.attrs, x, rois, idx)
		if err != nil {
			t.Fatal(err)
		}
		if got := out[0].F64[0]; math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%v: %v, want %v", c.attrs, got, c.want)
		}
	}
	if _, err := Eval("RoiAlign", nil, x, rois, i64Tensor(Shape{1}, 1)); err == nil {
		t.Error("batch index 1 of a batch of 1: no error")
	}
	huge := f64Tensor(Shape{1, 4}, 0, 0, 1e30, math.NaN())
	if _, err := Eval("RoiAlign", nil, x, huge, idx); err == nil || !strings.Contains(err.Error(), "samples per bin") {
		t.Errorf("a region of 1e30 pixels: %v, want a refusal", err)
	}
}

// TestTfIdfModes counts a pool of 1-grams {1, 3} and the 2-gram (1, 2) in
// [1, 5, 2, 1, 2] with one skip allowed: 1 twice, 3 never, (1, 2) once
// contiguous and once across the 5; IDF gives the weight where the count
// is positive, TFIDF count × weight.
func TestTfIdfModes(t *testing.T) {
	x := i64Tensor(Shape{5}, 1, 5, 2, 1, 2)
	base := Attrs{
		"min_gram_length": Int(1), "max_gram_length": Int(2), "max_skip_count": Int(1),
		"ngram_counts": Ints(0, 2), "ngram_indexes": Ints(0, 1, 2), "pool_int64s": Ints(1, 3, 1, 2),
		"weights": Floats(0.5, 2, 3),
	}
	for mode, want := range map[string][]float32{"TF": {2, 0, 2}, "IDF": {0.5, 0, 3}, "TFIDF": {1, 0, 6}} {
		a := base.Clone()
		a["mode"] = Str(mode)
		out, err := Eval("TfIdfVectorizer", a, x)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(out[0].F32, want) {
			t.Errorf("%s: %v, want %v", mode, out[0].F32, want)
		}
	}
	a := base.Clone()
	a["mode"], a["max_skip_count"] = Str("TF"), Int(0)
	out, err := Eval("TfIdfVectorizer", a, x)
	if err != nil {
		t.Fatal(err)
	}
	if want := []float32{2, 0, 1}; !slices.Equal(out[0].F32, want) {
		t.Errorf("no skips: %v, want %v", out[0].F32, want)
	}
}

// TestTfIdfHugeBounds: gram lengths and skips far past the row cost no more
// than the row allows (no allocation or loop sized by the attribute).
func TestTfIdfHugeBounds(t *testing.T) {
	a := Attrs{
		"mode": Str("TF"), "min_gram_length": Int(1), "max_gram_length": Int(1 << 40), "max_skip_count": Int(1 << 40),
		"ngram_counts": Ints(0), "ngram_indexes": Ints(0), "pool_int64s": Ints(5),
	}
	out, err := Eval("TfIdfVectorizer", a, i64Tensor(Shape{3}, 5, 1, 5))
	if err != nil {
		t.Fatal(err)
	}
	if out[0].F32[0] != 2 {
		t.Errorf("count of 5: %v, want 2", out[0].F32[0])
	}
}
