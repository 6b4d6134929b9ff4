package bench

// `flashgraph bench -accuracy`: the error of our FlashAttention forward and
// backward against a float64 reference, next to PyTorch SDPA's cuDNN and
// FLASH backends on the same inputs. Our kernels run here (package bench);
// the reference and SDPA run in tools/reference/sdpa_error.py, which reads
// the inputs and our outputs from a folder this command writes.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/train"
)

// accuracyFormat names the folder layout sdpa_error.py reads (see its
// docstring); a change to the layout changes the name (2: K, V, dK and dV
// of H_kv heads, H_kv in each case).
const accuracyFormat = "flashgraph-attention-accuracy/2"

// accuracyOutputs are the outputs the table compares, in column order (LSE
// is ours alone: SDPA does not return it).
var accuracyOutputs = []string{"o", "dq", "dk", "dv"}

// accuracyOutputNames are the outputs as the report writes them.
var accuracyOutputNames = map[string]string{"o": "O", "dq": "dQ", "dk": "dK", "dv": "dV", "lse": "LSE"}

// AccuracyOptions is everything -accuracy runs with.
type AccuracyOptions struct {
	Cases    []AccuracyCase
	Seed     uint64
	TorchPy  string
	Script   string
	Keep     string
	Backends string
	RefDev   string
	JSONOut  string
	Command  string // the command line, for the header
}

// shortDType is the table's name of an element type.
func shortDType(dt string) string {
	switch dt {
	case "bfloat16":
		return "bf16"
	case "float16":
		return "fp16"
	}
	return dt
}

// accuracyCaseName names a case in the manifest, the files and the rows.
func accuracyCaseName(c AccuracyCase) string {
	mask := "full"
	if c.Causal {
		mask = "causal"
	}
	kv := ""
	if c.KV() != c.H {
		kv = fmt.Sprintf("_kv%d", c.KV())
	}
	return fmt.Sprintf("%s_b%d_h%d%s_s%d_d%d_%s", shortDType(c.DType), c.B, c.H, kv, c.S, c.D, mask)
}

// accuracyManifest is DIR/manifest.json (sdpa_error.py's docstring has
// the schema).
type accuracyManifest struct {
	Format string            `json:"format"`
	Layout string            `json:"layout"`
	Device string            `json:"device,omitempty"`
	Seed   uint64            `json:"seed"`
	Env    map[string]string `json:"env,omitempty"`
	Cases  []accuracyCaseEnt `json:"cases"`
}

// accuracyCaseEnt is one case of the manifest; Files are relative to the
// manifest's folder.
type accuracyCaseEnt struct {
	Name   string            `json:"name"`
	DType  string            `json:"dtype"`
	B      int               `json:"B"`
	H      int               `json:"H"`
	HKV    int               `json:"H_kv"`
	S      int               `json:"S"`
	D      int               `json:"D"`
	Causal bool              `json:"causal"`
	Scale  float64           `json:"scale"`
	Files  map[string]string `json:"files"`
}

const accuracyLayout = "q do o dq: [B, H, S, D], k v dk dv: [B, H_kv, S, D] (query head h reads K/V head h/(H/H_kv)), " +
	"row-major, the element type's 16-bit patterns as little-endian uint16; lse: [B, H, S] little-endian float32, " +
	"natural log; causal: key j visible to query i iff j <= i"

