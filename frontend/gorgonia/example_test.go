package gorgonia_test

import (
	"fmt"
	"log"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	fg "github.com/flashgraph/flashgraph/frontend/gorgonia"
	"github.com/flashgraph/flashgraph/graph"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// A gorgonia model (a linear layer with a ReLU) imported, printed and run
// on flashgraph's CPU backend.
func Example() {
	g := G.NewGraph()
	x := G.NewMatrix(g, G.Float64, G.WithShape(2, 3), G.WithName("x"))
	w := G.NewMatrix(g, G.Float64, G.WithShape(3, 2), G.WithName("w"),
		G.WithValue(tensor.New(tensor.WithShape(3, 2), tensor.WithBacking([]float64{1, 0, 0, 1, 1, 1}))))
	y := G.Must(G.Rectify(G.Must(G.Mul(x, w))))

	// x has no value: it becomes the graph input; w's value makes it a param.
	m, names, err := fg.ImportWithNames(g, []*G.Node{y}, fg.Options{Name: "linear_relu"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(graph.Format(m))

	// Bind x in gorgonia, then run the import with the bound values.
	if err := G.Let(x, tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float64{1, -2, 3, -4, 5, -6}))); err != nil {
		log.Fatal(err)
	}
	feeds, err := fg.Feeds(m, names)
	if err != nil {
		log.Fatal(err)
	}
	exe, err := cpu.New().Compile(m, backend.Options{})
	if err != nil {
		log.Fatal(err)
	}
	out, err := exe.Run(feeds)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(names[y], out[names[y]].F64)
	// Output:
	// flashgraph 1
	// graph linear_relu
	// input x: float64[2,3]
	// param w: float64[3,2] = literal(1, 0, 0, 1, 1, 1)
	// node MatMul_0 = MatMul(x, w) -> MatMul_0: float64[2,2]
	// node Relu_0 = Relu(MatMul_0) -> Relu_0: float64[2,2]
	// output Relu_0
	// Relu_0 [4 1 0 0]
}
