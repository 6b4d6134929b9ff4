package cuda

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/flashgraph/flashgraph/graph"
)

// OpTraffic is what the nodes of one op type read and write in a run of a
// planned graph: the floor of their memory traffic.
type OpTraffic struct {
	Op string
	// Nodes counts the nodes that launch work: views and layouts folded
	// into their readers launch none and are left out.
	Nodes int
	// Bytes counts every operand of those nodes once per node, in its
	// device storage type: what a kernel that reads each input and writes
	// each output exactly once moves. Real kernels move at least this.
	Bytes int64
}

// Traffic returns the memory traffic of g, the graph p was planned for, per
// op type, most bytes first. For the memory-bound kernels (elementwise,
// norms, transposes, the optimizer) Bytes over the device's bandwidth is a
// lower bound on their time; for GEMMs and attention, compute-bound at
// these sizes, it is not the limit.
func (p *Plan) Traffic(g *graph.Graph) ([]OpTraffic, error) {
	by := map[string]*OpTraffic{}
	for _, n := range g.Nodes {
		launches := false
		for _, v := range n.Outputs {
			vp := p.values[v]
			if vp == nil {
				return nil, fmt.Errorf("traffic: %s's output %s is not in the plan (planned for another graph?)", n.Name, v.Name)
			}
			if vp.kind != placeFolded && (vp.kind != placeAlias || vp.inPlace) {
				launches = true
			}
		}
		if !launches {
			continue
		}
		t := by[n.Op]
		if t == nil {
			t = &OpTraffic{Op: n.Op}
			by[n.Op] = t
		}
		t.Nodes++
		seen := map[*graph.Value]bool{}
		for _, v := range append(slices.Clone(n.Inputs), n.Outputs...) {
			if v == nil || seen[v] {
				continue
			}
			seen[v] = true
			dt := v.Type.DType
			if vp := p.values[v]; vp != nil {
				dt = vp.storage
			}
			t.Bytes += bytesOf(dt, v.Type.Shape)
		}
	}
	out := make([]OpTraffic, 0, len(by))
	for _, t := range by {
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b OpTraffic) int {
		return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), cmp.Compare(a.Op, b.Op))
	})
	return out, nil
}

// ReportTraffic writes Traffic for people, with the time each op type's
// bytes take at tbps terabytes a second.
func (p *Plan) ReportTraffic(w io.Writer, g *graph.Graph, tbps float64) error {
	rows, err := p.Traffic(g)
	if err != nil {
		return err
	}
	var total int64
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "op\t nodes\t bytes\t ms at %g TB/s\t\n", tbps)
	for _, r := range rows {
		total += r.Bytes
		fmt.Fprintf(tw, "%s\t %d\t %s\t %.3f\t\n", r.Op, r.Nodes, FormatBytes(r.Bytes), float64(r.Bytes)/(tbps*1e12)*1e3)
	}
	fmt.Fprintf(tw, "total\t \t %s\t %.3f\t\n", FormatBytes(total), float64(total)/(tbps*1e12)*1e3)
	return tw.Flush()
}
