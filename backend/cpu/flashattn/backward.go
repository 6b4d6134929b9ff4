package flashattn

import (
	"math"
	"runtime"
)

// Backward computes dQ, dK and dV of FlashAttention given dO, from the
// forward pass's O and logsumexp (the same lse Forward wrote, in the same
// dtype: a float64 backward needs a float64 lse to be exact to ~1e-15).
//
// dq, dk and dv are overwritten and must not alias the inputs or each other.
//
// Scheme (FlashAttention-2 with a separate dQ pass):
//
//	D_i = rowsum(dO_i ∘ O_i)                          (pre-pass, O(BH·Sq))
//	pass 1, one task per (head, K/V block j), loop over query blocks i
//	(causal: from row j0 on, since earlier rows see none of block j):
//	    P = exp(scale·Q_i·K_jᵀ − L_i)   dV_j += Pᵀ·dO_i
//	    dP = dO_i·V_jᵀ                   dS = scale·P∘(dP − D_i)
//	    dK_j += dSᵀ·Q_i
//	pass 2, one task per (head, query block i), loop over K/V blocks j:
//	    recompute P and dS, dQ_i += dS·K_j
//
// Every task owns its output rows, so no locks, atomics or per-worker copies
// of dQ are needed and results do not depend on the number of workers. The
// price is recomputing S, P and dP in pass 2 (7 tile GEMMs per block pair
// instead of 5); the alternative — each worker accumulating a private
// Sq×D dQ and summing at the end — costs O(workers·Sq·D) memory and makes
// the summation order depend on scheduling.
func Backward[T Float, L Float](q, k, v, o, do []T, lse []L, dq, dk, dv []T, bh, sq, sk, d int, scale float64, causal bool) error {
	return backward(q, k, v, o, do, lse, dq, dk, dv, bh, 1, sq, sk, d, scale, causal, runtime.GOMAXPROCS(0))
}

// BackwardGrouped is Backward with k, v, dk and dv of bh/group heads: query
// head h reads K/V head h/group, whose dK and dV are the sums over the group
// of query heads reading it. A pass-1 task owns one K/V block of one K/V
// head and loops over the group's query heads in order, so the sums need no
// atomics and stay independent of the number of workers.
func BackwardGrouped[T Float, L Float](q, k, v, o, do []T, lse []L, dq, dk, dv []T, bh, group, sq, sk, d int, scale float64, causal bool) error {
	return backward(q, k, v, o, do, lse, dq, dk, dv, bh, group, sq, sk, d, scale, causal, runtime.GOMAXPROCS(0))
}

