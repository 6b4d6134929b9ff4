package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/flashgraph/flashgraph/autodiff"
	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/passes"
	"github.com/flashgraph/flashgraph/train"
)

// TableShape is one attention problem of the table.
type TableShape struct {
	S, D int
	// KVHeads is the number of K/V heads, 0 for H (multi-head attention);
	// a shape whose H_kv equals its H has 0 here, so that MHA is one key.
	KVHeads int
	Causal  bool
}

// attnFLOPs is the forward FLOP count of attention over [B, H, S, S] scores
// with head dim D: two GEMMs of 2·S·S·D each per head (4·B·H·S²·D), halved
// when causal because half the scores are masked. The backward does five
// such GEMMs to the forward's two, hence 2.5× (the convention FlashAttention
// and PyTorch's benchmarks use).
func attnFLOPs(b, h, s, d int, causal bool) (fwd, bwd float64) {
	fwd = 4 * float64(b) * float64(h) * float64(s) * float64(s) * float64(d)
	if causal {
		fwd /= 2
	}
	return fwd, 2.5 * fwd
}

// tflops is flops done in ms milliseconds, in TFLOP/s (NaN when ms is not positive).
func tflops(flops, ms float64) float64 {
	if !(ms > 0) {
		return math.NaN()
	}
	return flops / (ms * 1e-3) / 1e12
}

// benchRow is one JSON line of -json: one implementation on one shape (kind
// "attention"), or one training step (kind "train_memory"). Pointers are
// null where a number does not exist (a path that did not run).
type benchRow struct {
	Kind   string `json:"kind"`
	Impl   string `json:"impl"` // fused, composed, torch-flash, torch-cudnn, ...; train: fused, unfused
	B      int    `json:"B"`
	H      int    `json:"H,omitempty"`
	HKV    int    `json:"H_kv,omitempty"` // K/V heads when not H (grouped-query attention); absent for MHA
	Sq     int    `json:"Sq,omitempty"`   // attention_decode: query rows (S is the key count)
	S      int    `json:"S"`
	D      int    `json:"D,omitempty"`
	Causal bool   `json:"causal"`
	DType  string `json:"dtype"`

	FwdMs     *float64 `json:"fwd_ms,omitempty"`
	BwdMs     *float64 `json:"bwd_ms,omitempty"`
	FwdTFLOPs *float64 `json:"fwd_tflops,omitempty"`
	BwdTFLOPs *float64 `json:"bwd_tflops,omitempty"`
	// PeakMemBytes: measured device memory (ours: the peak of our own
	// allocations, cuda.Device.PeakAllocatedBytes, over what was allocated
	// before; torch: max_memory_allocated), inputs, outputs and gradients
	// included. Before 2026-12-03 evening ours was cuMemGetInfo's difference.
	PeakMemBytes *int64 `json:"peak_mem_bytes"`
	// PlannedMemBytes: the same by accounting (ours only).
	PlannedMemBytes *int64 `json:"planned_mem_bytes,omitempty"`
	// MaxAbsErr and MaxAbsRef (fused rows): max |fused − composed| and max
	// |composed| over o, dq, dk, dv.
	MaxAbsErr map[string]float64 `json:"max_abs_err,omitempty"`
	MaxAbsRef map[string]float64 `json:"max_abs_ref,omitempty"`

	StepMs *float64 `json:"step_ms,omitempty"` // train_memory
	Loss   *float64 `json:"loss,omitempty"`    // train_memory

	// FwdMsRounds and BwdMsRounds: each round's time when -rounds > 1
	// (fwd_ms and bwd_ms are their medians).
	FwdMsRounds []float64 `json:"fwd_ms_rounds,omitempty"`
	BwdMsRounds []float64 `json:"bwd_ms_rounds,omitempty"`

	Iters int     `json:"iters,omitempty"`
	GPU   string  `json:"gpu,omitempty"`
	Torch string  `json:"torch,omitempty"`
	Error *string `json:"error"`
}

// setTFLOPs sets an attention row's TFLOP/s from its times (attnFLOPs over
// FwdMs, BwdMs; nil where a time is).
func (r *benchRow) setTFLOPs() {
	f, b := attnFLOPs(r.B, r.H, r.S, r.D, r.Causal)
	r.FwdTFLOPs, r.BwdTFLOPs = nil, nil
	if r.FwdMs != nil {
		r.FwdTFLOPs = fptr(tflops(f, *r.FwdMs))
	}
	if r.BwdMs != nil {
		r.BwdTFLOPs = fptr(tflops(b, *r.BwdMs))
	}
}

func fptr(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}
func iptr(v int64) *int64   { return &v }
func sptr(s string) *string { return &s }

// torchRecord is one line of tools/reference/sdpa_bench.py's output (see
// its header for the schema).
type torchRecord struct {
	Backend      string   `json:"backend"`
	B            int      `json:"B"`
	H            int      `json:"H"`
	HKV          int      `json:"H_kv"` // absent from scripts before -kv-heads: H
	S            int      `json:"S"`
	D            int      `json:"D"`
	Causal       bool     `json:"causal"`
	DType        string   `json:"dtype"`
	FwdMs        *float64 `json:"fwd_ms"`
	BwdMs        *float64 `json:"bwd_ms"`
	PeakMemBytes *int64   `json:"peak_mem_bytes"`
	Iters        int      `json:"iters"`
	GPU          string   `json:"gpu"`
	Torch        string   `json:"torch"`
	Error        *string  `json:"error"`
}

