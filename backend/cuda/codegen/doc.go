// Package codegen writes the CUDA C of flashgraph's generated kernels. It is
// one generator: a kernel skeleton (kernel.go: the source's layout, the
// signature and buffer parameters, C and compute types, vector width and
// 16-byte moves, loop headers, coordinates and offsets, the loop over a
// thread's vector) and the expression body (expr.go: an op-table expression
// rendered as C, ExprC and OpExpr, with the conversions to and from the
// buffers' types), around which each variant writes the loop of its shape:
// Elementwise (fused.go: a FusedElementwise body or one elementwise op over
// strided, broadcast operands), Rows (fused_rows.go: a body that reduces its
// last axis), Index (fused_index.go: a body with Slice, Concat or Transpose
// steps), and the row and column reductions (fused_reduce.go: RowReduce,
// ColReduce). Every variant is a Program whose Generate returns a Kernel:
// source, entry point, launch shape and buffer arguments, which the
// executor launches the same way.
//
// It renders source strings only: it knows a buffer by its address (vector
// loads need it aligned), element type and count (Buffer), and never the
// device. Package cuda compiles the source with NVRTC and launches it. Two
// goldens pin what is written here: every kernel of the tiny and small
// training steps (backend/cuda/testdata/kernel_sources.golden), and a sweep
// of every variant over its choices with each launch
// (testdata/sources.golden, TestGeneratorSourcesGolden).
package codegen
