package graph

import (
	"fmt"
	"math"
	"slices"
)

// Interpolate is ONNX Resize (opset 11 to 13 semantics) with its operands
// resolved: the output shape (sizes), the scale of each axis the coordinate
// transform divides by, and the crop box (roi, tf_crop_and_resize only) are
// attributes, since our shapes are static. It lives in our domain because
// its form differs from ONNX's; the importer maps Resize and Upsample onto it.

var (
	resizeModes  = []string{"nearest", "linear", "cubic"}
	resizeCoords = []string{"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"}
	nearestModes = []string{"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}
)

func init() {
	register(&OpSpec{
		Name: "Interpolate", Domain: DomainFlashgraph,
		Doc:    "ONNX Resize with sizes, per-axis scales and roi resolved: each output element interpolated (nearest, linear, cubic) at its source coordinate",
		Inputs: []string{"X"}, Outputs: []string{"Y"}, Eval: evalInterpolate,
		Attrs: []AttrSpec{
			{Name: "sizes", Kind: AttrInts, Required: true},
			{Name: "scales", Kind: AttrFloats, Required: true},
			{Name: "roi", Kind: AttrFloats},
			{Name: "mode", Kind: AttrString, Default: Str("nearest")},
			{Name: "coordinate_transformation_mode", Kind: AttrString, Default: Str("half_pixel")},
			{Name: "nearest_mode", Kind: AttrString, Default: Str("round_prefer_floor")},
			{Name: "cubic_coeff_a", Kind: AttrFloat, Default: Float(-0.75)},
			{Name: "exclude_outside", Kind: AttrInt, Default: Int(0)},
			{Name: "extrapolation_value", Kind: AttrFloat, Default: Float(0)},
		},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			if !in[0].DType.IsFloat() {
				return nil, fmt.Errorf("X must be a float type, got %v", in[0].DType)
			}
			r := in[0].Shape.Rank()
			sizes, scales := a.IntList("sizes"), a["scales"].Floats
			if len(sizes) != r || len(scales) != r {
				return nil, fmt.Errorf("sizes %v and scales %v for rank %d", sizes, scales, r)
			}
			if roi := a["roi"].Floats; roi != nil && len(roi) != 2*r {
				return nil, fmt.Errorf("roi %v for rank %d", roi, r)
			}
			for i, s := range scales {
				if !(s > 0) || math.IsInf(s, 0) || sizes[i] < 0 || sizes[i] > math.MaxInt32 {
					return nil, fmt.Errorf("scales %v or sizes %v out of range", scales, sizes)
				}
				if sizes[i] > 0 && in[0].Shape[i] == 0 {
					return nil, fmt.Errorf("cannot interpolate the empty axis %d", i)
				}
			}
			for name, allowed := range map[string][]string{"mode": resizeModes, "coordinate_transformation_mode": resizeCoords, "nearest_mode": nearestModes} {
				if v := a.String(name, ""); !slices.Contains(allowed, v) {
					return nil, fmt.Errorf("%s %q is not one of %v", name, v, allowed)
				}
			}
			return []TensorType{{in[0].DType, Shape(toInts(sizes))}}, nil
		},
	})
}

// resizeSource is the coordinate in the input (axis of length n, output
// length m, scale s) of output coordinate x; ok false when tf_crop_and_resize
// puts it outside the input. As in ONNX's definition, the "resized length"
// the transforms divide by is n·s, which a scales operand need not make an
// integer (sizes give s = m/n, so it is m).
func resizeSource(mode string, x float64, n, m int, s float64, start, end float64) (float64, bool) {
	l := float64(n) * s
	// m/n·n may miss m by an ulp; a resized length of 1 is told within 1e-9.
	one := math.Abs(l-1) < 1e-9
	switch mode {
	case "pytorch_half_pixel":
		if l > 1 && !one {
			return (x+0.5)/s - 0.5, true
		}
		return 0, true
	case "align_corners":
		if one {
			return 0, true
		}
		return x * float64(n-1) / (l - 1), true
	case "asymmetric":
		return x / s, true
	case "tf_half_pixel_for_nn":
		return (x + 0.5) / s, true
	case "tf_crop_and_resize":
		var v float64
		if m > 1 {
			v = start*float64(n-1) + x*(end-start)*float64(n-1)/float64(m-1)
		} else {
			v = 0.5 * (start + end) * float64(n-1)
		}
		return v, v >= 0 && v <= float64(n-1)
	}
	return (x+0.5)/s - 0.5, true // half_pixel
}