// parseTorchRows reads sdpa_bench.py's JSON lines into rows ("torch-<backend>").
// Blank lines are skipped; a malformed line is an error naming it.
func parseTorchRows(r io.Reader) ([]benchRow, error) {
	var rows []benchRow
	err := readJSONLines(r, func(line int, rec torchRecord) error {
		if rec.Backend == "" || rec.S <= 0 || rec.D <= 0 || rec.B <= 0 || rec.H <= 0 {
			return fmt.Errorf("PyTorch output line %d: missing backend or shape", line)
		}
		if rec.HKV < 0 || (rec.HKV > 0 && rec.H%rec.HKV != 0) {
			return fmt.Errorf("PyTorch output line %d: H_kv %d does not divide H %d", line, rec.HKV, rec.H)
		}
		if rec.HKV == rec.H {
			rec.HKV = 0 // multi-head attention: the same key as our MHA rows
		}
		row := benchRow{Kind: "attention", Impl: "torch-" + rec.Backend, B: rec.B, H: rec.H, HKV: rec.HKV, S: rec.S, D: rec.D,
			Causal: rec.Causal, DType: rec.DType, FwdMs: rec.FwdMs, BwdMs: rec.BwdMs, PeakMemBytes: rec.PeakMemBytes,
			Iters: rec.Iters, GPU: rec.GPU, Torch: rec.Torch, Error: rec.Error}
		// TFLOP/s recomputed with our formula, so every column divides the same count.
		row.setTFLOPs()
		rows = append(rows, row)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return rows, nil
}

// readJSONLines decodes each non-blank line of r as a T and hands it to
// each with its line number; a malformed line, or an error from each, stops
// the read and is returned.
func readJSONLines[T any](r io.Reader, each func(line int, rec T) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		var rec T
		if err := json.Unmarshal([]byte(text), &rec); err != nil {
			return fmt.Errorf("PyTorch output line %d: %w", line, err)
		}
		if err := each(line, rec); err != nil {
			return err
		}
	}
	return sc.Err()
}

// attnRows turns one of our results into its fused and composed rows.
func attnRows(r *AttnResult, iters int, gpu string) []benchRow {
	sh := r.Shape
	f, b := attnFLOPs(sh.B, sh.H, sh.S, sh.D, sh.Causal)
	mk := func(impl string, t AttnTiming) benchRow {
		row := benchRow{Kind: "attention", Impl: impl, B: sh.B, H: sh.H, S: sh.S, D: sh.D, Causal: sh.Causal,
			DType: "bfloat16", Iters: iters, GPU: gpu}
		if sh.Grouped() {
			row.HKV = sh.KV()
		}
		if t.PlannedBytes > 0 {
			row.PlannedMemBytes = iptr(t.PlannedBytes)
		}
		if t.Err != "" {
			row.Error = sptr(t.Err)
			return row
		}
		row.FwdMs, row.BwdMs = fptr(t.FwdMs), fptr(t.BwdMs)
		row.FwdTFLOPs, row.BwdTFLOPs = fptr(tflops(f, t.FwdMs)), fptr(tflops(b, t.BwdMs))
		row.PeakMemBytes = iptr(t.MeasuredBytes)
		return row
	}
	fused := mk("fused", r.Fused)
	if r.Checked {
		fused.MaxAbsErr, fused.MaxAbsRef = map[string]float64{}, map[string]float64{}
		for i, name := range []string{"o", "dq", "dk", "dv"} {
			fused.MaxAbsErr[name] = jsonSafe(r.MaxAbsErr[i])
			fused.MaxAbsRef[name] = r.MaxAbsRef[i]
		}
	}
	return []benchRow{fused, mk("composed", r.Composed)}
}

// jsonSafe maps the +Inf that marks a NaN output to a large finite number
// (JSON has no Inf).
func jsonSafe(v float64) float64 {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return math.MaxFloat64
	}
	return v
}

type attnKey struct {
	impl      string
	s, d, hkv int // hkv: 0 for multi-head attention
	causal    bool
}

// tableColumns are the implementations of the table, in column order.
var tableColumns = []string{"fused", "composed", "torch-flash", "torch-cudnn", "torch-efficient"}

