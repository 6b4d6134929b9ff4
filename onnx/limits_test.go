package onnx

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// foldChain is ConstantOfShape(shape, fill) followed by n nodes of op, each
// reading the previous result (and, for a binary op, the first constant): a
// few bytes per node, shape's product of elements per fold.
func foldChain(shape []int64, fill float32, op string, n int) *onnxpb.Model {
	nodes := []*onnxpb.Node{nd("ConstantOfShape", []string{"s"}, []string{"c0"},
		aTensor("value", onnxpb.NewFloat32("", []int64{1}, []float32{fill})))}
	for i := range n {
		in := []string{"c" + strconv.Itoa(i)}
		if op == "Add" || op == "Mul" {
			in = append(in, "c0")
		}
		nodes = append(nodes, nd(op, in, []string{"c" + strconv.Itoa(i+1)}))
	}
	return modelOf(13, nil, []*onnxpb.Tensor{onnxpb.NewInt64("s", []int64{int64(len(shape))}, shape)},
		[]string{"c" + strconv.Itoa(n)}, nodes...)
}

// hostileFolds are models of a few hundred bytes whose constant folding,
// unbounded, would create from millions to billions of elements.
func hostileFolds() []*onnxpb.Model {
	i64 := func(name string, v ...int64) *onnxpb.Tensor {
		return onnxpb.NewInt64(name, []int64{int64(len(v))}, v)
	}
	scalar := func(name string, v int64) *onnxpb.Tensor { return onnxpb.NewInt64(name, nil, []int64{v}) }
	concat := []*onnxpb.Node{nd("ConstantOfShape", []string{"s"}, []string{"c"})}
	var many []string
	for range 64 {
		many = append(many, "c")
	}
	concat = append(concat, nd("Concat", many, []string{"y"}, aInt("axis", 0)))
	return []*onnxpb.Model{
		// One fold of 4 Mi elements, then 64 more of the same size.
		foldChain([]int64{2048, 2048}, 1, "Add", 64),
		// Within the floor each, past it together: folding stops, Adds run at run time.
		foldChain([]int64{1024, 1024}, 1, "Add", 64),
		foldChain([]int64{1024, 1024}, 1, "Sqrt", 64),
		// 64 copies of a 1 Mi constant.
		modelOf(13, nil, []*onnxpb.Tensor{i64("s", 1024, 1024)}, []string{"y"}, concat...),
		// A scalar broadcast to 2^40 elements.
		modelOf(13, nil, []*onnxpb.Tensor{i64("x", 1), i64("s", 1<<20, 1<<20)}, []string{"y"},
			nd("Expand", []string{"x", "s"}, []string{"y"})),
		// Three small vectors that broadcast to 2^36 elements.
		modelOf(13, nil, []*onnxpb.Tensor{i64("a", 4096, 1, 1), i64("b", 1, 4096, 1), i64("c", 1, 1, 4096)}, []string{"y"},
			nd("ConstantOfShape", []string{"a"}, []string{"ca"}, aTensor("value", onnxpb.NewBool("", []int64{1}, []bool{true}))),
			nd("ConstantOfShape", []string{"b"}, []string{"cb"}),
			nd("ConstantOfShape", []string{"c"}, []string{"cc"}),
			nd("Where", []string{"ca", "cb", "cc"}, []string{"y"})),
		// A range of 10^12 integers.
		modelOf(13, nil, []*onnxpb.Tensor{scalar("a", 0), scalar("b", 1e12), scalar("d", 1)}, []string{"y"},
			nd("Range", []string{"a", "b", "d"}, []string{"y"})),
	}
}

// TestFoldBudgetRefuses: an op that can only be folded, asked to fold past the
// budget, is refused with the node, the limit and how to raise it.
func TestFoldBudgetRefuses(t *testing.T) {
	for _, m := range []*onnxpb.Model{hostileFolds()[0], hostileFolds()[len(hostileFolds())-1]} {
		b := onnxpb.Encode(m)
		_, err := ImportBytes(b)
		if err == nil {
			t.Fatalf("a %d-byte model folding millions of elements imported", len(b))
		}
		n := m.Graph.Node[0]
		for _, want := range []string{fmt.Sprintf("node %q", n.Name), "limit of 1048576", "Options.MaxFoldElems"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
	}
}

// TestFoldBudgetRaised: the same ConstantOfShape imports when the caller
// raises the limit, and the folded constant holds what ONNX defines.
func TestFoldBudgetRaised(t *testing.T) {
	b := onnxpb.Encode(foldChain([]int64{2048, 1024}, 1.5, "Add", 0))
	if _, err := ImportBytes(b); err == nil {
		t.Fatal("2 Mi elements folded within the default budget of a small model")
	}
	g, err := ImportBytesWith(b, Options{MaxFoldElems: 2048 * 1024})
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Consts) != 1 {
		t.Fatalf("want the folded output as one const, got %d", len(g.Consts))
	}
	c, err := g.Consts[0].Init.Materialize(g.Consts[0].Type)
	if err != nil {
		t.Fatal(err)
	}
	if c.Len() != 2048*1024 || c.At(0) != 1.5 || c.At(c.Len()-1) != 1.5 {
		t.Fatalf("folded constant: %d elements, first %v, last %v", c.Len(), c.At(0), c.At(c.Len()-1))
	}
}

