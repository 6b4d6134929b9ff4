package bench

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/flashgraph/flashgraph/backend/cuda"
)

// DecodeOptions are `flashgraph bench -decode`'s flags.
type DecodeOptions struct {
	Sqs, Seqs, Dims                   string
	Tokens, Width, Warmup, Iters      int
	Settle                            time.Duration
	Seed                              uint64
	TorchPy, Reference, TorchBackends string
	JSONOut, Device                   string
}

// RunDecode is `flashgraph bench -decode`: generation-shaped attention on
// shapes, ours and SDPA's, in one table.
func RunDecode(stdout, stderr io.Writer, shapes []DecodeShape, o DecodeOptions) error {
	if o.Iters < 1 || o.Warmup < 0 || o.Settle < 0 {
		return errors.New("-iters must be at least 1, -warmup and -settle at least 0")
	}
	if o.Device != "cuda" {
		return fmt.Errorf("bench needs -device cuda: -device %s is not benchmarked", o.Device)
	}
	if err := cuda.Available(); err != nil {
		return fmt.Errorf("bench needs -device cuda: %v", err)
	}
	ab, err := NewAttnBench(o.Tokens*o.Width, o.Seed)
	if err != nil {
		return fmt.Errorf("bench needs -device cuda: %w", err)
	}
	ab.Warmup, ab.Iters, ab.Settle = o.Warmup, o.Iters, o.Settle
	gpu := ab.Device().Name()
	header := deviceLine(ab.Device())
	var rows []benchRow
	for _, sh := range shapes {
		r, err := ab.Decode(sh)
		if err != nil {
			ab.Close()
			return err
		}
		fmt.Fprintf(stderr, "bench: decode %v: split %.1f us, whole %.1f us, max|split-whole| %.2g (max|O| %.3g)\n",
			sh, r.SplitMs*1e3, r.WholeMs*1e3, r.MaxAbsDiff, r.MaxAbsRef)
		for _, impl := range []struct {
			name string
			ms   float64
		}{{"fused-decode", r.SplitMs}, {"fused-nosplit", r.WholeMs}} {
			row := decodeRow(sh, impl.name, impl.ms, o.Iters, gpu)
			if impl.name == "fused-decode" {
				row.MaxAbsErr = map[string]float64{"o": r.MaxAbsDiff}
				row.MaxAbsRef = map[string]float64{"o": r.MaxAbsRef}
			}
			rows = append(rows, row)
		}
	}
	if err := ab.Close(); err != nil {
		return err
	}
	torchNote := "PyTorch reference skipped (-torch \"\")"
	if o.TorchPy != "" {
		tr, err := runTorchDecode(stderr, o)
		torchNote = ""
		if err != nil {
			torchNote = "PyTorch reference not run: " + err.Error()
			fmt.Fprintln(stderr, "bench: "+torchNote)
		}
		rows = append(rows, tr...)
	}
	fmt.Fprintf(stdout, "flashgraph bench -decode: %s\n", header)
	fmt.Fprintf(stdout, "bf16 forward, non-causal, B·S = %d key tokens, H·D = %d; CUDA events, median of %d after %d warm-up, each loop after %v idle; %s\n",
		o.Tokens, o.Width, o.Iters, o.Warmup, o.Settle, time.Now().UTC().Format("2006-01-02"))
	printDecodeTable(stdout, shapes, rows)
	fmt.Fprintln(stdout, "decode: FlashForward (split-K/V decode forward where Sq <= 16 and S >= 1024); nosplit: the same with "+cuda.FlashDecodeEnv+"=0")
	fmt.Fprintln(stdout, "(one CTA per batch·head and query tile). GB/s: K and V bytes / time. best SDPA: the fastest backend that ran.")
	if torchNote != "" {
		fmt.Fprintln(stdout, torchNote)
	}
	if o.JSONOut != "" {
		if err := writeJSONLines(stderr, o.JSONOut, rows); err != nil {
			return err
		}
	}
	return nil
}

func decodeRow(sh DecodeShape, impl string, ms float64, iters int, gpu string) benchRow {
	row := benchRow{Kind: "attention_decode", Impl: impl, B: sh.B, H: sh.H, Sq: sh.Sq, S: sh.Sk, D: sh.D,
		DType: "bfloat16", Iters: iters, GPU: gpu, FwdMs: fptr(ms)}
	row.FwdTFLOPs = fptr(tflops(4*float64(sh.B*sh.H)*float64(sh.Sq)*float64(sh.Sk)*float64(sh.D), ms))
	return row
}