// printAttnTable writes the one table: TFLOP/s per implementation, fused's
// ratios to PyTorch FLASH, cuDNN and our composed path (forward, backward,
// forward+backward by total time), measured peak memory and the fused−composed
// error. Rows are shapes in order; a missing number prints "-", a path that
// failed prints its reason in the notes below the table. When a shape has
// grouped K/V heads the table gets an Hkv column after c (H_kv; H for a
// multi-head row), and the first lines say what grouped rows time.
func printAttnTable(w io.Writer, shapes []TableShape, rows []benchRow) {
	by := map[attnKey]benchRow{}
	for _, r := range rows {
		if r.Kind == "attention" {
			by[attnKey{r.Impl, r.S, r.D, r.HKV, r.Causal}] = r
		}
	}
	grouped := slices.ContainsFunc(shapes, func(sh TableShape) bool { return sh.KVHeads != 0 })
	fmt.Fprintln(w, "TFLOP/s (fwd 4·B·H·S²·D, halved when causal; bwd 2.5× fwd); ratios are fused's speed over the other's (>1: fused faster);")
	fmt.Fprintln(w, "f+b: by total fwd+bwd time. peak GiB: device memory for fwd+bwd, inputs included (ours: peak of our own allocations; torch: max_memory_allocated).")
	lead, hkvHead := "", ""
	if grouped {
		fmt.Fprintln(w, "Hkv: K/V heads (grouped-query attention where below H; the same FLOP count as H heads): fused takes K/V of Hkv heads")
		fmt.Fprintln(w, "(FlashForwardGroupedWS/FlashBackwardGrouped; the backward on K/V repeated to every head, its dK, dV summed after, where")
		fmt.Fprintln(w, "the grouped grid is small: "+cuda.FlashGQABwdEnv+"), PyTorch SDPA enable_gqa=True; the composed path is MHA only (skip).")
		lead, hkvHead = "     ", " Hkv"
	}
	fmt.Fprintf(w, "%-15s%s|%-36s|%-36s|%-19s|%-19s|%-19s|%-19s| %s\n",
		"", lead, " forward TFLOP/s", " backward TFLOP/s", " fused/flash", " fused/cudnn", " fused/composed", " peak GiB", "max|fused-comp|")
	fmt.Fprintf(w, "%4s %6s %2s%s | %6s %6s %6s %6s %6s | %6s %6s %6s %6s %6s | %5s %5s %5s | %5s %5s %5s | %5s %5s %5s | %5s %5s %5s | %7s %7s\n",
		"D", "S", "c", hkvHead, "fused", "comp", "flash", "cudnn", "eff", "fused", "comp", "flash", "cudnn", "eff",
		"fwd", "bwd", "f+b", "fwd", "bwd", "f+b", "fwd", "bwd", "f+b", "fused", "comp", "cudnn", "O", "dQKV")
	var notes []string
	for _, sh := range shapes {
		get := func(impl string) (benchRow, bool) {
			r, ok := by[attnKey{impl, sh.S, sh.D, sh.KVHeads, sh.Causal}]
			return r, ok
		}
		c := 0
		if sh.Causal {
			c = 1
		}
		fmt.Fprintf(w, "%4d %6d %2d", sh.D, sh.S, c)
		if grouped {
			fmt.Fprintf(w, " %4s", kvHeadsText(sh, get))
		}
		fmt.Fprint(w, " |")
		for _, phase := range []int{0, 1} {
			for _, impl := range tableColumns {
				r, ok := get(impl)
				v := (*float64)(nil)
				if ok {
					v = r.FwdTFLOPs
					if phase == 1 {
						v = r.BwdTFLOPs
					}
				}
				switch {
				case v != nil:
					fmt.Fprintf(w, " %6.1f", *v)
				case ok && r.Error != nil && isOOMText(*r.Error):
					fmt.Fprintf(w, " %6s", "OOM")
				case ok && r.Error != nil && strings.HasPrefix(*r.Error, "skipped"):
					fmt.Fprintf(w, " %6s", "skip")
				case ok && r.Error != nil:
					fmt.Fprintf(w, " %6s", "err")
				default:
					fmt.Fprintf(w, " %6s", "-")
				}
			}
			fmt.Fprint(w, " |")
		}
		fused, _ := get("fused")
		for _, other := range []string{"torch-flash", "torch-cudnn", "composed"} {
			o, _ := get(other)
			fmt.Fprintf(w, " %5s %5s %5s |", ratio(o.FwdMs, fused.FwdMs), ratio(o.BwdMs, fused.BwdMs), ratio(sum(o.FwdMs, o.BwdMs), sum(fused.FwdMs, fused.BwdMs)))
		}
		for _, impl := range []string{"fused", "composed", "torch-cudnn"} {
			r, _ := get(impl)
			if r.PeakMemBytes != nil {
				fmt.Fprintf(w, " %5.2f", float64(*r.PeakMemBytes)/(1<<30))
			} else {
				fmt.Fprintf(w, " %5s", "-")
			}
		}
		fmt.Fprint(w, " |")
		if fused.MaxAbsErr != nil {
			dqkv := max(fused.MaxAbsErr["dq"], fused.MaxAbsErr["dk"], fused.MaxAbsErr["dv"])
			fmt.Fprintf(w, " %7.1e %7.1e", fused.MaxAbsErr["o"], dqkv)
		} else {
			fmt.Fprintf(w, " %7s %7s", "-", "-")
		}
		fmt.Fprintln(w)
		for _, impl := range tableColumns {
			if r, ok := get(impl); ok && r.Error != nil && !strings.HasPrefix(*r.Error, "skipped") {
				kv := ""
				if sh.KVHeads != 0 {
					kv = fmt.Sprintf(" H_kv=%d", sh.KVHeads)
				}
				notes = append(notes, fmt.Sprintf("  %s D=%d S=%d%s causal=%v: %s", impl, sh.D, sh.S, kv, sh.Causal, firstLine(*r.Error, 160)))
			}
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w, "not run:")
		for _, n := range notes {
			fmt.Fprintln(w, n)
		}
	}
	if grouped {
		printBestSDPA(w, shapes, by)
	}
}

// printBestSDPA writes, for each shape, fused's speed over the fastest SDPA
// backend of each phase (which backend refuses grouped K/V varies with the
// PyTorch version, so the table's flash and cuDNN columns may not hold the
// best): forward, backward and forward+backward, each naming the backend.
func printBestSDPA(w io.Writer, shapes []TableShape, by map[attnKey]benchRow) {
	fmt.Fprintln(w, "fused over the fastest SDPA backend of each phase (>1: fused faster):")
	for _, sh := range shapes {
		fused := by[attnKey{"fused", sh.S, sh.D, sh.KVHeads, sh.Causal}]
		fmt.Fprintf(w, "  D=%d S=%d Hkv=%s causal=%v:", sh.D, sh.S, kvHeadsText(sh, func(impl string) (benchRow, bool) {
			r, ok := by[attnKey{impl, sh.S, sh.D, sh.KVHeads, sh.Causal}]
			return r, ok
		}), sh.Causal)
		for _, ph := range []struct {
			name string
			ms   func(benchRow) *float64
		}{
			{"fwd", func(r benchRow) *float64 { return r.FwdMs }},
			{"bwd", func(r benchRow) *float64 { return r.BwdMs }},
			{"f+b", func(r benchRow) *float64 { return sum(r.FwdMs, r.BwdMs) }},
		} {
			var best *float64
			bestImpl := "none ran"
			for _, impl := range tableColumns {
				if !strings.HasPrefix(impl, "torch-") {
					continue
				}
				r, ok := by[attnKey{impl, sh.S, sh.D, sh.KVHeads, sh.Causal}]
				if v := ph.ms(r); ok && v != nil && (best == nil || *v < *best) {
					best, bestImpl = v, strings.TrimPrefix(impl, "torch-")
				}
			}
			fmt.Fprintf(w, " %s %s (%s)", ph.name, ratio(best, ph.ms(fused)), bestImpl)
		}
		fmt.Fprintln(w)
	}
}

// kvHeadsText is a shape's Hkv column: its H_kv, or for multi-head
// attention the H of any of its rows ("H" when none has one).
func kvHeadsText(sh TableShape, get func(string) (benchRow, bool)) string {
	if sh.KVHeads != 0 {
		return strconv.Itoa(sh.KVHeads)
	}
	for _, impl := range tableColumns {
		if r, ok := get(impl); ok && r.H > 0 {
			return strconv.Itoa(r.H)
		}
	}
	return "H"
}