// TestFoldBudgetFallsBack: ops flashgraph can run are left to run time once
// the budget is spent, and the graph still computes what ONNX defines.
func TestFoldBudgetFallsBack(t *testing.T) {
	const adds = 8
	b := onnxpb.Encode(foldChain([]int64{64, 64}, 1.5, "Add", adds))
	// ConstantOfShape makes one 64×64 result, each Add reads two and makes one:
	// a budget of four results folds two Adds (an elementwise fold is refused
	// when its inputs alone exceed what is left).
	g, err := ImportBytesWith(b, Options{MaxFoldElems: 4 * 64 * 64})
	if err != nil {
		t.Fatal(err)
	}
	run := 0
	for _, n := range g.Nodes {
		if n.Op == "Add" {
			run++
		}
	}
	if run != adds-2 {
		t.Fatalf("%d Adds left to run time, want %d", run, adds-2)
	}
	out := runGraph(t, g, nil)
	y := out[g.Outputs[0].Name]
	for k := range y.Len() {
		if y.At(k) != 1.5*(adds+1) {
			t.Fatalf("element %d = %v, want %v", k, y.At(k), 1.5*(adds+1))
		}
	}
}

// TestFoldBudgetScales: the default budget grows with the model's bytes.
func TestFoldBudgetScales(t *testing.T) {
	m := foldChain([]int64{2048, 1024}, 1, "Add", 0)
	// Padding the model to a quarter of a million bytes (a doc string) buys
	// it 8 × 256 Ki = 2 Mi elements.
	m.Graph.DocString = strings.Repeat("x", 256*1024)
	if _, err := ImportBytes(onnxpb.Encode(m)); err != nil {
		t.Fatalf("a 256 KiB model cannot fold 2 Mi elements: %v", err)
	}
}

// TestImportShapeOverflow: a declared input whose element count overflows is
// refused, not folded by Size into a wrapped number.
func TestImportShapeOverflow(t *testing.T) {
	x := []*onnxpb.ValueInfo{vi("x", onnxpb.Float, math.MaxInt32, math.MaxInt32, math.MaxInt32)}
	_, err := ImportBytes(onnxpb.Encode(modelOf(13, x, nil, []string{"n"}, nd("Size", []string{"x"}, []string{"n"}))))
	if err == nil || !strings.Contains(err.Error(), `graph input "x"`) {
		t.Fatalf("want an error naming the input, got %v", err)
	}
}

// TestFoldMissingInput: a foldable op without a required input is an error
// naming the node (FuzzImport found Reshape with one input).
func TestFoldMissingInput(t *testing.T) {
	inits := []*onnxpb.Tensor{onnxpb.NewInt64("s", []int64{2}, []int64{2, 2})}
	for _, n := range []*onnxpb.Node{
		nd("Reshape", []string{"s"}, []string{"y"}),
		nd("Add", []string{"s", ""}, []string{"y"}),
		nd("Range", []string{"s"}, []string{"y"}),
		nd("Identity", nil, []string{"y"}),
	} {
		_, err := ImportBytes(onnxpb.Encode(modelOf(13, nil, inits, []string{"y"}, n)))
		if err == nil || !strings.Contains(err.Error(), "required but omitted") || !strings.Contains(err.Error(), n.Name) {
			t.Errorf("%s: want an omitted-input error naming the node, got %v", n.OpType, err)
		}
	}
}

// maxImportTime is the throughput floor's bound on one FuzzImport execution.
const maxImportTime = 100 * time.Millisecond

