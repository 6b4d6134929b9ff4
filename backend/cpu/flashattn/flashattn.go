// Package flashattn is the reference CPU implementation of FlashAttention
// (forward and backward) on contiguous row-major slices.
//
// Layout: q, o and do are [BH, Sq, D]; k and v are [BH, Sk, D]; the
// logsumexp lse is [BH, Sq]. BH is batch×heads flattened: heads are
// independent. The Grouped variants take k and v with BH/group heads
// (grouped-query attention): query head h reads K/V head h/group, and the
// backward pass sums dK and dV over each K/V head's group. Scores are scale·Q·Kᵀ; causal masking is top-left aligned
// (query i sees keys j <= i), as in ONNX Attention without past KV and
// PyTorch SDPA is_causal.
//
// The algorithm is FlashAttention-2's, not a composed softmax: the forward
// pass tiles queries into Br-row blocks and streams Bc-row blocks of K and V
// through an online softmax (running max m, running sum l, accumulator
// rescaled by exp(m_old − m_new)), normalises once and keeps LSE = m + ln l.
// The backward pass recomputes P = exp(S − LSE) tile by tile. Each worker
// holds at most two Br×Bc tiles (plus Br-long row statistics); nothing Sq×Sk
// is ever allocated (the tests measure it).
//
// # Logsumexp dtype
//
// The lse element type L is a type parameter of its own, independent of the
// data type T. The FlashAttention graph op uses L = float32 for float32 (and
// narrower) inputs and L = float64 for float64 inputs: a float32 logsumexp in
// a float64 backward makes P = exp(S − L) wrong by |L|·2⁻²⁴ ≈ 1e-7 relative,
// which would break float64 fused-vs-unfused agreement at 1e-10. Any pairing
// is accepted; it is the op's choice, not this package's.
//
// # Determinism
//
// Work is split into tasks that own disjoint output rows and accumulate in a
// fixed order, so results are bitwise identical for any GOMAXPROCS.
package flashattn

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
)

// Float is the element type of Q, K, V, O and their gradients, and of the
// logsumexp.
type Float interface{ ~float32 | ~float64 }

// Tile sizes. 64×64 keeps a tile of float64 scores at 32 KiB, so a worker's
// Q, K, V and score tiles stay in L2 on any current CPU; it is also gonum's
// GEMM block size, so each tile GEMM is one serial gonum block product.
const (
	br = 64 // query rows per block
	bc = 64 // key/value rows per block
)

// Forward computes O = softmax(scale·Q·Kᵀ [causal mask]) · V and, if lse is
// not nil, the natural-log logsumexp of each (scaled, masked) score row.
//
// o and lse are overwritten and must not alias the inputs. lse may be nil
// when only O is needed (pass a typed nil, e.g. []float32(nil), so that L
// can be inferred). A row with no visible key (only possible here when
// sk == 0) gets O = 0 and LSE = +Inf, which makes the backward pass treat
// its probabilities as exactly 0.
func Forward[T Float, L Float](q, k, v, o []T, lse []L, bh, sq, sk, d int, scale float64, causal bool) error {
	return forward(q, k, v, o, lse, bh, 1, sq, sk, d, scale, causal, runtime.GOMAXPROCS(0))
}

// ForwardGrouped is Forward with k and v of bh/group heads [BH/group, Sk,
// D]: query head h attends to K/V head h/group. group 1 is Forward.
func ForwardGrouped[T Float, L Float](q, k, v, o []T, lse []L, bh, group, sq, sk, d int, scale float64, causal bool) error {
	return forward(q, k, v, o, lse, bh, group, sq, sk, d, scale, causal, runtime.GOMAXPROCS(0))
}

func forward[T Float, L Float](q, k, v, o []T, lse []L, bh, group, sq, sk, d int, scale float64, causal bool, workers int) error {
	if err := checkDims(bh, sq, sk, d, scale); err != nil {
		return err
	}
	if err := checkGroup(bh, group); err != nil {
		return err
	}
	nq, nk := bh*sq*d, bh/group*sk*d
	if err := checkLens(lenCheck{"q", len(q), nq}, lenCheck{"k", len(k), nk}, lenCheck{"v", len(v), nk}, lenCheck{"o", len(o), nq}); err != nil {
		return err
	}
	if lse != nil {
		if err := checkLens(lenCheck{"lse", len(lse), bh * sq}); err != nil {
			return err
		}
	}

	qBlocks := ceilDiv(sq, br)
	forEachTask(bh*qBlocks, workers, func() func(int) {
		// Scratch for one worker, reused for all of its tasks.
		s := make([]T, br*bc)
		m := make([]float64, br)
		l := make([]float64, br)
		return func(task int) {
			h, i0 := task/qBlocks, (task%qBlocks)*br
			rows := min(br, sq-i0)
			g := h / group // the K/V head of query head h
			qh, kh, vh := q[h*sq*d:(h+1)*sq*d], k[g*sk*d:(g+1)*sk*d], v[g*sk*d:(g+1)*sk*d]
			oi := o[(h*sq+i0)*d : (h*sq+i0+rows)*d]
			var lseRows []L
			if lse != nil {
				lseRows = lse[h*sq+i0 : h*sq+i0+rows]
			}
			forwardBlock(qh[i0*d:(i0+rows)*d], kh, vh, oi, lseRows, rows, i0, sk, d, scale, causal, s, m[:rows], l[:rows])
		}
	})
	return nil
}

