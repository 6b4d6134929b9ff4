package graph

import (
	"fmt"
	"math"
)

// GridSample (ONNX opset 16, 4-D): each output position reads X at the
// point its grid entry gives, in [-1, 1] coordinates over X's width and
// height, interpolated (nearest, bilinear or bicubic) with out-of-range
// points padded (zeros, border or reflection).

func init() {
	register(&OpSpec{
		Name: "GridSample", Doc: "X [N, C, H, W] sampled at the normalized (x, y) points of grid [N, Ho, Wo, 2] (nearest, bilinear or bicubic; zeros, border or reflection padding)",
		Inputs: []string{"X", "grid"}, Outputs: []string{"Y"}, Eval: evalGridSample,
		Attrs: []AttrSpec{
			{Name: "align_corners", Kind: AttrInt, Default: Int(0)},
			{Name: "mode", Kind: AttrString, Default: Str("bilinear"), Enum: []string{"bilinear", "nearest", "bicubic"}},
			{Name: "padding_mode", Kind: AttrString, Default: Str("zeros"), Enum: []string{"zeros", "border", "reflection"}},
		},
		Infer: func(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
			x, g := in[0], in[1]
			if !x.DType.IsFloat() || x.Shape.Rank() != 4 {
				return nil, fmt.Errorf("X %v: want a float [N, C, H, W]", *x)
			}
			if g.DType != x.DType || g.Shape.Rank() != 4 || g.Shape[0] != x.Shape[0] || g.Shape[3] != 2 {
				return nil, fmt.Errorf("grid %v: want %v[%d, Ho, Wo, 2]", *g, x.DType, x.Shape[0])
			}
			return []TensorType{{x.DType, Shape{x.Shape[0], x.Shape[1], g.Shape[1], g.Shape[2]}}}, nil
		},
	})
}

// gridSampler reads one [H, W] plane of X at real coordinates.
type gridSampler struct {
	x                      *Tensor
	h, w                   int
	align                  bool
	pad                    string
	xmin, xmax, ymin, ymax float64 // the extent points are reflected within
}

// unnormalize maps a grid coordinate in [-1, 1] to a pixel coordinate:
// the corner pixels' centres (align_corners) or their outer edges.
func (s *gridSampler) unnormalize(v float64, n int) float64 {
	if s.align {
		return (v + 1) / 2 * float64(n-1)
	}
	return ((v+1)*float64(n) - 1) / 2
}

// reflect folds v into [lo, hi] as a mirror at each end would.
func reflect(v, lo, hi float64) float64 {
	r := hi - lo
	if r <= 0 {
		return lo
	}
	switch {
	case v < lo:
		d := lo - v
		k := math.Floor(d / r)
		if int(k)%2 == 0 {
			return lo + (d - k*r)
		}
		return hi - (d - k*r)
	case v > hi:
		d := v - hi
		k := math.Floor(d / r)
		if int(k)%2 == 0 {
			return hi - (d - k*r)
		}
		return lo + (d - k*r)
	}
	return v
}

// pixel is X at integer (row, col) of plane base, padded by the mode.
func (s *gridSampler) pixel(base, row, col int) float64 {
	switch s.pad {
	case "border":
		row, col = min(max(row, 0), s.h-1), min(max(col, 0), s.w-1)
	case "reflection":
		row = int(reflect(float64(row), s.ymin, s.ymax))
		col = int(reflect(float64(col), s.xmin, s.xmax))
	}
	if row < 0 || row >= s.h || col < 0 || col >= s.w {
		return 0
	}
	return s.x.At(base + row*s.w + col)
}

// cubicWeights are the bicubic convolution weights (a = −0.75) of the four
// pixels around a point t ∈ [0, 1) past the second.
func cubicWeights(t float64) [4]float64 {
	const a = -0.75
	near := func(d float64) float64 { return ((a+2)*d-(a+3))*d*d + 1 }
	far := func(d float64) float64 { return ((a*d-5*a)*d+8*a)*d - 4*a }
	return [4]float64{far(t + 1), near(t), near(1 - t), far(2 - t)}
}

func evalGridSample(in []*Tensor, a Attrs, out []*Tensor) error {
	x, grid, y := in[0], in[1], out[0]
	n, ch, h, w := x.Shape[0], x.Shape[1], x.Shape[2], x.Shape[3]
	ho, wo := grid.Shape[1], grid.Shape[2]
	s := &gridSampler{x: x, h: h, w: w, align: a.Int("align_corners", 0) != 0, pad: a.String("padding_mode", "zeros")}
	if s.align {
		s.xmin, s.xmax, s.ymin, s.ymax = 0, float64(w-1), 0, float64(h-1)
	} else {
		s.xmin, s.xmax, s.ymin, s.ymax = -0.5, float64(w)-0.5, -0.5, float64(h)-0.5
	}
	mode := a.String("mode", "bilinear")
	for b := range n {
		for i := range ho {
			for j := range wo {
				gp := ((b*ho+i)*wo + j) * 2
				px, py := s.unnormalize(grid.At(gp), w), s.unnormalize(grid.At(gp+1), h)
				if mode == "nearest" {
					px, py = math.RoundToEven(px), math.RoundToEven(py)
				}
				if px < s.xmin || px > s.xmax || py < s.ymin || py > s.ymax {
					switch s.pad {
					case "border":
						px, py = min(max(px, 0), float64(w-1)), min(max(py, 0), float64(h-1))
					case "reflection":
						px, py = reflect(px, s.xmin, s.xmax), reflect(py, s.ymin, s.ymax)
					}
				}
				for c := range ch {
					base := (b*ch + c) * h * w
					var v float64
					switch mode {
					case "nearest":
						v = s.pixel(base, int(py), int(px))
					case "bilinear":
						x0, y0 := math.Floor(px), math.Floor(py)
						fx, fy := px-x0, py-y0
						c0, r0 := int(x0), int(y0)
						v = (1-fy)*((1-fx)*s.pixel(base, r0, c0)+fx*s.pixel(base, r0, c0+1)) +
							fy*((1-fx)*s.pixel(base, r0+1, c0)+fx*s.pixel(base, r0+1, c0+1))
					default: // bicubic over the 4×4 pixels around the point
						x0, y0 := math.Floor(px), math.Floor(py)
						wx, wy := cubicWeights(px-x0), cubicWeights(py-y0)
						for r := range 4 {
							var row float64
							for q := range 4 {
								row += wx[q] * s.pixel(base, int(y0)-1+r, int(x0)-1+q)
							}
							v += wy[r] * row
						}
					}
					y.Set(((b*ch+c)*ho+i)*wo+j, v)
				}
			}
		}
	}
	return nil
}
