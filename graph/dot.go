package graph

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/awalterschulze/gographviz"
)

// DOT output. The diagram is modelled with gographviz (so what we write is
// what its analyser reads back), but the text is written here: gographviz
// orders nodes by name (n10 before n2) and builds its text by repeated string
// concatenation, quadratic in the graph size, while we want the graph's own
// order and gpt2-sized graphs (thousands of nodes) in well under a second.
//
// Node IDs are positional, never derived from value names, so that a diagram
// is stable across renames and two graphs of one shape diff line by line:
// i<k> inputs, p<k> params, c<k> consts, n<k> nodes, o<k> graph outputs.

// Node styles. Params are filled boxes so that what training changes stands
// out from fixed consts (small grey notes) and runtime inputs.
var (
	dotInputStyle  = map[string]string{"shape": "invhouse", "style": "filled", "fillcolor": "palegreen"}
	dotParamStyle  = map[string]string{"shape": "box", "style": "filled", "fillcolor": "lightblue"}
	dotConstStyle  = map[string]string{"shape": "note", "style": "filled", "fillcolor": "gray92", "fontsize": "8"}
	dotOutputStyle = map[string]string{"shape": "house", "style": "filled", "fillcolor": "lightsalmon"}
	dotOpStyle     = map[string]string{"shape": "ellipse"}
	// Our own (fused) ops are tinted; the attention kernels, which are the
	// point of the project, are loud.
	dotCustomStyle = map[string]string{"shape": "ellipse", "style": "filled", "fillcolor": "lightyellow"}
	// The clusters of a before/after pair.
	dotClusterStyle = map[string]string{"style": "rounded", "color": "gray50"}
	dotFlashStyle   = map[string]string{"shape": "doubleoctagon", "style": "filled,bold", "fillcolor": "orange", "color": "red", "penwidth": "2"}
)

// dotMaxText caps initializer recipes and attributes in labels: a literal
// imported weight would otherwise make a megabyte label.
const dotMaxText = 48

// WriteDOT renders g as a Graphviz digraph.
func WriteDOT(g *Graph) (string, error) {
	if g == nil {
		return "", errors.New("dot: nil graph")
	}
	d, err := NewDiagram(g)
	if err != nil {
		return "", err
	}
	return WriteDiagramDOT(d)
}

// WriteDOTPair renders two graphs side by side, one cluster each: the graph
// before and after a pass (flashgraph dot -fuse).
func WriteDOTPair(before, after *Graph, titleBefore, titleAfter string) (string, error) {
	if before == nil || after == nil {
		return "", errors.New("dot: nil graph")
	}
	d, err := NewDiagramPair(before, after, titleBefore, titleAfter)
	if err != nil {
		return "", err
	}
	return WriteDiagramDOT(d)
}

// WriteDiagramDOT writes a diagram as DOT: a single graph (NewDiagram) at the
// top level with its title, a pair (NewDiagramPair) as two clusters.
func WriteDiagramDOT(d *Diagram) (string, error) {
	if d == nil || len(d.Clusters) == 0 {
		return "", errors.New("dot: empty diagram")
	}
	w := newDOTWriter(d.Title)
	if len(d.Clusters) == 1 && d.Clusters[0].ID == "" {
		w.attr(w.root, "label", d.Title)
		w.attr(w.root, "labelloc", "t")
		w.attr(w.root, "rankdir", "TB")
		w.add(w.root, d.Clusters[0])
		return w.String(), w.err
	}
	w.attr(w.root, "rankdir", "TB")
	w.attr(w.root, "newrank", "true")
	for _, c := range d.Clusters {
		attrs := map[string]string{"label": dotQuote(c.Title)}
		for k, v := range c.Style {
			attrs[k] = v
		}
		w.subgraph(c.ID, attrs)
		w.add(c.ID, c)
	}
	return w.String(), w.err
}

// dotWriter fills a gographviz model and remembers the order things were
// declared in, which is the order they are written.
type dotWriter struct {
	gv       *gographviz.Graph
	root     string
	subs     []string            // cluster IDs in declaration order
	children map[string][]string // parent graph -> node IDs in order
	err      error
}

func newDOTWriter(name string) *dotWriter {
	w := &dotWriter{gv: gographviz.NewGraph(), root: dotQuote(name), children: map[string][]string{}}
	w.check(w.gv.SetName(w.root))
	w.check(w.gv.SetDir(true))
	return w
}

func (w *dotWriter) check(err error) {
	if err != nil && w.err == nil {
		w.err = fmt.Errorf("dot: %w", err)
	}
}

func (w *dotWriter) attr(parent, key, value string) {
	w.check(w.gv.AddAttr(parent, key, dotQuote(value)))
}

func (w *dotWriter) subgraph(id string, attrs map[string]string) {
	w.check(w.gv.AddSubGraph(w.root, id, attrs))
	w.subs = append(w.subs, id)
}

