package main

import (
	"flag"
	"fmt"

	"github.com/flashgraph/flashgraph/train"
)

// recomputeFlag is -recompute: none, cheap or full. It is a boolean flag
// too, so that -recompute alone still means full, as when it was a switch
// (flag.Value with IsBoolFlag: "-recompute" sets "true").
type recomputeFlag struct{ mode train.RecomputeMode }

func (f *recomputeFlag) String() string {
	if f == nil {
		return "none"
	}
	return f.mode.String()
}

func (f *recomputeFlag) Set(s string) error {
	m, err := train.ParseRecomputeMode(s)
	if err != nil {
		return err
	}
	f.mode = m
	return nil
}

func (f *recomputeFlag) IsBoolFlag() bool { return true }

// recomputeHelp says what each mode keeps; train and bench -train share it.
const recomputeHelp = "-recompute=none|cheap|full: what the backward recomputes instead of keeping from the forward: none; cheap (norms and elementwise ops, GEMM and attention outputs kept); full (each layer's whole forward; -recompute alone). Less memory (see compile -plan), more arithmetic; the same bits on the CPU"

// addRecomputeFlag defines -recompute on fs (default none).
func addRecomputeFlag(fs *flag.FlagSet) *recomputeFlag {
	f := &recomputeFlag{}
	fs.Var(f, "recompute", recomputeHelp)
	return f
}

// recomputeMeaning says, for train -explain, what each mode keeps.
var recomputeMeaning = map[train.RecomputeMode]string{
	train.RecomputeNone:  "none (the backward reads every activation the forward saved)",
	train.RecomputeCheap: "cheap (each layer's norms and elementwise ops are recomputed in the backward; GEMM and attention outputs stay saved)",
	train.RecomputeFull:  "full (each layer's whole forward is recomputed in the backward from the layer's input)",
}

// recomputeNote is what the summary adds to the peak activations of a
// recomputing run.
func recomputeNote(m train.RecomputeMode) string {
	if !m.On() {
		return ""
	}
	return ", with -recompute " + m.String()
}

// checkRecomputeArgs refuses "-recompute cheap": a boolean flag takes no
// separate value, so the flag package would read -recompute alone (full)
// and then cheap as a positional argument (train's FILE). The value must be
// attached: -recompute=cheap.
func checkRecomputeArgs(args []string) error {
	for i, a := range args {
		if a == "--" {
			return nil
		}
		if (a == "-recompute" || a == "--recompute") && i+1 < len(args) {
			if _, err := train.ParseRecomputeMode(args[i+1]); err == nil && args[i+1] != "" {
				return fmt.Errorf("%s %s: write %s=%s (-recompute alone means full, and a value after a space would be read as an argument)", a, args[i+1], a, args[i+1])
			}
		}
	}
	return nil
}
