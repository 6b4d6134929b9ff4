package autodiff

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
)

// TrainOptions configures TrainingGraph.
type TrainOptions struct {
	// Loss names the scalar loss value; "" means "loss".
	Loss string
	// Params lists the params to train; nil means every param of the graph.
	Params []string
	// AdamW hyperparameters. Zero Beta1, Beta2 or Eps mean the defaults
	// (0.9, 0.95, 1e-8); WeightDecay is used as given (0: none).
	Beta1, Beta2, Eps, WeightDecay float64
	// DecayNorms also applies weight decay to params of rank 1 (norm gains
	// and biases). Off by default, as in GPT-2/LLaMA practice: decaying a
	// norm gain pulls it towards 0, which rescales the layer instead of
	// regularising it.
	DecayNorms bool
	// ClipNorm, when positive, clips the global gradient norm to it before
	// the update (clip.go); the step then also outputs the norm
	// (TrainStep.GradNorm).
	ClipNorm float64
	// Accum, above 1, accumulates the gradients of Accum runs (micro-batches)
	// and applies their mean on the run whose TrainApplyInput is true
	// (accum.go). With clipping, the mean is clipped.
	Accum int
	// World, above 1, makes the step data parallel over World ranks: the
	// final gradient of each param (after accumulation, before clipping) is
	// averaged over the ranks by a flashgraph.AllReduce, bucketed by
	// BucketBytes (0: DefaultBucketBytes; allreduce.go). 0 or 1 inserts
	// nothing: the graph is the single-process one.
	World       int
	BucketBytes int64
	// ShardOptimizer, with World > 1, makes the step ZeRO-1's for rank
	// Rank (zero.go): each bucket's averaged gradients are reduce-scattered,
	// the rank updates its part of the flat bucket with moments for that
	// part only, and the updated parts are all-gathered into every rank's
	// weights. Each rank's graph then differs in its part.
	ShardOptimizer bool
	Rank           int
}

// Default AdamW hyperparameters (those of the AdamW op's table entry).
const (
	DefaultBeta1 = 0.9
	DefaultBeta2 = 0.95
	DefaultEps   = 1e-8
)

// Names of the scalar inputs a training graph adds.
const (
	TrainLRInput   = "lr"
	TrainStepInput = "step"
)

// TrainStep is one optimizer step as a static graph.
type TrainStep struct {
	// Graph: the forward graph's inputs plus lr and step (scalars of
	// graph.LSEType of the params' dtype: float32, float64 for float64
	// graphs); forward nodes, backward nodes, one flashgraph.AdamW per param.
	// Outputs: the loss first, then for each param in Params order its new
	// value, new first moment and new second moment.
	Graph *graph.Graph
	// Loss, LR and Step name the loss output and the two scalar inputs.
	// Step is the 1-based step number t used for bias correction.
	Loss, LR, Step string
	// Params lists the trained params in order.
	Params []string
	// Grads maps each param to its gradient value inside Graph.
	Grads map[string]string
	// Moments maps each param to its first and second moment initializers
	// ("opt.m.<param>", "opt.v.<param>": zeros consts of the param's type;
	// with ShardOptimizer, of the rank's part of the param only, and only
	// for the params the rank holds a part of).
	Moments map[string][2]string
	// Shards, with ShardOptimizer, gives for each param the rank holds a
	// part of the part: elements [lo, hi) of the flattened param, which its
	// moments hold.
	Shards map[string][2]int
	// GradNorm names the global gradient norm output (before clipping),
	// "" unless TrainOptions.ClipNorm was set.
	GradNorm string
	// Apply names the bool input that applies an accumulated update,
	// "" unless TrainOptions.Accum > 1.
	Apply string
	// Updates maps each new-value output to the initializer it replaces,
	// for backend.Options{Updates: ...}: weights and moments then stay
	// inside the executable between steps, and Run returns only the loss.
	Updates map[string]string
}

