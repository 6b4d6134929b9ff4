package picture

import (
	"bytes"
	"encoding/xml"
	"strconv"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/graph/layout"
)

// SVG draws the diagram as an SVG document. Hovering a node shows its
// tooltip (what an op computes), hovering an edge its DOT label (the value's
// name or shape); node IDs are the DOT IDs.
func SVG(d *graph.Diagram) ([]byte, error) {
	s, err := newScene(d)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.Grow(4096 + 600*s.nodes())
	w, h := num(s.w), num(s.h)
	b.WriteString(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	b.WriteString(`<svg xmlns="http://www.w3.org/2000/svg" width="` + w + `" height="` + h + `" viewBox="0 0 ` + w + " " + h + `" font-family="monospace" font-size="12">` + "\n")
	b.WriteString("<title>" + esc(d.Title) + "</title>\n")
	b.WriteString(`<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" fill="` + edgeColour.hex() + `"/></marker></defs>` + "\n")
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	b.WriteString(`<text x="` + num(s.w/2) + `" y="` + num(margin+titleH*0.6) + `" text-anchor="middle" font-size="16">` + esc(d.Title) + "</text>\n")
	for _, pc := range s.clusters {
		b.WriteString("<g")
		if pc.c.ID != "" {
			b.WriteString(` id="` + esc(pc.c.ID) + `"`)
		}
		b.WriteString(">\n")
		if pc.framed {
			b.WriteString(`<rect x="` + num(pc.box.x) + `" y="` + num(pc.box.y) + `" width="` + num(pc.box.w) + `" height="` + num(pc.box.h) + `" rx="8" fill="none" stroke="` + pc.frame.hex() + `"/>` + "\n")
			b.WriteString(`<text x="` + num(pc.titleAt.X) + `" y="` + num(pc.titleAt.Y) + `" text-anchor="middle" font-size="14">` + esc(pc.c.Title) + "</text>\n")
		}
		for i, pts := range pc.edges {
			b.WriteString(`<path d="`)
			for k, p := range pts {
				if k == 0 {
					b.WriteByte('M')
				} else {
					b.WriteByte('L')
				}
				b.WriteString(num(p.X) + "," + num(p.Y))
			}
			b.WriteString(`" fill="none" stroke="` + edgeColour.hex() + `" marker-end="url(#arrow)"><title>` + esc(pc.c.Edges[i].Label) + "</title></path>\n")
		}
		for i := range pc.nodes {
			writeNodeSVG(&b, &pc.nodes[i])
		}
		b.WriteString("</g>\n")
	}
	b.WriteString("</svg>\n")
	return b.Bytes(), nil
}

func writeNodeSVG(b *bytes.Buffer, p *placedNode) {
	b.WriteString(`<g id="` + esc(p.n.ID) + `">`)
	if p.n.Tooltip != "" {
		b.WriteString("<title>" + esc(p.n.Tooltip) + "</title>")
	}
	fill := "white"
	if p.filled {
		fill = p.fill.hex()
	}
	paint := `" fill="` + fill + `" stroke="` + p.stroke.hex() + `" stroke-width="` + num(p.pen) + `"/>`
	outer, inner := p.outline()
	if p.shape == "ellipse" {
		b.WriteString(`<ellipse cx="` + num(p.c.X) + `" cy="` + num(p.c.Y) + `" rx="` + num(p.w/2) + `" ry="` + num(p.h/2) + paint)
	} else {
		b.WriteString(`<polygon points="` + points(outer) + paint)
	}
	if inner != nil {
		b.WriteString(`<polygon points="` + points(inner) + `" fill="none" stroke="` + p.stroke.hex() + `" stroke-width="` + num(p.pen) + `"/>`)
	}
	size := ""
	if fs, ok := p.n.Style["fontsize"]; ok {
		if f, err := strconv.ParseFloat(fs, 64); err == nil && f < 14 {
			size = ` font-size="` + num(max(9, 12*f/14)) + `"` // Graphviz's 8 of 14, kept legible
		}
	}
	top := p.c.Y - float64(len(p.n.Lines))*lineH/2 + lineH*0.75
	b.WriteString(`<text x="` + num(p.c.X) + `" y="` + num(top) + `" text-anchor="middle"` + size + ">")
	for k, l := range p.n.Lines {
		b.WriteString(`<tspan x="` + num(p.c.X) + `" y="` + num(top+float64(k)*lineH) + `">` + esc(l) + "</tspan>")
	}
	b.WriteString("</text></g>\n")
}

func (s *scene) nodes() int {
	n := 0
	for _, c := range s.clusters {
		n += len(c.nodes)
	}
	return n
}

func points(ps []layout.Point) string {
	var b strings.Builder
	for k, p := range ps {
		if k > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(num(p.X) + "," + num(p.Y))
	}
	return b.String()
}

// num writes a coordinate with one decimal, the same bytes on every run.
func num(f float64) string {
	s := strconv.FormatFloat(f, 'f', 1, 64)
	s = strings.TrimSuffix(s, ".0")
	if s == "-0" {
		s = "0"
	}
	return s
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder does not fail
	return b.String()
}
