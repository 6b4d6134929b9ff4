// Package picture draws a graph.Diagram (what graph.WriteDOT writes as DOT)
// without Graphviz: it lays each graph out with graph/layout and writes SVG,
// or PNG through a small rasteriser. Shapes, colours and labels come from the
// diagram's Graphviz attributes, so the picture shows what the DOT says.
// The output depends on nothing but the diagram: the same graph gives the
// same bytes.
package picture

import (
	"fmt"
	"math"
	"strconv"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/graph/layout"
)

// Text metrics, shared by SVG (a 12px monospace font advances about 7.2px)
// and PNG (basicfont's 7×13 face), so that a label fits its box in both.
const (
	charW   = 7.2
	lineH   = 14.0
	padX    = 16.0
	padY    = 10.0
	margin  = 20.0
	titleH  = 28.0 // a graph's or cluster's title line
	pairGap = 40.0 // between the clusters of a before/after pair
)

// A scene is a diagram laid out: every node's box and every edge's
// polyline in picture coordinates.
type scene struct {
	d        *graph.Diagram
	w, h     float64
	clusters []placedCluster
}

type placedCluster struct {
	c       *graph.DiagramCluster
	box     rect // the cluster's frame (pairs) or the whole picture
	titleAt layout.Point
	nodes   []placedNode
	edges   [][]layout.Point
	framed  bool
	frame   rgb // the frame's colour
}

type placedNode struct {
	n      *graph.DiagramNode
	shape  string
	fill   rgb
	stroke rgb
	pen    float64
	filled bool
	c      layout.Point
	w, h   float64
}

type rect struct{ x, y, w, h float64 }

// newScene lays the diagram out: each cluster on its own, side by side.
func newScene(d *graph.Diagram) (*scene, error) {
	if d == nil || len(d.Clusters) == 0 {
		return nil, fmt.Errorf("picture: empty diagram")
	}
	s := &scene{d: d}
	framed := len(d.Clusters) > 1 || d.Clusters[0].ID != ""
	x := margin
	top := margin + titleH // the picture's title
	for ci, c := range d.Clusters {
		nodes := make([]layout.Node, len(c.Nodes))
		pns := make([]placedNode, len(c.Nodes))
		for i := range c.Nodes {
			pn, err := nodeLook(&c.Nodes[i])
			if err != nil {
				return nil, fmt.Errorf("picture: %s: %w", c.Nodes[i].ID, err)
			}
			pns[i] = pn
			nodes[i] = layout.Node{W: pn.w, H: pn.h}
		}
		edges := make([]layout.Edge, len(c.Edges))
		for i, e := range c.Edges {
			edges[i] = layout.Edge{Src: e.Src, Dst: e.Dst}
		}
		res, err := layout.Layout(nodes, edges, layout.DefaultOptions)
		if err != nil {
			return nil, fmt.Errorf("picture: cluster %d: %w", ci, err)
		}
		pc := placedCluster{c: c, nodes: pns, framed: framed, frame: clusterColour}
		if name, ok := c.Style["color"]; ok {
			if pc.frame, err = colour(name); err != nil {
				return nil, fmt.Errorf("picture: cluster %s: %w", c.ID, err)
			}
		}
		inner := 0.0
		if framed {
			inner = margin
			pc.box = rect{x, top, res.Width + 2*inner, res.Height + 2*inner + titleH}
			pc.titleAt = layout.Point{X: x + pc.box.w/2, Y: top + titleH*0.7}
		}
		ox, oy := x+inner, top+inner
		if framed {
			oy += titleH
		}
		for i := range pns {
			pns[i].c = layout.Point{X: res.Centers[i].X + ox, Y: res.Centers[i].Y + oy}
		}
		pc.edges = res.Edges
		for _, pts := range pc.edges {
			for k := range pts {
				pts[k].X += ox
				pts[k].Y += oy
			}
		}
		w := res.Width + 2*inner
		h := res.Height + 2*inner
		if framed {
			h += titleH
		}
		s.w = max(s.w, x+w+margin)
		s.h = max(s.h, top+h+margin)
		x += w + pairGap
		s.clusters = append(s.clusters, pc)
	}
	return s, nil
}

