package main

import (
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/bench"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx"
	"github.com/flashgraph/flashgraph/train"
)

// Real inputs and outputs for run, and -bind for run and compile: tensors
// come from safetensors files, or from ONNX test data sets (a folder
// test_data_set_N of input_K.pb and output_K.pb, one serialized TensorProto
// each, as the ONNX model zoo and backend tests ship them).

// maxTensorFileBytes bounds a tensor file read into memory, so that a bad
// path (a disk image) is an error rather than an out-of-memory crash.
const maxTensorFileBytes = 8 << 30

// readFileBounded reads a file of at most maxTensorFileBytes.
func readFileBounded(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		return nil, fmt.Errorf("%s is a folder, not a tensor file", path)
	}
	if st.Size() > maxTensorFileBytes {
		return nil, fmt.Errorf("%s: %s is over the %s a tensor file may have", path, trainBytes(st.Size()), trainBytes(maxTensorFileBytes))
	}
	return os.ReadFile(path)
}

// readSafetensors reads a safetensors file's tensors.
func readSafetensors(path string) (map[string]*graph.Tensor, error) {
	data, err := readFileBounded(path)
	if err != nil {
		return nil, err
	}
	ts, err := checkpoint.ReadSafetensors(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ts.Tensors, nil
}

// writeSafetensors writes tensors to path atomically.
func writeSafetensors(path string, tensors map[string]*graph.Tensor, meta map[string]string) error {
	return checkpoint.WriteFileAtomic(path, func(w io.Writer) error {
		return checkpoint.WriteSafetensors(w, &checkpoint.Tensors{Tensors: tensors, Metadata: meta})
	})
}

// readTensorProtoFile reads one .pb TensorProto file.
func readTensorProtoFile(path string) (string, *graph.Tensor, error) {
	data, err := readFileBounded(path)
	if err != nil {
		return "", nil, err
	}
	name, t, err := onnx.ReadTensorProto(data)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", path, err)
	}
	return name, t, nil
}

// readTensorFile reads the tensor for name from path: a .pb TensorProto, or
// a safetensors file holding a tensor called name (or only one tensor).
func readTensorFile(path, name string) (*graph.Tensor, error) {
	if strings.EqualFold(filepath.Ext(path), ".pb") {
		_, t, err := readTensorProtoFile(path)
		return t, err
	}
	return readSafetensorsTensor(path, name)
}

// readSafetensorsTensor reads the tensor for name from a safetensors file:
// the one called name, or the file's only tensor. It reads -bind's tensors
// for run and compile (through readTensorFile) and for train.
func readSafetensorsTensor(path, name string) (*graph.Tensor, error) {
	ts, err := readSafetensors(path)
	if err != nil {
		return nil, err
	}
	if t, ok := ts[name]; ok {
		return t, nil
	}
	if len(ts) == 1 {
		for _, t := range ts {
			return t, nil
		}
	}
	have := "it has none"
	if len(ts) > 0 {
		have = "it has " + strings.Join(slices.Sorted(maps.Keys(ts)), ", ")
	}
	return nil, fmt.Errorf("%s has no tensor called %s (%s)", path, name, have)
}

// testDataFiles lists a test data set's files of kind (input or output),
// ordered by their number: input_0.pb, input_1.pb, ..., input_10.pb.
func testDataFiles(dir, kind string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	re := regexp.MustCompile(`^` + kind + `_(\d+)\.pb$`)
	type numbered struct {
		n    int
		path string
	}
	var fs []numbered
	for _, e := range ents {
		m := re.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		n, err := strconv.Atoi(m[1])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		fs = append(fs, numbered{n, filepath.Join(dir, e.Name())})
	}
	sort.Slice(fs, func(i, j int) bool { return fs[i].n < fs[j].n })
	out := make([]string, len(fs))
	for i, f := range fs {
		if f.n != i {
			return nil, fmt.Errorf("%s: %s_%d.pb is missing (the files are numbered from 0 without gaps)", dir, kind, i)
		}
		out[i] = f.path
	}
	return out, nil
}

