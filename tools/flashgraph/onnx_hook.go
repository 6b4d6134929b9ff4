package main

import (
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx"
)

// importONNX reads an .onnx model.
func importONNX(path string) (*graph.Graph, error) { return onnx.Import(path) }

// exportONNX writes g as an .onnx model.
func exportONNX(g *graph.Graph, path string) error { return onnx.ExportFile(g, path) }
