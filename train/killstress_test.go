package train

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
)

// The kill stress: a training run in a child process is killed with SIGKILL
// (no deferred code, no signal handler: what a power cut or the OOM killer
// does) at random moments inside a step, inside validation and inside a
// checkpoint write, and resumed each time from the newest checkpoint; every
// run that reaches the end must hold exactly the tensors, losses and
// validation points of an uninterrupted run.
//
// FLASHGRAPH_STRESS_KILLS sets the number of kills (default 5, which keeps
// `go test ./train` fast; `make fuzz-long` runs 50), FLASHGRAPH_STRESS_SEED
// the random seed (logged, so a failure can be replayed).

const (
	stressSteps     = 12
	stressEvalEvery = 3
	stressCkptEvery = 2
	stressPrefix    = "killstress: "
)

func stressOptions(t *testing.T, dir string, resume bool) Options {
	return Options{Config: testConfig(t, graph.Float32), Hyper: testHyper(stressSteps),
		EvalEvery: stressEvalEvery, CkptDir: dir, CkptEvery: stressCkptEvery, Resume: resume}
}

// stressChild is the child's side: train from the newest checkpoint (or from
// scratch), announcing each phase on stdout so the parent can aim its kill.
// With FLASHGRAPH_KILL_CKPT_AT=n, the first checkpoint write stops after n
// bytes and asks to be killed there.
func stressChild(t *testing.T, dir string) {
	say := func(format string, args ...any) { fmt.Printf(stressPrefix+format+"\n", args...) }
	if at, err := strconv.Atoi(os.Getenv("FLASHGRAPH_KILL_CKPT_AT")); err == nil {
		checkpoint.SaveHook = func(w io.Writer) io.Writer {
			checkpoint.SaveHook = nil
			return &killMeAfter{w: w, n: at, say: say}
		}
	}
	latest, _, err := checkpoint.LatestCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	opts := stressOptions(t, dir, latest != "")
	opts.OnStep = func(step int64, _ float64) {
		// What Run does next: validate at multiples of EvalEvery, else train
		// (or checkpoint, which the hook announces itself).
		if step%stressEvalEvery == 0 && step != stressSteps {
			say("eval %d", step)
		} else {
			say("step %d", step)
		}
	}
	if _, err := Run(context.Background(), cpu.New(), testCorpus(t), opts); err != nil {
		t.Fatal(err)
	}
	say("done")
}

// killMeAfter writes n bytes of a checkpoint, asks to be killed, and waits.
type killMeAfter struct {
	w   io.Writer
	n   int
	say func(string, ...any)
}

func (k *killMeAfter) Write(p []byte) (int, error) {
	if len(p) <= k.n {
		k.n -= len(p)
		return k.w.Write(p)
	}
	n, _ := k.w.Write(p[:k.n])
	k.say("ckpt")
	time.Sleep(time.Hour) // the parent kills us here
	return n, fmt.Errorf("not killed")
}

