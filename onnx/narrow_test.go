package onnx

import (
	"maps"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// narrowModel: x INT32 [2, 3] → Gather(x, idx INT32 const, axis 1) → y
// INT32; Equal(x, x) → eq BOOL; Cast(x → FLOAT) → f; Cast(u UINT8 → INT32) → w.
func narrowModel() *onnxpb.Model {
	m := modelOf(13,
		[]*onnxpb.ValueInfo{vi("x", onnxpb.Int32, 2, 3), vi("u", onnxpb.Uint8, 2)},
		[]*onnxpb.Tensor{onnxpb.NewInt32("idx", []int64{2}, []int32{2, 0})},
		nil,
		nd("Gather", []string{"x", "idx"}, []string{"y"}, aInt("axis", 1)),
		nd("Equal", []string{"x", "x"}, []string{"eq"}),
		nd("Cast", []string{"x"}, []string{"f"}, aInt("to", int64(onnxpb.Float))),
		nd("Cast", []string{"u"}, []string{"w"}, aInt("to", int64(onnxpb.Int32))),
	)
	m.Graph.Output = []*onnxpb.ValueInfo{vi("y", onnxpb.Int32, 2, 2), vi("eq", onnxpb.Bool, 2, 3), vi("f", onnxpb.Float, 2, 3), vi("w", onnxpb.Int32, 2)}
	return m
}

func TestNarrowIntegers(t *testing.T) {
	x := graph.NewTensor(graph.Int64, graph.Shape{2, 3})
	copy(x.I64, []int64{-2147483648, 5, 2147483647, 7, -1, 0})
	u := graph.NewTensor(graph.Int64, graph.Shape{2})
	copy(u.I64, []int64{255, 0})
	g, out := importAndRun(t, narrowModel(), map[string]*graph.Tensor{"x": x, "u": u})
	if want := map[string]string{"x": "int32", "u": "uint8", "y": "int32", "w": "int32"}; !maps.Equal(g.ElemTypes, want) {
		t.Fatalf("ElemTypes %v, want %v", g.ElemTypes, want)
	}
	if !slices.Equal(out["y"].I64, []int64{2147483647, -2147483648, 0, 7}) {
		t.Fatalf("y = %v", out["y"].I64)
	}
	if !slices.Equal(out["w"].I64, []int64{255, 0}) {
		t.Fatalf("w = %v", out["w"].I64)
	}
	if got := out["f"].F32[0]; got != -2147483648 {
		t.Fatalf("f[0] = %v", got)
	}
	for name, want := range g.ElemTypes {
		if t2, ok := out[name]; ok {
			if err := graph.CheckNarrow(t2, want); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
	}

	// Export writes the declared types back, with boundary Casts, and our
	// import of it gives back the graph and its declared types.
	m := roundTrip(t, g)
	for _, vi := range slices.Concat(m.Graph.Input, m.Graph.Output) {
		if nt := g.ElemTypes[vi.Name]; nt != "" && narrowName(vi.Type.Tensor.ElemType) != nt {
			t.Fatalf("export declares %s as %v, want %s", vi.Name, vi.Type.Tensor.ElemType, nt)
		}
	}
	back, err := ImportBytes(onnxpb.Encode(m))
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(back.ElemTypes, g.ElemTypes) {
		t.Fatalf("round trip ElemTypes %v, want %v", back.ElemTypes, g.ElemTypes)
	}
	// Another importer sees plain ONNX: strip our producer, and the
	// boundary Casts import as ONNX's casts (INT32 → INT64 exact, INT64 →
	// INT32 keeping the low 32 bits), which give the same values.
	m.ProducerName = "other"
	plain, err := ImportBytes(onnxpb.Encode(m))
	if err != nil {
		t.Fatalf("plain import of the boundary Casts: %v", err)
	}
	if out2 := runGraph(t, plain, map[string]*graph.Tensor{"x": x, "u": u}); !slices.Equal(out2["y"].I64, out["y"].I64) {
		t.Fatalf("plain import: y = %v, want %v", out2["y"].I64, out["y"].I64)
	}
}

// TestNarrowCasts: a Cast into a narrow type follows ONNX's rules: from a
// wider integer the low bits are kept (200 as INT8 is −56); from a float the
// value is truncated toward zero and, out of range (where the spec leaves
// the result undefined), saturated; NaN, which no integer holds, is an
// error; a folded constant casts as a run-time value does.
func TestNarrowCasts(t *testing.T) {
	for _, c := range []struct {
		from, to onnxpb.DataType
		in       []float64
		want     []int64
	}{
		{onnxpb.Float, onnxpb.Uint8, []float64{-3.7, 0.2, 254.9, 255.5, 300, 1e20}, []int64{0, 0, 254, 255, 255, 255}},
		{onnxpb.Float, onnxpb.Int32, []float64{3e9, -3e9, 2147483520}, []int64{2147483647, -2147483648, 2147483520}},
		{onnxpb.Float, onnxpb.Int8, []float64{-128.9, 127.9, -1e10, -0.5}, []int64{-128, 127, -128, 0}},
		{onnxpb.Double, onnxpb.Int32, []float64{-2147483648.5, 2147483647.5, 1e300}, []int64{-2147483648, 2147483647, 2147483647}},
		{onnxpb.Int32, onnxpb.Int8, []float64{200, -129, 127, -2147483648}, []int64{-56, 127, 127, 0}},
		{onnxpb.Int64, onnxpb.Uint16, []float64{65536 + 5, -1}, []int64{5, 65535}},
		{onnxpb.Uint32, onnxpb.Int16, []float64{40000, 7}, []int64{40000 - 65536, 7}},
	} {
		n := int64(len(c.in))
		m := modelOf(13, []*onnxpb.ValueInfo{vi("a", c.from, n)}, nil, []string{"b"},
			nd("Cast", []string{"a"}, []string{"b"}, aInt("to", int64(c.to))))
		dt, _ := graphDType(c.from)
		a := graph.NewTensor(dt, graph.Shape{int(n)})
		for i, v := range c.in {
			a.Set(i, v)
		}
		g, out := importAndRun(t, m, map[string]*graph.Tensor{"a": a})
		if !slices.Equal(out["b"].I64, c.want) || g.ElemTypes["b"] != narrowName(c.to) {
			t.Errorf("Cast %v %v to %v = %v (declared %q), want %v", c.from, c.in, c.to, out["b"].I64, g.ElemTypes["b"], c.want)
		}
		// The same values as a constant fold to the same result.
		k := &onnxpb.Tensor{Name: "k", DataType: c.from, Dims: []int64{n}}
		for _, v := range c.in {
			switch c.from {
			case onnxpb.Float:
				k.FloatData = append(k.FloatData, float32(v))
			case onnxpb.Double:
				k.DoubleData = append(k.DoubleData, v)
			case onnxpb.Int64:
				k.Int64Data = append(k.Int64Data, int64(v))
			case onnxpb.Uint32:
				k.Uint64Data = append(k.Uint64Data, uint64(v))
			default:
				k.Int32Data = append(k.Int32Data, int32(v))
			}
		}
		mk := modelOf(13, []*onnxpb.ValueInfo{vi("z", c.to, n)}, []*onnxpb.Tensor{k}, []string{"b"},
			nd("Cast", []string{"k"}, []string{"kb"}, aInt("to", int64(c.to))), nd("Max", []string{"kb", "z"}, []string{"b"}))
		_, kout := importAndRun(t, mk, map[string]*graph.Tensor{"z": {DType: graph.Int64, Shape: graph.Shape{int(n)}, I64: make([]int64, n)}})
		for i, w := range c.want {
			if got := kout["b"].I64[i]; got != max(w, 0) {
				t.Errorf("folded Cast %v %v to %v: element %d = %d, want %d", c.from, c.in[i], c.to, i, got, max(w, 0))
			}
		}
	}
	m := modelOf(13, []*onnxpb.ValueInfo{vi("a", onnxpb.Float, 1)}, nil, []string{"b"},
		nd("Cast", []string{"a"}, []string{"b"}, aInt("to", int64(onnxpb.Uint8))))
	g, err := ImportBytes(onnxpb.Encode(m))
	if err != nil {
		t.Fatal(err)
	}
	exe, err := cpu.New().Compile(g, backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	nan := &graph.Tensor{DType: graph.Float32, Shape: graph.Shape{1}, F32: []float32{float32(math.NaN())}}
	if _, err := exe.Run(map[string]*graph.Tensor{"a": nan}); err == nil || !strings.Contains(err.Error(), "NaN") {
		t.Errorf("Cast of NaN to UINT8: %v, want an error naming NaN", err)
	}
	k := &onnxpb.Tensor{Name: "k", DataType: onnxpb.Float, Dims: []int64{1}, FloatData: []float32{float32(math.NaN())}}
	mk := modelOf(13, []*onnxpb.ValueInfo{vi("z", onnxpb.Uint8, 1)}, []*onnxpb.Tensor{k}, []string{"b"},
		nd("Cast", []string{"k"}, []string{"kb"}, aInt("to", int64(onnxpb.Uint8))), nd("Max", []string{"kb", "z"}, []string{"b"}))
	if _, err := ImportBytes(onnxpb.Encode(mk)); err == nil || !strings.Contains(err.Error(), "cast of NaN to UINT8") {
		t.Errorf("folded Cast of NaN to UINT8: %v", err)
	}
}

func TestNarrowRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    *onnxpb.Model
		want string
	}{
		{"neg wraps", modelOf(13, []*onnxpb.ValueInfo{vi("a", onnxpb.Int8, 2)}, nil, []string{"c"},
			nd("Neg", []string{"a"}, []string{"c"})), "integer semantics differ: Neg on INT8"},
		{"signed div overflows", modelOf(13, []*onnxpb.ValueInfo{vi("a", onnxpb.Int16, 2), vi("b", onnxpb.Int16, 2)}, nil, []string{"c"},
			nd("Div", []string{"a", "b"}, []string{"c"})), "integer semantics differ: Div on INT16"},
		{"sum wraps", modelOf(13, []*onnxpb.ValueInfo{vi("a", onnxpb.Int32, 2, 2)}, nil, []string{"c"},
			nd("ReduceSum", []string{"a"}, []string{"c"})), "integer semantics differ: ReduceSum on INT32"},
		{"uint64 sum read by another node", modelOf(13, []*onnxpb.ValueInfo{vi("a", onnxpb.Uint64, 2)}, nil, []string{"d"},
			nd("Add", []string{"a", "a"}, []string{"c"}), nd("Max", []string{"c", "a"}, []string{"d"})),
			`integer semantics differ: Add on UINT64 (a result at or above 2^63 has no int64 value, and "c" is not only a graph output)`},
		{"uint64 shift read by another node", modelOf(13, []*onnxpb.ValueInfo{vi("a", onnxpb.Uint64, 2)}, nil, []string{"c", "d"},
			nd("BitShift", []string{"a", "a"}, []string{"c"}, aStr("direction", "LEFT")), nd("Identity", []string{"c"}, []string{"d"})),
			"integer semantics differ: BitShift on UINT64"},
		{"uint64 folds past 2^63", modelOf(13, []*onnxpb.ValueInfo{vi("a", onnxpb.Uint64, 1)},
			[]*onnxpb.Tensor{{Name: "k", DataType: onnxpb.Uint64, Dims: []int64{1}, Uint64Data: []uint64{1 << 62}}}, []string{"c"},
			nd("Add", []string{"k", "k"}, []string{"k2"}), nd("Max", []string{"a", "k2"}, []string{"c"})),
			"UINT64 value 9223372036854775808 is at or above 2^63"},
		{"uint64 data past 2^63", modelOf(13, []*onnxpb.ValueInfo{vi("a", onnxpb.Uint64, 1)},
			[]*onnxpb.Tensor{{Name: "k", DataType: onnxpb.Uint64, Dims: []int64{1}, Uint64Data: []uint64{1 << 63}}}, []string{"c"},
			nd("Max", []string{"a", "k"}, []string{"c"})),
			"does not fit int64"},
		{"float to uint64 saturates", modelOf(13, []*onnxpb.ValueInfo{vi("a", onnxpb.Float, 2)}, nil, []string{"c"},
			nd("Cast", []string{"a"}, []string{"c"}, aInt("to", int64(onnxpb.Uint64)))), "integer semantics differ: Cast on FLOAT to UINT64"},
		{"int64 to uint64 wraps", modelOf(13, []*onnxpb.ValueInfo{vi("a", onnxpb.Int64, 2)}, nil, []string{"c"},
			nd("Cast", []string{"a"}, []string{"c"}, aInt("to", int64(onnxpb.Uint64)))), "integer semantics differ: Cast on INT64 to UINT64"},
		{"our domain", func() *onnxpb.Model {
			m := modelOf(13, []*onnxpb.ValueInfo{vi("a", onnxpb.Int32, 2), vi("b", onnxpb.Int32, 2)}, nil, []string{"c"},
				&onnxpb.Node{OpType: "SoftmaxGrad", Domain: graph.DomainFlashgraph, Input: []string{"a", "b"}, Output: []string{"c"}})
			m.OpsetImport = append(m.OpsetImport, onnxpb.OperatorSetID{Domain: graph.DomainFlashgraph, Version: 1})
			return m
		}(), "integer semantics differ: SoftmaxGrad on INT32"},
	} {
		_, err := ImportBytes(onnxpb.Encode(tc.m))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
	// Unsigned Div and Mod are exact; so is a constant folded at its width.
	_, out := importAndRun(t, modelOf(13, []*onnxpb.ValueInfo{vi("a", onnxpb.Uint8, 2)},
		[]*onnxpb.Tensor{{Name: "k", DataType: onnxpb.Uint8, Dims: []int64{2}, Int32Data: []int32{200, 100}},
			{Name: "one", DataType: onnxpb.Uint8, Dims: []int64{}, Int32Data: []int32{1}}}, []string{"q", "r"},
		nd("Add", []string{"k", "k"}, []string{"k2"}), // folds: 400 and 200 wrap to 144 and 200
		nd("Max", []string{"k2", "one"}, []string{"d"}),
		nd("Div", []string{"a", "d"}, []string{"q"}),
		nd("Mod", []string{"a", "d"}, []string{"r"})),
		map[string]*graph.Tensor{"a": {DType: graph.Int64, Shape: graph.Shape{2}, I64: []int64{255, 201}}})
	if !slices.Equal(out["q"].I64, []int64{1, 1}) || !slices.Equal(out["r"].I64, []int64{111, 1}) {
		t.Fatalf("q = %v, r = %v", out["q"].I64, out["r"].I64)
	}
}

// TestNarrowRingWraps: Add, Sub, Mul and Pow on narrow integers compute in
// int64 and reduce to the type's width, as a store of that width wraps:
// 200 + 100 = 44 in UINT8, 100 + 100 = −56 in INT8, −32768 − 1 = 32767 in
// INT16, 65536·65536 = 0 and 3^21 = 10460353203 → 1870418611 in INT32.
func TestNarrowRingWraps(t *testing.T) {
	for _, c := range []struct {
		op   string
		dt   onnxpb.DataType
		a, b int64
		want int64
	}{
		{"Add", onnxpb.Uint8, 200, 100, 44},
		{"Add", onnxpb.Int8, 100, 100, -56},
		{"Sub", onnxpb.Int16, -32768, 1, 32767},
		{"Mul", onnxpb.Int32, 65536, 65536, 0},
		{"Pow", onnxpb.Int32, 3, 21, 10460353203 - 2*(1<<32)},
		{"Sub", onnxpb.Uint16, 1, 2, 65535},
	} {
		m := modelOf(13, []*onnxpb.ValueInfo{vi("a", c.dt, 1), vi("b", c.dt, 1)}, nil, []string{"c"},
			nd(c.op, []string{"a", "b"}, []string{"c"}))
		_, out := importAndRun(t, m, map[string]*graph.Tensor{
			"a": {DType: graph.Int64, Shape: graph.Shape{1}, I64: []int64{c.a}},
			"b": {DType: graph.Int64, Shape: graph.Shape{1}, I64: []int64{c.b}},
		})
		if got := out["c"].I64[0]; got != c.want {
			t.Errorf("%s on %v of %d, %d = %d, want %d", c.op, c.dt, c.a, c.b, got, c.want)
		}
	}
}

// TestNarrowTypesFlow: the outputs of exact ops take their data's narrow
// type (the model's value_info declares it for every value, which the import
// checks), a comparison its own.
func TestNarrowTypesFlow(t *testing.T) {
	m := modelOf(13, []*onnxpb.ValueInfo{vi("x", onnxpb.Int16, 2, 2), vi("c", onnxpb.Bool, 2, 2)},
		[]*onnxpb.Tensor{{Name: "k", DataType: onnxpb.Int16, Dims: []int64{2, 2}, Int32Data: []int32{-32768, 1, 2, 32767}}}, nil,
		nd("Concat", []string{"x", "k"}, []string{"cat"}, aInt("axis", 0)),
		nd("Where", []string{"c", "x", "k"}, []string{"w"}),
		nd("Greater", []string{"k", "x"}, []string{"lt"}),
		nd("Transpose", []string{"w"}, []string{"tt"}))
	m.Graph.ValueInfo = []*onnxpb.ValueInfo{vi("cat", onnxpb.Int16, 4, 2), vi("w", onnxpb.Int16, 2, 2)}
	m.Graph.Output = []*onnxpb.ValueInfo{vi("lt", onnxpb.Bool, 2, 2), vi("tt", onnxpb.Int16, 2, 2), vi("cat", onnxpb.Int16, 4, 2)}
	x := &graph.Tensor{DType: graph.Int64, Shape: graph.Shape{2, 2}, I64: []int64{5, -7, 32767, 0}}
	c := &graph.Tensor{DType: graph.Bool, Shape: graph.Shape{2, 2}, B: []bool{true, false, false, true}}
	g, err := ImportBytes(onnxpb.Encode(m))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"x": "int16", "tt": "int16", "cat": "int16"}; !maps.Equal(g.ElemTypes, want) {
		t.Fatalf("ElemTypes %v, want %v", g.ElemTypes, want)
	}
	out := runGraph(t, g, map[string]*graph.Tensor{"x": x, "c": c})
	if !slices.Equal(out["cat"].I64, []int64{5, -7, 32767, 0, -32768, 1, 2, 32767}) ||
		!slices.Equal(out["lt"].B, []bool{false, true, false, true}) ||
		!slices.Equal(out["tt"].I64, []int64{5, 2, 1, 0}) {
		t.Fatalf("cat %v, lt %v, tt %v", out["cat"].I64, out["lt"].B, out["tt"].I64)
	}
	roundTrip(t, g)
}

// TestClipIntegers: Clip of int64 and of a narrow type selects with Max and
// Min, exactly at the extremes.
func TestClipIntegers(t *testing.T) {
	for _, dt := range []onnxpb.DataType{onnxpb.Int64, onnxpb.Int8} {
		lo := &onnxpb.Tensor{Name: "lo", DataType: dt, Dims: []int64{}, Int32Data: []int32{-128}, Int64Data: []int64{-128}}
		hi := &onnxpb.Tensor{Name: "hi", DataType: dt, Dims: []int64{}, Int32Data: []int32{5}, Int64Data: []int64{5}}
		if dt == onnxpb.Int64 {
			lo.Int32Data, hi.Int32Data = nil, nil
		} else {
			lo.Int64Data, hi.Int64Data = nil, nil
		}
		x := &graph.Tensor{DType: graph.Int64, Shape: graph.Shape{4}, I64: []int64{-128, 127, 5, 0}}
		_, out := importAndRun(t, modelOf(13, []*onnxpb.ValueInfo{vi("x", dt, 4)}, []*onnxpb.Tensor{lo, hi}, []string{"y", "z"},
			nd("Clip", []string{"x", "lo", "hi"}, []string{"y"}),
			nd("Clip", []string{"x", "", "hi"}, []string{"z"})), map[string]*graph.Tensor{"x": x})
		if !slices.Equal(out["y"].I64, []int64{-128, 5, 5, 0}) || !slices.Equal(out["z"].I64, []int64{-128, 5, 5, 0}) {
			t.Errorf("%v: y %v, z %v", dt, out["y"].I64, out["z"].I64)
		}
	}
}

// TestUint64 (UINT64, held as int64 below 2^63): ops that move, select or
// compare are exact, as are unsigned Div, Mod and a right shift; a ring
// operation or a left shift whose result is only a graph output computes
// the int64 result, the UINT64 one's bits, and one at or above 2^63 is an
// error where the output is read, never a negative number.
func TestUint64(t *testing.T) {
	u64 := func(v ...int64) *graph.Tensor {
		return &graph.Tensor{DType: graph.Int64, Shape: graph.Shape{len(v)}, I64: v}
	}
	big := int64(1<<61 + 3)
	m := modelOf(13, []*onnxpb.ValueInfo{vi("a", onnxpb.Uint64, 3), vi("b", onnxpb.Uint64, 3)}, nil, []string{"mx", "q", "r", "sr", "sl", "sum"},
		nd("Max", []string{"a", "b"}, []string{"mx"}),
		nd("Div", []string{"a", "b"}, []string{"q"}),
		nd("Mod", []string{"a", "b"}, []string{"r"}),
		nd("BitShift", []string{"a", "b"}, []string{"sr"}, aStr("direction", "RIGHT")),
		nd("BitShift", []string{"a", "b"}, []string{"sl"}, aStr("direction", "LEFT")),
		nd("Add", []string{"a", "b"}, []string{"sum"}))
	g, out := importAndRun(t, m, map[string]*graph.Tensor{"a": u64(big, 7, 1<<40), "b": u64(1, 2, 20)})
	for name, want := range map[string][]int64{
		"mx": {big, 7, 1 << 40}, "q": {big, 3, 1 << 40 / 20}, "r": {0, 1, 1 << 40 % 20},
		"sr": {big >> 1, 1, 1 << 20}, "sl": {big << 1, 28, 1 << 60}, "sum": {big + 1, 9, 1<<40 + 20},
	} {
		if g.ElemTypes[name] != "uint64" {
			t.Errorf("%s is declared %q, want uint64", name, g.ElemTypes[name])
		}
		if !slices.Equal(out[name].I64, want) {
			t.Errorf("%s = %v, want %v", name, out[name].I64, want)
		}
		if err := graph.CheckNarrow(out[name], "uint64"); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// 2^62 + 3 shifted left once is 2^63 + 6 in UINT64: its int64 bits are
	// negative, outside the held range, which the output's check says; shifted
	// twice it is 12 (2^64 drops out), in range.
	out = runGraph(t, g, map[string]*graph.Tensor{"a": u64(2*big-3, 2*big-3, 1), "b": u64(1, 2, 2)})
	if got := out["sl"].I64[1]; got != 12 {
		t.Errorf("(2^62 + 3) << 2 = %d in UINT64, want 12", got)
	}
	if err := graph.CheckNarrow(out["sl"], "uint64"); err == nil || !strings.Contains(err.Error(), "element 0") {
		t.Errorf("a left shift past 2^63: %v", err)
	}
}

// TestNarrowPowFloatExponent: a narrow integer to a float power is the
// float power converted as Cast converts a float: truncated (2^0.5 is 1,
// 2^−1 is 0) and, out of the type's range, saturated (3^21 in INT32, 2^7
// in INT8); UINT64, whose powers past 2^63 have no int64, is refused.
func TestNarrowPowFloatExponent(t *testing.T) {
	for _, c := range []struct {
		dt   onnxpb.DataType
		x    []int64
		e    []float32
		want []int64
	}{
		{onnxpb.Int32, []int64{2, 2, 3, -2, -3, 5}, []float32{0.5, -1, 21, 31, 21, 2}, []int64{1, 0, 2147483647, -2147483648, -2147483648, 25}},
		{onnxpb.Int8, []int64{2, -2, 3}, []float32{7, 7, 2.5}, []int64{127, -128, 15}},
		{onnxpb.Uint16, []int64{65535, 4}, []float32{2, 0.5}, []int64{65535, 2}},
	} {
		n := int64(len(c.x))
		m := modelOf(15, []*onnxpb.ValueInfo{vi("x", c.dt, n), vi("e", onnxpb.Float, n)}, nil, []string{"p"},
			nd("Pow", []string{"x", "e"}, []string{"p"}))
		g, out := importAndRun(t, m, map[string]*graph.Tensor{
			"x": {DType: graph.Int64, Shape: graph.Shape{int(n)}, I64: c.x},
			"e": {DType: graph.Float32, Shape: graph.Shape{int(n)}, F32: c.e},
		})
		if !slices.Equal(out["p"].I64, c.want) || g.ElemTypes["p"] != narrowName(c.dt) {
			t.Errorf("Pow %v %v to %v = %v (declared %q), want %v", c.dt, c.x, c.e, out["p"].I64, g.ElemTypes["p"], c.want)
		}
	}
	m := modelOf(15, []*onnxpb.ValueInfo{vi("x", onnxpb.Uint64, 1), vi("e", onnxpb.Float, 1)}, nil, []string{"p"},
		nd("Pow", []string{"x", "e"}, []string{"p"}))
	if _, err := ImportBytes(onnxpb.Encode(m)); err == nil || !strings.Contains(err.Error(), "integer semantics differ: Pow on UINT64") {
		t.Errorf("Pow of UINT64 to a float power: %v", err)
	}
}