// readTestData reads a test data set's tensors of kind, naming each by the
// name it carries, or, for one without a name, by the position's name in
// order (the graph's inputs or outputs in order, as ONNX runners match them).
//
// decl, when not nil, is what an ONNX model declares for its inputs or
// outputs, some of them sequences or optionals (onnxIO): file K is then the
// K-th declared value, read by its type as the graph's tensors
// (onnx.ReadTestValue: a sequence x as x.0, x.1, ...).
func readTestData(dir, kind string, order []string, decl []onnx.Declared) (map[string]*graph.Tensor, error) {
	files, err := testDataFiles(dir, kind)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s has no %s_0.pb: not an ONNX test data set folder", dir, kind)
	}
	out := map[string]*graph.Tensor{}
	if decl != nil {
		if len(files) != len(decl) {
			return nil, fmt.Errorf("%s has %d %s files, the model declares %d %ss", dir, len(files), kind, len(decl), kind)
		}
		for i, p := range files {
			tv, err := readTestValue(p, decl[i])
			if err != nil {
				return nil, err
			}
			for k, name := range tv.Names {
				out[name] = tv.Tensors[k]
			}
		}
		return out, nil
	}
	for i, p := range files {
		name, t, err := readTensorProtoFile(p)
		if err != nil {
			return nil, err
		}
		if name == "" || !slices.Contains(order, name) {
			if name != "" {
				return nil, fmt.Errorf("%s: tensor %q is not a graph %s (the graph's: %s)", p, name, kind, strings.Join(order, ", "))
			}
			if i >= len(order) {
				return nil, fmt.Errorf("%s: an unnamed tensor at position %d, and the graph has %d %ss", p, i, len(order), kind)
			}
			name = order[i]
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("%s: a second tensor for %s", p, name)
		}
		out[name] = t
	}
	return out, nil
}

// loadFeeds reads -inputs: a safetensors file or a test data set folder,
// holding a tensor for each of g's inputs (order: the input names of the
// graph as read, before -bind, for unnamed TensorProtos). Floats convert to
// the input's float type, integers to int64; shapes must match.
func loadFeeds(g *graph.Graph, path string, order []string, bound map[string]bool, decl []onnx.Declared) (map[string]*graph.Tensor, error) {
	var ts map[string]*graph.Tensor
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("-inputs: %w", err)
	}
	if st.IsDir() {
		ts, err = readTestData(path, "input", order, decl)
	} else {
		ts, err = readSafetensors(path)
	}
	if err != nil {
		return nil, fmt.Errorf("-inputs: %w", err)
	}
	feeds := map[string]*graph.Tensor{}
	var missing []string
	for _, in := range g.Inputs {
		t, ok := ts[in.Name]
		if !ok {
			missing = append(missing, in.Name)
			continue
		}
		c, err := convertTo(t, in.Type)
		if err != nil {
			return nil, fmt.Errorf("-inputs %s: input %s: %w", path, in.Name, err)
		}
		feeds[in.Name] = c
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("-inputs %s: no tensor for input %s (a bound input needs none; -bind binds others)", path, strings.Join(missing, ", "))
	}
	var extra []string
	for n := range ts {
		if _, ok := feeds[n]; !ok && !bound[n] {
			extra = append(extra, n)
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		return nil, fmt.Errorf("-inputs %s: %s is not an input of the graph (inputs: %s)", path, strings.Join(extra, ", "), strings.Join(inputNames(g), ", "))
	}
	return feeds, nil
}

func inputNames(g *graph.Graph) []string {
	var out []string
	for _, in := range g.Inputs {
		out = append(out, in.Name)
	}
	return out
}

// convertTo converts t to type want: the same shape, and a float type for a
// float input (rounded), int64 or bool for an integer one.
func convertTo(t *graph.Tensor, want graph.TensorType) (*graph.Tensor, error) {
	if !t.Shape.Equal(want.Shape) {
		return nil, fmt.Errorf("the tensor is %v, the graph wants %v", t.Type(), want)
	}
	if t.DType == want.DType {
		return t, nil
	}
	if t.DType.IsFloat() != want.DType.IsFloat() {
		return nil, fmt.Errorf("the tensor is %v, the graph wants %v", t.Type(), want)
	}
	c := graph.NewTensor(want.DType, want.Shape)
	for i := range t.Len() {
		c.Set(i, t.At(i))
	}
	return c, nil
}

