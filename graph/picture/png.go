package picture

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"slices"

	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/graph/layout"
)

// PNG limits: a picture larger than maxPixels (or wider or taller than
// maxSide) is drawn scaled down, and below textScale without its labels,
// since the bitmap font has one size. The SVG has them at any size.
const (
	maxPixels = 64 << 20
	maxSide   = 32767
	textScale = 0.999
)

// PNG draws the diagram as a paletted PNG with a small rasteriser: filled
// polygons, lines, and labels in basicfont's 7×13 face. A large graph
// (gpt2's) comes out scaled down without labels; PNGScale says how much.
func PNG(d *graph.Diagram) ([]byte, error) {
	s, err := newScene(d)
	if err != nil {
		return nil, err
	}
	k := PNGScale(s.w, s.h)
	w, h := int(math.Ceil(s.w*k)), int(math.Ceil(s.h*k))
	r := &raster{k: k}
	pal := color.Palette{color.White, color.Black, toColor(edgeColour)}
	seen := map[rgb]uint8{{255, 255, 255}: 0, {0, 0, 0}: 1, edgeColour: 2}
	r.index = func(c rgb) uint8 {
		if i, ok := seen[c]; ok {
			return i
		}
		pal = append(pal, toColor(c))
		seen[c] = uint8(len(pal) - 1)
		return seen[c]
	}
	// Every colour the picture uses, in a fixed order, so the palette is
	// the same on every run.
	for _, pc := range s.clusters {
		r.index(pc.frame)
		for _, n := range pc.nodes {
			r.index(n.fill)
			r.index(n.stroke)
		}
	}
	if len(pal) > 256 {
		return nil, fmt.Errorf("picture: %d colours do not fit a PNG palette", len(pal))
	}
	r.img = image.NewPaletted(image.Rect(0, 0, w, h), pal)
	text := k >= textScale
	if text {
		r.text(s.w/2-float64(len(d.Title))*3.5, margin+titleH*0.6, d.Title, 1)
	}
	for _, pc := range s.clusters {
		if pc.framed {
			b := pc.box
			r.polyline([]layout.Point{{X: b.x, Y: b.y}, {X: b.x + b.w, Y: b.y}, {X: b.x + b.w, Y: b.y + b.h}, {X: b.x, Y: b.y + b.h}, {X: b.x, Y: b.y}}, r.index(pc.frame), 1)
			if text {
				r.text(pc.titleAt.X-float64(len(pc.c.Title))*3.5, pc.titleAt.Y, pc.c.Title, 1)
			}
		}
		for _, pts := range pc.edges {
			r.polyline(pts, 2, 1)
			r.arrow(pts[len(pts)-2], pts[len(pts)-1])
		}
		for i := range pc.nodes {
			n := &pc.nodes[i]
			outer, inner := n.outline()
			fill := uint8(0)
			if n.filled {
				fill = r.index(n.fill)
			}
			r.fill(outer, fill)
			stroke := r.index(n.stroke)
			r.polyline(append(outer, outer[0]), stroke, n.pen)
			if inner != nil {
				r.polyline(append(inner, inner[0]), stroke, n.pen)
			}
			if text {
				top := n.c.Y - float64(len(n.n.Lines))*lineH/2 + lineH*0.75
				for j, l := range n.n.Lines {
					r.text(n.c.X-float64(len([]rune(l)))*3.5, top+float64(j)*lineH, l, 1)
				}
			}
		}
	}
	var b bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestSpeed}
	if err := enc.Encode(&b, r.img); err != nil {
		return nil, fmt.Errorf("picture: png: %w", err)
	}
	return b.Bytes(), nil
}

// PNGScale is the factor PNG draws a w×h picture at: 1, or less to keep
// within its size limits.
func PNGScale(w, h float64) float64 {
	k := 1.0
	if w*h > maxPixels {
		k = math.Sqrt(maxPixels / (w * h))
	}
	return min(k, maxSide/w, maxSide/h)
}

func toColor(c rgb) color.Color { return color.RGBA{c.r, c.g, c.b, 255} }

