// Package autodiff differentiates graphs: Gradients appends the backward of
// a scalar loss to a graph, in the same IR (one vector-Jacobian rule per op,
// gradRules in autodiff_rules.go), and TrainingGraph builds a whole training
// step from it: the loss, the gradients and one AdamW update per param, as
// one static graph. It knows only the IR; passes/recompute.go rewrites its
// training graphs.
package autodiff