// compareExpected compares outs with the expected outputs of the test data
// set in dir: every element within atol + rtol·|expected| (NaN matches NaN
// only). It prints one line per output with its worst element and returns
// an error when any output differs.
func compareExpected(w io.Writer, dir string, g *graph.Graph, outs map[string]*graph.Tensor, rtol, atol float64, decl []onnx.Declared) error {
	var order []string
	for _, o := range g.Outputs {
		order = append(order, o.Name)
	}
	want, err := readTestData(dir, "output", order, decl)
	if err != nil {
		return fmt.Errorf("-expect: %w", err)
	}
	var bad []string
	for _, name := range order {
		exp, ok := want[name]
		if !ok {
			continue
		}
		got := outs[name]
		if got == nil {
			return fmt.Errorf("-expect: the run gave no output %s", name)
		}
		r := compareTensors(got, exp, rtol, atol)
		fmt.Fprintf(w, "expect %s: %s\n", name, r)
		if !r.ok {
			bad = append(bad, name)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("-expect %s: %s differ%s beyond -atol %g + -rtol %g·|expected|", dir, strings.Join(bad, ", "), map[bool]string{true: "s", false: ""}[len(bad) == 1], atol, rtol)
	}
	fmt.Fprintf(w, "expect: %d outputs match %s (atol %g + rtol %g·|expected|)\n", len(want), dir, atol, rtol)
	return nil
}

// comparison is the result of comparing one output.
type comparison struct {
	ok        bool
	shapeErr  string
	n, over   int     // elements, elements out of tolerance
	worst     int     // index of the worst element (largest error over tolerance)
	got, want float64 // its values
	ratio     float64 // its |got - want| / (atol + rtol·|want|)
	shape     graph.Shape
}

func compareTensors(got, want *graph.Tensor, rtol, atol float64) comparison {
	c := comparison{n: want.Len(), worst: -1, shape: want.Shape}
	if !got.Shape.Equal(want.Shape) {
		c.shapeErr = fmt.Sprintf("shape %v, expected %v", got.Shape, want.Shape)
		return c
	}
	for i := range want.Len() {
		g, e := got.At(i), want.At(i)
		var r float64
		switch {
		case math.IsNaN(g) && math.IsNaN(e):
			r = 0
		case math.IsNaN(g) || math.IsNaN(e):
			r = math.Inf(1)
		case g == e: // equal infinities too
			r = 0
		default:
			r = math.Abs(g-e) / (atol + rtol*math.Abs(e))
		}
		if r > 1 || math.IsNaN(r) {
			c.over++
		}
		if c.worst < 0 || r > c.ratio {
			c.worst, c.ratio, c.got, c.want = i, r, g, e
		}
	}
	c.ok = c.over == 0
	return c
}

func (c comparison) String() string {
	if c.shapeErr != "" {
		return "MISMATCH: " + c.shapeErr
	}
	if c.n == 0 {
		return "ok (empty)"
	}
	verdict := "ok"
	if !c.ok {
		verdict = fmt.Sprintf("MISMATCH: %d of %d elements out of tolerance", c.over, c.n)
	}
	return fmt.Sprintf("%s; worst element %v: %.9g, expected %.9g (|diff| %.3g, %.3g of the tolerance)",
		verdict, unravel(c.worst, c.shape), c.got, c.want, math.Abs(c.got-c.want), c.ratio)
}

// unravel turns a flat index into a multi-index of shape.
func unravel(i int, shape graph.Shape) []int {
	idx := make([]int, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		if shape[d] > 0 {
			idx[d] = i % shape[d]
			i /= shape[d]
		}
	}
	return idx
}

func addBindFlag(fs *flag.FlagSet) bindFlag {
	b := bindFlag{}
	fs.Var(b, "bind", "NAME=FILE: make graph input NAME a constant holding FILE's tensor (a .pb TensorProto, or a safetensors file with a tensor NAME or only one), before the passes run, so they fold it; repeatable")
	return b
}

// names are the inputs bound.
func (b bindFlag) names() map[string]bool {
	m := map[string]bool{}
	for name := range b {
		m[name] = true
	}
	return m
}

// apply binds every -bind to g, in the order of the inputs' names.
func (b bindFlag) apply(g *graph.Graph) (*graph.Graph, error) {
	for _, name := range slices.Sorted(maps.Keys(b)) {
		file := b[name]
		t, err := readTensorFile(file, name)
		if err != nil {
			return nil, fmt.Errorf("-bind %s=%s: %w", name, file, err)
		}
		if g, err = graph.Bind(g, name, t); err != nil {
			return nil, fmt.Errorf("-bind %s=%s: %w", name, file, err)
		}
	}
	return g, nil
}

// runIOFlags are run's flags for real inputs and outputs.
type runIOFlags struct {
	decl            *onnxIO // see prepareONNX
	bind            bindFlag
	inputs, outputs string
	expect          string
	rtol, atol      float64
	force           bool
}

func addRunIOFlags(fs *flag.FlagSet) *runIOFlags {
	r := &runIOFlags{bind: addBindFlag(fs)}
	fs.StringVar(&r.inputs, "inputs", "", "the inputs: a safetensors file with a tensor per graph input, or an ONNX test data set folder (test_data_set_N: input_0.pb, input_1.pb, ... TensorProtos, matched by name, else by position); default: random inputs (-input-seed)")
	fs.StringVar(&r.outputs, "outputs", "", "write every output to this safetensors file")
	fs.StringVar(&r.expect, "expect", "", "an ONNX test data set folder: compare the outputs with its output_K.pb (and take its input_K.pb when -inputs is not given); prints the worst element of each output, exits non-zero on a mismatch")
	fs.Float64Var(&r.rtol, "rtol", 1e-3, "with -expect: relative tolerance (an element passes when |got - expected| <= atol + rtol·|expected|)")
	fs.Float64Var(&r.atol, "atol", 1e-7, "with -expect: absolute tolerance")
	fs.BoolVar(&r.force, "force", false, "run even when the memory plan says the forward pass needs more memory than is available")
	return r
}

// checkMemory refuses a forward pass whose memory plan does not fit on be
// (as train does; on the CPU with the executor's overhead, guardMemory),
// unless -force; hint says what to change.
func (r *runIOFlags) checkMemory(w io.Writer, be backend.Backend, g *graph.Graph, bf16 bool, hint string) error {
	return guardMemory(w, be, bf16, "the forward pass of "+g.Name, hint+", or -force to try anyway", r.force, g)
}

// feeds are the run's inputs: from -inputs (or -expect's folder), else random.
func (r *runIOFlags) feeds(g *graph.Graph, order []string, seed uint64) (map[string]*graph.Tensor, error) {
	if !(r.rtol >= 0) || !(r.atol >= 0) {
		return nil, fmt.Errorf("-rtol and -atol must be at least 0, got %g and %g", r.rtol, r.atol)
	}
	if r.outputs != "" {
		if err := train.CheckOutputFile("-outputs", r.outputs); err != nil {
			return nil, err
		}
	}
	if r.inputs == "" && r.expect != "" {
		r.inputs = r.expect
	}
	var feeds map[string]*graph.Tensor
	var err error
	if r.inputs == "" {
		feeds, err = bench.RandomFeeds(g, seed)
	} else {
		feeds, err = loadFeeds(g, r.inputs, order, r.bind.names(), r.decl.ins())
	}
	if err != nil {
		return nil, err
	}
	if err := checkDeclared(g, g.Inputs, feeds); err != nil {
		return nil, fmt.Errorf("-inputs: %w", err)
	}
	return feeds, nil
}

// checkDeclared checks that the int64 tensors of the graph inputs or
// outputs vs declared with a narrow integer type (an ONNX INT32 or UINT8,
// Graph.ElemTypes) hold values of that type: the graph computes them as
// int64, and a value outside the type is not one the model can see or give.
func checkDeclared(g *graph.Graph, vs []*graph.Value, ts map[string]*graph.Tensor) error {
	for _, v := range vs {
		nt, t := g.ElemTypes[v.Name], ts[v.Name]
		if nt == "" || t == nil {
			continue
		}
		if err := graph.CheckNarrow(t, nt); err != nil {
			return fmt.Errorf("%s is declared %s: %w", v.Name, nt, err)
		}
	}
	return nil
}

// finish writes -outputs and compares with -expect.
func (r *runIOFlags) finish(w io.Writer, g *graph.Graph, outs map[string]*graph.Tensor) error {
	if err := checkDeclared(g, g.Outputs, outs); err != nil {
		return fmt.Errorf("output %w", err)
	}
	if r.outputs != "" {
		meta := map[string]string{"producer": "flashgraph run", "graph": g.Name}
		for _, o := range g.Outputs {
			if nt := g.ElemTypes[o.Name]; nt != "" {
				// Written as int64, its values checked to be the type's.
				meta["elem_type."+o.Name] = nt
			}
		}
		if err := writeSafetensors(r.outputs, outs, meta); err != nil {
			return fmt.Errorf("-outputs %s: %w", r.outputs, err)
		}
		fmt.Fprintf(w, "outputs: %d tensors written to %s\n", len(outs), r.outputs)
	}
	if r.expect != "" {
		return compareExpected(w, r.expect, g, outs, r.rtol, r.atol, r.decl.outs())
	}
	return nil
}

// onnxIO is what an ONNX model declares for its graph inputs (other than
// initializers) and outputs, in order, when some are sequences or
// optionals: its test data sets then hold SequenceProtos and OptionalProtos
// for those, which readTestData reads by these types.
type onnxIO struct{ inputs, outputs []onnx.Declared }

func (d *onnxIO) ins() []onnx.Declared {
	if d == nil {
		return nil
	}
	return d.inputs
}

func (d *onnxIO) outs() []onnx.Declared {
	if d == nil {
		return nil
	}
	return d.outputs
}

// prepareONNX, for an ONNX FILE with sequence or optional inputs or outputs
// run on a test data set (-inputs or -expect a folder), reads what the model
// declares, and takes the shapes of each sequence input and the absence of
// each optional one from the set's input files, where -sequence does not give
// them: the import needs them before the feeds are read.
func (r *runIOFlags) prepareONNX(file string, b *boundaryFlags) error {
	isDir := func(p string) bool {
		st, err := os.Stat(p)
		return p != "" && err == nil && st.IsDir()
	}
	inDir := r.inputs
	if inDir == "" {
		inDir = r.expect
	}
	if !strings.EqualFold(filepath.Ext(file), ".onnx") || (!isDir(inDir) && !isDir(r.expect)) {
		return nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("cannot read graph: %w", err)
	}
	ins, outs, err := onnx.DeclaredIO(data)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if !slices.ContainsFunc(slices.Concat(ins, outs), onnx.Declared.NonTensor) {
		return nil
	}
	r.decl = &onnxIO{inputs: ins, outputs: outs}
	if !isDir(inDir) {
		return nil // the inputs are a safetensors file: x.0, x.1, ... by name
	}
	files, err := testDataFiles(inDir, "input")
	if err != nil {
		return err
	}
	for k, d := range ins {
		if k >= len(files) || !d.NonTensor() {
			continue
		}
		tv, err := readTestValue(files[k], d)
		if err != nil {
			return err
		}
		for name, shapes := range tv.Sequences {
			if _, given := b.seqs[name]; !given {
				b.seqs[name] = shapes
			}
		}
		for _, name := range tv.Absent {
			b.absent[name] = true
		}
	}
	return nil
}

// readTestValue reads a test data file by the type the model declares for it.
func readTestValue(path string, d onnx.Declared) (*onnx.TestValue, error) {
	data, err := readFileBounded(path)
	if err != nil {
		return nil, err
	}
	tv, err := onnx.ReadTestValue(data, d)
	if err != nil {
		return nil, fmt.Errorf("%s (%s, a %s): %w", path, d.Name, d.TypeKind(), err)
	}
	return tv, nil
}
