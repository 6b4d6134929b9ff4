package autodiff

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
)

// TrainApplyInput names the bool scalar input of a training step built with
// TrainOptions.Accum > 1: true on the last micro-batch of an optimizer step
// (the update is applied and the accumulators cleared), false before (the
// gradient is only added to the accumulators).
const TrainApplyInput = "accum_apply"

// accumulator is gradient accumulation inside the step graph. Each run adds
// the micro-batch's gradient to an accumulator initializer
// ("opt.acc.<param>", kept between runs through the Updates map). The update
// sees the mean of the accumulated gradients (the gradient of the mean loss
// over all the micro-batches: the same as one step on their concatenation);
// it is computed on every run, and Where(apply, new, old) keeps params and
// moments as they were (bit for bit) until the last micro-batch.
type accumulator struct {
	apply *graph.Value
	next  []*graph.Value // the accumulators' new values: outputs of the step, after the params'
}

// accumulate adds the accumulators and returns the gradient each param's
// update reads: (acc + g) / n.
func accumulate(g *graph.Graph, nm *graph.Namer, ts *TrainStep, vals map[string]*graph.Value, grads map[string]string, params []string, n int) (*accumulator, map[string]*graph.Value, error) {
	if !nm.Reserve(TrainApplyInput) {
		return nil, nil, fmt.Errorf("gradient accumulation: name %q is already used", TrainApplyInput)
	}
	apply := &graph.Value{Name: TrainApplyInput, Type: graph.TensorType{DType: graph.Bool, Shape: graph.Shape{}}, Kind: graph.Input}
	g.Inputs = append(g.Inputs, apply)
	a := &accumulator{apply: apply}
	dt := vals[grads[params[0]]].Type.DType
	scalar := func(v float64) *graph.Value {
		init := graph.Literal(v)
		s := &graph.Value{Name: nm.Fresh("accum/c"), Type: graph.TensorType{DType: dt, Shape: graph.Shape{}}, Kind: graph.Const, Init: &init}
		g.Consts = append(g.Consts, s)
		return s
	}
	zero, inv := scalar(0), scalar(1/float64(n))
	mean := map[string]*graph.Value{}
	for _, p := range params {
		gv := vals[grads[p]]
		name := "opt.acc." + p
		if !nm.Reserve(name) {
			return nil, nil, fmt.Errorf("gradient accumulation: name %q is already used", name)
		}
		init := graph.Zeros()
		acc := &graph.Value{Name: name, Type: graph.TensorType{DType: gv.Type.DType, Shape: gv.Type.Shape.Clone()}, Kind: graph.Const, Init: &init}
		g.Consts = append(g.Consts, acc)
		total, err := addNode(g, nm, "accum/Add", "Add", acc, gv)
		if err != nil {
			return nil, nil, err
		}
		if mean[p], err = addNode(g, nm, "accum/Mul", "Mul", total, inv); err != nil {
			return nil, nil, err
		}
		next, err := addNode(g, nm, "accum/clear", "Where", apply, zero, total)
		if err != nil {
			return nil, nil, err
		}
		next.Name = name + ".next"
		if !nm.Reserve(next.Name) {
			return nil, nil, fmt.Errorf("gradient accumulation: name %q is already used", next.Name)
		}
		ts.Updates[next.Name] = name
		a.next = append(a.next, next)
	}
	return a, mean, nil
}

// gate keeps an update's outputs (named for the Updates map) as their old
// values unless apply is set: each output of the update node is renamed and
// a Where(apply, new, old) takes its name.
func (a *accumulator) gate(g *graph.Graph, nm *graph.Namer, update *graph.Node, old []*graph.Value) ([]*graph.Value, error) {
	gated := make([]*graph.Value, len(update.Outputs))
	for k, o := range update.Outputs {
		name := o.Name
		o.Name = nm.Fresh("accum/" + name)
		w, err := addNode(g, nm, "accum/select", "Where", a.apply, o, old[k])
		if err != nil {
			return nil, err
		}
		w.Name = name
		gated[k] = w
	}
	return gated, nil
}

// addNode appends op(inputs) to g under a fresh name with prefix and returns
// its output.
func addNode(g *graph.Graph, nm *graph.Namer, prefix, op string, inputs ...*graph.Value) (*graph.Value, error) {
	n, err := graph.NewNode(nm.Fresh(prefix), op, nil, inputs...)
	if err != nil {
		return nil, fmt.Errorf("gradient accumulation: %w", err)
	}
	for _, o := range n.Outputs {
		o.Kind = graph.Intermediate
	}
	g.Nodes = append(g.Nodes, n)
	return n.Outputs[0], nil
}
