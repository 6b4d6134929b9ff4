package onnx

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// TestRecurrentAgainstLoops runs RNN, GRU (both linear_before_reset forms)
// and LSTM (with peepholes) bidirectionally, with sequence lengths that end
// early, a clip, initial states and both layouts, and compares Y, Y_h and
// Y_c with recurrentRef: the ONNX formulas as plain loops over each batch
// entry's own steps (the ONNX suite's tests have neither a reverse
// direction nor lengths shorter than the sequence).
func TestRecurrentAgainstLoops(t *testing.T) {
	const steps, batch, in, hid = 4, 3, 2, 3
	for _, c := range []struct {
		op     string
		lbr    int64
		clip   float32
		layout int64
	}{
		{"RNN", 0, 0, 0}, {"GRU", 0, 0, 0}, {"GRU", 1, 0, 1}, {"LSTM", 0, 0, 0}, {"LSTM", 0, 0.5, 1},
	} {
		name := fmt.Sprintf("%s_lbr%d_clip%g_layout%d", c.op, c.lbr, c.clip, c.layout)
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, uint64(len(name))))
			g := map[string]int{"RNN": 1, "GRU": 3, "LSTM": 4}[c.op]
			const dirs = 2
			rnd := func(n int) []float32 {
				v := make([]float32, n)
				for i := range v {
					v[i] = float32(rng.NormFloat64() * 0.7)
				}
				return v
			}
			x, w, r, b := rnd(steps*batch*in), rnd(dirs*g*hid*in), rnd(dirs*g*hid*hid), rnd(dirs*2*g*hid)
			h0, c0, p := rnd(dirs*batch*hid), rnd(dirs*batch*hid), rnd(dirs*3*hid)
			lens := []int64{4, 1, 2}
			xDims := []int64{steps, batch, in}
			xFeed := x
			if c.layout == 1 { // the same sequences given [batch, seq, input]
				xDims = []int64{batch, steps, in}
				xFeed = make([]float32, len(x))
				for s := range steps {
					for bi := range batch {
						copy(xFeed[(bi*steps+s)*in:][:in], x[(s*batch+bi)*in:][:in])
					}
				}
			}
			inputs := []*onnxpb.ValueInfo{vi("X", onnxpb.Float, xDims...), vi("L", onnxpb.Int64, batch), vi("H0", onnxpb.Float, dirs, batch, hid)}
			inits := []*onnxpb.Tensor{
				onnxpb.NewFloat32("W", []int64{dirs, int64(g * hid), in}, w),
				onnxpb.NewFloat32("R", []int64{dirs, int64(g * hid), hid}, r),
				onnxpb.NewFloat32("B", []int64{dirs, int64(2 * g * hid)}, b),
			}
			ins := []string{"X", "W", "R", "B", "L", "H0"}
			outs := []string{"Y", "Y_h"}
			if c.op == "LSTM" {
				inputs = append(inputs, vi("C0", onnxpb.Float, dirs, batch, hid))
				inits = append(inits, onnxpb.NewFloat32("P", []int64{dirs, 3 * hid}, p))
				ins = append(ins, "C0", "P")
				outs = append(outs, "Y_c")
			}
			attrs := []*onnxpb.Attribute{aInt("hidden_size", hid), aStr("direction", "bidirectional"), aInt("layout", c.layout)}
			if c.op == "GRU" {
				attrs = append(attrs, aInt("linear_before_reset", c.lbr))
			}
			if c.clip != 0 {
				attrs = append(attrs, aFloat("clip", c.clip))
			}
			m := modelOf(14, inputs, inits, outs, nd(c.op, ins, outs, attrs...))
			feed := func(dims []int64, v []float32) *graph.Tensor {
				s := make(graph.Shape, len(dims))
				for i, d := range dims {
					s[i] = int(d)
				}
				tt := graph.NewTensor(graph.Float32, s)
				copy(tt.F32, v)
				return tt
			}
			lt := graph.NewTensor(graph.Int64, graph.Shape{batch})
			copy(lt.I64, lens)
			feeds := map[string]*graph.Tensor{"X": feed(xDims, xFeed), "L": lt, "H0": feed([]int64{dirs, batch, hid}, h0)}
			if c.op == "LSTM" {
				feeds["C0"] = feed([]int64{dirs, batch, hid}, c0)
			} else {
				p = nil
			}
			_, got := importAndRun(t, m, feeds)
			want := recurrentRef(c.op, c.lbr != 0, float64(c.clip), steps, batch, in, hid, x, w, r, b, h0, c0, p, lens)
			// Layout 1 moves batch to the front: compare at the same (s, d, b, k).
			at := func(out string, s, d, bi, k int) float64 {
				v := got[out]
				switch {
				case out == "Y" && c.layout == 1:
					return v.At(((bi*steps+s)*dirs+d)*hid + k)
				case out == "Y":
					return v.At(((s*dirs+d)*batch+bi)*hid + k)
				case c.layout == 1:
					return v.At((bi*dirs+d)*hid + k)
				}
				return v.At((d*batch+bi)*hid + k)
			}
			for d := range dirs {
				for bi := range batch {
					for k := range hid {
						for s := range steps {
							if g, w := at("Y", s, d, bi, k), want.y[d][s][bi][k]; math.Abs(g-w) > 1e-5 {
								t.Fatalf("Y[s=%d d=%d b=%d k=%d] = %v, want %v", s, d, bi, k, g, w)
							}
						}
						if g, w := at("Y_h", 0, d, bi, k), want.h[d][bi][k]; math.Abs(g-w) > 1e-5 {
							t.Fatalf("Y_h[d=%d b=%d k=%d] = %v, want %v", d, bi, k, g, w)
						}
						if c.op == "LSTM" {
							if g, w := at("Y_c", 0, d, bi, k), want.c[d][bi][k]; math.Abs(g-w) > 1e-5 {
								t.Fatalf("Y_c[d=%d b=%d k=%d] = %v, want %v", d, bi, k, g, w)
							}
						}
					}
				}
			}
		})
	}
}

