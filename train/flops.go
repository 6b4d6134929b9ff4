package train

import (
	"strings"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// FLOPs are the floating-point operations of one run of a graph, counted on
// its matrix products (MatMul, Gemm) and attention (FlashAttention and its
// gradient): the work that dominates a transformer's time.
type FLOPs struct {
	// Model is the work the model needs, the numerator of MFU (model FLOPs
	// utilisation, as in the PaLM paper and llm.c): each product once. Work
	// that a schedule adds to save memory is not model work: the backward's
	// recomputation of the attention scores (FlashAttentionGrad) and the
	// forward nodes that -recompute clones into the backward.
	Model float64
	// Hardware is what the device executes: Model plus the recomputation.
	// Time estimates use it.
	Hardware float64
}

// recomputeClonePrefix names the forward nodes passes.Recompute clones into
// the backward (TestModelFLOPsIgnoreRecompute keeps it in step).
const recomputeClonePrefix = "recompute/"

// GraphFLOPs counts g's matrix and attention FLOPs (a multiply-add is 2).
// It reads only shapes, so it is exact for the static graph and costs one
// walk over the nodes. On a training step it counts forward, backward and
// optimizer together; `train` divides it by the tokens of a step and
// `bench -train` uses the same count, so their MFU figures agree.
func GraphFLOPs(g *graph.Graph) FLOPs {
	var f FLOPs
	for _, n := range g.Nodes {
		var model, hw float64
		switch n.Op {
		case "MatMul", "Gemm":
			a := n.Inputs[0].Type.Shape
			if a.Rank() == 0 || len(n.Outputs) == 0 {
				continue
			}
			k := a[a.Rank()-1]
			if n.Op == "Gemm" && n.Attrs.Int("transA", 0) != 0 {
				k = a[0]
			}
			model = 2 * float64(n.Outputs[0].Type.Shape.Numel()) * float64(k)
			hw = model
		case "FlashAttention", "FlashAttentionGrad":
			if len(n.Inputs) < 3 {
				continue
			}
			// Grouped K/V heads do the products of as many heads as Q has.
			as, err := graph.AttentionShape(n.Inputs[0].Type.Shape, n.Inputs[1].Type.Shape, n.Inputs[2].Type.Shape)
			if err != nil {
				continue
			}
			bh, sq, sk, d := as.BH, as.Sq, as.Sk, as.D
			// One product of [sq,d]·[d,sk] per head, 2·sq·sk·d FLOPs; a
			// causal mask skips about half of them but MFU conventions count
			// the full product (so do PyTorch's and FLASH's TFLOP/s), and so
			// does this. Forward: Q·Kᵀ and P·V. Backward: dV, dP, dQ, dK,
			// plus Q·Kᵀ recomputed from the logsumexp (hardware only).
			prod := 2 * float64(bh) * float64(sq) * float64(sk) * float64(d)
			if n.Op == "FlashAttention" {
				model, hw = 2*prod, 2*prod
			} else {
				model, hw = 4*prod, 5*prod
			}
		default:
			continue
		}
		f.Hardware += hw
		if !strings.HasPrefix(n.Name, recomputeClonePrefix) {
			f.Model += model
		}
	}
	return f
}

// Peak is a device's dense peak rate for one compute type, in FLOP/s.
type Peak struct {
	Device string // as the device names itself, e.g. "NVIDIA H200"
	DType  graph.DType
	FLOPS  float64
	Source string // where the figure comes from
}

// peaks is the one table of peak rates MFU is measured against: dense (no
// sparsity) figures from the vendors' data sheets for the SXM parts. A
// float32 step runs cuBLAS in full float32 (no TF32; backend/cuda/driver/cublas.go),
// so its peak is the float32 (non-tensor-core) one. The CPU has no entry: its
// rate depends on the machine, and train prints its measured FLOP/s instead.
var peaks = []Peak{
	{"NVIDIA H200", graph.BFloat16, 989e12, "H200 SXM data sheet, BF16 tensor core, dense"},
	{"NVIDIA H200", graph.Float32, 67e12, "H200 SXM data sheet, FP32"},
	{"NVIDIA H200", graph.Float64, 34e12, "H200 SXM data sheet, FP64 (non-tensor)"},
	{"NVIDIA H100 80GB HBM3", graph.BFloat16, 989e12, "H100 SXM data sheet, BF16 tensor core, dense"},
	{"NVIDIA H100 80GB HBM3", graph.Float32, 67e12, "H100 SXM data sheet, FP32"},
	{"NVIDIA H100 80GB HBM3", graph.Float64, 34e12, "H100 SXM data sheet, FP64 (non-tensor)"},
}

// PeakFLOPS is the peak rate of device for compute type dt (0, false when
// the table has none: the CPU, or a GPU not listed). Names match exactly:
// variants of a part (NVL, PCIe) differ in clocks and so in peak.
func PeakFLOPS(device string, dt graph.DType) (Peak, bool) {
	for _, p := range peaks {
		if p.Device == device && p.DType == dt {
			return p, true
		}
	}
	return Peak{}, false
}

// MFU is the model FLOPs utilisation of a run that trains tokensPerSec
// tokens/s with modelFLOPsPerToken model FLOPs a token on a device of peak
// FLOP/s (0 when peak is unknown).
func MFU(modelFLOPsPerToken, tokensPerSec, peak float64) float64 {
	if peak <= 0 {
		return 0
	}
	return modelFLOPsPerToken * tokensPerSec / peak
}

// ComputeDType is the type be computes a model of type dt in: bf16 on the
// mixed-precision CUDA backend, the model's own type otherwise (what
// PeakFLOPS is looked up for).
func ComputeDType(be backend.Backend, dt graph.DType) graph.DType {
	if be.Name() == "cuda-bf16" {
		return graph.BFloat16
	}
	return dt
}
