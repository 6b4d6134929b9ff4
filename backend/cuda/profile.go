package cuda

import (
	"fmt"
	"sort"

	"github.com/flashgraph/flashgraph/graph"
)

// NodeTime is the device time one node took in a profiled run.
type NodeTime struct {
	Node string  // node name ("" for the executor's own work: staging, updates)
	Op   string  // op type
	Ms   float64 // milliseconds between the events around the node's work
}

// Profiler is implemented by CUDA executables: Profile runs the graph once
// like Run, with an event recorded on the stream before and after every
// node, and returns each node's device time in graph order. Like Run it
// applies the updates (a training step's AdamW nodes may write the weights
// in place, so a profiled step is a real step); the copies of the updates
// that are not in place come after the last event and are not timed.
//
// The events are queued with the kernels in the same device requests as a
// plain Run, so the host keeps ahead of the GPU and the times are the GPU's
// own; a node whose kernels are shorter than a launch (a few microseconds)
// may still show the GPU waiting for the host.
type Profiler interface {
	Profile(feeds map[string]*graph.Tensor) ([]NodeTime, error)
}

// Profile implements Profiler.
func (x *executable) Profile(feeds map[string]*graph.Tensor) ([]NodeTime, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	d := x.b.dev
	d.RunMu.Lock()
	defer d.RunMu.Unlock()
	if err := x.start("profile", feeds); err != nil {
		return nil, err
	}
	events := make([]uintptr, len(x.steps)+1)
	defer func() {
		_ = d.Do(func() error {
			for _, e := range events {
				if e != 0 {
					d.EventDestroyRaw(e)
				}
			}
			return nil
		})
	}()
	err := d.Do(func() error {
		for i := range events {
			if err := d.EventCreateRaw(&events[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	record := func(i int) error {
		return d.EventRecordRaw(events[i])
	}
	for i := 0; i < len(x.steps); {
		st := &x.steps[i]
		if st.dev == nil {
			if err := d.Do(func() error { return record(i) }); err != nil {
				return nil, err
			}
			if err := st.run(); err != nil {
				return nil, fmt.Errorf("cuda: step %d: %w", i, err)
			}
			i++
			continue
		}
		j := i
		for j < len(x.steps) && x.steps[j].dev != nil {
			j++
		}
		err := d.Do(func() error {
			for k := i; k < j; k++ {
				if err := record(k); err != nil {
					return err
				}
				if err := x.steps[k].dev(); err != nil {
					return fmt.Errorf("step %d: %w", k, err)
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("cuda: %w", err)
		}
		i = j
	}
	times := make([]NodeTime, len(x.steps))
	err = d.Do(func() error {
		if err := record(len(x.steps)); err != nil {
			return err
		}
		if err := d.EventSynchronizeRaw(events[len(x.steps)]); err != nil {
			return err
		}
		for k, st := range x.steps {
			var ms float32
			if err := d.EventElapsedRaw(&ms, events[k], events[k+1]); err != nil {
				return err
			}
			times[k] = NodeTime{Ms: float64(ms)}
			if st.node != nil {
				times[k].Node, times[k].Op = st.node.Name, st.node.Op
			} else {
				times[k].Op = "(staging)"
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	if err := x.kernelFlag(); err != nil {
		return nil, err
	}
	if err := x.applyUpdates(); err != nil {
		return nil, err
	}
	return times, nil
}

// OpTime is the total device time of one op type in a profile.
type OpTime struct {
	Op    string
	Nodes int
	Ms    float64
}

// ByOp sums a profile per op type, largest first.
func ByOp(times []NodeTime) []OpTime {
	idx := map[string]int{}
	var out []OpTime
	for _, t := range times {
		i, ok := idx[t.Op]
		if !ok {
			i = len(out)
			idx[t.Op] = i
			out = append(out, OpTime{Op: t.Op})
		}
		out[i].Nodes++
		out[i].Ms += t.Ms
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Ms > out[b].Ms })
	return out
}