// writeAccuracyCase writes one case's tensors under dir/<name>/ and returns
// its manifest entry.
func writeAccuracyCase(dir string, r *AccuracyData) (accuracyCaseEnt, error) {
	c := r.Case
	ent := accuracyCaseEnt{Name: accuracyCaseName(c), DType: c.DType, B: c.B, H: c.H, HKV: c.KV(), S: c.S, D: c.D, Causal: c.Causal,
		Scale: float64(c.Scale()), Files: map[string]string{}}
	if err := os.MkdirAll(filepath.Join(dir, ent.Name), 0o755); err != nil {
		return ent, err
	}
	n, nkv, rows := c.Elems(), c.KVElems(), c.B*c.H*c.S
	for _, t := range []struct {
		name string
		data []uint16
		n    int
	}{{"q", r.Q, n}, {"k", r.K, nkv}, {"v", r.V, nkv}, {"do", r.DO, n}, {"o", r.O, n}, {"dq", r.DQ, n}, {"dk", r.DK, nkv}, {"dv", r.DV, nkv}} {
		if len(t.data) != t.n {
			return ent, fmt.Errorf("%s %s: %d elements, want %d", ent.Name, t.name, len(t.data), t.n)
		}
		n := t.n
		b := make([]byte, 2*n)
		for i, v := range t.data {
			binary.LittleEndian.PutUint16(b[2*i:], v)
		}
		rel := ent.Name + "/" + t.name + ".u16"
		if err := os.WriteFile(filepath.Join(dir, rel), b, 0o644); err != nil {
			return ent, err
		}
		ent.Files[t.name] = rel
	}
	if len(r.LSE) != rows {
		return ent, fmt.Errorf("%s lse: %d elements, want %d", ent.Name, len(r.LSE), rows)
	}
	b := make([]byte, 4*rows)
	for i, v := range r.LSE {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	rel := ent.Name + "/lse.f32"
	if err := os.WriteFile(filepath.Join(dir, rel), b, 0o644); err != nil {
		return ent, err
	}
	ent.Files["lse"] = rel
	return ent, nil
}

func writeAccuracyManifest(dir string, m accuracyManifest) error {
	b, err := json.MarshalIndent(m, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "manifest.json"), append(b, '\n'), 0o644)
}

// readAccuracyManifest reads dir/manifest.json back and checks what the
// script relies on: the format, and every case's files at their sizes.
func readAccuracyManifest(dir string) (*accuracyManifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return nil, err
	}
	var m accuracyManifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "manifest.json"), err)
	}
	if m.Format != accuracyFormat {
		return nil, fmt.Errorf("manifest format %q, want %q", m.Format, accuracyFormat)
	}
	for _, c := range m.Cases {
		if c.HKV < 1 || c.H%c.HKV != 0 {
			return nil, fmt.Errorf("case %s: H_kv %d must divide H %d", c.Name, c.HKV, c.H)
		}
		for _, name := range []string{"q", "k", "v", "do", "o", "dq", "dk", "dv", "lse"} {
			want := int64(2 * c.B * c.H * c.S * c.D)
			switch name {
			case "lse":
				want = int64(4 * c.B * c.H * c.S)
			case "k", "v", "dk", "dv":
				want = int64(2 * c.B * c.HKV * c.S * c.D)
			}
			rel, ok := c.Files[name]
			if !ok {
				return nil, fmt.Errorf("case %s has no %s file", c.Name, name)
			}
			st, err := os.Stat(filepath.Join(dir, rel))
			if err != nil {
				return nil, fmt.Errorf("case %s: %w", c.Name, err)
			}
			if st.Size() != want {
				return nil, fmt.Errorf("case %s: %s is %d bytes, want %d", c.Name, rel, st.Size(), want)
			}
		}
	}
	return &m, nil
}

// accuracyMetric is one output's error against the reference.
type accuracyMetric struct {
	RelL2     *float64 `json:"rel_l2"`  // ‖x − ref‖₂/‖ref‖₂; null when x has non-finite elements
	MaxAbs    *float64 `json:"max_abs"` // max |x − ref|; null likewise
	RefMaxAbs float64  `json:"ref_max_abs"`
	Nonfinite int      `json:"nonfinite"`
}

// accuracyRow is one line of sdpa_error.py (impl "ours", "cudnn",
// "flash") and, with Kind set and Impl renamed (fused, torch-cudnn,
// torch-flash) as in the timing rows, one line of -json.
type accuracyRow struct {
	Kind      string                    `json:"kind,omitempty"` // attention_accuracy
	Case      string                    `json:"case"`
	Impl      string                    `json:"impl"`
	DType     string                    `json:"dtype"`
	B         int                       `json:"B"`
	H         int                       `json:"H"`
	HKV       int                       `json:"H_kv,omitempty"` // K/V heads (sdpa_error.py: always; -json: only when not H)
	S         int                       `json:"S"`
	D         int                       `json:"D"`
	Causal    bool                      `json:"causal"`
	Scale     float64                   `json:"scale"`
	Seed      uint64                    `json:"seed,omitempty"`
	Metrics   map[string]accuracyMetric `json:"metrics"`
	GPU       string                    `json:"gpu,omitempty"`
	Torch     string                    `json:"torch,omitempty"`
	RefDevice string                    `json:"ref_device,omitempty"`
	Error     *string                   `json:"error"`
}

