package cuda

import (
	"fmt"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// runCheckedSteps is Run's diagnostic mode (backend.Options.CheckFinite):
// the steps run one at a time, never captured as a graph, and each node's
// floating inputs are read back before it runs (an in-place node overwrites
// them) and its outputs after, so that the first node to make a NaN or an
// infinity from inputs without one is named as the CPU backend names it. It
// costs a synchronisation and a copy of every value: a tool for finding
// where a diverged step went wrong, not for training. A step that is no
// single node's (staging) is run unchecked.
func (x *executable) runCheckedSteps() error {
	for i := range x.steps {
		st := &x.steps[i]
		var ins []*graph.Tensor
		if st.node != nil {
			var err error
			if ins, err = x.readFloats(st.node.Inputs); err != nil {
				return fmt.Errorf("cuda: node %s (%s): reading its inputs: %w", st.node.Name, st.node.Op, err)
			}
		}
		if err := x.runAlone(st); err != nil {
			return stepError(st, err)
		}
		if st.node == nil {
			continue
		}
		outs, err := x.readFloats(st.node.Outputs)
		if err != nil {
			return fmt.Errorf("cuda: node %s (%s): reading its outputs: %w", st.node.Name, st.node.Op, err)
		}
		if nf := backend.CheckNodeFinite(st.node, ins, outs); nf != nil {
			return fmt.Errorf("cuda: %w", nf)
		}
	}
	return nil
}

// readFloats copies the floating values among vs to the host (nil for the
// others and for values with no device buffer, which CheckNodeFinite
// skips). The copies wait for the work queued before them.
func (x *executable) readFloats(vs []*graph.Value) ([]*graph.Tensor, error) {
	ts := make([]*graph.Tensor, len(vs))
	for i, v := range vs {
		if v == nil || !v.Type.DType.IsFloat() {
			continue
		}
		buf, ok := x.bufs[v]
		if !ok || buf.n == 0 || buf.n != v.Type.Shape.Numel() {
			continue // no buffer of its own (a shared zeros buffer, a shape operand)
		}
		t, err := download(x.b.dev, buf, v.Type)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", v.Name, err)
		}
		ts[i] = t
	}
	return ts, nil
}
