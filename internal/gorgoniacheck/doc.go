// Package gorgoniacheck checks flashgraph's autodiff against an independent
// implementation: the same transformer, written out in gorgonia.org/gorgonia
// with gorgonia's own symbolic backprop, must give the same loss and the
// same gradient for every parameter (float64, 1e-9 relative). It has only
// tests; importing gorgonia needs go.mod's pin of
// go4.org/unsafe/assume-no-moving-gc.
package gorgoniacheck