// sm90Variants are the Hopper forwards -sm90 times: the row name, the table
// column and the value of cuda.FlashSM90Env that selects each.
var sm90Variants = []struct{ impl, column, env string }{
	{"fused-sm90", "tma", "tma"},
	{"fused-sm90pp", "pp", "pp"},
	{"fused-sm90pp3", "pp3", "pp3"},
	{"fused-sm90ppp", "ppp", "ppp"},
	{"fused-sm90ppp3", "ppp3", "ppp3"},
}

// printSM90Table writes the forward TFLOP/s of FA2 ("fused"), each Hopper
// kernel of sm90Variants and cuDNN, and the fastest Hopper kernel's speed
// over FA2 and over cuDNN.
func printSM90Table(w io.Writer, shapes []TableShape, rows []benchRow) {
	by := map[attnKey]benchRow{}
	for _, r := range rows {
		if r.Kind == "attention" {
			by[attnKey{r.Impl, r.S, r.D, r.HKV, r.Causal}] = r
		}
	}
	fmt.Fprintln(w, "forward TFLOP/s: FA2 (fused); Hopper wgmma kernels/flash_sm90_fwd.cu, kernels/dev/flash_sm90_dev.cu: tma = TMA + producer warpgroup,")
	fmt.Fprintln(w, "pp = tma with the consumer warpgroups taking turns (ping-pong), pp3 = three of them at D=64 (pp at D=128),")
	fmt.Fprintln(w, "ppp/ppp3 = pp/pp3 persistent (a CTA per SM); cuDNN;")
	fmt.Fprintln(w, "then the best sm90's speed over FA2 and cuDNN:")
	grouped := slices.ContainsFunc(shapes, func(sh TableShape) bool { return sh.KVHeads != 0 })
	hkvHead := ""
	if grouped {
		hkvHead = " Hkv"
	}
	fmt.Fprintf(w, "%4s %6s %2s%s | %6s", "D", "S", "c", hkvHead, "fa2")
	for _, v := range sm90Variants {
		fmt.Fprintf(w, " %7s", v.column)
	}
	fmt.Fprintf(w, " %6s | %8s %8s\n", "cudnn", "best/fa2", "best/cd")
	var notes []string
	for _, sh := range shapes {
		c := 0
		if sh.Causal {
			c = 1
		}
		get := func(impl string) benchRow { return by[attnKey{impl, sh.S, sh.D, sh.KVHeads, sh.Causal}] }
		getOK := func(impl string) (benchRow, bool) {
			r, ok := by[attnKey{impl, sh.S, sh.D, sh.KVHeads, sh.Causal}]
			return r, ok
		}
		tf := func(r benchRow, width int) string {
			if r.FwdTFLOPs != nil {
				return fmt.Sprintf("%*.1f", width, *r.FwdTFLOPs)
			}
			return fmt.Sprintf("%*s", width, "-")
		}
		fa2, cd := get("fused"), get("torch-cudnn")
		fmt.Fprintf(w, "%4d %6d %2d", sh.D, sh.S, c)
		if grouped {
			fmt.Fprintf(w, " %4s", kvHeadsText(sh, getOK))
		}
		fmt.Fprintf(w, " | %s", tf(fa2, 6))
		var best *float64
		for _, v := range sm90Variants {
			r := get(v.impl)
			fmt.Fprintf(w, " %s", tf(r, 7))
			if r.FwdMs != nil && (best == nil || *r.FwdMs < *best) {
				best = r.FwdMs
			}
			if r.Error != nil {
				notes = append(notes, fmt.Sprintf("  %s D=%d S=%d causal=%v: %s", v.impl, sh.D, sh.S, sh.Causal, firstLine(*r.Error, 160)))
			}
		}
		fmt.Fprintf(w, " %s | %8s %8s\n", tf(cd, 6), ratio(fa2.FwdMs, best), ratio(cd.FwdMs, best))
	}
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
}

func isOOMText(s string) bool {
	s = strings.ToLower(s)
	return strings.Contains(s, "out of memory") || strings.Contains(s, "out_of_memory")
}

func firstLine(s string, n int) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

// ratio is a/b with two decimals, "-" when either is missing.
func ratio(a, b *float64) string {
	if a == nil || b == nil || !(*b > 0) {
		return "-"
	}
	return strconv.FormatFloat(*a / *b, 'f', 2, 64)
}

func sum(a, b *float64) *float64 {
	if a == nil || b == nil {
		return nil
	}
	s := *a + *b
	return &s
}

// MemShape is one training step of the -memory table.
type MemShape struct{ S, B int }

// AttentionOptions are what `flashgraph bench` runs with: the attention
// table's shapes (B = Tokens/S, H = Width/D, H_kv from KVHeads), its timing
// and PyTorch's script, the -memory table's shapes and the -json file.
type AttentionOptions struct {
	Shapes []TableShape
	// KVHeads is -kv-heads as given (nil: multi-head only), passed on to
	// sdpa_bench.py's --kv-heads, which resolves it per D as
	// AttentionShapes does (an entry equal to H is multi-head attention).
	KVHeads                           []int
	Tokens, Width, Warmup, Iters      int
	Rounds                            int
	Settle                            time.Duration
	Composed, SM90                    bool
	Seed                              uint64
	TorchPy, Reference, TorchBackends string
	Attention, Memory                 bool
	MemShapes                         []MemShape
	JSONOut                           string
}

// RunAttention runs the attention table and, with Memory, the
// training-step memory table, and writes every row to JSONOut.
func RunAttention(stdout, stderr io.Writer, o AttentionOptions) error {
	if err := cuda.Available(); err != nil {
		return fmt.Errorf("bench needs -device cuda: %v", err)
	}
	// The rows are written after minutes of GPU time: a -json path that
	// cannot be written fails now, not then.
	if o.JSONOut != "" {
		if err := checkpoint.WriteFileAtomic(o.JSONOut, func(io.Writer) error { return nil }); err != nil {
			return fmt.Errorf("-json %s: %w", o.JSONOut, err)
		}
	}

	var rows []benchRow
	if o.Attention {
		r, err := benchAttention(stdout, stderr, o.Shapes, o.KVHeads, o.Tokens, o.Width, o.Warmup, o.Iters, o.Rounds, o.Settle, o.Composed, o.SM90, o.Seed,
			o.TorchPy, o.Reference, o.TorchBackends)
		rows = append(rows, r...)
		if err != nil {
			return err
		}
	}
	if o.Memory {
		r, err := benchMemory(stdout, stderr, o.MemShapes, o.Seed)
		rows = append(rows, r...)
		if err != nil {
			return err
		}
	}
	if o.JSONOut != "" {
		sortRows(rows)
		if err := writeJSONLines(stderr, o.JSONOut, rows); err != nil {
			return err
		}
	}
	return nil
}