// accuracyImpl maps sdpa_error.py's impl names to the bench's.
func accuracyImpl(py string) string {
	if py == "ours" {
		return "fused"
	}
	return "torch-" + py
}

// parseAccuracyRows reads sdpa_error.py's JSON lines.
func parseAccuracyRows(r io.Reader) ([]accuracyRow, error) {
	var rows []accuracyRow
	err := readJSONLines(r, func(line int, rec accuracyRow) error {
		if rec.Case == "" || rec.Impl == "" || rec.S <= 0 || rec.D <= 0 || rec.B <= 0 || rec.H <= 0 {
			return fmt.Errorf("PyTorch output line %d: missing case, impl or shape", line)
		}
		if rec.Error == nil && rec.Metrics == nil {
			return fmt.Errorf("PyTorch output line %d: neither metrics nor an error", line)
		}
		if rec.HKV == rec.H {
			rec.HKV = 0
		}
		rec.Kind, rec.Impl = "attention_accuracy", accuracyImpl(rec.Impl)
		rows = append(rows, rec)
		return nil
	})
	return rows, err
}

// checkAccuracyPython fails early, before any GPU work, when the script is
// not there or the python cannot import torch and numpy.
func checkAccuracyPython(py, script string) error {
	if _, err := os.Stat(script); err != nil {
		return fmt.Errorf("-accuracy-script %s: %w (run from the repository root or pass -accuracy-script)", script, err)
	}
	if _, err := exec.LookPath(py); err != nil {
		return fmt.Errorf("-torch %s: %w (bench -accuracy needs a python3 with torch and numpy)", py, err)
	}
	var errBuf bytes.Buffer
	cmd := exec.Command(py, "-c", "import numpy, torch")
	cmd.Stdout, cmd.Stderr = io.Discard, &errBuf
	if err := cmd.Run(); err != nil {
		why := strings.TrimSpace(errBuf.String())
		if i := strings.LastIndexByte(why, '\n'); i >= 0 {
			why = why[i+1:]
		}
		return fmt.Errorf("-torch %s cannot import torch and numpy (%v: %s); bench -accuracy needs both", py, err, why)
	}
	return nil
}

// runAccuracyPython runs sdpa_error.py on dir and returns its rows (those it
// wrote before failing, with the error).
func runAccuracyPython(stderr io.Writer, py, script, dir, backends, refDev string) ([]accuracyRow, error) {
	out := filepath.Join(dir, "errors.jsonl")
	// A kept folder may hold an earlier run's lines: they must not pass for this run's.
	if err := os.Remove(out); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	args := []string{script, "--dir", dir, "--out", out, "--backends", backends, "--device", refDev}
	return runPythonJSONLines(stderr, py, args, out, parseAccuracyRows)
}

