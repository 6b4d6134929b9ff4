package graph

import "fmt"

// MatMulShape is ONNX/numpy matmul shape inference: rank-1 operands are
// promoted and the batch dimensions broadcast.
func MatMulShape(a, b Shape) (Shape, error) {
	if a.Rank() == 0 || b.Rank() == 0 {
		return nil, fmt.Errorf("MatMul operands must have rank >= 1, got %v and %v", a, b)
	}
	aa, bb := a, b
	if a.Rank() == 1 {
		aa = Shape{1, a[0]}
	}
	if b.Rank() == 1 {
		bb = Shape{b[0], 1}
	}
	m, k := aa[aa.Rank()-2], aa[aa.Rank()-1]
	k2, n := bb[bb.Rank()-2], bb[bb.Rank()-1]
	if k != k2 {
		return nil, fmt.Errorf("MatMul inner dimensions differ: %v @ %v (%d vs %d)", a, b, k, k2)
	}
	batch, err := Broadcast(aa[:aa.Rank()-2], bb[:bb.Rank()-2])
	if err != nil {
		return nil, fmt.Errorf("MatMul batch dims: %w", err)
	}
	out := append(batch.Clone(), m, n)
	if a.Rank() == 1 {
		out = append(out[:len(out)-2], n)
	}
	if b.Rank() == 1 {
		out = out[:len(out)-1]
	}
	return out, nil
}

func init() {
	register(&OpSpec{
		Name: "MatMul", Doc: "A @ B with numpy batching and broadcasting",
		Inputs: []string{"A", "B"}, Outputs: []string{"Y"}, Eval: evalMatMul,
		Infer: func(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
			if err := sameFloat(in); err != nil {
				return nil, err
			}
			if in[0].DType != in[1].DType {
				return nil, fmt.Errorf("dtypes differ: %v vs %v", in[0].DType, in[1].DType)
			}
			s, err := MatMulShape(in[0].Shape, in[1].Shape)
			if err != nil {
				return nil, err
			}
			return []TensorType{{in[0].DType, s}}, nil
		},
	})
	register(&OpSpec{
		Name: "Gemm", Doc: "alpha·op(A)·op(B) + beta·C for 2-D A, B",
		Inputs: []string{"A", "B", "C?"}, Outputs: []string{"Y"}, Eval: evalGemm,
		Attrs: []AttrSpec{
			{Name: "alpha", Kind: AttrFloat, Default: Float(1)}, {Name: "beta", Kind: AttrFloat, Default: Float(1)},
			{Name: "transA", Kind: AttrInt, Default: Int(0)}, {Name: "transB", Kind: AttrInt, Default: Int(0)},
		},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			if in[0].Shape.Rank() != 2 || in[1].Shape.Rank() != 2 {
				return nil, fmt.Errorf("A and B must be 2-D, got %v and %v", in[0].Shape, in[1].Shape)
			}
			m, k := in[0].Shape[0], in[0].Shape[1]
			if a.Int("transA", 0) != 0 {
				m, k = k, m
			}
			k2, n := in[1].Shape[0], in[1].Shape[1]
			if a.Int("transB", 0) != 0 {
				k2, n = n, k2
			}
			if k != k2 {
				return nil, fmt.Errorf("inner dimensions differ: %d vs %d", k, k2)
			}
			if in[2] != nil {
				if _, err := Broadcast(in[2].Shape, Shape{m, n}); err != nil {
					return nil, fmt.Errorf("C: %w", err)
				}
			}
			return []TensorType{{in[0].DType, Shape{m, n}}}, nil
		},
	})
}
