package onnx

import (
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// testCtx is an opCtx for node n of a bare opset-17 model, with attributes.
func testCtx(t *testing.T, n *onnxpb.Node, attrs ...*onnxpb.Attribute) *opCtx {
	t.Helper()
	m := &onnxpb.Model{IRVersion: 8, OpsetImport: []onnxpb.OperatorSetID{{Version: 17}}, Graph: &onnxpb.Graph{Name: "g"}}
	im, err := newImporter(m, Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := &opCtx{im: im, n: n, ver: 17, attrs: map[string]*onnxpb.Attribute{}, used: map[string]bool{}}
	for _, a := range attrs {
		c.attrs[a.Name] = a
	}
	return c
}

// A rewrite keeps its first error: the steps after it add no node, read no
// attribute, return nil (or the default) and leave the error as it was.
func TestRewriteKeepsFirstError(t *testing.T) {
	c := testCtx(t, &onnxpb.Node{Name: "n", OpType: "Test", Output: []string{"y"}},
		&onnxpb.Attribute{Name: "k", Type: onnxpb.AttrInt, I: 7},
		&onnxpb.Attribute{Name: "bad", Type: onnxpb.AttrFloat, F: 1})
	x := &graph.Value{Name: "x", Kind: graph.Input, Type: graph.TensorType{DType: graph.Float32, Shape: graph.Shape{2, 3}}}
	r := c.rewrite()
	neg := r.sub("Neg", nil, x)
	if r.err != nil || neg == nil || !neg.Type.Shape.Equal(graph.Shape{2, 3}) {
		t.Fatalf("Neg: %v, %v", neg, r.err)
	}
	if k := r.attrInt("k", 1); k != 7 || !c.used["k"] {
		t.Fatalf("attrInt k = %d (used %v), want 7, read", k, c.used["k"])
	}
	// [2, 3]·[2, 3] does not multiply: the first error, naming the node.
	if mm := r.sub("MatMul", nil, neg, neg); mm != nil || r.err == nil {
		t.Fatalf("MatMul of [2,3] by [2,3]: %v, err %v; want nil and an error", mm, r.err)
	}
	first := r.err
	if !strings.Contains(first.Error(), `node "n" (Test`) {
		t.Errorf("error %q does not name the node", first)
	}
	nodes := len(c.im.g.Nodes)
	if v := r.sub("Exp", nil, neg); v != nil {
		t.Errorf("a step after the error returned %v", v)
	}
	if v := r.attrFloat("bad", 2); v != 2 || c.used["bad"] {
		t.Errorf("attrFloat after the error = %v (used %v), want the default 2, unread", v, c.used["bad"])
	}
	r.emitReshape(neg, []int64{6})
	r.fail(c.errf("a later error"))
	if len(c.im.g.Nodes) != nodes {
		t.Errorf("%d nodes added after the error", len(c.im.g.Nodes)-nodes)
	}
	if r.err != first {
		t.Errorf("error became %v, want the first, %v", r.err, first)
	}
}

// A failing attribute read is the rewrite's error too, and stops what follows.
func TestRewriteAttrError(t *testing.T) {
	c := testCtx(t, &onnxpb.Node{Name: "n", OpType: "Test", Output: []string{"y"}},
		&onnxpb.Attribute{Name: "axis", Type: onnxpb.AttrFloat, F: 1})
	r := c.rewrite()
	if a := r.attrInt("axis", 3); a != 3 || r.err == nil || !strings.Contains(r.err.Error(), "attribute axis is") {
		t.Fatalf("attrInt of a float attribute = %d, err %v; want the default and a type error", a, r.err)
	}
	if v := r.ints("shape", []int64{1}); v != nil || len(c.im.inits) != 0 {
		t.Errorf("ints after the error = %v, %d constants", v, len(c.im.inits))
	}
}