func backward[T Float, L Float](q, k, v, o, do []T, lse []L, dq, dk, dv []T, bh, group, sq, sk, d int, scale float64, causal bool, workers int) error {
	if err := checkDims(bh, sq, sk, d, scale); err != nil {
		return err
	}
	if err := checkGroup(bh, group); err != nil {
		return err
	}
	nkv := bh / group
	nq, nk := bh*sq*d, nkv*sk*d
	if err := checkLens(
		lenCheck{"q", len(q), nq}, lenCheck{"k", len(k), nk}, lenCheck{"v", len(v), nk},
		lenCheck{"o", len(o), nq}, lenCheck{"do", len(do), nq}, lenCheck{"lse", len(lse), bh * sq},
		lenCheck{"dq", len(dq), nq}, lenCheck{"dk", len(dk), nk}, lenCheck{"dv", len(dv), nk},
	); err != nil {
		return err
	}

	// D_i = rowsum(dO∘O) = rowsum(P∘dP): the softmax-backward correction,
	// computed once from O instead of from every P tile.
	delta := make([]float64, bh*sq)
	for r := range delta {
		var acc float64
		orow, drow := o[r*d:(r+1)*d], do[r*d:(r+1)*d]
		for t := range orow {
			acc += float64(orow[t]) * float64(drow[t])
		}
		delta[r] = acc
	}

	// Pass 1: dK, dV, one task per (K/V head, K/V block), summing over the
	// head's group of query heads.
	kBlocks := ceilDiv(sk, bc)
	forEachTask(nkv*kBlocks, workers, func() func(int) {
		p := make([]T, br*bc)
		ds := make([]T, br*bc)
		return func(task int) {
			g, j0 := task/kBlocks, (task%kBlocks)*bc
			c := min(bc, sk-j0)
			hk := g * sk * d
			kj, vj := k[hk+j0*d:hk+(j0+c)*d], v[hk+j0*d:hk+(j0+c)*d]
			dkj, dvj := dk[hk+j0*d:hk+(j0+c)*d], dv[hk+j0*d:hk+(j0+c)*d]
			clear(dkj)
			clear(dvj)
			iStart := 0
			if causal {
				iStart = j0
			}
			for h := g * group; h < (g+1)*group; h++ {
				hq := h * sq * d
				for i0 := iStart; i0 < sq; i0 += br {
					r := min(br, sq-i0)
					qi, doi := q[hq+i0*d:hq+(i0+r)*d], do[hq+i0*d:hq+(i0+r)*d]
					li, di := lse[h*sq+i0:h*sq+i0+r], delta[h*sq+i0:h*sq+i0+r]
					pt, dst := p[:r*c], ds[:r*c]
					probs(pt, qi, kj, li, r, c, d, i0, j0, scale, causal)
					gemm(true, false, c, d, r, 1, pt, c, doi, d, 1, dvj, d)
					scoreGrad(dst, pt, doi, vj, di, r, c, d, scale)
					gemm(true, false, c, d, r, 1, dst, c, qi, d, 1, dkj, d)
				}
			}
		}
	})

	// Pass 2: dQ.
	qBlocks := ceilDiv(sq, br)
	forEachTask(bh*qBlocks, workers, func() func(int) {
		p := make([]T, br*bc)
		ds := make([]T, br*bc)
		return func(task int) {
			h, i0 := task/qBlocks, (task%qBlocks)*br
			r := min(br, sq-i0)
			hq, hk := h*sq*d, h/group*sk*d
			qi, doi := q[hq+i0*d:hq+(i0+r)*d], do[hq+i0*d:hq+(i0+r)*d]
			li, di := lse[h*sq+i0:h*sq+i0+r], delta[h*sq+i0:h*sq+i0+r]
			dqi := dq[hq+i0*d : hq+(i0+r)*d]
			clear(dqi)
			kEnd := sk
			if causal {
				kEnd = min(sk, i0+r)
			}
			for j0 := 0; j0 < kEnd; j0 += bc {
				c := min(bc, kEnd-j0)
				kj, vj := k[hk+j0*d:hk+(j0+c)*d], v[hk+j0*d:hk+(j0+c)*d]
				pt, dst := p[:r*c], ds[:r*c]
				probs(pt, qi, kj, li, r, c, d, i0, j0, scale, causal)
				scoreGrad(dst, pt, doi, vj, di, r, c, d, scale)
				gemm(false, false, r, d, c, 1, dst, c, kj, d, 1, dqi, d)
			}
		}
	})
	return nil
}

// probs fills p (r×c) with P = exp(scale·Q_i·K_jᵀ − L), masked entries 0.
// A row with L = +Inf (no visible key in the forward pass) gets P = 0.
func probs[T Float, L Float](p, qi, kj []T, lse []L, r, c, d, i0, j0 int, scale float64, causal bool) {
	gemm(false, true, r, c, d, 1, qi, d, kj, d, 0, p, c)
	for a := 0; a < r; a++ {
		row := p[a*c : (a+1)*c]
		valid := max(0, visible(c, i0+a, j0, causal))
		la := float64(lse[a])
		for t, x := range row[:valid] {
			row[t] = T(math.Exp(scale*float64(x) - la))
		}
		clear(row[valid:])
	}
}

// scoreGrad fills ds (r×c) with dS = scale·P∘(dO_i·V_jᵀ − D). scale is folded
// in here, in float64, so the dK and dQ GEMMs need no alpha.
func scoreGrad[T Float](ds, p, doi, vj []T, delta []float64, r, c, d int, scale float64) {
	gemm(false, true, r, c, d, 1, doi, d, vj, d, 0, ds, c)
	for a := 0; a < r; a++ {
		da := delta[a]
		prow, drow := p[a*c:(a+1)*c], ds[a*c:(a+1)*c]
		for t, pv := range prow {
			if pv == 0 {
				// Masked or underflowed: exactly 0, even if dP − D is not
				// finite.
				drow[t] = 0
				continue
			}
			drow[t] = T(scale * float64(pv) * (float64(drow[t]) - da))
		}
	}
}
