package checkpoint

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flashgraph/flashgraph/graph"
)

// ckptTensors is a checkpoint-shaped tensor set of about size float32s.
func ckptTensors(step int64, size int) *Tensors {
	w := graph.NewTensor(graph.Float32, graph.Shape{size})
	for i := range w.F32 {
		w.F32[i] = float32(step) + float32(i)*1e-3
	}
	m := graph.NewTensor(graph.Float32, graph.Shape{size})
	m.F32[0] = float32(step)
	return &Tensors{
		Tensors:  map[string]*graph.Tensor{"w": w, "opt.m.w": m, "opt.v.w": m.Clone()},
		Metadata: map[string]string{MetaFormat: CheckpointFormat, MetaStep: fmt.Sprint(step)},
	}
}

func checkLoads(t *testing.T, path string, step int64, size int) {
	t.Helper()
	ts, got, err := LoadCheckpoint(path)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	if got != step {
		t.Fatalf("%s: step %d, want %d", path, got, step)
	}
	want := ckptTensors(step, size)
	for n, w := range want.Tensors {
		if !sameBits(ts.Tensors[n], w) {
			t.Fatalf("%s: tensor %s differs from what was saved", path, n)
		}
	}
}

func TestCheckpointSaveLoadPrune(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt") // SaveCheckpoint makes the folder
	if p, s, err := LatestCheckpoint(dir); err != nil || p != "" || s != 0 {
		t.Fatalf("empty folder: latest %q %d %v", p, s, err)
	}
	for step := int64(1); step <= 7; step++ {
		if _, err := SaveCheckpoint(dir, step, ckptTensors(step, 10), 3); err != nil {
			t.Fatal(err)
		}
	}
	steps, _ := ListCheckpoints(dir)
	if fmt.Sprint(steps) != "[3 6 7]" {
		t.Errorf("kept steps %v, want [3 6 7] (keep-every 3 and the newest)", steps)
	}
	p, s, err := LatestCheckpoint(dir)
	if err != nil || s != 7 || p != CheckpointPath(dir, 7) {
		t.Fatalf("latest %q %d %v", p, s, err)
	}
	checkLoads(t, p, 7, 10)
	checkLoads(t, CheckpointPath(dir, 3), 3, 10)

	// Not one of ours: a safetensors file without our format.
	other := filepath.Join(dir, "other.safetensors")
	ts := ckptTensors(1, 1)
	delete(ts.Metadata, MetaFormat)
	WriteFileAtomic(other, func(w io.Writer) error { return WriteSafetensors(w, ts) })
	if _, _, err := LoadCheckpoint(other); err == nil || !strings.Contains(err.Error(), "not a flashgraph training checkpoint") {
		t.Errorf("foreign file: err %v", err)
	}
	// A truncated checkpoint is a clear error.
	data, _ := os.ReadFile(p)
	os.WriteFile(p, data[:len(data)-5], 0o644)
	if _, _, err := LoadCheckpoint(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("truncated checkpoint: err %v, want one naming the file", err)
	}
}