// deviceLine describes the card: name, SMs, driver (from nvidia-smi when it
// is there) and CUDA driver API version.
func deviceLine(d *cuda.Device) string {
	v := d.DriverVersion()
	s := fmt.Sprintf("%s (%s, %d SMs), CUDA driver API %d.%d", d.Name(), d.Arch(), d.SMCount(), v/1000, v%1000/10)
	if out, err := exec.Command("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").Output(); err == nil {
		s += ", driver " + strings.TrimSpace(strings.Split(string(out), "\n")[0])
	}
	return s
}

func benchAttention(stdout, stderr io.Writer, shapes []TableShape, kvHeads []int, tokens, width, warmup, iters, rounds int, settle time.Duration, composed, sm90 bool,
	seed uint64, torchPy, reference, torchBackends string) ([]benchRow, error) {
	if sm90 {
		// FlashForward reads the variable at each call: "fused" runs FA2 with
		// it 0, each sm90Variants row with its value; the caller's value comes
		// back at the end.
		old, had := os.LookupEnv(cuda.FlashSM90Env)
		defer func() {
			if had {
				os.Setenv(cuda.FlashSM90Env, old)
			} else {
				os.Unsetenv(cuda.FlashSM90Env)
			}
		}()
		os.Setenv(cuda.FlashSM90Env, "0")
	}
	// Rounds take turns at going first, ours and PyTorch's: the card's clock
	// follows its temperature and power draw, so whichever runs right after
	// the other's minutes of load, or after an idle pause, is timed on a
	// different clock (run 62 in BENCHMARKS.md: up to 13% either way on one
	// shape). The table gives each row's median over the rounds.
	var perRound [][]benchRow
	header, torchNote := "", ""
	if torchPy == "" {
		torchNote = "PyTorch reference skipped (-torch \"\")"
	}
	for r := range rounds {
		var round []benchRow
		ours := func() error {
			rows, h, err := benchOurs(stderr, shapes, tokens, width, warmup, iters, settle, composed, sm90, seed)
			header = h
			round = append(round, rows...)
			return err
		}
		torch := func() {
			if torchPy == "" || torchNote != "" {
				return
			}
			tr, err := runTorch(stderr, torchPy, reference, torchBackends, shapes, kvHeads, tokens, width, warmup, iters, settle)
			if err != nil {
				// Not retried in later rounds: what failed once (no
				// PyTorch, no GPU for it) fails again.
				torchNote = "PyTorch reference not run: " + err.Error()
				fmt.Fprintln(stderr, "bench: "+torchNote)
			}
			round = append(round, tr...)
		}
		if rounds > 1 {
			first := "ours"
			if r%2 == 1 {
				first = "PyTorch's"
			}
			fmt.Fprintf(stderr, "bench: round %d of %d, %s first\n", r+1, rounds, first)
		}
		if r%2 == 1 {
			torch()
		}
		if err := ours(); err != nil {
			return medianRows(append(perRound, round)), err
		}
		if r%2 == 0 {
			torch()
		}
		perRound = append(perRound, round)
	}
	rows := medianRows(perRound)
	fmt.Fprintf(stdout, "flashgraph bench: %s\n", header)
	fmt.Fprintf(stdout, "bf16, B·S = %d tokens, H·D = %d; CUDA events, forward and backward each timed in a loop of its own (as PyTorch's), median of %d after %d warm-up",
		tokens, width, iters, warmup)
	if settle > 0 {
		fmt.Fprintf(stdout, ", each loop after %v idle", settle)
	}
	if rounds > 1 {
		fmt.Fprintf(stdout, "; median of %d rounds, ours and PyTorch's taking turns at going first", rounds)
	}
	fmt.Fprintf(stdout, "; %s\n", time.Now().UTC().Format("2006-01-02"))
	for _, r := range rows {
		if r.Torch != "" {
			fmt.Fprintf(stdout, "PyTorch %s (SDPA, tools/reference/sdpa_bench.py)\n", r.Torch)
			break
		}
	}
	printAttnTable(stdout, shapes, rows)
	if sm90 {
		printSM90Table(stdout, shapes, rows)
	}
	fmt.Fprintln(stdout, "fused: FlashForward/FlashBackward (kernels/flash_attention.cu). composed: the unfused graph (MatMul(Q,Kᵀ), Mul scale,")
	fmt.Fprintln(stdout, "Add causal mask, Softmax, MatMul; backward by autodiff: Transpose, MatMul, SoftmaxGrad, Mul) run by the CUDA executor's")
	fmt.Fprintln(stdout, "own lowering (kernels/ops.cu + cuBLAS); its bwd excludes the loss and dO seed, its memory includes them.")
	if torchNote != "" {
		fmt.Fprintln(stdout, torchNote)
	}
	return rows, nil
}