func TestTrainKillStress(t *testing.T) {
	if dir := os.Getenv("FLASHGRAPH_KILL_HELPER"); dir != "" {
		stressChild(t, dir)
		return
	}
	kills := 5
	if s := os.Getenv("FLASHGRAPH_STRESS_KILLS"); s != "" {
		var err error
		if kills, err = strconv.Atoi(s); err != nil || kills < 0 {
			t.Fatalf("FLASHGRAPH_STRESS_KILLS=%q", s)
		}
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("FLASHGRAPH_STRESS_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("%d kills, FLASHGRAPH_STRESS_SEED=%d", kills, seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	// The uninterrupted run, and how long a step and a validation take (a
	// kill aimed at one lands at a uniform moment within its duration).
	refDir := t.TempDir()
	ref, err := Run(context.Background(), cpu.New(), testCorpus(t), stressOptions(t, refDir, false))
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := checkpoint.LoadCheckpoint(ref.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(ref.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	stepDur, evalDur := phaseDurations(t)

	dir := t.TempDir()
	killed := map[string]int{}
	completed := 0
	for n := 0; n <= kills; n++ {
		target := []string{"step", "eval", "ckpt"}[n%3]
		if n == kills {
			target = "" // the last child runs to the end
		}
		env := append(os.Environ(), "FLASHGRAPH_KILL_HELPER="+dir)
		if target == "ckpt" {
			env = append(env, fmt.Sprintf("FLASHGRAPH_KILL_CKPT_AT=%d", rng.Int64N(st.Size())))
		}
		delay := map[string]time.Duration{"step": stepDur, "eval": evalDur}[target]
		delay = time.Duration(rng.Float64() * 0.8 * float64(delay))
		switch runStressChild(t, env, target, delay) {
		case "killed":
			killed[target]++
			continue
		case "done":
			completed++
			checkStressResult(t, dir, want)
			if n < kills {
				// The run finished before the aimed phase came round:
				// start a new one, so every kill interrupts something.
				dir = t.TempDir()
				n--
			}
		}
	}
	t.Logf("kills by phase: %v; runs completed and matched: %d", killed, completed)
}

// phaseDurations times one training step and one validation of the stress
// configuration in this process.
func phaseDurations(t *testing.T) (step, eval time.Duration) {
	opts := stressOptions(t, "", false)
	tr, err := NewTrainer(cpu.New(), opts.Config, false, opts.Hyper, testCorpus(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for range 2 { // the second step is the steady one
		t0 := time.Now()
		if _, err := tr.Step(); err != nil {
			t.Fatal(err)
		}
		step = time.Since(t0)
	}
	t0 := time.Now()
	if _, err := tr.Eval(); err != nil {
		t.Fatal(err)
	}
	return step, time.Since(t0)
}

// runStressChild runs one child and SIGKILLs it delay after it announces the
// target phase ("ckpt": as soon as it asks, part way into the write). It
// returns "killed" or "done".
func runStressChild(t *testing.T, env []string, target string, delay time.Duration) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestTrainKillStress$")
	cmd.Env = env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	guard := time.AfterFunc(2*time.Minute, func() { cmd.Process.Kill() })
	defer guard.Stop()
	var seen []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), stressPrefix)
		if !ok {
			continue
		}
		seen = append(seen, line)
		if line == "done" {
			break
		}
		if target != "" && strings.Fields(line)[0] == target {
			time.Sleep(delay)
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			return "killed"
		}
	}
	io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil || len(seen) == 0 || seen[len(seen)-1] != "done" {
		t.Fatalf("child failed (%v) after %v:\n%s", err, seen, stderr.String())
	}
	return "done"
}

// checkStressResult compares the final checkpoint of a killed-and-resumed
// run with the uninterrupted run's: every tensor bit for bit, and the loss
// and validation history.
func checkStressResult(t *testing.T, dir string, want *checkpoint.Tensors) {
	t.Helper()
	p, step, err := checkpoint.LatestCheckpoint(dir)
	if err != nil || step != stressSteps {
		t.Fatalf("after the last resume the newest checkpoint is step %d (%v), want %d", step, err, stressSteps)
	}
	got, _, err := checkpoint.LoadCheckpoint(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Tensors) != len(want.Tensors) {
		t.Fatalf("resumed run has %d tensors, uninterrupted %d", len(got.Tensors), len(want.Tensors))
	}
	for n, w := range want.Tensors {
		if g, ok := got.Tensors[n]; !ok || !sameBits(g, w) {
			t.Errorf("tensor %s differs from the uninterrupted run", n)
		}
	}
	for _, k := range []string{checkpoint.MetaLosses, checkpoint.MetaValLosses, checkpoint.MetaTrainTokens, checkpoint.MetaDataNext} {
		if got.Metadata[k] != want.Metadata[k] {
			t.Errorf("metadata %s: resumed %.80q, uninterrupted %.80q", k, got.Metadata[k], want.Metadata[k])
		}
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("a killed write's temporary %s is still there after later saves", e.Name())
		}
	}
}