// RunAccuracyReport is `flashgraph bench -accuracy`: our kernels run each
// case, sdpa_error.py measures them and SDPA's against a float64 reference,
// and the report compares the errors.
func RunAccuracyReport(stdout, stderr io.Writer, o AccuracyOptions) error {
	if err := cuda.Available(); err != nil {
		return fmt.Errorf("bench -accuracy needs a CUDA GPU: %v", err)
	}
	if err := checkAccuracyPython(o.TorchPy, o.Script); err != nil {
		return err
	}
	if o.JSONOut != "" {
		if err := train.WriteOutputFile("-json", o.JSONOut, nil); err != nil {
			return err
		}
	}
	dir := o.Keep
	if dir == "" {
		tmp, err := os.MkdirTemp("", "flashgraph-accuracy-*")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("-accuracy-dir %s: %w", dir, err)
	}
	d, err := cuda.Open(0)
	if err != nil {
		return fmt.Errorf("bench -accuracy needs a CUDA GPU: %w", err)
	}
	header := deviceLine(d)
	env := map[string]string{}
	for _, name := range []string{cuda.FlashSM90Env, cuda.FlashSM90BwdEnv, cuda.FlashDecodeEnv, cuda.FlashGQABwdEnv} {
		if v, ok := os.LookupEnv(name); ok {
			env[name] = v
		}
	}
	man := accuracyManifest{Format: accuracyFormat, Layout: accuracyLayout, Device: header, Seed: o.Seed, Env: env}
	var rows []accuracyRow
	var failed []string
	t0 := time.Now()
	for _, c := range o.Cases {
		data, err := RunAccuracy(d, c, o.Seed)
		if err == nil {
			var ent accuracyCaseEnt
			if ent, err = writeAccuracyCase(dir, data); err == nil {
				man.Cases = append(man.Cases, ent)
				fmt.Fprintf(stderr, "bench: accuracy %v: ours ran, files in %s\n", c, filepath.Join(dir, ent.Name))
				continue
			}
		}
		// A case our kernels cannot run is a failure to report, after the others.
		fmt.Fprintf(stderr, "bench: accuracy %v: %v\n", c, err)
		failed = append(failed, fmt.Sprintf("%v: %s", c, firstLine(err.Error(), 200)))
		hkv := 0
		if c.KV() != c.H {
			hkv = c.KV()
		}
		rows = append(rows, accuracyRow{Kind: "attention_accuracy", Case: accuracyCaseName(c), Impl: "fused", DType: c.DType,
			B: c.B, H: c.H, HKV: hkv, S: c.S, D: c.D, Causal: c.Causal, Scale: float64(c.Scale()), Seed: o.Seed, GPU: d.Name(),
			Error: sptr(err.Error())})
	}
	gpu := d.Name()
	if err := d.Close(); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "bench: our kernels ran %d of %d cases in %v\n", len(man.Cases), len(o.Cases), time.Since(t0).Round(time.Millisecond))
	var pyErr error
	if len(man.Cases) > 0 {
		if err := writeAccuracyManifest(dir, man); err != nil {
			return err
		}
		// What the script will read, checked here where a mistake is ours.
		if _, err := readAccuracyManifest(dir); err != nil {
			return err
		}
		pr, err := runAccuracyPython(stderr, o.TorchPy, o.Script, dir, o.Backends, o.RefDev)
		pyErr = err
		for i := range pr {
			pr[i].Seed = o.Seed
			if pr[i].GPU == "" {
				pr[i].GPU = gpu
			}
		}
		rows = append(rows, pr...)
	}

	fmt.Fprintf(stdout, "flashgraph bench -accuracy: %s\n", header)
	fmt.Fprintf(stdout, "command: %s; %s\n", o.Command, time.Now().UTC().Format("2006-01-02"))
	printAccuracyPreamble(stdout, o, rows, env)
	printAccuracyTable(stdout, o.Cases, rows, "rel")
	fmt.Fprintln(stdout)
	printAccuracyTable(stdout, o.Cases, rows, "max")
	fmt.Fprintln(stdout)
	printAccuracyVerdict(stdout, o.Cases, rows)
	if o.Keep != "" {
		fmt.Fprintf(stdout, "inputs, our outputs, manifest.json and errors.jsonl kept in %s\n", dir)
	}

	if o.JSONOut != "" {
		if err := writeJSONLines(stderr, o.JSONOut, rows); err != nil {
			return err
		}
	}
	var errs []error
	if len(failed) > 0 {
		errs = append(errs, fmt.Errorf("our kernels failed on %d of %d cases: %s", len(failed), len(o.Cases), strings.Join(failed, "; ")))
	}
	if pyErr != nil {
		errs = append(errs, fmt.Errorf("the reference script failed: %w", pyErr))
	}
	return errors.Join(errs...)
}

// printAccuracyPreamble says what was compared: shapes, inputs, our
// kernels' selection, PyTorch's version and where the reference ran.
func printAccuracyPreamble(w io.Writer, o AccuracyOptions, rows []accuracyRow, env map[string]string) {
	h := 0
	if len(o.Cases) > 0 {
		h = o.Cases[0].H
	}
	fmt.Fprintf(w, "B=1 H=%d, Sq=Sk=S, scale 1/√D; Q, K, V, dO ~ N(0,1) rounded to the element type (seed %d), the same for every impl\n", h, o.Seed)
	if accuracyGrouped(o.Cases) {
		fmt.Fprintln(w, "Hkv: K/V heads; below H, grouped-query attention: ours on K/V of Hkv heads (dK, dV summed over each group in the kernel,")
		fmt.Fprintln(w, "or after it where the backward runs on K/V repeated to every head: "+cuda.FlashGQABwdEnv+"),")
		fmt.Fprintln(w, "SDPA with enable_gqa=True, the reference with query head h reading K/V head h/(H/Hkv) and dK, dV summed over the group")
	}
	sel := []string{}
	names := []string{cuda.FlashSM90Env, cuda.FlashSM90BwdEnv}
	if accuracyGrouped(o.Cases) {
		names = append(names, cuda.FlashGQABwdEnv)
	}
	for _, name := range names {
		v, ok := env[name]
		if !ok {
			v = "unset"
		}
		sel = append(sel, name+"="+v)
	}
	fmt.Fprintf(w, "ours: FlashForward + FlashBackward as the environment picks them (%s; on compute capability 9.0\n", strings.Join(sel, ", "))
	fmt.Fprintln(w, "unset means the Hopper forward and backward); cudnn, flash: PyTorch SDPA with that backend forced, forward and backward")
	torch, refDev := "", ""
	for _, r := range rows {
		if r.Torch != "" {
			torch, refDev = r.Torch, r.RefDevice
			break
		}
	}
	if torch != "" {
		fmt.Fprintf(w, "reference: float64 on %s from the same 16-bit inputs (tools/reference/sdpa_error.py, PyTorch %s)\n", refDev, torch)
	}
}