// forwardBlock runs the online softmax for one block of rows query rows
// starting at query index i0 of one head. o is used as the (unnormalised)
// accumulator, so the worker needs no Br×D scratch of its own. The running
// max and sum are kept in float64 even for float32 data: they are per row,
// so the cost is nil, and l sums up to Sk terms.
func forwardBlock[T Float, L Float](qi, k, v, oi []T, lse []L, rows, i0, sk, d int, scale float64, causal bool, sBuf []T, m, l []float64) {
	clear(oi)
	for a := range m {
		m[a] = math.Inf(-1)
		l[a] = 0
	}
	kEnd := sk
	if causal {
		// Keys past the block's last row are masked for every row: the
		// blocks beyond the diagonal are skipped, not computed and masked.
		kEnd = min(sk, i0+rows)
	}
	for j0 := 0; j0 < kEnd; j0 += bc {
		c := min(bc, kEnd-j0)
		s := sBuf[:rows*c]
		// Raw Q·Kᵀ: scale is applied in float64 below, so float32 data does
		// not also pay for rounding scale to float32.
		gemm(false, true, rows, c, d, 1, qi, d, k[j0*d:(j0+c)*d], d, 0, s, c)
		for a := 0; a < rows; a++ {
			row := s[a*c : (a+1)*c]
			valid := visible(c, i0+a, j0, causal)
			if valid <= 0 {
				clear(row)
				continue
			}
			mx := math.Inf(-1)
			for _, x := range row[:valid] {
				mx = max(mx, scale*float64(x))
			}
			if math.IsInf(mx, -1) {
				// Every visible score is −Inf: this block adds nothing, and
				// using mx would give exp(−Inf − (−Inf)) = NaN.
				clear(row)
				continue
			}
			mNew := max(m[a], mx)
			var sum float64
			for t, x := range row[:valid] {
				p := math.Exp(scale*float64(x) - mNew)
				row[t] = T(p)
				sum += p
			}
			clear(row[valid:])
			if mNew != m[a] && l[a] != 0 {
				alpha := math.Exp(m[a] - mNew)
				l[a] *= alpha
				orow := oi[a*d : (a+1)*d]
				for t := range orow {
					orow[t] = T(alpha * float64(orow[t]))
				}
			}
			l[a] += sum
			m[a] = mNew
		}
		gemm(false, false, rows, d, c, 1, s, c, v[j0*d:(j0+c)*d], d, 1, oi, d)
	}
	for a := 0; a < rows; a++ {
		orow := oi[a*d : (a+1)*d]
		if l[a] == 0 || math.IsNaN(l[a]) {
			// No visible key: define O = 0 and LSE = +Inf (P = exp(S−LSE) = 0
			// in the backward pass), as SDPA does, instead of 0/0.
			clear(orow)
			if lse != nil {
				lse[a] = L(math.Inf(1))
			}
			continue
		}
		inv := 1 / l[a]
		for t := range orow {
			orow[t] = T(float64(orow[t]) * inv)
		}
		if lse != nil {
			lse[a] = L(m[a] + math.Log(l[a]))
		}
	}
}

// visible returns how many of the c keys starting at j0 query i may see.
func visible(c, i, j0 int, causal bool) int {
	if !causal {
		return c
	}
	return min(c, i-j0+1)
}

// forEachTask runs task(0..n-1) on up to workers goroutines. setup is called
// once per goroutine and returns the task function bound to that goroutine's
// scratch, so scratch is allocated per worker, not per task. Tasks are
// handed out dynamically because causal blocks differ in cost.
func forEachTask(n, workers int, setup func() func(int)) {
	workers = min(workers, n)
	if workers <= 1 {
		if n > 0 {
			run := setup()
			for t := 0; t < n; t++ {
				run(t)
			}
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run := setup()
			for {
				t := int(next.Add(1) - 1)
				if t >= n {
					return
				}
				run(t)
			}
		}()
	}
	wg.Wait()
}

// ErrShape is wrapped by every error about dimensions or slice lengths.
var ErrShape = errors.New("flashattn: bad shape")

func checkDims(bh, sq, sk, d int, scale float64) error {
	if bh < 0 || sq < 0 || sk < 0 {
		return fmt.Errorf("%w: negative dimension (bh=%d, sq=%d, sk=%d)", ErrShape, bh, sq, sk)
	}
	if d <= 0 {
		return fmt.Errorf("%w: head dimension d=%d, want > 0", ErrShape, d)
	}
	for _, n := range []int{sq, sk} {
		if _, ok := mulNoOverflow(bh, n, d); !ok {
			return fmt.Errorf("%w: bh·s·d overflows int (bh=%d, s=%d, d=%d)", ErrShape, bh, n, d)
		}
	}
	if math.IsNaN(scale) || math.IsInf(scale, 0) {
		return fmt.Errorf("flashattn: scale %v is not finite", scale)
	}
	return nil
}

// checkGroup: group query heads share each K/V head, so it must divide bh.
func checkGroup(bh, group int) error {
	if group < 1 || bh%group != 0 {
		return fmt.Errorf("%w: group %d must be at least 1 and divide bh=%d", ErrShape, group, bh)
	}
	return nil
}

type lenCheck struct {
	name      string
	got, want int
}

func checkLens(cs ...lenCheck) error {
	for _, c := range cs {
		if c.got != c.want {
			return fmt.Errorf("%w: %s has length %d, want %d", ErrShape, c.name, c.got, c.want)
		}
	}
	return nil
}

func mulNoOverflow(xs ...int) (int, bool) {
	p := 1
	for _, x := range xs {
		if x != 0 && p > math.MaxInt/x {
			return 0, false
		}
		p *= x
	}
	return p, true
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