// raster draws in picture coordinates scaled by k onto a paletted image.
type raster struct {
	img   *image.Paletted
	k     float64
	index func(rgb) uint8
}

func (r *raster) set(x, y int, c uint8) {
	if (image.Point{x, y}).In(r.img.Rect) {
		r.img.Pix[y*r.img.Stride+x] = c
	}
}

// fill paints the inside of a polygon, scanline by scanline (even-odd).
func (r *raster) fill(poly []layout.Point, c uint8) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, p := range poly {
		lo, hi = min(lo, p.Y*r.k), max(hi, p.Y*r.k)
	}
	var xs []float64
	for y := int(math.Floor(lo)); y <= int(math.Ceil(hi)); y++ {
		fy := float64(y) + 0.5
		xs = xs[:0]
		for i, a := range poly {
			b := poly[(i+1)%len(poly)]
			ay, by := a.Y*r.k, b.Y*r.k
			if (ay <= fy) != (by <= fy) {
				xs = append(xs, a.X*r.k+(fy-ay)/(by-ay)*(b.X-a.X)*r.k)
			}
		}
		slices.Sort(xs)
		for i := 0; i+1 < len(xs); i += 2 {
			for x := int(math.Round(xs[i])); x < int(math.Round(xs[i+1])); x++ {
				r.set(x, y, c)
			}
		}
	}
}

// polyline draws straight segments through pts, pen pixels wide (at scale 1).
func (r *raster) polyline(pts []layout.Point, c uint8, pen float64) {
	wide := int(math.Max(1, math.Round(pen*r.k)))
	for i := 0; i+1 < len(pts); i++ {
		r.line(pts[i].X*r.k, pts[i].Y*r.k, pts[i+1].X*r.k, pts[i+1].Y*r.k, c, wide)
	}
}

func (r *raster) line(x0, y0, x1, y1 float64, c uint8, wide int) {
	steps := int(math.Ceil(math.Max(math.Abs(x1-x0), math.Abs(y1-y0))))
	for s := 0; s <= steps; s++ {
		t := 0.0
		if steps > 0 {
			t = float64(s) / float64(steps)
		}
		x, y := int(math.Floor(x0+t*(x1-x0))), int(math.Floor(y0+t*(y1-y0)))
		for d := range wide {
			r.set(x+d, y, c)
			r.set(x, y+d, c)
		}
	}
}

// arrow draws a filled arrowhead at b, pointing from a.
func (r *raster) arrow(a, b layout.Point) {
	dx, dy := b.X-a.X, b.Y-a.Y
	n := math.Hypot(dx, dy)
	if n == 0 {
		return
	}
	dx, dy = dx/n, dy/n
	const size, half = 8.0, 3.5
	base := layout.Point{X: b.X - dx*size, Y: b.Y - dy*size}
	r.fill([]layout.Point{b, {X: base.X - dy*half, Y: base.Y + dx*half}, {X: base.X + dy*half, Y: base.Y - dx*half}}, 2)
}

// text writes s with its baseline at y, starting at x, in basicfont's face.
// Runes outside the face are skipped (their advance kept).
func (r *raster) text(x, y float64, s string, c uint8) {
	face := basicfont.Face7x13
	dot := fixed.P(int(math.Round(x*r.k)), int(math.Round(y*r.k)))
	for _, ch := range s {
		dr, mask, mp, adv, ok := face.Glyph(dot, ch)
		if ok {
			alpha, _ := mask.(*image.Alpha)
			for yy := dr.Min.Y; yy < dr.Max.Y; yy++ {
				for xx := dr.Min.X; xx < dr.Max.X; xx++ {
					mx, my := mp.X+xx-dr.Min.X, mp.Y+yy-dr.Min.Y
					var a uint8
					if alpha != nil {
						a = alpha.AlphaAt(mx, my).A
					} else if _, _, _, a32 := mask.At(mx, my).RGBA(); a32 > 0x7fff {
						a = 255
					}
					if a > 127 {
						r.set(xx, yy, c)
					}
				}
			}
		}
		dot.X += adv
	}
}