func TestCheckpointCheckState(t *testing.T) {
	ts := ckptTensors(1, 4)
	f32 := func(s ...int) graph.TensorType { return graph.TensorType{DType: graph.Float32, Shape: s} }
	if err := CheckState(ts, map[string]graph.TensorType{"w": f32(4), "opt.m.w": f32(4), "opt.v.w": f32(4)}); err != nil {
		t.Errorf("matching state: %v", err)
	}
	err := CheckState(ts, map[string]graph.TensorType{"w": f32(2, 2), "opt.m.w": f32(4), "b": f32(1)})
	if err == nil {
		t.Fatal("mismatched state accepted")
	}
	for _, want := range []string{"missing b", "w is float32[4], the graph wants float32[2,2]", "unexpected tensor opt.v.w"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// failAfter passes n bytes through and then fails, like a full disk.
type failAfter struct {
	w io.Writer
	n int
}

var errDiskFull = errors.New("simulated: no space left on device")

func (f *failAfter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		k, _ := f.w.Write(p[:f.n])
		f.n = 0
		return k, errDiskFull
	}
	f.n -= len(p)
	return f.w.Write(p)
}

func TestCheckpointFailedWriteKeepsPrevious(t *testing.T) {
	dir := t.TempDir()
	if _, err := SaveCheckpoint(dir, 1, ckptTensors(1, 1000), 0); err != nil {
		t.Fatal(err)
	}
	SaveHook = func(w io.Writer) io.Writer { return &failAfter{w: w, n: 1500} }
	defer func() { SaveHook = nil }()
	_, err := SaveCheckpoint(dir, 2, ckptTensors(2, 1000), 0)
	if !errors.Is(err, errDiskFull) {
		t.Fatalf("save through a failing writer: err %v", err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("folder holds %v; want only the step-1 checkpoint (no temporary left)", names)
	}
	p, s, _ := LatestCheckpoint(dir)
	if s != 1 {
		t.Fatalf("latest is step %d after a failed save, want 1", s)
	}
	checkLoads(t, p, 1, 1000)
}

// TestCheckpointKilledMidWrite kills a process while it writes a checkpoint
// (SIGKILL: no deferred cleanup runs) and checks that the previous checkpoint
// is still the latest and loads, that the partial file is ignored, and that
// the next save cleans it up.
func TestCheckpointKilledMidWrite(t *testing.T) {
	if os.Getenv("FLASHGRAPH_CKPT_HELPER") != "" {
		return // the helper side runs in TestMain
	}
	dir := t.TempDir()
	const size = 1 << 18
	cmd := exec.Command(os.Args[0], "-test.run=^TestCheckpointKilledMidWrite$")
	cmd.Env = append(os.Environ(), "FLASHGRAPH_CKPT_HELPER="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	// The helper prints "writing" once it is part way into the step-2 file.
	sc := bufio.NewScanner(out)
	deadline := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	defer deadline.Stop()
	for sc.Scan() && sc.Text() != "writing" {
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	var temps []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			temps = append(temps, e.Name())
		}
	}
	if len(temps) != 1 {
		t.Fatalf("want the killed write's partial temporary in the folder, found %v", ents)
	}
	if st, _ := os.Stat(filepath.Join(dir, temps[0])); st.Size() == 0 || st.Size() >= 3*4*size {
		t.Errorf("partial file is %d bytes; the kill should have hit mid-write", st.Size())
	}
	p, s, err := LatestCheckpoint(dir)
	if err != nil || s != 1 {
		t.Fatalf("latest after the kill: step %d, err %v; want step 1", s, err)
	}
	checkLoads(t, p, 1, size)
	if _, err := SaveCheckpoint(dir, 3, ckptTensors(3, 10), 0); err != nil {
		t.Fatal(err)
	}
	ents, _ = os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != filepath.Base(CheckpointPath(dir, 3)) {
		t.Errorf("after the next save the folder holds %v, want only step 3", ents)
	}
}

// ckptHelper is the child of TestCheckpointKilledMidWrite: it saves step 1,
// then starts step 2 and stalls half way, waiting to be killed.
func ckptHelper(dir string) {
	const size = 1 << 18
	if _, err := SaveCheckpoint(dir, 1, ckptTensors(1, size), 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	SaveHook = func(w io.Writer) io.Writer { return &stallAfter{w: w, n: 4 * size} }
	SaveCheckpoint(dir, 2, ckptTensors(2, size), 0)
	os.Exit(3) // not reached: the parent kills us inside the write
}

// stallAfter writes n bytes (to the file, so they are really there), says
// so on stdout, and then blocks.
type stallAfter struct {
	w io.Writer
	n int
}

func (s *stallAfter) Write(p []byte) (int, error) {
	if len(p) <= s.n {
		s.n -= len(p)
		return s.w.Write(p)
	}
	k, _ := s.w.Write(p[:s.n])
	if f, ok := s.w.(*os.File); ok {
		f.Sync()
	}
	fmt.Println("writing")
	// Sleep rather than block forever: with no other goroutine, the
	// runtime would call a bare select{} a deadlock and exit by itself.
	time.Sleep(time.Hour)
	return k, errors.New("not killed")
}

func TestMain(m *testing.M) {
	if dir := os.Getenv("FLASHGRAPH_CKPT_HELPER"); dir != "" {
		ckptHelper(dir)
	}
	os.Exit(m.Run())
}