type recurrentResult struct {
	y    [][][][]float64 // [dir][step][batch][hidden]
	h, c [][][]float64   // [dir][batch][hidden]
}

// recurrentRef computes RNN/GRU/LSTM as the ONNX operator documents write
// them, one batch entry and one step at a time, in float64: gates of W and
// R in the order z r h (GRU) and i o f c (LSTM), peepholes i o f, B = [Wb,
// Rb]. Direction 1 runs each entry's steps from its length − 1 down to 0;
// steps past an entry's length output 0.
func recurrentRef(op string, lbr bool, clip float64, steps, batch, in, hid int, x, w, r, b, h0, c0, p []float32, lens []int64) recurrentResult {
	g := map[string]int{"RNN": 1, "GRU": 3, "LSTM": 4}[op]
	sig := func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }
	cl := func(v float64) float64 {
		if clip > 0 {
			return math.Max(-clip, math.Min(clip, v))
		}
		return v
	}
	var res recurrentResult
	for d := range 2 {
		W := func(row, col int) float64 { return float64(w[(d*g*hid+row)*in+col]) }
		R := func(row, col int) float64 { return float64(r[(d*g*hid+row)*hid+col]) }
		Wb := func(row int) float64 { return float64(b[d*2*g*hid+row]) }
		Rb := func(row int) float64 { return float64(b[d*2*g*hid+g*hid+row]) }
		ys := make([][][]float64, steps)
		for s := range ys {
			ys[s] = make([][]float64, batch)
			for bi := range ys[s] {
				ys[s][bi] = make([]float64, hid)
			}
		}
		hs, cs := make([][]float64, batch), make([][]float64, batch)
		for bi := range batch {
			h, c := make([]float64, hid), make([]float64, hid)
			for k := range hid {
				h[k] = float64(h0[(d*batch+bi)*hid+k])
				c[k] = float64(c0[(d*batch+bi)*hid+k])
			}
			n := int(lens[bi])
			for i := range n {
				s := i
				if d == 1 {
					s = n - 1 - i
				}
				xt := func(col int) float64 { return float64(x[(s*batch+bi)*in+col]) }
				// xg(k, j) = W row k·hid+j · x_t + Wb; rg(k, j, v) = R row · v + Rb.
				xg := func(k, j int) float64 {
					sum := Wb(k*hid + j)
					for col := range in {
						sum += W(k*hid+j, col) * xt(col)
					}
					return sum
				}
				rg := func(k, j int, v []float64) float64 {
					sum := Rb(k*hid + j)
					for col := range hid {
						sum += R(k*hid+j, col) * v[col]
					}
					return sum
				}
				nh, nc := make([]float64, hid), make([]float64, hid)
				for j := range hid {
					switch op {
					case "RNN":
						nh[j] = math.Tanh(cl(xg(0, j) + rg(0, j, h)))
					case "GRU":
						z := sig(cl(xg(0, j) + rg(0, j, h)))
						var hh float64
						if lbr {
							rr := sig(cl(xg(1, j) + rg(1, j, h)))
							hh = math.Tanh(cl(xg(2, j) + rr*rg(2, j, h)))
						} else {
							rh := make([]float64, hid)
							for col := range hid {
								rh[col] = sig(cl(xg(1, col)+rg(1, col, h))) * h[col]
							}
							hh = math.Tanh(cl(xg(2, j) + rg(2, j, rh)))
						}
						nh[j] = (1-z)*hh + z*h[j]
					case "LSTM":
						pi, po, pf := 0.0, 0.0, 0.0
						if p != nil {
							pi, po, pf = float64(p[d*3*hid+j]), float64(p[d*3*hid+hid+j]), float64(p[d*3*hid+2*hid+j])
						}
						ig := sig(cl(xg(0, j) + rg(0, j, h) + pi*c[j]))
						fg := sig(cl(xg(2, j) + rg(2, j, h) + pf*c[j]))
						cg := math.Tanh(cl(xg(3, j) + rg(3, j, h)))
						nc[j] = fg*c[j] + ig*cg
						og := sig(cl(xg(1, j) + rg(1, j, h) + po*nc[j]))
						nh[j] = og * math.Tanh(nc[j])
					}
				}
				h = nh
				if op == "LSTM" {
					c = nc
				}
				copy(ys[s][bi], h)
			}
			hs[bi], cs[bi] = h, c
		}
		res.y, res.h, res.c = append(res.y, ys), append(res.h, hs), append(res.c, cs)
	}
	return res
}