type tap struct {
	i int
	w float64
}

// resizeTaps are the input positions and weights that make output position
// x of one axis.
func resizeTaps(a Attrs, axis, x, n, m int) ([]tap, bool) {
	s := a["scales"].Floats[axis]
	var start, end float64
	if roi := a["roi"].Floats; roi != nil {
		start, end = roi[axis], roi[len(roi)/2+axis]
	}
	v, ok := resizeSource(a.String("coordinate_transformation_mode", "half_pixel"), float64(x), n, m, s, start, end)
	if !ok {
		return nil, false
	}
	clamp := func(i int) int { return min(max(i, 0), n-1) }
	switch a.String("mode", "nearest") {
	case "nearest":
		var i float64
		switch a.String("nearest_mode", "round_prefer_floor") {
		case "round_prefer_ceil":
			i = math.Floor(v + 0.5)
		case "floor":
			i = math.Floor(v)
		case "ceil":
			i = math.Ceil(v)
		default:
			i = math.Ceil(v - 0.5)
		}
		return []tap{{clamp(int(i)), 1}}, true
	case "linear":
		x0 := math.Floor(v)
		r := v - x0
		return []tap{{clamp(int(x0)), 1 - r}, {clamp(int(x0) + 1), r}}, true
	}
	// cubic, with coefficient A; exclude_outside drops the taps outside the
	// input and renormalizes the rest.
	A := a.Float("cubic_coeff_a", -0.75)
	x0 := math.Floor(v)
	r := v - x0
	ws := []float64{
		((A*(r+1)-5*A)*(r+1)+8*A)*(r+1) - 4*A,
		((A+2)*r-(A+3))*r*r + 1,
		((A+2)*(1-r)-(A+3))*(1-r)*(1-r) + 1,
		((A*(2-r)-5*A)*(2-r)+8*A)*(2-r) - 4*A,
	}
	taps := make([]tap, 4)
	var sum float64
	for k := range 4 {
		i := int(x0) - 1 + k
		w := ws[k]
		if a.Int("exclude_outside", 0) != 0 && (i < 0 || i >= n) {
			w = 0
		}
		taps[k] = tap{clamp(i), w}
		sum += w
	}
	if a.Int("exclude_outside", 0) != 0 && sum != 0 {
		for k := range taps {
			taps[k].w /= sum
		}
	}
	return taps, true
}

func evalInterpolate(in []*Tensor, a Attrs, out []*Tensor) error {
	x, y := in[0], out[0]
	r := x.Shape.Rank()
	// The taps of every output coordinate of every axis.
	taps := make([][][]tap, r)
	inside := make([][]bool, r)
	for d := range r {
		m := y.Shape[d]
		taps[d] = make([][]tap, m)
		inside[d] = make([]bool, m)
		for o := range m {
			taps[d][o], inside[d][o] = resizeTaps(a, d, o, x.Shape[d], m)
		}
	}
	extra := a.Float("extrapolation_value", 0)
	oi := make([]int, r)
	ii := make([]int, r)
	for p := range y.Len() {
		unravel(p, y.Shape, oi)
		ok := true
		for d := range r {
			ok = ok && inside[d][oi[d]]
		}
		if !ok {
			y.Set(p, extra)
			continue
		}
		// The tensor product of the axes' taps.
		var s float64
		var walk func(d int, w float64)
		walk = func(d int, w float64) {
			if d == r {
				s += w * x.At(ravel(ii, x.Shape))
				return
			}
			for _, t := range taps[d][oi[d]] {
				ii[d] = t.i
				walk(d+1, w*t.w)
			}
		}
		walk(0, 1)
		y.Set(p, s)
	}
	return nil
}
