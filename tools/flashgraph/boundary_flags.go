package main

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx"
)

// -dims, -sequence and -absent (compile, dot, run): what an ONNX model leaves
// open about its graph inputs, which a static graph needs fixed. -dims sizes
// symbolic dimensions (as train's -dims does). A graph input of sequence or
// optional type becomes tensors at the import (the onnx package's
// boundary.go): a sequence x of n tensors is the inputs x.0 ... x.(n-1),
// whose shapes the import needs; an optional is its tensor, or nothing.

// seqFlag collects -sequence NAME=SHAPE,SHAPE,...: each shape is its sizes
// joined by x (3x4), "scalar" for a scalar; NAME= is an empty sequence.
type seqFlag map[string][]graph.Shape

func (s seqFlag) String() string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(s)) {
		var shapes []string
		for _, sh := range s[name] {
			shapes = append(shapes, formatSeqShape(sh))
		}
		out = append(out, name+"="+strings.Join(shapes, ","))
	}
	return strings.Join(out, " ")
}

func formatSeqShape(sh graph.Shape) string {
	if len(sh) == 0 {
		return "scalar"
	}
	parts := make([]string, len(sh))
	for i, d := range sh {
		parts[i] = strconv.Itoa(d)
	}
	return strings.Join(parts, "x")
}

func (s seqFlag) Set(v string) error {
	name, list, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return fmt.Errorf("want NAME=SHAPE,SHAPE,... (a shape as 3x4, or scalar), got %q", v)
	}
	if _, dup := s[name]; dup {
		return fmt.Errorf("sequence %s given twice", name)
	}
	shapes := []graph.Shape{}
	if list != "" {
		for _, f := range strings.Split(list, ",") {
			sh, err := parseSeqShape(f)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			shapes = append(shapes, sh)
		}
	}
	s[name] = shapes
	return nil
}

// parseSeqShape reads 3x4 (or scalar) as a shape.
func parseSeqShape(f string) (graph.Shape, error) {
	f = strings.TrimSpace(f)
	if f == "scalar" {
		return graph.Shape{}, nil
	}
	var sh graph.Shape
	for _, d := range strings.Split(f, "x") {
		n, err := strconv.Atoi(d)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("shape %q: want sizes joined by x (3x4), or scalar", f)
		}
		sh = append(sh, n)
	}
	if err := sh.Check(); err != nil {
		return nil, fmt.Errorf("shape %q: %w", f, err)
	}
	return sh, nil
}

// absentFlag collects -absent NAME.
type absentFlag map[string]bool

func (a absentFlag) String() string {
	return strings.Join(slices.Sorted(maps.Keys(a)), ",")
}

func (a absentFlag) Set(v string) error {
	if v == "" {
		return errors.New("want the name of an optional graph input")
	}
	a[v] = true
	return nil
}

// boundaryFlags are a command's -dims, -sequence and -absent.
type boundaryFlags struct {
	dims   dimsFlag
	seqs   seqFlag
	absent absentFlag
}

// addBoundaryFlags adds -sequence and -absent to the command of mf, whose
// load then imports an ONNX FILE with them.
func addBoundaryFlags(fs *flag.FlagSet, mf *modelFlags) {
	b := &boundaryFlags{dims: dimsFlag{}, seqs: seqFlag{}, absent: absentFlag{}}
	fs.Var(b.dims, "dims", "with an .onnx FILE: NAME=N sizes its symbolic dimension NAME (dim_param: batch, sequence_length, N, ...); comma-separated or repeated")
	fs.Var(b.seqs, "sequence", "NAME=SHAPE,SHAPE,...: an ONNX FILE's graph input NAME, a sequence of tensors, holds tensors of these shapes (3x4, or scalar; NAME= for none); it becomes the inputs NAME.0, NAME.1, ...; repeatable")
	fs.Var(b.absent, "absent", "NAME: an ONNX FILE's graph input NAME, an optional, holds no value (without it an optional input holds one, an input of its name); repeatable")
	mf.boundary = b
}

// given reports whether any of the flags was given.
func (b *boundaryFlags) given() bool {
	return b != nil && (len(b.dims) > 0 || len(b.seqs) > 0 || len(b.absent) > 0)
}

// apply puts the flags into an ONNX import's options.
func (b *boundaryFlags) apply(o *onnx.Options) {
	if b == nil {
		return
	}
	o.Dims, o.Sequences, o.Absent = b.dims, b.seqs, b.absent
}

// explainImportError says which flag gives what the import of file asked
// for: a sequence input's shapes, a symbolic dimension's size.
func explainImportError(file string, err error) error {
	var se *onnx.SequenceError
	switch {
	case errors.As(err, &se):
		return fmt.Errorf("%s: graph input %s is a sequence of tensors: give the shapes of its elements with -sequence %s=SHAPE,SHAPE,... (for example -sequence %s=3x4,2x4; it becomes the inputs %s, %s, ...)",
			file, se.Input, se.Input, se.Input, onnx.SequenceElem(se.Input, 0), onnx.SequenceElem(se.Input, 1))
	case err != nil && strings.Contains(err.Error(), "Options.Dims"):
		return fmt.Errorf("%w (-dims NAME=N)", err)
	}
	return err
}