// accuracyGrouped says whether a case has fewer K/V heads than query heads.
func accuracyGrouped(cases []AccuracyCase) bool {
	return slices.ContainsFunc(cases, func(c AccuracyCase) bool { return c.KV() != c.H })
}

// accuracyKey finds a row by case and impl.
type accuracyKey struct{ name, impl string }

func indexAccuracyRows(rows []accuracyRow) map[accuracyKey]accuracyRow {
	by := map[accuracyKey]accuracyRow{}
	for _, r := range rows {
		by[accuracyKey{r.Case, r.Impl}] = r
	}
	return by
}

// accuracyValue is one metric of one output of one row: the number, or why
// there is none ("err": the impl did not run; "nan": non-finite elements;
// "-": no row or no metric).
func accuracyValue(r accuracyRow, ok bool, out, metric string) (*float64, string) {
	switch {
	case !ok:
		return nil, "-"
	case r.Error != nil:
		return nil, "err"
	}
	m, has := r.Metrics[out]
	switch {
	case !has:
		return nil, "-"
	case m.Nonfinite > 0:
		return nil, "nan"
	case metric == "max":
		return m.MaxAbs, "-"
	}
	return m.RelL2, "-"
}

// accuracyRatio is ours/cuDNN with two decimals, "*" after a ratio above 1.
func accuracyRatio(ours, cd *float64) string {
	if ours == nil || cd == nil || !(*cd > 0) {
		return "-"
	}
	r := *ours / *cd
	s := strconv.FormatFloat(r, 'f', 2, 64)
	if r > 1 {
		s += "*"
	}
	return s
}

func sciOr(v *float64, why string) string {
	if v == nil {
		return why
	}
	return fmt.Sprintf("%.2e", *v)
}

// printAccuracyTable writes one line per case: for O, dQ, dK, dV ours,
// cuDNN's, ours/cuDNN and FLASH's error, then our LSE's; metric "rel" is
// the relative L2 error, "max" the max absolute error. Impls that did not
// run are listed below it with their reason.
func printAccuracyTable(w io.Writer, cases []AccuracyCase, rows []accuracyRow, metric string) {
	by := indexAccuracyRows(rows)
	if metric == "max" {
		fmt.Fprintln(w, "max |x − ref| vs float64 (ours/cd: ours ÷ cuDNN; * marks a ratio above 1):")
	} else {
		fmt.Fprintln(w, "relative L2 error vs float64, ‖x − ref‖₂ / ‖ref‖₂ (ours/cd: ours ÷ cuDNN, <= 1: ours no larger; * marks a ratio above 1):")
	}
	// An Hkv column only when a case is grouped: multi-head reports keep
	// their layout.
	grouped := accuracyGrouped(cases)
	lead, hkvHead := "", ""
	if grouped {
		lead, hkvHead = "     ", " Hkv"
	}
	fmt.Fprintf(w, "%-5s %4s %6s %2s%s |", "", "", "", "", lead)
	for _, out := range accuracyOutputs {
		fmt.Fprintf(w, " %-35s|", accuracyOutputNames[out])
	}
	fmt.Fprintf(w, " %8s\n", "LSE")
	fmt.Fprintf(w, "%-5s %4s %6s %2s%s |", "dtype", "D", "S", "c", hkvHead)
	for range accuracyOutputs {
		fmt.Fprintf(w, " %8s %8s %7s %8s |", "ours", "cudnn", "ours/cd", "flash")
	}
	fmt.Fprintf(w, " %8s\n", "ours")
	var notes []string
	for _, c := range cases {
		name := accuracyCaseName(c)
		ours, oursOK := by[accuracyKey{name, "fused"}]
		cd, cdOK := by[accuracyKey{name, "torch-cudnn"}]
		fl, flOK := by[accuracyKey{name, "torch-flash"}]
		fmt.Fprintf(w, "%-5s %4d %6d %2d", shortDType(c.DType), c.D, c.S, boolDigit(c.Causal))
		if grouped {
			fmt.Fprintf(w, " %4d", c.KV())
		}
		fmt.Fprint(w, " |")
		for _, out := range accuracyOutputs {
			ov, ow := accuracyValue(ours, oursOK, out, metric)
			cv, cw := accuracyValue(cd, cdOK, out, metric)
			fv, fw := accuracyValue(fl, flOK, out, metric)
			fmt.Fprintf(w, " %8s %8s %7s %8s |", sciOr(ov, ow), sciOr(cv, cw), accuracyRatio(ov, cv), sciOr(fv, fw))
		}
		lv, lw := accuracyValue(ours, oursOK, "lse", metric)
		fmt.Fprintf(w, " %8s\n", sciOr(lv, lw))
		if metric == "rel" {
			for _, r := range []struct {
				row accuracyRow
				ok  bool
			}{{ours, oursOK}, {cd, cdOK}, {fl, flOK}} {
				if r.ok && r.row.Error != nil {
					notes = append(notes, fmt.Sprintf("  %s %s: %s", r.row.Impl, name, firstLine(*r.row.Error, 200)))
				}
			}
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w, "not run:")
		for _, n := range notes {
			fmt.Fprintln(w, n)
		}
	}
}

