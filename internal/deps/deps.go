// Package deps pins the project's chosen dependencies in go.mod until the
// packages that use them land; it has no code of its own.
package deps

import (
	_ "github.com/awalterschulze/gographviz"
	_ "github.com/ebitengine/purego"
	_ "github.com/schollz/progressbar/v3"
	_ "go4.org/unsafe/assume-no-moving-gc"
	_ "gonum.org/v1/gonum/blas/gonum"
	_ "gonum.org/v1/plot"
	_ "google.golang.org/protobuf/encoding/protowire"
	_ "gorgonia.org/gorgonia"
)