// TestImportCorpusTime holds every FuzzImport input (seeds and the checked-in
// corpus, plus the files in FLASHGRAPH_IMPORT_CORPUS when set) to 100 ms. Each input runs several times and its fastest run is its
// cost: a shared machine adds scheduling noise, never speed. The slowest input
// is logged, so `go test -v -run ImportCorpusTime ./onnx` shows the margin.
func TestImportCorpusTime(t *testing.T) {
	inputs := map[string][]byte{}
	for i, b := range importSeeds(t) {
		inputs["seed#"+strconv.Itoa(i)] = b
	}
	files, _ := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzImport", "*"))
	if dir := os.Getenv("FLASHGRAPH_IMPORT_CORPUS"); dir != "" {
		// Also a corpus the fuzzer grew, e.g. $(go env GOCACHE)/fuzz/<module>/onnx/FuzzImport.
		more, _ := filepath.Glob(filepath.Join(dir, "*"))
		files = append(files, more...)
	}
	for _, p := range files {
		b, err := readCorpusFile(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		inputs[filepath.Base(p)] = b
	}
	const repeats = 5
	worst, worstName := time.Duration(0), ""
	for name, b := range inputs {
		best := time.Duration(math.MaxInt64)
		for range repeats {
			start := time.Now()
			if err := importChecked(b); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			best = min(best, time.Since(start))
		}
		if best > maxImportTime {
			t.Errorf("%s (%d bytes): import takes %v, over %v", name, len(b), best, maxImportTime)
		}
		if best > worst {
			worst, worstName = best, name
		}
	}
	t.Logf("%d inputs; slowest %s at %v (bound %v)", len(inputs), worstName, worst, maxImportTime)
}

// readCorpusFile reads a one-value []byte entry of Go's fuzz corpus format.
func readCorpusFile(path string) ([]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.SplitN(strings.TrimSpace(string(raw)), "\n", 2)
	if len(lines) != 2 || lines[0] != "go test fuzz v1" {
		return nil, fmt.Errorf("not a fuzz corpus file")
	}
	v := strings.TrimSpace(lines[1])
	if !strings.HasPrefix(v, "[]byte(") || !strings.HasSuffix(v, ")") {
		return nil, fmt.Errorf("want one []byte value, got %.40q", v)
	}
	s, err := strconv.Unquote(v[len("[]byte(") : len(v)-1])
	if err != nil {
		return nil, err
	}
	return []byte(s), nil
}

// TestFoldMemoryCaps: FoldMemory caps the budget however it was chosen (here
// an explicit MaxFoldElems of 2^40): a ConstantOfShape of [100000,100000], a
// Range of 10^12 are refused before they allocate, naming the node, what the
// fold would have made and the memory that bounds it; an Expand to 2^40
// elements, which flashgraph can run, is left to run time; a fold within
// the memory still imports.
func TestFoldMemoryCaps(t *testing.T) {
	huge := foldChain([]int64{100000, 100000}, 1, "Add", 0)
	models := []*onnxpb.Model{huge, hostileFolds()[len(hostileFolds())-1]}
	wants := []string{"[100000 100000] result of 1e+10 elements", "a range of 1e+12 elements"}
	opts := Options{MaxFoldElems: 1 << 40, FoldMemory: 1 << 30}
	for i, m := range models {
		_, err := ImportBytesWith(onnxpb.Encode(m), opts)
		if err == nil {
			t.Fatalf("model %d: folded past 1 GiB of memory", i)
		}
		n := m.Graph.Node[0]
		for _, want := range []string{fmt.Sprintf("node %q", n.Name), n.OpType, wants[i], "1.00 GiB of memory available for folding",
			fmt.Sprintf("limit of %d", (1<<30)/FoldBytesPerElem), "refused before allocating"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("model %d: error %q does not say %q", i, err, want)
			}
		}
	}
	g, err := ImportBytesWith(onnxpb.Encode(hostileFolds()[4]), opts)
	if err != nil || len(g.Nodes) != 1 || g.Nodes[0].Op != "Expand" {
		t.Errorf("an Expand to 2^40 elements: %v, want it left to run time", err)
	}
	small := onnxpb.Encode(foldChain([]int64{1024, 1024}, 1, "Add", 0))
	if _, err := ImportBytesWith(small, Options{FoldMemory: 64 << 20}); err != nil {
		t.Errorf("1 Mi elements within 64 MiB: %v", err)
	}
	if _, err := ImportBytesWith(small, Options{FoldMemory: 16 << 20}); err == nil || !strings.Contains(err.Error(), "16.00 MiB of memory") {
		t.Errorf("1 Mi elements (24 MiB) within 16 MiB: %v", err)
	}
}