// benchOurs times our fused (and composed, and with sm90 each Hopper
// forward's) attention on every shape once; it returns the rows and the
// device line.
func benchOurs(stderr io.Writer, shapes []TableShape, tokens, width, warmup, iters int, settle time.Duration, composed, sm90 bool, seed uint64) ([]benchRow, string, error) {
	t0 := time.Now()
	ab, err := NewAttnBench(tokens*width, seed)
	if err != nil {
		return nil, "", fmt.Errorf("bench needs -device cuda: %w", err)
	}
	ab.Warmup, ab.Iters, ab.Settle = warmup, iters, settle
	gpu := ab.Device().Name()
	header := deviceLine(ab.Device())
	fmt.Fprintf(stderr, "bench: %s; inputs ready in %v\n", header, time.Since(t0).Round(time.Millisecond))
	var rows []benchRow
	for _, sh := range shapes {
		as := AttnShape{B: tokens / sh.S, H: width / sh.D, S: sh.S, D: sh.D, KVHeads: sh.KVHeads, Causal: sh.Causal}
		t1 := time.Now()
		r, err := ab.Run(as, composed)
		if err != nil {
			ab.Close()
			return rows, header, fmt.Errorf("%v: %w", as, err)
		}
		rows = append(rows, attnRows(r, iters, gpu)...)
		fmt.Fprintf(stderr, "bench: %v: fused %s, composed %s (%v)\n", as, timingText(r.Fused), timingText(r.Composed), time.Since(t1).Round(time.Millisecond))
		for _, v := range sm90Variants {
			if !sm90 {
				break
			}
			os.Setenv(cuda.FlashSM90Env, v.env)
			r90, err := ab.Run(as, false)
			os.Setenv(cuda.FlashSM90Env, "0")
			if err != nil {
				ab.Close()
				return rows, header, fmt.Errorf("%v (%s): %w", as, v.impl, err)
			}
			row := attnRows(r90, iters, gpu)[0]
			row.Impl = v.impl
			rows = append(rows, row)
			fmt.Fprintf(stderr, "bench: %v: %s %s\n", as, v.impl, timingText(r90.Fused))
		}
		if r.Checked {
			fmt.Fprintf(stderr, "bench:   max|fused-composed| O %.2g dQ %.2g dK %.2g dV %.2g (max|composed| %.3g %.3g %.3g %.3g)\n",
				r.MaxAbsErr[0], r.MaxAbsErr[1], r.MaxAbsErr[2], r.MaxAbsErr[3], r.MaxAbsRef[0], r.MaxAbsRef[1], r.MaxAbsRef[2], r.MaxAbsRef[3])
		}
	}
	if err := ab.Close(); err != nil {
		return rows, header, err
	}
	return rows, header, nil
}

// medianRows merges the rounds' rows of each implementation and shape into
// one: forward and backward times are the medians of the rounds that have
// them (each kept in fwd_ms_rounds, bwd_ms_rounds when there are several),
// TFLOP/s follow from those; the rest is the first round's.
func medianRows(rounds [][]benchRow) []benchRow {
	type key struct {
		kind, impl string
		s, d, hkv  int
		causal     bool
	}
	var order []key
	byKey := map[key][]benchRow{}
	for _, round := range rounds {
		for _, r := range round {
			k := key{r.Kind, r.Impl, r.S, r.D, r.HKV, r.Causal}
			if _, ok := byKey[k]; !ok {
				order = append(order, k)
			}
			byKey[k] = append(byKey[k], r)
		}
	}
	rows := make([]benchRow, 0, len(order))
	for _, k := range order {
		all := byKey[k]
		row := all[0]
		if len(all) > 1 {
			row.FwdMsRounds, row.BwdMsRounds = msOf(all, func(r benchRow) *float64 { return r.FwdMs }), msOf(all, func(r benchRow) *float64 { return r.BwdMs })
			row.FwdMs, row.BwdMs = medianPtr(row.FwdMsRounds), medianPtr(row.BwdMsRounds)
			row.setTFLOPs()
		}
		rows = append(rows, row)
	}
	return rows
}

// msOf collects the times get finds in rows (nil when none has one).
func msOf(rows []benchRow, get func(benchRow) *float64) []float64 {
	var ms []float64
	for _, r := range rows {
		if v := get(r); v != nil {
			ms = append(ms, *v)
		}
	}
	return ms
}