// TrainingGraph builds one training step of fwd: the loss and its gradients
// (Gradients) and an AdamW update of every trained param. The result is an
// ordinary static graph: it verifies, formats, parses and hashes like any
// other. fwd is not changed.
func TrainingGraph(fwd *graph.Graph, opt TrainOptions) (*TrainStep, error) {
	if fwd == nil {
		return nil, fmt.Errorf("training graph: nil graph")
	}
	loss := opt.Loss
	if loss == "" {
		loss = "loss"
	}
	b1, b2, eps := opt.Beta1, opt.Beta2, opt.Eps
	if b1 == 0 {
		b1 = DefaultBeta1
	}
	if b2 == 0 {
		b2 = DefaultBeta2
	}
	if eps == 0 {
		eps = DefaultEps
	}
	params := opt.Params
	if params == nil {
		for _, p := range fwd.Params {
			params = append(params, p.Name)
		}
	}
	if len(params) == 0 {
		return nil, fmt.Errorf("training graph %s: no params to train", fwd.Name)
	}
	isParam := map[string]bool{}
	for _, p := range fwd.Params {
		isParam[p.Name] = true
	}
	for _, p := range params {
		if !isParam[p] {
			return nil, fmt.Errorf("training graph %s: %q is not a param", fwd.Name, p)
		}
	}

	g, grads, err := Gradients(fwd, loss, params)
	if err != nil {
		return nil, fmt.Errorf("training graph %s: %w", fwd.Name, err)
	}
	vals := g.Values()
	lossV := vals[loss]
	dt := vals[params[0]].Type.DType
	for _, p := range params {
		if vals[p].Type.DType != dt {
			return nil, fmt.Errorf("training graph %s: params have mixed dtypes (%s is %v, %s is %v)", fwd.Name, params[0], dt, p, vals[p].Type.DType)
		}
	}

	nm := graph.NewNamer(g)
	claim := func(name string) error {
		if !nm.Reserve(name) {
			return fmt.Errorf("training graph %s: name %q is already used", fwd.Name, name)
		}
		return nil
	}
	// lr and step are runtime inputs so that a schedule needs no recompile.
	sdt := graph.LSEType(dt)
	scalarIn := func(name string) (*graph.Value, error) {
		if err := claim(name); err != nil {
			return nil, err
		}
		v := &graph.Value{Name: name, Type: graph.TensorType{DType: sdt, Shape: graph.Shape{}}, Kind: graph.Input}
		g.Inputs = append(g.Inputs, v)
		return v, nil
	}
	lr, err := scalarIn(TrainLRInput)
	if err != nil {
		return nil, err
	}
	step, err := scalarIn(TrainStepInput)
	if err != nil {
		return nil, err
	}

	ts := &TrainStep{
		Loss: loss, LR: lr.Name, Step: step.Name, Params: append([]string(nil), params...),
		Grads: grads, Moments: map[string][2]string{}, Updates: map[string]string{},
	}
	outs := []*graph.Value{lossV}
	gradOf := func(p string) *graph.Value { return vals[grads[p]] }
	var acc *accumulator
	if opt.Accum > 1 {
		a, mean, err := accumulate(g, nm, ts, vals, grads, params, opt.Accum)
		if err != nil {
			return nil, fmt.Errorf("training graph %s: %w", fwd.Name, err)
		}
		acc, gradOf = a, func(p string) *graph.Value { return mean[p] }
		ts.Apply = TrainApplyInput
	}
	if opt.World < 0 {
		return nil, fmt.Errorf("training graph %s: world size must be at least 1, got %d", fwd.Name, opt.World)
	}
	if opt.ShardOptimizer && opt.World > 1 {
		switch {
		case opt.ClipNorm != 0:
			return nil, fmt.Errorf("training graph %s: gradient clipping with a sharded optimizer is not supported yet (each rank holds a part of the gradients; the norm needs one more all-reduce)", fwd.Name)
		case acc != nil:
			return nil, fmt.Errorf("training graph %s: gradient accumulation with a sharded optimizer is not supported yet", fwd.Name)
		}
		outs, err := shardedUpdate(g, nm, claim, ts, vals, gradOf, params, opt, lr, step, b1, b2, eps)
		if err != nil {
			return nil, fmt.Errorf("training graph %s: %w", fwd.Name, err)
		}
		g.Outputs = append([]*graph.Value{lossV}, outs...)
		if err := graph.Verify(g); err != nil {
			return nil, fmt.Errorf("training graph %s: %w", fwd.Name, err)
		}
		ts.Graph = g
		return ts, nil
	}
	if opt.World > 1 {
		reduced, err := allReduceGradients(g, nm, gradOf, params, opt.World, opt.BucketBytes)
		if err != nil {
			return nil, fmt.Errorf("training graph %s: %w", fwd.Name, err)
		}
		gradOf = func(p string) *graph.Value { return reduced[p] }
	}
	var normOut *graph.Value
	if opt.ClipNorm != 0 {
		clipped, norm, err := clipGradients(g, nm, gradOf, params, opt.ClipNorm)
		if err != nil {
			return nil, fmt.Errorf("training graph %s: %w", fwd.Name, err)
		}
		gradOf = func(p string) *graph.Value { return clipped[p] }
		normOut, ts.GradNorm = norm, norm.Name
	}
	for _, p := range params {
		pv := vals[p]
		mom := [2]*graph.Value{}
		for k, prefix := range []string{"opt.m.", "opt.v."} {
			name := prefix + p
			if err := claim(name); err != nil {
				return nil, err
			}
			init := graph.Zeros()
			mom[k] = &graph.Value{Name: name, Type: graph.TensorType{DType: pv.Type.DType, Shape: pv.Type.Shape.Clone()}, Kind: graph.Const, Init: &init}
			g.Consts = append(g.Consts, mom[k])
		}
		wd := opt.WeightDecay
		if pv.Type.Shape.Rank() < 2 && !opt.DecayNorms {
			wd = 0
		}
		attrs := graph.Attrs{
			"beta1": graph.Float(b1), "beta2": graph.Float(b2), "eps": graph.Float(eps), "weight_decay": graph.Float(wd),
		}
		n, err := graph.NewNode(nm.Fresh("opt/"+p), "AdamW", attrs, pv, gradOf(p), mom[0], mom[1], lr, step)
		if err != nil {
			return nil, fmt.Errorf("training graph %s: AdamW for %s: %w", fwd.Name, p, err)
		}
		// Readable output names: the checkpoint name with ".next".
		for k, target := range []string{p, mom[0].Name, mom[1].Name} {
			name := target + ".next"
			if err := claim(name); err != nil {
				return nil, err
			}
			n.Outputs[k].Name = name
			ts.Updates[name] = target
		}
		g.Nodes = append(g.Nodes, n)
		newVals := n.Outputs
		if acc != nil {
			if newVals, err = acc.gate(g, nm, n, []*graph.Value{pv, mom[0], mom[1]}); err != nil {
				return nil, fmt.Errorf("training graph %s: %w", fwd.Name, err)
			}
		}
		outs = append(outs, newVals...)
		ts.Moments[p] = [2]string{mom[0].Name, mom[1].Name}
	}
	if normOut != nil {
		outs = append(outs, normOut)
	}
	if acc != nil {
		outs = append(outs, acc.next...)
	}
	g.Outputs = outs
	if err := graph.Verify(g); err != nil {
		return nil, fmt.Errorf("training graph %s: %w", fwd.Name, err)
	}
	ts.Graph = g
	return ts, nil
}