func (w *dotWriter) node(parent string, n DiagramNode) {
	attrs := make(map[string]string, len(n.Style)+2)
	for k, v := range n.Style {
		attrs[k] = dotQuoteIfNeeded(v)
	}
	attrs["label"] = dotLabel(n.Lines...)
	if n.Tooltip != "" {
		attrs["tooltip"] = dotQuote(n.Tooltip) // hovering an op in SVG says what it computes
	}
	w.check(w.gv.AddNode(parent, n.ID, attrs))
	w.children[parent] = append(w.children[parent], n.ID)
}

// add declares a cluster's nodes, then its edges, inside the graph or
// cluster parent.
func (w *dotWriter) add(parent string, c *DiagramCluster) {
	for _, n := range c.Nodes {
		w.node(parent, n)
	}
	for _, e := range c.Edges {
		w.check(w.gv.AddEdge(c.Nodes[e.Src].ID, c.Nodes[e.Dst].ID, true, map[string]string{"label": dotQuote(e.Label)}))
	}
}

// dotEdgeLabel names a value where the name says something the source node
// does not (a renamed value such as layers.0/attn/q, one output of several),
// and gives its shape otherwise.
func dotEdgeLabel(v *Value) string {
	if v.Producer != nil && v.Name != v.Producer.Name {
		return v.Name
	}
	return v.Type.Shape.String()
}

// String writes the model in declaration order: graph attributes, then each
// cluster with its nodes, then top-level nodes, then edges. Attributes are
// sorted by name, so the text depends on nothing but the graphs.
func (w *dotWriter) String() string {
	var b strings.Builder
	b.Grow(256 * (len(w.gv.Nodes.Nodes) + len(w.gv.Edges.Edges)))
	b.WriteString("digraph " + w.root + " {\n")
	writeAttrStmts(&b, "\t", w.gv.Attrs)
	for _, sub := range w.subs {
		b.WriteString("\tsubgraph " + sub + " {\n")
		writeAttrStmts(&b, "\t\t", w.gv.SubGraphs.SubGraphs[sub].Attrs)
		w.writeNodes(&b, "\t\t", sub)
		b.WriteString("\t}\n")
	}
	w.writeNodes(&b, "\t", w.root)
	for _, e := range w.gv.Edges.Edges {
		b.WriteString("\t" + e.Src + " -> " + e.Dst)
		writeAttrList(&b, e.Attrs)
		b.WriteString(";\n")
	}
	b.WriteString("}\n")
	return b.String()
}

func (w *dotWriter) writeNodes(b *strings.Builder, indent, parent string) {
	for _, id := range w.children[parent] {
		b.WriteString(indent + id)
		writeAttrList(b, w.gv.Nodes.Lookup[id].Attrs)
		b.WriteString(";\n")
	}
}

func sortedAttrNames(attrs gographviz.Attrs) []string {
	names := make([]string, 0, len(attrs))
	for k := range attrs {
		names = append(names, string(k))
	}
	slices.Sort(names)
	return names
}

func writeAttrStmts(b *strings.Builder, indent string, attrs gographviz.Attrs) {
	for _, k := range sortedAttrNames(attrs) {
		b.WriteString(indent + k + "=" + attrs[gographviz.Attr(k)] + ";\n")
	}
}

func writeAttrList(b *strings.Builder, attrs gographviz.Attrs) {
	if len(attrs) == 0 {
		return
	}
	b.WriteString(" [")
	for i, k := range sortedAttrNames(attrs) {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k + "=" + attrs[gographviz.Attr(k)])
	}
	b.WriteString("]")
}

// dotLabel joins label lines with DOT's centred line break.
func dotLabel(lines ...string) string {
	esc := make([]string, len(lines))
	for i, l := range lines {
		esc[i] = dotEscape(l)
	}
	return `"` + strings.Join(esc, `\n`) + `"`
}

// dotQuote makes s one DOT string literal.
func dotQuote(s string) string { return `"` + dotEscape(s) + `"` }

// dotQuoteIfNeeded leaves DOT identifiers (box, gray92) and integers (2)
// bare, to keep the text short, and quotes anything else.
func dotQuoteIfNeeded(s string) string {
	if s == "" {
		return `""`
	}
	digits, ident := true, s[0] < '0' || s[0] > '9'
	for i := 0; i < len(s); i++ {
		c := s[i]
		isDigit := c >= '0' && c <= '9'
		digits = digits && isDigit
		ident = ident && (isDigit || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_')
	}
	if digits || ident {
		return s
	}
	return dotQuote(s)
}

// dotEscape escapes what a DOT string literal cannot hold as is. Backslash
// is doubled because Graphviz reads \n, \l, \N in labels as escapes.
func dotEscape(s string) string {
	if !strings.ContainsAny(s, "\\\"\n\r") {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '\\':
			b.WriteString(`\\`)
		case '"':
			b.WriteString(`\"`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// dotClip shortens s to dotMaxText characters.
func dotClip(s string) string {
	if len(s) <= dotMaxText {
		return s
	}
	cut := dotMaxText
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func isRuneStart(c byte) bool { return c&0xC0 != 0x80 }
