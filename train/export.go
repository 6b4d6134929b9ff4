package train

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// Trained is the model a checkpoint holds: what it was trained from and its
// trained weights, for export.
type Trained struct {
	Path   string // the checkpoint file
	Dir    string // its folder (where a graph's source files are)
	Step   int64
	Config model.Config // the built-in model's config, or a graph's description
	Spec   *GraphSpec   // nil: the built-in model of Config
	// Weights are the trained params (the checkpoint without the
	// optimizer's moments).
	Weights map[string]*graph.Tensor
}

// LoadTrained reads the newest checkpoint of a checkpoint folder, or the
// checkpoint file path names.
func LoadTrained(path string) (*Trained, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	dir := path
	if st.IsDir() {
		p, _, err := checkpoint.LatestCheckpoint(path)
		if err != nil {
			return nil, fmt.Errorf("checkpoint folder %s: %w", path, err)
		}
		if p == "" {
			return nil, fmt.Errorf("checkpoint folder %s holds no checkpoint (step-*.safetensors)", path)
		}
		path = p
	} else {
		dir = filepath.Dir(path)
	}
	ts, step, err := checkpoint.LoadCheckpoint(path)
	if err != nil {
		return nil, err
	}
	t := &Trained{Path: path, Dir: dir, Step: step, Weights: map[string]*graph.Tensor{}}
	if err := json.Unmarshal([]byte(ts.Metadata[checkpoint.MetaConfig]), &t.Config); err != nil {
		return nil, fmt.Errorf("checkpoint %s: config: %w", path, err)
	}
	if t.Spec, err = sourceSpec(ts.Metadata); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	for name, w := range ts.Tensors {
		if !strings.HasPrefix(name, "opt.m.") && !strings.HasPrefix(name, "opt.v.") {
			t.Weights[name] = w
		}
	}
	return t, nil
}

// Name is the trained model's name for messages.
func (t *Trained) Name() string {
	if t.Spec == nil {
		return t.Config.Name
	}
	return fmt.Sprintf("%s (trained from %s)", t.Config.Name, t.Spec.File)
}

// BuiltInForward is the built-in model's forward graph (unfused) with the
// trained weights; an error for a graph-trained checkpoint.
func (t *Trained) BuiltInForward() (*graph.Graph, error) {
	if t.Spec != nil {
		return nil, fmt.Errorf("checkpoint %s is of a model trained from %s, not of a built-in config", t.Path, t.Spec.File)
	}
	g, err := model.Build(t.Config)
	if err != nil {
		return nil, err
	}
	return WithWeights(g, t.Weights)
}

// WithWeights returns g with the params named in w set to w's values (as
// literals); g is not changed. Every tensor of w must be a param of g of
// the same type: a checkpoint of another model is refused, naming what does
// not fit. Params of g that w lacks (frozen ones) keep their values.
func WithWeights(g *graph.Graph, w map[string]*graph.Tensor) (*graph.Graph, error) {
	out := g.Clone()
	params := map[string]*graph.Value{}
	for _, p := range out.Params {
		params[p.Name] = p
	}
	names := make([]string, 0, len(w))
	for n := range w {
		names = append(names, n)
	}
	sort.Strings(names)
	var problems []string
	for _, n := range names {
		p, ok := params[n]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s is not a param of the model", n))
		case !p.Type.Equal(w[n].Type()):
			problems = append(problems, fmt.Sprintf("%s is %v in the checkpoint, %v in the model", n, w[n].Type(), p.Type))
		}
	}
	if len(problems) > 0 {
		const show = 6
		msg := strings.Join(problems[:min(show, len(problems))], "; ")
		if len(problems) > show {
			msg += fmt.Sprintf("; and %d more", len(problems)-show)
		}
		return nil, fmt.Errorf("the checkpoint is of another model: %s", msg)
	}
	for _, n := range names {
		t := w[n]
		data := make([]float64, t.Len())
		for i := range data {
			data[i] = t.At(i)
		}
		init := graph.Literal(data...)
		params[n].Init = &init
	}
	return out, nil
}
