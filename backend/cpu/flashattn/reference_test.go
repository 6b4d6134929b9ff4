package flashattn

import "math"

// Reference computes attention the composed way, in float64, materialising
// each head's Sq×Sk score matrix: S = scale·Q·Kᵀ, causal mask to −Inf,
// row softmax, O = P·V. It returns O [BH,Sq,D] and LSE [BH,Sq]. It is the
// oracle of this package's tests only (a _test.go file), deliberately sharing no
// code with Forward. A row with no visible key gets O = 0 and LSE = +Inf,
// Forward's convention.
func Reference(q, k, v []float64, bh, sq, sk, d int, scale float64, causal bool) (o, lse []float64, err error) {
	if err := checkRef(q, k, v, bh, sq, sk, d, scale); err != nil {
		return nil, nil, err
	}
	o = make([]float64, bh*sq*d)
	lse = make([]float64, bh*sq)
	for h := range bh {
		p, l := refProbs(q[h*sq*d:], k[h*sk*d:], sq, sk, d, scale, causal)
		copy(lse[h*sq:], l)
		matMul(o[h*sq*d:(h+1)*sq*d], p, v[h*sk*d:(h+1)*sk*d], sq, sk, d)
	}
	return o, lse, nil
}

// ReferenceBackward returns dQ, dK, dV of sum(O∘dO) for Reference's O, by the
// textbook softmax backward on the full P: dP = dO·Vᵀ,
// dS = P∘(dP − rowsum(P∘dP)), dQ = scale·dS·K, dK = scale·dSᵀ·Q, dV = Pᵀ·dO.
// (rowsum(P∘dP) is computed from P and dP, not as Backward's rowsum(dO∘O),
// so the two do not share that shortcut either.)
func ReferenceBackward(q, k, v, do []float64, bh, sq, sk, d int, scale float64, causal bool) (dq, dk, dv []float64, err error) {
	if err := checkRef(q, k, v, bh, sq, sk, d, scale); err != nil {
		return nil, nil, nil, err
	}
	if err := checkLens(lenCheck{"do", len(do), bh * sq * d}); err != nil {
		return nil, nil, nil, err
	}
	dq = make([]float64, bh*sq*d)
	dk = make([]float64, bh*sk*d)
	dv = make([]float64, bh*sk*d)
	for h := range bh {
		qh, kh, vh, doh := q[h*sq*d:], k[h*sk*d:], v[h*sk*d:], do[h*sq*d:]
		p, _ := refProbs(qh, kh, sq, sk, d, scale, causal)
		ds := make([]float64, sq*sk)
		for i := range sq {
			var corr float64
			for j := range sk {
				var dp float64
				for t := range d {
					dp += doh[i*d+t] * vh[j*d+t]
				}
				ds[i*sk+j] = dp
				corr += p[i*sk+j] * dp
			}
			for j := range sk {
				ds[i*sk+j] = scale * p[i*sk+j] * (ds[i*sk+j] - corr)
			}
		}
		dqh, dkh, dvh := dq[h*sq*d:(h+1)*sq*d], dk[h*sk*d:(h+1)*sk*d], dv[h*sk*d:(h+1)*sk*d]
		for i := range sq {
			for j := range sk {
				pij, dsij := p[i*sk+j], ds[i*sk+j]
				for t := range d {
					dqh[i*d+t] += dsij * kh[j*d+t]
					dkh[j*d+t] += dsij * qh[i*d+t]
					dvh[j*d+t] += pij * doh[i*d+t]
				}
			}
		}
	}
	return dq, dk, dv, nil
}

// refProbs returns one head's full softmax matrix P (sq×sk) and its LSE.
func refProbs(q, k []float64, sq, sk, d int, scale float64, causal bool) (p, lse []float64) {
	p = make([]float64, sq*sk)
	lse = make([]float64, sq)
	for i := range sq {
		row := p[i*sk : (i+1)*sk]
		mx := math.Inf(-1)
		for j := range sk {
			if causal && j > i {
				row[j] = math.Inf(-1)
				continue
			}
			var s float64
			for t := range d {
				s += q[i*d+t] * k[j*d+t]
			}
			row[j] = scale * s
			mx = max(mx, row[j])
		}
		if math.IsInf(mx, -1) {
			clear(row)
			lse[i] = math.Inf(1)
			continue
		}
		var sum float64
		for j := range row {
			row[j] = math.Exp(row[j] - mx)
			sum += row[j]
		}
		for j := range row {
			row[j] /= sum
		}
		lse[i] = mx + math.Log(sum)
	}
	return p, lse
}

func matMul(c, a, b []float64, m, k, n int) {
	for i := range m {
		crow := c[i*n : (i+1)*n]
		for l := range k {
			ail := a[i*k+l]
			for j, bv := range b[l*n : (l+1)*n] {
				crow[j] += ail * bv
			}
		}
	}
}

func checkRef(q, k, v []float64, bh, sq, sk, d int, scale float64) error {
	if err := checkDims(bh, sq, sk, d, scale); err != nil {
		return err
	}
	nq, nk := bh*sq*d, bh*sk*d
	return checkLens(lenCheck{"q", len(q), nq}, lenCheck{"k", len(k), nk}, lenCheck{"v", len(v), nk})
}
