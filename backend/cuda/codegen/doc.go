// Package codegen writes the CUDA C of flashgraph's generated kernels: an
// op-table expression rendered as C (ExprC, OpExpr), and the programs the
// CUDA executor compiles per node: Elementwise (a FusedElementwise body or
// one elementwise op over strided, broadcast operands), Rows (a body that
// reduces its last axis), Index (a body with Slice, Concat or Transpose
// steps), and the row and column reductions (RowReduce,
// ColReduce).
//
// It renders source strings only: it knows a buffer by its address (vector
// loads need it aligned), element type and count (Buffer), and never the
// device. Package cuda compiles the source with NVRTC and launches it; the
// golden of every kernel of the tiny and small training steps
// (backend/cuda/testdata/kernel_sources.golden) pins what is written here.
package codegen