// nodeLook reads a node's Graphviz attributes: its shape, colours, pen and
// the box its label needs.
func nodeLook(n *graph.DiagramNode) (placedNode, error) {
	p := placedNode{n: n, shape: n.Style["shape"], pen: 1, stroke: rgb{0, 0, 0}, fill: rgb{255, 255, 255}}
	if p.shape == "" {
		p.shape = "ellipse"
	}
	style := n.Style["style"]
	p.filled = style == "filled" || style == "filled,bold"
	if style == "filled,bold" {
		p.pen = 2
	}
	if c, ok := n.Style["fillcolor"]; ok {
		col, err := colour(c)
		if err != nil {
			return p, err
		}
		p.fill = col
	}
	if c, ok := n.Style["color"]; ok {
		col, err := colour(c)
		if err != nil {
			return p, err
		}
		p.stroke = col
	}
	if pw, ok := n.Style["penwidth"]; ok {
		f, err := strconv.ParseFloat(pw, 64)
		if err != nil {
			return p, fmt.Errorf("penwidth %q: %w", pw, err)
		}
		p.pen = max(p.pen, f)
	}
	chars := 0
	for _, l := range n.Lines {
		chars = max(chars, len([]rune(l)))
	}
	p.w = float64(chars)*charW + padX
	p.h = float64(len(n.Lines))*lineH + padY
	switch p.shape {
	case "box", "note":
	case "ellipse":
		p.w, p.h = math.Ceil(p.w*1.25), p.h+8
	case "house", "invhouse":
		p.h += 12
	case "doubleoctagon":
		p.w, p.h = p.w+28, p.h+12
	default:
		return p, fmt.Errorf("shape %q is not drawn (add it to graph/picture)", p.shape)
	}
	return p, nil
}

// outline is a node's shape as a polygon (an ellipse as 32 points), and for a
// doubleoctagon the inner one too.
func (p *placedNode) outline() (outer, inner []layout.Point) {
	cx, cy, hw, hh := p.c.X, p.c.Y, p.w/2, p.h/2
	pt := func(x, y float64) layout.Point { return layout.Point{X: cx + x, Y: cy + y} }
	switch p.shape {
	case "ellipse":
		for k := range 32 {
			a := 2 * math.Pi * float64(k) / 32
			outer = append(outer, pt(hw*math.Cos(a), hh*math.Sin(a)))
		}
	case "house":
		outer = []layout.Point{pt(-hw, hh), pt(-hw, -hh+12), pt(0, -hh), pt(hw, -hh+12), pt(hw, hh)}
	case "invhouse":
		outer = []layout.Point{pt(-hw, -hh), pt(-hw, hh-12), pt(0, hh), pt(hw, hh-12), pt(hw, -hh)}
	case "note":
		outer = []layout.Point{pt(-hw, -hh), pt(hw-8, -hh), pt(hw, -hh+8), pt(hw, hh), pt(-hw, hh)}
	case "doubleoctagon":
		oct := func(hw, hh float64) []layout.Point {
			dx, dy := min(14, hw/3), hh/3
			return []layout.Point{pt(-hw+dx, -hh), pt(hw-dx, -hh), pt(hw, -hh+dy), pt(hw, hh-dy), pt(hw-dx, hh), pt(-hw+dx, hh), pt(-hw, hh-dy), pt(-hw, -hh+dy)}
		}
		return oct(hw, hh), oct(hw-4, hh-4)
	default: // box
		outer = []layout.Point{pt(-hw, -hh), pt(hw, -hh), pt(hw, hh), pt(-hw, hh)}
	}
	return outer, nil
}

type rgb struct{ r, g, b uint8 }

func (c rgb) hex() string { return fmt.Sprintf("#%02x%02x%02x", c.r, c.g, c.b) }

// x11 holds the Graphviz (X11) colour names the diagram styles use.
var x11 = map[string]rgb{
	"black":       {0, 0, 0},
	"white":       {255, 255, 255},
	"red":         {255, 0, 0},
	"orange":      {255, 165, 0},
	"palegreen":   {152, 251, 152},
	"lightblue":   {173, 216, 230},
	"lightsalmon": {255, 160, 122},
	"lightyellow": {255, 255, 224},
	"gray50":      {127, 127, 127},
	"gray92":      {235, 235, 235},
}

var (
	edgeColour    = rgb{80, 80, 80}
	clusterColour = rgb{0, 0, 0} // Graphviz's default
)

func colour(name string) (rgb, error) {
	c, ok := x11[name]
	if !ok {
		return c, fmt.Errorf("colour %q is not in graph/picture's table", name)
	}
	return c, nil
}
