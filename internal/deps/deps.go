// Package deps imports every direct requirement of go.mod, so that `go mod
// tidy` keeps them direct. All but one are used by the packages themselves;
// go4.org/unsafe/assume-no-moving-gc is used only by gorgonia, and is required
// here at a version newer than gorgonia's own, which refuses to run on the
// current Go release. It has no code of its own.
package deps

import (
	_ "github.com/awalterschulze/gographviz"
	_ "github.com/ebitengine/purego"
	_ "github.com/schollz/progressbar/v3"
	_ "go4.org/unsafe/assume-no-moving-gc"
	_ "golang.org/x/image/font/basicfont"
	_ "golang.org/x/sys/cpu"
	_ "gonum.org/v1/gonum/blas/gonum"
	_ "gonum.org/v1/plot"
	_ "google.golang.org/protobuf/encoding/protowire"
	_ "gorgonia.org/gorgonia"
)
