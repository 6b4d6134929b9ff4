package main

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
)

// importONNX reads an .onnx model.
func importONNX(path string) (*graph.Graph, error) {
	return nil, fmt.Errorf("%s: ONNX import is not available in this build yet", path)
}
