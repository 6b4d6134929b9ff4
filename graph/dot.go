package graph

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
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
	dotFlashStyle  = map[string]string{"shape": "doubleoctagon", "style": "filled,bold", "fillcolor": "orange", "color": "red", "penwidth": "2"}
)

// dotMaxText caps initializer recipes and attributes in labels: a literal
// imported weight would otherwise make a megabyte label.
const dotMaxText = 48

// WriteDOT renders g as a Graphviz digraph.
func WriteDOT(g *Graph) (string, error) {
	if g == nil {
		return "", errors.New("dot: nil graph")
	}
	w := newDOTWriter(g.Name)
	w.attr(w.root, "label", g.Name)
	w.attr(w.root, "labelloc", "t")
	w.attr(w.root, "rankdir", "TB")
	if err := w.add(w.root, "", g); err != nil {
		return "", err
	}
	return w.String(), w.err
}

// WriteDOTPair renders two graphs side by side, one cluster each: the graph
// before and after a pass (flashgraph dot -fuse).
func WriteDOTPair(before, after *Graph, titleBefore, titleAfter string) (string, error) {
	if before == nil || after == nil {
		return "", errors.New("dot: nil graph")
	}
	w := newDOTWriter(titleBefore + " vs " + titleAfter)
	w.attr(w.root, "rankdir", "TB")
	w.attr(w.root, "newrank", "true")
	for _, c := range []struct {
		id, title string
		g         *Graph
	}{{"cluster_before", titleBefore, before}, {"cluster_after", titleAfter, after}} {
		w.subgraph(c.id, map[string]string{"label": dotQuote(c.title), "style": "rounded", "color": "gray50"})
		if err := w.add(c.id, strings.TrimPrefix(c.id, "cluster_")+"_", c.g); err != nil {
			return "", err
		}
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

func (w *dotWriter) node(parent, id string, style map[string]string, label, tooltip string) {
	attrs := make(map[string]string, len(style)+2)
	for k, v := range style {
		attrs[k] = dotQuoteIfNeeded(v)
	}
	attrs["label"] = label
	if tooltip != "" {
		attrs["tooltip"] = dotQuote(tooltip)
	}
	w.check(w.gv.AddNode(parent, id, attrs))
	w.children[parent] = append(w.children[parent], id)
}

// add declares g's leaves, nodes, outputs and edges, with IDs prefixed by
// prefix, inside the graph or cluster parent.
func (w *dotWriter) add(parent, prefix string, g *Graph) error {
	ids := make(map[*Value]string, len(g.Inputs)+len(g.Params)+len(g.Consts)+len(g.Nodes))
	leaves := func(vs []*Value, tag string, style map[string]string) {
		for k, v := range vs {
			id := prefix + tag + strconv.Itoa(k)
			ids[v] = id
			lines := []string{v.Name, v.Type.String()}
			if v.Init != nil {
				lines = append(lines, dotClip(formatInit(v.Init)))
			}
			w.node(parent, id, style, dotLabel(lines...), v.Kind.String()+" "+v.Name)
		}
	}
	leaves(g.Inputs, "i", dotInputStyle)
	leaves(g.Params, "p", dotParamStyle)
	leaves(g.Consts, "c", dotConstStyle)

	type edge struct {
		src, dst string
		v        *Value
	}
	var edges []edge
	for k, n := range g.Nodes {
		id := prefix + "n" + strconv.Itoa(k)
		op, style, doc := n.Op, dotOpStyle, ""
		if s := n.Spec(); s != nil {
			op, doc = s.QualifiedName(), s.QualifiedName()+": "+s.Doc
			if s.Domain != DomainONNX {
				style = dotCustomStyle
			}
		}
		if n.Op == "FlashAttention" || n.Op == "FlashAttentionGrad" {
			style = dotFlashStyle
		}
		lines := []string{op, n.Name}
		if len(n.Attrs) > 0 {
			var parts []string
			for _, a := range n.Attrs.Names() {
				parts = append(parts, a+"="+n.Attrs[a].format())
			}
			lines = append(lines, dotClip(strings.Join(parts, ", ")))
		}
		var types []string
		for _, o := range n.Outputs {
			types = append(types, o.Type.String())
		}
		lines = append(lines, strings.Join(types, ", "))
		w.node(parent, id, style, dotLabel(lines...), doc) // hovering an op in SVG says what it computes
		for i, v := range n.Inputs {
			if v == nil {
				continue // an omitted optional input
			}
			src, ok := ids[v]
			if !ok {
				return fmt.Errorf("dot: node %s input %d (%s) is not defined before it", n.Name, i, v.Name)
			}
			edges = append(edges, edge{src, id, v})
		}
		for _, o := range n.Outputs {
			ids[o] = id
		}
	}
	for k, v := range g.Outputs {
		id := prefix + "o" + strconv.Itoa(k)
		src, ok := ids[v]
		if !ok {
			return fmt.Errorf("dot: output %s is not defined", v.Name)
		}
		w.node(parent, id, dotOutputStyle, dotLabel("output "+v.Name, v.Type.String()), "output "+v.Name)
		edges = append(edges, edge{src, id, v})
	}
	for _, e := range edges {
		w.check(w.gv.AddEdge(e.src, e.dst, true, map[string]string{"label": dotQuote(dotEdgeLabel(e.v))}))
	}
	return nil
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