// printDecodeTable prints one line per shape: our two forwards, each SDPA
// backend, and our decode forward's speed-up over the best SDPA backend.
func printDecodeTable(w io.Writer, shapes []DecodeShape, rows []benchRow) {
	var impls []string
	seen := map[string]bool{}
	for _, r := range rows {
		if !seen[r.Impl] {
			seen[r.Impl] = true
			impls = append(impls, r.Impl)
		}
	}
	fmt.Fprintf(w, "%4s %6s %4s %4s %4s", "Sq", "S", "D", "B", "H")
	for _, im := range impls {
		fmt.Fprintf(w, " %14s", strings.TrimPrefix(im, "fused-")+" us")
	}
	fmt.Fprintf(w, " %10s %12s %12s\n", "decode GB/s", "best SDPA", "decode/best")
	for _, sh := range shapes {
		fmt.Fprintf(w, "%4d %6d %4d %4d %4d", sh.Sq, sh.Sk, sh.D, sh.B, sh.H)
		ours, best, bestName := 0.0, 0.0, ""
		for _, im := range impls {
			var ms *float64
			for _, r := range rows {
				if r.Impl == im && r.Sq == sh.Sq && r.S == sh.Sk && r.D == sh.D && r.B == sh.B && r.H == sh.H {
					ms = r.FwdMs
				}
			}
			if ms == nil {
				fmt.Fprintf(w, " %14s", "-")
				continue
			}
			fmt.Fprintf(w, " %14.1f", *ms*1e3)
			if im == "fused-decode" {
				ours = *ms
			}
			if strings.HasPrefix(im, "torch-") && (best == 0 || *ms < best) {
				best, bestName = *ms, strings.TrimPrefix(im, "torch-")
			}
		}
		gbps := "-"
		if ours > 0 {
			gbps = fmt.Sprintf("%.0f", float64(sh.KVBytes())/(ours*1e-3)/1e9)
		}
		ratio := "-"
		if ours > 0 && best > 0 {
			ratio = fmt.Sprintf("%.2fx", best/ours)
		}
		fmt.Fprintf(w, " %10s %12s %12s\n", gbps, bestName, ratio)
	}
}

// decodeTorchRecord is one --decode-sq line of sdpa_bench.py.
type decodeTorchRecord struct {
	torchRecord
	Sq int `json:"Sq"`
}

// runTorchDecode runs sdpa_bench.py --decode-sq on the same shapes.
func runTorchDecode(stderr io.Writer, o DecodeOptions) ([]benchRow, error) {
	if _, err := os.Stat(o.Reference); err != nil {
		return nil, fmt.Errorf("-reference %s: %w (run from the repository root or pass -reference)", o.Reference, err)
	}
	tmp, err := os.CreateTemp("", "flashgraph-sdpa-decode-*.jsonl")
	if err != nil {
		return nil, err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	args := []string{o.Reference, "--backends", o.TorchBackends, "--seqs", o.Seqs, "--head-dims", o.Dims,
		"--decode-sq", o.Sqs, "--tokens", strconv.Itoa(o.Tokens), "--width", strconv.Itoa(o.Width),
		"--iters", strconv.Itoa(o.Iters), "--warmup", strconv.Itoa(max(1, o.Warmup)), "--out", tmp.Name()}
	if o.Settle > 0 {
		args = append(args, "--settle-ms", strconv.FormatFloat(float64(o.Settle)/float64(time.Millisecond), 'f', -1, 64))
	}
	return runPythonJSONLines(stderr, o.TorchPy, args, tmp.Name(), parseTorchDecodeRows)
}

// parseTorchDecodeRows reads sdpa_bench.py --decode-sq's JSON lines.
func parseTorchDecodeRows(r io.Reader) ([]benchRow, error) {
	var rows []benchRow
	err := readJSONLines(r, func(line int, rec decodeTorchRecord) error {
		if rec.Backend == "" || rec.Sq <= 0 || rec.S <= 0 || rec.D <= 0 || rec.B <= 0 || rec.H <= 0 {
			return fmt.Errorf("PyTorch output line %d: missing backend or decode shape (Sq, S, D, B, H)", line)
		}
		sh := DecodeShape{B: rec.B, H: rec.H, Sq: rec.Sq, Sk: rec.S, D: rec.D}
		row := benchRow{Kind: "attention_decode", Impl: "torch-" + rec.Backend, B: rec.B, H: rec.H, Sq: rec.Sq, S: rec.S, D: rec.D,
			DType: rec.DType, PeakMemBytes: rec.PeakMemBytes, Iters: rec.Iters, GPU: rec.GPU, Torch: rec.Torch, Error: rec.Error}
		if rec.FwdMs != nil {
			row = decodeRow(sh, row.Impl, *rec.FwdMs, rec.Iters, rec.GPU)
			row.DType, row.PeakMemBytes, row.Torch, row.Error = rec.DType, rec.PeakMemBytes, rec.Torch, rec.Error
		}
		rows = append(rows, row)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return rows, nil
}