// medianPtr is the median of v (the mean of the middle two for an even
// count), nil for none.
func medianPtr(v []float64) *float64 {
	if len(v) == 0 {
		return nil
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return &m
}

func timingText(t AttnTiming) string {
	if t.Err != "" {
		return firstLine(t.Err, 120)
	}
	return fmt.Sprintf("fwd %.3f ms bwd %.3f ms, %s", t.FwdMs, t.BwdMs, cuda.FormatBytes(t.MeasuredBytes))
}

// runTorch runs sdpa_bench.py on the same shapes and returns its rows.
func runTorch(stderr io.Writer, py, script, backends string, shapes []TableShape, kvHeads []int, tokens, width, warmup, iters int, settle time.Duration) ([]benchRow, error) {
	if _, err := os.Stat(script); err != nil {
		return nil, fmt.Errorf("-reference %s: %w (run from the repository root or pass -reference)", script, err)
	}
	args, out, err := torchArgs(script, backends, shapes, kvHeads, tokens, width, warmup, iters, settle)
	if err != nil {
		return nil, err
	}
	defer os.Remove(out)
	return runPythonJSONLines(stderr, py, args, out, parseTorchRows)
}

// torchArgs is sdpa_bench.py's command line for the shapes (args[0] the
// script) and the temporary file it writes its JSON lines to (the caller
// removes it).
func torchArgs(script, backends string, shapes []TableShape, kvHeads []int, tokens, width, warmup, iters int, settle time.Duration) (args []string, out string, err error) {
	var seqs, dims []string
	causal := map[bool]bool{}
	seenS, seenD := map[int]bool{}, map[int]bool{}
	for _, sh := range shapes {
		if !seenS[sh.S] {
			seenS[sh.S] = true
			seqs = append(seqs, strconv.Itoa(sh.S))
		}
		if !seenD[sh.D] {
			seenD[sh.D] = true
			dims = append(dims, strconv.Itoa(sh.D))
		}
		causal[sh.Causal] = true
	}
	c := "both"
	if !causal[false] {
		c = "causal"
	} else if !causal[true] {
		c = "noncausal"
	}
	tmp, err := os.CreateTemp("", "flashgraph-sdpa-*.jsonl")
	if err != nil {
		return nil, "", err
	}
	tmp.Close()
	args = []string{script, "--backends", backends, "--seqs", strings.Join(seqs, ","), "--head-dims", strings.Join(dims, ","),
		"--causal", c, "--tokens", strconv.Itoa(tokens), "--width", strconv.Itoa(width),
		"--iters", strconv.Itoa(iters), "--warmup", strconv.Itoa(max(1, warmup)), "--out", tmp.Name()}
	if settle > 0 {
		args = append(args, "--settle-ms", strconv.FormatFloat(float64(settle)/float64(time.Millisecond), 'f', -1, 64))
	}
	if len(kvHeads) > 0 {
		kv := make([]string, len(kvHeads))
		for i, n := range kvHeads {
			kv[i] = strconv.Itoa(n)
		}
		args = append(args, "--kv-heads", strings.Join(kv, ","))
	}
	return args, tmp.Name(), nil
}

// AttentionShapes lists the table's shapes: each D, then each entry of
// kvHeads (nil: multi-head only), each S and each causal, in that nesting.
// H = width/D; an H_kv equal to H is multi-head attention (KVHeads 0, listed
// once per D), and one that does not divide H is an error naming it.
func AttentionShapes(seqs, dims, kvHeads []int, causal []bool, tokens, width int) ([]TableShape, error) {
	if tokens < 1 || width < 1 {
		return nil, fmt.Errorf("-tokens and -width must be positive, got %d and %d", tokens, width)
	}
	var out []TableShape
	for _, d := range dims {
		if d < 1 || width%d != 0 {
			return nil, fmt.Errorf("D=%d: -width %d must be a multiple of D", d, width)
		}
		h := width / d
		kvs := []int{0}
		if len(kvHeads) > 0 {
			kvs = nil
			for _, kv := range kvHeads {
				if kv < 1 || h%kv != 0 {
					return nil, fmt.Errorf("-kv-heads %d: must divide H = %d (-width %d / D %d)", kv, h, width, d)
				}
				if kv == h {
					kv = 0
				}
				if !slices.Contains(kvs, kv) {
					kvs = append(kvs, kv)
				}
			}
		}
		for _, kv := range kvs {
			for _, s := range seqs {
				if s < 1 || tokens%s != 0 {
					return nil, fmt.Errorf("S=%d, D=%d: -tokens %d and -width %d must be multiples of S and D", s, d, tokens, width)
				}
				for _, c := range causal {
					out = append(out, TableShape{S: s, D: d, KVHeads: kv, Causal: c})
				}
			}
		}
	}
	return out, nil
}

// runPythonJSONLines runs py with args (args[0] the script), whose JSON lines
// go to the file out, and parses that file with parse. Rows written before
// the script failed come back with its error.
func runPythonJSONLines[R any](stderr io.Writer, py string, args []string, out string, parse func(io.Reader) ([]R, error)) ([]R, error) {
	fmt.Fprintf(stderr, "bench: %s %s\n", py, strings.Join(args, " "))
	cmd := exec.Command(py, args...)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	cmd.Env = append(os.Environ(), "PYTHONUNBUFFERED=1")
	runErr := cmd.Run()
	if runErr != nil {
		runErr = fmt.Errorf("%s %s: %w", py, args[0], runErr)
	}
	f, err := os.Open(out)
	if err != nil {
		if runErr != nil {
			return nil, runErr
		}
		return nil, err
	}
	defer f.Close()
	rows, perr := parse(f)
	if runErr != nil {
		return rows, runErr
	}
	return rows, perr
}

// benchMemory runs one training step of model small per (S, B), fused and
// unfused attention, mixed precision, and reports the device memory the
// executable took (the peak of our own allocations from compiling to the
// end of the step, memRunStep) next to the static plan. An unfused step
// that does not fit must fail cleanly: the out-of-memory error is
// reported, the bench goes on.
func benchMemory(stdout, stderr io.Writer, shapes []MemShape, seed uint64) ([]benchRow, error) {
	be, err := cuda.NewBackend(cuda.Options{Compute: graph.BFloat16})
	if err != nil {
		return nil, fmt.Errorf("bench needs -device cuda: %w", err)
	}
	defer be.Close()
	cb, ok := be.(*cuda.Backend)
	if !ok {
		return nil, errors.New("cuda.NewBackend did not return a *cuda.Backend")
	}
	if err := cb.BenchWarmUp(); err != nil {
		return nil, err
	}
	d := cb.Device()
	gpu := d.Name()
	type line struct {
		sh                      MemShape
		fuse                    bool
		arena, planned, measure int64
		stepMs, loss            float64
		status                  string
	}
	var lines []line
	var rows []benchRow
	for _, ms := range shapes {
		for _, fuse := range []bool{true, false} {
			ln := line{sh: ms, fuse: fuse, status: "ok"}
			ts, plan, err := memTrainGraph(ms, fuse)
			if err != nil {
				return rows, err
			}
			ln.arena = plan.PeakBytes
			ln.planned = plan.PeakBytes + plan.InitializerBytes + plan.InputBytes
			ln.measure, ln.stepMs, ln.loss, err = memRunStep(d, be, ts, seed)
			if err != nil {
				if !isOOMText(err.Error()) {
					ln.status = "error: " + firstLine(err.Error(), 200)
				} else {
					free, _, _ := d.MemInfo()
					ln.status = fmt.Sprintf("out of memory (plan needs %s, %s free): %s", cuda.FormatBytes(ln.planned), cuda.FormatBytes(int64(free)), firstLine(err.Error(), 160))
				}
			}
			fmt.Fprintf(stderr, "bench: memory S=%d B=%d fused=%v: plan %s, measured %s, %s\n", ms.S, ms.B, fuse, cuda.FormatBytes(ln.planned), cuda.FormatBytes(ln.measure), ln.status)
			lines = append(lines, ln)
			impl := map[bool]string{true: "fused", false: "unfused"}[fuse]
			row := benchRow{Kind: "train_memory", Impl: impl, B: ms.B, S: ms.S, Causal: true, DType: "bf16 activations, f32 weights",
				PlannedMemBytes: iptr(ln.planned), GPU: gpu}
			if ln.status == "ok" {
				row.PeakMemBytes, row.StepMs, row.Loss = iptr(ln.measure), fptr(ln.stepMs), fptr(ln.loss)
			} else {
				row.Error = sptr(ln.status)
			}
			rows = append(rows, row)
		}
	}
	fmt.Fprintf(stdout, "\ntraining step memory: model small (%s), mixed precision (bf16 activations), one AdamW step on %s\n", smallDesc(), gpu)
	fmt.Fprintln(stdout, "measured: peak of our own device allocations from compiling to the end of the step (params, moments, inputs, activation arena);")
	fmt.Fprintln(stdout, "plan: cuda.PlanMemoryWith (arena + initializers + inputs). The executor allocates the whole plan at compile.")
	fmt.Fprintf(stdout, "%6s %3s %-8s %12s %12s %12s %9s %8s  %s\n", "S", "B", "attn", "plan arena", "plan total", "measured", "step ms", "loss", "status")
	for _, ln := range lines {
		meas, step, loss := "-", "-", "-"
		if ln.status == "ok" {
			meas, step, loss = cuda.FormatBytes(ln.measure), fmt.Sprintf("%.1f", ln.stepMs), fmt.Sprintf("%.4f", ln.loss)
		}
		fmt.Fprintf(stdout, "%6d %3d %-8s %12s %12s %12s %9s %8s  %s\n", ln.sh.S, ln.sh.B, map[bool]string{true: "fused", false: "unfused"}[ln.fuse],
			cuda.FormatBytes(ln.arena), cuda.FormatBytes(ln.planned), meas, step, loss, firstLine(ln.status, 100))
	}
	for i := 0; i+1 < len(lines); i += 2 {
		f, u := lines[i], lines[i+1]
		switch {
		case f.status == "ok" && u.status == "ok":
			fmt.Fprintf(stdout, "S=%d B=%d: fused/unfused measured memory %.3f (plan %.3f)\n", f.sh.S, f.sh.B,
				float64(f.measure)/float64(u.measure), float64(f.planned)/float64(u.planned))
		case f.status == "ok":
			fmt.Fprintf(stdout, "S=%d B=%d: fused runs (%s); unfused did not: %s\n", f.sh.S, f.sh.B, cuda.FormatBytes(f.measure), firstLine(u.status, 120))
		}
	}
	return rows, nil
}

func smallDesc() string {
	c, err := model.Lookup("small")
	if err != nil {
		return "?"
	}
	return fmt.Sprintf("dim %d, %d layers, %d heads of %d", c.Dim, c.Layers, c.Heads, c.HeadDim)
}

// memTrainGraph builds the training step of model small at S, B with or
// without the attention fusion, the way `flashgraph train` builds it.
func memTrainGraph(ms MemShape, fuse bool) (*autodiff.TrainStep, *cuda.Plan, error) {
	cfg, err := model.Lookup("small")
	if err != nil {
		return nil, nil, err
	}
	cfg.Seq, cfg.Batch = ms.S, ms.B
	g, err := model.Build(cfg)
	if err != nil {
		return nil, nil, err
	}
	if g, err = passes.Default(fuse).Run(g, nil); err != nil {
		return nil, nil, err
	}
	ts, err := autodiff.TrainingGraph(g, autodiff.TrainOptions{Loss: "loss"})
	if err != nil {
		return nil, nil, err
	}
	plan, err := cuda.PlanMemoryWith(ts.Graph, cuda.PlanOptions{Compute: graph.BFloat16, Updates: ts.Updates})
	if err != nil {
		return nil, nil, err
	}
	return ts, plan, nil
}

// memRunStep compiles the step, runs it twice (the second is timed, so the
// first's one-time costs stay out) and measures the memory the executable
// took: the peak of our own allocations from before compiling to after the
// runs, less what was allocated before (cuMemGetInfo would count every other
// process on the GPU too). The executable is closed before it returns.
func memRunStep(d *cuda.Device, be backend.Backend, ts *autodiff.TrainStep, seed uint64) (used int64, stepMs, loss float64, err error) {
	base := d.ResetPeakAllocated()
	exe, err := be.Compile(ts.Graph, backend.Options{Updates: ts.Updates})
	if err != nil {
		return 0, 0, 0, err
	}
	defer exe.Close()
	feeds, err := RandomFeeds(ts.Graph, seed)
	if err != nil {
		return 0, 0, 0, err
	}
	for name, v := range map[string]float64{ts.LR: 1e-4, ts.Step: 1} {
		t := feeds[name]
		if t == nil {
			return 0, 0, 0, fmt.Errorf("training graph has no input %s", name)
		}
		t.Fill(v)
	}
	var outs map[string]*graph.Tensor
	for i := range 2 {
		t0 := time.Now()
		if outs, err = exe.Run(feeds); err != nil {
			return 0, 0, 0, err
		}
		stepMs = float64(time.Since(t0).Microseconds()) / 1000
		if i == 0 {
			if step := feeds[ts.Step]; step != nil {
				step.Fill(2)
			}
		}
	}
	used = d.PeakAllocatedBytes() - base
	l, ok := outs[ts.Loss]
	if !ok || l.Len() != 1 {
		return 0, 0, 0, fmt.Errorf("the step returned no scalar %s", ts.Loss)
	}
	return used, stepMs, l.At(0), nil
}

// sortRows orders rows by kind, shape and implementation (used by tests and
// to keep -json stable when PyTorch's lines arrive in another order).
// writeJSONLines writes rows to path (the -json flag's file) as JSON lines,
// atomically, and says so on stderr.
func writeJSONLines[R any](stderr io.Writer, path string, rows []R) error {
	var b strings.Builder
	for _, r := range rows {
		line, err := json.Marshal(r)
		if err != nil {
			return err
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	if err := train.WriteOutputFile("-json", path, []byte(b.String())); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %d rows to %s\n", len(rows), path)
	return nil
}

func sortRows(rows []benchRow) {
	order := map[string]int{}
	for i, c := range tableColumns {
		order[c] = i
	}
	sort.SliceStable(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if a.D != b.D {
			return a.D < b.D
		}
		if a.S != b.S {
			return a.S < b.S
		}
		if ak, bk := kvOrder(a), kvOrder(b); ak != bk {
			return ak > bk // multi-head first, then fewer and fewer K/V heads
		}
		if a.Causal != b.Causal {
			return !a.Causal
		}
		return order[a.Impl] < order[b.Impl]
	})
}

// kvOrder is a row's K/V head count for sorting: H for multi-head rows.
func kvOrder(r benchRow) int {
	if r.HKV == 0 {
		return r.H
	}
	return r.HKV
}