func boolDigit(b bool) int {
	if b {
		return 1
	}
	return 0
}

// printAccuracyVerdict closes the report: whether ours/cuDNN <= 1 for the
// relative L2 error of every output of every case, and where not (or where
// there is no pair to compare).
func printAccuracyVerdict(w io.Writer, cases []AccuracyCase, rows []accuracyRow) {
	by := indexAccuracyRows(rows)
	var over, missing []string
	total, compared := 0, 0
	for _, c := range cases {
		name := accuracyCaseName(c)
		ours, oursOK := by[accuracyKey{name, "fused"}]
		cd, cdOK := by[accuracyKey{name, "torch-cudnn"}]
		label := fmt.Sprintf("%s D=%d S=%d causal=%v", shortDType(c.DType), c.D, c.S, c.Causal)
		if c.KV() != c.H {
			label = fmt.Sprintf("%s D=%d S=%d H_kv=%d causal=%v", shortDType(c.DType), c.D, c.S, c.KV(), c.Causal)
		}
		var lacking []string
		for _, out := range accuracyOutputs {
			total++
			ov, _ := accuracyValue(ours, oursOK, out, "rel")
			cv, _ := accuracyValue(cd, cdOK, out, "rel")
			switch {
			case ov == nil || cv == nil || !(*cv > 0):
				lacking = append(lacking, accuracyOutputNames[out])
				continue
			case *ov > *cv:
				over = append(over, fmt.Sprintf("%s %s: %.2f (%.2e vs %.2e)", label, accuracyOutputNames[out], *ov / *cv, *ov, *cv))
			}
			compared++
		}
		if len(lacking) > 0 {
			missing = append(missing, label+" "+strings.Join(lacking, ","))
		}
	}
	switch {
	case compared == 0:
		fmt.Fprintf(w, "verdict: nothing compared: no case has both our and cuDNN's errors\n")
	case len(over) == 0 && compared == total:
		fmt.Fprintf(w, "verdict: ours/cuDNN <= 1 for all %d relative L2 errors (O, dQ, dK, dV of %d %s)\n", total, len(cases), plural(len(cases), "case", "cases"))
	case len(over) == 0:
		fmt.Fprintf(w, "verdict: ours/cuDNN <= 1 for all %d relative L2 errors compared, of %d\n", compared, total)
	default:
		fmt.Fprintf(w, "verdict: ours/cuDNN > 1 for %d of the %d relative L2 errors compared (%d in all):\n", len(over), compared, total)
		for _, s := range over {
			fmt.Fprintln(w, "  "+s)
		}
	}
	if len(missing) > 0 {
		fmt.Fprintf(w, "not compared (ours or cuDNN has no finite number): %s\n", strings.Join(missing, "; "))
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
