package graph

import (
	"fmt"
	"math"
)

// RoiAlign (ONNX opset 16; opset 10's output_half_pixel coordinates too):
// each region of interest [x1, y1, x2, y2] of an image is divided into
// output_height × output_width bins; a bin's value is the average (or, as
// ONNX's reference and runtimes compute it, the largest weighted corner)
// of bilinear samples on a regular grid inside it.

func init() {
	register(&OpSpec{
		Name: "RoiAlign", Doc: "[num_rois, C, output_height, output_width]: each ROI of X [N, C, H, W] pooled over bins of bilinear samples (avg or max)",
		Inputs: []string{"X", "rois", "batch_indices"}, Outputs: []string{"Y"}, Eval: evalRoiAlign,
		Attrs: []AttrSpec{
			{Name: "coordinate_transformation_mode", Kind: AttrString, Default: Str("half_pixel"), Enum: []string{"half_pixel", "output_half_pixel"}},
			{Name: "mode", Kind: AttrString, Default: Str("avg"), Enum: []string{"avg", "max"}},
			{Name: "output_height", Kind: AttrInt, Default: Int(1)},
			{Name: "output_width", Kind: AttrInt, Default: Int(1)},
			{Name: "sampling_ratio", Kind: AttrInt, Default: Int(0)},
			{Name: "spatial_scale", Kind: AttrFloat, Default: Float(1)},
		},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			x, rois, idx := in[0], in[1], in[2]
			if !x.DType.IsFloat() || x.Shape.Rank() != 4 {
				return nil, fmt.Errorf("X %v: want a float [N, C, H, W]", *x)
			}
			if rois.DType != x.DType || rois.Shape.Rank() != 2 || rois.Shape[1] != 4 {
				return nil, fmt.Errorf("rois %v: want %v[num_rois, 4]", *rois, x.DType)
			}
			if idx.DType != Int64 || !idx.Shape.Equal(Shape{rois.Shape[0]}) {
				return nil, fmt.Errorf("batch_indices %v: want int64[%d]", *idx, rois.Shape[0])
			}
			oh, ow := a.Int("output_height", 1), a.Int("output_width", 1)
			if sr := a.Int("sampling_ratio", 0); oh < 1 || ow < 1 || sr < 0 || sr > MaxRoiSamples {
				return nil, fmt.Errorf("output %d×%d, sampling_ratio %d: want positive sizes, a ratio in [0, %d]", oh, ow, sr, MaxRoiSamples)
			}
			return []TensorType{{x.DType, Shape{rois.Shape[0], x.Shape[1], int(oh), int(ow)}}}, nil
		},
	})
}

// MaxRoiSamples bounds the samples per bin along an axis when
// sampling_ratio is 0 (the region's own size then sets them).
const MaxRoiSamples = 1 << 16

func evalRoiAlign(in []*Tensor, a Attrs, out []*Tensor) error {
	x, rois, idx, y := in[0], in[1], in[2], out[0]
	n, ch, h, w := x.Shape[0], x.Shape[1], x.Shape[2], x.Shape[3]
	oh, ow := int(a.Int("output_height", 1)), int(a.Int("output_width", 1))
	ratio, scale := int(a.Int("sampling_ratio", 0)), a.Float("spatial_scale", 1)
	halfPixel := a.String("coordinate_transformation_mode", "half_pixel") == "half_pixel"
	useMax := a.String("mode", "avg") == "max"
	offset := 0.0
	if halfPixel {
		offset = 0.5
	}
	for r := range rois.Shape[0] {
		b := idx.I64[r]
		if b < 0 || b >= int64(n) {
			return fmt.Errorf("batch_indices[%d] = %d outside [0, %d)", r, b, n)
		}
		x1, y1 := rois.At(r*4)*scale-offset, rois.At(r*4+1)*scale-offset
		x2, y2 := rois.At(r*4+2)*scale-offset, rois.At(r*4+3)*scale-offset
		rw, rh := x2-x1, y2-y1
		if !halfPixel { // output_half_pixel: a region at least one pixel wide
			rw, rh = math.Max(rw, 1), math.Max(rh, 1)
		}
		bh, bw := rh/float64(oh), rw/float64(ow)
		gh, gw := ratio, ratio
		if ratio == 0 {
			fh, fw := math.Ceil(rh/float64(oh)), math.Ceil(rw/float64(ow))
			// A region of absurd size (or NaN corners) would sample without end.
			if math.IsNaN(fh) || math.IsNaN(fw) || fh > MaxRoiSamples || fw > MaxRoiSamples {
				return fmt.Errorf("roi %d spans %v×%v samples per bin, past %d", r, fh, fw, MaxRoiSamples)
			}
			gh, gw = int(math.Max(fh, 0)), int(math.Max(fw, 0))
		}
		count := float64(max(gh*gw, 1))
		for c := range ch {
			plane := (int(b)*ch + c) * h * w
			for ph := range oh {
				for pw := range ow {
					var acc float64
					first := true
					for iy := range gh {
						sy := y1 + float64(ph)*bh + (float64(iy)+0.5)*bh/float64(gh)
						for ix := range gw {
							sx := x1 + float64(pw)*bw + (float64(ix)+0.5)*bw/float64(gw)
							corners := roiBilinear(x, plane, h, w, sy, sx)
							if useMax {
								v := math.Max(math.Max(corners[0], corners[1]), math.Max(corners[2], corners[3]))
								if first || v > acc {
									acc = v
								}
								first = false
								continue
							}
							acc += corners[0] + corners[1] + corners[2] + corners[3]
						}
					}
					if !useMax {
						acc /= count
					}
					y.Set(((r*ch+c)*oh+ph)*ow+pw, acc)
				}
			}
		}
	}
	return nil
}

// roiBilinear gives the four weighted corner values of the bilinear sample
// at (sy, sx): zeros outside [-1, H] × [-1, W], coordinates below 0 read
// at 0 and past the last row or column at it.
func roiBilinear(x *Tensor, plane, h, w int, sy, sx float64) [4]float64 {
	if sy < -1 || sy > float64(h) || sx < -1 || sx > float64(w) {
		return [4]float64{}
	}
	sy, sx = math.Max(sy, 0), math.Max(sx, 0)
	y0, x0 := int(sy), int(sx)
	y1, x1 := y0+1, x0+1
	if y0 >= h-1 {
		y0, y1, sy = h-1, h-1, float64(h-1)
	}
	if x0 >= w-1 {
		x0, x1, sx = w-1, w-1, float64(w-1)
	}
	ly, lx := sy-float64(y0), sx-float64(x0)
	hy, hx := 1-ly, 1-lx
	at := func(r, c int) float64 { return x.At(plane + r*w + c) }
	return [4]float64{hy * hx * at(y0, x0), hy * lx * at(y0, x1), ly * hx * at(y1, x0), ly * lx * at(y1, x1)}
}
